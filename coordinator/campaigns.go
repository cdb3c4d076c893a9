package coordinator

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/compat"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// BreakerConfig bounds what campaigns together may drain (kit.Breaker).
//
//	breaker: {window: 1h, max_share: 0.05, max_count: 20}
type BreakerConfig struct {
	Window   time.Duration `yaml:"window"`
	MaxShare float64       `yaml:"max_share"`
	MaxCount int           `yaml:"max_count"`
}

// validateCampaigns checks the campaign sections of the config.
func (c Config) validateCampaigns() error {
	var errs []error
	switch c.Drain.Adapter {
	case "", "none", "slurm", "kubernetes":
	default:
		errs = append(errs, fmt.Errorf("drain.adapter %q: must be none, slurm or kubernetes", c.Drain.Adapter))
	}
	if err := c.Drain.Policy.validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs,
		rangeBreakerWindow.CheckOrZero("breaker.window", c.Breaker.Window),
		rangeBreakerShare.Check("breaker.max_share", c.Breaker.MaxShare),
		rangeBreakerCount.Check("breaker.max_count", c.Breaker.MaxCount),
		rangeSlurmTimeout.CheckOrZero("drain.slurm.timeout", c.Drain.Slurm.Timeout),
		rangeEvictTimeout.CheckOrZero("drain.kubernetes.eviction_timeout", c.Drain.Kubernetes.EvictionTimeout))
	if err := c.Remediation.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.SweepSchedule != nil {
		if _, err := cron.ParseStandard(c.SweepSchedule.Cron); err != nil {
			errs = append(errs, fmt.Errorf("sweep_schedule.cron %q: %w", c.SweepSchedule.Cron, err))
		}
		if err := c.SweepSchedule.Spec.WithDefaults().Validate(); err != nil {
			errs = append(errs, fmt.Errorf("sweep_schedule.spec: %w", err))
		}
	}
	return errors.Join(errs...)
}

// errNoFleet answers campaign calls on a coordinator given no fleet.
var errNoFleet = errors.New("no fleet wired into this coordinator: campaigns are off")

// campaigns hosts the campaign engines on the coordinator's database and
// serves CampaignService.
type campaigns struct {
	pb.UnimplementedCampaignServiceServer

	s       *Server
	log     zerolog.Logger
	db      *sql.DB
	fleet   kit.Fleet
	matrix  string // configured compatibility matrix file
	bl      *baselines.Store
	breaker *kit.Breaker
	policy  *drainPolicy     // nil when the drain policy is off
	conds   *conditionWriter // nil unless the drain adapter writes node conditions
	sweep   *sweep.Engine
	sweeps  sweep.Store // the sweep engine's store, listed for /metrics
	rollout *rollout.Engine
	burnin  *burnin.Engine
	drill   *drill.Engine
	remed   *remediation.Engine // the remediation ladder (shadow mode unless configured)
	feed    *remedFeed
	cron    *cron.Cron

	ctx      context.Context // the engines' life: cancelled by stop
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	sweeping atomic.Bool // a scheduled sweep is running
}

