// Package rollout is the rolling driver-upgrade gate: a canary, then waves,
// with an automatic halt.
//
// Plan checks every selected node's inventory against the compatibility
// matrix for the TARGET versions and lays the eligible nodes out in waves.
// The Engine then moves each node through a durable state machine:
//
//	pending → drain-required → draining → upgrade-required → upgrading →
//	rebooting → validating → undrain-required → done
//
// or failed (stays drained, with the reason) or skipped. Every transition
// is written to the rollout_ tables before it is acted on, in one
// transaction per step, so a coordinator restarted at any point continues:
// a node found "upgrading" is re-checked (does the agent report the target
// driver?) rather than upgraded again; maxUnavailable slots are derived
// from the stored states, so none leaks; and only nodes whose drain reason
// carries this rollout's tag are ever returned to service.
//
// After each wave the gate counts failures against the wave's budget:
// over it, the rollout halts with the evidence. An inconclusive inspection
// (missing data, NaN, a timeout) pauses the rollout for a human; it never
// passes. Operators Pause, Resume, Approve (after the canary), Abort and
// Rollback.
package rollout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/compat"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/selector"
)

// Errors, tested with errors.Is.
var (
	ErrNotFound = errors.New("no such rollout")
	// ErrState: the operation does not apply in the rollout's current phase.
	ErrState = errors.New("not possible in this state")
	// ErrConflict: a node is already in another unfinished rollout.
	ErrConflict = errors.New("node already in an unfinished rollout")
	// ErrNothingToDo: the plan has no node to upgrade.
	ErrNothingToDo = errors.New("no node to upgrade")
)

// DefaultPollInterval is how often a waiting node is looked at again.
const DefaultPollInterval = 15 * time.Second

// probeTimeout bounds the inventory probe made while a node reboots.
const probeTimeout = 2 * time.Minute

// Options are the rollout engine's own knobs; zero values take defaults.
type Options struct {
	// Baselines, when set, give validation a node's pre-upgrade baseline
	// (node scope, SKU fallback) instead of measuring it.
	Baselines baselines.Finder
	// Poll is how often draining and rebooting nodes are looked at,
	// transient errors retried and the fleet listed (default 15s).
	Poll time.Duration
}

// Engine drives rollouts. Its methods are safe for concurrent use: the
// coordinator calls the operator methods from its API handlers while Run
// steps the rollouts.
type Engine struct {
	st      *store
	fleet   kit.Fleet
	drainer drain.Adapter
	breaker *kit.Breaker
	busy    *kit.Busy
	clock   kit.Clock
	// virtual: the clock moves only when every goroutine taking part is
	// blocked on it (kit.Virtual). The engine counts its loop and its
	// operations as taking part, so simulated time never runs ahead of a
	// result the engine has not looked at yet.
	virtual bool
	log     zerolog.Logger
	finder  baselines.Finder
	poll    time.Duration

	mu      sync.Mutex
	runs    []*run
	byID    map[string]*run
	pending []event   // events written with the next save
	launch  []func()  // operations started once the next save commits
	seq     uint64    // operation numbers
	view    fleetView // the fleet as last listed
	ops     sync.WaitGroup

	resMu   sync.Mutex
	results []opResult
	kick    chan struct{}

	// counters for benchmarks, under mu
	steps, saves, started int

	// afterSave, when set (tests), runs after a save commits and before
	// its operations start: returning true drops them, as a coordinator
	// killed right after the write would.
	afterSave func() bool
}

// New creates or upgrades the rollout tables, loads every rollout, and
// returns an engine that has started nothing yet: call Run (or Step). The
// drainer is how nodes leave and rejoin service; the engine registers its
// unfinished rollouts' nodes in d.Busy.
func New(ctx context.Context, d kit.Deps, opts Options) (*Engine, error) {
	d, err := d.Check("rollout engine")
	if err != nil {
		return nil, err
	}
	e := &Engine{
		fleet: d.Fleet, drainer: d.Drainer, breaker: d.Breaker, busy: d.Busy, clock: d.Clock,
		log: d.Logger, poll: DefaultPollInterval, byID: map[string]*run{}, finder: opts.Baselines,
		kick: make(chan struct{}, 1),
	}
	if opts.Poll > 0 {
		e.poll = opts.Poll
	}
	e.virtual = kit.Virtual(e.clock)
	st, err := openStore(ctx, d.DB, e.clock.Now())
	if err != nil {
		return nil, err
	}
	e.st = st
	if err := e.reload(ctx); err != nil {
		return nil, err
	}
	e.busy.Register("rollout", e.busyNodes)
	return e, nil
}

