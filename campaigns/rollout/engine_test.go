package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// On both databases: every campaign engine uses the same store.
func TestHealthyRolloutInWaves(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, open func(testing.TB) *sqldb.DB) { healthyRollout(t, newHarnessOn(t, 9, open(t))) })
}

func healthyRollout(t *testing.T, h *harness) {
	spec := baseSpec()
	spec.Approval = ApprovalManual
	h.drain.jobsTill["gpu-002"] = h.clock.Now().Add(5 * time.Minute) // a job to wait for
	id := h.start(spec)

	s := h.runUntil(id, 200, settled)
	if s.Phase != PhaseAwaitingApproval {
		t.Fatalf("after the canary: phase %s, counts %v", s.Phase, s.Counts)
	}
	if s.Counts[Done] != 1 || s.Counts[Pending] != 8 {
		t.Fatalf("counts %v", s.Counts)
	}
	if err := h.eng.Approve(h.ctx, id); err != nil {
		t.Fatal(err)
	}
	s = h.runUntil(id, 500, settled)
	if s.Phase != PhaseCompleted || s.Counts[Done] != 9 {
		t.Fatalf("phase %s counts %v halt %q", s.Phase, s.Counts, s.HaltReason)
	}
	for name, c := range h.fleet.upgradeCalls() {
		if c != 1 {
			t.Errorf("%s upgraded %d times", name, c)
		}
	}
	if len(h.fleet.upgradeCalls()) != 9 {
		t.Fatalf("upgraded %v", h.fleet.upgradeCalls())
	}
	if d := h.drain.ourDrains(); len(d) != 0 {
		t.Fatalf("left drained: %v", d)
	}
	n := nodeState(s, "gpu-001")
	if n.Baseline != 480 || !strings.Contains(n.BaselineFrom, "measured before the upgrade") {
		t.Fatalf("baseline %+v", n)
	}
	// Waves: canary 1, then 50 % of the 8 left: 4 and 4.
	if len(s.Waves) != 3 || s.Waves[1].Size != 4 || s.Waves[2].Size != 4 {
		t.Fatalf("waves %+v", s.Waves)
	}
	if _, err := json.Marshal(s); err != nil {
		t.Fatal(err)
	}
	hist, err := h.eng.History(h.ctx, id, "gpu-002", 0)
	if err != nil {
		t.Fatal(err)
	}
	var path []string
	for _, e := range hist {
		if e.Kind == evTransition {
			path = append(path, string(e.To))
		}
	}
	want := "drain-required draining upgrade-required upgrading rebooting validating undrain-required done"
	if strings.Join(path, " ") != want {
		t.Fatalf("gpu-002 path:\n%s\nwant:\n%s", strings.Join(path, " "), want)
	}
}

func TestCanaryFailureHaltsBeforeWaveOne(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 6)
	h.fleet.set("gpu-001", func(n *fnode) { n.badAfter = true })
	id := h.start(baseSpec())
	s := h.runUntil(id, 200, settled)
	if s.Phase != PhaseHalted {
		t.Fatalf("phase %s, counts %v", s.Phase, s.Counts)
	}
	if s.Counts[Failed] != 1 || s.Counts[Pending] != 5 {
		t.Fatalf("counts %v", s.Counts)
	}
	if s.HaltReason != "canary: 1 failed, budget 0" || len(s.Evidence) != 1 || !strings.Contains(s.Evidence[0], "XID_79") {
		t.Fatalf("halt %q evidence %q", s.HaltReason, s.Evidence)
	}
	if calls := h.fleet.upgradeCalls(); len(calls) != 1 || calls["gpu-001"] != 1 {
		t.Fatalf("upgrade calls %v", calls)
	}
	// The failed canary stays drained, with the reason; nothing else was touched.
	if d := h.drain.ourDrains(); len(d) != 1 || d[0] != "gpu-001" {
		t.Fatalf("drained %v", d)
	}
	if n := nodeState(s, "gpu-001"); n.State != Failed || !strings.Contains(n.Reason, "gpu.xid failed") {
		t.Fatalf("canary %+v", n)
	}
	// Still halted after more time.
	for range 20 {
		h.step()
	}
	if s := h.status(id); s.Phase != PhaseHalted || s.Counts[Pending] != 5 {
		t.Fatalf("moved on while halted: %s %v", s.Phase, s.Counts)
	}
	// Rollback of a rollout with nothing done: no node to roll back.
	if err := h.eng.Rollback(h.ctx, id); err != nil {
		t.Fatal(err)
	}
	s = h.runUntil(id, 10, settled)
	if s.Phase != PhaseRolledBack || s.Counts[Skipped] != 5 || s.Counts[Failed] != 1 {
		t.Fatalf("after rollback: %s %v", s.Phase, s.Counts)
	}
	// The canary's wave ran and was undone; the waves never reached were skipped.
	for _, w := range s.Waves {
		if want := map[bool]string{true: "rolled-back", false: "skipped"}[w.Index == 0]; w.State != want {
			t.Errorf("wave %d shows %q after rolling back a halted canary, want %s", w.Index, w.State, want)
		}
	}
}

