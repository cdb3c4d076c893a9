package rollout

import (
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

// State is a node's place in a rollout.
type State string

// Node states, in the order a node normally moves through them.
const (
	Pending         State = "pending"
	DrainRequired   State = "drain-required"   // holds a maxUnavailable slot from here
	Draining        State = "draining"         // drained; waiting for running work to end
	UpgradeRequired State = "upgrade-required" // idle; pre-upgrade inspection, then upgrade
	Upgrading       State = "upgrading"        // the agent's action was sent
	Rebooting       State = "rebooting"        // waiting for the agent to return with the new driver
	Validating      State = "validating"       // the post-upgrade inspection
	UndrainRequired State = "undrain-required" // back to service, then done/skipped/rolled-back
	Done            State = "done"
	Failed          State = "failed" // stays drained, with the reason
	Skipped         State = "skipped"
	RolledBack      State = "rolled-back"
)

// active states have the node out of service on the rollout's account.
func (s State) active() bool {
	switch s {
	case DrainRequired, Draining, UpgradeRequired, Upgrading, Rebooting, Validating, UndrainRequired:
		return true
	}
	return false
}

// Phase is the rollout's state.
type Phase string

// Rollout phases.
const (
	PhaseRunning          Phase = "running"
	PhaseSoaking          Phase = "soaking"           // a wave passed its gate; waiting before the next
	PhaseAwaitingApproval Phase = "awaiting-approval" // the canary passed; an operator approves
	PhaseHalted           Phase = "halted"            // a wave failed its gate
	PhaseCompleted        Phase = "completed"
	PhaseAborting         Phase = "aborting" // no new nodes; in-flight ones finish
	PhaseAborted          Phase = "aborted"
	PhaseRollingBack      Phase = "rolling-back"
	PhaseRolledBack       Phase = "rolled-back"
)

// final phases take no further step.
func (p Phase) final() bool {
	switch p {
	case PhaseCompleted, PhaseAborted, PhaseRolledBack:
		return true
	}
	return false
}

// Node operations.
const (
	opUpgrade  = "upgrade"
	opRollback = "rollback"
)

// nodeRec is one node of one rollout. Exported-looking fields are
// persisted in rollout_nodes; the rest live in memory only.
type nodeRec struct {
	Name string
	Wave int
	Seq  int
	// State and Since: where the node is and since when; Deadline bounds
	// the state (zero: none).
	State    State
	Since    time.Time
	Deadline time.Time
	// Op is upgrade, or rollback once Rollback took a done node back.
	Op string
	// FromDriver is the driver before the upgrade (the rollback target).
	FromDriver string
	// DrainedByUs: this rollout's drain is on the node; only then is
	// Undrain ever called, and a failed node keeps its slot.
	DrainedByUs bool
	DrainedAt   time.Time
	// After is the state a node in undrain-required moves to.
	After State
	// Baseline is the pre-upgrade metric value (0 when unknown);
	// BaselineFrom says where it came from ("measured", "stored node:x",
	// "waived by operator").
	Baseline     float64
	BaselineFrom string
	// Pre holds the check statuses of the pre-upgrade inspection; PreDone
	// says it ran.
	Pre     map[string]report.Status
	PreDone bool
	// Hold is set while the node waits for an operator (inconclusive
	// inspection): the rollout is paused and the node takes no step.
	Hold string
	// Reason says why the node is where it is (failed, skipped, a note).
	Reason   string
	Evidence []string
	// Upgrades counts upgrade (or rollback) actions sent: never above one
	// per op.
	Upgrades int

	// memory only
	busy    bool      // an operation is in flight
	opSeq   uint64    // the in-flight operation's number
	nextTry time.Time // earliest next poll or retry
	lastErr string    // last transient error, for status
	// waitSince: the node's turn came with its agent not connected; it is
	// waited for until waitSince + the spec's connect grace. In memory
	// only: a restarted coordinator gives every agent a fresh grace.
	waitSince time.Time
	dirty     bool
}

// run is one rollout in memory.
type run struct {
	ID      string
	Spec    *Spec
	Plan    *PlanResult
	Phase   Phase
	Wave    int
	Paused  bool
	PauseAt time.Time
	// PauseReason says who or what paused it.
	PauseReason string
	SoakUntil   time.Time
	// Accepted counts failures of the current wave an operator accepted
	// by resuming a halted rollout.
	Accepted   int
	HaltReason string
	Evidence   []string
	Created    time.Time
	Updated    time.Time
	Finished   time.Time

	nodes  []*nodeRec
	byName map[string]*nodeRec
	// blocked says why no node could start at the last step (slots, the
	// breaker); memory only, for status.
	blocked string
	dirty   bool
	// parked holds operation results that arrived while paused.
	parked []opResult
	// scopeIn caches the maxUnavailable scope for the listing of scopeAt.
	scopeAt time.Time
	scopeIn map[string]bool
}

// tag is the start of every drain reason this rollout writes: it tells
// this rollout's drains from anyone else's.
func (r *run) tag() string { return "fleetcheck: rollout " + r.ID }

func (r *run) drainReason(n *nodeRec) string {
	if n.Op == opRollback {
		return r.tag() + ": rollback to driver " + n.FromDriver
	}
	return r.tag() + ": driver " + r.Spec.Target.Driver
}

// targetDriver is the driver the node's current op moves it to.
func (r *run) targetDriver(n *nodeRec) string {
	if n.Op == opRollback {
		return n.FromDriver
	}
	return r.Spec.Target.Driver
}

// holdsSlot reports whether the node counts against maxUnavailable on
// this rollout's account: active, or failed and still drained by us.
func (n *nodeRec) holdsSlot() bool {
	return n.State.active() || (n.State == Failed && n.DrainedByUs)
}

// event is one line of a rollout's history.
type event struct {
	Rollout string
	Time    time.Time
	Node    string
	Kind    string
	From    State
	To      State
	Message string
}

// Event kinds.
const (
	evTransition = "transition"
	evOperator   = "operator"
	evPhase      = "phase"
)