// busyNodes lists the nodes of unfinished rollouts, for kit.Busy.
func (e *Engine) busyNodes(context.Context) (map[string]string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	busy := map[string]string{}
	for _, r := range e.runs {
		if r.Phase.final() {
			continue
		}
		for _, nr := range r.nodes {
			busy[nr.Name] = "rollout " + r.ID
		}
	}
	return busy, nil
}

// reload replaces the in-memory rollouts with the stored ones: at start,
// and after a failed save (memory may then be ahead of the store).
// Operations still in flight report to node records that no longer exist
// and are dropped.
func (e *Engine) reload(ctx context.Context) error {
	runs, err := e.st.load(ctx)
	if err != nil {
		return err
	}
	e.runs, e.byID, e.pending, e.launch = runs, map[string]*run{}, nil, nil
	var recs []kit.DrainRecord
	for _, r := range runs {
		e.byID[r.ID] = r
		for _, n := range r.nodes {
			if !n.DrainedAt.IsZero() {
				recs = append(recs, kit.DrainRecord{Node: n.Name, Campaign: r.tag(), At: n.DrainedAt})
			}
		}
	}
	// The breaker's window survives a restart through the drains stored here.
	e.breaker.Restore(recs)
	return nil
}

// Reload replaces the rollouts in memory with the stored ones, for an
// engine that serves reads while another process runs the rollouts (a
// follower of several coordinators): its Status and List are then as
// current as the store. Never call it on an engine whose Run is running:
// writes and operations not yet saved would be dropped.
func (e *Engine) Reload(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reload(ctx)
}

// join and leave count a goroutine in or out of a virtual clock.
func (e *Engine) join() {
	if e.virtual {
		kit.Join(e.clock)
	}
}

func (e *Engine) leave() {
	if e.virtual {
		kit.Leave(e.clock)
	}
}

func (e *Engine) wake() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// Start plans the spec against the fleet and the matrix and starts the
// rollout. It returns the new rollout's id.
func (e *Engine) Start(ctx context.Context, spec *Spec, matrix *compat.Matrix) (string, error) {
	p, err := Plan(ctx, spec, e.fleet, matrix)
	if err != nil {
		return "", err
	}
	n := 0
	for _, w := range p.Waves {
		n += len(w.Nodes)
	}
	if n == 0 {
		return "", fmt.Errorf("start rollout: %w: %d selected, %d excluded", ErrNothingToDo, p.Selected, len(p.Excluded))
	}
	var id string
	err = e.busy.Claim(ctx, func(busy map[string]string) error {
		for _, w := range p.Waves {
			for _, pn := range w.Nodes {
				if who, ok := busy[pn.Name]; ok {
					return fmt.Errorf("start rollout: %w: %s is in %s", ErrConflict, pn.Name, who)
				}
			}
		}
		var err error
		id, err = e.create(ctx, spec, p, n)
		return err
	})
	if err != nil {
		return "", err
	}
	e.wake()
	return id, nil
}

// create writes a new rollout and takes it into memory.
func (e *Engine) create(ctx context.Context, spec *Spec, p *PlanResult, n int) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.clock.Now()
	r := &run{
		ID: newID(spec.Name, now), Spec: spec, Plan: p, Phase: PhaseRunning,
		Created: now, Updated: now, byName: map[string]*nodeRec{},
	}
	seq := 0
	for _, w := range p.Waves {
		for _, pn := range w.Nodes {
			nr := &nodeRec{Name: pn.Name, Wave: w.Index, Seq: seq, State: Pending, Since: now, Op: opUpgrade, FromDriver: pn.Driver}
			seq++
			r.nodes = append(r.nodes, nr)
			r.byName[nr.Name] = nr
		}
	}
	evs := []event{{Rollout: r.ID, Time: now, Kind: evPhase, Message: fmt.Sprintf(
		"started: driver %s on %d nodes in %d waves (%d excluded), max unavailable %s",
		spec.Target.Driver, n, len(p.Waves), len(p.Excluded), spec.MaxUnavailable)}}
	for _, ex := range p.Excluded {
		evs = append(evs, event{Rollout: r.ID, Time: now, Node: ex.Node, Kind: evPhase, Message: "excluded (" + ex.Kind + "): " + ex.Reason})
	}
	for _, w := range p.Waves {
		for _, pn := range w.Nodes {
			if pn.Disconnected {
				evs = append(evs, event{Rollout: r.ID, Time: now, Node: pn.Name, Kind: evPhase, Message: "planned: " + pn.Note})
			}
		}
	}
	if err := e.st.create(ctx, r, evs); err != nil {
		return "", err
	}
	e.runs = append(e.runs, r)
	e.byID[r.ID] = r
	e.log.Info().Str("campaign", r.ID).Str("driver", spec.Target.Driver).Int("nodes", n).Int("waves", len(p.Waves)).
		Int("excluded", len(p.Excluded)).Msg("rollout started")
	return r.ID, nil
}

