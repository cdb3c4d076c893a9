package rollout

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/drain"
)

// crashScenario is a small rollout with a busy node, a foreign drain and
// a soak, run with the coordinator killed after its k-th write (k = 0:
// never). beforeActing kills it after the write and before the write's
// operations start (the worst moment: the store says "upgrading" and the
// action was never sent); otherwise the operations run to the end and only
// their results are lost.
func crashScenario(t *testing.T, k int, beforeActing bool) (h *harness, id string, writes int) {
	t.Helper()
	h = newHarness(t, 5)
	h.drain.Set("gpu-005", drain.Status{Drained: true, Reason: "maintenance: rack r1 PDU"})
	h.drain.jobsTill["gpu-003"] = h.clock.Now().Add(2 * time.Minute)
	spec := baseSpec()
	spec.Waves = []Amount{Percent(100)}
	spec.MaxUnavailable = Count(3)
	spec.Deadlines.Rebooting = Duration(15 * time.Minute)
	spec.FailureBudget.Wave = Count(1) // the foreign-drained gpu-005 is skipped
	id = h.start(spec)

	crashed := false
	hook := func() bool {
		writes++
		if writes == k {
			crashed = true
			return beforeActing
		}
		return false
	}
	h.eng.afterSave = hook
	for i := 0; i < 400; i++ {
		if err := h.eng.Step(h.ctx); err != nil {
			t.Fatal(err)
		}
		h.eng.waitOps()
		if crashed {
			// The coordinator dies: a new engine on the same database.
			crashed = false
			h.eng = h.newEngine()
			h.eng.afterSave = hook
		}
		h.clock.advance(h.tick)
		if s := h.status(id); settled(s) {
			return h, id, writes
		}
	}
	t.Fatalf("crash at write %d: not settled", k)
	return nil, "", 0
}

// checkInvariants: no node upgraded twice, only this rollout's drains
// undone, no slot leaked (whatever is still drained by fleetcheck is a
// failed node on the rollout's account).
func checkInvariants(t *testing.T, h *harness, id string) *Status {
	t.Helper()
	s := h.status(id)
	for name, c := range h.fleet.upgradeCalls() {
		if c > 1 {
			t.Errorf("%s upgraded %d times", name, c)
		}
	}
	if c := h.drain.undrainCount("gpu-005"); c != 0 {
		t.Errorf("foreign-drained gpu-005: Undrain called %d times", c)
	}
	if st := h.drain.Snapshot()["gpu-005"]; !st.Drained || st.Reason != "maintenance: rack r1 PDU" {
		t.Errorf("gpu-005 drain changed: %+v", st)
	}
	var failed []string
	for _, n := range s.Nodes {
		if n.State == Failed {
			failed = append(failed, n.Node)
		}
		if n.State.active() {
			t.Errorf("%s still %s in a settled rollout", n.Node, n.State)
		}
	}
	slices.Sort(failed)
	if got := h.drain.ourDrains(); !slices.Equal(got, failed) {
		t.Errorf("drained by fleetcheck %v, failed %v: a slot leaked", got, failed)
	}
	if s.Unavailable != len(failed) {
		t.Errorf("rollout holds %d slots, %d nodes failed", s.Unavailable, len(failed))
	}
	return s
}

func TestRestartAtEveryTransition(t *testing.T) {
	t.Parallel()
	h, id, total := crashScenario(t, 0, false)
	if s := checkInvariants(t, h, id); s.Phase != PhaseCompleted || s.Counts[Done] != 4 || s.Counts[Skipped] != 1 {
		t.Fatalf("without crash: %s %v", s.Phase, s.Counts)
	}
	if total < 20 {
		t.Fatalf("only %d writes", total)
	}
	for _, before := range []bool{false, true} {
		for k := 1; k <= total; k++ {
			t.Run(fmt.Sprintf("write%d/beforeActing=%v", k, before), func(t *testing.T) {
				t.Parallel()
				h, id, _ := crashScenario(t, k, before)
				s := checkInvariants(t, h, id)
				if s.Phase == PhaseCompleted {
					return
				}
				// Only a crash between writing "upgrading" and sending the
				// action may cost a node: it is never upgraded blindly again,
				// so its agent never reports the new driver and it fails.
				if !before || s.Phase != PhaseHalted || s.Counts[Failed] == 0 {
					t.Fatalf("phase %s counts %v halt %q", s.Phase, s.Counts, s.HaltReason)
				}
				for _, n := range s.Nodes {
					if n.State == Failed && (!strings.Contains(n.Reason, "did not return with driver") || h.fleet.upgradeCalls()[n.Node] != 0) {
						t.Fatalf("failed node %+v, upgrades %d", n, h.fleet.upgradeCalls()[n.Node])
					}
				}
			})
		}
	}
}

// TestRestartMidUpgradeRechecks: a coordinator restarted while the upgrade
// action runs finds the node "upgrading", asks the agent for its driver and
// carries on without sending the action again.
func TestRestartMidUpgradeRechecks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2)
	id := h.start(baseSpec())
	for i := 0; i < 100; i++ {
		if err := h.eng.Step(h.ctx); err != nil {
			t.Fatal(err)
		}
		if nodeState(h.status(id), "gpu-001").State == Upgrading {
			break
		}
		h.eng.waitOps()
		h.clock.advance(h.tick)
	}
	h.eng.waitOps() // the action ran; its answer dies with the coordinator
	h.eng = h.newEngine()
	h.step()
	n := nodeState(h.status(id), "gpu-001")
	if n.State != Rebooting || !strings.Contains(n.Reason, "instead of sending the action again") {
		t.Fatalf("after restart: %+v", n)
	}
	s := h.runUntil(id, 200, settled)
	if s.Phase != PhaseCompleted || h.fleet.upgradeCalls()["gpu-001"] != 1 {
		t.Fatalf("phase %s, upgrades %v", s.Phase, h.fleet.upgradeCalls())
	}
}

// TestPauseSurvivesRestart: the operator's pause and the held node are in
// the store.
func TestPauseSurvivesRestart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	id := h.start(baseSpec())
	h.step()
	h.step()
	if err := h.eng.Pause(h.ctx, id, "change freeze"); err != nil {
		t.Fatal(err)
	}
	before := h.status(id)
	h.eng = h.newEngine()
	for range 30 {
		h.step()
	}
	s := h.status(id)
	if !s.Paused || s.PauseReason != "change freeze" {
		t.Fatalf("pause lost: %+v", s)
	}
	for i := range s.Nodes {
		if s.Nodes[i].State != before.Nodes[i].State {
			t.Fatalf("%s moved while paused: %s → %s", s.Nodes[i].Node, before.Nodes[i].State, s.Nodes[i].State)
		}
	}
	if err := h.eng.Resume(h.ctx, id); err != nil {
		t.Fatal(err)
	}
	if s := h.runUntil(id, 300, settled); s.Phase != PhaseCompleted {
		t.Fatalf("phase %s", s.Phase)
	}
}
