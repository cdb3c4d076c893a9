package remediation

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/escalate"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/selector"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// Actor is the breaker's campaign name and the drains' reason prefix.
const Actor = "remediation"

// maxNotes bounds the later triggers kept on one remediation.
const maxNotes = 50

// Baselines gives a node's stored single-node all_reduce bus bandwidth;
// ok is false when none is stored.
type Baselines interface {
	AllReduce(ctx context.Context, node string) (busbw float64, ok bool, err error)
}

// Campaigns says whether a campaign holds a node (a rollout, burn-in or
// drill on it): the health path leaves such a node alone.
type Campaigns interface {
	Holding(ctx context.Context, node string) (why string, held bool)
}

// History gives the burn-in runs that tested a node.
type History interface {
	BurnIns(ctx context.Context, node string) ([]BurnInRecord, error)
}

// Deps are what the engine runs on; Fleet, Drain and DB are required.
type Deps struct {
	DB        *sqldb.DB
	Fleet     kit.Fleet
	Drain     drain.Adapter
	Breaker   *kit.Breaker // nil: unbounded (tests only)
	Clock     kit.Clock    // nil: the wall clock
	Log       zerolog.Logger
	Baselines Baselines    // nil: the all_reduce check's own verdict decides
	Campaigns Campaigns    // nil: no campaign holds nodes
	History   History      // nil: RMAs carry no burn-in history
	HTTP      *http.Client // nil: a client with rma.timeout
}

// Engine runs the ladder. Safe for concurrent use; one Step at a time.
type Engine struct {
	cfg  Config
	d    Deps
	http *http.Client
	log  zerolog.Logger

	mu    sync.Mutex // rules, seq, and the read-modify-write of items
	rules *escalate.Rules
	seq   int
	kick  chan struct{} // wakes Run

	// moving holds the nodes whose remediation a step or an operator is
	// moving now (one remediation per node is open at a time): never two
	// at once on one node. slots bounds the steps running (Parallel).
	movMu   sync.Mutex
	moving  map[string]chan struct{}
	slots   chan struct{}
	workers sync.WaitGroup
}

// New opens the engine on deps.DB (creating its tables); cfg is
// validated and its defaults filled.
func New(ctx context.Context, cfg Config, d Deps) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.DB == nil || d.Fleet == nil || d.Drain == nil {
		return nil, errors.New("remediation: DB, Fleet and Drain are required")
	}
	if d.Clock == nil {
		d.Clock = kit.WallClock{}
	}
	cfg = cfg.WithDefaults()
	e := &Engine{cfg: cfg, d: d, http: d.HTTP, log: d.Log.With().Str("subsystem", "remediation").Logger(), rules: escalate.New(cfg.Rules),
		kick: make(chan struct{}, 1), moving: map[string]chan struct{}{}, slots: make(chan struct{}, cfg.Parallel)}
	if e.http == nil {
		e.http = &http.Client{Timeout: cfg.RMA.Timeout}
	}
	if err := schema.Migrate(ctx, d.DB, d.Clock.Now()); err != nil {
		return nil, err
	}
	seq, err := maxSeq(ctx, d.DB)
	if err != nil {
		return nil, err
	}
	e.seq = seq
	return e, nil
}

// Config is the engine's configuration, defaults filled.
func (e *Engine) Config() Config { return e.cfg }

// Mode is the engine's mode.
func (e *Engine) Mode() Mode { return e.cfg.Mode }

func (e *Engine) now() time.Time { return e.d.Clock.Now() }

