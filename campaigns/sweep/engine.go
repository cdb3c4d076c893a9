package sweep

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// checkAllReduce is the check a sweep runs; its busbw metric is the one
// baselines.MetricAllReduceBusBW names.
const checkAllReduce = "nccl.allreduce"

// codeDataCorruption is the nccl.allreduce finding for wrong results: a
// run that corrupts data measures nothing worth comparing.
const codeDataCorruption = "NCCL_DATA_CORRUPTION"

// ErrAlreadyRunning is returned when Run is called for a sweep this
// engine is already running.
var ErrAlreadyRunning = errors.New("sweep already running")

// Drainer takes a node out of service: a drain.Adapter (none, slurm,
// kubernetes) is one. It must be idempotent: after a restart a drain
// asked for but not recorded as done is asked for again.
type Drainer interface {
	Drain(ctx context.Context, node, reason string) error
}

// DrainFunc adapts a function to Drainer.
type DrainFunc func(ctx context.Context, node, reason string) error

// Drain calls f.
func (f DrainFunc) Drain(ctx context.Context, node, reason string) error { return f(ctx, node, reason) }

// Options are the sweep engine's own knobs.
type Options struct {
	// Store keeps the sweeps (nil: an SQLStore on Deps.DB).
	Store Store
	// Baselines decide the verdicts (required).
	Baselines BaselineSource
	// OnProgress, when set, is called after every finished test and new
	// wave (from the engine's goroutines, one call at a time).
	OnProgress func(Progress)
	// NewID names new sweeps (default: kit.NewID("sweep", now)).
	NewID func(now time.Time) string
}

// engineConfig is what the engine runs with.
type engineConfig struct {
	Fleet     kit.Fleet
	Store     Store
	Baselines BaselineSource
	// Drainer is used when a spec asks to drain; nil records the drains
	// as skipped.
	Drainer Drainer
	// Breaker is asked before every drain (nil allows all).
	Breaker    *kit.Breaker
	OnProgress func(Progress)
	NewID      func(now time.Time) string
}

// Engine runs sweeps. It is safe for concurrent use; one sweep is run by
// one Run call at a time.
type Engine struct {
	cfg   engineConfig
	clock kit.Clock
	busy  *kit.Busy
	log   zerolog.Logger

	mu       sync.Mutex
	running  map[string]*Progress
	progress sync.Mutex // serializes OnProgress
	// waits: since when a test's node has waited for its agent (in memory:
	// a restarted coordinator gives every agent a fresh grace).
	waits kit.ConnectWaits
}

// New checks the wiring and opens the store. A clock with Join and Leave
// (simfleet.Clock) is told which goroutines take part, so simulated time
// moves only when all of them wait. Deps.Drainer nil records the drains a
// spec asks for as skipped. The engine registers its running sweeps'
// nodes in d.Busy and leaves out nodes other campaigns hold.
func New(ctx context.Context, d kit.Deps, opts Options) (*Engine, error) {
	drainer := d.Drainer
	d, err := d.Check("sweep engine")
	if err != nil {
		return nil, err
	}
	if opts.Baselines == nil {
		return nil, errors.New("sweep engine: no baseline source")
	}
	cfg := engineConfig{Fleet: d.Fleet, Store: opts.Store, Baselines: opts.Baselines, Breaker: d.Breaker,
		OnProgress: opts.OnProgress, NewID: opts.NewID}
	if drainer != nil {
		cfg.Drainer = drainer
	}
	if cfg.Store == nil {
		if d.DB == nil {
			return nil, errors.New("sweep engine: no store and no database")
		}
		if cfg.Store, err = OpenSQLStore(ctx, d.DB, d.Clock.Now()); err != nil {
			return nil, err
		}
	}
	if cfg.NewID == nil {
		cfg.NewID = func(now time.Time) string { return kit.NewID("sweep", now) }
	}
	e := &Engine{cfg: cfg, clock: d.Clock, busy: d.Busy, log: d.Logger, running: map[string]*Progress{}}
	e.busy.Register("sweep", e.busyNodes)
	return e, nil
}

// Store is where the engine keeps its sweeps.
func (e *Engine) Store() Store { return e.cfg.Store }

