package drill

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// observingFleet is the simulated fleet as the coordinator is: it keeps
// what each agent reported on its own schedule (kit.Observer).
type observingFleet struct {
	*simDrillFleet
	// unscheduled is a check the agents do not run on their own.
	unscheduled string
}

var _ kit.Observer = observingFleet{}

// RunChecks runs the checks when asked, as the coordinator's agents do
// (the stored results are what Observed reads).
func (o observingFleet) RunChecks(ctx context.Context, node string, names []string, _ kit.RunOptions) (*report.Report, error) {
	a, err := o.reach(node)
	if err != nil {
		return nil, err
	}
	return o.fresh(ctx, a, node, names)
}

func (o observingFleet) Observed(_ context.Context, node string, names []string, since time.Time) ([]kit.Observation, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	a := o.agents[node]
	if a == nil || a.last == nil {
		return nil, nil
	}
	at, err := time.Parse(time.RFC3339, a.last.CollectedAt)
	if err != nil || at.Before(since) {
		return nil, err
	}
	var out []kit.Observation
	for _, c := range a.last.Checks {
		if slices.Contains(names, c.Name) && c.Name != o.unscheduled {
			out = append(out, kit.Observation{Check: c, At: at})
		}
	}
	return out, nil
}

func (o observingFleet) CheckInterval(context.Context, string) (time.Duration, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.schedule, nil
}

