package coordinator

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/leader"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/compat"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
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
	policy  *drainPolicy            // nil when the drain policy is off
	conds   *conditionWriter        // nil unless the drain adapter writes node conditions
	deps    kit.Deps                // what the engines run on (unfenced: see leadTerm)
	eng     atomic.Pointer[engines] // rebuilt from the store at every leadership term
	reads   *engines                // built at start-up: under a lease never run, they answer a follower's rollout reads
	lease   *leader.Lease           // nil on SQLite or without ha:; then this coordinator always leads
	lead    leadership              // the running term, if this coordinator leads (campaign_lead.go)

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
	if sdb.Dialect() == sqldb.Postgres {
		// Every coordinator on the database counts its drains (campaigns,
		// drain policy, remediation) against one window, in a ledger
		// table; unfenced, since followers drain too (docs/ha.md).
		if err := c.breaker.Share(ctx, sqldb.Wrap(c.db, sqldb.Postgres, nil)); err != nil {
			return nil, err
		}
	}
	// One Deps for every engine: they share the database, clock, breaker
	// and which nodes campaigns hold. These engines migrate the tables and
	// serve reads; under a lease each term builds its own on the fenced
	// database (campaign_lead.go). Baselines and results are never fenced.
	busy := &kit.Busy{}
	c.deps = kit.Deps{DB: sdb, Fleet: c.fleet, Clock: clock, Drainer: adapter, Breaker: c.breaker, Busy: busy, Logger: c.log}
	e, err := c.newEngines(ctx, c.deps)
	if err != nil {
		return nil, err
	}
	c.eng.Store(e)
	c.reads = e
	c.log.Info().Str("mode", string(e.remed.Mode())).Msg("remediation ladder on")
	// The breaker keeps its window in memory: the campaigns' own records
	// of their drains bring it back after a restart.
	window := bc.Window
	if window <= 0 {
		window = time.Hour
	}
	if recs, err := e.sweep.BreakerRecords(ctx, clock.Now().Add(-window)); err == nil {
		c.breaker.Restore(recs)
	} else {
		c.log.Warn().Err(err).Msg("sweep drains not restored into the breaker")
	}
	if recs, err := e.burnin.DrainRecords(ctx); err == nil {
		c.breaker.Restore(recs)
	} else {
		c.log.Warn().Err(err).Msg("burn-in drains not restored into the breaker")
	}
	if recs, err := e.remed.DrainRecords(ctx, clock.Now().Add(-window)); err == nil {
		c.breaker.Restore(recs)
	} else {
		c.log.Warn().Err(err).Msg("remediation drains not restored into the breaker")
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
	return c, nil
}

// stop ends the schedule and the loops, and closes the engines' database.
func (c *campaigns) stop() error {
	// The term ends (its schedule and loops) with the engines' life.
	c.cancel()
	c.lead.wait()
	c.wg.Wait()
	c.policy.wait()
	c.conds.wait()
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
