// Package agent is the node daemon: it runs the enabled passive checks on
// its own schedule, runs the checks the coordinator asks for by name (and
// only those its config enables), keeps every result on local disk until the
// coordinator acknowledges it, and holds one long-lived gRPC stream to the
// coordinator that it opens itself, so agents behind firewalls work.
//
// Guarantees: a result is deleted from the spool only after the coordinator
// acknowledged storing it, so a coordinator down for an hour loses nothing;
// results carry ids made here, so a resend after a reconnect is stored once
// by the coordinator's dedupe. A slow or hung check runs on its own
// goroutine with its own deadline and never blocks the stream's heartbeats,
// acks or other checks. The coordinator sends names and a timeout, never
// commands.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/fleetcheck/fleetcheck/agent/spool"
	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/membership"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/inspect"
)

// ErrStateDirInUse: another agent holds the state directory.
var ErrStateDirInUse = errors.New("state dir is in use by another agent")

// Option adjusts an Agent.
type Option func(*options)

type options struct {
	version      string
	backoff      Backoff
	activity     ActivitySource
	metrics      Metrics
	dial         []grpc.DialOption
	helloTimeout time.Duration
	healthyAfter time.Duration
	ackTimeout   time.Duration
	window       int
	gossipTune   func(*membership.Config)
	spoolFS      spool.FS
	lookup       lookupFunc
}

// WithVersion sets the agent version the hello declares.
func WithVersion(v string) Option { return func(o *options) { o.version = v } }

// WithBackoff replaces the reconnect backoff (default: ExpBackoff from the
// config's reconnect section).
func WithBackoff(b Backoff) Option { return func(o *options) { o.backoff = b } }

// WithActivitySource replaces how the agent learns the node's activity
// (default: the activity file, then the config's activity).
func WithActivitySource(s ActivitySource) Option { return func(o *options) { o.activity = s } }

// WithGossipConfig adjusts the gossip pool's configuration before it
// starts (tests and the demo: transport, timings).
func WithGossipConfig(f func(*membership.Config)) Option {
	return func(o *options) { o.gossipTune = f }
}

// WithSpoolFS writes the spool's files through fs (tests: a full disk).
func WithSpoolFS(fs spool.FS) Option { return func(o *options) { o.spoolFS = fs } }

// WithMetrics hands the agent's measurements to m (the /metrics exporter).
func WithMetrics(m Metrics) Option { return func(o *options) { o.metrics = m } }

// WithDialOptions adds gRPC dial options after the agent's own (tests: an
// in-memory dialer; later: interceptors).
func WithDialOptions(d ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, d...) }
}

// WithTimeouts tunes the stream's timing: how long to wait for the
// welcome, how long a connection must last to reset the backoff, and how
// long a sent result may go unacknowledged before the stream is redone.
// Zero keeps a default (reconnect.hello_timeout, 30s, 2m).
func WithTimeouts(hello, healthyAfter, ack time.Duration) Option {
	return func(o *options) {
		if hello > 0 {
			o.helloTimeout = hello
		}
		if healthyAfter > 0 {
			o.healthyAfter = healthyAfter
		}
		if ack > 0 {
			o.ackTimeout = ack
		}
	}
}

// Agent is the node daemon. Create it with New, run it with Run.
type Agent struct {
	cfg  *Config
	host host.Host
	log  zerolog.Logger
	o    options

	known        map[string]checks.Check // every check fleetcheck has
	enabled      map[string]checks.Check // what this agent may run
	enabledNames []string
	passive      []checks.Check // enabled passive checks: the quick pass

	started atomic.Bool
	ctx     context.Context // Run's context: requested checks outlive a stream
	creds   credentials.TransportCredentials
	certs   *pki.Reloader // nil when insecure
	spool   *spool.Spool
	workWG  sync.WaitGroup

	// actions and multi are the host's optional capabilities (nil when
	// it has none), taken before the host is guarded.
	actions host.ActionRunner
	multi   host.MultiNodeRunner
	reverts *revertKeeper
	kick    chan struct{} // asks the schedule for a pass now
	// gossip is nil when gossip is off or failed to start. Set in Run
	// before the goroutines that read it start; never changed after.
	gossip *gossip

	mu        sync.Mutex
	state     *checks.State
	inventory *report.Inventory
	sess      *session
	work      map[string]*workItem
	workOrder []string // ids in arrival order, to bound work
	running   int
	acts      map[string]*actionItem // by action id
	actOrder  []string
	// actRunning counts the actions running.
	actRunning int
	// reserved names who holds the node for a disruptive run ("" free);
	// disruptiveRuns counts the single-node disruptive checks running.
	reserved       string
	disruptiveRuns int
	peers          map[string]*peerRun // multi-node runs joined as a peer, by multi id
	// activityErr is the last activity error, to log it once.
	activityErr string
}