func TestBudgetArithmetic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a      Amount
		total  int
		of, fl int
	}{
		{Percent(10), 95, 10, 9},
		{Percent(10), 100, 10, 10},
		{Percent(2.5), 40, 1, 1},
		{Percent(1), 50, 1, 0},
		{Count(3), 50, 3, 3},
		{Percent(0), 10, 0, 0},
		{Percent(100), 7, 7, 7},
	} {
		if got := tc.a.Of(tc.total); got != tc.of {
			t.Errorf("%s of %d = %d, want %d", tc.a, tc.total, got, tc.of)
		}
		if got := tc.a.Floor(tc.total); got != tc.fl {
			t.Errorf("floor %s of %d = %d, want %d", tc.a, tc.total, got, tc.fl)
		}
	}

	// A wave of 10 with a 10 % budget tolerates one failure, not two.
	for _, failures := range []int{1, 2} {
		t.Run(strings.Repeat("x", failures), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, 11)
			for i := range failures {
				h.fleet.set([]string{"gpu-003", "gpu-007"}[i], func(n *fnode) { n.badAfter = true })
			}
			spec := baseSpec()
			spec.Waves = []Amount{Percent(100)}
			spec.FailureBudget.Wave = Percent(10)
			spec.MaxUnavailable = Count(20)
			id := h.start(spec)
			s := h.runUntil(id, 300, settled)
			if s.Waves[1].Budget != 1 {
				t.Fatalf("budget %d", s.Waves[1].Budget)
			}
			want := PhaseCompleted
			if failures == 2 {
				want = PhaseHalted
			}
			if s.Phase != want || s.Counts[Failed] != failures {
				t.Fatalf("%d failures: phase %s counts %v", failures, s.Phase, s.Counts)
			}
		})
	}
}

func TestAgentLostMidUpgrade(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	h.fleet.set("gpu-001", func(n *fnode) { n.lost = true })
	spec := baseSpec()
	spec.Deadlines.Rebooting = Duration(10 * time.Minute)
	id := h.start(spec)
	s := h.runUntil(id, 200, settled)
	if s.Phase != PhaseHalted {
		t.Fatalf("phase %s", s.Phase)
	}
	n := nodeState(s, "gpu-001")
	if n.State != Failed || !strings.Contains(n.Reason, "did not return with driver "+newDriver) || !strings.Contains(n.Reason, "unreachable") {
		t.Fatalf("node %+v", n)
	}
	if !n.DrainedByUs || s.Unavailable != 1 {
		t.Fatalf("a failed node stays out of service on our account: %+v, unavailable %d", n, s.Unavailable)
	}
}