// busyNodes lists the nodes of running sweeps, for kit.Busy.
func (e *Engine) busyNodes(ctx context.Context) (map[string]string, error) {
	recs, err := e.cfg.Store.Sweeps(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, r := range recs {
		if r.State != StateRunning {
			continue
		}
		for _, n := range r.Nodes {
			out[n.Name] = "sweep " + r.ID
		}
	}
	return out, nil
}

// Start selects the nodes and stores a new sweep; Run runs it.
func (e *Engine) Start(ctx context.Context, spec Spec) (Record, error) {
	spec = spec.WithDefaults()
	if err := spec.Validate(); err != nil {
		return Record{}, err
	}
	nodes, err := e.cfg.Fleet.Nodes(ctx, spec.Selector)
	if err != nil {
		return Record{}, fmt.Errorf("start sweep: list nodes %q: %w", spec.Selector, err)
	}
	var rec Record
	err = e.busy.Claim(ctx, func(held map[string]string) error {
		var err error
		rec, err = e.create(ctx, spec, nodes, held)
		return err
	})
	if err != nil {
		return Record{}, err
	}
	id := rec.ID
	e.log.Info().Str("campaign", id).Int("nodes", len(rec.Nodes)).Int("skipped", len(rec.Skipped)).
		Int("unreachable", len(rec.Unreachable)).Int("deferred", len(rec.Deferred)).Msg("sweep started")
	return rec, nil
}

// create selects the nodes, leaving out those other campaigns hold, and
// stores the new sweep.
func (e *Engine) create(ctx context.Context, spec Spec, nodes []kit.Node, held map[string]string) (Record, error) {
	var free []kit.Node
	var heldSkips []Skip
	for _, n := range nodes {
		if who, ok := held[n.Name]; ok {
			heldSkips = append(heldSkips, Skip{Node: n.Name, Reason: "held by " + who})
			continue
		}
		free = append(free, n)
	}
	last, err := e.cfg.Store.Coverage(ctx)
	if err != nil {
		return Record{}, fmt.Errorf("start sweep: %w", err)
	}
	sel := selectNodes(free, spec, last)
	now := e.clock.Now()
	id := e.cfg.NewID(now)
	seed := spec.Seed
	if seed == 0 {
		seed = hashSeed(0, id)
	}
	rec := Record{
		ID: id, Spec: spec, Seed: seed, State: StateRunning,
		Created: now, Started: now,
		Unreachable: sel.unreachable, Skipped: append(sel.skipped, heldSkips...), Deferred: sel.deferred, Coverage: sel.cov,
	}
	for _, n := range sel.take {
		rec.Nodes = append(rec.Nodes, nodeInfo(n))
	}
	if err := e.cfg.Store.CreateSweep(ctx, rec); err != nil {
		return Record{}, fmt.Errorf("start sweep: %w", err)
	}
	return rec, nil
}

func nodeInfo(n kit.Node) NodeInfo {
	labels := make(map[string]string, len(n.Labels))
	for k, v := range n.Labels {
		labels[k] = v
	}
	return NodeInfo{
		Name: n.Name, Labels: labels, GPUs: len(n.Inventory.GPUs),
		SKU:   baselines.SKUFromInventory(n.Inventory, n.Labels),
		Stack: baselines.Stack{Driver: n.Inventory.DriverVersion, RDMAStack: n.Inventory.RDMAStack}.Normalize(),
	}
}

// Sweep starts a sweep and runs it to the end.
func (e *Engine) Sweep(ctx context.Context, spec Spec) (*Report, error) {
	rec, err := e.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	return e.Run(ctx, rec.ID)
}

// Resume runs every sweep the store holds as running (a coordinator calls
// it at start), oldest first.
func (e *Engine) Resume(ctx context.Context) ([]*Report, error) {
	recs, err := e.cfg.Store.Sweeps(ctx)
	if err != nil {
		return nil, fmt.Errorf("resume sweeps: %w", err)
	}
	slices.Reverse(recs)
	var out []*Report
	var errs []error
	for _, r := range recs {
		if r.State != StateRunning {
			continue
		}
		rep, err := e.Run(ctx, r.ID)
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		out = append(out, rep)
	}
	return out, errors.Join(errs...)
}

// Run drives a stored sweep to its end and returns its report. On a sweep
// that was interrupted it continues where the store says it stopped:
// finished tests are kept, tests that were started but not finished run
// again. When ctx ends Run returns its error and the sweep stays running.
func (e *Engine) Run(ctx context.Context, id string) (*Report, error) {
	kit.Join(e.clock)
	defer kit.Leave(e.clock)
	e.mu.Lock()
	if _, ok := e.running[id]; ok {
		e.mu.Unlock()
		return nil, fmt.Errorf("run sweep %s: %w", id, ErrAlreadyRunning)
	}
	prog := &Progress{ID: id, State: StateRunning}
	e.running[id] = prog
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.running, id)
		e.mu.Unlock()
	}()

	rec, err := e.cfg.Store.Sweep(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("run sweep: %w", err)
	}
	if rec.State != StateRunning {
		if rec.Report != nil {
			return rec.Report, nil
		}
		return nil, fmt.Errorf("run sweep %s: it is %s: %s", id, rec.State, rec.Error)
	}
	rec.Spec = rec.Spec.WithDefaults()
	if err := rec.Spec.Validate(); err != nil {
		return nil, e.fail(ctx, &rec, err)
	}
	rec.indexNodes()
	tests, err := e.cfg.Store.Tests(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("run sweep %s: %w", id, err)
	}
	log := e.log.With().Str("campaign", id).Logger()
	if rec.Phase != "" {
		log.Info().Str("phase", string(rec.Phase)).Int("wave", rec.Wave).Int("tests", len(tests)).Msg("sweep resumed")
	}
	if rec.Phase == "" && len(rec.Unreachable) > 0 {
		if err := e.awaitUnreachable(ctx, &rec, prog, log); err != nil {
			return nil, err
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Only the current wave can have unfinished tests; any left over
		// from an earlier one (a store written by hand) runs first.
		var pending []int
		for i := range tests {
			if tests[i].State != TestDone {
				pending = append(pending, i)
			}
		}
		e.setProgress(prog, &rec, tests)
		if len(pending) > 0 {
			if err := e.runWave(ctx, &rec, tests, pending, prog); err != nil {
				return nil, err
			}
			continue
		}
		a := analyse(&rec, tests)
		phase, wave, next := planNext(&rec, a)
		if phase == PhaseDone {
			return e.finish(ctx, &rec, tests, a)
		}
		for i := range next {
			next[i].Seq = len(tests) + i + 1
		}
		if err := e.cfg.Store.SavePlan(ctx, id, phase, wave, next); err != nil {
			return nil, fmt.Errorf("run sweep %s: plan %s wave %d: %w", id, phase, wave, err)
		}
		rec.Phase, rec.Wave = phase, wave
		tests = append(tests, next...)
		log.Info().Str("phase", string(phase)).Int("round", phase.Round()).Int("wave", wave).Int("tests", len(next)).Msg("wave planned")
	}
}

