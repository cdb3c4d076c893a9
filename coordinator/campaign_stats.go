package coordinator

import (
	"context"
	"errors"
	"fmt"

	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
)

// Campaign kinds as /metrics names them.
const (
	KindSweep   = "sweep"
	KindRollout = "rollout"
	KindBurnin  = "burnin"
	KindDrill   = "drill"
)

// Progress values of CampaignRun.Nodes: where each node of an unfinished
// campaign stands.
const (
	ProgressPending = "pending" // its turn has not come
	ProgressActive  = "active"  // being drained, tested, upgraded, watched
	ProgressDone    = "done"    // finished well (upgraded, accepted, recovered)
	ProgressFailed  = "failed"  // finished badly (failed, rejected, aborted)
	ProgressSkipped = "skipped" // left out (a rollout's skipped node)
)

// KindStats is one campaign kind as /metrics shows it.
type KindStats struct {
	Kind string
	// States counts every stored campaign of the kind by state (a
	// rollout's phase); every state the kind knows is present.
	States map[string]int
	// Running are the campaigns not finished yet, oldest first.
	Running []CampaignRun
}

// CampaignRun is the progress of one unfinished campaign.
type CampaignRun struct {
	ID string
	// Nodes counts its nodes by Progress value; nil for a sweep, which
	// judges nodes only when it ends.
	Nodes map[string]int
	// TestsDone and Tests count a sweep's tests or a burn-in's runs;
	// both 0 for the kinds that have none.
	TestsDone, Tests int
	// Round is a sweep's round (1-3) or a rollout's wave (1 is the
	// first); 0 where the kind has none.
	Round int
	// Halted: it stands until an operator acts (a rollout halted at a
	// gate, or paused).
	Halted bool
}

// campaignStates are the states each kind knows, so that every one shows
// at 0 before it happens.
var campaignStates = map[string][]string{
	KindSweep: {string(sweep.StateRunning), string(sweep.StateDone), string(sweep.StateFailed)},
	KindRollout: {string(rollout.PhaseRunning), string(rollout.PhaseSoaking), string(rollout.PhaseAwaitingApproval),
		string(rollout.PhaseHalted), string(rollout.PhaseCompleted), string(rollout.PhaseAborting), string(rollout.PhaseAborted),
		string(rollout.PhaseRollingBack), string(rollout.PhaseRolledBack)},
	KindBurnin: {string(burnin.StateRunning), string(burnin.StateDone), string(burnin.StateCancelled)},
	KindDrill:  {string(drill.StateRunning), string(drill.StateDone), string(drill.StateAborted), string(drill.StateRefused)},
}

func newKindStats(kind string) KindStats {
	k := KindStats{Kind: kind, States: map[string]int{}}
	for _, s := range campaignStates[kind] {
		k.States[s] = 0
	}
	return k
}

// CampaignStats reads every engine's status for /metrics: sweep, rollout,
// burn-in and drill, in that order. It returns nil when campaigns are off
// (no fleet, or not started). A kind whose status cannot be read is left
// out and its error joined into the one returned.
func (s *Server) CampaignStats(ctx context.Context) ([]KindStats, error) {
	s.mu.Lock()
	c := s.camp
	s.mu.Unlock()
	if c == nil || c.fleet == nil {
		return nil, nil
	}
	var out []KindStats
	var errs []error
	for _, read := range []func(context.Context) (KindStats, error){c.sweepStats, c.rolloutStats, c.burninStats, c.drillStats} {
		k, err := read(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, k)
	}
	return out, errors.Join(errs...)
}