// newID derives a readable, unique id from the name and the start time.
func newID(name string, now time.Time) string {
	if name == "" {
		name = "rollout"
	}
	return kit.NewID(name, now)
}

// Run steps the rollouts until ctx ends: at once when an operation
// finishes or an operator acts, else when the next node is due.
func (e *Engine) Run(ctx context.Context) error {
	e.join() // the loop's own share of a virtual clock
	wakeCh := make(chan struct{}, 16)
	for {
		if err := e.Step(ctx); err != nil && ctx.Err() == nil {
			e.log.Error().Err(err).Msg("rollout step")
		}
		if ctx.Err() != nil {
			e.leave()
			return ctx.Err()
		}
		wait := e.nextWake()
		var timer <-chan time.Time
		stop := func() {}
		if e.virtual {
			// A sleeping helper stands for the loop on the virtual clock:
			// time moves to the next due node unless a result comes first.
			hctx, cancel := context.WithCancel(ctx)
			stop = cancel
			e.join()
			go func() {
				if err := kit.Sleep(hctx, e.clock, wait); err != nil {
					e.leave()
					return
				}
				wakeCh <- struct{}{} // its share passes to the loop
			}()
		} else {
			timer = e.clock.After(wait)
		}
		e.leave()
		helperShare := false
		select {
		case <-ctx.Done():
		case <-e.kick:
		case <-timer:
		case <-wakeCh:
			helperShare = true
		}
		// Join before giving back the helper's share: in between, nobody
		// would hold the virtual clock and time could run past this wake.
		e.join()
		if helperShare {
			e.leave()
		}
		stop()
		for drained := false; !drained; {
			select {
			case <-wakeCh:
				e.leave()
			default:
				drained = true
			}
		}
	}
}

// nextWake is how long the loop may sleep: until the next due poll,
// deadline or soak end, at most the poll interval.
func (e *Engine) nextWake() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.clock.Now()
	next := now.Add(e.poll)
	consider := func(t time.Time) {
		if !t.IsZero() && t.Before(next) {
			next = t
		}
	}
	for _, r := range e.runs {
		if r.Phase.final() || r.Paused {
			continue
		}
		if r.Phase == PhaseSoaking {
			consider(r.SoakUntil)
		}
		for _, n := range r.nodes {
			if n.State == Pending && !n.waitSince.IsZero() {
				consider(n.waitSince.Add(r.Spec.connectGrace()))
			}
			if !n.State.active() || n.busy || n.Hold != "" {
				continue
			}
			consider(n.nextTry)
			consider(n.Deadline)
		}
	}
	if d := next.Sub(now); d > 0 {
		return d
	}
	return time.Millisecond
}

// Step applies finished operations, advances every rollout once, writes
// the transitions and then starts the operations they call for.
func (e *Engine) Step(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.steps++
	now := e.clock.Now()
	e.applyResults(now)
	for _, r := range e.runs {
		e.advance(ctx, r, now)
	}
	return e.commit(ctx)
}

// commit saves what changed, then starts the operations decided on it.
// A failed save reloads the stored state and starts nothing.
func (e *Engine) commit(ctx context.Context) error {
	dirty := false
	for _, r := range e.runs {
		if r.dirty {
			dirty = true
			break
		}
		for _, n := range r.nodes {
			if n.dirty {
				dirty = true
				break
			}
		}
	}
	launch := e.launch
	e.launch = nil
	if dirty || len(e.pending) > 0 {
		if err := e.st.save(ctx, e.runs, e.pending); err != nil {
			// Nothing decided in this step happened: forget it and read
			// back what the store holds.
			e.ops.Add(-len(launch))
			for range launch {
				e.leave()
			}
			if rerr := e.reload(context.WithoutCancel(ctx)); rerr != nil {
				return errors.Join(err, rerr)
			}
			return err
		}
		e.pending = nil
		e.saves++
		for _, r := range e.runs {
			r.dirty = false
			for _, n := range r.nodes {
				n.dirty = false
			}
		}
	}
	if e.afterSave != nil && e.afterSave() {
		e.ops.Add(-len(launch))
		for range launch {
			e.leave()
		}
		return nil
	}
	for _, f := range launch {
		go f()
	}
	return nil
}