// reconnectPoll is how often a sweep waiting for agents asks again.
const reconnectPoll = 5 * time.Second

// awaitUnreachable waits, before the first round, for selected nodes whose
// agent was not connected when the sweep started (agents reconnect with
// backoff after a coordinator restart), until the spec's connect grace
// after the start. A node that comes back joins the sweep (under the
// activity rule; into Deferred when the budget already deferred nodes);
// the others stay unreachable, which is never a pass.
func (e *Engine) awaitUnreachable(ctx context.Context, rec *Record, prog *Progress, log zerolog.Logger) error {
	grace := rec.Spec.connectGrace()
	deadline := rec.Started.Add(grace)
	for {
		list, err := e.cfg.Fleet.Nodes(ctx, "name in ("+strings.Join(rec.Unreachable, ",")+")")
		if err != nil {
			list = nil // asked again at the next poll
		}
		back := map[string]kit.Node{}
		for _, n := range list {
			if n.Connected && slices.Contains(rec.Unreachable, n.Name) {
				back[n.Name] = n
			}
		}
		if len(back) > 0 {
			var still []string
			for _, name := range rec.Unreachable {
				n, ok := back[name]
				switch {
				case !ok:
					still = append(still, name)
				case n.Activity != "idle" && n.Activity != "drained":
					rec.Skipped = append(rec.Skipped, Skip{Node: name, Reason: fmt.Sprintf("reconnected %s: disruptive tests run only on idle or drained nodes", orUnknown(n.Activity))})
				case len(rec.Deferred) > 0:
					rec.Deferred = append(rec.Deferred, name)
				default:
					rec.Nodes = append(rec.Nodes, nodeInfo(n))
				}
			}
			rec.Unreachable = still
			sort.Slice(rec.Nodes, func(i, j int) bool { return rec.Nodes[i].Name < rec.Nodes[j].Name })
			rec.indexNodes()
			if err := e.cfg.Store.SaveSelection(ctx, *rec); err != nil {
				return fmt.Errorf("run sweep %s: %w", rec.ID, err)
			}
			log.Info().Int("back", len(back)).Int("unreachable", len(still)).Msg("agents reconnected: joining the sweep")
		}
		now := e.clock.Now()
		if len(rec.Unreachable) == 0 || !now.Before(deadline) {
			return nil
		}
		e.mu.Lock()
		prog.ID, prog.State, prog.Nodes = rec.ID, StateRunning, len(rec.Nodes)
		prog.Waiting = fmt.Sprintf("waiting up to %v after the start for %d agents to reconnect: %s", grace, len(rec.Unreachable), strings.Join(rec.Unreachable, ", "))
		e.mu.Unlock()
		if err := kit.Sleep(ctx, e.clock, min(reconnectPoll, deadline.Sub(now))); err != nil {
			return err
		}
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "with activity unknown"
	}
	return "busy"
}

func (e *Engine) fail(ctx context.Context, rec *Record, cause error) error {
	if err := e.cfg.Store.Finish(ctx, rec.ID, StateFailed, cause.Error(), nil, nil, e.clock.Now()); err != nil {
		return fmt.Errorf("sweep %s failed (%w), and recording it failed: %w", rec.ID, cause, err)
	}
	return fmt.Errorf("sweep %s failed: %w", rec.ID, cause)
}

