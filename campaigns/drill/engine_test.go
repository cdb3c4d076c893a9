package drill

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
)

const xidDrill = `
name: xid79-drill
fault: xid-inject
params: {xid: "79", gpu: "3"}
expect: {check: gpu.xid, code: XID_79}
targets: name=gpu-002
deadline: 10m
poll_interval: 30s
`

// On both databases: every campaign engine uses the same store.
func TestXidDrillDetectedRevertedRecovered(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, open func(testing.TB) *sqldb.DB) {
		xidDrillRecovered(t, newHarnessOn(t, open(t), 8, "gpu-002"))
	})
}

func xidDrillRecovered(t *testing.T, h *harness) {
	id := h.start(xidDrill)
	h.run(h.eng, nil)
	d := h.drill(id)
	if d.State != StateDone || len(d.Targets) != 1 {
		t.Fatalf("drill %s %s %+v", d.State, d.Reason, d.Targets)
	}
	tg := d.Targets[0]
	ttd, ok := tg.TTD()
	if !ok || tg.DetectedBy != "gpu.xid" || !tg.ExpectedDetected {
		t.Fatalf("detection: %+v", tg)
	}
	// The first watch runs right after injection.
	if ttd < 0 || ttd > 30*time.Second {
		t.Errorf("time to detect %s, want within one poll interval", ttd)
	}
	ttr, ok := tg.TTR()
	if !ok || ttr < ttd || tg.RevertedBy != "coordinator" {
		t.Errorf("recovery: ttr %s ok %v reverted by %q", ttr, ok, tg.RevertedBy)
	}
	if len(tg.Findings) != 0 {
		t.Errorf("findings %+v", tg.Findings)
	}
	if n := h.fleet.actionCount("gpu-002", "xid-inject"); n != 1 {
		t.Errorf("injected %d times", n)
	}
	if n := h.fleet.actionCount("gpu-002", "xid-inject-revert"); n != 1 {
		t.Errorf("reverted %d times", n)
	}
	// Every drill action carried the agent's safety timer.
	a := h.fleet.agent("gpu-002")
	for _, ad := range a.drills {
		if ad.params[ParamRevertAfter] != "15m0s" || ad.params[ParamRevertOnDisconnect] != "2m0s" || ad.id != id || !ad.revertedByCoord {
			t.Errorf("agent drill %+v", ad)
		}
	}
	if len(a.node.Faults()) != 0 {
		t.Errorf("faults left: %v", a.node.Faults())
	}
}