func (c *campaigns) sweepStats(ctx context.Context) (KindStats, error) {
	k := newKindStats(KindSweep)
	recs, err := c.sweeps().Sweeps(ctx) // records only: no tests, no report
	if err != nil {
		return k, fmt.Errorf("sweep stats: %w", err)
	}
	for i := len(recs) - 1; i >= 0; i-- { // newest first: oldest first
		r := recs[i]
		k.States[string(r.State)]++
		if r.State != sweep.StateRunning {
			continue
		}
		p, live := c.sweep().Live(r.ID)
		if !live { // interrupted, resumed later: read it from the store
			if p, err = c.sweep().Status(ctx, r.ID); err != nil {
				return k, fmt.Errorf("sweep stats %s: %w", r.ID, err)
			}
		}
		k.Running = append(k.Running, CampaignRun{ID: r.ID, Round: p.Round,
			TestsDone: p.Singles + p.Pairs, Tests: p.SinglesAll + p.PairsAll})
	}
	return k, nil
}

func (c *campaigns) rolloutStats(ctx context.Context) (KindStats, error) {
	k := newKindStats(KindRollout)
	e, err := c.rolloutReads(ctx)
	if err != nil {
		return k, err
	}
	for _, r := range e.List() {
		k.States[string(r.Phase)]++
		switch r.Phase {
		case rollout.PhaseCompleted, rollout.PhaseAborted, rollout.PhaseRolledBack:
			continue
		}
		run := CampaignRun{ID: r.ID, Round: r.Wave + 1, Halted: r.Paused || r.Phase == rollout.PhaseHalted,
			Nodes: map[string]int{ProgressPending: 0, ProgressActive: 0, ProgressDone: 0, ProgressFailed: 0, ProgressSkipped: 0}}
		for st, n := range r.Counts {
			switch st {
			case rollout.Pending:
				run.Nodes[ProgressPending] += n
			case rollout.Done, rollout.RolledBack:
				run.Nodes[ProgressDone] += n
			case rollout.Failed:
				run.Nodes[ProgressFailed] += n
			case rollout.Skipped:
				run.Nodes[ProgressSkipped] += n
			default:
				run.Nodes[ProgressActive] += n
			}
		}
		k.Running = append(k.Running, run)
	}
	return k, nil
}

func (c *campaigns) burninStats(ctx context.Context) (KindStats, error) {
	k := newKindStats(KindBurnin)
	list, err := c.burnin().List(ctx)
	if err != nil {
		return k, fmt.Errorf("burn-in stats: %w", err)
	}
	for _, b := range list {
		k.States[string(b.State)]++
		if b.State != burnin.StateRunning {
			continue
		}
		run := CampaignRun{ID: b.ID, TestsDone: b.RunsDone, Tests: b.RunsTotal,
			Nodes: map[string]int{ProgressPending: 0, ProgressActive: 0, ProgressDone: 0, ProgressFailed: 0}}
		for _, n := range b.NodeStates {
			switch {
			case n.Verdict == burnin.Rejected:
				run.Nodes[ProgressFailed]++
			case n.Verdict == burnin.Accepted && n.State == burnin.NodeDone:
				run.Nodes[ProgressDone]++
			case n.State == burnin.NodePending:
				run.Nodes[ProgressPending]++
			default:
				run.Nodes[ProgressActive]++
			}
		}
		k.Running = append(k.Running, run)
	}
	return k, nil
}

func (c *campaigns) drillStats(ctx context.Context) (KindStats, error) {
	k := newKindStats(KindDrill)
	list, err := c.drill().List(ctx)
	if err != nil {
		return k, fmt.Errorf("drill stats: %w", err)
	}
	for _, d := range list {
		k.States[string(d.State)]++
		if d.State != drill.StateRunning {
			continue
		}
		run := CampaignRun{ID: d.ID, Nodes: map[string]int{ProgressPending: 0, ProgressActive: 0, ProgressDone: 0, ProgressFailed: 0}}
		for _, t := range d.Targets {
			switch {
			case t.Aborted:
				run.Nodes[ProgressFailed]++
			case t.State == drill.TargetDone:
				run.Nodes[ProgressDone]++
			case t.State == drill.TargetPending:
				run.Nodes[ProgressPending]++
			default:
				run.Nodes[ProgressActive]++
			}
		}
		k.Running = append(k.Running, run)
	}
	return k, nil
}