func TestActionOutcomes(t *testing.T) {
	t.Parallel()
	t.Run("action fails", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 2)
		h.fleet.set("gpu-001", func(n *fnode) { n.failAction = true })
		id := h.start(baseSpec())
		s := h.runUntil(id, 100, settled)
		n := nodeState(s, "gpu-001")
		if s.Phase != PhaseHalted || n.State != Failed || !strings.Contains(n.Reason, "dkms build failed") || len(n.Evidence) != 1 {
			t.Fatalf("%s %+v", s.Phase, n)
		}
	})
	t.Run("answer lost", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 2)
		h.fleet.set("gpu-001", func(n *fnode) { n.actionNoReply = true })
		id := h.start(baseSpec())
		s := h.runUntil(id, 200, settled)
		if s.Phase != PhaseCompleted || h.fleet.upgradeCalls()["gpu-001"] != 1 {
			t.Fatalf("%s %v %v", s.Phase, s.Counts, h.fleet.upgradeCalls())
		}
	})
	t.Run("action refused", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 2)
		spec := baseSpec()
		spec.Action = "not-configured"
		id := h.start(spec)
		s := h.runUntil(id, 100, settled)
		if n := nodeState(s, "gpu-001"); n.State != Failed || !strings.Contains(n.Reason, "refused") {
			t.Fatalf("%+v", n)
		}
	})
}

func TestNCCLRegressionFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		factor float64
		want   Phase
	}{{0.65, PhaseHalted}, {0.70, PhaseCompleted}, {0.95, PhaseCompleted}} {
		h := newHarness(t, 2)
		h.fleet.set("gpu-001", func(n *fnode) { n.slowAfter = tc.factor })
		id := h.start(baseSpec())
		s := h.runUntil(id, 200, settled)
		if s.Phase != tc.want {
			t.Fatalf("busbw ×%v: phase %s (%s)", tc.factor, s.Phase, nodeState(s, "gpu-001").Reason)
		}
		if tc.want == PhaseHalted && !strings.Contains(nodeState(s, "gpu-001").Reason, "35.0% below") {
			t.Fatalf("reason %q", nodeState(s, "gpu-001").Reason)
		}
	}
}

func TestInconclusiveValidationPauses(t *testing.T) {
	t.Parallel()
	t.Run("NaN metric then resume", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 3)
		h.fleet.set("gpu-001", func(n *fnode) { n.nanAfter = true })
		id := h.start(baseSpec())
		s := h.runUntil(id, 200, settled)
		n := nodeState(s, "gpu-001")
		if !s.Paused || n.State != Validating || !strings.Contains(n.Hold, "reported no "+DefaultMetric) {
			t.Fatalf("paused %v %q; node %+v", s.Paused, s.PauseReason, n)
		}
		// Paused means paused: nothing moves.
		for range 10 {
			h.step()
		}
		if s2 := h.status(id); s2.Counts[Pending] != 2 || nodeState(s2, "gpu-001").State != Validating {
			t.Fatalf("moved while paused: %v", s2.Counts)
		}
		// A human fixes the node and resumes: the inspection runs again.
		h.fleet.set("gpu-001", func(n *fnode) { n.nanAfter = false })
		if err := h.eng.Resume(h.ctx, id); err != nil {
			t.Fatal(err)
		}
		s = h.runUntil(id, 200, settled)
		if s.Phase != PhaseCompleted {
			t.Fatalf("phase %s counts %v", s.Phase, s.Counts)
		}
	})
	t.Run("timeout then operator fails it", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 3)
		h.fleet.set("gpu-001", func(n *fnode) { n.timeoutAfter = true })
		id := h.start(baseSpec())
		s := h.runUntil(id, 200, settled)
		if n := nodeState(s, "gpu-001"); !s.Paused || !strings.Contains(n.Hold, "timed out") {
			t.Fatalf("paused %v node %+v", s.Paused, n)
		}
		if err := h.eng.ResolveNode(h.ctx, id, "gpu-001", false, "GPU3 hangs"); err != nil {
			t.Fatal(err)
		}
		if err := h.eng.Resume(h.ctx, id); err != nil {
			t.Fatal(err)
		}
		s = h.runUntil(id, 100, settled)
		if s.Phase != PhaseHalted || nodeState(s, "gpu-001").State != Failed {
			t.Fatalf("phase %s, node %+v", s.Phase, nodeState(s, "gpu-001"))
		}
	})
	t.Run("missing pre-upgrade baseline, operator waives", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, 2)
		h.fleet.set("gpu-001", func(n *fnode) { n.busbw = math.NaN() })
		id := h.start(baseSpec())
		s := h.runUntil(id, 100, settled)
		n := nodeState(s, "gpu-001")
		if !s.Paused || n.State != UpgradeRequired || h.fleet.upgradeCalls()["gpu-001"] != 0 {
			t.Fatalf("paused %v node %+v", s.Paused, n)
		}
		if err := h.eng.ResolveNode(h.ctx, id, "gpu-001", true, "no NCCL on this node"); err != nil {
			t.Fatal(err)
		}
		if err := h.eng.Resume(h.ctx, id); err != nil {
			t.Fatal(err)
		}
		// After the upgrade the metric is still NaN: the comparison is waived,
		// but the required NCCL check itself must still answer.
		h.fleet.set("gpu-001", func(n *fnode) { n.busbw = 470 })
		s = h.runUntil(id, 200, settled)
		if s.Phase != PhaseCompleted {
			t.Fatalf("phase %s paused %v %q", s.Phase, s.Paused, s.PauseReason)
		}
		if ev := nodeState(s, "gpu-001").Evidence; len(ev) == 0 || !strings.Contains(strings.Join(ev, " "), "waived") {
			t.Fatalf("evidence %q", ev)
		}
	})
}

