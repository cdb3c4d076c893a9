package rollout

import (
	"strings"
	"testing"
	"time"
)

// waveSpec is a canary and one wave of the rest, no soak, no approval.
func waveSpec() *Spec {
	spec := baseSpec()
	spec.Waves = []Amount{Percent(100)}
	spec.Soak = 0
	return spec
}

// TestRestartWaitsForReconnectingAgent is the operator's report: the
// coordinator restarts mid-rollout, the next node's agent is still in its
// reconnect backoff when its turn comes. It must be waited for and
// upgraded, not skipped while the wave "passes" with nothing done.
func TestRestartWaitsForReconnectingAgent(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2)
	spec := waveSpec()
	spec.Approval = ApprovalManual
	id := h.start(spec)
	if s := h.runUntil(id, 100, settled); s.Phase != PhaseAwaitingApproval {
		t.Fatalf("phase %s", s.Phase)
	}

	// The coordinator restarts: every agent has to reconnect, gpu-002's
	// after 40s of backoff. The operator approves wave 1 at once.
	h.fleet.set("gpu-002", func(n *fnode) { n.rebootUntil = h.clock.Now().Add(40 * time.Second) })
	h.eng = h.newEngine()
	if err := h.eng.Approve(h.ctx, id); err != nil {
		t.Fatal(err)
	}
	s := h.runUntil(id, 100, settled)
	if s.Phase != PhaseCompleted || s.Counts[Done] != 2 || s.Waves[1].State != "passed" || s.Incomplete != "" {
		t.Fatalf("phase %s counts %v waves %+v incomplete %q", s.Phase, s.Counts, s.Waves, s.Incomplete)
	}
	if h.fleet.upgradeCalls()["gpu-002"] != 1 {
		t.Fatalf("gpu-002 not upgraded: %v", h.fleet.upgradeCalls())
	}
}

// TestAgentAwayPastGraceSkipsAndHalts: a node whose agent stays away is
// shown waiting for the grace, then skipped with the reason, and the wave
// does not pass: the skip counts against its budget.
func TestAgentAwayPastGraceSkipsAndHalts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	spec := waveSpec()
	spec.ConnectGrace = Duration(2 * time.Minute)
	id := h.start(spec)
	h.fleet.set("gpu-003", func(n *fnode) { n.disconnect = true }) // away from after the plan on

	var turn time.Time
	s := h.runUntil(id, 200, func(s *Status) bool {
		n := nodeState(s, "gpu-003")
		if n.Waiting != "" && turn.IsZero() {
			turn = h.clock.Now()
			if !strings.Contains(n.Waiting, "waits up to 2m0s") || !strings.Contains(s.Blocked, "gpu-003: waiting for the agent") {
				t.Errorf("waiting %q blocked %q", n.Waiting, s.Blocked)
			}
		}
		if n.State == Skipped && h.clock.Now().Sub(turn) < 2*time.Minute {
			t.Fatalf("skipped %v after its turn, before the grace", h.clock.Now().Sub(turn))
		}
		return settled(s)
	})
	n := nodeState(s, "gpu-003")
	if turn.IsZero() || n.State != Skipped || n.Reason != "agent not connected: waited 2m0s after its turn came: not upgraded" {
		t.Fatalf("gpu-003 %+v (turn %v)", n, turn)
	}
	if s.Phase != PhaseHalted || s.HaltReason != "wave 1: 1 skipped, budget 0" || s.Waves[1].State != "halted" {
		t.Fatalf("phase %s halt %q waves %+v", s.Phase, s.HaltReason, s.Waves)
	}
	if !strings.Contains(s.Incomplete, "gpu-003 skipped (agent not connected: waited 2m0s") {
		t.Fatalf("incomplete %q", s.Incomplete)
	}
}

// TestConnectivityJudgedAtTheTurn: the fleet was listed while gpu-002's
// agent was away; it reconnected seconds before its turn. The engine asks
// the fleet at the turn instead of trusting the older listing, so the node
// starts at once, without waiting at all.
func TestConnectivityJudgedAtTheTurn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2)
	id := h.start(waveSpec())
	for i := 0; ; i++ {
		if i > 300 {
			t.Fatal("gpu-002's turn never came")
		}
		// Before every step the engine's listing is 5s old and shows
		// gpu-002 away; by the step it is back.
		h.fleet.set("gpu-002", func(n *fnode) { n.disconnect = true })
		h.eng.mu.Lock()
		h.eng.listFleet(h.ctx, h.clock.Now())
		h.eng.mu.Unlock()
		h.fleet.set("gpu-002", func(n *fnode) { n.disconnect = false })
		h.clock.advance(5 * time.Second)
		if err := h.eng.Step(h.ctx); err != nil {
			t.Fatal(err)
		}
		h.eng.waitOps()
		if nodeState(h.status(id), "gpu-002").State != Pending {
			break
		}
	}
	if n := nodeState(h.status(id), "gpu-002"); n.State != DrainRequired && n.State != Draining {
		t.Fatalf("gpu-002 at its turn: %+v", n)
	}
	hist, err := h.eng.History(h.ctx, id, "gpu-002", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range hist {
		if strings.Contains(e.Message, "not connected") {
			t.Fatalf("gpu-002 judged from the stale listing: %q", e.Message)
		}
	}
}

func TestConnectGraceRange(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		grace Duration
		ok    bool
	}{{0, true}, {Duration(time.Minute), true}, {Duration(time.Second), false}, {Duration(48 * time.Hour), false}} {
		spec := baseSpec()
		spec.ConnectGrace = tc.grace
		err := spec.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("connect_grace %v: %v", tc.grace.D(), err)
		}
		if err != nil && !strings.Contains(err.Error(), "connect_grace") {
			t.Errorf("error does not name the field: %v", err)
		}
		if tc.grace == 0 && spec.ConnectGrace.D() != 2*time.Minute {
			t.Errorf("default grace %v", spec.ConnectGrace.D())
		}
	}
}