// New checks cfg and builds an agent reading h. It touches no disk and no
// network; Run does.
func New(cfg *Config, h host.Host, logger zerolog.Logger, opts ...Option) (*Agent, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil config", ErrInvalid)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if h == nil {
		return nil, errors.New("agent: nil host")
	}
	o := options{
		version:      "dev",
		metrics:      nopMetrics{},
		helloTimeout: time.Duration(cfg.Reconnect.HelloTimeout),
		healthyAfter: 30 * time.Second,
		ackTimeout:   2 * time.Minute,
		window:       32,
		backoff:      ExpBackoff{Initial: time.Duration(cfg.Reconnect.Initial), Max: time.Duration(cfg.Reconnect.Max)},
		activity:     fileActivity{path: cfg.activityFile(), fallback: cfg.Activity},
		lookup:       net.DefaultResolver.LookupHost,
	}
	for _, opt := range opts {
		opt(&o)
	}
	a := &Agent{
		cfg:     cfg,
		host:    guard(h),
		log:     logger.With().Str("node", cfg.Node).Logger(),
		o:       o,
		known:   map[string]checks.Check{},
		enabled: map[string]checks.Check{},
		work:    map[string]*workItem{},
		acts:    map[string]*actionItem{},
		peers:   map[string]*peerRun{},
		kick:    make(chan struct{}, 1),
	}
	a.actions, _ = h.(host.ActionRunner)
	a.multi, _ = h.(host.MultiNodeRunner)
	a.reverts = newRevertKeeper(cfg.StateDir, a.log, a.runRevert)
	all := registry.All()
	for _, c := range all {
		a.known[c.Name()] = c
	}
	for _, c := range cfg.enabledChecks(all) {
		a.enabled[c.Name()] = c
		a.enabledNames = append(a.enabledNames, c.Name())
		if !c.Disruptive() {
			a.passive = append(a.passive, c)
		}
	}
	return a, nil
}

// Run runs the agent until ctx is done: the quick-pass schedule and the
// stream to the coordinator, reconnecting as needed. It returns nil on a
// graceful stop and an error only when the agent cannot start (state
// directory unusable or held by another agent).
func (a *Agent) Run(ctx context.Context) error {
	if !a.started.CompareAndSwap(false, true) {
		return errors.New("agent: Run called twice")
	}
	// A certificate that cannot be read is a config error: say so now
	// rather than retry a connection that can never succeed.
	creds, certs, err := transport(a.cfg, a.log)
	if err != nil {
		return err
	}
	a.creds, a.certs = creds, certs
	if err := os.MkdirAll(a.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	unlock, err := lockDir(a.cfg.StateDir)
	if err != nil {
		return err
	}
	defer unlock()
	spoolOpts := []spool.Option{spool.OnDrop(func(r spool.DropReason, n int) { a.o.metrics.SpoolDropped(string(r), n) })}
	if a.o.spoolFS != nil {
		spoolOpts = append(spoolOpts, spool.WithFS(a.o.spoolFS))
	}
	sp, err := spool.Open(filepath.Join(a.cfg.StateDir, "spool"),
		spool.Limits{MaxEntries: a.cfg.Spool.MaxResults, MaxBytes: int64(a.cfg.Spool.MaxBytes)}, a.log, spoolOpts...)
	if err != nil {
		return err
	}
	a.spool = sp
	p, err := loadState(a.cfg.StateDir)
	if err != nil {
		// Costs one pass of deltas, not the agent.
		a.log.Warn().Err(err).Msg("ignoring unreadable state; counter deltas restart")
	}
	a.mu.Lock()
	a.state, a.inventory = p.Checks, p.Inventory
	a.mu.Unlock()
	// Timers a previous run armed must fire on time, stream or not.
	if err := a.reverts.load(); err != nil {
		return err
	}
	a.ctx = ctx
	a.o.metrics.Spool(sp.Len(), sp.Bytes())
	a.log.Info().Strs("coordinators", a.cfg.coordinatorAddrs()).Strs("enabled_checks", a.enabledNames).
		Dur("interval_ms", time.Duration(a.cfg.Interval)).Int("spooled", sp.Len()).Msg("agent starting")

	a.startGossip()

	var wg sync.WaitGroup
	wg.Go(func() {
		<-ctx.Done()
		a.stopGossip()
	})
	wg.Go(func() { a.schedule(ctx) })
	wg.Go(func() { a.connectLoop(ctx) })
	wg.Go(func() { a.reverts.loop(ctx) })
	if certs != nil {
		// Handshakes reread changed files; this also logs a renewed or
		// broken certificate while the stream stays up.
		wg.Go(func() { certs.Run(ctx, 0) })
	}
	wg.Wait()
	// Requested checks see ctx done; inspections return at once then.
	a.workWG.Wait()
	a.log.Info().Int("spooled", sp.Len()).Msg("agent stopped")
	return nil
}

// lockDir takes an exclusive lock on the state directory: two agents on
// one spool would send and delete each other's results.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close() // the lock error is the one to report
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrStateDirInUse, dir)
		}
		return nil, fmt.Errorf("state dir lock: %w", err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		_ = f.Close() // the lock goes with the descriptor either way
	}, nil
}