func TestIBPortDownTakenOutOfService(t *testing.T) {
	t.Parallel()
	for _, policy := range []bool{true, false} {
		h := newHarness(t, 6, "gpu-004")
		h.fleet.autoDrain = policy
		id := h.start(`
fault: ib-port-down
params: {hca: mlx5_3}
expect: {check: ib.ports, out_of_service: true, out_of_service_within: 2m}
targets: name=gpu-004
`)
		h.run(h.eng, nil)
		tg := h.drill(id).Targets[0]
		if tg.DetectedBy != "ib.ports" && tg.DetectedBy != "ib.counters" {
			t.Errorf("detected by %q", tg.DetectedBy)
		}
		if !tg.ExpectedDetected {
			t.Errorf("ib.ports did not detect: %+v", tg.Detections)
		}
		_, out := tg.TimeToOutOfService()
		if out != policy || tg.HasFinding(FindingNotOutOfService) == policy {
			t.Errorf("policy %v: out of service %v, findings %+v", policy, out, tg.Findings)
		}
		if _, ok := tg.TTR(); !ok {
			t.Errorf("not recovered: %+v", tg)
		}
	}
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("opt-in label", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 8, "gpu-001")
		id, err := h.eng.Start(ctx, h.spec("{fault: xid-inject, targets: 'name in (gpu-001,gpu-002)', blast_radius: {max_nodes: 2}}"))
		if !errors.Is(err, ErrRefused) || !errors.Is(err, ErrNotOptedIn) || !strings.Contains(err.Error(), "gpu-002") {
			t.Fatalf("%v", err)
		}
		if d := h.drill(id); d.State != StateRefused || len(d.Targets) != 0 {
			t.Errorf("refused drill recorded as %+v", d)
		}
		if h.fleet.actionCount("gpu-001", "xid-inject") != 0 {
			t.Error("a refused drill injected")
		}
	})
	t.Run("blast radius count", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 8, "gpu-001", "gpu-002", "gpu-003")
		_, err := h.eng.Start(ctx, h.spec("{fault: xid-inject, targets: 'name in (gpu-001,gpu-002,gpu-003)', blast_radius: {max_nodes: 2}}"))
		if !errors.Is(err, ErrBlastRadius) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("blast radius share", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 8, "gpu-001", "gpu-002")
		// 20 % of 8 nodes is one node.
		_, err := h.eng.Start(ctx, h.spec("{fault: xid-inject, targets: 'name in (gpu-001,gpu-002)', blast_radius: {max_nodes: 5, max_share: 0.2}}"))
		if !errors.Is(err, ErrBlastRadius) || !strings.Contains(err.Error(), "at most 1") {
			t.Fatalf("%v", err)
		}
		p, err := h.eng.Preflight(ctx, h.spec("{fault: xid-inject, targets: name=gpu-001, blast_radius: {max_share: 0.2}}"))
		if err != nil || p.Allowed != 1 || p.FleetSize != 8 {
			t.Fatalf("preflight %+v %v", p, err)
		}
	})
	t.Run("degraded fleet", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 16, "gpu-001")
		h.fleet.setState("gpu-010", "failed")
		// One of 16 (6.25 %) is over the default 5 %.
		_, err := h.eng.Start(ctx, h.spec("{fault: xid-inject, targets: name=gpu-001}"))
		if !errors.Is(err, ErrFleetDegraded) || !strings.Contains(err.Error(), "gpu-010") {
			t.Fatalf("%v", err)
		}
		// A looser limit lets it run.
		if _, err := h.eng.Start(ctx, h.spec("{fault: xid-inject, targets: name=gpu-001, fleet_health: {max_degraded_share: 0.1}}")); err != nil {
			t.Fatalf("with 10 %%: %v", err)
		}
	})
	t.Run("unhealthy or busy target", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 8, "gpu-001", "gpu-002")
		h.fleet.setState("gpu-002", "degraded")
		_, err := h.eng.Start(ctx, h.spec("{fault: xid-inject, targets: name=gpu-002, fleet_health: {max_degraded_share: 0.5}}"))
		if !errors.Is(err, ErrTargetUnhealthy) {
			t.Fatalf("%v", err)
		}
		h.fleet.setState("gpu-002", "healthy")
		// An agent away (a coordinator restart, a reconnect backoff) is
		// refused as such, not as sick, and the message says to retry.
		h.fleet.disconnect("gpu-002")
		_, err = h.eng.Start(ctx, h.spec("{fault: xid-inject, targets: name=gpu-002, fleet_health: {max_degraded_share: 0.5}}"))
		if !errors.Is(err, ErrTargetNotConnected) || errors.Is(err, ErrTargetUnhealthy) ||
			!strings.Contains(err.Error(), "gpu-002: the agent is not connected") || !strings.Contains(err.Error(), "retry once it has reconnected") {
			t.Fatalf("target away: %v", err)
		}
		h.fleet.reconnect("gpu-002")
		if _, err := h.eng.Start(ctx, h.spec("{fault: xid-inject, targets: name=gpu-002, fleet_health: {max_degraded_share: 0.5}}")); err != nil {
			t.Fatalf("retried once reconnected: %v", err)
		}
		h.start("{fault: xid-inject, targets: name=gpu-001}")
		if _, err := h.eng.Start(ctx, h.spec("{fault: ib-port-down, targets: name=gpu-001}")); !errors.Is(err, ErrBusy) {
			t.Fatalf("second drill on a node: %v", err)
		}
	})
	t.Run("breaker", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 8, "gpu-001")
		br, err := kit.NewBreaker(kit.BreakerConfig{Window: time.Hour, MaxCount: 1}, h.fleet.clock)
		if err != nil {
			t.Fatal(err)
		}
		if err := br.Allow("rollout-1", "gpu-007", 8); err != nil {
			t.Fatal(err)
		}
		h.eng = h.newEngine(br)
		_, err = h.eng.Start(ctx, h.spec("{fault: ib-port-down, targets: name=gpu-001, expect: {out_of_service: true}}"))
		if !errors.Is(err, ErrBreaker) || !errors.Is(err, kit.ErrBreakerOpen) {
			t.Fatalf("%v", err)
		}
		// A drill that takes nothing out of service does not count.
		if _, err := h.eng.Start(ctx, h.spec("{fault: ib-port-down, targets: name=gpu-001}")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("breaker counts a node drained again once", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 8, "gpu-001")
		br, err := kit.NewBreaker(kit.BreakerConfig{Window: time.Hour, MaxCount: 1}, h.fleet.clock)
		if err != nil {
			t.Fatal(err)
		}
		// The window is full with the target itself (a rollout upgraded it):
		// draining it again takes no new slot, as Breaker.Allow says.
		if err := br.Allow("rollout-1", "gpu-001", 8); err != nil {
			t.Fatal(err)
		}
		h.eng = h.newEngine(br)
		if _, err := h.eng.Start(ctx, h.spec("{fault: ib-port-down, targets: name=gpu-001, expect: {out_of_service: true}}")); err != nil {
			t.Fatalf("refused although the target is already in the window: %v", err)
		}
		if err := br.Allow("drill", "gpu-001", 8); err != nil {
			t.Fatalf("the breaker itself: %v", err)
		}
	})
	t.Run("no targets", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 2)
		if _, err := h.eng.Start(ctx, h.spec("{fault: xid-inject, targets: name=nope}")); !errors.Is(err, ErrNoTargets) {
			t.Fatalf("%v", err)
		}
	})
}

