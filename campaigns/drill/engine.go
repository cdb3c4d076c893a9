package drill

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// ErrRefused wraps every reason a drill is refused before it touches a
// node; the specific reason is one of the errors below.
var ErrRefused = errors.New("drill refused")

// Refusal reasons, each wrapped with ErrRefused.
var (
	ErrNoTargets       = errors.New("the targets selector matches no node")
	ErrNotOptedIn      = errors.New("targets lack the opt-in label")
	ErrBlastRadius     = errors.New("more targets than the blast radius allows")
	ErrBreaker         = errors.New("the drain circuit breaker would trip")
	ErrFleetDegraded   = errors.New("the fleet is already degraded")
	ErrTargetUnhealthy = errors.New("a target is not healthy")
	// ErrTargetNotConnected: a target's agent is away at start.
	ErrTargetNotConnected = errors.New("a target's agent is not connected")
	ErrBusy               = errors.New("a target is in a running drill")
)

// degraded: the coordinator's node states that count as sick, or a node
// whose agent is not connected.
func degraded(n kit.Node) bool {
	switch n.State {
	case "failed", "degraded", "unreachable":
		return true
	}
	return !n.Connected
}

// Options are the drill engine's own knobs; zero values take defaults.
type Options struct {
	// IdlePoll is how long Run waits when no drill has anything due
	// (default 5s).
	IdlePoll time.Duration
}

// Engine drives drills. Its methods are safe for concurrent use; one Run
// (or Step) drives drills at a time.
type Engine struct {
	db      *sqldb.DB
	fleet   kit.Fleet
	drain   drain.Adapter
	breaker *kit.Breaker
	busy    *kit.Busy
	clock   kit.Clock
	log     zerolog.Logger
	idle    time.Duration

	drive sync.Mutex
	seq   atomic.Int64
	// waits: agents found not connected (drill/node), given the connect
	// grace before they count against the drill.
	waits kit.ConnectWaits
}

// New creates or upgrades the drill_ tables and returns an engine. The
// drainer tells whether a node was taken out of service (drain.None when
// the fleet has no scheduler). The engine registers its running drills'
// targets in d.Busy.
func New(ctx context.Context, d kit.Deps, opts Options) (*Engine, error) {
	d, err := d.Check("drill engine")
	if err != nil {
		return nil, err
	}
	e := &Engine{db: d.DB, fleet: d.Fleet, drain: d.Drainer, breaker: d.Breaker, busy: d.Busy, clock: d.Clock,
		log: d.Logger, idle: 5 * time.Second}
	if opts.IdlePoll > 0 {
		e.idle = opts.IdlePoll
	}
	if err := schema.Migrate(ctx, e.db, e.clock.Now()); err != nil {
		return nil, fmt.Errorf("drill engine: %w", err)
	}
	var maxSeq sql.NullInt64
	if err := e.db.QueryRowContext(ctx, `SELECT MAX(seq) FROM drill_drills`).Scan(&maxSeq); err != nil {
		return nil, fmt.Errorf("drill engine: %w", err)
	}
	e.seq.Store(maxSeq.Int64)
	e.busy.Register("drill", e.busyNodes)
	return e, nil
}

// Plan is what a drill would do, or why it may not.
type Plan struct {
	Targets   []string `json:"targets"`
	FleetSize int      `json:"fleet_size"`
	// Allowed is the blast radius in nodes for this fleet.
	Allowed int `json:"allowed"`
	// Degraded lists nodes failed, degraded or unreachable now.
	Degraded []string         `json:"degraded"`
	Breaker  kit.BreakerState `json:"breaker"`
}

// Preflight checks a spec against the fleet as it is now, without
// starting anything: the same refusals Start makes.
func (e *Engine) Preflight(ctx context.Context, in *Spec) (Plan, error) {
	spec := in.clone()
	if err := spec.Normalize(); err != nil {
		return Plan{}, err
	}
	busy, err := e.busy.Held(ctx)
	if err != nil {
		return Plan{}, err
	}
	return e.preflight(ctx, spec, busy)
}

