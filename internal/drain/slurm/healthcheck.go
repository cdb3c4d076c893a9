package slurm

import (
	"context"
	"fmt"

	"github.com/fleetcheck/fleetcheck/internal/drain"
)

// Outcome is what HealthCheck did to the node.
type Outcome string

const (
	// Drained: the node was in service and is now drained with the reason.
	Drained Outcome = "drained"
	// StillDrained: fleetcheck had drained it already; its reason is kept.
	StillDrained Outcome = "still_drained"
	// Resumed: healthy again, and the drain was fleetcheck's own.
	Resumed Outcome = "resumed"
	// InService: healthy and not drained; nothing to do.
	InService Outcome = "in_service"
	// NotOurs: drained or down for someone else's reason (an operator,
	// NHC, slurmctld); left exactly as it is, healthy or not.
	NotOurs Outcome = "not_ours"
)

// HealthCheck applies one health-check run to the node, as Slurm's
// HealthCheckProgram (NHC) does: failure is the reason the node failed,
// "" when it is healthy. A failing node is drained with a fleetcheck
// reason; a healthy one is resumed only when the drain is fleetcheck's.
// Someone else's drain is never resumed nor overwritten. It costs one
// sinfo and at most one scontrol, each bounded by Options.Timeout.
func (a *Adapter) HealthCheck(ctx context.Context, node, failure string) (Outcome, string, error) {
	if err := drain.CheckNode(node); err != nil {
		return "", "", err
	}
	st, err := a.state(ctx, node)
	if err != nil {
		return "", "", fmt.Errorf("health check %s: %w", node, err)
	}
	switch {
	case st.Drained && !st.ByFleetcheck:
		return NotOurs, st.Reason, nil
	case failure == "" && !st.Drained:
		return InService, "", nil
	case failure == "":
		if _, err := a.run(ctx, a.opts.Scontrol, "update", "nodename="+node, "state=resume"); err != nil {
			return "", "", fmt.Errorf("health check %s: resume: %w", node, err)
		}
		return Resumed, st.Reason, nil
	case st.Drained:
		return StillDrained, st.Reason, nil
	}
	reason := cleanReason(failure)
	if _, err := a.run(ctx, a.opts.Scontrol, "update", "nodename="+node, "state=drain", "reason="+reason); err != nil {
		return "", "", fmt.Errorf("health check %s: drain: %w", node, err)
	}
	return Drained, reason, nil
}
