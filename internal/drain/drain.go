// Package drain takes nodes out of service and brings them back through the
// scheduler that owns them: none (record only), Slurm (drain/drain/slurm) or
// Kubernetes (internal/drain/kubernetes, coordinator only).
//
// Every adapter keeps one rule: fleetcheck only ever brings back a node that
// fleetcheck took out. A node drained by someone else keeps its drain, and
// Undrain says so with ErrNotOurs. Which fleetcheck campaign drained a node is
// told by the reason: campaigns write "fleetcheck: <campaign> ..." and compare
// it before undraining (see Owns).
package drain

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// ReasonPrefix starts every reason fleetcheck writes; a drain whose reason
// does not start with it is someone else's.
const ReasonPrefix = "fleetcheck:"

// Errors, tested with errors.Is.
var (
	// ErrNotOurs: the node is drained, but not by fleetcheck. It is never
	// resumed by fleetcheck.
	ErrNotOurs = errors.New("node drained by someone else")
	// ErrUnknownNode: the scheduler does not know the node.
	ErrUnknownNode = errors.New("unknown node")
	// ErrInvalidNode: the name could be read as several nodes or as an
	// option by the scheduler's tools (a Slurm hostlist "n[1-4]").
	ErrInvalidNode = errors.New("invalid node name")
)

// Status is a node's service state as its scheduler sees it.
type Status struct {
	// Drained: new work is not scheduled on the node (Slurm drain or
	// draining or down, Kubernetes cordoned).
	Drained bool `json:"drained"`
	// ByFleetcheck: fleetcheck wrote the drain (reason prefix or owner
	// annotation).
	ByFleetcheck bool   `json:"by_fleetcheck"`
	Reason       string `json:"reason,omitempty"`
	// RunningJobs counts work still running on the node: Slurm jobs, or
	// Kubernetes pods that a drain evicts (DaemonSet and mirror pods left out).
	RunningJobs int `json:"running_jobs"`
	// State is the scheduler's own word for the node, lower case and
	// without flags: Slurm's "idle", "allocated", "mixed", "drained",
	// "draining", "down"; empty where the adapter has none.
	State string `json:"state,omitempty"`
}

// Adapter takes nodes out of service and back.
type Adapter interface {
	// Drain stops new work on the node and asks running work to leave (or
	// waits for it, as the scheduler does). A node already drained by
	// fleetcheck is left as it is; one drained by someone else gives
	// ErrNotOurs and is not touched.
	Drain(ctx context.Context, node, reason string) error
	// Undrain returns a node fleetcheck drained to service. A node that is
	// not drained is a no-op; one drained by someone else gives ErrNotOurs.
	Undrain(ctx context.Context, node string) error
	// Status reads the node's state.
	Status(ctx context.Context, node string) (Status, error)
}

// Lister is implemented by adapters that can list every node out of
// service in one call; campaigns use it to count unavailable nodes across
// the fleet without asking node by node.
type Lister interface {
	// Unavailable returns the nodes that are drained, draining or down.
	Unavailable(ctx context.Context) (map[string]Status, error)
}

// Reason returns s with ReasonPrefix in front, unless it has it already.
func Reason(s string) string {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, ReasonPrefix) {
		return s
	}
	if s == "" {
		return ReasonPrefix
	}
	return ReasonPrefix + " " + s
}

// Ours reports whether a reason was written by fleetcheck.
func Ours(reason string) bool {
	return strings.HasPrefix(strings.TrimSpace(reason), ReasonPrefix)
}

// Owns reports whether a status is a drain written with a reason that starts
// with tag (a campaign's "fleetcheck: rollout r-1"). Campaigns compare with
// their own tag before undraining, so one campaign never resumes a node that
// another campaign (or a person) drained.
func Owns(st Status, tag string) bool {
	return st.Drained && st.ByFleetcheck && tag != "" && strings.HasPrefix(strings.TrimSpace(st.Reason), tag)
}

// nodeName accepts what schedulers use as host names and refuses what
// their tools would expand or parse: brackets and commas (Slurm hostlists),
// spaces, '=' and a leading '-'. Compiled on first use: the counted
// repetition makes a 230 KB program, which every start of the node binary
// (run, analyze) would otherwise pay for.
var nodeName = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,252}$`)
})

// CheckNode validates a node name before it reaches a scheduler's tool.
func CheckNode(node string) error {
	if !nodeName().MatchString(node) {
		return fmt.Errorf("%w: %q", ErrInvalidNode, node)
	}
	return nil
}