func TestForeignDrainNeverResumed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 5)
	// An admin drained gpu-003 before its turn.
	h.drain.Set("gpu-003", drain.Status{Drained: true, Reason: "bad DIMM, ticket 4411"})
	spec := baseSpec()
	spec.MaxUnavailable = Count(3)
	spec.FailureBudget.Wave = Count(1) // the skipped gpu-003 fits the budget
	id := h.start(spec)

	// While gpu-001 (the canary) validates, someone drains it for their own
	// reason: the rollout must leave it drained.
	for i := 0; i < 200; i++ {
		h.step()
		if nodeState(h.status(id), "gpu-001").State == Validating {
			h.drain.Set("gpu-001", drain.Status{Drained: true, Reason: "PSU swap"})
			break
		}
	}
	s := h.runUntil(id, 300, settled)
	if s.Phase != PhaseCompleted || s.Waves[1].State != "incomplete" || !strings.Contains(s.Incomplete, "gpu-003 skipped") {
		t.Fatalf("phase %s counts %v waves %+v incomplete %q", s.Phase, s.Counts, s.Waves, s.Incomplete)
	}
	if n := nodeState(s, "gpu-003"); n.State != Skipped || !strings.Contains(n.Reason, "bad DIMM") {
		t.Fatalf("gpu-003 %+v", n)
	}
	if n := nodeState(s, "gpu-001"); n.State != Done || !strings.Contains(n.Reason, "left out of service") {
		t.Fatalf("gpu-001 %+v", n)
	}
	for _, name := range []string{"gpu-001", "gpu-003"} {
		if c := h.drain.undrainCount(name); c != 0 {
			t.Errorf("%s: Undrain called %d times", name, c)
		}
	}
	snap := h.drain.Snapshot()
	if st := snap["gpu-003"]; !st.Drained || st.Reason != "bad DIMM, ticket 4411" {
		t.Fatalf("gpu-003 drain changed: %+v", st)
	}
	if st := snap["gpu-001"]; !st.Drained || st.Reason != "PSU swap" {
		t.Fatalf("gpu-001 drain changed: %+v", st)
	}
	if h.fleet.upgradeCalls()["gpu-003"] != 0 {
		t.Fatal("foreign-drained node upgraded")
	}
}