// opResult is a finished operation: apply runs under the engine's lock.
type opResult struct {
	run, node string
	seq       uint64
	apply     func(r *run, n *nodeRec, now time.Time)
}

// start queues an operation on a node; it begins once the step's
// transitions are saved. do runs without the lock and returns the change
// to make once it is done.
func (e *Engine) start(ctx context.Context, r *run, n *nodeRec, do func(ctx context.Context) func(r *run, n *nodeRec, now time.Time)) {
	e.seq++
	e.started++
	seq := e.seq
	n.busy, n.opSeq = true, seq
	id, name := r.ID, n.Name
	e.ops.Add(1)
	e.join() // the operation's share of a virtual clock, held until its result is applied
	e.launch = append(e.launch, func() {
		apply := do(ctx)
		e.resMu.Lock()
		e.results = append(e.results, opResult{run: id, node: name, seq: seq, apply: apply})
		e.resMu.Unlock()
		e.ops.Done()
		e.wake()
	})
}

// applyResults applies every finished operation whose node is still
// where the operation left it; results for a paused rollout wait.
func (e *Engine) applyResults(now time.Time) {
	e.resMu.Lock()
	res := e.results
	e.results = nil
	e.resMu.Unlock()
	for _, o := range res {
		e.leave()
		r := e.byID[o.run]
		if r == nil {
			continue
		}
		n := r.byName[o.node]
		if n == nil || !n.busy || n.opSeq != o.seq {
			continue // from before a reload
		}
		if r.Paused {
			r.parked = append(r.parked, o)
			continue
		}
		n.busy = false
		o.apply(r, n, now)
	}
}

// unpark applies results that arrived while the rollout was paused.
func (e *Engine) unpark(r *run, now time.Time) {
	parked := r.parked
	r.parked = nil
	for _, o := range parked {
		n := r.byName[o.node]
		if n == nil || !n.busy || n.opSeq != o.seq {
			continue
		}
		n.busy = false
		o.apply(r, n, now)
	}
}

// fleetView is the fleet as last listed: who is connected, with which
// driver, and who is out of service for any reason.
type fleetView struct {
	at    time.Time
	ok    bool
	err   string
	nodes map[string]nodeView
	// out are nodes out of service: drained (by anyone), down,
	// disconnected.
	out map[string]string
}

type nodeView struct {
	labels    map[string]string
	connected bool
	driver    string
	inv       report.Inventory
}

// listFleet lists the fleet now.
func (e *Engine) listFleet(ctx context.Context, now time.Time) {
	nodes, err := e.fleet.Nodes(ctx, "")
	v := fleetView{at: now, nodes: make(map[string]nodeView, len(nodes)), out: map[string]string{}}
	if err != nil {
		v.err = fmt.Sprintf("list nodes: %v", err)
		e.view = v
		return
	}
	for _, n := range nodes {
		v.nodes[n.Name] = viewOf(n)
		if why := outOfService(n); why != "" {
			v.out[n.Name] = why
		}
	}
	if l, ok := e.drainer.(drain.Lister); ok {
		un, err := l.Unavailable(ctx)
		if err != nil {
			v.err = fmt.Sprintf("list drained nodes: %v", err)
			e.view = v
			return
		}
		for name, st := range un {
			if _, seen := v.out[name]; !seen {
				v.out[name] = "drained: " + st.Reason
			}
		}
	}
	v.ok = true
	e.view = v
}

func viewOf(n kit.Node) nodeView {
	return nodeView{labels: n.Labels, connected: n.Connected, driver: n.Inventory.DriverVersion, inv: n.Inventory}
}

// outOfService says why the fleet has a node out of service ("" when it
// is in service).
func outOfService(n kit.Node) string {
	switch {
	case !n.Connected:
		return notConnected
	case n.State == "draining" || n.State == "drained" || n.State == "failed" || n.State == "unreachable":
		return "node " + n.State
	case n.Activity == "drained":
		return "drained (agent reports)"
	}
	return ""
}

