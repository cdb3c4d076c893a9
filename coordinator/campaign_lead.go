package coordinator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/leader"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// engines are the campaign engines of one leadership term. Each loads its
// campaigns from the store when built, so a coordinator that becomes
// leader builds them anew: what the previous leader wrote is what runs.
type engines struct {
	sweep   *sweep.Engine
	sweeps  sweep.Store // the sweep engine's store, listed for /metrics
	rollout *rollout.Engine
	burnin  *burnin.Engine
	drill   *drill.Engine
	remed   *remediation.Engine // the remediation ladder (shadow mode unless configured)
	db      *sqldb.DB           // what they write through (fenced under a lease)
}

func (c *campaigns) newEngines(ctx context.Context, d kit.Deps) (*engines, error) {
	e := engines{db: d.DB}
	var err error
	if e.sweep, err = sweep.New(ctx, d, sweep.Options{Baselines: sweep.FinderSource{Finder: c.bl}}); err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	e.sweeps = e.sweep.Store()
	if e.rollout, err = rollout.New(ctx, d, rollout.Options{Baselines: c.bl}); err != nil {
		return nil, fmt.Errorf("rollout: %w", err)
	}
	if e.burnin, err = burnin.New(ctx, d, burnin.Options{Baselines: c.bl}); err != nil {
		return nil, fmt.Errorf("burnin: %w", err)
	}
	if e.drill, err = drill.New(ctx, d, drill.Options{}); err != nil {
		return nil, fmt.Errorf("drill: %w", err)
	}
	if e.remed, err = remediation.New(ctx, c.s.cfg.Remediation, remediation.Deps{DB: d.DB, Fleet: d.Fleet, Drain: d.Drainer,
		Breaker: d.Breaker, Clock: d.Clock, Log: d.Logger, Campaigns: remedHolding{c, d.Busy},
		Baselines: remedBaselines{c}, History: remedHistory{c}}); err != nil {
		return nil, fmt.Errorf("remediation: %w", err)
	}
	return &e, nil
}

// rolloutReads is the rollout engine that answers rollout status and
// list: the running one while this coordinator leads (and always without
// a lease); on a follower the engine built at start-up, which no term
// runs, reloaded from the store for each read, so what the leader wrote
// is what a follower shows.
func (c *campaigns) rolloutReads(ctx context.Context) (*rollout.Engine, error) {
	if c.lease == nil || c.lead.get() != nil {
		return c.rollout(), nil
	}
	e := c.reads.rollout
	if err := e.Reload(ctx); err != nil {
		return nil, status.Errorf(codes.Unavailable, "rollouts: read the store: %v", err)
	}
	return e, nil
}

func (c *campaigns) sweep() *sweep.Engine     { return c.eng.Load().sweep }
func (c *campaigns) sweeps() sweep.Store      { return c.eng.Load().sweeps }
func (c *campaigns) rollout() *rollout.Engine { return c.eng.Load().rollout }
func (c *campaigns) burnin() *burnin.Engine   { return c.eng.Load().burnin }
func (c *campaigns) drill() *drill.Engine     { return c.eng.Load().drill }

// remed is the remediation engine: the leader's term's, else the one
// built at start-up; both read the store.
func (c *campaigns) remed() *remediation.Engine { return c.eng.Load().remed }

// HAConfig makes this coordinator one of several over one PostgreSQL
// store (docs/ha.md): they elect a leader through a lease in the
// database, and only the leader runs campaigns and the sweep schedule.
//
//	ha: {enabled: true, lease_ttl: 6s, advertise: coord-a.example:7443}
type HAConfig struct {
	Enabled bool `yaml:"enabled"`
	// LeaseTTL is how long the lease lasts unrenewed: a dead leader is
	// replaced within about 7/6 of it (default 6s).
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// Advertise is the address the others name as the leader's while this
	// one leads (default: the gRPC listen address).
	Advertise string `yaml:"advertise"`
}

var rangeLeaseTTL = config.R(leader.MinTTL, leader.MaxTTL)

func (h HAConfig) validate(storeURL string) error {
	if err := rangeLeaseTTL.CheckOrZero("ha.lease_ttl", h.LeaseTTL); err != nil {
		return err
	}
	if !h.Enabled {
		return nil
	}
	if t, err := sqldb.Parse(storeURL); storeURL == "" || err != nil || t.Dialect != sqldb.Postgres {
		return errors.New("ha.enabled: needs store_url: postgres://... (one SQLite file has one coordinator)")
	}
	return nil
}

// term is one leadership: its context ends when leadership does, and the
// work started in it (loops, sweeps, the schedule) is waited for before
// another term may start.
type term struct {
	ctx    context.Context
	e      *engines
	cron   *cron.Cron
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// do runs f in the term; false when the term has ended.
func (t *term) do(f func(ctx context.Context)) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f(t.ctx)
	}()
	return true
}

// leadership is the current term (nil while following) and the election.
type leadership struct {
	mu   sync.Mutex
	cur  *term
	done chan struct{} // closed when the election (or the only term) is over
}

func (l *leadership) set(t *term) {
	l.mu.Lock()
	l.cur = t
	l.mu.Unlock()
}

func (l *leadership) get() *term {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur
}

func (l *leadership) wait() {
	if l.done != nil {
		<-l.done
	}
}