// runWave runs the wave's pending tests, Spec.Concurrency at a time.
func (e *Engine) runWave(ctx context.Context, rec *Record, tests []TestRecord, idx []int, prog *Progress) error {
	workers := rec.Spec.Concurrency
	if workers <= 0 || workers > len(idx) {
		workers = len(idx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu   sync.Mutex
		next int
		errs []error
		wg   sync.WaitGroup
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next >= len(idx) {
			return 0, false
		}
		next++
		return idx[next-1], true
	}
	for range workers {
		wg.Add(1)
		kit.Go(e.clock, func() { // joined before it starts: time waits for it
			defer wg.Done()
			for {
				i, ok := take()
				if !ok {
					return
				}
				if err := e.runTest(ctx, rec, &tests[i], prog); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					cancel()
					return
				}
			}
		})
	}
	kit.Leave(e.clock) // this goroutine waits below, not on the clock
	wg.Wait()
	kit.Join(e.clock)
	// The first failure cancels the others; report it, not their
	// cancellations.
	for _, err := range errs {
		if !errors.Is(err, context.Canceled) {
			return err
		}
	}
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// runTest runs one test: recorded as started, run, recorded as finished.
// When ctx ends before the run returns the test stays "running" in the
// store, so a resumed sweep runs it again.
func (e *Engine) runTest(ctx context.Context, rec *Record, t *TestRecord, prog *Progress) error {
	away, err := e.awaitTurn(ctx, rec, t, prog)
	if err != nil {
		return err
	}
	if len(away) > 0 {
		return e.notRun(ctx, rec, t, prog, away)
	}
	t.State = TestRunning
	t.Attempts++
	t.Started, t.Ended = e.clock.Now(), time.Time{}
	t.Outcome, t.GBps, t.Baseline, t.Deviation, t.Band, t.Error, t.Lost, t.NotRun = "", 0, nil, 0, 0, "", nil, false
	if err := e.cfg.Store.SaveTest(ctx, rec.ID, *t); err != nil {
		return fmt.Errorf("sweep %s: record test %d started: %w", rec.ID, t.Seq, err)
	}
	opts := kit.RunOptions{Timeout: time.Duration(rec.Spec.TestTimeout)}
	var rep *report.Report
	if len(t.Nodes) == 1 {
		rep, err = e.cfg.Fleet.RunChecks(ctx, t.Nodes[0], []string{checkAllReduce}, opts)
	} else {
		rep, err = e.cfg.Fleet.RunMulti(ctx, t.Nodes, checkAllReduce, opts)
	}
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	// A run that came back is kept even when the sweep is being stopped.
	wctx := context.WithoutCancel(ctx)
	e.read(wctx, rec, t, rep, err)
	t.State, t.Ended = TestDone, e.clock.Now()
	if err := e.cfg.Store.SaveTest(wctx, rec.ID, *t); err != nil {
		return fmt.Errorf("sweep %s: record test %d finished: %w", rec.ID, t.Seq, err)
	}
	ev := e.log.Debug()
	if t.Outcome != OutFine {
		ev = e.log.Info()
	}
	ev.Str("campaign", rec.ID).Str("node", strings.Join(t.Nodes, ",")).Int("test", t.Seq).
		Str("purpose", string(t.Purpose)).Str("outcome", string(t.Outcome)).Float64("gbps", t.GBps).
		Float64("deviation", t.Deviation).Str("error", t.Error).Msg("test finished")
	e.testDone(prog, t)
	return nil
}

// awaitTurn waits, when a test's turn comes, for the agents of its nodes
// to be connected, each up to the spec's connect grace from the moment it
// was first found away (decided afresh now, not from the listing the plan
// was made from). After a coordinator restart the agents reconnect with
// backoff: a resumed sweep must not run, and lose, its tests before they
// are back. It returns the nodes still away when the grace ran out.
func (e *Engine) awaitTurn(ctx context.Context, rec *Record, t *TestRecord, prog *Progress) ([]string, error) {
	grace := rec.Spec.connectGrace()
	defer e.setWaiting(prog, t, "")
	for {
		var away []string
		var since time.Time
		over := true
		now := e.clock.Now()
		for _, name := range t.Nodes {
			key := rec.ID + "/" + name
			n, ok, err := kit.LookupNode(ctx, e.cfg.Fleet, name)
			if err == nil && ok && n.Connected {
				e.waits.Done(key)
				continue
			}
			if err != nil && ctx.Err() != nil {
				return nil, ctx.Err()
			}
			s, o := e.waits.Wait(key, now, grace)
			away = append(away, name)
			if since.IsZero() || s.Before(since) {
				since = s
			}
			over = over && o
		}
		if len(away) == 0 {
			return nil, nil
		}
		if over {
			for _, name := range away {
				e.waits.Done(rec.ID + "/" + name)
			}
			return away, nil
		}
		e.setWaiting(prog, t, fmt.Sprintf("test %d (%s): %s", t.Seq, strings.Join(away, ", "), kit.WaitingNote(since, grace)))
		if err := kit.Sleep(ctx, e.clock, min(reconnectPoll, since.Add(grace).Sub(now))); err != nil {
			return nil, err
		}
	}
}

// setWaiting shows (or, with "", clears) the wait of test t in the live
// progress.
func (e *Engine) setWaiting(prog *Progress, t *TestRecord, note string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	prefix := fmt.Sprintf("test %d ", t.Seq)
	if note == "" {
		if strings.HasPrefix(prog.Waiting, prefix) {
			prog.Waiting = ""
		}
		return
	}
	prog.Waiting = note
}

// notRun records a test whose nodes did not come back within the grace:
// it was not run, and its away nodes are lost (unreachable, never passed).
func (e *Engine) notRun(ctx context.Context, rec *Record, t *TestRecord, prog *Progress, away []string) error {
	now := e.clock.Now()
	t.State, t.Ended, t.NotRun = TestDone, now, true
	t.Outcome, t.GBps, t.Baseline, t.Deviation, t.Band, t.Lost = OutUnreachable, 0, nil, 0, 0, away
	t.Error = kit.GaveUpNote(rec.Spec.connectGrace()) + " for test " + fmt.Sprint(t.Seq) + "; not run"
	if err := e.cfg.Store.SaveTest(context.WithoutCancel(ctx), rec.ID, *t); err != nil {
		return fmt.Errorf("sweep %s: record test %d not run: %w", rec.ID, t.Seq, err)
	}
	e.log.Info().Str("campaign", rec.ID).Str("node", strings.Join(away, ",")).Int("test", t.Seq).
		Str("outcome", string(t.Outcome)).Str("error", t.Error).Msg("test not run: agents not connected")
	e.testDone(prog, t)
	return nil
}

// read fills a finished test's result from the fleet's answer.
func (e *Engine) read(ctx context.Context, rec *Record, t *TestRecord, rep *report.Report, runErr error) {
	if runErr != nil {
		t.Error = runErr.Error()
		switch {
		case errors.Is(runErr, kit.ErrUnreachable):
			t.Outcome, t.Lost = OutUnreachable, e.whoIsGone(ctx, t.Nodes, false)
		case errors.Is(runErr, kit.ErrRefused):
			t.Outcome, t.Lost = OutRefused, e.whoIsGone(ctx, t.Nodes, true)
		default:
			t.Outcome = OutError
		}
		if t.Outcome != OutError && len(t.Lost) == 0 {
			if len(t.Nodes) == 1 {
				t.Lost = slices.Clone(t.Nodes)
			} else {
				t.Outcome = OutError
				t.Error += " (could not tell which node)"
			}
		}
		return
	}
	v, why := busBW(rep)
	if why != "" {
		t.Outcome, t.Error = OutError, why
		return
	}
	t.GBps = v
	infos := make([]NodeInfo, len(t.Nodes))
	for i, n := range t.Nodes {
		infos[i] = rec.nodeInfo(n)
	}
	var res baselines.Resolution
	var err error
	if len(infos) == 1 {
		res, err = e.cfg.Baselines.Single(ctx, infos[0])
	} else {
		res, err = e.cfg.Baselines.Pair(ctx, infos[0], infos[1])
	}
	if err != nil {
		t.Outcome, t.Error = OutError, "baseline: "+err.Error()
		return
	}
	j := judge(res, v, infos[0].Stack, rec.Spec)
	t.Outcome, t.Baseline, t.Deviation = j.outcome, j.ref, j.deviation
	if j.ref != nil {
		t.Band = j.ref.Noise
	}
	if j.outcome == OutError || j.outcome == OutNoBaseline {
		t.Error = j.reason
	}
}

// busBW reads the all_reduce bus bandwidth from a report, or says why not.
func busBW(rep *report.Report) (float64, string) {
	if rep == nil {
		return 0, "no report"
	}
	c := rep.Check(checkAllReduce)
	if c == nil {
		return 0, "the report has no " + checkAllReduce + " result"
	}
	for _, f := range c.Findings {
		if f.Code == codeDataCorruption {
			return 0, "all_reduce returned wrong data: " + f.Message
		}
	}
	v, ok := c.Metrics[baselines.MetricAllReduceBusBW]
	if !ok || c.Status == report.Error || c.Status == report.Skip {
		why := c.Reason
		if why == "" && len(c.Findings) > 0 {
			why = c.Findings[0].Message
		}
		if why == "" {
			why = "no " + baselines.MetricAllReduceBusBW
		}
		return 0, fmt.Sprintf("%s %s: %s", checkAllReduce, c.Status, why)
	}
	return v, ""
}

// whoIsGone asks the fleet which of the nodes is disconnected (or busy,
// when busy is set).
func (e *Engine) whoIsGone(ctx context.Context, nodes []string, busy bool) []string {
	list, err := e.cfg.Fleet.Nodes(ctx, "name in ("+strings.Join(nodes, ",")+")")
	if err != nil {
		// A name the selector grammar cannot hold: look through all.
		if list, err = e.cfg.Fleet.Nodes(ctx, ""); err != nil {
			return nil
		}
	}
	state := map[string]kit.Node{}
	for _, n := range list {
		state[n.Name] = n
	}
	var out []string
	for _, n := range nodes {
		s, ok := state[n]
		switch {
		case !busy && (!ok || !s.Connected):
			out = append(out, n)
		case busy && ok && s.Connected && s.Activity != "idle" && s.Activity != "drained":
			out = append(out, n)
		}
	}
	return out
}

// indexNodes builds the name index nodeInfo uses; call it before workers
// share the record.
func (r *Record) indexNodes() {
	r.index = make(map[string]int, len(r.Nodes))
	for i, n := range r.Nodes {
		r.index[n.Name] = i
	}
}

func (r *Record) nodeInfo(name string) NodeInfo {
	if i, ok := r.index[name]; ok {
		return r.Nodes[i]
	}
	for _, n := range r.Nodes {
		if n.Name == name {
			return n
		}
	}
	return NodeInfo{Name: name}
}

// finish calls the verdicts, asks for drains, records coverage and the
// report.
func (e *Engine) finish(ctx context.Context, rec *Record, tests []TestRecord, a *analysis) (*Report, error) {
	verdicts, passed, skipped := buildVerdicts(rec, a)
	drains, err := e.drain(ctx, rec, verdicts)
	if err != nil {
		return nil, err
	}
	now := e.clock.Now()
	var covered []string
	measured := map[string]bool{}
	for i := range tests {
		t := &tests[i]
		if t.State == TestDone && t.GBps > 0 {
			for _, n := range t.Nodes {
				measured[n] = true
			}
		}
	}
	for _, n := range rec.Nodes {
		if measured[n.Name] && a.lost[n.Name] == nil {
			covered = append(covered, n.Name)
		}
	}
	last, err := e.cfg.Store.Coverage(ctx)
	if err != nil {
		return nil, fmt.Errorf("finish sweep %s: %w", rec.ID, err)
	}
	for _, n := range covered {
		last[n] = now
	}
	rep := buildReport(rec, tests, verdicts, passed, skipped, drains, now)
	rep.State = StateDone
	rep.Incomplete = incomplete(rec, rep, covered)
	rep.Coverage = finishCoverage(rec.Coverage, rec.selected(), last, now)
	if err := e.cfg.Store.Finish(ctx, rec.ID, StateDone, "", rep, covered, now); err != nil {
		return nil, fmt.Errorf("finish sweep %s: %w", rec.ID, err)
	}
	e.log.Info().Str("campaign", rec.ID).Int("verdicts", len(rep.Verdicts)).Int("passed", len(rep.Passed)).
		Str("incomplete", rep.Incomplete).Int("rounds", rep.RoundCount).Int("allreduce_runs", rep.AllReduceRuns).Float64("duration_s", rep.DurationS).
		Msg("sweep done")
	return rep, nil
}

// incomplete says why a finished sweep could not test its nodes, or ""
// when it measured at least one: a sweep with nothing measured ends done
// but must not read as a healthy fleet.
func incomplete(rec *Record, rep *Report, covered []string) string {
	sel := len(rec.selected())
	if len(covered) > 0 || sel == 0 {
		return ""
	}
	parts := []string{}
	if n := rep.Counts[Unreachable]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d unreachable (agents not connected; waited up to %v)", n, rec.Spec.connectGrace()))
	}
	if n := len(rep.Skipped); n > 0 {
		parts = append(parts, fmt.Sprintf("%d skipped", n))
	}
	if n := len(rec.Deferred); n > 0 {
		parts = append(parts, fmt.Sprintf("%d deferred", n))
	}
	if n := rep.Counts[Inconclusive]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d inconclusive", n))
	}
	why := ""
	if len(parts) > 0 {
		why = ": " + strings.Join(parts, ", ")
	}
	return fmt.Sprintf("could not test: no all_reduce measured on any of the %d selected nodes%s", sel, why)
}