func TestPreCheckFailureLeavesNodeAsFound(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	h.fleet.set("gpu-002", func(n *fnode) { n.preFail = true })
	spec := baseSpec()
	spec.Waves = []Amount{Percent(100)}
	id := h.start(spec)
	s := h.runUntil(id, 200, settled)
	n := nodeState(s, "gpu-002")
	// A node left as found is not upgraded: it counts against the wave.
	if s.Phase != PhaseHalted || n.State != Skipped || !strings.Contains(n.Reason, "pre-upgrade inspection") || h.fleet.upgradeCalls()["gpu-002"] != 0 {
		t.Fatalf("%s %+v", s.Phase, n)
	}
	if s.HaltReason != "wave 1: 1 skipped, budget 0" || len(s.Evidence) != 1 || !strings.Contains(s.Evidence[0], "gpu-002 skipped: failed its pre-upgrade inspection") {
		t.Fatalf("halt %q evidence %q", s.HaltReason, s.Evidence)
	}
	// The operator accepts it: the rollout completes and still says so.
	if err := h.eng.Resume(h.ctx, id); err != nil {
		t.Fatal(err)
	}
	s = h.runUntil(id, 50, settled)
	if s.Phase != PhaseCompleted || s.Waves[1].State != "incomplete" || !strings.Contains(s.Incomplete, "1 of 3 nodes not upgraded: gpu-002 skipped") {
		t.Fatalf("phase %s waves %+v incomplete %q", s.Phase, s.Waves, s.Incomplete)
	}
	if len(h.drain.ourDrains()) != 0 {
		t.Fatal("left drained")
	}
}

func TestRollback(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4)
	id := h.start(baseSpec())
	if s := h.runUntil(id, 300, settled); s.Phase != PhaseCompleted {
		t.Fatalf("phase %s", s.Phase)
	}
	if err := h.eng.Rollback(h.ctx, id); err != nil {
		t.Fatal(err)
	}
	before := h.status(id)
	s := h.runUntil(id, 300, settled)
	if s.Phase != PhaseRolledBack || s.Counts[RolledBack] != 4 {
		t.Fatalf("phase %s counts %v", s.Phase, s.Counts)
	}
	// The waves keep their nodes through a rollback: the canary is still
	// one node, counted done once rolled back.
	for _, st := range []*Status{before, s} {
		size := 0
		for _, w := range st.Waves {
			size += w.Size
		}
		if len(st.Waves) == 0 || st.Waves[0].Size != 1 || size != 4 {
			t.Errorf("%s: waves %+v, want the canary of 1 and 4 nodes in all", st.Phase, st.Waves)
		}
	}
	if s.Waves[0].Done != 1 || s.Waves[0].Pending != 0 {
		t.Errorf("rolled-back canary wave: %+v", s.Waves[0])
	}
	// Every wave was undone, the last no differently from the others.
	for _, w := range s.Waves {
		if w.State != "rolled-back" {
			t.Errorf("wave %d of a rolled-back rollout shows %q, want rolled-back", w.Index, w.State)
		}
	}
	for _, name := range []string{"gpu-001", "gpu-004"} {
		n := h.fleet.node(name)
		h.fleet.mu.Lock()
		drv, rb := n.driver, n.rollbacks
		h.fleet.mu.Unlock()
		if drv != oldDriver || rb != 1 {
			t.Fatalf("%s driver %s after %d rollbacks", name, drv, rb)
		}
	}
	if len(h.drain.ourDrains()) != 0 {
		t.Fatal("left drained")
	}
	if err := h.eng.Rollback(h.ctx, id); !errors.Is(err, ErrState) {
		t.Fatalf("second rollback: %v", err)
	}
}

func TestAbort(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 8)
	spec := baseSpec()
	spec.Waves = []Amount{Percent(100)}
	spec.MaxUnavailable = Count(3)
	id := h.start(spec)
	for i := 0; i < 300; i++ {
		h.step()
		if s := h.status(id); s.Counts[Done] >= 2 {
			break
		}
	}
	if err := h.eng.Abort(h.ctx, id); err != nil {
		t.Fatal(err)
	}
	s := h.runUntil(id, 300, settled)
	if s.Phase != PhaseAborted || s.Counts[Pending] != 0 || s.Counts[Skipped] == 0 {
		t.Fatalf("phase %s counts %v", s.Phase, s.Counts)
	}
	if len(h.drain.ourDrains()) != 0 {
		t.Fatalf("left drained: %v", h.drain.ourDrains())
	}
	for name, c := range h.fleet.upgradeCalls() {
		if st := nodeState(s, name).State; c != 1 || st != Done {
			t.Fatalf("%s: %d upgrades, state %s", name, c, st)
		}
	}
}