const notConnected = "agent not connected"

// refreshNode asks the fleet about one node now and puts the answer in
// the view: an agent that reconnected since the last listing is judged
// by what it is now.
func (e *Engine) refreshNode(ctx context.Context, name string) (nodeView, bool) {
	cn, ok, err := kit.LookupNode(ctx, e.fleet, name)
	if err != nil || !ok {
		nv, known := e.view.nodes[name]
		return nv, known
	}
	nv := viewOf(cn)
	e.view.nodes[name] = nv
	why := outOfService(cn)
	switch {
	case why != "":
		e.view.out[name] = why
	case e.view.out[name] == notConnected || strings.HasPrefix(e.view.out[name], "node "):
		delete(e.view.out, name)
	}
	return nv, true
}

// transition moves a node and records the event; the store gets both with
// the step's save.
func (e *Engine) transition(r *run, n *nodeRec, to State, now time.Time, msg string) {
	from, oldDeadline := n.State, n.Deadline
	n.State, n.Since, n.dirty = to, now, true
	n.nextTry, n.lastErr = time.Time{}, ""
	n.Deadline = time.Time{}
	d := r.Spec.Deadlines
	switch to {
	case DrainRequired:
		n.Deadline = now.Add(d.Draining.D())
	case UpgradeRequired, Validating:
		n.Deadline = now.Add(d.Validating.D())
	case Upgrading:
		n.Deadline = now.Add(d.Upgrading.D())
	case Rebooting:
		n.Deadline = now.Add(d.Rebooting.D())
	case UndrainRequired:
		n.Deadline = now.Add(d.Undraining.D())
	case Draining:
		n.Deadline = oldDeadline // one deadline covers taking the node out and its work ending
	}
	if msg != "" {
		n.Reason = msg
	}
	e.pending = append(e.pending, event{Rollout: r.ID, Time: now, Node: n.Name, Kind: evTransition, From: from, To: to, Message: msg})
	ev := e.log.Info()
	if to == Failed {
		ev = e.log.Warn()
	}
	ev.Str("campaign", r.ID).Str("node", n.Name).Str("from", string(from)).Str("to", string(to)).Msg(strings.TrimSpace("rollout node " + msg))
}

// toUndrain sends a node back to service on the way to after.
func (e *Engine) toUndrain(r *run, n *nodeRec, after State, now time.Time, msg string) {
	n.After = after
	e.transition(r, n, UndrainRequired, now, msg)
}

func (e *Engine) phase(r *run, p Phase, now time.Time, msg string) {
	if r.Phase == p && msg == "" {
		return
	}
	r.Phase, r.Updated, r.dirty = p, now, true
	if p.final() {
		r.Finished = now
	}
	e.pending = append(e.pending, event{Rollout: r.ID, Time: now, Kind: evPhase, To: State(p), Message: msg})
	e.log.Info().Str("campaign", r.ID).Str("phase", string(p)).Msg(strings.TrimSpace("rollout " + msg))
}

// pause freezes a rollout with a reason (an inconclusive inspection, or
// the operator).
func (e *Engine) pause(r *run, now time.Time, reason string) {
	if r.Paused {
		return
	}
	r.Paused, r.PauseAt, r.PauseReason, r.Updated, r.dirty = true, now, reason, now, true
	e.pending = append(e.pending, event{Rollout: r.ID, Time: now, Kind: evPhase, Message: "paused: " + reason})
	e.log.Warn().Str("campaign", r.ID).Str("reason", reason).Msg("rollout paused")
}

// hold stops a node for a human and pauses its rollout.
func (e *Engine) hold(r *run, n *nodeRec, now time.Time, reason string) {
	n.Hold, n.dirty = reason, true
	e.pending = append(e.pending, event{Rollout: r.ID, Time: now, Node: n.Name, Kind: evTransition, From: n.State, To: n.State, Message: "inconclusive: " + reason})
	e.pause(r, now, fmt.Sprintf("inconclusive inspection on %s: %s", n.Name, reason))
}

// advance takes one rollout one step further. A phase change (a soak
// over, a wave passed) may let more happen at the same instant, so it goes
// round again, a few times at most.
func (e *Engine) advance(ctx context.Context, r *run, now time.Time) {
	r.blocked = ""
	for range 4 {
		if r.Phase.final() || r.Paused {
			return
		}
		phase, wave := r.Phase, r.Wave
		e.advanceOnce(ctx, r, now)
		if r.Phase == phase && r.Wave == wave {
			return
		}
	}
}