// selected is every node the selector matched when the sweep started.
func (r *Record) selected() []string {
	out := make([]string, 0, len(r.Nodes)+len(r.Unreachable)+len(r.Skipped)+len(r.Deferred))
	for _, n := range r.Nodes {
		out = append(out, n.Name)
	}
	out = append(out, r.Unreachable...)
	for _, s := range r.Skipped {
		out = append(out, s.Node)
	}
	return append(out, r.Deferred...)
}

// drain asks the Drainer to take slow nodes out of service, each request
// recorded before it is made and allowed by the circuit breaker first.
func (e *Engine) drain(ctx context.Context, rec *Record, verdicts []Verdict) ([]DrainRecord, error) {
	if !rec.Spec.Drain {
		return nil, nil
	}
	prev, err := e.cfg.Store.Drains(ctx, rec.ID)
	if err != nil {
		return nil, fmt.Errorf("sweep %s drains: %w", rec.ID, err)
	}
	done := map[string]DrainRecord{}
	for _, d := range prev {
		if d.State != DrainPlanned {
			done[d.Node] = d
		}
	}
	fleetSize := -1
	var out []DrainRecord
	for i := range verdicts {
		v := &verdicts[i]
		if v.SubjectKind != SubjectNode || (v.Verdict != GPUSide && v.Verdict != NetworkSide) {
			continue
		}
		d, ok := done[v.Subject]
		if !ok {
			d = DrainRecord{Node: v.Subject, State: DrainPlanned, At: e.clock.Now(),
				Reason: drain.Reason(fmt.Sprintf("%s %s: all_reduce %s below baseline", rec.ID, v.Verdict, pctText(v.Deviation)))}
			if err := e.cfg.Store.SaveDrain(ctx, rec.ID, d); err != nil {
				return nil, fmt.Errorf("sweep %s: record drain of %s: %w", rec.ID, v.Subject, err)
			}
			if fleetSize < 0 && e.cfg.Breaker != nil {
				all, err := e.cfg.Fleet.Nodes(ctx, "")
				if err != nil {
					return nil, fmt.Errorf("sweep %s: fleet size for the drain breaker: %w", rec.ID, err)
				}
				fleetSize = len(all)
			}
			if err := e.cfg.Breaker.Allow(rec.ID, d.Node, fleetSize); err != nil {
				d.State, d.Error = DrainRefused, err.Error()
			} else if e.cfg.Drainer == nil {
				e.cfg.Breaker.Release(rec.ID, d.Node)
				d.State, d.Error = DrainSkipped, "no drain adapter configured"
			} else if err := e.cfg.Drainer.Drain(ctx, d.Node, d.Reason); err != nil {
				e.cfg.Breaker.Release(rec.ID, d.Node)
				d.State, d.Error = DrainFailed, err.Error()
			} else {
				d.State = DrainDone
			}
			d.At = e.clock.Now()
			if err := e.cfg.Store.SaveDrain(ctx, rec.ID, d); err != nil {
				return nil, fmt.Errorf("sweep %s: record drain of %s: %w", rec.ID, v.Subject, err)
			}
			e.log.Info().Str("campaign", rec.ID).Str("node", d.Node).Str("state", string(d.State)).Str("error", d.Error).Msg("drain")
		}
		st := d.State
		v.Drain = &st
		out = append(out, d)
	}
	return out, nil
}