// Observe takes one result of node: failing findings whose action is a
// ladder step start remediations; Xid, ECC and link events go through
// the escalation rules, whose verdicts start remediations or record job
// events. job is the scheduler's job on the node, when known.
func (e *Engine) Observe(ctx context.Context, node string, checks []report.CheckResult, at time.Time, job string) error {
	var trig []Trigger
	seen := map[string]bool{}
	var evs []escalate.Event
	for _, c := range checks {
		for _, f := range c.Findings {
			step, ok := stepFor(f.Action)
			if !ok || f.Severity != report.SevFail {
				continue
			}
			comp := f.Component
			if comp == "" {
				comp = "node"
			}
			if seen[comp] {
				continue
			}
			seen[comp] = true
			trig = append(trig, Trigger{Node: node, Component: comp, Step: step, Code: f.Code, Source: "finding", At: at,
				Reason: fmt.Sprintf("%s: %s %s (%s)", c.Name, comp, f.Code, f.Action)})
		}
		evs = append(evs, escalate.FromCheck(node, c, at, job)...)
	}
	e.mu.Lock()
	var vs []escalate.Verdict
	for _, ev := range evs {
		vs = append(vs, e.rules.Observe(ev)...)
	}
	e.mu.Unlock()
	var errs []error
	for _, t := range trig {
		if _, err := e.Trigger(ctx, t); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, e.verdicts(ctx, vs))
	return errors.Join(errs...)
}

// Observed is one result a previous leader already observed.
type Observed struct {
	ID     string // the result's, for logs
	Node   string
	Checks []report.CheckResult
	At     time.Time
}

// RecallHorizon is how much of the stored history Recall wants: the
// rules' longest window.
func (e *Engine) RecallHorizon() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rules.Horizon()
}

// Recall rebuilds the rules' windows (Xid counts, ECC rises, link flaps,
// flagged ports) from results a previous leader already observed, in the
// order it did. Their verdicts were acted on then, so none is acted on
// now. A flagged port whose newest remediation is done since it was
// flagged is armed again, as that remediation's end armed it. It returns
// how many events were recalled.
func (e *Engine) Recall(ctx context.Context, results []Observed) (int, error) {
	n := 0
	e.mu.Lock()
	for _, r := range results {
		for _, c := range r.Checks {
			for _, ev := range escalate.FromCheck(r.Node, c, r.At, "") {
				e.rules.Observe(ev)
				n++
			}
		}
	}
	flagged := e.rules.Flagged("")
	e.mu.Unlock()
	for _, f := range flagged {
		rs, err := loadItems(ctx, e.d.DB, `WHERE node = ? AND component = ?`, f.Node, f.Component)
		if err != nil {
			return n, err
		}
		if len(rs) > 0 && rs[0].State == StateDone && !rs[0].DoneAt.Before(f.Since) {
			e.mu.Lock()
			e.rules.Rearm(f.Node, f.Component)
			e.mu.Unlock()
		}
	}
	return n, nil
}

// ObserveEvents feeds events straight to the rules (the simulator, and
// sources other than check results).
func (e *Engine) ObserveEvents(ctx context.Context, evs ...escalate.Event) error {
	e.mu.Lock()
	var vs []escalate.Verdict
	for _, ev := range evs {
		vs = append(vs, e.rules.Observe(ev)...)
	}
	e.mu.Unlock()
	return e.verdicts(ctx, vs)
}

func (e *Engine) verdicts(ctx context.Context, vs []escalate.Verdict) error {
	var errs []error
	for _, v := range vs {
		switch v.Kind {
		case escalate.Escalate:
			_, err := e.Trigger(ctx, Trigger{Node: v.Node, Component: v.Component, Step: v.Action, Code: v.Rule, Source: "rule", Reason: v.Reason, At: v.At})
			errs = append(errs, err)
		case escalate.JobEvent:
			j := JobEvent{At: v.At, Job: v.Job, Xid: v.Xid, Nodes: v.Nodes, Reason: v.Reason}
			errs = append(errs, insertJob(ctx, e.d.DB, j))
			e.log.Info().Str("job", v.Job).Int("nodes", len(v.Nodes)).Msg("application Xids correlated into one job event")
		case escalate.Cleared:
			e.log.Info().Str("node", v.Node).Str("component", v.Component).Msg(v.Reason)
		}
	}
	return errors.Join(errs...)
}

