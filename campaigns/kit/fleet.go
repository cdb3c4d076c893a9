// Package kit holds what every campaign (sweep, rollout, burn-in,
// drill) needs from the rest of the system, as small interfaces: the fleet
// (nodes, running checks and actions on agents), a clock that can be
// virtual, node reservations and a circuit breaker on draining. Campaign
// packages code against these; the coordinator implements Fleet over its
// agent streams, and the simulator implements it in-process on a virtual
// clock for tests and benchmarks.
package kit

import (
	"context"
	"errors"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

// Node is what a campaign knows of one node.
type Node struct {
	Name      string
	Labels    map[string]string
	State     string // initializing|healthy|degraded|failed|unreachable|draining|drained
	Activity  string // busy|idle|drained (the agent says)
	Connected bool
	Inventory report.Inventory
	// OutOfService: the coordinator has taken the node out of service
	// (State draining or drained, by its drain policy); OutOfServiceReason
	// says by whom and why ("drain policy through slurm: ib.ports: ...").
	OutOfService       bool
	OutOfServiceReason string
}

// Bounds on RunOptions.Timeout the coordinator enforces on every request
// (0 takes its default of 2m). Campaign specs are checked against them
// when they are read, so a step the coordinator would refuse is an error
// at start, not an inconclusive node hours later.
const (
	MinRunTimeout = 100 * time.Millisecond
	MaxRunTimeout = time.Hour
)

// RunOptions bound one request to an agent.
type RunOptions struct {
	Timeout time.Duration
	// Params are bounded, named parameters the agent validates (e.g.
	// "min_bytes"); never commands.
	Params map[string]string
	// ID, when set, is the action's id on the agent (RunAction only). A
	// campaign that sends a step again after a coordinator restart gives
	// the same ID, so the agent answers the action it is still running or
	// ran (it never runs an id twice) instead of refusing a second one
	// because the first holds the node. Empty: a fresh id. At most 128 of
	// letters, digits, '.', '_', ':', '-', starting with a letter or digit.
	ID string
}

// ActionResult is the outcome of an agent action (upgrade, rollback,
// fault inject/revert). Actions are named in the agent's config; the
// coordinator only sends the name and validated parameters.
//
// Burn-in stores it in its runs' JSON. Runs stored before the fields had
// JSON names hold "OK", "Message", "Output": encoding/json matches names
// without regard to case, so those still read back.
type ActionResult struct {
	OK      bool   `json:"ok"`
	Message string `json:"message,omitempty"`
	// Output is a bounded excerpt of what the action printed.
	Output string `json:"output,omitempty"`
}

// Fleet is the coordinator as campaigns see it.
type Fleet interface {
	// Nodes lists nodes matching a label selector ("" = all).
	Nodes(ctx context.Context, selector string) ([]Node, error)
	// RunChecks runs named checks on one node and returns its report.
	RunChecks(ctx context.Context, node string, checks []string, opts RunOptions) (*report.Report, error)
	// RunMulti runs a multi-node check (nccl.allreduce across nodes): the
	// first node launches the command its agent config defines with the
	// validated node names filled in, the others take part. It returns the
	// launcher's report; each participant's side is stored as its result.
	RunMulti(ctx context.Context, nodes []string, check string, opts RunOptions) (*report.Report, error)
	// RunAction runs an agent-configured action by name.
	RunAction(ctx context.Context, node, action string, params map[string]string, opts RunOptions) (ActionResult, error)
}

// Errors a Fleet returns, tested with errors.Is.
var (
	ErrUnreachable = errors.New("node unreachable")
	ErrRefused     = errors.New("agent refused")
	ErrTimeout     = errors.New("timed out")
)

// Observation is one check result an agent reported on its own schedule,
// with when it ran.
type Observation struct {
	Check report.CheckResult
	At    time.Time
}

// Observer is a Fleet that keeps what agents report on their own
// schedule (the coordinator's stored results). Drills time detection by
// it: a fault is detected when the fleet's normal monitoring shows it,
// not when the drill asks for a check the moment after injecting.
type Observer interface {
	// Observed returns, for each named check, the node's latest result
	// its agent ran on its own (not on a campaign's request) that finished
	// at or after since; checks with none are left out.
	Observed(ctx context.Context, node string, checks []string, since time.Time) ([]Observation, error)
	// CheckInterval is how often the node's agent runs its checks on its
	// own, as its latest results show (0: not known yet).
	CheckInterval(ctx context.Context, node string) (time.Duration, error)
}