// startCampaigns opens the engines on st, restores the breaker, resumes
// interrupted sweeps and starts the engines' loops and the schedule. With
// no fleet only baselines are served.
func startCampaigns(ctx context.Context, s *Server, st *store.Store) (_ *campaigns, err error) {
	// The store's write fence comes with the handle: a coordinator that
	// lost its lease writes no campaign or baseline either.
	sdb, err := st.OpenSQLDB(ctx)
	if err != nil {
		return nil, fmt.Errorf("campaign database: %w", err)
	}
	c := &campaigns{s: s, log: s.log.With().Str("subsystem", "campaigns").Logger(), db: sdb.SQL(),
		fleet: s.campaignFleet(), matrix: s.cfg.CompatMatrix}
	defer func() {
		if err != nil {
			_ = c.db.Close() // the start error is the one to report
		}
	}()
	c.bl, err = baselines.NewSQLStore(sdb,
		baselines.WithSQLReader(st.ReaderSQLDB()), baselines.WithClock(s.now))
	if err != nil {
		return nil, fmt.Errorf("baselines: %w", err)
	}
	if res, err := c.bl.ImportReference(ctx, "coordinator"); err != nil {
		return nil, fmt.Errorf("baselines reference: %w", err)
	} else if res.Added > 0 {
		c.log.Info().Int("added", res.Added).Msg("reference baselines imported")
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if c.fleet == nil {
		c.log.Warn().Msg("no fleet: sweeps, rollouts, burn-ins and drills are off")
		return c, nil
	}
	defer func() {
		if err != nil {
			c.cancel()
		}
	}()
	clock := s.opts.CampaignClock
	if clock == nil {
		clock = kit.WallClock{}
	}
	adapter := s.opts.Drain
	if adapter == nil {
		if adapter, err = newDrainAdapter(s.cfg.Drain); err != nil {
			return nil, err
		}
	}
	bc := s.cfg.Breaker
	if c.breaker, err = kit.NewBreaker(kit.BreakerConfig{Window: bc.Window, MaxShare: bc.MaxShare, MaxCount: bc.MaxCount}, clock); err != nil {
		return nil, fmt.Errorf("breaker: %w", err)
	}
	// One Deps for every engine: they share the database, clock, breaker
	// and which nodes campaigns hold.
	busy := &kit.Busy{}
	deps := kit.Deps{DB: sdb, Fleet: c.fleet, Clock: clock, Drainer: adapter, Breaker: c.breaker, Busy: busy, Logger: c.log}
	if c.sweep, err = sweep.New(ctx, deps, sweep.Options{Baselines: sweep.FinderSource{Finder: c.bl}}); err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	sst := c.sweep.Store()
	c.sweeps = sst
	if c.rollout, err = rollout.New(ctx, deps, rollout.Options{Baselines: c.bl}); err != nil {
		return nil, fmt.Errorf("rollout: %w", err)
	}
	if c.burnin, err = burnin.New(ctx, deps, burnin.Options{Baselines: c.bl}); err != nil {
		return nil, fmt.Errorf("burnin: %w", err)
	}
	if c.drill, err = drill.New(ctx, deps, drill.Options{}); err != nil {
		return nil, fmt.Errorf("drill: %w", err)
	}
	if c.remed, err = remediation.New(ctx, s.cfg.Remediation, remediation.Deps{DB: sdb, Fleet: c.fleet, Drain: adapter, Breaker: c.breaker,
		Clock: clock, Log: c.log, Campaigns: remedHolding{c, busy}}); err != nil {
		return nil, fmt.Errorf("remediation: %w", err)
	}
	c.log.Info().Str("mode", string(c.remed.Mode())).Msg("remediation ladder on")
	// The breaker keeps its window in memory: the campaigns' own records
	// of their drains bring it back after a restart.
	window := bc.Window
	if window <= 0 {
		window = time.Hour
	}
	if recs, err := c.sweep.BreakerRecords(ctx, clock.Now().Add(-window)); err == nil {
		c.breaker.Restore(recs)
	} else {
		c.log.Warn().Err(err).Msg("sweep drains not restored into the breaker")
	}
	if recs, err := c.burnin.DrainRecords(ctx); err == nil {
		c.breaker.Restore(recs)
	} else {
		c.log.Warn().Err(err).Msg("burn-in drains not restored into the breaker")
	}
	if nodes, err := st.Nodes(ctx); err == nil {
		c.breaker.Restore(policyBreakerRecords(nodes))
	} else {
		c.log.Warn().Err(err).Msg("drain policy drains not restored into the breaker")
	}
	c.conds = newConditionWriter(c.ctx, adapter, c.log)
	if p := s.cfg.Drain.Policy; p.Enabled() {
		c.policy = newDrainPolicy(c.ctx, s, p, adapter, s.cfg.Drain.Adapter, c.breaker, c.log)
		c.log.Info().Strs("actions", p.Actions).Strs("codes", p.Codes).Str("adapter", c.policy.via).Msg("drain policy on")
	}
	if sc := s.cfg.SweepSchedule; sc != nil {
		spec := sc.Spec
		c.cron = cron.New()
		if _, err := c.cron.AddFunc(sc.Cron, func() { c.scheduledSweep(spec) }); err != nil {
			return nil, fmt.Errorf("sweep_schedule.cron: %w", err)
		}
		c.cron.Start()
	}
	// Finish the sweeps a stop interrupted. They are listed now, not in
	// the goroutine (as Engine.Resume would), so a sweep an operator
	// starts meanwhile is not picked up twice.
	recs, err := sst.Sweeps(ctx)
	if err != nil {
		return nil, fmt.Errorf("sweep resume: %w", err)
	}
	var interrupted []string
	for _, r := range slices.Backward(recs) { // oldest first
		if r.State == sweep.StateRunning {
			interrupted = append(interrupted, r.ID)
		}
	}
	c.loop("sweep resume", func(ctx context.Context) error {
		var errs []error
		for _, id := range interrupted {
			c.log.Info().Str("campaign", id).Msg("resuming sweep")
			if _, err := c.sweep.Run(ctx, id); err != nil && !errors.Is(err, sweep.ErrAlreadyRunning) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
	c.loop("rollout", c.rollout.Run)
	c.loop("burnin", c.burnin.Run)
	c.loop("drill", c.drill.Run)
	c.feed = newRemedFeed(c.ctx, c.remed, c.log)
	c.loop("remediation", func(ctx context.Context) error { return c.remed.Run(ctx, remediationPoll) })
	return c, nil
}

// loop runs an engine's loop until stop.
func (c *campaigns) loop(name string, run func(context.Context) error) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := run(c.ctx); err != nil && !errors.Is(err, context.Canceled) {
			c.log.Error().Err(err).Str("engine", name).Msg("campaign engine stopped")
		}
	}()
}

// stop ends the schedule and the loops, and closes the engines' database.
func (c *campaigns) stop() error {
	// No new scheduled run first; then end the running ones (a scheduled
	// sweep can take hours, so cancel before waiting for it).
	var jobs context.Context
	if c.cron != nil {
		jobs = c.cron.Stop()
	}
	c.cancel()
	if jobs != nil {
		<-jobs.Done()
	}
	c.wg.Wait()
	c.policy.wait()
	c.conds.wait()
	c.feed.wait()
	return c.db.Close()
}

// campaignErr maps the engines' sentinels onto gRPC codes.
func campaignErr(op string, err error) error {
	if err == nil {
		return nil
	}
	// A gRPC status already says what happened (a fleet call's error).
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, errNoFleet):
		code = codes.Unavailable
	case errors.Is(err, baselines.ErrNotFound), errors.Is(err, sweep.ErrNotFound), errors.Is(err, rollout.ErrNotFound),
		errors.Is(err, burnin.ErrNotFound), errors.Is(err, drill.ErrNotFound), errors.Is(err, store.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, baselines.ErrInvalid), errors.Is(err, sweep.ErrInvalidSpec), errors.Is(err, rollout.ErrInvalidSpec),
		errors.Is(err, burnin.ErrInvalidSpec), errors.Is(err, drill.ErrInvalidSpec), errors.Is(err, compat.ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, sweep.ErrAlreadyRunning), errors.Is(err, sweep.ErrExists), errors.Is(err, rollout.ErrState),
		errors.Is(err, rollout.ErrConflict), errors.Is(err, rollout.ErrNothingToDo), errors.Is(err, rollout.ErrNoMatrix),
		errors.Is(err, burnin.ErrBusy), errors.Is(err, burnin.ErrNoNodes), errors.Is(err, burnin.ErrFinished),
		errors.Is(err, drill.ErrRefused), errors.Is(err, drill.ErrFinished):
		code = codes.FailedPrecondition
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return status.Errorf(code, "%s: %v", op, err)
}

// audit records an operator's action before it is taken: an action that
// could not be recorded is not taken.
func (c *campaigns) audit(ctx context.Context, action, detail string) error {
	if err := c.s.Audit(ctx, "", action, detail); err != nil {
		return status.Errorf(codes.Unavailable, "%s: %v", action, err)
	}
	return nil
}

// auditStarted records a start once the campaign has its id; the campaign
// is running by then, so a failure is logged rather than returned.
func (c *campaigns) auditStarted(ctx context.Context, action, id string) {
	if err := c.s.Audit(ctx, "", action, id); err != nil {
		c.log.Error().Err(err).Str("campaign", id).Msg("audit")
	}
}

func (c *campaigns) needFleet() error {
	if c.fleet == nil {
		return status.Error(codes.Unavailable, errNoFleet.Error())
	}
	return nil
}

func jsonDoc(op string, v any) (*pb.Document, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s: encode: %v", op, err)
	}
	return &pb.Document{ContentType: "application/json", Body: b}, nil
}