// begin starts leading: at once on SQLite (one coordinator), else by
// taking part in the election. addr is the bound gRPC address.
func (c *campaigns) begin(ctx context.Context, addr string) error {
	if c.fleet == nil {
		return nil
	}
	c.lead.done = make(chan struct{})
	ha := c.s.cfg.HA
	if !ha.Enabled {
		t, err := c.startTerm(c.ctx)
		if err != nil {
			close(c.lead.done)
			return err
		}
		go func() {
			defer close(c.lead.done)
			<-c.ctx.Done()
			c.endTerm(t)
		}()
		return nil
	}
	if ha.Advertise != "" {
		addr = ha.Advertise
	}
	l, err := leader.New(sqldb.Wrap(c.db, sqldb.Postgres, nil), leader.Options{
		Addr: addr, TTL: ha.LeaseTTL, Logger: c.log, Holder: c.s.holder,
	})
	if err == nil {
		err = l.Migrate(ctx)
	}
	if err != nil {
		close(c.lead.done)
		return fmt.Errorf("ha: %w", err)
	}
	c.lease = l
	c.log.Info().Str("holder", l.Holder()).Str("addr", addr).Dur("lease_ttl", l.TTL()).Msg("ha: taking part in the leader election")
	go func() {
		defer close(c.lead.done)
		l.Run(c.ctx, c.leadTerm)
	}()
	return nil
}

// leadTerm is Lease.Run's lead function: the engines are built from the
// store as it is now, lead until ctx ends, and stop.
func (c *campaigns) leadTerm(ctx context.Context) {
	d := c.deps
	d.DB = sqldb.Wrap(c.db, sqldb.Postgres, c.lease.Fence) // every campaign write checks the token
	e, err := c.newEngines(ctx, d)
	if err == nil {
		c.eng.Store(e)
		var t *term
		if t, err = c.startTerm(ctx); err == nil {
			<-ctx.Done()
			c.endTerm(t)
			return
		}
	}
	if ctx.Err() != nil {
		return
	}
	// Give the lease up for a while rather than retake it at once.
	c.log.Error().Err(err).Msg("ha: leading failed; handing the lease on")
	t := time.NewTimer(c.lease.TTL())
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// startTerm resumes interrupted sweeps, starts the schedule and the
// engines' loops under ctx.
func (c *campaigns) startTerm(ctx context.Context) (*term, error) {
	e := c.eng.Load()
	// Listed now, not in the goroutine (as Engine.Resume would), and
	// before operators may start one, so no sweep is picked up twice.
	recs, err := e.sweeps.Sweeps(ctx)
	if err != nil {
		return nil, fmt.Errorf("sweep resume: %w", err)
	}
	var interrupted []string
	for _, r := range slices.Backward(recs) { // oldest first
		if r.State == sweep.StateRunning {
			interrupted = append(interrupted, r.ID)
		}
	}
	// Before any run of this term: the multi-node runs of earlier
	// leaders, whose peers may still be reserved (stalemulti.go).
	if err := c.s.loadStaleMultis(ctx, c.s.now()); err != nil {
		return nil, fmt.Errorf("multi-node runs of earlier terms: %w", err)
	}
	t := &term{ctx: ctx, e: e}
	if sc := c.s.cfg.SweepSchedule; sc != nil {
		spec := sc.Spec
		t.cron = cron.New()
		if _, err := t.cron.AddFunc(sc.Cron, func() { c.scheduledSweep(t, spec) }); err != nil {
			return nil, fmt.Errorf("sweep_schedule.cron: %w", err)
		}
		t.cron.Start()
	}
	c.lead.set(t)
	loop := func(name string, run func(context.Context) error) {
		t.do(func(ctx context.Context) {
			if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				c.log.Error().Err(err).Str("engine", name).Msg("campaign engine stopped")
			}
		})
	}
	loop("sweep resume", func(ctx context.Context) error {
		var errs []error
		for _, id := range interrupted {
			c.log.Info().Str("campaign", id).Msg("resuming sweep")
			if err := c.runSweep(ctx, e, id); err != nil && !errors.Is(err, sweep.ErrAlreadyRunning) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
	loop("rollout", e.rollout.Run)
	loop("burnin", e.burnin.Run)
	loop("drill", e.drill.Run)
	// The ladder runs in the term too: stepped from the store (so what
	// the previous leader left in flight goes on), fed from the results
	// every coordinator stores, writing through the fenced handle.
	loop("remediation", func(ctx context.Context) error { return e.remed.Run(ctx, remediationPoll) })
	loop("remediation feed", func(ctx context.Context) error { return c.runRemedFeed(ctx, e.remed) })
	return t, nil
}

// endTerm waits for a term whose ctx has ended: no new scheduled run,
// then the running ones.
func (c *campaigns) endTerm(t *term) {
	c.lead.set(nil)
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	if t.cron != nil {
		<-t.cron.Stop().Done()
	}
	t.wg.Wait()
}

// leader is the running term, for a campaign-changing call; a follower
// refuses it with the leader's address, which the CLI retries at.
func (c *campaigns) leader(ctx context.Context) (*term, error) {
	if t := c.lead.get(); t != nil && t.ctx.Err() == nil {
		return t, nil
	}
	if c.lease == nil {
		return nil, status.Error(codes.Unavailable, "campaigns are stopping")
	}
	cur, err := c.lease.Current(ctx)
	switch {
	case err != nil:
		return nil, leader.NoLeaderError(fmt.Sprintf("not the leader, and the lease cannot be read: %v", err))
	case !cur.Valid || cur.Holder == c.lease.Holder():
		return nil, leader.NoLeaderError("not the leader; no leader now (an election is under way): retry in a few seconds")
	}
	// The refusal carries the address as a detail too (leader.Refusal):
	// the CLI retries there.
	return nil, leader.NotLeaderError(cur.Addr)
}

// notLeaderPrefix starts a follower's refusal; the leader's address
// follows.
const notLeaderPrefix = leader.NotLeaderPrefix
