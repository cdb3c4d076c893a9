package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/agent/spool"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/proto/version"
)

func TestHelloWelcomeAndScheduledResultsAcked(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	cfg := testConfig(t)
	cfg.Activity = ActivityBusy
	ta := startAgent(t, cfg, &fakeHost{}, tn)

	// First pass at start, the next one an interval later; both acked.
	testwait.Until(t, 10*time.Second, "two scheduled results stored", func() bool { return c.stored() >= 2 })
	testwait.Until(t, 10*time.Second, "spool drained by acks", func() bool {
		var n int
		ta.metrics.read(func(m *recMetrics) { n = m.spool })
		return n == 0
	})

	var hello *fleetcheckv1.Hello
	var results []*fleetcheckv1.Result
	c.get(func(c *fakeCoord) {
		hello = c.hellos[0]
		for _, r := range c.results {
			results = append(results, r)
		}
	})
	if hello.GetNode() != "gpu-001" || hello.GetProtocolVersion() != version.Protocol || hello.GetAgentVersion() != "test" {
		t.Errorf("hello identity: %v", hello)
	}
	if hello.GetLabels()["sku"] != "h100-sxm-8" || hello.GetActivity() != fleetcheckv1.NodeActivity_NODE_ACTIVITY_BUSY {
		t.Errorf("hello labels/activity: %v", hello)
	}
	if len(hello.GetEnabledChecks()) == 0 || slices.Contains(hello.GetEnabledChecks(), "nccl.allreduce") {
		t.Errorf("default enabled checks must be the passive ones: %v", hello.GetEnabledChecks())
	}
	for _, r := range results {
		if r.GetNode() != "gpu-001" || r.GetWorkId() != "" || !r.GetFull() || len(r.GetId()) != 32 {
			t.Errorf("scheduled result: id=%q node=%q work=%q full=%v", r.GetId(), r.GetNode(), r.GetWorkId(), r.GetFull())
		}
		if len(r.GetChecks()) != len(hello.GetEnabledChecks()) {
			t.Errorf("result has %d checks, %d enabled", len(r.GetChecks()), len(hello.GetEnabledChecks()))
		}
		if r.GetFinishedUnixMs() < r.GetStartedUnixMs() || r.GetStatus() == "" {
			t.Errorf("result times/status: %v", r)
		}
	}
	// Heartbeats flow both ways at the welcome's interval.
	testwait.Until(t, 10*time.Second, "agent heartbeats", func() bool {
		var n int
		c.get(func(c *fakeCoord) { n = c.heartbeats })
		return n >= 2
	})
}

func TestCoordinatorAbsentAtStartThenUp(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	ta := startAgent(t, testConfig(t), &fakeHost{}, tn)

	testwait.Until(t, 10*time.Second, "two results spooled while the coordinator is down", func() bool {
		var n int
		ta.metrics.read(func(m *recMetrics) { n = m.spool })
		return n >= 2
	})

	if len(ta.backoff.calls()) == 0 {
		t.Fatal("no reconnect attempts while the coordinator was down")
	}
	if !strings.Contains(ta.logs.String(), "cannot reach the coordinator") {
		t.Errorf("no log line about the unreachable coordinator")
	}
	tn.serve(t, c)
	testwait.Until(t, 10*time.Second, "spooled results delivered and acked", func() bool {
		var spooled, passes int
		ta.metrics.read(func(m *recMetrics) { spooled, passes = m.spool, m.passes })
		return spooled == 0 && c.stored() == passes
	})
}