// encodeErr is a typed answer's encoding error, as Internal.
func encodeErr(op string, err error) error {
	if err != nil {
		return status.Errorf(codes.Internal, "%s: encode: %v", op, err)
	}
	return nil
}

func started(op, id string, v any) (*pb.CampaignStarted, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s: encode: %v", op, err)
	}
	return &pb.CampaignStarted{Id: id, Document: b}, nil
}

// ---------------------------------------------------------------- baselines

// ---------------------------------------------------------------- sweeps

// ---------------------------------------------------------------- rollouts

// ---------------------------------------------------------------- burn-ins

// ---------------------------------------------------------------- drills

// conditions is the node condition writer; nil unless drains go through Kubernetes.
func (s *Server) conditions() *conditionWriter {
	if s.camp == nil {
		return nil
	}
	return s.camp.conds
}

// remedFeed is the remediation engine's result queue; nil without a fleet.
func (s *Server) remedFeed() *remedFeed {
	if s.camp == nil {
		return nil
	}
	return s.camp.feed
}

// drainPolicy is the running drain policy; nil when it is off.
func (s *Server) drainPolicy() *drainPolicy {
	if s.camp == nil {
		return nil
	}
	return s.camp.policy
}

// campaignFleet is the fleet campaigns run on: Options.Fleet when the
// caller wired one in (a simulated fleet), else the agents' streams.
func (s *Server) campaignFleet() kit.Fleet {
	if s.opts.Fleet != nil {
		return s.opts.Fleet
	}
	return s.Fleet()
}