func (e *Engine) advanceOnce(ctx context.Context, r *run, now time.Time) {
	switch r.Phase {
	case PhaseSoaking:
		if !now.Before(r.SoakUntil) {
			r.SoakUntil, r.dirty = time.Time{}, true
			if r.Wave == 0 && r.Spec.Approval == ApprovalManual {
				e.phase(r, PhaseAwaitingApproval, now, "canary passed: waiting for approval")
			} else {
				e.nextWave(r, now)
			}
		}
	case PhaseRunning:
		// Nodes start before the others step, so a node taken out now gets
		// its first operation in this same step.
		e.startNodes(ctx, r, now, func(n *nodeRec) bool { return n.Wave == r.Wave && n.Op == opUpgrade })
	case PhaseRollingBack:
		e.startNodes(ctx, r, now, func(n *nodeRec) bool { return n.Op == opRollback })
	case PhaseAborting:
		for _, n := range r.nodes {
			if n.State == Pending {
				e.transition(r, n, Skipped, now, "aborted")
			}
		}
	}
	for _, n := range r.nodes {
		if n.busy || n.Hold != "" || !n.State.active() {
			continue
		}
		if r.Phase == PhaseAborting {
			switch n.State {
			case DrainRequired, Draining, UpgradeRequired:
				e.toUndrain(r, n, Skipped, now, "aborted before the upgrade")
				continue
			}
		}
		e.stepNode(ctx, r, n, now)
	}
	switch r.Phase {
	case PhaseRunning:
		e.gate(r, now)
	case PhaseAborting:
		busy := false
		for _, n := range r.nodes {
			busy = busy || n.State.active()
		}
		if !busy {
			e.phase(r, PhaseAborted, now, "aborted")
		}
	case PhaseRollingBack:
		busy := false
		for _, n := range r.nodes {
			busy = busy || (n.Op == opRollback && (n.State == Pending || n.State.active()))
		}
		if !busy {
			e.phase(r, PhaseRolledBack, now, "rolled back")
		}
	}
}

func (e *Engine) nextWave(r *run, now time.Time) {
	r.Wave, r.Accepted, r.dirty = r.Wave+1, 0, true
	e.phase(r, PhaseRunning, now, fmt.Sprintf("wave %d (%s) started", r.Wave, r.waveName(r.Wave)))
}

func (r *run) waveName(w int) string {
	if w < len(r.Plan.Waves) {
		return r.Plan.Waves[w].Name
	}
	return fmt.Sprintf("wave %d", w)
}

func (r *run) waveBudget(w int) int {
	if w < len(r.Plan.Waves) {
		return r.Plan.Waves[w].Budget
	}
	return 0
}

// waveFailures lists the wave's nodes that count against its budget:
// failed upgrades, and skipped nodes (not upgraded: the wave did not do
// its job on them, so it cannot pass as if it had).
func (r *run) waveFailures(w int) (failed []*nodeRec) {
	for _, n := range r.nodes {
		if n.Wave == w && n.Op == opUpgrade && (n.State == Failed || n.State == Skipped) {
			failed = append(failed, n)
		}
	}
	return failed
}

// shortfall describes failed and skipped nodes: "2 failed, 1 skipped".
func shortfall(nodes []*nodeRec) string {
	failed, skipped := 0, 0
	for _, n := range nodes {
		if n.State == Skipped {
			skipped++
		} else {
			failed++
		}
	}
	var parts []string
	if failed > 0 {
		parts = append(parts, fmt.Sprintf("%d failed", failed))
	}
	if skipped > 0 {
		parts = append(parts, fmt.Sprintf("%d skipped", skipped))
	}
	return strings.Join(parts, ", ")
}

