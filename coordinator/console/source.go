package console

import (
	"context"
	"errors"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/escalate"
)

// Source is what the console reads: the coordinator's store (with the live
// view of connections merged in) and its campaign engines, in process. The
// coordinator implements it; tests fake it.
type Source interface {
	// Nodes is every stored node with its newest check statuses.
	Nodes(ctx context.Context) ([]store.Node, error)
	// Node is one node, or an error wrapping store.ErrNotFound.
	Node(ctx context.Context, name string) (store.Node, error)
	Results(ctx context.Context, q store.ResultQuery) ([]store.StoredCheck, error)
	Events(ctx context.Context, q store.EventQuery) ([]store.Event, error)
	// Baselines finds reference values; nil when there are none.
	Baselines() baselines.Finder
	// Campaigns is nil when the coordinator runs no campaigns.
	Campaigns() Campaigns
	// Remediations is nil when the coordinator runs no remediation ladder.
	Remediations() Remediations
}

// Campaigns is the campaign engines as the operator service reads them.
type Campaigns interface {
	Sweeps(ctx context.Context) ([]sweep.Summary, error)
	// Sweep is a sweep's progress and, once it has any, its report.
	Sweep(ctx context.Context, id string) (sweep.Progress, *sweep.Report, error)
	Rollouts(ctx context.Context) ([]rollout.Summary, error)
	Rollout(ctx context.Context, id string) (*rollout.Status, error)
	Burnins(ctx context.Context) ([]burnin.CampaignStatus, error)
	Burnin(ctx context.Context, id string) (burnin.CampaignStatus, error)
	// BurninHTML is the burn-in's acceptance report as a page.
	BurninHTML(ctx context.Context, id string) ([]byte, error)
	Drills(ctx context.Context) ([]drill.Drill, error)
	// DrillRows is every drill target with its time to detect and recover.
	DrillRows(ctx context.Context) ([]drill.Row, error)
	// Control takes an operator's action on a campaign through the same
	// path as the CLI's RPC: authorized and audited there, with the
	// caller's identity from ctx (authz.WithIdentity). kind is sweep,
	// rollout, burnin or drill; action one of Actions(kind).
	Control(ctx context.Context, kind, id, action, reason string) error
}

// Actions lists the actions the console offers on a campaign kind.
func Actions(kind string) []string {
	switch kind {
	case "rollout":
		return []string{"pause", "resume", "approve", "abort"}
	case "burnin", "drill":
		return []string{"abort"}
	}
	return nil
}

// ErrUnknownAction is wrapped by Control for an action Actions does not list.
var ErrUnknownAction = errors.New("unknown campaign action")

// Remediations is the remediation ladder as the operator service reads
// it. Approve and Cancel go through RemediationService's own methods, as
// the CLI's RPCs do: authorized there for the caller in ctx
// (authz.WithIdentity) and audited (remediation.approve,
// remediation.cancel) before the engine acts. An unknown id is an error
// wrapping store.ErrNotFound; an action the remediation's state does not
// take is another error (answered 409).
type Remediations interface {
	// Mode is the engine's: shadow (records what it would do) or auto.
	Mode() remediation.Mode
	// List is the remediations, newest first: all, or of node, or in state.
	List(ctx context.Context, node string, state remediation.State) ([]remediation.Remediation, error)
	// Get is one remediation with its transitions.
	Get(ctx context.Context, id string) (remediation.Remediation, error)
	Approve(ctx context.Context, id string) error
	Cancel(ctx context.Context, id, reason string) error
	// JobEvents is the newest job events (application Xids on many nodes
	// at once: one job's crash, nobody drained), newest first.
	JobEvents(ctx context.Context, limit int) ([]remediation.JobEvent, error)
	// Flagged is the ports the link rule holds flagged ("" all nodes).
	Flagged(node string) []escalate.FlaggedPort
}