// Flagged lists the ports the link rule holds flagged ("" all nodes).
func (e *Engine) Flagged(node string) []escalate.FlaggedPort {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rules.Flagged(node)
}

// JobEvents returns the newest job events, newest first.
func (e *Engine) JobEvents(ctx context.Context, limit int) ([]JobEvent, error) {
	if limit <= 0 {
		limit = 100
	}
	return loadJobs(ctx, e.d.DB, limit)
}

// open is the node's remediation still running or waiting for an
// operator, if any.
func (e *Engine) open(ctx context.Context, node string) (*Remediation, error) {
	rs, err := loadItems(ctx, e.d.DB, `WHERE node = ? AND state NOT IN (?, ?, ?, ?)`, node,
		string(StateSuppressed), string(StateDone), string(StateFailed), string(StateCancelled))
	if err != nil || len(rs) == 0 {
		return nil, err
	}
	return &rs[0], nil
}

// Trigger starts a remediation for t, or notes t on the node's open one.
// It returns the remediation's id.
func (e *Engine) Trigger(ctx context.Context, t Trigger) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	if t.At.IsZero() {
		t.At = now
	}
	if t.Component == "" {
		t.Component = "node"
	}
	if open, err := e.open(ctx, t.Node); err != nil {
		return "", err
	} else if open != nil {
		if len(open.Notes) < maxNotes {
			open.Notes = append(open.Notes, t.At.UTC().Format(time.RFC3339)+" "+t.Reason)
			open.UpdatedAt = now
			what := ""
			if open.State == StateShadow && open.Component == t.Component {
				// What auto mode would have done: the part was back in
				// service and failed again, so the ladder climbs.
				open.ShadowRecurs++
				next := min(open.Rung+open.ShadowRecurs, len(open.Ladder)-1)
				what = fmt.Sprintf("recurred %s (%s): in auto mode it would climb to %s", t.At.UTC().Format(time.RFC3339), t.Reason, open.Ladder[next])
				open.Would = append(open.Would, what)
			}
			if err := e.save(ctx, open, now, what); err != nil {
				return "", err
			}
		}
		return open.ID, nil
	}
	n, known, err := kit.LookupNode(ctx, e.d.Fleet, t.Node)
	if err != nil {
		return "", err
	}
	if !known {
		return "", fmt.Errorf("remediation: node %s: %w", t.Node, kit.ErrUnreachable)
	}
	why := e.suppressed(ctx, n, now)
	if why != "" {
		// One record per suppressed episode, not one per result.
		last, err := loadItems(ctx, e.d.DB, `WHERE node = ? AND component = ? AND state = ?`, t.Node, t.Component, string(StateSuppressed))
		if err != nil {
			return "", err
		}
		if len(last) > 0 && last[0].Reason == why {
			return last[0].ID, nil
		}
	}
	e.seq++
	r := &Remediation{ID: fmt.Sprintf("rem-%s-%d", now.UTC().Format("20060102"), e.seq), Node: t.Node, Component: t.Component,
		Mode: e.cfg.Mode, Trigger: t, CreatedAt: now, UpdatedAt: now}
	r.Ladder = ladder(t.Component, t.Step)
	r.Rung = rung(t.Component, t.Step)
	// A fault back on the same part soon after its remediation climbs.
	prev, err := loadItems(ctx, e.d.DB, `WHERE node = ? AND component = ? AND state = ?`, t.Node, t.Component, string(StateDone))
	if err != nil {
		return "", err
	}
	if len(prev) > 0 && now.Sub(prev[0].DoneAt) <= e.cfg.RecurWindow {
		p := prev[0]
		if next := rung(t.Component, p.Step) + 1; next > r.Rung {
			r.Rung = min(next, len(r.Ladder)-1)
		}
		r.Recurs = p.ID
	}
	r.Step = r.Ladder[r.Rung]
	what := fmt.Sprintf("opened: %s on %s (%s)", r.Step, t.Component, t.Reason)
	if r.Recurs != "" {
		what += fmt.Sprintf("; recurred within %v of %s: climbed", e.cfg.RecurWindow, r.Recurs)
	}
	switch {
	case why != "":
		r.State, r.Reason, r.FinishedAt = StateSuppressed, why, now
		what += "; suppressed: " + why
	case e.cfg.Mode == ModeShadow:
		r.State, r.Reason = StateShadow, "shadow mode: recorded, not run (approve runs it)"
		r.Would = e.plan(r)
	default:
		r.State, r.DueAt = StateDraining, now
	}
	if err := e.d.DB.Tx(ctx, func(tx *sqldb.Tx) error {
		if err := insertItem(ctx, tx, r, e.seq); err != nil {
			return err
		}
		return events.Add(ctx, tx, r.ID, r.Node, now, what)
	}); err != nil {
		return "", fmt.Errorf("record remediation: %w", err)
	}
	e.log.Info().Str("node", r.Node).Str("remediation", r.ID).Str("state", string(r.State)).Str("step", r.Step).Msg(what)
	if r.State == StateDraining {
		e.wake()
	}
	return r.ID, nil
}