func TestBreakerLimitsDrains(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	b, err := kit.NewBreaker(kit.BreakerConfig{Window: time.Hour, MaxCount: 3}, h.clock)
	if err != nil {
		t.Fatal(err)
	}
	h.breaker = b
	h.eng = h.newEngine()
	spec := baseSpec()
	spec.Waves = []Amount{Percent(100)}
	spec.MaxUnavailable = Count(10)
	spec.Soak = 0
	id := h.start(spec)
	var sawBlocked bool
	for range 100 {
		h.step()
		s := h.status(id)
		if strings.Contains(s.Blocked, "circuit breaker") {
			sawBlocked = true
		}
		if s.Counts[Done] == 3 {
			break
		}
	}
	if !sawBlocked {
		t.Fatal("breaker never blocked")
	}
	if got := len(h.fleet.upgradeCalls()); got != 3 {
		t.Fatalf("%d nodes upgraded within the window, breaker allows 3", got)
	}
	// A restarted engine rebuilds the window from the stored drains.
	b2, _ := kit.NewBreaker(kit.BreakerConfig{Window: time.Hour, MaxCount: 3}, h.clock)
	h.breaker = b2
	h.eng = h.newEngine()
	if st := b2.State(10); st.Drained != 3 || !st.Open {
		t.Fatalf("restored breaker %+v", st)
	}
	// After the window the rollout goes on.
	h.tick = 5 * time.Minute
	s := h.runUntil(id, 200, settled)
	if s.Phase != PhaseCompleted || s.Counts[Done] != 10 {
		t.Fatalf("phase %s counts %v", s.Phase, s.Counts)
	}
}