func TestDetectionGapAbortsAndReverts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-001")
	// kill -9 leaves GPU memory held, but gpu.processes only calls that a
	// ghost on a node expected to be idle: nothing detects it.
	id := h.start(`
fault: kill-workload
targets: name=gpu-001
deadline: 3m
poll_interval: 30s
`)
	h.run(h.eng, nil)
	d := h.drill(id)
	tg := d.Targets[0]
	if d.State != StateAborted || !tg.HasFinding(FindingDetectionGap) || !tg.Aborted || !strings.Contains(tg.AbortReason, "deadline") {
		t.Fatalf("drill %s: %+v", d.State, tg)
	}
	if _, ok := tg.TTD(); ok {
		t.Error("a gap has a time to detect")
	}
	if tg.RevertedBy != "coordinator" || len(h.fleet.agent("gpu-001").node.Faults()) != 0 {
		t.Errorf("not reverted: %q %v", tg.RevertedBy, h.fleet.agent("gpu-001").node.Faults())
	}
	// Past the deadline, but the drill still waited for the node.
	if tg.RecoveredAt.IsZero() {
		t.Error("recovery after the abort not recorded")
	}
	if _, ok := tg.TTR(); ok {
		t.Error("an aborted drill counted toward MTTR")
	}
	// Polls stopped at the deadline: about 3m / 30s of them, plus recovery.
	if tg.Polls > 10 {
		t.Errorf("%d polls", tg.Polls)
	}
}

func TestDeadlineAbortRevertsWhenDetectedByOtherCheckOnly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-003")
	// The spec expects gpu.ecc, which never sees a missing GPU; the watch
	// list is only gpu.ecc, so nothing detects it before the deadline.
	id := h.start(`
fault: gpu-reset
params: {gpu: "5"}
expect: {check: gpu.ecc}
watch: [gpu.ecc]
targets: name=gpu-003
deadline: 2m
poll_interval: 20s
`)
	h.run(h.eng, nil)
	d := h.drill(id)
	tg := d.Targets[0]
	if d.State != StateAborted || !tg.HasFinding(FindingDetectionGap) {
		t.Fatalf("%s %+v", d.State, tg.Findings)
	}
	if h.fleet.actionCount("gpu-003", "gpu-reset-revert") != 1 || len(h.fleet.agent("gpu-003").node.Faults()) != 0 {
		t.Error("GPU not given back")
	}
	// With the default watch list gpu.inventory sees it: detected by
	// another check than the expected one.
	h2 := newHarness(t, 4, "gpu-003")
	id2 := h2.start(`
fault: gpu-reset
params: {gpu: "5"}
expect: {check: gpu.ecc}
targets: name=gpu-003
`)
	h2.run(h2.eng, nil)
	tg2 := h2.drill(id2).Targets[0]
	if tg2.DetectedBy != "gpu.inventory" || tg2.ExpectedDetected || !tg2.HasFinding(FindingOtherCheck) {
		t.Errorf("%+v", tg2)
	}
}

