package rollout

import (
	"context"
	"fmt"
	"time"
)

// operate runs an operator action on one rollout under the lock and
// writes its changes before returning: the operator's word is durable
// once the call returns.
func (e *Engine) operate(ctx context.Context, id, what string, fn func(r *run, now time.Time) error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.byID[id]
	if r == nil {
		return fmt.Errorf("%s %s: %w", what, id, ErrNotFound)
	}
	now := e.clock.Now()
	if err := fn(r, now); err != nil {
		return fmt.Errorf("%s %s: %w", what, id, err)
	}
	r.Updated, r.dirty = now, true
	if err := e.commit(ctx); err != nil {
		return fmt.Errorf("%s %s: %w", what, id, err)
	}
	e.log.Info().Str("campaign", id).Str("op", what).Msg("rollout operator action")
	e.wake()
	return nil
}

func (e *Engine) note(r *run, now time.Time, node, msg string) {
	e.pending = append(e.pending, event{Rollout: r.ID, Time: now, Node: node, Kind: evOperator, Message: msg})
}

// Pause freezes the rollout: no node changes state until Resume.
// Operations already running finish, and their outcome is applied on
// Resume.
func (e *Engine) Pause(ctx context.Context, id, reason string) error {
	return e.operate(ctx, id, "pause", func(r *run, now time.Time) error {
		if r.Phase.final() {
			return fmt.Errorf("%w: rollout is %s", ErrState, r.Phase)
		}
		if r.Paused {
			return nil
		}
		if reason == "" {
			reason = "operator"
		}
		e.note(r, now, "", "pause: "+reason)
		e.pause(r, now, reason)
		return nil
	})
}

// Resume continues a paused or halted rollout. Paused: the clocks of the
// waiting nodes are moved by the pause's length, and nodes held on an
// inconclusive inspection run it again. Halted: the failures of the
// current wave are accepted and the wave goes on.
func (e *Engine) Resume(ctx context.Context, id string) error {
	return e.operate(ctx, id, "resume", func(r *run, now time.Time) error {
		if !r.Paused && r.Phase != PhaseHalted {
			return fmt.Errorf("%w: rollout is %s and not paused", ErrState, r.Phase)
		}
		if r.Paused {
			shiftDeadlines(r, now.Sub(r.PauseAt))
			for _, n := range r.nodes {
				if n.Hold == "" {
					continue
				}
				e.note(r, now, n.Name, "resume: inspecting again after: "+n.Hold)
				n.Hold, n.dirty = "", true
				n.nextTry = time.Time{}
				switch n.State {
				case UpgradeRequired, Validating:
					n.Deadline = now.Add(r.Spec.Deadlines.Validating.D())
				}
			}
			r.Paused, r.PauseAt, r.PauseReason = false, time.Time{}, ""
			e.note(r, now, "", "resume")
			e.unpark(r, now)
		}
		if r.Phase == PhaseHalted {
			r.Accepted = len(r.waveFailures(r.Wave))
			e.note(r, now, "", fmt.Sprintf("resume after halt: %d failed or skipped nodes of %s accepted (%s)", r.Accepted, r.waveName(r.Wave), r.HaltReason))
			r.HaltReason = ""
			e.phase(r, PhaseRunning, now, "resumed")
		}
		return nil
	})
}

// Approve lets the rollout go on after the canary.
func (e *Engine) Approve(ctx context.Context, id string) error {
	return e.operate(ctx, id, "approve", func(r *run, now time.Time) error {
		if r.Phase != PhaseAwaitingApproval {
			return fmt.Errorf("%w: rollout is %s, not awaiting approval", ErrState, r.Phase)
		}
		e.note(r, now, "", "approve")
		e.nextWave(r, now)
		return nil
	})
}

