// Package remediation is the remediation ladder: a finding (or an
// escalation rule's verdict, internal/escalate) names a step; the engine
// drains the node, has its agent run the configured action for the step
// (GPU reset, IB port reset, reboot), verifies the node (the passive
// checks and a short single-node all_reduce against its baseline) and
// returns it to service. A fault that recurs on the same component within
// the recurrence window climbs the ladder (reset → reboot → replace);
// replace keeps the node drained and opens an RMA record with its
// evidence, sent to a webhook as a CloudEvent.
//
// A new install runs in shadow mode: every remediation is recorded with
// what it would do, and nothing is drained or run until an operator
// approves it (or sets mode: auto). Nodes in a maintenance window, with
// the opt-out label, or held by a campaign (rollout, burn-in, drill) are
// never remediated; the campaigns' circuit breaker bounds every drain.
//
// Every transition is written to the store before it is acted on; the
// engine is stepped (Step, NextDue) so the simulator's virtual clock and
// tests drive it like the coordinator's loop (Run).
package remediation

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb"
	"github.com/fleetcheck/fleetcheck/internal/escalate"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// State is where a remediation is.
type State string

// States. Active ones are stepped; the rest are final, except shadow,
// awaiting and rma, which wait for an operator.
const (
	// StateShadow: recorded in dry-run mode with what it would do; approve runs it.
	StateShadow State = "shadow"
	// StateSuppressed: the node was in maintenance, a campaign or opted
	// out; nothing was done.
	StateSuppressed State = "suppressed"
	// StateHeld: the breaker refused the drain; tried again later.
	StateHeld      State = "held"
	StateDraining  State = "draining"
	StateActing    State = "acting"
	StateVerifying State = "verifying"
	// StateAwaiting: a step that needs hands (reseat); approve once done.
	StateAwaiting State = "awaiting"
	// StateRMA: replace: the node stays drained; the RMA record is sent
	// (retried until the webhook takes it); approve once the part is
	// replaced, and the node is verified.
	StateRMA       State = "rma"
	StateDone      State = "done"
	StateFailed    State = "failed"
	StateCancelled State = "cancelled"
)

// Final reports whether nothing more happens to a remediation in st.
func (st State) Final() bool {
	switch st {
	case StateSuppressed, StateDone, StateFailed, StateCancelled:
		return true
	}
	return false
}

// Mode is how the engine acts.
type Mode string

// Modes.
const (
	// ModeShadow records what would be done and does nothing (the default).
	ModeShadow Mode = "shadow"
	// ModeAuto remediates.
	ModeAuto Mode = "auto"
)

// Steps of the ladder.
const (
	StepResetGPU    = escalate.StepResetGPU
	StepResetIBPort = escalate.StepResetIBPort
	StepReboot      = escalate.StepReboot
	StepReplace     = escalate.StepReplace
	StepReseat      = escalate.StepReseat
)

// ladder is the rungs for a component and a first step: GPUs climb from a
// reset, ports from a port reset, the node from a reboot; a reseat that
// does not hold is a replace.
func ladder(component, step string) []string {
	switch {
	case step == StepReseat:
		return []string{StepReseat, StepReplace}
	case strings.HasPrefix(component, "GPU"):
		return []string{StepResetGPU, StepReboot, StepReplace}
	case strings.Contains(component, "/"):
		return []string{StepResetIBPort, StepReboot, StepReplace}
	}
	return []string{StepReboot, StepReplace}
}

// rung is step's place on the component's ladder (the last rung for a
// step the ladder lacks: a reset_gpu named for a port replaces nothing
// more wisely than a reboot would, so it starts at reboot).
func rung(component, step string) int {
	l := ladder(component, step)
	if i := slices.Index(l, step); i >= 0 {
		return i
	}
	if step == StepResetGPU || step == StepResetIBPort {
		return slices.Index(l, StepReboot)
	}
	return len(l) - 1
}

// stepFor maps a finding's action to a ladder step; ok is false for the
// actions the ladder never takes (restart_app, monitor, none: the job or
// nothing; drain: a software fix the drain policy handles).
func stepFor(a report.Action) (string, bool) {
	switch a {
	case report.ActionResetGPU:
		return StepResetGPU, true
	case report.ActionReboot:
		return StepReboot, true
	case report.ActionReplace:
		return StepReplace, true
	case report.ActionReseat:
		return StepReseat, true
	}
	return "", false
}

// Trigger is what starts a remediation.
type Trigger struct {
	Node      string    `json:"node"`
	Component string    `json:"component"` // GPU3, mlx5_0/1, node
	Step      string    `json:"step"`
	Code      string    `json:"code"`   // XID_79, or the rule
	Source    string    `json:"source"` // finding | rule
	Reason    string    `json:"reason"`
	At        time.Time `json:"at"`
}