func TestUnexpectedStateAborts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 8, "gpu-001")
	id := h.start(`
fault: gpu-slowdown
params: {load: "60"}
targets: name=gpu-001
deadline: 20m
poll_interval: 1m
`)
	hit := false
	h.run(h.eng, func() bool {
		tg := h.drill(id).Targets[0]
		if !hit && tg.State == TargetWatching {
			// Another node fails while the fault is in: stop now.
			h.fleet.setState("gpu-006", "failed")
			hit = true
		}
		return false
	})
	d := h.drill(id)
	tg := d.Targets[0]
	if d.State != StateAborted || !strings.Contains(d.Reason, "gpu-006 is failed") {
		t.Fatalf("%s %q", d.State, d.Reason)
	}
	if tg.RevertedBy != "coordinator" || len(h.fleet.agent("gpu-001").node.Faults()) != 0 {
		t.Errorf("not reverted: %+v", tg)
	}
}

func TestGPUSlowdownSeenByAllReduce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3, "gpu-002")
	id := h.start(`
fault: gpu-slowdown
params: {load: "50"}
targets: name=gpu-002
watch: [nccl.allreduce]
poll_interval: 2m
`)
	h.run(h.eng, nil)
	tg := h.drill(id).Targets[0]
	if tg.DetectedBy != "nccl.allreduce" || !tg.ExpectedDetected {
		t.Fatalf("%+v", tg)
	}
	if _, ok := tg.TTR(); !ok {
		t.Errorf("not recovered %+v", tg)
	}
}

func TestAgentRevertsOnCoordinatorLoss(t *testing.T) {
	t.Parallel()
	t.Run("coordinator gone", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 4, "gpu-001")
		id := h.start(xidDrill[:strings.Index(xidDrill, "targets:")] + "targets: name=gpu-001\n")
		// Inject, then the coordinator dies (no more steps) and the agent
		// notices it lost its stream.
		h.run(h.eng, func() bool { return h.drill(id).Targets[0].State == TargetWatching })
		if len(h.fleet.agent("gpu-001").node.Faults()) != 1 {
			t.Fatal("fault not in place")
		}
		h.fleet.disconnect("gpu-001")
		h.fleet.clock.Advance(time.Minute)
		h.fleet.tick()
		if len(h.fleet.agent("gpu-001").node.Faults()) != 1 {
			t.Fatal("reverted before revert_on_disconnect")
		}
		h.fleet.clock.Advance(61 * time.Second)
		h.fleet.tick()
		if len(h.fleet.agent("gpu-001").node.Faults()) != 0 || len(h.fleet.agentRevertLog) != 1 {
			t.Fatalf("agent did not revert on its own: %v", h.fleet.agentRevertLog)
		}
	})
	t.Run("target unreachable mid-drill", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 4, "gpu-001")
		id := h.start(`
fault: ib-port-down
params: {hca: mlx5_1}
targets: name=gpu-001
deadline: 10m
poll_interval: 30s
recover_grace: 5m
connect_grace: 30s
`)
		lost := false
		h.run(h.eng, func() bool {
			tg := h.drill(id).Targets[0]
			if !lost && tg.State == TargetWatching {
				// The link the agent speaks over goes: the coordinator
				// cannot revert, the agent reverts on its own timer and
				// comes back later.
				h.fleet.disconnect("gpu-001")
				lost = true
			}
			if lost && len(h.fleet.agentRevertLog) > 0 && !h.fleet.agent("gpu-001").connected {
				h.fleet.reconnect("gpu-001")
			}
			return false
		})
		d := h.drill(id)
		tg := d.Targets[0]
		if d.State != StateAborted || !tg.HasFinding(FindingRevertFailed) || tg.RevertedBy != "agent" {
			t.Fatalf("%s %+v", d.State, tg)
		}
		if len(h.fleet.agentRevertLog) != 1 || len(h.fleet.agent("gpu-001").node.Faults()) != 0 {
			t.Fatalf("agent reverts %v", h.fleet.agentRevertLog)
		}
		if tg.RecoveredAt.IsZero() {
			t.Errorf("recovery after the agent's revert not seen: %+v", tg)
		}
	})
}