// TestTimeToDetectIsTheFleetsOwn: the operator saw "time to detect 0s"
// because the engine polled the moment after injecting. With the agents
// checking every minute and gpu-002's next pass 15s after the injection,
// the fault is detected by that pass: 15s, read beside the 1m interval.
func TestTimeToDetectIsTheFleetsOwn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-002")
	eng, err := New(context.Background(), kit.Deps{DB: h.db, Fleet: observingFleet{simDrillFleet: h.fleet}, Drainer: h.fleet.drain, Clock: h.fleet.clock, Logger: h.eng.log}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.eng = eng
	ctx := context.Background()
	// The agents pass at :00 of every minute; the drill starts at :40 and
	// injects at :45, after its 5s precheck.
	h.fleet.enableSchedule(time.Minute, func(int) time.Duration { return 0 })
	h.fleet.runPasses(ctx)
	h.fleet.clock.Advance(40 * time.Second)
	id := h.start(xidDrill)
	h.run(h.eng, nil)
	d := h.drill(id)
	tg := d.Targets[0]
	ttd, ok := tg.TTD()
	if d.State != StateDone || !ok || !tg.ExpectedDetected {
		t.Fatalf("drill %s: %+v", d.State, tg)
	}
	// First shown by the agent's pass at 1:00, although the drill itself
	// polled at once after injecting (which used to read 0s).
	if ttd != 15*time.Second || time.Duration(tg.CheckInterval) != time.Minute {
		t.Fatalf("time to detect %s (injected %s, detected %s), interval %s", ttd,
			tg.InjectedAt.Format(time.TimeOnly), tg.DetectedAt.Format(time.TimeOnly), time.Duration(tg.CheckInterval))
	}
	rep, err := h.eng.Report(ctx, ReportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	row := rep.Rows[0]
	if row.CheckInterval != "1m" || row.TTDSeconds == nil || *row.TTDSeconds != 15 {
		t.Fatalf("report row %+v", row)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "CHECK INTERVAL") || !strings.Contains(buf.String(), "15s  ") || !strings.Contains(buf.String(), "1m  ") {
		t.Fatalf("table:\n%s", buf.String())
	}
}

// TestReportListsTheMatchedFinding: the operator's drill report had no
// findings although XID_79 matched.
func TestReportListsTheMatchedFinding(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-002")
	h.start(xidDrill)
	h.run(h.eng, nil)
	rep, err := h.eng.Report(context.Background(), ReportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	row := rep.Rows[0]
	if !slices.Contains(row.Findings, "gpu.xid:XID_79") || len(row.Detected) == 0 ||
		!strings.Contains(strings.Join(row.Detected, "\n"), "gpu.xid fail XID_79 GPU3") {
		t.Fatalf("findings %v detected %q", row.Findings, row.Detected)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "gpu.xid:XID_79") {
		t.Fatalf("table:\n%s", buf.String())
	}
}

// TestOutOfServiceAsTheCoordinatorShowsIt: the coordinator's drain policy
// takes the node out of service (kit.Node.OutOfService) without the
// scheduler's adapter saying so; the drill sees it.
func TestOutOfServiceAsTheCoordinatorShowsIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-004")
	h.fleet.policyOut = map[string]string{}
	id := h.start(`
fault: ib-port-down
params: {hca: mlx5_3}
expect: {check: ib.ports, out_of_service: true, out_of_service_within: 2m}
targets: name=gpu-004
`)
	h.run(h.eng, func() bool {
		if tg := h.drill(id).Targets[0]; tg.State == TargetOutOfService {
			h.fleet.mu.Lock()
			h.fleet.policyOut["gpu-004"] = "drain policy through none: ib.ports: IB_PORT_DOWN mlx5_3/1"
			h.fleet.mu.Unlock()
		}
		return false
	})
	tg := h.drill(id).Targets[0]
	if _, out := tg.TimeToOutOfService(); !out || tg.HasFinding(FindingNotOutOfService) {
		t.Fatalf("out of service not seen: %+v", tg.Findings)
	}
	evs, err := h.eng.Events(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs, func(e Event) bool { return strings.Contains(e.What, "taken out of service: drain policy through none") }) {
		t.Fatalf("events %+v", evs)
	}
}

// TestAgentsReconnectingDoNotAbort: after a coordinator restart agents
// come back with backoff. A non-target away for less than the grace is
// not "unexpected", and a target away at its turn is waited for.
func TestAgentsReconnectingDoNotAbort(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-002")
	id := h.start(xidDrill)
	var awayAt time.Time
	h.run(h.eng, func() bool {
		tg := h.drill(id).Targets[0]
		now := h.fleet.clock.Now()
		switch {
		case awayAt.IsZero() && tg.State == TargetWatching:
			awayAt = now
			h.fleet.disconnect("gpu-002")
			h.fleet.disconnect("gpu-003")
		case !awayAt.IsZero() && now.Sub(awayAt) >= 50*time.Second && !h.fleet.agent("gpu-002").connected:
			h.fleet.reconnect("gpu-002")
			h.fleet.reconnect("gpu-003")
		}
		return false
	})
	d := h.drill(id)
	tg := d.Targets[0]
	if d.State != StateDone || tg.Aborted || !tg.ExpectedDetected {
		t.Fatalf("drill %s %q: %+v", d.State, d.Reason, tg.Findings)
	}
	evs, err := h.eng.Events(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs, func(e Event) bool { return strings.Contains(e.What, "waiting up to 2m0s for it to reconnect") }) {
		t.Fatalf("no wait recorded: %+v", evs)
	}
}

// skippingFleet makes one check skip on every node, as when its source
// is absent.
type skippingFleet struct {
	*simDrillFleet
	check string
}

func (s skippingFleet) RunChecks(ctx context.Context, node string, names []string, opts kit.RunOptions) (*report.Report, error) {
	rep, err := s.simDrillFleet.RunChecks(ctx, node, names, opts)
	if rep != nil {
		for i := range rep.Checks {
			if rep.Checks[i].Name == s.check {
				rep.Checks[i].Status, rep.Checks[i].Reason, rep.Checks[i].Findings = report.Skip, "no kernel log", nil
			}
		}
	}
	return rep, err
}

// TestExpectedCheckSkippedIsNotInjected: a watched check that skips
// where data was expected could never see the fault: the drill says so
// and injects nothing, instead of timing a detection gap.
func TestExpectedCheckSkippedIsNotInjected(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-002")
	eng, err := New(context.Background(), kit.Deps{DB: h.db, Fleet: skippingFleet{h.fleet, "gpu.xid"}, Drainer: h.fleet.drain, Clock: h.fleet.clock, Logger: h.eng.log}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.eng = eng
	id := h.start(xidDrill)
	h.run(h.eng, nil)
	tg := h.drill(id).Targets[0]
	if !tg.InjectedAt.IsZero() || !tg.HasFinding(FindingUnhealthyBefore) || !strings.Contains(tg.AbortReason, "gpu.xid skipped before injection (no kernel log)") {
		t.Fatalf("target %+v", tg)
	}
	if n := h.fleet.actionCount("gpu-002", "xid-inject"); n != 0 {
		t.Fatalf("injected %d times", n)
	}
}

func TestConnectGraceBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v  string
		ok bool
	}{{"2m", true}, {"1s", false}, {"25h", false}, {"-1m", false}, {"soon", false}} {
		_, err := ParseSpec([]byte("fault: xid-inject\ntargets: a=b\nconnect_grace: " + tc.v + "\n"))
		if (err == nil) != tc.ok {
			t.Errorf("connect_grace %s: %v", tc.v, err)
		}
	}
}

// TestUnscheduledCheckIsAskedFor: a watched check the agent does not run
// on its own never shows in its results; it is asked for instead, so the
// node's recovery is still seen.
func TestUnscheduledCheckIsAskedFor(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-002")
	eng, err := New(context.Background(), kit.Deps{DB: h.db, Fleet: observingFleet{simDrillFleet: h.fleet, unscheduled: "gpu.thermal"}, Drainer: h.fleet.drain, Clock: h.fleet.clock, Logger: h.eng.log}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.eng = eng
	h.fleet.enableSchedule(time.Minute, func(int) time.Duration { return 0 })
	h.fleet.runPasses(context.Background())
	id := h.start(xidDrill)
	h.run(h.eng, nil)
	d := h.drill(id)
	tg := d.Targets[0]
	if _, ok := tg.TTR(); d.State != StateDone || !ok || tg.HasFinding(FindingNotRecovered) {
		t.Fatalf("drill %s %q: %+v", d.State, d.Reason, tg.Findings)
	}
}