// gate closes a wave once it settled: over its failure budget the
// rollout halts with the evidence; else it soaks, waits for approval or
// completes. A wave over budget starts no further node and halts as soon
// as its in-flight nodes settle.
func (e *Engine) gate(r *run, now time.Time) {
	failed := r.waveFailures(r.Wave)
	over := len(failed)-r.Accepted > r.waveBudget(r.Wave)
	for _, n := range r.nodes {
		if n.Wave != r.Wave || n.Op != opUpgrade {
			continue
		}
		if n.State.active() || (n.State == Pending && !over) {
			return
		}
	}
	if r.Wave == 0 && !over && e.promoteCanary(r, now) {
		return
	}
	if over {
		r.HaltReason = fmt.Sprintf("%s: %s, budget %d", r.waveName(r.Wave), shortfall(failed), r.waveBudget(r.Wave))
		if r.Accepted > 0 {
			r.HaltReason += fmt.Sprintf(" (%d accepted by an operator)", r.Accepted)
		}
		r.Evidence = r.Evidence[:0]
		for _, n := range failed {
			line := n.Name + " " + string(n.State) + ": " + n.Reason
			if len(n.Evidence) > 0 {
				line += " [" + strings.Join(n.Evidence, "; ") + "]"
			}
			r.Evidence = append(r.Evidence, line)
		}
		e.phase(r, PhaseHalted, now, "halted: "+r.HaltReason)
		return
	}
	closed := "passed"
	if len(failed) > 0 {
		closed = "closed within its budget with " + shortfall(failed)
	}
	if r.Wave+1 >= len(r.Plan.Waves) {
		e.phase(r, PhaseCompleted, now, "completed"+r.incompleteNote())
		return
	}
	if soak := r.Spec.Soak.D(); soak > 0 {
		r.SoakUntil, r.dirty = now.Add(soak), true
		e.phase(r, PhaseSoaking, now, fmt.Sprintf("%s %s: soaking %v", r.waveName(r.Wave), closed, soak))
		return
	}
	if r.Wave == 0 && r.Spec.Approval == ApprovalManual {
		e.phase(r, PhaseAwaitingApproval, now, "canary passed: waiting for approval")
		return
	}
	e.nextWave(r, now)
}

// incompleteNote says what a finished rollout left undone: "" when every
// node was upgraded, else ": N nodes not upgraded (skipped ...)".
func (r *run) incompleteNote() string {
	if m := r.incomplete(); m != "" {
		return ": " + m
	}
	return ""
}