func TestRestartMidDrillResumes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-002")
	id := h.start(xidDrill)
	h.run(h.eng, func() bool { return h.drill(id).Targets[0].State == TargetWatching })
	// A new engine over the same database.
	e2, err := New(context.Background(), kit.Deps{DB: openDB(t, h.path), Fleet: h.fleet, Drainer: h.fleet.drain, Clock: h.fleet.clock, Logger: h.eng.log}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.run(e2, nil)
	d, err := e2.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if d.State != StateDone || h.fleet.actionCount("gpu-002", "xid-inject") != 1 {
		t.Fatalf("%s, injected %d times", d.State, h.fleet.actionCount("gpu-002", "xid-inject"))
	}
	if _, ok := d.Targets[0].TTR(); !ok {
		t.Errorf("%+v", d.Targets[0])
	}
}

func TestRestartDuringInjectionRevertsAnyway(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-002")
	id := h.start(xidDrill)
	ctx := context.Background()
	d := h.drill(id)
	// As if the coordinator died after writing "injecting" and before the
	// agent answered (the fault may be in place).
	tg := d.Targets[0]
	tg.State, tg.InjectedAt = TargetInjecting, h.fleet.clock.Now()
	tg.Precheck = map[string]CheckSnap{"gpu.xid": {Status: "pass"}}
	if err := saveTarget(ctx, h.db, id, tg, h.fleet.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if err := h.fleet.agent("gpu-002").node.AddFault(sim.Xid{GPU: 3, Code: 79}); err != nil {
		t.Fatal(err)
	}
	h.run(h.newEngine(nil), nil)
	d = h.drill(id)
	if d.State != StateDone || d.Targets[0].DetectedBy != "gpu.xid" || h.fleet.actionCount("gpu-002", "xid-inject-revert") != 1 {
		t.Fatalf("%s %+v", d.State, d.Targets[0])
	}
	if h.fleet.actionCount("gpu-002", "xid-inject") != 0 {
		t.Error("injected again after the restart")
	}
}

func TestOperatorAbort(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-001")
	id := h.start("{fault: ib-port-down, targets: name=gpu-001, poll_interval: 1m, deadline: 30m}")
	h.run(h.eng, func() bool { return h.drill(id).Targets[0].State == TargetWatching })
	ctx := context.Background()
	if err := h.eng.Abort(ctx, id, "change freeze"); err != nil {
		t.Fatal(err)
	}
	h.run(h.eng, nil)
	d := h.drill(id)
	if d.State != StateAborted || !strings.Contains(d.Reason, "change freeze") || len(h.fleet.agent("gpu-001").node.Faults()) != 0 {
		t.Fatalf("%s %q", d.State, d.Reason)
	}
	if err := h.eng.Abort(ctx, id, "again"); !errors.Is(err, ErrFinished) {
		t.Errorf("abort twice: %v", err)
	}
	if _, err := h.eng.Events(ctx, id); err != nil {
		t.Error(err)
	}
	if st, _ := h.fleet.drain.Status(ctx, "gpu-001"); st.Drained {
		t.Error("drill drained a node")
	}

}

// A node another kind of campaign holds (kit.Busy) is refused like one in
// a running drill, naming the holder.
func TestNodeHeldByAnotherCampaignRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-002")
	busy := &kit.Busy{}
	busy.Register("burnin", func(context.Context) (map[string]string, error) {
		return map[string]string{"gpu-002": "burnin b-1"}, nil
	})
	e, err := New(context.Background(), kit.Deps{DB: h.db, Fleet: h.fleet, Drainer: h.fleet.drain, Clock: h.fleet.clock, Busy: busy}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Start(context.Background(), h.spec(xidDrill)); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "burnin b-1") {
		t.Fatalf("drill on a node a burn-in holds: %v", err)
	}
	if n := h.fleet.actionCount("gpu-002", "xid-inject"); n != 0 {
		t.Fatalf("injected %d times on a held node", n)
	}
	// Its own running drills are what it registers for the others.
	held, err := busy.Held(context.Background())
	if err != nil || len(held) != 1 {
		t.Fatalf("held %v, %v: a refused drill holds nothing", held, err)
	}
}
