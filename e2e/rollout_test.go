//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

const (
	fromDriver = "535.161.08" // the simulator's default driver
	toDriver   = "550.90.07"
)

// rolloutMatrix allows the simulated H100s both drivers.
const rolloutMatrix = `
gpus:
  - model: H100 80GB HBM3
    drivers: ["535.*", ">=550.90.07, <551"]
`

type rolloutDoc struct {
	ID          string           `json:"id"`
	Phase       string           `json:"phase"`
	Paused      bool             `json:"paused"`
	PauseReason string           `json:"pause_reason"`
	HaltReason  string           `json:"halt_reason"`
	Unavailable int              `json:"unavailable"`
	Counts      map[string]int   `json:"counts"`
	Nodes       []rolloutNodeDoc `json:"nodes"`
}

type rolloutNodeDoc struct {
	Node       string `json:"node"`
	Wave       int    `json:"wave"`
	State      string `json:"state"`
	FromDriver string `json:"from_driver"`
	Reason     string `json:"reason"`
	Upgrades   int    `json:"upgrades"`
}

func (d rolloutDoc) node(name string) rolloutNodeDoc {
	for _, n := range d.Nodes {
		if n.Node == name {
			return n
		}
	}
	return rolloutNodeDoc{}
}

func (d rolloutDoc) summary() string {
	var b []string
	for _, n := range d.Nodes {
		b = append(b, n.Node+"="+n.State)
	}
	out := d.Phase + " [" + strings.Join(b, " ") + "]"
	if d.Paused {
		out += " paused: " + d.PauseReason
	}
	return out
}

// waitRollout polls the rollout (across coordinator restarts) until done
// says so.
func (f *fleet) waitRollout(id string, within time.Duration, what string, done func(rolloutDoc) bool) rolloutDoc {
	f.t.Helper()
	var last rolloutDoc
	testwait.ForEvery(f.t, within, 200*time.Millisecond, what, func() (bool, string) {
		var d rolloutDoc
		if !tryJSON(f, &d, "rollout", "status", id) {
			return false, fmt.Sprintf("%s (halt %q)", last.summary(), last.HaltReason)
		}
		last = d
		return done(d), fmt.Sprintf("%s (halt %q)", last.summary(), last.HaltReason)
	})
	return last
}

// TestRollout: a canary and two waves to a new driver, then a rollback of
// them all, through `fleetcheck rollout`. The coordinator is SIGKILLed
// while the canary's upgrade action runs and again in the middle of the
// rollback; both wave-2 agents are restarted before their turn (one
// stopped cleanly, one killed when wave 1 starts) and the wave-1 agent is
// SIGKILLed while its node is validated. The
// rollout must complete with every node upgraded exactly once and none
// skipped, and the rollback must bring every node back exactly once.
func TestRollout(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetOpts{nodes: 4, actionDelay: 3 * time.Second, longTools: 2 * time.Second})
	spec := f.specFile("rollout.yaml", `
name: r550
selector: "sku=h100"
target: {driver: `+toDriver+`}
action: driver-upgrade
rollback_action: driver-rollback
canary: 1
canary_nodes: [gpu-001]
waves: [1, 2]
max_unavailable: 2
approval: auto
connect_grace: 2m
deadlines: {upgrading: 1m, rebooting: 2m, validating: 1m}
validation:
  checks: [gpu.inventory, gpu.ecc, gpu.xid, ib.ports, nccl.allreduce]
  baseline: measured
`)
	matrix := f.specFile("matrix.yaml", rolloutMatrix)
	id := startedID(t, "rollout", f.ok("rollout", "start", "-f", spec, "--matrix", matrix))

	// 1. The coordinator killed while the canary's upgrade runs.
	f.waitRollout(id, time.Minute, "the canary upgrading", func(d rolloutDoc) bool {
		return d.node("gpu-001").State == "upgrading" || d.node("gpu-001").State == "rebooting"
	})
	f.killCoordinator("while the canary's driver upgrade runs")

	// 2. Wave-2 agents restarted before their turn: one stopped cleanly
	// (now), one killed (when wave 1 starts). They are waited for, never
	// skipped.
	f.restartAgent("gpu-004", syscall.SIGTERM, "before its wave")
	f.waitRollout(id, 2*time.Minute, "wave 1 started", func(d rolloutDoc) bool {
		return d.node("gpu-002").State != "pending" || d.Phase != "running"
	})
	f.restartAgent("gpu-003", syscall.SIGKILL, "when wave 1 starts, before its own wave")

	// 3. The wave-1 agent killed while its node is validated: after its
	// upgrade, as soon as its agent starts the validation's checks.
	f.waitRollout(id, 3*time.Minute, "the wave-1 node rebooting", func(d rolloutDoc) bool {
		return d.node("gpu-002").State == "rebooting" || d.Phase == "halted" || d.Phase == "completed"
	})
	wave1 := f.agent("gpu-002")
	before := wave1.requestedRuns("ib.ports")
	testwait.Until(t, 2*time.Minute, "gpu-002's validation running", func() bool {
		return wave1.requestedRuns("ib.ports") > before
	})
	f.restartAgent("gpu-002", syscall.SIGKILL, "while its node is validated")

	// Finished, or stopped with a reason: halted, or paused on an
	// inconclusive inspection (waiting for an operator).
	d := f.waitRollout(id, 4*time.Minute, "the rollout to finish", func(d rolloutDoc) bool {
		return d.Phase == "completed" || d.Phase == "halted" || d.Phase == "aborted" || d.Paused
	})
	t.Logf("rollout %s ended %s (halt reason %q)", id, d.summary(), d.HaltReason)
	if d.Phase != "completed" {
		t.Fatalf("rollout stopped %s (halt reason %q)", d.summary(), d.HaltReason)
	}
	for _, name := range f.nodeNames() {
		n := d.node(name)
		if n.State != "done" || n.Upgrades != 1 {
			t.Errorf("%s: %s after %d upgrades (%s)", name, n.State, n.Upgrades, n.Reason)
		}
		if st := f.agent(name).simState(t); st.Driver != toDriver {
			t.Errorf("%s runs driver %s after the rollout", name, st.Driver)
		}
	}
	f.checkUpgradedAtMostOnce(map[string]int{"gpu-001": 1, "gpu-002": 1, "gpu-003": 1, "gpu-004": 1})

	// 4. The rollback, with the coordinator killed in the middle.
	f.ok("rollout", "rollback", id)
	f.waitRollout(id, time.Minute, "the rollback under way", func(d rolloutDoc) bool {
		for _, n := range d.Nodes {
			if n.State != "done" && n.State != "rolled-back" {
				return true
			}
		}
		return d.Phase == "rolled-back"
	})
	f.killCoordinator("in the middle of the rollback")
	d = f.waitRollout(id, 4*time.Minute, "the rollback to finish", func(d rolloutDoc) bool {
		return d.Phase == "rolled-back" || d.Phase == "halted"
	})
	t.Logf("rollback of %s ended %s", id, d.summary())
	if d.Phase != "rolled-back" {
		t.Errorf("rollback ended %s (halt %q)", d.Phase, d.HaltReason)
	}
	for _, a := range f.agents {
		st := a.simState(t)
		if n := d.node(a.node); n.State != "rolled-back" || st.Driver != fromDriver || st.Actions["driver-rollback"] != 1 {
			t.Errorf("%s after the rollback: %s (%s), driver %s, %d rollbacks", a.node, n.State, n.Reason, st.Driver, st.Actions["driver-rollback"])
		}
	}
	f.checkUpgradedAtMostOnce(nil)
	f.checkAckedStoredOnce()
}