// BreakerRecords lists the drains sweeps made at or after since, for
// kit.Breaker.Restore when the coordinator starts.
func (e *Engine) BreakerRecords(ctx context.Context, since time.Time) ([]kit.DrainRecord, error) {
	recs, err := e.cfg.Store.Sweeps(ctx)
	if err != nil {
		return nil, fmt.Errorf("sweep drain records: %w", err)
	}
	var out []kit.DrainRecord
	for _, r := range recs {
		if !r.Ended.IsZero() && r.Ended.Before(since) {
			continue
		}
		ds, err := e.cfg.Store.Drains(ctx, r.ID)
		if err != nil {
			return nil, fmt.Errorf("sweep drain records: %w", err)
		}
		for _, d := range ds {
			if d.State == DrainDone && !d.At.Before(since) {
				out = append(out, kit.DrainRecord{Node: d.Node, Campaign: r.ID, At: d.At})
			}
		}
	}
	return out, nil
}

// buildReport assembles the report from the stored tests and the verdicts.
func buildReport(rec *Record, tests []TestRecord, verdicts []Verdict, passed []string, skipped []Skip, drains []DrainRecord, now time.Time) *Report {
	rep := &Report{
		ID: rec.ID, Spec: rec.Spec, State: rec.State, Error: rec.Error,
		Started: rec.Started, Ended: now, DurationS: now.Sub(rec.Started).Seconds(),
		Tested: len(rec.Nodes), Passed: passed, Verdicts: verdicts, Counts: map[Kind]int{},
		Skipped: append(slices.Clone(rec.Skipped), skipped...), Coverage: rec.Coverage, Drains: drains,
	}
	if rep.Passed == nil {
		rep.Passed = []string{}
	}
	if rep.Verdicts == nil {
		rep.Verdicts = []Verdict{}
	}
	if rep.Skipped == nil {
		rep.Skipped = []Skip{}
	}
	byPhase := map[Phase]*RoundSummary{}
	for i := range tests {
		t := &tests[i]
		rep.AllReduceRuns += t.Attempts
		if len(t.Nodes) == 1 {
			rep.SingleRuns += t.Attempts
		} else {
			rep.PairRuns += t.Attempts
		}
		r := byPhase[t.Phase]
		if r == nil {
			r = &RoundSummary{Round: t.Phase.Round(), Phase: t.Phase}
			byPhase[t.Phase] = r
		}
		r.Tests++
		r.Waves = max(r.Waves, t.Wave+1)
		if !t.Started.IsZero() && (r.Started.IsZero() || t.Started.Before(r.Started)) {
			r.Started = t.Started
		}
		if t.Ended.After(r.Ended) {
			r.Ended = t.Ended
		}
	}
	for _, r := range byPhase {
		if !r.Ended.IsZero() {
			r.DurationS = r.Ended.Sub(r.Started).Seconds()
		}
		rep.Rounds = append(rep.Rounds, *r)
		rep.RepeatWaves += r.Waves - 1
	}
	sort.Slice(rep.Rounds, func(i, j int) bool { return rep.Rounds[i].Round < rep.Rounds[j].Round })
	rep.RoundCount = len(rep.Rounds)
	for _, v := range verdicts {
		rep.Counts[v.Verdict]++
	}
	sort.SliceStable(rep.Verdicts, func(i, j int) bool {
		if rank(rep.Verdicts[i].Verdict) != rank(rep.Verdicts[j].Verdict) {
			return rank(rep.Verdicts[i].Verdict) > rank(rep.Verdicts[j].Verdict)
		}
		if rep.Verdicts[i].Verdict != rep.Verdicts[j].Verdict {
			return rep.Verdicts[i].Verdict < rep.Verdicts[j].Verdict
		}
		return rep.Verdicts[i].Subject < rep.Verdicts[j].Subject
	})
	return rep
}