// schedule runs a quick pass at start and then every interval. Passes never
// overlap: a pass slower than the interval delays the next one.
func (a *Agent) schedule(ctx context.Context) {
	t := time.NewTicker(time.Duration(a.cfg.Interval))
	defer t.Stop()
	trigger := wire.TriggerSchedule
	for {
		a.quickPass(ctx, trigger)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			trigger = wire.TriggerSchedule
		case <-a.kick:
			// A kick leaves the ticker alone: the schedule keeps its beat.
			trigger = wire.TriggerAfterAction
		}
	}
}

// quickPass runs the enabled passive checks, spools the result, then keeps
// the state for the next pass. Spool first: a crash between the two then
// re-reports an event instead of losing it.
func (a *Agent) quickPass(ctx context.Context, trigger string) {
	if len(a.passive) == 0 {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, time.Duration(a.cfg.PassTimeout))
	defer cancel()
	a.mu.Lock()
	prev := a.state
	a.mu.Unlock()
	r, next := a.inspect(pctx, a.passive, prev, "")
	r.Trigger = trigger
	if ctx.Err() != nil {
		return // stopping: a pass cut short says nothing about the node
	}
	if err := a.store(r); err != nil {
		a.log.Error().Err(err).Str("result_id", r.ID).Msg("cannot spool result")
	}
	inv := r.Report.Inventory
	a.mu.Lock()
	a.state, a.inventory = next, &inv
	a.mu.Unlock()
	if err := saveState(a.cfg.StateDir, persisted{Checks: next, Inventory: &inv}); err != nil {
		a.log.Error().Err(err).Msg("cannot save state")
	}
}

// inspect reads the host and runs list, returning the result and the state
// the pass leaves.
func (a *Agent) inspect(ctx context.Context, list []checks.Check, prev *checks.State, workID string) (*Result, *checks.State) {
	return a.inspectOn(ctx, a.host, &a.cfg.Checks, list, prev, workID)
}

// inspectOn is inspect on another view of the host or with another
// checks config (a multi-node run).
func (a *Agent) inspectOn(ctx context.Context, h host.Host, cfg *config.Config, list []checks.Check, prev *checks.State, workID string) (*Result, *checks.State) {
	started := time.Now()
	res := inspect.Run(ctx, h, inspect.Options{Config: cfg, Checks: list, Prev: prev, Labels: a.cfg.Labels})
	finished := time.Now()
	res.Report.Node = a.cfg.Node
	// Full: every passive check this agent's config enables ran. Not every
	// passive check there is: a node whose operator disabled one would
	// otherwise never send a full result and stay initializing for ever.
	full := len(a.passive) > 0
	for _, p := range a.passive {
		if !slices.ContainsFunc(list, func(c checks.Check) bool { return c.Name() == p.Name() }) {
			full = false
			break
		}
	}
	r := &Result{
		ID:       NewResultID(finished),
		Node:     a.cfg.Node,
		WorkID:   workID,
		Started:  started,
		Finished: finished,
		Full:     full,
		Trigger:  triggerOf(workID),
		Report:   res.Report,
	}
	return r, res.State
}

// triggerOf is a pass's trigger as its work id tells it: the schedule's
// passes say so themselves when kicked (quickPass).
func triggerOf(workID string) string {
	if workID != "" {
		return wire.TriggerRequest
	}
	return wire.TriggerSchedule
}

// store puts a result in the spool, durably, before anything is sent.
func (a *Agent) store(r *Result) error {
	took := r.Finished.Sub(r.Started)
	a.o.metrics.PassDone(r.WorkID, &r.Report, took)
	ev := a.log.Debug()
	if r.Report.Status != report.Pass {
		ev = a.log.Info()
	}
	ev.Str("result_id", r.ID).Str("work_id", r.WorkID).Str("status", string(r.Report.Status)).
		Dur("took_ms", took).Msg("inspection done")
	data, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	// Losses (the oldest dropped for the limits, or this one not
	// writable) reach the metrics through the spool's OnDrop.
	_, err = a.spool.Put(r.ID, data)
	a.o.metrics.Spool(a.spool.Len(), a.spool.Bytes())
	if err != nil {
		return fmt.Errorf("spool result: %w", err)
	}
	return nil
}

// activity asks the activity source; an error means "unknown", which
// refuses disruptive checks.
func (a *Agent) activity(ctx context.Context) Activity {
	act, err := a.o.activity.Activity(ctx)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	a.mu.Lock()
	changed := msg != a.activityErr
	a.activityErr = msg
	a.mu.Unlock()
	// Logged when it changes, not on every heartbeat.
	if changed && err != nil {
		a.log.Warn().Err(err).Msg("node activity unknown; disruptive checks refused")
	}
	if err != nil {
		return ActivityUnknown
	}
	return act
}