// Remediation is one run of the ladder on one component of one node.
type Remediation struct {
	ID        string `json:"id"`
	Node      string `json:"node"`
	Component string `json:"component"`
	// Step is the rung being run; Ladder all of them, Rung its index.
	Step   string   `json:"step"`
	Ladder []string `json:"ladder"`
	Rung   int      `json:"rung"`
	State  State    `json:"state"`
	Reason string   `json:"reason,omitempty"` // why it is in its state
	Mode   Mode     `json:"mode"`
	// Trigger is what started it; Recurs the remediation of the same
	// component it recurred after (the ladder climbed from there).
	Trigger Trigger `json:"trigger"`
	Recurs  string  `json:"recurs,omitempty"`
	// Would is, in shadow mode, what the engine would do, and the climbs
	// later failures of the part would take; ShadowRecurs counts those.
	Would        []string `json:"would,omitempty"`
	ShadowRecurs int      `json:"shadow_recurrences,omitempty"`
	// Drained: the engine took the node out (and owes it a return).
	Drained bool `json:"drained"`
	// Attempts counts tries of the current state (held, verify, RMA send).
	Attempts int        `json:"attempts"`
	Action   *ActionRun `json:"action,omitempty"`
	Verify   *Verify    `json:"verify,omitempty"`
	RMA      *RMA       `json:"rma,omitempty"`
	// Notes are later triggers on the node while this one ran.
	Notes      []string  `json:"notes,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	DueAt      time.Time `json:"due_at"`
	DoneAt     time.Time `json:"done_at,omitempty"`
	FinishedAt time.Time `json:"finished_at,omitempty"`
	Events     []Event   `json:"events,omitempty"`
}

// ActionRun is the agent action a step ran.
type ActionRun struct {
	Step    string            `json:"step"`
	Action  string            `json:"action"`
	Params  map[string]string `json:"params,omitempty"`
	OK      bool              `json:"ok"`
	Message string            `json:"message,omitempty"`
	At      time.Time         `json:"at"`
}

// Verify is what the verification found.
type Verify struct {
	Passed bool     `json:"passed"`
	Failed []string `json:"failed,omitempty"` // "gpu.xid: GPU3 XID_79"
	// BusBW is the single-node all_reduce bus bandwidth; Baseline the
	// node's stored figure (0: none stored).
	BusBW    float64   `json:"busbw_gbps,omitempty"`
	Baseline float64   `json:"baseline_gbps,omitempty"`
	At       time.Time `json:"at"`
}

// RMA is a replace's record, sent to the webhook.
type RMA struct {
	ID       string    `json:"id"`
	Evidence Evidence  `json:"evidence"`
	Sent     bool      `json:"sent"`
	SentAt   time.Time `json:"sent_at,omitempty"`
	Attempts int       `json:"attempts"`
	LastErr  string    `json:"last_error,omitempty"`
}

// Evidence is what an RMA carries.
type Evidence struct {
	Node      string   `json:"node"`
	Component string   `json:"component"`
	Findings  []string `json:"findings"`
	// Serials: the part's (and, for a node, each GPU's and HCA's).
	Serials []Part `json:"serials"`
	// Bundle is where the automatically collected support bundle is
	// (the collect action's message), or why there is none.
	Bundle string         `json:"bundle"`
	BurnIn []BurnInRecord `json:"burnin_history"`
	Ladder []string       `json:"ladder_history"` // what was tried before
	Opened time.Time      `json:"opened"`
}

// Part is one serial-numbered part.
type Part struct {
	Component string `json:"component"`
	Model     string `json:"model,omitempty"`
	Serial    string `json:"serial"`
}

// BurnInRecord is one burn-in run that tested the node.
type BurnInRecord struct {
	ID      string    `json:"id"`
	Verdict string    `json:"verdict"`
	At      time.Time `json:"at"`
	Detail  string    `json:"detail,omitempty"`
}

// JobEvent is application Xids on many nodes at once: one job's crash.
type JobEvent struct {
	At     time.Time `json:"at"`
	Job    string    `json:"job,omitempty"`
	Xid    int       `json:"xid"`
	Nodes  []string  `json:"nodes"`
	Reason string    `json:"reason"`
}

// Errors, tested with errors.Is.
var (
	ErrNotFound     = errors.New("no such remediation")
	ErrState        = errors.New("not possible in this state")
	ErrInvalid      = errors.New("invalid remediation config")
	ErrSchemaTooNew = campaigndb.ErrSchemaTooNew
)
