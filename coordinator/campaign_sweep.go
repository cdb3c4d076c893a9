package coordinator

import (
	"context"
	"errors"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/campaignpb"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// SweepScheduleConfig runs a sweep on a cron schedule (five fields,
// robfig/cron syntax, the coordinator's local time unless CRON_TZ= leads).
//
//	sweep_schedule:
//	  cron: "0 2 * * *"
//	  spec: {selector: "sku=h100", threshold: 0.3, drain: true}
type SweepScheduleConfig struct {
	Cron string `yaml:"cron"`
	// Spec is the sweep to run (campaigns/sweep/spec.go), decoded as strictly as
	// the rest of the file: durations as durations ("10m").
	Spec sweep.Spec `yaml:"spec"`
}

// parseSweepSpec reads a sweep spec as YAML or JSON (sweep.ParseSpec).
func parseSweepSpec(b []byte) (sweep.Spec, error) { return sweep.ParseSpec(b) }

// scheduledSweep runs one nightly sweep in the leader's term t; a night
// whose previous sweep is still running is skipped rather than queued.
func (c *campaigns) scheduledSweep(t *term, spec sweep.Spec) {
	if !c.sweeping.CompareAndSwap(false, true) {
		c.log.Warn().Msg("scheduled sweep skipped: the previous one is still running")
		return
	}
	defer c.sweeping.Store(false)
	ctx := t.ctx
	rec, err := t.e.sweep.Start(ctx, spec)
	if err != nil {
		c.log.Error().Err(err).Msg("scheduled sweep not started")
		return
	}
	if err := c.s.Audit(ctx, "schedule:sweep", "sweep.start", rec.ID); err != nil {
		c.log.Error().Err(err).Str("campaign", rec.ID).Msg("audit")
	}
	if err := c.runSweep(ctx, t.e, rec.ID); err != nil && !errors.Is(err, context.Canceled) {
		c.log.Error().Err(err).Str("campaign", rec.ID).Msg("scheduled sweep")
	}
}

// sweepRetry is the pause before a sweep stopped by an error runs again.
var sweepRetry = 5 * time.Second

// runSweep runs a stored sweep to its end in the leader's term. A run an
// error stopped (a store call failing while the database restarts) runs
// again after a pause, from what the store holds, while the sweep is
// still running and the term lasts: a leader that stays leader would
// otherwise leave it running for ever, which only a new leader resumes.
func (c *campaigns) runSweep(ctx context.Context, e *engines, id string) error {
	for {
		_, err := e.sweep.Run(ctx, id)
		if err == nil || ctx.Err() != nil || errors.Is(err, sweep.ErrAlreadyRunning) {
			return err
		}
		c.log.Warn().Err(err).Str("campaign", id).Dur("retry_in", sweepRetry).Msg("sweep stopped by an error; it runs again from the store")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(sweepRetry):
		}
		if rec, serr := e.sweeps.Sweep(ctx, id); serr == nil && rec.State != sweep.StateRunning {
			return err // it ended (failed with its reason, or stopped)
		}
	}
}

func (c *campaigns) SweepStart(ctx context.Context, req *pb.SpecRequest) (*pb.CampaignStarted, error) {
	const op = "sweep start"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	t, err := c.leader(ctx)
	if err != nil {
		return nil, err
	}
	spec, err := parseSweepSpec(req.GetSpec())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if err := c.audit(ctx, "sweep.start", "selector "+spec.Selector); err != nil {
		return nil, err
	}
	rec, err := t.e.sweep.Start(ctx, spec)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	c.auditStarted(ctx, "sweep.started", rec.ID)
	t.do(func(ctx context.Context) {
		if err := c.runSweep(ctx, t.e, rec.ID); err != nil && !errors.Is(err, context.Canceled) {
			c.log.Error().Err(err).Str("campaign", rec.ID).Msg("sweep")
		}
	})
	return started(op, rec.ID, rec)
}

func (c *campaigns) SweepStatus(ctx context.Context, req *pb.CampaignRef) (*pb.SweepStatusReply, error) {
	const op = "sweep status"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	if p, ok := c.sweep().Live(req.GetId()); ok {
		return campaignpb.SweepStatusPB(p), nil
	}
	p, err := c.sweep().Status(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return campaignpb.SweepStatusPB(p), nil
}

func (c *campaigns) SweepList(ctx context.Context, _ *pb.CampaignListRequest) (*pb.SweepListReply, error) {
	const op = "sweep list"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	l, err := c.sweep().List(ctx)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return campaignpb.SweepListPB(l), nil
}

func (c *campaigns) SweepReport(ctx context.Context, req *pb.CampaignRef) (*pb.Document, error) {
	const op = "sweep report"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	r, err := c.sweep().Report(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, r)
}