// TestNothingMeasuredIsInconclusive: after the upgrade the agent sees no
// GPU at all and its checks pass on nothing. That is no evidence: the
// inspection is inconclusive, the rollout pauses, the node is not done.
func TestNothingMeasuredIsInconclusive(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2)
	h.fleet.set("gpu-001", func(n *fnode) { n.blankAfter = true })
	id := h.start(waveSpec())
	s := h.runUntil(id, 200, settled)
	n := nodeState(s, "gpu-001")
	if !s.Paused || n.State == Done || !strings.Contains(n.Hold, "the report shows no GPU") {
		t.Fatalf("phase %s paused %v gpu-001 %+v", s.Phase, s.Paused, n)
	}
}

// TestStartWhileAgentAwayPlansAndWaits is the operator's second report: a
// fresh `rollout start` while an agent is in its reconnect backoff. The
// node is planned into its wave (marked), not left out, and upgraded once
// its agent is back: the rollout completes with nothing left undone.
func TestStartWhileAgentAwayPlansAndWaits(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	// gpu-003's agent comes back 90s after the start: at or before its turn.
	h.fleet.set("gpu-003", func(n *fnode) { n.rebootUntil = h.clock.Now().Add(90 * time.Second) })
	id := h.start(waveSpec())
	s := h.status(id)
	if n := nodeState(s, "gpu-003"); n.State != Pending || n.Wave != 1 {
		t.Fatalf("gpu-003 not planned into wave 1: %+v", n)
	}
	if len(s.Excluded) != 0 {
		t.Fatalf("excluded %+v", s.Excluded)
	}
	s = h.runUntil(id, 300, settled)
	if s.Phase != PhaseCompleted || s.Counts[Done] != 3 || s.Incomplete != "" || s.Waves[1].State != "passed" {
		t.Fatalf("phase %s counts %v waves %+v incomplete %q", s.Phase, s.Counts, s.Waves, s.Incomplete)
	}
	if c := h.fleet.upgradeCalls()["gpu-003"]; c != 1 {
		t.Fatalf("gpu-003 upgraded %d times", c)
	}
	hist, err := h.eng.History(h.ctx, id, "gpu-003", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) == 0 || !strings.Contains(hist[0].Message, "planned: disconnected at plan time: will be waited for 2m0s") {
		t.Fatalf("history does not say it was planned while away: %+v", hist)
	}
}

// TestStartWhileAgentAwayNeverBack: planned while away and never back.
// At its turn it is waited for connect_grace, then skipped; the skip
// counts against the wave, which does not pass, and the rollout says so.
func TestStartWhileAgentAwayNeverBack(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	h.fleet.set("gpu-003", func(n *fnode) { n.disconnect = true })
	spec := waveSpec()
	spec.ConnectGrace = Duration(time.Minute)
	id := h.start(spec)
	var turn time.Time
	s := h.runUntil(id, 300, func(s *Status) bool {
		if n := nodeState(s, "gpu-003"); n.Waiting != "" && turn.IsZero() {
			turn = h.clock.Now()
		} else if n.State == Skipped && h.clock.Now().Sub(turn) < time.Minute {
			t.Fatalf("skipped %v after its turn, before the grace", h.clock.Now().Sub(turn))
		}
		return settled(s)
	})
	n := nodeState(s, "gpu-003")
	if turn.IsZero() || n.State != Skipped || n.Reason != "agent not connected: waited 1m0s after its turn came: not upgraded" {
		t.Fatalf("gpu-003 %+v (turn %v)", n, turn)
	}
	if s.Phase != PhaseHalted || s.HaltReason != "wave 1: 1 skipped, budget 0" || s.Waves[1].State != "halted" {
		t.Fatalf("phase %s halt %q waves %+v", s.Phase, s.HaltReason, s.Waves)
	}
	if !strings.Contains(s.Incomplete, "gpu-003 skipped") {
		t.Fatalf("incomplete %q", s.Incomplete)
	}
	if c := h.fleet.upgradeCalls()["gpu-003"]; c != 0 {
		t.Fatalf("gpu-003 upgraded %d times", c)
	}
}

// TestAwayAtPlanHoldsMaxUnavailable: a node planned while its agent is
// away is out of service until it reconnects. With max_unavailable 1 the
// rollout waits and says why, rather than taking a second node out; once
// the agent is back every node is upgraded.
func TestAwayAtPlanHoldsMaxUnavailable(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	h.fleet.set("gpu-003", func(n *fnode) { n.disconnect = true })
	spec := waveSpec()
	spec.MaxUnavailable = Count(1)
	id := h.start(spec)
	for range 20 { // 400s of virtual time: past the grace too
		h.step()
	}
	s := h.status(id)
	if c := h.fleet.upgradeCalls(); len(c) != 0 || !strings.Contains(s.Blocked, "max unavailable reached: 1 of 3") {
		t.Fatalf("upgrades %v blocked %q", c, s.Blocked)
	}
	h.fleet.set("gpu-003", func(n *fnode) { n.disconnect = false })
	s = h.runUntil(id, 300, settled)
	if s.Phase != PhaseCompleted || s.Counts[Done] != 3 || s.Incomplete != "" {
		t.Fatalf("phase %s counts %v incomplete %q", s.Phase, s.Counts, s.Incomplete)
	}
}