// incomplete lists the nodes a rollout did not upgrade, with why.
func (r *run) incomplete() string {
	var lines []string
	for _, n := range r.nodes {
		if n.Op == opUpgrade && (n.State == Skipped || n.State == Failed) {
			lines = append(lines, n.Name+" "+string(n.State)+" ("+n.Reason+")")
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d nodes not upgraded: %s", len(lines), len(r.nodes), strings.Join(lines, "; "))
}

// promoteCanary keeps the canary honest: when every canary node was
// skipped (drained by someone else, agent away), no node has shown the
// target works, so the next pending node becomes the canary instead of
// letting the waves start untested. It reports whether it found one.
func (e *Engine) promoteCanary(r *run, now time.Time) bool {
	for _, n := range r.nodes {
		if n.Wave == 0 && n.Op == opUpgrade && n.State != Skipped {
			return false
		}
	}
	for _, n := range r.nodes {
		if n.Wave > 0 && n.Op == opUpgrade && n.State == Pending {
			n.Wave, n.dirty = 0, true
			e.pending = append(e.pending, event{Rollout: r.ID, Time: now, Node: n.Name, Kind: evPhase,
				Message: "promoted to canary: every canary node was skipped"})
			return true
		}
	}
	return false
}

// startNodes takes pending nodes out of service while the fleet has room:
// the rollout's maxUnavailable counts every node out of service in its
// scope, whoever took it out, and the shared breaker has the last word.
func (e *Engine) startNodes(ctx context.Context, r *run, now time.Time, eligible func(*nodeRec) bool) {
	var cands []*nodeRec
	for _, n := range r.nodes {
		if n.State == Pending && eligible(n) {
			cands = append(cands, n)
		}
	}
	if len(cands) == 0 {
		return
	}
	// Most steps of a wave find every slot taken by the rollout's own
	// nodes: count those against the last listing first, and list the
	// fleet again (when older than the poll interval) only when a slot may
	// be free.
	if e.view.ok {
		inScope, size := e.scope(r)
		limit := maxUnavailable(r.Spec, size, size)
		held := 0
		for _, rr := range e.runs {
			for _, n := range rr.nodes {
				if n.holdsSlot() && inScope(n.Name) {
					held++
				}
			}
		}
		if held >= limit {
			r.blocked = fmt.Sprintf("max unavailable reached: %d of %d nodes out of service (limit %d)", held, size, limit)
			return
		}
	}
	if !e.view.ok || now.Sub(e.view.at) >= e.poll {
		e.listFleet(ctx, now)
	}
	if !e.view.ok {
		r.blocked = "fleet state unknown: " + e.view.err
		return
	}
	inScope, size := e.scope(r)
	limit := maxUnavailable(r.Spec, size, size)
	held := 0
	for _, rr := range e.runs {
		for _, n := range rr.nodes {
			if n.holdsSlot() && inScope(n.Name) {
				held++
			}
		}
	}
	out := make(map[string]bool, held+len(e.view.out))
	for name := range e.view.out {
		if inScope(name) && !e.knownSince(name, e.view.at) {
			out[name] = true
		}
	}
	for _, rr := range e.runs {
		for _, n := range rr.nodes {
			if n.holdsSlot() && inScope(n.Name) {
				out[n.Name] = true
			}
		}
	}
	for _, n := range cands {
		nv, known := e.view.nodes[n.Name]
		if !known || !nv.connected {
			// The listing may be a poll interval old: ask about this node now.
			nv, known = e.refreshNode(ctx, n.Name)
		}
		if !known || !nv.connected {
			grace := r.Spec.connectGrace()
			if n.waitSince.IsZero() {
				n.waitSince = now
				e.pending = append(e.pending, event{Rollout: r.ID, Time: now, Node: n.Name, Kind: evTransition, From: n.State, To: n.State,
					Message: fmt.Sprintf("agent not connected when its turn came: waiting up to %v for it to reconnect", grace)})
			}
			if now.Sub(n.waitSince) < grace {
				if r.blocked == "" {
					r.blocked = n.Name + ": " + kit.WaitingNote(n.waitSince, grace)
				}
				continue
			}
			n.waitSince = time.Time{}
			e.transition(r, n, Skipped, now, kit.GaveUpNote(grace)+": not upgraded")
			continue
		}
		n.waitSince = time.Time{}
		if why, down := e.view.out[n.Name]; down {
			e.transition(r, n, Skipped, now, "out of service when its turn came ("+why+"): left as it is")
			continue
		}
		delete(out, n.Name) // counted as out while its agent was away
		if len(out) >= limit {
			r.blocked = fmt.Sprintf("max unavailable reached: %d of %d nodes out of service (limit %d)", len(out), size, limit)
			return
		}
		if err := e.breaker.Allow(r.tag(), n.Name, len(e.view.nodes)); err != nil {
			r.blocked = err.Error()
			return
		}
		out[n.Name] = true
		n.DrainedAt = now
		e.transition(r, n, DrainRequired, now, "")
	}
}

// knownSince reports whether one of the engine's rollouts moved the node
// after t: its own record is then newer than a listing taken at t (a node
// just returned to service still shows as drained there).
func (e *Engine) knownSince(name string, t time.Time) bool {
	for _, r := range e.runs {
		if n := r.byName[name]; n != nil && n.Since.After(t) {
			return true
		}
	}
	return false
}

// scope returns the membership test and size of the set maxUnavailable is
// counted over.
func (e *Engine) scope(r *run) (func(string) bool, int) {
	if r.Spec.MaxUnavailableScope != ScopeSelection || r.Spec.Selector == "" {
		return func(string) bool { return true }, len(e.view.nodes)
	}
	if r.scopeAt.Equal(e.view.at) && r.scopeIn != nil {
		return func(name string) bool { return r.scopeIn[name] }, len(r.scopeIn)
	}
	sel, err := selector.Parse(r.Spec.Selector)
	if err != nil { // validated at start; a stored spec cannot change
		return func(string) bool { return true }, len(e.view.nodes)
	}
	in := map[string]bool{}
	for name, nv := range e.view.nodes {
		if sel.Matches(name, nv.labels) {
			in[name] = true
		}
	}
	for _, n := range r.nodes {
		in[n.Name] = true // a rollout node missing from the listing still counts
	}
	r.scopeAt, r.scopeIn = e.view.at, in
	return func(name string) bool { return in[name] }, len(in)
}

// waitOps waits for operations in flight (tests).
func (e *Engine) waitOps() { e.ops.Wait() }

// shiftDeadlines moves every clock a pause stopped by the pause's length.
func shiftDeadlines(r *run, d time.Duration) {
	if d <= 0 {
		return
	}
	for _, n := range r.nodes {
		if n.State.active() && !n.Deadline.IsZero() {
			n.Deadline, n.dirty = n.Deadline.Add(d), true
		}
	}
	if !r.SoakUntil.IsZero() {
		r.SoakUntil = r.SoakUntil.Add(d)
	}
}