func TestStartConflictsAndNothingToDo(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	h.start(baseSpec())
	if _, err := h.eng.Start(h.ctx, baseSpec(), h.matrix); !errors.Is(err, ErrConflict) {
		t.Fatalf("second rollout on the same nodes: %v", err)
	}
	h2 := newHarness(t, 2)
	for _, n := range []string{"gpu-001", "gpu-002"} {
		h2.fleet.set(n, func(n *fnode) { n.driver = newDriver })
	}
	if _, err := h2.eng.Start(h2.ctx, baseSpec(), h2.matrix); !errors.Is(err, ErrNothingToDo) {
		t.Fatalf("all up to date: %v", err)
	}
	if _, err := h2.eng.Start(h2.ctx, baseSpec(), nil); !errors.Is(err, ErrNoMatrix) {
		t.Fatalf("no matrix: %v", err)
	}
	if err := h.eng.Approve(h.ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
}

// TestRunOnWallClock drives a small rollout through Run on the real clock.
func TestRunOnWallClock(t *testing.T) {
	t.Parallel()
	clk := kit.WallClock{}
	f := newFakeFleet(clk, 3)
	f.reboot = 20 * time.Millisecond
	dr := newRecordingDrain(clk)
	eng, err := New(context.Background(), kit.Deps{DB: openDB(t, t.TempDir()), Fleet: f, Drainer: dr, Clock: clk, Logger: zerolog.Nop()}, Options{Poll: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	spec := baseSpec()
	spec.Soak = 0
	spec.Waves = []Amount{Percent(100)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	id, err := eng.Start(ctx, spec, mustMatrix(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- eng.Run(ctx) }()
	testwait.For(t, 20*time.Second, "the rollout completed", func() (bool, string) {
		s, err := eng.Status(id)
		if err != nil {
			t.Fatal(err)
		}
		if s.Phase != PhaseCompleted && settled(s) {
			t.Fatalf("settled short of completed: phase %s paused %v counts %v", s.Phase, s.Paused, s.Counts)
		}
		return s.Phase == PhaseCompleted, fmt.Sprintf("phase %s paused %v counts %v", s.Phase, s.Paused, s.Counts)
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
	if l := eng.List(); len(l) != 1 || l[0].Counts[Done] != 3 {
		t.Fatalf("list %+v", l)
	}
}

// TestSkippedCanaryIsReplaced: a canary drained by someone else does not
// count as a passed canary: it halts the rollout (it counts against the
// canary's budget), and once an operator accepts it the next node takes
// its place.
func TestSkippedCanaryIsReplaced(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4)
	h.drain.Set("gpu-001", drain.Status{Drained: true, Reason: "RMA"})
	h.fleet.set("gpu-002", func(n *fnode) { n.badAfter = true })
	spec := baseSpec()
	spec.Waves = []Amount{Percent(100)}
	id := h.start(spec)
	s := h.runUntil(id, 200, settled)
	if s.Phase != PhaseHalted || s.HaltReason != "canary: 1 skipped, budget 0" || s.Waves[0].State != "halted" {
		t.Fatalf("phase %s halt %q waves %+v", s.Phase, s.HaltReason, s.Waves)
	}
	if err := h.eng.Resume(h.ctx, id); err != nil {
		t.Fatal(err)
	}
	s = h.runUntil(id, 200, settled)
	if s.Phase != PhaseHalted || !strings.HasPrefix(s.HaltReason, "canary: 1 failed, 1 skipped") {
		t.Fatalf("phase %s halt %q counts %v", s.Phase, s.HaltReason, s.Counts)
	}
	if n := nodeState(s, "gpu-002"); n.Wave != 0 || n.State != Failed {
		t.Fatalf("gpu-002 %+v", n)
	}
	if c := h.fleet.upgradeCalls(); len(c) != 1 {
		t.Fatalf("upgrades %v", c)
	}
}

// TestStoredBaseline: with stored baselines and no pre-check, the node's
// stored pre-upgrade baseline is the reference, and nothing is measured
// before the upgrade. A node without one pauses the rollout.
func TestStoredBaseline(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2)
	st, err := baselines.NewStats([]float64{600})
	if err != nil {
		t.Fatal(err)
	}
	static := baselines.Static{{
		Key:       baselines.Key{Metric: DefaultMetric, Scope: baselines.NodeScope("gpu-001"), Stack: baselines.Stack{Driver: oldDriver}},
		Direction: baselines.HigherBetter, Samples: st, Value: 600, Version: 3,
	}}
	eng, err := New(context.Background(), kit.Deps{DB: h.db, Fleet: h.fleet, Drainer: h.drain, Clock: h.clock, Logger: zerolog.Nop()},
		Options{Poll: 15 * time.Second, Baselines: static})
	if err != nil {
		t.Fatal(err)
	}
	h.eng = eng
	spec := baseSpec()
	no := false
	spec.Validation.PreCheck = &no
	spec.Validation.Baseline = BaselineStored
	id := h.start(spec)
	// 480 after the upgrade against a stored 600 is 20 % below: passes.
	s := h.runUntil(id, 200, settled)
	n := nodeState(s, "gpu-001")
	if n.State != Done || n.Baseline != 600 || !strings.Contains(n.BaselineFrom, "stored node:gpu-001 v3") {
		t.Fatalf("canary %+v", n)
	}
	// gpu-002 has no stored baseline: inconclusive, paused before its upgrade.
	if !s.Paused || nodeState(s, "gpu-002").State != UpgradeRequired || !strings.Contains(nodeState(s, "gpu-002").Hold, "no stored baseline") {
		t.Fatalf("phase %s paused %v gpu-002 %+v", s.Phase, s.Paused, nodeState(s, "gpu-002"))
	}
	if h.fleet.upgradeCalls()["gpu-002"] != 0 {
		t.Fatal("upgraded without a baseline")
	}
}