func (e *Engine) preflight(ctx context.Context, spec *Spec, busy map[string]string) (Plan, error) {
	all, err := e.fleet.Nodes(ctx, "")
	if err != nil {
		return Plan{}, fmt.Errorf("drill preflight: list the fleet: %w", err)
	}
	targets, err := e.fleet.Nodes(ctx, spec.Targets)
	if err != nil {
		return Plan{}, fmt.Errorf("drill preflight: select targets: %w", err)
	}
	sort.Slice(targets, func(i, j int) bool { return targets[i].Name < targets[j].Name })
	p := Plan{FleetSize: len(all), Allowed: allowed(spec.BlastRadius, len(all)), Breaker: e.breaker.State(len(all))}
	for _, t := range targets {
		p.Targets = append(p.Targets, t.Name)
	}
	for _, n := range all {
		if degraded(n) {
			p.Degraded = append(p.Degraded, n.Name)
		}
	}
	refuse := func(why error, f string, a ...any) (Plan, error) {
		return p, fmt.Errorf("%w: %w: %s", ErrRefused, why, fmt.Sprintf(f, a...))
	}
	if len(targets) == 0 {
		return refuse(ErrNoTargets, "%q", spec.Targets)
	}
	k, v := spec.optIn()
	var missing []string
	for _, t := range targets {
		if t.Labels[k] != v {
			missing = append(missing, t.Name)
		}
	}
	if len(missing) > 0 {
		return refuse(ErrNotOptedIn, "%s=%s missing on %s", k, v, strings.Join(missing, ", "))
	}
	if len(targets) > p.Allowed {
		return refuse(ErrBlastRadius, "%d targets, at most %d (max_nodes %d, max_share %v of %d nodes)",
			len(targets), p.Allowed, spec.BlastRadius.MaxNodes, spec.BlastRadius.MaxShare, len(all))
	}
	var clash []string
	for _, t := range targets {
		if id, ok := busy[t.Name]; ok {
			clash = append(clash, t.Name+" ("+id+")")
		}
	}
	if len(clash) > 0 {
		return refuse(ErrBusy, "%s", strings.Join(clash, ", "))
	}
	var sick, away []string
	for _, t := range targets {
		// A disconnected node shows unreachable: that alone is "away";
		// any other state but healthy is sick, connected or not.
		switch {
		case t.State != "" && t.State != "healthy" && (t.Connected || t.State != "unreachable"):
			sick = append(sick, fmt.Sprintf("%s (%s, connected=%v)", t.Name, t.State, t.Connected))
		case !t.Connected:
			away = append(away, t.Name)
		}
	}
	if len(sick) > 0 {
		return refuse(ErrTargetUnhealthy, "%s: a drill on a sick node measures nothing", strings.Join(sick, ", "))
	}
	// Refused, not waited for: nothing is injected into a node whose agent
	// could not be told to revert. After a coordinator restart agents are
	// back within their reconnect backoff, so a retry soon succeeds.
	if len(away) > 0 {
		return refuse(ErrTargetNotConnected, "%s: the agent is not connected, so nothing could inject or revert the fault; retry once it has reconnected (fleetcheck nodes shows it healthy)",
			strings.Join(away, ", "))
	}
	share := float64(len(p.Degraded)) / float64(max(1, len(all)))
	if share > spec.FleetHealth.MaxDegradedShare || (spec.FleetHealth.MaxDegradedNodes > 0 && len(p.Degraded) > spec.FleetHealth.MaxDegradedNodes) {
		return refuse(ErrFleetDegraded, "%d of %d nodes failed, degraded or unreachable (%.1f%%; limit %.1f%%%s): %s",
			len(p.Degraded), len(all), share*100, spec.FleetHealth.MaxDegradedShare*100, nodeLimit(spec.FleetHealth.MaxDegradedNodes), abbreviate(p.Degraded, 10))
	}
	if spec.Expect.OutOfService && p.Breaker.Limit >= 0 {
		// The breaker counts a node drained again within its window once:
		// only targets not in the window yet take a slot.
		inWindow := map[string]bool{}
		for _, r := range e.breaker.Records() {
			inWindow[r.Node] = true
		}
		more := 0
		for _, t := range targets {
			if !inWindow[t.Name] {
				more++
			}
		}
		if p.Breaker.Drained+more > p.Breaker.Limit {
			return p, fmt.Errorf("%w: %w: %w: %d nodes drained within %s, the drill expects %d more, limit %d",
				ErrRefused, ErrBreaker, kit.ErrBreakerOpen, p.Breaker.Drained, p.Breaker.Window, more, p.Breaker.Limit)
		}
	}
	return p, nil
}

func nodeLimit(n int) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf(", at most %d nodes", n)
}

func abbreviate(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return strings.Join(s[:n], ", ") + fmt.Sprintf(" and %d more", len(s)-n)
}

// allowed is the blast radius in nodes.
func allowed(b BlastRadius, fleet int) int {
	n := b.MaxNodes
	if b.MaxShare > 0 {
		n = min(n, int(math.Floor(b.MaxShare*float64(fleet)+1e-9)))
	}
	return n
}

// busyNodes lists the targets of running drills, for kit.Busy.
func (e *Engine) busyNodes(ctx context.Context) (map[string]string, error) {
	return campaigndb.Held(ctx, e.db, "drill", `SELECT t.node, t.drill_id FROM drill_targets t
		JOIN drill_drills d ON d.id = t.drill_id WHERE d.state = ?`, string(StateRunning))
}

// Start runs the preflight and writes the drill. A refused drill is
// recorded too (state refused, with the reason) and its id returned with
// the error, so refusals show in the drill history.
func (e *Engine) Start(ctx context.Context, in *Spec) (string, error) {
	if in == nil {
		return "", fmt.Errorf("%w: no spec", ErrInvalidSpec)
	}
	spec := in.clone()
	if err := spec.Normalize(); err != nil {
		return "", err
	}
	var id string
	var refusal error
	err := e.busy.Claim(ctx, func(busy map[string]string) error {
		var err error
		id, refusal, err = e.start(ctx, spec, busy)
		return err
	})
	if err != nil {
		return "", err
	}
	if refusal != nil {
		e.log.Warn().Str("campaign", id).Err(refusal).Msg("drill refused")
		return id, fmt.Errorf("drill %s: %w", id, refusal)
	}
	return id, nil
}