// plan is what a shadow remediation would do.
func (e *Engine) plan(r *Remediation) []string {
	out := []string{"drain " + r.Node + " (behind the breaker)"}
	switch r.Step {
	case StepReplace:
		out = append(out, "collect a support bundle (agent action "+e.cfg.Actions[ActionCollect]+")", "open an RMA for "+r.Component+" and keep the node drained")
	case StepReseat:
		out = append(out, "wait for hands: reseat "+r.Component+", then approve")
	default:
		a, p := e.action(r)
		out = append(out, fmt.Sprintf("run agent action %s %v (%s)", a, p, r.Step))
	}
	out = append(out, "verify: "+strings.Join(e.cfg.VerifyChecks, ", "))
	if e.cfg.VerifyAllReduce != "" {
		out = append(out, fmt.Sprintf("verify: %s within %.0f%% of the node's baseline", e.cfg.VerifyAllReduce, e.cfg.Tolerance*100))
	}
	if r.Step == StepReplace {
		return append(out, "keep the node drained until the part is replaced (approve)")
	}
	out = append(out, "return to service")
	if r.Rung+1 < len(r.Ladder) {
		out = append(out, fmt.Sprintf("if %s fails again (this step does not hold, or it recurs within %v of its return): %s",
			r.Component, e.cfg.RecurWindow, strings.Join(r.Ladder[r.Rung+1:], ", then ")))
	}
	return out
}

// suppressed says why the health path must leave the node alone, "" when not.
func (e *Engine) suppressed(ctx context.Context, n kit.Node, now time.Time) string {
	if v, ok := n.Labels[e.cfg.OptOutLabel]; ok && (v == "off" || v == "false" || v == "disabled") {
		return fmt.Sprintf("opted out (%s=%s)", e.cfg.OptOutLabel, v)
	}
	for _, w := range e.cfg.Maintenance {
		s, err := selector.Parse(w.Nodes)
		if err == nil && s.Matches(n.Name, n.Labels) && !now.Before(w.From) && now.Before(w.Until) {
			return fmt.Sprintf("maintenance window %s until %s", w.Nodes, w.Until.UTC().Format(time.RFC3339))
		}
	}
	if e.d.Campaigns != nil {
		if why, held := e.d.Campaigns.Holding(ctx, n.Name); held {
			return why
		}
	}
	if n.OutOfService {
		return "out of service already: " + n.OutOfServiceReason
	}
	return ""
}

// action is the agent action and parameters for r's step.
func (e *Engine) action(r *Remediation) (string, map[string]string) {
	return e.cfg.Action(r.Step, r.Component)
}