func TestConnectionCutLosesNothing(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	c.noAck = true // results arrive and are stored, but the acks are lost
	tn.serve(t, c)
	cfg := testConfig(t)
	ta := startAgent(t, cfg, &fakeHost{}, tn)

	testwait.Until(t, 10*time.Second, "two unacked results at the coordinator", func() bool { return c.stored() >= 2 })
	c.set(func(c *fakeCoord) { c.noAck = false })
	c.cut()
	testwait.Until(t, 10*time.Second, "reconnect", func() bool {
		var n int
		c.get(func(c *fakeCoord) { n = c.connects })
		return n >= 2
	})

	testwait.Until(t, 10*time.Second, "everything acked after the reconnect", func() bool {
		var spooled int
		ta.metrics.read(func(m *recMetrics) { spooled = m.spool })
		return spooled == 0
	})

	ta.stop()

	var dups int
	var mismatch []string
	c.get(func(c *fakeCoord) {
		for _, n := range c.receipts {
			if n > 1 {
				dups++
			}
		}
		mismatch = c.mismatch
	})
	if dups < 2 {
		t.Errorf("the unacked results should have been resent: %d resent", dups)
	}
	if len(mismatch) > 0 {
		t.Errorf("resent results differ from the first copy: %v", mismatch)
	}
	var dupAcks int
	ta.metrics.read(func(m *recMetrics) { dupAcks = m.dupAcks })
	if dupAcks < 2 {
		t.Errorf("duplicate acks seen by the agent: %d", dupAcks)
	}
	// Every pass made is either stored or still spooled: nothing lost.
	sp, err := spool.Open(cfg.StateDir+"/spool", spool.Limits{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	c.get(func(c *fakeCoord) {
		for id := range c.results {
			ids[id] = true
		}
	})
	for _, e := range sp.After(0, 0) {
		ids[e.ID] = true
	}
	var passes int
	ta.metrics.read(func(m *recMetrics) { passes = m.passes })
	if len(ids) != passes {
		t.Errorf("%d passes but %d distinct results stored or spooled", passes, len(ids))
	}
}

func TestKnownResultIDsDropFromSpool(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	cfg := testConfig(t)
	// An agent without a coordinator spools a result...
	ta := startAgent(t, cfg, &fakeHost{}, tn)
	testwait.Until(t, 10*time.Second, "a spooled result", func() bool {
		var n int
		ta.metrics.read(func(m *recMetrics) { n = m.spool })
		return n >= 1
	})

	ta.stop()
	sp, err := spool.Open(cfg.StateDir+"/spool", spool.Limits{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	var spooled []string
	for _, e := range sp.After(0, 0) {
		spooled = append(spooled, e.ID)
	}
	// ...that the coordinator says it already holds: not resent after restart.
	c := newFakeCoord()
	c.known = spooled
	tn.serve(t, c)
	ta2 := startAgent(t, cfg, &fakeHost{hang: map[snapshot.Source]bool{snapshot.SrcKernelLog: true}}, tn)
	testwait.Until(t, 10*time.Second, "connected", func() bool { return c.connected() })
	// The welcome's known ids are dropped from the spool before anything is
	// sent: once the agent has logged dropping all of them, none can be resent.
	already := fmt.Sprintf(`"already_stored":%d`, len(spooled))
	testwait.For(t, 10*time.Second, "the agent dropping the known results", func() (bool, string) {
		return strings.Contains(ta2.logs.String(), already), ta2.logs.String()
	})
	ta2.stop()
	c.get(func(c *fakeCoord) {
		for _, id := range spooled {
			if c.receipts[id] != 0 {
				t.Errorf("result %s resent although the coordinator holds it", id)
			}
		}
	})
}

func TestRestartDeliversSpoolAndKeepsState(t *testing.T) {
	t.Parallel()
	b, err := bundle.Open("../examples/bundles/h100-xid79-ecc")
	if err != nil {
		t.Fatal(err)
	}
	tn := &testNet{}
	cfg := testConfig(t)
	cfg.Interval = config.Duration(24 * time.Hour) // one pass per run
	cfg.EnabledChecks = []string{"gpu.xid"}

	// Run 1, coordinator down: one pass, spooled.
	ta := startAgent(t, cfg, &fakeHost{Host: b}, tn)
	testwait.Until(t, 10*time.Second, "first pass spooled", func() bool {
		var n int
		ta.metrics.read(func(m *recMetrics) { n = m.spool })
		return n == 1
	})

	ta.stop()

	// Run 2, coordinator up: run 1's result is delivered; the Xids it
	// reported are not new any more; the hello carries the inventory kept
	// from run 1 before run 2's own pass is done.
	c := newFakeCoord()
	tn.serve(t, c)
	ta2 := startAgent(t, cfg, &fakeHost{Host: b}, tn)
	testwait.Until(t, 10*time.Second, "both results stored", func() bool { return c.stored() == 2 })
	ta2.stop()

	var results []*fleetcheckv1.Result
	var hello *fleetcheckv1.Hello
	c.get(func(c *fakeCoord) {
		hello = c.hellos[0]
		for _, ev := range c.events {
			if id, ok := strings.CutPrefix(ev, "result:"); ok {
				results = append(results, c.results[id])
			}
		}
	})
	if len(hello.GetInventory().GetGpus()) == 0 {
		t.Errorf("hello after restart has no inventory")
	}
	newEvents := func(r *fleetcheckv1.Result) float64 {
		for _, ch := range r.GetChecks() {
			if ch.GetName() == "gpu.xid" {
				return wire.MetricsFromProto(ch.GetMetrics())["xid.new_event_count"]
			}
		}
		t.Fatalf("no gpu.xid in result %s", r.GetId())
		return 0
	}
	if len(results) != 2 || results[0].GetId() >= results[1].GetId() {
		t.Fatalf("want run 1's result then run 2's, in id order: %v", results)
	}
	if n := newEvents(results[0]); n == 0 {
		t.Errorf("run 1 saw no new Xid events on a bundle full of them")
	}
	if n := newEvents(results[1]); n != 0 {
		t.Errorf("run 2 reported %v Xid events as new again after restart", n)
	}
}

func TestRunChecksRefusals(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	cfg := testConfig(t)
	cfg.EnabledChecks = []string{"gpu.inventory", "gpu.ecc", "gpu.xid", "ib.ports", "nccl.allreduce"}
	var act atomic.Value
	act.Store(ActivityBusy)
	startAgent(t, cfg, &fakeHost{}, tn, WithActivitySource(ActivityFunc(func(context.Context) (Activity, error) {
		return act.Load().(Activity), nil
	})))
	testwait.Until(t, 10*time.Second, "connected", c.connected)

	tests := []struct {
		work   string
		checks []string
		reason string // substring of the refusal; "" = accepted
	}{
		{"w-unknown", []string{"gpu.ecc", "rm -rf /"}, `unknown check "rm -rf /"`},
		{"w-disabled", []string{"dcgm.diag"}, `check "dcgm.diag" is not enabled on this agent`},
		{"w-busy", []string{"gpu.ecc", "nccl.allreduce"}, `check "nccl.allreduce" is disruptive and the node is busy (allowed when idle or drained)`},
		{"", []string{"gpu.ecc"}, "missing work_id"},
		{"w-many", slices.Repeat([]string{"gpu.ecc"}, 65), "too many checks"},
	}
	for _, tc := range tests {
		c.runChecks(t, &fleetcheckv1.RunChecks{WorkId: tc.work, Checks: tc.checks, TimeoutMs: 1000})
		testwait.Until(t, 10*time.Second, "refusal of "+tc.work, func() bool {
			return c.hasState(tc.work, fleetcheckv1.WorkStatus_STATE_REFUSED) != nil
		})

		st := c.hasState(tc.work, fleetcheckv1.WorkStatus_STATE_REFUSED)
		if !strings.Contains(st.GetReason(), tc.reason) {
			t.Errorf("%s: reason %q, want it to say %q", tc.work, st.GetReason(), tc.reason)
		}
	}
	// The same disruptive request runs once the node is idle.
	act.Store(ActivityIdle)
	c.runChecks(t, &fleetcheckv1.RunChecks{WorkId: "w-idle", Checks: []string{"nccl.allreduce"}, TimeoutMs: 1000})
	testwait.Until(t, 10*time.Second, "disruptive check done while idle", func() bool {
		return c.hasState("w-idle", fleetcheckv1.WorkStatus_STATE_DONE) != nil
	})

	for _, tc := range tests {
		if c.hasState(tc.work, fleetcheckv1.WorkStatus_STATE_ACCEPTED) != nil {
			t.Errorf("%s was accepted as well as refused", tc.work)
		}
	}
}

func TestAcceptedWorkResultThenDone(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	ta := startAgent(t, testConfig(t), &fakeHost{}, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)

	c.runChecks(t, &fleetcheckv1.RunChecks{WorkId: "w1", Checks: []string{"gpu.ecc", "gpu.inventory", "gpu.ecc"}, TimeoutMs: 5000})
	testwait.Until(t, 10*time.Second, "DONE for w1", func() bool { return c.hasState("w1", fleetcheckv1.WorkStatus_STATE_DONE) != nil })
	done := c.hasState("w1", fleetcheckv1.WorkStatus_STATE_DONE)

	var r *fleetcheckv1.Result
	var events []string
	c.get(func(c *fakeCoord) { r, events = c.results[done.GetResultId()], append([]string(nil), c.events...) })
	if r == nil || r.GetWorkId() != "w1" {
		t.Fatalf("DONE names result %q, stored: %v", done.GetResultId(), r)
	}
	var names []string
	for _, ch := range r.GetChecks() {
		names = append(names, ch.GetName())
	}
	if strings.Join(names, ",") != "gpu.inventory,gpu.ecc" || r.GetFull() {
		t.Errorf("work result checks %v full=%v", names, r.GetFull())
	}
	// Order on the stream: ACCEPTED, the result, then DONE.
	idx := func(ev string) int { return slices.Index(events, ev) }
	acc, res, dn := idx("status:w1:STATE_ACCEPTED:"), idx("result:"+r.GetId()), idx("status:w1:STATE_DONE:"+r.GetId())
	if acc < 0 || res < 0 || dn < 0 || acc >= res || res >= dn {
		t.Errorf("want ACCEPTED < result < DONE, got %d %d %d in %v", acc, res, dn, events)
	}

	// A repeated request (a coordinator resending after a reconnect) is
	// answered from memory, not run again.
	testwait.Until(t, 10*time.Second, "w1 acked", func() bool {
		var n int
		ta.metrics.read(func(m *recMetrics) { n = m.spool })
		return n == 0
	})

	var before int
	ta.metrics.read(func(m *recMetrics) { before = m.workPasses })
	c.runChecks(t, &fleetcheckv1.RunChecks{WorkId: "w1", Checks: []string{"gpu.ecc"}})
	testwait.Until(t, 10*time.Second, "second DONE for w1", func() bool {
		n := 0
		for _, s := range c.statusOf("w1") {
			if s.GetState() == fleetcheckv1.WorkStatus_STATE_DONE {
				n++
			}
		}
		return n == 2
	})

	var after int
	ta.metrics.read(func(m *recMetrics) { after = m.workPasses })
	if after != before {
		t.Errorf("repeated work id ran again")
	}
	if st := c.statusOf("w1"); st[len(st)-1].GetResultId() != r.GetId() {
		t.Errorf("repeat answered with result %q, want %q", st[len(st)-1].GetResultId(), r.GetId())
	}
}

func TestHungCheckDoesNotBlockStream(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	c.heartbeatMs = 200
	tn.serve(t, c)
	cfg := testConfig(t)
	cfg.EnabledChecks = []string{"gpu.inventory", "gpu.ecc", "gpu.xid", "dcgm.diag"}
	cfg.Activity = ActivityIdle
	h := &fakeHost{hang: map[snapshot.Source]bool{snapshot.SrcDCGMDiag: true}}
	ta := startAgent(t, cfg, h, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)

	c.runChecks(t, &fleetcheckv1.RunChecks{WorkId: "w-hung", Checks: []string{"dcgm.diag"}, TimeoutMs: 60000})
	testwait.Until(t, 10*time.Second, "hung work accepted", func() bool {
		return c.hasState("w-hung", fleetcheckv1.WorkStatus_STATE_ACCEPTED) != nil
	})

	var hb0 int
	c.get(func(c *fakeCoord) { hb0 = c.heartbeats })
	stored0 := c.stored()

	// While it hangs: heartbeats keep flowing, scheduled passes are stored
	// and acked, and another request runs to completion.
	c.runChecks(t, &fleetcheckv1.RunChecks{WorkId: "w-quick", Checks: []string{"gpu.ecc"}, TimeoutMs: 5000})
	testwait.Until(t, 10*time.Second, "other work done while one hangs", func() bool {
		return c.hasState("w-quick", fleetcheckv1.WorkStatus_STATE_DONE) != nil
	})

	testwait.Until(t, 10*time.Second, "heartbeats while a check hangs", func() bool {
		var n int
		c.get(func(c *fakeCoord) { n = c.heartbeats })
		return n >= hb0+3
	})

	testwait.Until(t, 10*time.Second, "a scheduled pass stored and acked while a check hangs", func() bool {
		var spooled int
		ta.metrics.read(func(m *recMetrics) { spooled = m.spool })
		return c.stored() >= stored0+2 && spooled == 0
	})

	if c.hasState("w-hung", fleetcheckv1.WorkStatus_STATE_DONE) != nil {
		t.Fatal("the hung check finished")
	}
	// A second request for the same source joins the stuck read instead of
	// starting another, and ends at its own deadline.
	c.runChecks(t, &fleetcheckv1.RunChecks{WorkId: "w-hung2", Checks: []string{"dcgm.diag"}, TimeoutMs: 200})
	testwait.Until(t, 10*time.Second, "second dcgm request ends at its deadline", func() bool {
		return c.hasState("w-hung2", fleetcheckv1.WorkStatus_STATE_DONE) != nil
	})

	st := c.hasState("w-hung2", fleetcheckv1.WorkStatus_STATE_DONE)
	var r *fleetcheckv1.Result
	c.get(func(c *fakeCoord) { r = c.results[st.GetResultId()] })
	if got := r.GetChecks()[0]; got.GetStatus() != "error" || !strings.Contains(got.GetReason(), "still running") {
		t.Errorf("joined hung read: status %s reason %q", got.GetStatus(), got.GetReason())
	}

	// Stopping does not wait for the hung check.
	start := time.Now()
	ta.stop()
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("stop took %s with a hung check", d)
	}
}

func TestRefusedHelloBacksOff(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	c.refuse = "protocol 0.1 is too old for coordinator 1.0; upgrade the agent"
	tn.serve(t, c)
	ta := startAgent(t, testConfig(t), &fakeHost{}, tn)
	ta.backoff.mu.Lock()
	ta.backoff.wait = 150 * time.Millisecond
	ta.backoff.mu.Unlock()

	testwait.Until(t, 10*time.Second, "four refused attempts", func() bool {
		var n int
		c.get(func(c *fakeCoord) { n = c.connects })
		return n >= 4
	})

	// Attempts are spaced by the backoff, never back to back.
	var at []time.Time
	c.get(func(c *fakeCoord) { at = append(at, c.connectAt...) })
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < 140*time.Millisecond {
			t.Errorf("attempt %d came %s after the previous one; backoff is 150ms", i, gap)
		}
	}
	calls := ta.backoff.calls()
	for i, a := range calls {
		if a != i {
			t.Fatalf("backoff attempts %v: must grow while refused", calls)
		}
	}
	logs := ta.logs.String()
	if !strings.Contains(logs, "coordinator refused this agent") || !strings.Contains(logs, "upgrade the agent") {
		t.Errorf("refusal not logged with its reason: %s", logs)
	}
	// The results wait in the spool.
	var spooled int
	ta.metrics.read(func(m *recMetrics) { spooled = m.spool })
	if spooled == 0 {
		t.Errorf("scheduled result not kept while refused")
	}
}

func TestSilentCoordinatorReconnects(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	c.silent = true // a half-open connection: nothing comes back
	c.heartbeatMs = 100
	tn.serve(t, c)
	ta := startAgent(t, testConfig(t), &fakeHost{}, tn)
	testwait.Until(t, 10*time.Second, "reconnect after three silent intervals", func() bool {
		var n int
		c.get(func(c *fakeCoord) { n = c.connects })
		return n >= 2
	})

	if !strings.Contains(ta.logs.String(), "silent") {
		t.Errorf("no log of the silence")
	}
}

func TestRefusedResultDropped(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	c.refuseRes = `result claims node "gpu-999"`
	tn.serve(t, c)
	ta := startAgent(t, testConfig(t), &fakeHost{}, tn)
	testwait.Until(t, 10*time.Second, "refused result dropped from the spool", func() bool {
		var spooled, refused int
		ta.metrics.read(func(m *recMetrics) { spooled, refused = m.spool, m.refused })
		return refused >= 1 && spooled == 0
	})

	if !strings.Contains(ta.logs.String(), "coordinator refused a result") || !strings.Contains(ta.logs.String(), "gpu-999") {
		t.Errorf("refusal not logged with its reason")
	}
}

func TestNoWelcomeTimesOut(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	c.noWelcome = true
	tn.serve(t, c)
	ta := startAgent(t, testConfig(t), &fakeHost{}, tn, WithTimeouts(200*time.Millisecond, 0, 0))
	testwait.Until(t, 10*time.Second, "a second attempt after the hello timed out", func() bool {
		var n int
		c.get(func(c *fakeCoord) { n = c.connects })
		return n >= 2
	})

	if !strings.Contains(ta.logs.String(), "no welcome from the coordinator in time") {
		t.Errorf("hello timeout not logged")
	}
}

func TestStateDirLocked(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	cfg := testConfig(t)
	first := startAgent(t, cfg, &fakeHost{}, tn)
	// The first agent logs its start once it holds the state dir.
	testwait.Until(t, 10*time.Second, "the first agent started", func() bool {
		return strings.Contains(first.logs.String(), "agent starting")
	})
	a, err := New(cfg, &fakeHost{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := a.Run(ctx); !errors.Is(err, ErrStateDirInUse) {
		t.Fatalf("second agent on one state dir: %v", err)
	}
}

func TestAdmitTimeouts(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	a, err := New(cfg, &fakeHost{}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		ms   int64
		want time.Duration
	}{
		{0, DefaultWorkTimeout},
		{-5, DefaultWorkTimeout},
		{1500, 1500 * time.Millisecond},
		{int64(10 * time.Hour / time.Millisecond), DefaultMaxWorkTimeout},
	}
	for _, tc := range tests {
		_, got, reason := a.admit(context.Background(), &fleetcheckv1.RunChecks{WorkId: "w", Checks: []string{"gpu.ecc"}, TimeoutMs: tc.ms})
		if reason != "" || got != tc.want {
			t.Errorf("timeout_ms %d: got %s (%q), want %s", tc.ms, got, reason, tc.want)
		}
	}
	// No names: the quick pass.
	list, _, reason := a.admit(context.Background(), &fleetcheckv1.RunChecks{WorkId: "w"})
	if reason != "" || len(list) != len(a.passive) {
		t.Errorf("empty request: %d checks (%q), want the %d passive", len(list), reason, len(a.passive))
	}
}

// A node whose config leaves a passive check out still sends full results:
// full means every enabled passive check ran, or the node would never be
// healthy at the coordinator.
func TestScheduledResultFullWithSubsetEnabled(t *testing.T) {
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	cfg := testConfig(t)
	cfg.EnabledChecks = []string{"gpu.inventory", "gpu.ecc"}
	startAgent(t, cfg, &fakeHost{}, tn)
	testwait.Until(t, 10*time.Second, "a scheduled result", func() bool { return c.stored() >= 1 })
	c.get(func(c *fakeCoord) {
		for _, r := range c.results {
			if !r.GetFull() || len(r.GetChecks()) != 2 {
				t.Errorf("scheduled result with 2 enabled passive checks: full=%v checks=%d", r.GetFull(), len(r.GetChecks()))
			}
		}
	})
}

// fullDisk is a filesystem with no space left: the spool cannot write a
// result file.
type fullDisk struct{}

func (fullDisk) OpenFile(name string, flag int, perm os.FileMode) (spool.File, error) {
	return nil, &os.PathError{Op: "open", Path: name, Err: syscall.ENOSPC}
}
func (fullDisk) Rename(o, n string) error { return os.Rename(o, n) }
func (fullDisk) Remove(name string) error { return os.Remove(name) }

// A result that cannot be spooled is lost: it is counted, once, as
// no_space, besides the error log.
func TestFullSpoolDiskCountsEveryLostResult(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	ta := startAgent(t, testConfig(t), &fakeHost{}, tn, WithSpoolFS(fullDisk{}))
	testwait.Until(t, 10*time.Second, "two passes", func() bool {
		var n int
		ta.metrics.read(func(m *recMetrics) { n = m.passes })
		return n >= 2
	})

	ta.stop()
	var passes int
	var dropped map[string]int
	ta.metrics.read(func(m *recMetrics) { passes, dropped = m.passes+m.workPasses, maps.Clone(m.dropped) })
	if dropped[string(spool.DropNoSpace)] != passes || len(dropped) != 1 {
		t.Errorf("%d results lost to a full disk, counted %v", passes, dropped)
	}
	if c.stored() != 0 {
		t.Errorf("%d results reached the coordinator from a full disk", c.stored())
	}
	if !strings.Contains(ta.logs.String(), "cannot spool result") {
		t.Error("no error log for the lost results")
	}
}

// A coordinator whose welcome says metric_columns gets each check's
// metrics as columns, one older than that as entries; both read the same.
func TestResultMetricsFollowTheWelcome(t *testing.T) {
	t.Parallel()
	got := map[bool][]report.CheckResult{}
	for _, columns := range []bool{false, true} {
		tn := &testNet{}
		c := newFakeCoord()
		c.columns = columns
		tn.serve(t, c)
		startAgent(t, testConfig(t), &fakeHost{}, tn)
		testwait.Until(t, 10*time.Second, "a scheduled result stored", func() bool { return c.stored() >= 1 })
		c.get(func(c *fakeCoord) {
			for _, r := range c.results {
				sent := 0
				for _, ch := range r.GetChecks() {
					if columns && len(ch.GetMetrics()) > 0 || !columns && ch.GetMetricNames() != "" {
						t.Errorf("columns=%v: check %s sent %d entries and names %q", columns, ch.GetName(), len(ch.GetMetrics()), ch.GetMetricNames())
					}
					sent += len(ch.GetMetrics()) + len(ch.GetMetricValues())
				}
				if sent == 0 {
					t.Errorf("columns=%v: a result without metrics", columns)
				}
				if err := wire.CheckMetricsValid(r); err != nil {
					t.Error(err)
				}
				got[columns] = wire.ChecksFromProto(r.GetChecks())
				break
			}
		})
	}
	names := func(cs []report.CheckResult) map[string][]string {
		out := map[string][]string{}
		for _, c := range cs {
			out[c.Name] = slices.Sorted(maps.Keys(c.Metrics))
		}
		return out
	}
	if a, b := names(got[false]), names(got[true]); !reflect.DeepEqual(a, b) {
		t.Errorf("metric names differ by form:\nentries %v\ncolumns %v", a, b)
	}
}