// start writes the drill (running, or refused with the preflight's
// reason) while Start holds the fleet's claims.
func (e *Engine) start(ctx context.Context, spec *Spec, busy map[string]string) (id string, refusal, err error) {
	plan, refusal := e.preflight(ctx, spec, busy)
	if refusal != nil && !errors.Is(refusal, ErrRefused) {
		return "", nil, refusal
	}
	now := e.clock.Now()
	id = kit.NewID("d", now)
	name := spec.Name
	if name == "" {
		name = spec.Fault
	}
	state, reason := StateRunning, ""
	if refusal != nil {
		state, reason = StateRefused, refusal.Error()
	}
	degradedAtStart := plan.Degraded
	if degradedAtStart == nil {
		degradedAtStart = []string{}
	}
	finished := ""
	if state == StateRefused {
		finished = campaigndb.Time(now)
	}
	err = e.db.Tx(ctx, func(tx *sqldb.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO drill_drills (seq, `+drillCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			e.seq.Add(1), id, name, spec.Fault, campaigndb.JSON(spec), string(state), reason, campaigndb.JSON(degradedAtStart), campaigndb.Time(now), campaigndb.Time(now), finished); err != nil {
			return err
		}
		if state == StateRunning {
			for _, node := range plan.Targets {
				t := Target{Node: node, State: TargetPending, Findings: []Finding{}, NextAt: now}
				if _, err := tx.ExecContext(ctx, `INSERT INTO drill_targets (drill_id, node, state, data, updated_at) VALUES (?, ?, ?, ?, ?)`,
					id, node, string(t.State), campaigndb.JSON(t), campaigndb.Time(now)); err != nil {
					return err
				}
			}
		}
		what := fmt.Sprintf("started: fault %s on %s, expecting %s, deadline %s", spec.Fault, strings.Join(plan.Targets, ", "), spec.Expect.Check, time.Duration(spec.Deadline))
		if refusal != nil {
			what = "refused: " + refusal.Error()
		}
		return events.Add(ctx, tx, id, "", now, what)
	})
	if err != nil {
		return "", nil, fmt.Errorf("start drill: %w", err)
	}
	if refusal == nil {
		e.log.Info().Str("campaign", id).Str("fault", spec.Fault).Strs("targets", plan.Targets).Msg("drill started")
	}
	return id, refusal, nil
}

// Abort cuts a running drill short: targets not yet injected are left
// alone, injected ones are reverted and watched for recovery.
func (e *Engine) Abort(ctx context.Context, id, reason string) error {
	e.drive.Lock()
	defer e.drive.Unlock()
	d, err := loadDrill(ctx, e.db, id)
	if err != nil {
		return err
	}
	if d.State != StateRunning {
		return fmt.Errorf("abort %s: %w", id, ErrFinished)
	}
	now := e.clock.Now()
	for i := range d.Targets {
		if err := e.abortTarget(ctx, &d, &d.Targets[i], "operator: "+reason, now); err != nil {
			return err
		}
	}
	return events.Record(ctx, e.db, id, "", now, "abort requested: "+reason)
}

// Run drives every running drill until ctx ends, and returns ctx's error.
func (e *Engine) Run(ctx context.Context) error {
	for {
		next, err := e.step(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			e.log.Error().Err(err).Msg("drill step")
		}
		wait := e.idle
		if !next.IsZero() && err == nil {
			wait = min(max(next.Sub(e.clock.Now()), 0), e.idle)
		}
		if wait > 0 {
			if err := kit.Sleep(ctx, e.clock, wait); err != nil {
				return ctx.Err()
			}
		}
	}
}

// Step does everything due now in every running drill and reports whether
// anything is left to do later.
func (e *Engine) Step(ctx context.Context) (bool, error) {
	next, err := e.step(ctx)
	return !next.IsZero(), err
}

// NextDue is when the earliest running target is due (zero: none).
func (e *Engine) NextDue(ctx context.Context) (time.Time, error) {
	ds, err := loadDrills(ctx, e.db, `WHERE state = ?`, string(StateRunning))
	if err != nil {
		return time.Time{}, err
	}
	var next time.Time
	for _, d := range ds {
		for _, t := range d.Targets {
			if t.State != TargetDone && (next.IsZero() || t.NextAt.Before(next)) {
				next = t.NextAt
			}
		}
	}
	return next, nil
}

// step advances what is due and returns the next due time.
func (e *Engine) step(ctx context.Context) (time.Time, error) {
	e.drive.Lock()
	defer e.drive.Unlock()
	ds, err := loadDrills(ctx, e.db, `WHERE state = ?`, string(StateRunning))
	if err != nil {
		return time.Time{}, err
	}
	var errs []error
	for i := range ds {
		if err := e.advance(ctx, &ds[i]); err != nil {
			errs = append(errs, fmt.Errorf("drill %s: %w", ds[i].ID, err))
		}
	}
	next, err := e.NextDue(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	return next, errors.Join(errs...)
}

// advance moves one drill: the fleet is checked for unexpected trouble,
// then each target due now takes its next step (targets in parallel).
func (e *Engine) advance(ctx context.Context, d *Drill) error {
	now := e.clock.Now()
	if e.exposed(d) {
		if why, err := e.unexpected(ctx, d); err != nil {
			e.log.Warn().Str("campaign", d.ID).Err(err).Msg("cannot list the fleet")
		} else if why != "" {
			for i := range d.Targets {
				if err := e.abortTarget(ctx, d, &d.Targets[i], why, now); err != nil {
					return err
				}
			}
			if err := events.Record(ctx, e.db, d.ID, "", now, "aborting: "+why); err != nil {
				return err
			}
		}
	}
	var due []int
	for i, t := range d.Targets {
		if t.State != TargetDone && !t.NextAt.After(now) {
			due = append(due, i)
		}
	}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	wg.Add(len(due))
	for _, i := range due {
		kit.Go(e.clock, func() {
			defer wg.Done()
			if err := e.advanceTarget(ctx, d, &d.Targets[i]); err != nil && ctx.Err() == nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil || ctx.Err() != nil {
		return err
	}
	for _, t := range d.Targets {
		if t.State != TargetDone {
			return nil
		}
	}
	return e.finish(ctx, d)
}

// exposed: some target has (or may have) the fault in it.
func (e *Engine) exposed(d *Drill) bool {
	for _, t := range d.Targets {
		switch t.State {
		case TargetInjecting, TargetWatching, TargetOutOfService, TargetReverting:
			return true
		}
	}
	return false
}

// unexpected says why the drill must stop: a node that was not degraded
// at the start and is not a target is degraded now.
func (e *Engine) unexpected(ctx context.Context, d *Drill) (string, error) {
	all, err := e.fleet.Nodes(ctx, "")
	if err != nil {
		return "", err
	}
	targets := map[string]bool{}
	for _, t := range d.Targets {
		targets[t.Node] = true
	}
	var bad []string
	now, grace := e.clock.Now(), d.Spec.connectGrace()
	for _, n := range all {
		key := d.ID + "/fleet/" + n.Name // targets wait under their own key
		if targets[n.Name] || slices.Contains(d.Degraded, n.Name) || !degraded(n) {
			e.waits.Done(key)
			continue
		}
		if !n.Connected && n.State != "failed" && n.State != "degraded" {
			// Only away: after a coordinator restart every agent
			// reconnects with backoff. It counts once the grace is over.
			if _, over := e.waits.Wait(key, now, grace); !over {
				continue
			}
		}
		bad = append(bad, fmt.Sprintf("%s is %s", n.Name, nodeCondition(n)))
	}
	if len(bad) == 0 {
		return "", nil
	}
	sort.Strings(bad)
	return "unexpected state: non-target node " + abbreviate(bad, 5), nil
}

func nodeCondition(n kit.Node) string {
	if !n.Connected && n.State != "unreachable" {
		return n.State + " and disconnected"
	}
	return n.State
}

// abortTarget marks a target aborted and sends it toward its revert.
func (e *Engine) abortTarget(ctx context.Context, d *Drill, t *Target, why string, now time.Time) error {
	if t.State == TargetDone || t.Aborted {
		return nil
	}
	t.Aborted, t.AbortReason = true, why
	t.add(FindingAborted, "fail", why, now)
	switch t.State {
	case TargetPending, TargetPrechecking:
		t.State = TargetDone // nothing was injected
	case TargetInjecting, TargetWatching, TargetOutOfService:
		t.State, t.NextAt = TargetReverting, now
	}
	return e.db.Tx(ctx, func(tx *sqldb.Tx) error {
		if err := saveTarget(ctx, tx, d.ID, *t, now); err != nil {
			return err
		}
		return events.Add(ctx, tx, d.ID, t.Node, now, "aborted: "+why)
	})
}

// finish closes a drill whose targets are all done.
func (e *Engine) finish(ctx context.Context, d *Drill) error {
	now := e.clock.Now()
	state, reason := StateDone, ""
	for _, t := range d.Targets {
		if t.Aborted {
			state, reason = StateAborted, t.AbortReason
		}
	}
	if _, err := campaigndb.Exec(ctx, e.db, `UPDATE drill_drills SET state = ?, reason = ?, updated_at = ?, finished_at = ? WHERE id = ? AND state = ?`,
		string(state), reason, campaigndb.Time(now), campaigndb.Time(now), d.ID, string(StateRunning)); err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	var parts []string
	for _, t := range d.Targets {
		s := t.Node + ":"
		if ttd, ok := t.TTD(); ok {
			s += fmt.Sprintf(" detected by %s in %s", t.DetectedBy, ttd)
		} else {
			s += " not detected"
		}
		if ttr, ok := t.TTR(); ok {
			s += fmt.Sprintf(", recovered in %s", ttr)
		}
		parts = append(parts, s)
	}
	e.log.Info().Str("campaign", d.ID).Str("state", string(state)).Msg("drill finished")
	return events.Record(ctx, e.db, d.ID, "", now, fmt.Sprintf("%s: %s", state, strings.Join(parts, "; ")))
}

// ---- targets ----

// save writes a target's new state before the engine acts on it.
func (e *Engine) save(ctx context.Context, d *Drill, t *Target, what string) error {
	now := e.clock.Now()
	return e.db.Tx(ctx, func(tx *sqldb.Tx) error {
		if err := saveTarget(ctx, tx, d.ID, *t, now); err != nil {
			return err
		}
		if what != "" {
			return events.Add(ctx, tx, d.ID, t.Node, now, what)
		}
		return nil
	})
}

// advanceTarget takes a target due now one step: the deadline first,
// then its state's method (one per state).
func (e *Engine) advanceTarget(ctx context.Context, d *Drill, t *Target) error {
	if done, err := e.checkDeadline(ctx, d, t); done || err != nil {
		return err
	}
	switch t.State {
	case TargetPending, TargetPrechecking:
		return e.precheck(ctx, d, t)
	case TargetInjecting:
		return e.resumeInjecting(ctx, d, t)
	case TargetWatching:
		return e.watching(ctx, d, t)
	case TargetOutOfService:
		return e.awaitOutOfService(ctx, d, t)
	case TargetReverting:
		return e.reverting(ctx, d, t)
	case TargetRecovering:
		return e.recovering(ctx, d, t)
	}
	return nil
}

// checkDeadline aborts a target whose deadline passed (it runs from
// injection, from the start before it); done says it did.
func (e *Engine) checkDeadline(ctx context.Context, d *Drill, t *Target) (done bool, err error) {
	if t.Aborted {
		return false, nil
	}
	spec, deadline, now := d.Spec, time.Duration(d.Spec.Deadline), e.clock.Now()
	from := d.CreatedAt
	if !t.InjectedAt.IsZero() {
		from = t.InjectedAt
	}
	if !now.After(from.Add(deadline)) {
		return false, nil
	}
	switch t.State {
	case TargetPending, TargetPrechecking, TargetInjecting, TargetWatching, TargetOutOfService:
		if t.DetectedAt.IsZero() && !t.InjectedAt.IsZero() {
			t.add(FindingDetectionGap, "fail", fmt.Sprintf("no watched check (%s) detected %s within the deadline %s",
				strings.Join(spec.Watch, ", "), spec.Fault, deadline), now)
		}
		return true, e.abortTarget(ctx, d, t, fmt.Sprintf("deadline %s passed in state %s", deadline, t.State), now)
	}
	return false, nil
}

// precheck runs the watched checks before injection; a target that passes
// them has its fault injected (inject).
func (e *Engine) precheck(ctx context.Context, d *Drill, t *Target) error {
	spec := d.Spec
	poll := time.Duration(d.Spec.PollInterval)
	now := e.clock.Now()
	t.State = TargetPrechecking
	if err := e.save(ctx, d, t, ""); err != nil {
		return err
	}
	if wait, err := e.awaitAgent(ctx, d, t, now, poll); wait || err != nil {
		return err
	}
	rep, err := e.fleet.RunChecks(ctx, t.Node, spec.Watch, kit.RunOptions{Timeout: poll})
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		t.LastError = err.Error()
		t.add(FindingUnhealthyBefore, "fail", "precheck did not run: "+err.Error(), now)
		t.Aborted, t.AbortReason, t.State = true, "precheck failed: "+err.Error(), TargetDone
		return e.save(ctx, d, t, "not injected: precheck failed: "+err.Error())
	}
	t.Precheck = snapshot(rep)
	if pre, ok := t.Precheck[spec.Expect.Check]; !ok || pre.Status != report.Pass {
		st := report.Status("missing")
		if ok {
			st = pre.Status
		}
		msg := fmt.Sprintf("%s was %s before injection: a detection could not be told from what was already there", spec.Expect.Check, st)
		if st == report.Skip {
			// Where data was expected, a skip is inconclusive: the check
			// could not have seen the fault.
			msg = fmt.Sprintf("%s skipped before injection (%s): it could not see the fault, the drill would measure nothing",
				spec.Expect.Check, orText(rep.Check(spec.Expect.Check).Reason, "no reason given"))
		}
		t.add(FindingUnhealthyBefore, "fail", msg, now)
		t.Aborted, t.AbortReason, t.State = true, msg, TargetDone
		return e.save(ctx, d, t, "not injected: "+msg)
	}
	return e.inject(ctx, d, t)
}

// inject writes the target as injecting, then asks the agent for the
// fault.
func (e *Engine) inject(ctx context.Context, d *Drill, t *Target) error {
	spec, poll := d.Spec, time.Duration(d.Spec.PollInterval)
	log := e.log.With().Str("campaign", d.ID).Str("node", t.Node).Logger()
	// Written before the action: after a restart the engine treats the
	// fault as possibly in place and reverts it.
	t.State = TargetInjecting
	t.InjectedAt = e.clock.Now()
	if err := e.save(ctx, d, t, "injecting "+spec.Fault); err != nil {
		return err
	}
	res, err := e.fleet.RunAction(ctx, t.Node, spec.Fault, e.injectParams(d), kit.RunOptions{Timeout: poll})
	if ctx.Err() != nil {
		return nil
	}
	now := e.clock.Now()
	if err != nil || !res.OK {
		msg := actionError(res, err)
		t.add(FindingInjectFailed, "fail", spec.Fault+": "+msg, now)
		t.Aborted, t.AbortReason = true, "inject failed: "+msg
		// It may have half happened: revert anyway.
		t.State, t.NextAt = TargetReverting, now
		return e.save(ctx, d, t, "inject failed: "+msg)
	}
	t.InjectedAt = now
	t.State, t.NextAt = TargetWatching, now
	e.noteInterval(ctx, t)
	log.Info().Str("fault", spec.Fault).Msg("fault injected")
	return e.save(ctx, d, t, "injected: "+res.Message)
}

// resumeInjecting is a target found injecting after a restart.
func (e *Engine) resumeInjecting(ctx context.Context, d *Drill, t *Target) error {
	now := e.clock.Now()
	// A restart between the write and the action's answer: the fault
	// may be in place. Watch from the time it was written (a later
	// detection then reads a little long, never short).
	t.State, t.NextAt = TargetWatching, now
	return e.save(ctx, d, t, "resumed after a restart during injection: assuming the fault is in place")
}

// watching looks for the fault in what the agent reports on its own.
func (e *Engine) watching(ctx context.Context, d *Drill, t *Target) error {
	spec := d.Spec
	poll := time.Duration(d.Spec.PollInterval)
	deadline := time.Duration(d.Spec.Deadline)
	now := e.clock.Now()
	if wait, err := e.awaitAgent(ctx, d, t, now, poll); wait || err != nil {
		return err
	}
	if t.CheckInterval == 0 {
		e.noteInterval(ctx, t) // an agent that just started had too few results
	}
	obs, err := e.watch(ctx, d, t, t.InjectedAt, poll)
	if ctx.Err() != nil {
		return nil
	}
	now = e.clock.Now()
	t.Polls++
	if err != nil {
		t.LastError = err.Error()
		t.NextAt = e.nextPoll(t, now, poll, deadline)
		return e.save(ctx, d, t, "")
	}
	t.LastError = ""
	newDet := e.detect(d, t, obs, now)
	expectedNow := t.ExpectedDetected
	switch {
	case t.DetectedAt.IsZero():
		t.NextAt = e.nextPoll(t, now, poll, deadline)
		return e.save(ctx, d, t, "")
	case !expectedNow && t.Polls-t.DetectedPoll < 2:
		// Detected by another check: give the expected one two more
		// polls before calling it.
		t.NextAt = e.nextPoll(t, now, poll, deadline)
		return e.save(ctx, d, t, newDet)
	}
	if !expectedNow {
		t.add(FindingOtherCheck, "warn", fmt.Sprintf("detected by %s, not by the expected %s", t.DetectedBy, spec.Expect.Check), now)
	}
	if spec.Expect.OutOfService {
		t.State, t.NextAt = TargetOutOfService, now
		return e.save(ctx, d, t, newDet)
	}
	if err := e.noteUnexpectedDrain(ctx, t, now); err != nil {
		return err
	}
	t.State, t.NextAt = TargetReverting, now
	return e.save(ctx, d, t, newDet)
}

// awaitOutOfService waits for the node to be taken out of service, when the
// spec expects that of a detection.
func (e *Engine) awaitOutOfService(ctx context.Context, d *Drill, t *Target) error {
	spec := d.Spec
	poll := time.Duration(d.Spec.PollInterval)
	deadline := time.Duration(d.Spec.Deadline)
	out, why, err := e.outOfService(ctx, t.Node)
	now := e.clock.Now()
	if err != nil {
		t.LastError = err.Error()
	}
	if out {
		t.OutOfServiceAt = now
		t.State, t.NextAt = TargetReverting, now
		return e.save(ctx, d, t, "taken out of service: "+why)
	}
	if now.After(t.DetectedAt.Add(time.Duration(spec.Expect.OutOfServiceWithin))) {
		t.add(FindingNotOutOfService, "fail", fmt.Sprintf("not taken out of service within %s of detection", time.Duration(spec.Expect.OutOfServiceWithin)), now)
		t.State, t.NextAt = TargetReverting, now
		return e.save(ctx, d, t, "not taken out of service")
	}
	t.NextAt = e.nextPoll(t, now, min(poll, time.Duration(spec.Expect.OutOfServiceWithin)/4+time.Second), deadline)
	return e.save(ctx, d, t, "")
}

// reverting asks the agent to revert the fault (three tries, then the
// agent's own timer).
func (e *Engine) reverting(ctx context.Context, d *Drill, t *Target) error {
	spec := d.Spec
	poll := time.Duration(d.Spec.PollInterval)
	now := e.clock.Now()
	log := e.log.With().Str("campaign", d.ID).Str("node", t.Node).Logger()
	if t.RevertStartedAt.IsZero() {
		t.RevertStartedAt = now
	}
	t.RevertAttempts++
	if err := e.save(ctx, d, t, ""); err != nil {
		return err
	}
	res, err := e.fleet.RunAction(ctx, t.Node, spec.Revert, e.revertParams(d), kit.RunOptions{Timeout: poll})
	if ctx.Err() != nil {
		return nil
	}
	now = e.clock.Now()
	if err == nil && res.OK {
		t.RevertedAt, t.RevertedBy = now, "coordinator"
		t.State, t.NextAt = TargetRecovering, now
		log.Info().Msg("fault reverted")
		return e.save(ctx, d, t, "reverted: "+res.Message)
	}
	msg := actionError(res, err)
	t.LastError = msg
	if errors.Is(err, kit.ErrUnreachable) || t.RevertAttempts >= 3 {
		t.add(FindingRevertFailed, "fail", fmt.Sprintf("%s: %s; the agent reverts on its own timer (%s after injection, or %s after losing the coordinator)",
			spec.Revert, msg, time.Duration(spec.RevertAfter), time.Duration(spec.RevertOnDisconnect)), now)
		t.RevertedBy = "agent"
		t.State, t.NextAt = TargetRecovering, now.Add(poll)
		log.Warn().Str("problem", msg).Msg("revert failed; left to the agent's timer")
		return e.save(ctx, d, t, "revert failed, left to the agent's timer: "+msg)
	}
	t.NextAt = now.Add(poll)
	return e.save(ctx, d, t, "revert failed, retrying: "+msg)
}

// recovering waits for the node to be healthy again.
func (e *Engine) recovering(ctx context.Context, d *Drill, t *Target) error {
	spec := d.Spec
	poll := time.Duration(d.Spec.PollInterval)
	deadline := time.Duration(d.Spec.Deadline)
	limit := t.InjectedAt.Add(deadline)
	if t.Aborted || t.RevertedBy == "agent" {
		// An aborted drill (or one whose revert is the agent's) still
		// waits a grace for the node to come back, so a node left sick
		// is known. The agent's own timer may fire only at revert_after.
		limit = maxTime(limit, t.RevertStartedAt).Add(time.Duration(spec.RecoverGrace))
		if t.RevertedBy == "agent" {
			limit = maxTime(limit, t.InjectedAt.Add(time.Duration(spec.RevertAfter)).Add(time.Duration(spec.PollInterval)))
		}
	}
	from := t.RevertedAt
	if from.IsZero() {
		from = t.RevertStartedAt
	}
	obs, err := e.watch(ctx, d, t, from, poll)
	if ctx.Err() != nil {
		return nil
	}
	now := e.clock.Now()
	t.Polls++
	if err == nil {
		t.LastError = ""
		if at, ok := e.recovered(d, t, obs); ok {
			t.RecoveredAt = at
			t.State = TargetDone
			if err := e.noteUnexpectedDrain(ctx, t, now); err != nil {
				return err
			}
			what := "healthy again"
			if ttr, ok := t.TTR(); ok {
				what += fmt.Sprintf(" %s after injection", ttr)
			}
			return e.save(ctx, d, t, what)
		}
	} else {
		t.LastError = err.Error()
	}
	if now.After(limit) {
		t.add(FindingNotRecovered, "fail", fmt.Sprintf("not healthy again by %s: %s", limit.UTC().Format(time.RFC3339), orText(t.LastError, "watched checks still differ from before the drill")), now)
		if !t.Aborted {
			t.Aborted, t.AbortReason = true, "not recovered by the deadline"
		}
		t.State = TargetDone
		return e.save(ctx, d, t, "not recovered")
	}
	t.NextAt = minTime(now.Add(poll), limit.Add(time.Nanosecond))
	return e.save(ctx, d, t, "")
}

// nextPoll is the next watch, but no later than just past the deadline,
// so an abort is not late by up to a poll interval.
func (e *Engine) nextPoll(t *Target, now time.Time, poll, deadline time.Duration) time.Time {
	next := now.Add(poll)
	if !t.Aborted && !t.InjectedAt.IsZero() {
		next = minTime(next, t.InjectedAt.Add(deadline).Add(time.Nanosecond))
	}
	return next
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func orText(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (e *Engine) injectParams(d *Drill) map[string]string {
	p := map[string]string{}
	maps.Copy(p, d.Spec.Params)
	p[ParamDrillID] = d.ID
	p[ParamRevertAfter] = time.Duration(d.Spec.RevertAfter).String()
	p[ParamRevertOnDisconnect] = time.Duration(d.Spec.RevertOnDisconnect).String()
	return p
}

func (e *Engine) revertParams(d *Drill) map[string]string {
	p := map[string]string{}
	maps.Copy(p, d.Spec.Params)
	p[ParamDrillID] = d.ID
	return p
}

func actionError(res kit.ActionResult, err error) string {
	if err != nil {
		return err.Error()
	}
	if res.Message != "" {
		return res.Message
	}
	return "the action reported failure"
}

// outOfService reads the node's drain state as the coordinator exposes it
// (its drain policy's drains, with who and why), then the drain adapter
// (a scheduler's own drain).
func (e *Engine) outOfService(ctx context.Context, node string) (bool, string, error) {
	n, known, nerr := kit.LookupNode(ctx, e.fleet, node)
	if nerr == nil && known {
		switch {
		case n.OutOfService:
			return true, orText(n.OutOfServiceReason, "node "+orText(n.State, "out of service")), nil
		case n.State == "draining" || n.State == "drained":
			return true, "node state " + n.State, nil
		}
	}
	st, err := e.drain.Status(ctx, node)
	if err == nil && st.Drained {
		return true, orText(st.Reason, "drained"), nil
	}
	return false, "", errors.Join(err, nerr)
}

// awaitAgent asks the fleet now whether the target's agent is connected.
// One that is not is waited for (the connect grace: it may be reconnecting
// after a coordinator restart) before the target is aborted as
// unreachable. It reports whether the target waits.
func (e *Engine) awaitAgent(ctx context.Context, d *Drill, t *Target, now time.Time, poll time.Duration) (bool, error) {
	key := d.ID + "/" + t.Node
	n, known, err := kit.LookupNode(ctx, e.fleet, t.Node)
	if err != nil {
		t.LastError = err.Error()
		t.NextAt = now.Add(poll)
		return true, e.save(ctx, d, t, "")
	}
	if known && n.Connected {
		e.waits.Done(key)
		return false, nil
	}
	grace := d.Spec.connectGrace()
	since, over := e.waits.Wait(key, now, grace)
	if over {
		e.waits.Done(key)
		return true, e.abortTarget(ctx, d, t, kit.GaveUpNote(grace)+" (target unreachable)", now)
	}
	what := ""
	if since.Equal(now) {
		what = fmt.Sprintf("agent not connected: waiting up to %v for it to reconnect", grace)
	}
	t.LastError = kit.WaitingNote(since, grace)
	t.NextAt = minTime(now.Add(min(poll, grace)), since.Add(grace))
	return true, e.save(ctx, d, t, what)
}

// noteUnexpectedDrain records a node taken out of service although the
// spec said it would not be (once).
func (e *Engine) noteUnexpectedDrain(ctx context.Context, t *Target, now time.Time) error {
	if t.HasFinding(FindingUnexpectedOutOfService) || !t.OutOfServiceAt.IsZero() {
		return nil
	}
	out, why, err := e.outOfService(ctx, t.Node)
	if err != nil && !out {
		return nil // unknown is not a finding
	}
	if out {
		t.OutOfServiceAt = now
		t.add(FindingUnexpectedOutOfService, "warn", "taken out of service although the drill did not expect it: "+why, now)
	}
	return nil
}

// ---- detection and recovery ----

func rank(s report.Status) int {
	switch s {
	case report.Fail:
		return 4
	case report.Error:
		return 3
	case report.Warn:
		return 2
	default:
		return 1 // pass, skip
	}
}

func snapshot(rep *report.Report) map[string]CheckSnap {
	out := map[string]CheckSnap{}
	for _, c := range rep.Checks {
		out[c.Name] = CheckSnap{Status: c.Status, Codes: codes(c)}
	}
	return out
}

func codes(c report.CheckResult) []string {
	var out []string
	for _, f := range c.Findings {
		if !slices.Contains(out, f.Code) {
			out = append(out, f.Code)
		}
	}
	sort.Strings(out)
	return out
}

// collected is when the report's checks ran, within [from, now]; a report
// collected before from is stale (it cannot show what happened at from).
func collected(rep *report.Report, from, now time.Time) (time.Time, bool) {
	if rep.CollectedAt == "" {
		return now, true
	}
	at, err := time.Parse(time.RFC3339Nano, rep.CollectedAt)
	if err != nil {
		return now, true
	}
	if at.Before(from.Truncate(time.Second)) {
		return at, false
	}
	if at.After(now) {
		return now, true
	}
	if at.Before(from) {
		at = from // RFC 3339 seconds: the same second as from
	}
	return at, true
}

// observation is one watched check's result and when it ran.
type observation struct {
	c  report.CheckResult
	at time.Time
}

// watch reads the watched checks as they were after from. Checks the
// agent runs on its own schedule are read from what it reported, when
// the fleet keeps that (kit.Observer): a detection is then timed by
// the first result that shows the fault, as the fleet's monitoring sees
// it, not by a check the drill asked for the moment after injecting. The
// others (disruptive ones) run on request.
func (e *Engine) watch(ctx context.Context, d *Drill, t *Target, from time.Time, poll time.Duration) ([]observation, error) {
	var obs []observation
	onDemand := d.Spec.Watch
	if o, ok := e.fleet.(kit.Observer); ok {
		var own []string
		onDemand = nil
		for _, c := range d.Spec.Watch {
			if scheduledCheck(c) {
				own = append(own, c)
			} else {
				onDemand = append(onDemand, c)
			}
		}
		if len(own) > 0 {
			got, err := o.Observed(ctx, t.Node, own, from)
			if err != nil {
				return nil, err
			}
			seen := map[string]bool{}
			for _, g := range got {
				if !g.At.Before(from) {
					obs = append(obs, observation{c: g.Check, at: g.At})
					seen[g.Check.Name] = true
				}
			}
			if len(seen) > 0 {
				// The agent passed since, without these: its schedule does
				// not run them, so they are asked for.
				for _, c := range own {
					if !seen[c] {
						onDemand = append(onDemand, c)
					}
				}
			}
		}
	}
	if len(onDemand) > 0 {
		rep, err := e.fleet.RunChecks(ctx, t.Node, onDemand, kit.RunOptions{Timeout: poll})
		if err != nil {
			return obs, err
		}
		if at, fresh := collected(rep, from, e.clock.Now()); fresh {
			for _, c := range rep.Checks {
				obs = append(obs, observation{c: c, at: at})
			}
		}
	}
	return obs, nil
}

// noteInterval records how often the target's agent runs its checks on
// its own, when the fleet can tell.
func (e *Engine) noteInterval(ctx context.Context, t *Target) {
	if o, ok := e.fleet.(kit.Observer); ok {
		if iv, err := o.CheckInterval(ctx, t.Node); err == nil && iv > 0 {
			t.CheckInterval = config.Duration(iv)
		}
	}
}

// scheduledCheck: agents run the passive checks on their own schedule.
func scheduledCheck(name string) bool {
	for _, c := range registry.All() {
		if c.Name() == name {
			return !c.Disruptive()
		}
	}
	return false
}

// detect compares a watch poll with the precheck and records the first
// detection of each check: a status worse than before (warn or fail), or
// a finding code not seen before. The expected check must match
// expect.code when one is set. It returns an event text for new ones.
func (e *Engine) detect(d *Drill, t *Target, obs []observation, now time.Time) string {
	seen := map[string]bool{}
	for _, det := range t.Detections {
		seen[det.Check] = true
	}
	var news []string
	for _, ob := range obs {
		c, at := ob.c, ob.at
		if seen[c.Name] || rank(c.Status) < rank(report.Warn) {
			continue
		}
		pre := t.Precheck[c.Name]
		cs := codes(c)
		newCodes := false
		for _, code := range cs {
			if !slices.Contains(pre.Codes, code) {
				newCodes = true
			}
		}
		if rank(c.Status) <= rank(pre.Status) && !newCodes {
			continue
		}
		expected := c.Name == d.Spec.Expect.Check
		if expected && d.Spec.Expect.Code != "" && !slices.ContainsFunc(cs, func(s string) bool { return strings.HasPrefix(s, d.Spec.Expect.Code) }) {
			continue
		}
		det := Detection{Check: c.Name, Status: c.Status, Codes: cs, At: at, Observed: now}
		if len(c.Findings) > 0 {
			det.Message = c.Findings[0].Code + " " + c.Findings[0].Component + ": " + c.Findings[0].Message
		}
		det.Findings = append(det.Findings, c.Findings...)
		t.Detections = append(t.Detections, det)
		if t.DetectedAt.IsZero() {
			t.DetectedPoll = t.Polls
		}
		if t.DetectedAt.IsZero() || at.Before(t.DetectedAt) {
			t.DetectedAt, t.DetectedBy = at, c.Name
		}
		if expected {
			t.ExpectedDetected = true
		}
		news = append(news, fmt.Sprintf("%s %s (%s)", c.Name, c.Status, strings.Join(cs, ",")))
	}
	if len(news) == 0 {
		return ""
	}
	ttd, _ := t.TTD()
	return fmt.Sprintf("detected by %s; time to detect %s", strings.Join(news, ", "), ttd)
}

// recovered: every watched check that ran before the drill has a result
// from after the revert, back to its precheck status (or better) with no
// finding code that was not there before. The node is healthy again when
// the last of them showed it.
func (e *Engine) recovered(d *Drill, t *Target, obs []observation) (time.Time, bool) {
	got := map[string]bool{}
	var at time.Time
	for _, ob := range obs {
		c := ob.c
		pre, ok := t.Precheck[c.Name]
		if !ok {
			continue
		}
		if rank(c.Status) > rank(pre.Status) || c.Status == report.Skip && pre.Status != report.Skip {
			return time.Time{}, false // a check that answered before and skips now shows nothing
		}
		for _, code := range codes(c) {
			if !slices.Contains(pre.Codes, code) {
				return time.Time{}, false
			}
		}
		got[c.Name] = true
		at = maxTime(at, ob.at)
	}
	for _, name := range d.Spec.Watch {
		if _, ran := t.Precheck[name]; ran && !got[name] {
			return time.Time{}, false // not seen since the revert yet
		}
	}
	return at, !at.IsZero()
}