// Abort stops the rollout: pending nodes are skipped, nodes not yet
// upgraded go back to service, nodes being upgraded finish (inspection
// included) and go back to service when they pass.
func (e *Engine) Abort(ctx context.Context, id string) error {
	return e.operate(ctx, id, "abort", func(r *run, now time.Time) error {
		switch r.Phase {
		case PhaseRunning, PhaseSoaking, PhaseAwaitingApproval, PhaseHalted:
		default:
			return fmt.Errorf("%w: rollout is %s", ErrState, r.Phase)
		}
		if r.Paused {
			shiftDeadlines(r, now.Sub(r.PauseAt))
			r.Paused, r.PauseAt, r.PauseReason = false, time.Time{}, ""
			e.unpark(r, now)
		}
		r.SoakUntil = time.Time{}
		e.note(r, now, "", "abort")
		e.phase(r, PhaseAborting, now, "aborting")
		return nil
	})
}

// Rollback runs the agent's rollback action (to each node's previous
// driver) on the nodes the rollout finished, through the same drain,
// reboot and inspection steps, within maxUnavailable. Nodes that failed
// stay as they are, for a human. It needs rollback_action in the spec and
// no node in flight.
func (e *Engine) Rollback(ctx context.Context, id string) error {
	return e.operate(ctx, id, "rollback", func(r *run, now time.Time) error {
		if r.Spec.RollbackAction == "" {
			return fmt.Errorf("%w: the spec has no rollback_action", ErrState)
		}
		switch r.Phase {
		case PhaseRunning, PhaseSoaking, PhaseAwaitingApproval, PhaseHalted, PhaseCompleted, PhaseAborted:
		default:
			return fmt.Errorf("%w: rollout is %s", ErrState, r.Phase)
		}
		for _, n := range r.nodes {
			if n.State.active() {
				return fmt.Errorf("%w: %s is %s: pause and wait, or abort, until no node is in flight", ErrState, n.Name, n.State)
			}
		}
		count := 0
		for _, n := range r.nodes {
			switch n.State {
			case Pending:
				e.transition(r, n, Skipped, now, "rollout rolled back before this node's turn")
			case Done:
				n.Op, n.Upgrades, n.After, n.Evidence, n.dirty = opRollback, 0, "", nil, true
				n.DrainedAt = time.Time{}
				e.transition(r, n, Pending, now, "rollback to driver "+n.FromDriver+" queued")
				count++
			}
		}
		if r.Paused {
			r.Paused, r.PauseAt, r.PauseReason = false, time.Time{}, ""
		}
		r.SoakUntil, r.HaltReason = time.Time{}, ""
		e.note(r, now, "", fmt.Sprintf("rollback of %d nodes", count))
		e.phase(r, PhaseRollingBack, now, fmt.Sprintf("rolling back %d nodes", count))
		return nil
	})
}

// ResolveNode records an operator's decision on a node held on an
// inconclusive inspection. pass: after the post-upgrade inspection the
// node goes back to service as done; before the upgrade it proceeds
// without a baseline (the NCCL comparison is then waived). fail: an
// upgraded node fails (stays out of service); one not upgraded yet goes
// back to service, skipped. The rollout stays paused until Resume.
func (e *Engine) ResolveNode(ctx context.Context, id, node string, pass bool, note string) error {
	return e.operate(ctx, id, "resolve "+node, func(r *run, now time.Time) error {
		n := r.byName[node]
		if n == nil {
			return fmt.Errorf("%w: %s is not in this rollout", ErrNotFound, node)
		}
		if n.Hold == "" {
			return fmt.Errorf("%w: %s is not waiting for a decision", ErrState, node)
		}
		verdict := "fail"
		if pass {
			verdict = "pass"
		}
		e.note(r, now, node, fmt.Sprintf("resolved %s by operator (%s) after: %s", verdict, note, n.Hold))
		held := n.Hold
		n.Hold, n.dirty = "", true
		why := fmt.Sprintf("operator decided %s (%s) after: %s", verdict, note, held)
		switch {
		case n.State == Validating && pass:
			after := Done
			if n.Op == opRollback {
				after = RolledBack
			}
			e.toUndrain(r, n, after, now, why)
		case n.State == Validating:
			e.transition(r, n, Failed, now, why)
		case n.State == UpgradeRequired && pass:
			n.PreDone = true
			if n.BaselineFrom == "" {
				n.BaselineFrom = waived
			}
		case n.State == UpgradeRequired:
			e.toUndrain(r, n, Skipped, now, why+": not upgraded")
		default:
			return fmt.Errorf("%w: %s is %s", ErrState, node, n.State)
		}
		return nil
	})
}