// Action is the agent action the engine asks for to run step on
// component (GPU3, mlx5_0/1, node), and its parameters: gpu for a GPU
// reset, hca and port for a port reset, none for the rest. The agent's
// config (examples/agent.yaml) validates them again.
func (c Config) Action(step, component string) (string, map[string]string) {
	p := map[string]string{}
	switch step {
	case StepResetGPU:
		if i, err := strconv.Atoi(strings.TrimPrefix(component, "GPU")); err == nil && strings.HasPrefix(component, "GPU") {
			p["gpu"] = strconv.Itoa(i)
		}
	case StepResetIBPort:
		if hca, port, ok := strings.Cut(component, "/"); ok {
			p["hca"], p["port"] = hca, port
		}
	}
	return c.Actions[step], p
}

// List returns remediations, newest first: all, or those of node, or
// those in state.
func (e *Engine) List(ctx context.Context, node string, state State) ([]Remediation, error) {
	where, args := []string{}, []any{}
	if node != "" {
		where, args = append(where, "node = ?"), append(args, node)
	}
	if state != "" {
		where, args = append(where, "state = ?"), append(args, string(state))
	}
	w := ""
	if len(where) > 0 {
		w = "WHERE " + strings.Join(where, " AND ")
	}
	return loadItems(ctx, e.d.DB, w, args...)
}