// Report returns a finished sweep's report, or for a running one the
// verdicts so far with its progress.
func (e *Engine) Report(ctx context.Context, id string) (*Report, error) {
	rec, err := e.cfg.Store.Sweep(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.Report != nil {
		return rec.Report, nil
	}
	tests, err := e.cfg.Store.Tests(ctx, id)
	if err != nil {
		return nil, err
	}
	rec.Spec = rec.Spec.WithDefaults()
	a := analyse(&rec, tests)
	verdicts, passed, skipped := buildVerdicts(&rec, a)
	drains, err := e.cfg.Store.Drains(ctx, id)
	if err != nil {
		return nil, err
	}
	rep := buildReport(&rec, tests, verdicts, passed, skipped, drains, e.clock.Now())
	if rec.State == StateRunning {
		rep.Ended = time.Time{}
	}
	p := progressOf(&rec, tests)
	rep.Progress = &p
	return rep, nil
}

// Status is a sweep's progress, from the store.
func (e *Engine) Status(ctx context.Context, id string) (Progress, error) {
	rec, err := e.cfg.Store.Sweep(ctx, id)
	if err != nil {
		return Progress{}, err
	}
	tests, err := e.cfg.Store.Tests(ctx, id)
	if err != nil {
		return Progress{}, err
	}
	p := progressOf(&rec, tests)
	if rec.Report != nil {
		p.Incomplete = rec.Report.Incomplete
	}
	return p, nil
}

// Summary is one line of a sweep listing.
type Summary struct {
	ID       string       `json:"id"`
	State    State        `json:"state"`
	Phase    Phase        `json:"phase"`
	Selector string       `json:"selector"`
	Nodes    int          `json:"nodes"`
	Created  time.Time    `json:"created"`
	Ended    time.Time    `json:"ended,omitzero"`
	Counts   map[Kind]int `json:"counts,omitempty"`
	Error    string       `json:"error,omitempty"`
	// Incomplete: the sweep ended done without measuring any node (why).
	Incomplete string `json:"incomplete,omitempty"`
}

// List summarises stored sweeps, newest first.
func (e *Engine) List(ctx context.Context) ([]Summary, error) {
	recs, err := e.cfg.Store.Sweeps(ctx)
	if err != nil {
		return nil, fmt.Errorf("list sweeps: %w", err)
	}
	out := make([]Summary, len(recs))
	for i, r := range recs {
		out[i] = Summary{ID: r.ID, State: r.State, Phase: r.Phase, Selector: r.Spec.Selector,
			Nodes: len(r.Nodes), Created: r.Created, Ended: r.Ended, Error: r.Error}
		if full, err := e.cfg.Store.Sweep(ctx, r.ID); err == nil && full.Report != nil {
			out[i].Counts, out[i].Incomplete = full.Report.Counts, full.Report.Incomplete
		}
	}
	return out, nil
}

func progressOf(rec *Record, tests []TestRecord) Progress {
	p := Progress{ID: rec.ID, State: rec.State, Phase: rec.Phase, Round: rec.Phase.Round(), Wave: rec.Wave, Nodes: len(rec.Nodes)}
	for i := range tests {
		p.count(&tests[i], rec)
		if rec.Phase.Round() == 0 { // done: the last round it ran, not 0
			p.Round = max(p.Round, tests[i].Phase.Round())
		}
	}
	return p
}

func (p *Progress) count(t *TestRecord, rec *Record) {
	done := t.State == TestDone
	if len(t.Nodes) == 1 {
		p.SinglesAll++
		if done {
			p.Singles++
		}
	} else {
		p.PairsAll++
		if done {
			p.Pairs++
		}
	}
	if t.Phase == rec.Phase && t.Wave == rec.Wave {
		p.WaveTotal++
		if done {
			p.WaveDone++
		}
	}
}

func (e *Engine) setProgress(prog *Progress, rec *Record, tests []TestRecord) {
	p := progressOf(rec, tests)
	e.mu.Lock()
	*prog = p
	e.mu.Unlock()
	e.notify(p)
}

func (e *Engine) testDone(prog *Progress, t *TestRecord) {
	e.mu.Lock()
	prog.WaveDone++
	if len(t.Nodes) == 1 {
		prog.Singles++
	} else {
		prog.Pairs++
	}
	p := *prog
	e.mu.Unlock()
	e.notify(p)
}

func (e *Engine) notify(p Progress) {
	if e.cfg.OnProgress == nil {
		return
	}
	e.progress.Lock()
	defer e.progress.Unlock()
	e.cfg.OnProgress(p)
}

// Live returns the progress of a sweep this engine is running now.
func (e *Engine) Live(id string) (Progress, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.running[id]
	if !ok {
		return Progress{}, false
	}
	return *p, true
}