// Get returns one remediation with its events.
func (e *Engine) Get(ctx context.Context, id string) (Remediation, error) {
	rs, err := loadItems(ctx, e.d.DB, `WHERE id = ?`, id)
	if err != nil {
		return Remediation{}, err
	}
	if len(rs) == 0 {
		return Remediation{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	r := rs[0]
	if r.Events, err = events.List(ctx, e.d.DB, id); err != nil {
		return Remediation{}, err
	}
	return r, nil
}

// Approve runs a shadow remediation, or tells one waiting for hands
// (reseat, or replace once the part is swapped) that they are done: the
// node is then verified.
func (e *Engine) Approve(ctx context.Context, id, who string) (Remediation, error) {
	return e.operator(ctx, id, func(r *Remediation, now time.Time) (string, error) {
		switch r.State {
		case StateShadow:
			r.State, r.Mode, r.DueAt, r.Reason, r.Would = StateDraining, ModeAuto, now, "approved by "+who, nil
			return "approved by " + who + ": running", nil
		case StateAwaiting, StateRMA:
			r.State, r.DueAt, r.Attempts, r.Reason = StateVerifying, now, 0, "approved by "+who
			r.Action = &ActionRun{Step: r.Step, Action: "operator", OK: true, Message: r.Step + " done by " + who, At: now}
			return fmt.Sprintf("approved by %s: %s done, verifying", who, r.Step), nil
		}
		return "", fmt.Errorf("%w: %s is %s (approve takes shadow, awaiting or rma)", ErrState, r.ID, r.State)
	})
}

// Cancel ends a remediation that is not final; a node it drained is
// returned to service.
func (e *Engine) Cancel(ctx context.Context, id, who, reason string) (Remediation, error) {
	return e.operator(ctx, id, func(r *Remediation, now time.Time) (string, error) {
		if r.State.Final() {
			return "", fmt.Errorf("%w: %s is already %s", ErrState, r.ID, r.State)
		}
		what := fmt.Sprintf("cancelled by %s: %s", who, reason)
		if r.Drained {
			if err := e.d.Drain.Undrain(ctx, r.Node); err != nil && !errors.Is(err, drain.ErrNotOurs) {
				return "", fmt.Errorf("cancel %s: return %s to service: %w", r.ID, r.Node, err)
			}
			r.Drained = false
			what += "; node returned to service"
		}
		r.State, r.Reason, r.FinishedAt, r.DueAt = StateCancelled, what, now, time.Time{}
		return what, nil
	})
}

func (e *Engine) operator(ctx context.Context, id string, fn func(*Remediation, time.Time) (string, error)) (Remediation, error) {
	r, err := e.Get(ctx, id)
	if err != nil {
		return Remediation{}, err
	}
	// Never beside a step moving the same node: wait for it (a slow
	// agent action is bounded by action_timeout), then read again.
	if err := e.claimWait(ctx, r.Node); err != nil {
		return Remediation{}, err
	}
	defer e.release(r.Node)
	if r, err = e.Get(ctx, id); err != nil {
		return Remediation{}, err
	}
	now := e.now()
	what, err := fn(&r, now)
	if err != nil {
		return Remediation{}, err
	}
	if err := e.save(ctx, &r, now, what); err != nil {
		return Remediation{}, err
	}
	e.wake()
	return e.Get(ctx, id)
}

// save writes r and one event in one transaction.
func (e *Engine) save(ctx context.Context, r *Remediation, now time.Time, what string) error {
	r.UpdatedAt = now
	return e.d.DB.Tx(ctx, func(tx *sqldb.Tx) error {
		if err := saveItem(ctx, tx, r); err != nil {
			return err
		}
		if what == "" {
			return nil
		}
		return events.Add(ctx, tx, r.ID, r.Node, now, what)
	})
}

// NextDue is when the earliest stepped remediation is due; ok is false
// when none is.
func (e *Engine) NextDue(ctx context.Context) (time.Time, bool, error) {
	var s sql.NullString
	if err := e.d.DB.QueryRowContext(ctx, `SELECT MIN(due_at) FROM remediation_items WHERE due_at <> '' AND state IN (?, ?, ?, ?, ?)`,
		string(StateHeld), string(StateDraining), string(StateActing), string(StateVerifying), string(StateRMA)).Scan(&s); err != nil {
		return time.Time{}, false, fmt.Errorf("remediation next due: %w", err)
	}
	if !s.Valid || s.String == "" {
		return time.Time{}, false, nil
	}
	return campaigndb.ParseTime(s.String), true, nil
}

// claim marks node as being moved; false when it already is.
func (e *Engine) claim(node string) bool {
	e.movMu.Lock()
	defer e.movMu.Unlock()
	if _, busy := e.moving[node]; busy {
		return false
	}
	e.moving[node] = make(chan struct{})
	return true
}

// claimWait claims node, waiting while another mover has it.
func (e *Engine) claimWait(ctx context.Context, node string) error {
	for {
		e.movMu.Lock()
		ch, busy := e.moving[node]
		if !busy {
			e.moving[node] = make(chan struct{})
			e.movMu.Unlock()
			return nil
		}
		e.movMu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (e *Engine) release(node string) {
	e.movMu.Lock()
	ch := e.moving[node]
	delete(e.moving, node)
	e.movMu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// stillDue reads remediation id again: ok when it is still due at now
// in a state that is stepped.
func (e *Engine) stillDue(ctx context.Context, id string, now time.Time) (Remediation, bool, error) {
	rs, err := loadItems(ctx, e.d.DB, `WHERE id = ? AND due_at <> '' AND due_at <= ? AND state IN (?, ?, ?, ?, ?)`, id, campaigndb.Time(now),
		string(StateHeld), string(StateDraining), string(StateActing), string(StateVerifying), string(StateRMA))
	if err != nil || len(rs) == 0 {
		return Remediation{}, false, err
	}
	return rs[0], true, nil
}

// Step moves every due remediation on by one transition, up to Parallel
// of them at once, waits for them, and closes the rules' windows that
// have passed. It reports how many moved. Tests and the simulator drive
// it; Run does not wait for a slow one.
func (e *Engine) Step(ctx context.Context) (int, error) {
	return e.dispatch(ctx, true)
}

// dispatch starts a step for each due remediation whose node no step or
// operator is moving, oldest first, each in a slot of Parallel. With wait
// it waits for free slots and for the steps; without, it leaves what
// finds no free slot for the next round and returns at once (Run), each
// step waking Run when it ends. It reports how many started.
func (e *Engine) dispatch(ctx context.Context, wait bool) (int, error) {
	now := e.now()
	e.mu.Lock()
	vs := e.rules.Flush(now)
	e.mu.Unlock()
	err := e.verdicts(ctx, vs)
	due, lerr := loadItems(ctx, e.d.DB, `WHERE due_at <> '' AND due_at <= ? AND state IN (?, ?, ?, ?, ?)`, campaigndb.Time(now),
		string(StateHeld), string(StateDraining), string(StateActing), string(StateVerifying), string(StateRMA))
	if lerr != nil {
		return 0, errors.Join(err, lerr)
	}
	var (
		started int
		emu     sync.Mutex
		errs    []error
		steps   sync.WaitGroup
	)
	// Oldest first; the breaker's answers go in that order too (turn).
	var prev <-chan struct{}
	for i := len(due) - 1; i >= 0; i-- {
		r := due[i]
		if !e.claim(r.Node) {
			continue
		}
		// Read again under the claim: a step that ended since the list
		// was read may have moved it (its action must not run twice).
		fresh, ok, ferr := e.stillDue(ctx, r.ID, now)
		if ferr != nil || !ok {
			e.release(r.Node)
			err = errors.Join(err, ferr)
			continue
		}
		r = fresh
		if wait {
			select {
			case e.slots <- struct{}{}:
			case <-ctx.Done():
				e.release(r.Node)
				return started, errors.Join(err, ctx.Err())
			}
		} else {
			select {
			case e.slots <- struct{}{}:
			default:
				e.release(r.Node)
				continue
			}
		}
		var tn *turn
		if r.State == StateHeld || r.State == StateDraining {
			tn = &turn{prev: prev, done: make(chan struct{})}
			prev = tn.done
		}
		started++
		steps.Add(1)
		e.workers.Add(1)
		go func() {
			defer e.workers.Done()
			defer steps.Done()
			defer e.wake()
			defer e.release(r.Node)
			defer func() { <-e.slots }()
			serr := e.advance(ctx, &r, tn)
			switch {
			case serr == nil:
			case wait:
				emu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", r.ID, serr))
				emu.Unlock()
			case ctx.Err() == nil:
				e.log.Warn().Err(serr).Str("remediation", r.ID).Str("node", r.Node).Msg("remediation step")
			}
		}()
	}
	if !wait {
		return started, err
	}
	steps.Wait()
	return started, errors.Join(append(errs, err)...)
}

// Run steps the engine until ctx ends: each due remediation moves in a
// step of its own (up to Parallel at once), so a slow agent action holds
// only its own node; it looks for due work every poll, and at once when
// a step ends or an operator or trigger has work due now. It returns
// once the steps under way have ended.
func (e *Engine) Run(ctx context.Context, poll time.Duration) error {
	if poll <= 0 {
		poll = 10 * time.Second
	}
	defer e.workers.Wait()
	for {
		if _, err := e.dispatch(ctx, false); err != nil && ctx.Err() == nil {
			e.log.Warn().Err(err).Msg("remediation step")
		}
		if err := e.pause(ctx, poll); err != nil {
			return err
		}
	}
}

// pause waits poll, or less when an operator or a trigger has work due
// now (kick). On a virtual clock it sleeps (kit.Sleep), so simulated time
// moves.
func (e *Engine) pause(ctx context.Context, poll time.Duration) error {
	if _, virtual := e.d.Clock.(interface {
		Sleep(context.Context, time.Duration) error
	}); virtual {
		if err := kit.Sleep(ctx, e.d.Clock, poll); err != nil {
			return ctx.Err()
		}
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-e.kick:
	case <-e.d.Clock.After(poll):
	}
	return nil
}

// wake has Run step at once (work is due now).
func (e *Engine) wake() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}
