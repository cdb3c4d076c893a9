package burnin

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// BaselineStore is what burn-in needs of the baselines: candidates to
// compare with, and recording new versions. *baselines.Store fits.
type BaselineStore interface {
	baselines.Finder
	Get(ctx context.Context, key baselines.Key) (baselines.Baseline, error)
	Record(ctx context.Context, key baselines.Key, samples []float64, who, fromRun, note string) (baselines.Baseline, error)
}

// Options are the burn-in engine's own knobs; zero values take defaults.
type Options struct {
	// Baselines to compare with and record into (nil: a missing baseline
	// is inconclusive unless the spec says baseline.missing: peers).
	// *baselines.Store fits.
	Baselines BaselineStore
	// Poll is how long Run waits when no campaign can move (default 5s on
	// the engine's clock).
	Poll time.Duration
	// DrainTimeout bounds how long a node may take to be drained with no
	// work left on it before it is rejected as not drained (default 4h).
	DrainTimeout time.Duration
}

// Engine drives burn-in campaigns. Its methods are safe for concurrent use;
// one Run (or Step) drives campaigns at a time.
type Engine struct {
	db           *sqldb.DB
	fleet        kit.Fleet
	drain        drain.Adapter
	breaker      *kit.Breaker
	busy         *kit.Busy
	base         BaselineStore
	clock        kit.Clock
	log          zerolog.Logger
	poll         time.Duration
	drainTimeout time.Duration

	drive sync.Mutex // one driver (Run/Step) at a time
	seq   atomic.Int64
	// waits: nodes whose turn found their agent away (campaign/node).
	waits kit.ConnectWaits
}

// Defaults of the engine.
const (
	DefaultPoll         = 5 * time.Second
	DefaultDrainTimeout = 4 * time.Hour
	maxDrainAttempts    = 3
)

// New creates or upgrades the burnin_ tables and returns an engine; it
// registers its running campaigns' nodes in d.Busy and gives the breaker
// back the drains it made.
func New(ctx context.Context, d kit.Deps, opts Options) (*Engine, error) {
	d, err := d.Check("burnin engine")
	if err != nil {
		return nil, err
	}
	e := &Engine{db: d.DB, fleet: d.Fleet, drain: d.Drainer, breaker: d.Breaker, busy: d.Busy, base: opts.Baselines,
		clock: d.Clock, log: d.Logger, poll: DefaultPoll, drainTimeout: DefaultDrainTimeout}
	if opts.Poll > 0 {
		e.poll = opts.Poll
	}
	if opts.DrainTimeout > 0 {
		e.drainTimeout = opts.DrainTimeout
	}
	if err := schema.Migrate(ctx, e.db, e.clock.Now()); err != nil {
		return nil, fmt.Errorf("burnin engine: %w", err)
	}
	var maxSeq sql.NullInt64
	if err := e.db.QueryRowContext(ctx, `SELECT MAX(seq) FROM burnin_campaigns`).Scan(&maxSeq); err != nil {
		return nil, fmt.Errorf("burnin engine: %w", err)
	}
	e.seq.Store(maxSeq.Int64)
	// The breaker keeps its window in memory: give it back the drains
	// this engine made, so a restart does not reopen the window.
	recs, err := e.DrainRecords(ctx)
	if err != nil {
		return nil, fmt.Errorf("burnin engine: %w", err)
	}
	e.breaker.Restore(recs)
	e.busy.Register("burnin", e.busyNodes)
	return e, nil
}

// DrainRecords lists the drains burn-in campaigns made, for the shared
// circuit breaker (kit.Breaker.Restore).
func (e *Engine) DrainRecords(ctx context.Context) ([]kit.DrainRecord, error) {
	rows, err := e.db.QueryContext(ctx, `SELECT node, campaign_id, drained_at FROM burnin_nodes WHERE drained_by_us = 1 AND drained_at != ''`)
	if err != nil {
		return nil, fmt.Errorf("drain records: %w", err)
	}
	defer rows.Close()
	var out []kit.DrainRecord
	for rows.Next() {
		var r kit.DrainRecord
		var at string
		if err := rows.Scan(&r.Node, &r.Campaign, &at); err != nil {
			return nil, fmt.Errorf("drain records: %w", err)
		}
		r.At = campaigndb.ParseTime(at)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("drain records: %w", err)
	}
	return out, nil
}

// tag starts every drain reason this campaign writes; drain.Owns compares
// it before a node is returned to service.
func tag(id string) string { return drain.Reason("burnin " + id) }

// ErrBusy: a selected node is already under a running burn-in.
var ErrBusy = errors.New("node already in a running burn-in campaign")

// Start validates the spec, selects the nodes and writes the campaign with
// its whole single-node plan. Nothing is drained until Run or Step.
func (e *Engine) Start(ctx context.Context, in *Spec) (string, error) {
	if in == nil {
		return "", fmt.Errorf("%w: no spec", ErrInvalidSpec)
	}
	spec := in.clone()
	if err := spec.Normalize(); err != nil {
		return "", err
	}
	nodes, err := e.fleet.Nodes(ctx, spec.Selector)
	if err != nil {
		return "", fmt.Errorf("start burn-in: select nodes: %w", err)
	}
	if len(nodes) == 0 {
		return "", fmt.Errorf("start burn-in: %w: %q", ErrNoNodes, spec.Selector)
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	for _, n := range nodes {
		if err := drain.CheckNode(n.Name); err != nil {
			return "", fmt.Errorf("start burn-in: %w", err)
		}
	}

	var id string
	err = e.busy.Claim(ctx, func(busy map[string]string) error {
		var clash []string
		for _, n := range nodes {
			if who, ok := busy[n.Name]; ok {
				clash = append(clash, n.Name+" ("+who+")")
			}
		}
		if len(clash) > 0 {
			return fmt.Errorf("start burn-in: %w: %s", ErrBusy, strings.Join(clash, ", "))
		}
		var err error
		id, err = e.create(ctx, spec, nodes)
		return err
	})
	if err != nil {
		return "", err
	}
	e.log.Info().Str("campaign", id).Int("nodes", len(nodes)).Str("level", string(spec.Level)).Msg("burn-in started")
	return id, nil
}

// create writes a new campaign with its nodes and single-node plan.
func (e *Engine) create(ctx context.Context, spec *Spec, nodes []kit.Node) (string, error) {
	now := e.clock.Now()
	id := kit.NewID("b", now)
	seq := e.seq.Add(1)
	name := spec.Name
	if name == "" {
		name = id
	}
	var single []Step
	for _, st := range spec.Suite.Steps {
		if st.Kind != StepPairs {
			single = append(single, st)
		}
	}
	err := e.db.Tx(ctx, func(tx *sqldb.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO burnin_campaigns (`+campaignCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?, '')`,
			id, seq, name, campaigndb.JSON(spec), string(StateRunning), string(PhaseNodes), "", campaigndb.Time(now), campaigndb.Time(now)); err != nil {
			return fmt.Errorf("write campaign: %w", err)
		}
		runSeq := 0
		for _, n := range nodes {
			sku := spec.Baseline.SKU
			if sku == "" {
				sku = baselines.SKUFromInventory(n.Inventory, n.Labels)
			}
			labels := n.Labels
			if labels == nil {
				labels = map[string]string{}
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO burnin_nodes (campaign_id, `+nodeCols+`, since) VALUES (?, ?, ?, 0, 0, ?, ?, ?, '', '', 0, '', ?, ?)`,
				id, n.Name, string(NodePending), campaigndb.JSON(labels), campaigndb.JSON(n.Inventory), sku, campaigndb.Time(now), campaigndb.Time(now)); err != nil {
				return fmt.Errorf("write node %s: %w", n.Name, err)
			}
			for rep := 1; rep <= spec.Repeats; rep++ {
				for _, st := range single {
					runSeq++
					if err := insertRun(ctx, tx, id, Run{Seq: runSeq, Node: n.Name, Repeat: rep, Step: st.Name, Kind: st.Kind}); err != nil {
						return err
					}
				}
			}
		}
		return events.Add(ctx, tx, id, "", now, fmt.Sprintf("started: %d nodes, level %s, suite %s, %d repeats", len(nodes), spec.Level, spec.Suite.Name, spec.Repeats))
	})
	if err != nil {
		return "", fmt.Errorf("start burn-in: %w", err)
	}
	return id, nil
}

// busyNodes lists the nodes of running campaigns, for kit.Busy.
func (e *Engine) busyNodes(ctx context.Context) (map[string]string, error) {
	return campaigndb.Held(ctx, e.db, "burnin", `SELECT n.node, n.campaign_id FROM burnin_nodes n
		JOIN burnin_campaigns c ON c.id = n.campaign_id WHERE c.state = ?`, string(StateRunning))
}

// Cancel stops a running campaign. Nodes keep their drain: a burn-in that
// did not finish never returns unproven nodes to service.
func (e *Engine) Cancel(ctx context.Context, id, reason string) error {
	now := e.clock.Now()
	n, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_campaigns SET state = ?, reason = ?, updated_at = ?, finished_at = ? WHERE id = ? AND state = ?`,
		string(StateCancelled), reason, campaigndb.Time(now), campaigndb.Time(now), id, string(StateRunning))
	if err != nil {
		return fmt.Errorf("cancel %s: %w", id, err)
	}
	if n == 0 {
		if _, err := getCampaign(ctx, e.db, id); err != nil {
			return err
		}
		return fmt.Errorf("cancel %s: %w", id, ErrFinished)
	}
	if err := events.Record(ctx, e.db, id, "", now, "cancelled: "+reason); err != nil {
		return err
	}
	e.log.Info().Str("campaign", id).Str("reason", reason).Msg("burn-in cancelled")
	return nil
}

// Run drives every running campaign until ctx ends, and returns ctx's error.
// Work cut short by the end is redone by the next Run (a run written as
// running is run again), so stopping the coordinator at any moment is safe.
func (e *Engine) Run(ctx context.Context) error {
	for {
		progressed, err := e.advanceAll(ctx, false)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			e.log.Error().Err(err).Msg("burn-in step")
		}
		if !progressed {
			if err := kit.Sleep(ctx, e.clock, e.poll); err != nil {
				return ctx.Err()
			}
		}
	}
}

// Step moves every running campaign by one unit of work per node (one
// drain attempt or one run; one pair round; the verdicts; the finishing
// of each node) and reports whether anything moved. Tests and tools use
// it to stop at a chosen point; Run is the production driver.
func (e *Engine) Step(ctx context.Context) (bool, error) {
	return e.advanceAll(ctx, true)
}

// running reports whether a campaign is still running (not cancelled):
// checked before each run, so a cancel stops work at the next unit.
func (e *Engine) running(ctx context.Context, id string) (bool, error) {
	var st string
	if err := e.db.QueryRowContext(ctx, `SELECT state FROM burnin_campaigns WHERE id = ?`, id).Scan(&st); err != nil {
		return false, fmt.Errorf("campaign %s: %w", id, err)
	}
	return State(st) == StateRunning, nil
}

// Done reports whether no campaign is running.
func (e *Engine) Done(ctx context.Context) (bool, error) {
	var n int
	if err := e.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM burnin_campaigns WHERE state = ?`, string(StateRunning)).Scan(&n); err != nil {
		return false, fmt.Errorf("running campaigns: %w", err)
	}
	return n == 0, nil
}

func (e *Engine) advanceAll(ctx context.Context, oneUnit bool) (bool, error) {
	e.drive.Lock()
	defer e.drive.Unlock()
	cs, err := listCampaigns(ctx, e.db, `WHERE state = ?`, string(StateRunning))
	if err != nil {
		return false, err
	}
	progressed := false
	var errs []error
	for _, c := range cs {
		p, err := e.advance(ctx, c, oneUnit)
		progressed = progressed || p
		if err != nil {
			errs = append(errs, fmt.Errorf("campaign %s: %w", c.ID, err))
		}
	}
	return progressed, errors.Join(errs...)
}

// advance moves one campaign; in Run mode (oneUnit false) it goes as far
// as it can.
func (e *Engine) advance(ctx context.Context, c campaignRow, oneUnit bool) (bool, error) {
	progressed := false
	for {
		var p bool
		var err error
		switch c.Phase {
		case PhaseNodes:
			p, err = e.phaseNodes(ctx, c, oneUnit)
		case PhasePairs:
			p, err = e.phasePairs(ctx, c, oneUnit)
		case PhaseEvaluate:
			p, err = e.phaseEvaluate(ctx, c)
		case PhaseFinish:
			p, err = e.phaseFinish(ctx, c)
		default:
			return progressed, nil
		}
		progressed = progressed || p
		if err != nil || ctx.Err() != nil {
			return progressed, err
		}
		next, gerr := getCampaign(ctx, e.db, c.ID)
		if gerr != nil {
			return progressed, gerr
		}
		moved := next.Phase != c.Phase
		c = next
		if c.State != StateRunning || !moved || (oneUnit && p) {
			return progressed, nil
		}
	}
}

// setPhase writes a phase change (and its side writes, in the same
// transaction) before the next phase is acted on.
func (e *Engine) setPhase(ctx context.Context, c campaignRow, to Phase, what string, more func(tx *sqldb.Tx) error) error {
	now := e.clock.Now()
	state, finished := StateRunning, ""
	if to == PhaseDone {
		state, finished = StateDone, campaigndb.Time(now)
	}
	moved := false
	err := e.db.Tx(ctx, func(tx *sqldb.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE burnin_campaigns SET phase = ?, state = ?, updated_at = ?, finished_at = ? WHERE id = ? AND phase = ? AND state = ?`,
			string(to), string(state), campaigndb.Time(now), finished, c.ID, string(c.Phase), string(StateRunning))
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return nil // cancelled meanwhile: leave it
		}
		moved = true
		if more != nil {
			if err := more(tx); err != nil {
				return err
			}
		}
		return events.Add(ctx, tx, c.ID, "", now, what)
	})
	if err != nil {
		return fmt.Errorf("phase %s: %w", to, err)
	}
	if !moved {
		return nil
	}
	e.log.Info().Str("campaign", c.ID).Str("phase", string(to)).Msg(what)
	return nil
}

// pool runs work(i) for i in [0, n) on at most size goroutines; each
// goroutine takes part in a virtual clock for its whole life, so simulated
// time moves only while all of them wait on it.
func (e *Engine) pool(n, size int, work func(i int)) {
	if n == 0 {
		return
	}
	size = min(size, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	wg.Add(size)
	for range size {
		kit.Go(e.clock, func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				work(i)
			}
		})
	}
	wg.Wait()
}

// ---- phase: nodes (drain, single-node steps) ----

func (e *Engine) phaseNodes(ctx context.Context, c campaignRow, oneUnit bool) (bool, error) {
	nodes, err := listNodes(ctx, e.db, c.ID)
	if err != nil {
		return false, err
	}
	var active []nodeRow
	for _, n := range nodes {
		switch n.State {
		case NodePending, NodeDraining, NodeTesting:
			active = append(active, n)
		}
	}
	if len(active) == 0 {
		return true, e.afterNodes(ctx, c, nodes)
	}
	steps := map[string]Step{}
	for _, st := range c.Spec.Suite.Steps {
		steps[st.Name] = st
	}
	// One listing per step: the breaker's share is of the whole fleet, and
	// a node it shows connected needs no question of its own when its turn
	// comes within freshListing of it.
	all, err := e.fleet.Nodes(ctx, "")
	if err != nil {
		return false, fmt.Errorf("list the fleet: %w", err)
	}
	fleetSize, listedAt := len(all), e.clock.Now()
	connected := make(map[string]bool, len(all))
	for _, n := range all {
		connected[n.Name] = n.Connected
	}
	var moved atomic.Bool
	var mu sync.Mutex
	var errs []error
	e.pool(len(active), c.Spec.Concurrency, func(i int) {
		listed := connected[active[i].Node] && e.clock.Now().Sub(listedAt) < freshListing
		p, err := e.nodeWork(ctx, c, active[i], steps, fleetSize, listed, oneUnit)
		if p {
			moved.Store(true)
		}
		if err != nil && ctx.Err() == nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	})
	return moved.Load(), errors.Join(errs...)
}

// freshListing is how old the step's fleet listing may be for a node's
// turn to trust it; an older one is asked again, node by node.
const freshListing = 2 * time.Second

// nodeWork advances one node: drain, then its runs in order. listed says
// the step's fresh listing showed its agent connected.
func (e *Engine) nodeWork(ctx context.Context, c campaignRow, n nodeRow, steps map[string]Step, fleetSize int, listed, oneUnit bool) (bool, error) {
	log := e.log.With().Str("campaign", c.ID).Str("node", n.Node).Logger()
	progressed := false
	if !listed || !e.waits.Since(c.ID+"/"+n.Node).IsZero() {
		if wait, err := e.awaitAgent(ctx, c, n, log); err != nil || wait {
			return false, err
		}
	}
	if n.State == NodePending || n.State == NodeDraining {
		st, err := e.drainNode(ctx, c, n, fleetSize, log)
		if err != nil || st == n.State {
			return false, err
		}
		progressed = true
		if st != NodeTesting || oneUnit {
			return true, nil
		}
	}
	runs, err := listRuns(ctx, e.db, c.ID, false, `AND node = ? AND state != ?`, n.Node, RunDone)
	if err != nil {
		return progressed, err
	}
	for _, r := range runs {
		if ctx.Err() != nil {
			return progressed, nil
		}
		if running, err := e.running(ctx, c.ID); err != nil || !running {
			return progressed, err
		}
		if progressed {
			// Each run is a turn: is the agent there now?
			if wait, err := e.awaitAgent(ctx, c, n, log); err != nil || wait {
				return progressed, err
			}
		}
		if err := e.execute(ctx, c, r, steps[r.Step], log); err != nil {
			return progressed, err
		}
		progressed = true
		if oneUnit {
			if len(runs) > 1 {
				return true, nil
			}
			break
		}
	}
	if ctx.Err() != nil {
		return progressed, nil
	}
	return true, e.setNodeState(ctx, c.ID, n.Node, NodeTested, "", "single-node steps done")
}

// awaitAgent asks the fleet now whether the node's agent is connected.
// When it is not, the node waits (its note says so, for status) until
// the spec's connect grace is over; then a node not yet drained is
// rejected untested as inconclusive, and a node under test goes on, so
// that its next run records the agent unreachable (inconclusive too). It
// reports whether the node is to wait.
func (e *Engine) awaitAgent(ctx context.Context, c campaignRow, n nodeRow, log zerolog.Logger) (bool, error) {
	key := c.ID + "/" + n.Node
	cn, known, err := kit.LookupNode(ctx, e.fleet, n.Node)
	if err != nil {
		return true, err
	}
	if known && cn.Connected {
		if !e.waits.Since(key).IsZero() {
			e.waits.Done(key)
			log.Info().Msg("agent back: node goes on")
			now := e.clock.Now()
			if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_nodes SET note = '', updated_at = ? WHERE campaign_id = ? AND node = ? AND note LIKE 'waiting for the agent%'`,
				campaigndb.Time(now), c.ID, n.Node); err != nil {
				return true, fmt.Errorf("node %s: %w", n.Node, err)
			}
			return false, events.Record(ctx, e.db, c.ID, n.Node, now, "agent reconnected: going on")
		}
		return false, nil
	}
	now, grace := e.clock.Now(), c.Spec.connectGrace()
	since, over := e.waits.Wait(key, now, grace)
	if !over {
		note := kit.WaitingNote(since, grace)
		if note == n.Note {
			return true, nil
		}
		if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_nodes SET note = ?, updated_at = ? WHERE campaign_id = ? AND node = ?`,
			note, campaigndb.Time(now), c.ID, n.Node); err != nil {
			return true, fmt.Errorf("node %s: %w", n.Node, err)
		}
		log.Info().Dur("grace_ms", grace).Msg("agent not connected at the node's turn: waiting")
		return true, events.Record(ctx, e.db, c.ID, n.Node, now, fmt.Sprintf("agent not connected at its turn: waiting up to %v", grace))
	}
	e.waits.Done(key)
	if n.State != NodePending {
		return false, nil
	}
	return true, e.rejectUntested(ctx, c.ID, n.Node, ReasonInconclusive, kit.GaveUpNote(grace))
}

func (e *Engine) setNodeState(ctx context.Context, id, node string, st NodeState, note, what string) error {
	now := e.clock.Now()
	if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_nodes SET state = ?, note = ?, updated_at = ?, since = ? WHERE campaign_id = ? AND node = ?`,
		string(st), note, campaigndb.Time(now), campaigndb.Time(now), id, node); err != nil {
		return fmt.Errorf("node %s: state %s: %w", node, st, err)
	}
	if what != "" {
		return events.Record(ctx, e.db, id, node, now, what)
	}
	return nil
}

// drainNode makes one attempt at taking the node out of service and
// returns its new state. A node already drained by someone else is
// tested as it is (it is out of service) and is never returned to
// service by the campaign.
func (e *Engine) drainNode(ctx context.Context, c campaignRow, n nodeRow, fleetSize int, log zerolog.Logger) (NodeState, error) {
	now := e.clock.Now()
	st, err := e.drain.Status(ctx, n.Node)
	if err != nil {
		return n.State, e.drainTrouble(ctx, c, n, fmt.Sprintf("read drain status: %v", err))
	}
	mine := drain.Owns(st, tag(c.ID))
	if st.Drained && !mine && n.State == NodePending {
		// Out of service already, not by us: test it, never undrain it.
		if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_nodes SET state = ?, drained_by_us = 0, note = ?, updated_at = ?, since = ? WHERE campaign_id = ? AND node = ?`,
			string(NodeTesting), "already out of service: "+st.Reason, campaigndb.Time(now), campaigndb.Time(now), c.ID, n.Node); err != nil {
			return n.State, fmt.Errorf("node %s: %w", n.Node, err)
		}
		log.Info().Str("reason", st.Reason).Msg("node already drained by someone else; testing it as it is")
		return NodeTesting, events.Record(ctx, e.db, c.ID, n.Node, now, "already out of service ("+st.Reason+"): tested as it is, never returned to service by this campaign")
	}
	if !st.Drained {
		if n.State == NodePending && e.breaker != nil {
			if err := e.breaker.Allow(c.ID, n.Node, fleetSize); err != nil {
				note := "waiting for the drain circuit breaker: " + err.Error()
				if note != n.Note {
					if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_nodes SET note = ?, updated_at = ? WHERE campaign_id = ? AND node = ?`,
						note, campaigndb.Time(now), c.ID, n.Node); err != nil {
						return n.State, fmt.Errorf("node %s: %w", n.Node, err)
					}
				}
				return n.State, nil
			}
		}
		// Written before the adapter is called: a restart finds the node
		// draining and asks again (Drain is idempotent) rather than
		// forgetting it took it out.
		if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_nodes SET state = ?, drained_by_us = 1, attempts = attempts + 1, note = ?, updated_at = ?, drained_at = ?, since = CASE WHEN state = ? THEN since ELSE ? END WHERE campaign_id = ? AND node = ?`,
			string(NodeDraining), "draining", campaigndb.Time(now), campaigndb.Time(now), string(NodeDraining), campaigndb.Time(now), c.ID, n.Node); err != nil {
			e.breaker.Release(c.ID, n.Node)
			return n.State, fmt.Errorf("node %s: %w", n.Node, err)
		}
		n.Attempts++
		if err := e.drain.Drain(ctx, n.Node, tag(c.ID)+": acceptance testing"); err != nil {
			if errors.Is(err, drain.ErrNotOurs) {
				e.breaker.Release(c.ID, n.Node)
				if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_nodes SET state = ?, drained_by_us = 0, drained_at = '' WHERE campaign_id = ? AND node = ?`,
					string(NodePending), c.ID, n.Node); err != nil {
					return n.State, fmt.Errorf("node %s: %w", n.Node, err)
				}
				return e.drainNode(ctx, c, nodeRow{Node: n.Node, State: NodePending, Attempts: n.Attempts}, fleetSize, log)
			}
			return NodeDraining, e.drainTrouble(ctx, c, n, "drain: "+err.Error())
		}
		if st, err = e.drain.Status(ctx, n.Node); err != nil {
			return NodeDraining, e.drainTrouble(ctx, c, n, fmt.Sprintf("read drain status: %v", err))
		}
	} else if n.State == NodePending {
		// Ours from before a restart.
		if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_nodes SET state = ?, drained_by_us = 1, updated_at = ?, since = ? WHERE campaign_id = ? AND node = ?`,
			string(NodeDraining), campaigndb.Time(now), campaigndb.Time(now), c.ID, n.Node); err != nil {
			return n.State, fmt.Errorf("node %s: %w", n.Node, err)
		}
	}
	if st.RunningJobs > 0 {
		since := e.nodeSince(ctx, c.ID, n.Node)
		if !since.IsZero() && now.Sub(since) > e.drainTimeout {
			return NodeTested, e.rejectEarly(ctx, c.ID, n.Node, fmt.Sprintf("%d jobs still running after %s of draining", st.RunningJobs, e.drainTimeout))
		}
		note := fmt.Sprintf("drained, waiting for %d running jobs to leave", st.RunningJobs)
		if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_nodes SET state = ?, note = ?, updated_at = ? WHERE campaign_id = ? AND node = ?`,
			string(NodeDraining), note, campaigndb.Time(now), c.ID, n.Node); err != nil {
			return n.State, fmt.Errorf("node %s: %w", n.Node, err)
		}
		return NodeDraining, nil
	}
	if err := e.setNodeState(ctx, c.ID, n.Node, NodeTesting, "", "drained; testing"); err != nil {
		return n.State, err
	}
	log.Debug().Msg("drained")
	return NodeTesting, nil
}

func (e *Engine) nodeSince(ctx context.Context, id, node string) time.Time {
	var s string
	if err := e.db.QueryRowContext(ctx, `SELECT since FROM burnin_nodes WHERE campaign_id = ? AND node = ?`, id, node).Scan(&s); err != nil {
		return time.Time{}
	}
	return campaigndb.ParseTime(s)
}

// drainTrouble records a failed drain attempt; after maxDrainAttempts the
// node is rejected as not drained (it was never tested).
func (e *Engine) drainTrouble(ctx context.Context, c campaignRow, n nodeRow, msg string) error {
	e.log.Warn().Str("campaign", c.ID).Str("node", n.Node).Str("problem", msg).Msg("drain attempt failed")
	if n.Attempts >= maxDrainAttempts {
		return e.rejectEarly(ctx, c.ID, n.Node, fmt.Sprintf("%s (after %d attempts)", msg, n.Attempts))
	}
	now := e.clock.Now()
	if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_nodes SET note = ?, updated_at = ? WHERE campaign_id = ? AND node = ?`,
		msg, campaigndb.Time(now), c.ID, n.Node); err != nil {
		return fmt.Errorf("node %s: %w", n.Node, err)
	}
	return nil
}

// rejectEarly ends a node's testing before it began: the verdict will
// reject it with this reason.
func (e *Engine) rejectEarly(ctx context.Context, id, node, msg string) error {
	return e.rejectUntested(ctx, id, node, ReasonNotDrained, msg)
}

// rejectUntested ends a node's testing before it began, with a reason code.
func (e *Engine) rejectUntested(ctx context.Context, id, node, code, msg string) error {
	ev := Evidence{Reasons: []Reason{{Code: code, Message: "not tested: " + msg}}}
	now := e.clock.Now()
	if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_nodes SET state = ?, evidence = ?, note = ?, updated_at = ?, since = ? WHERE campaign_id = ? AND node = ?`,
		string(NodeTested), campaigndb.JSON(ev), msg, campaigndb.Time(now), campaigndb.Time(now), id, node); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	return events.Record(ctx, e.db, id, node, now, "not tested: "+msg)
}

// afterNodes leaves the nodes phase: to pairs when the suite has a pairs
// step and two nodes can take part, else to the verdicts.
func (e *Engine) afterNodes(ctx context.Context, c campaignRow, nodes []nodeRow) error {
	var pairSteps []Step
	for _, st := range c.Spec.Suite.Steps {
		if st.Kind == StepPairs {
			pairSteps = append(pairSteps, st)
		}
	}
	if len(pairSteps) == 0 {
		return e.setPhase(ctx, c, PhaseEvaluate, "single-node steps done on every node", nil)
	}
	eligible, err := e.pairEligible(ctx, c, nodes)
	if err != nil {
		return err
	}
	if len(eligible) < 2 {
		return e.setPhase(ctx, c, PhaseEvaluate, fmt.Sprintf("pairs skipped: %d node(s) fit to take part", len(eligible)), nil)
	}
	var maxSeq int
	if err := e.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM burnin_runs WHERE campaign_id = ?`, c.ID).Scan(&maxSeq); err != nil {
		return fmt.Errorf("plan pairs: %w", err)
	}
	var plan []Run
	round := 0
	for rep := 1; rep <= c.Spec.Repeats; rep++ {
		for _, st := range pairSteps {
			for r := range st.Rounds {
				round++
				for _, p := range pairRound(eligible, r) {
					maxSeq++
					plan = append(plan, Run{Seq: maxSeq, Node: p[0], Peers: []string{p[1]}, Repeat: rep, Step: st.Name, Kind: StepPairs, Round: round})
				}
			}
		}
	}
	return e.setPhase(ctx, c, PhasePairs, fmt.Sprintf("pairs: %d runs over %d nodes", len(plan), len(eligible)), func(tx *sqldb.Tx) error {
		for _, r := range plan {
			if err := insertRun(ctx, tx, c.ID, r); err != nil {
				return err
			}
		}
		return nil
	})
}

// pairEligible are the nodes whose single-node runs all came back without
// a failure: a node already certain to be rejected would only make its
// partners look bad.
func (e *Engine) pairEligible(ctx context.Context, c campaignRow, nodes []nodeRow) ([]string, error) {
	runs, err := listRuns(ctx, e.db, c.ID, false, "")
	if err != nil {
		return nil, err
	}
	bad := map[string]bool{}
	for _, r := range runs {
		if r.Outcome != OutcomeOK || r.Status == report.Fail || r.Status == report.Error {
			bad[r.Node] = true
		}
	}
	var out []string
	for _, n := range nodes {
		if n.Evidence == nil && !bad[n.Node] {
			out = append(out, n.Node)
		}
	}
	return out, nil
}

// pairRound pairs nodes for round r by the circle method: every round
// gives each node a different partner; with an odd count one node sits
// the round out.
func pairRound(nodes []string, r int) [][2]string {
	list := slices.Clone(nodes)
	if len(list)%2 == 1 {
		list = append(list, "")
	}
	n := len(list)
	// Rotate all but the first by r.
	rot := make([]string, n)
	rot[0] = list[0]
	for i := 1; i < n; i++ {
		rot[i] = list[1+(i-1+r)%(n-1)]
	}
	var out [][2]string
	for i := range n / 2 {
		a, b := rot[i], rot[n-1-i]
		if a == "" || b == "" {
			continue
		}
		if b < a {
			a, b = b, a
		}
		out = append(out, [2]string{a, b})
	}
	return out
}

// ---- phase: pairs ----

func (e *Engine) phasePairs(ctx context.Context, c campaignRow, oneUnit bool) (bool, error) {
	steps := map[string]Step{}
	for _, st := range c.Spec.Suite.Steps {
		steps[st.Name] = st
	}
	progressed := false
	for {
		runs, err := listRuns(ctx, e.db, c.ID, false, `AND kind = ? AND state != ?`, string(StepPairs), RunDone)
		if err != nil {
			return progressed, err
		}
		if len(runs) == 0 {
			return true, e.setPhase(ctx, c, PhaseEvaluate, "pair rounds done", nil)
		}
		round := runs[0].Round
		var batch []Run
		for _, r := range runs {
			if r.Round == round {
				batch = append(batch, r)
			}
		}
		var mu sync.Mutex
		var errs []error
		e.pool(len(batch), c.Spec.Concurrency, func(i int) {
			r := batch[i]
			log := e.log.With().Str("campaign", c.ID).Str("node", r.Node).Str("peer", strings.Join(r.Peers, ",")).Logger()
			if err := e.execute(ctx, c, r, steps[r.Step], log); err != nil && ctx.Err() == nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
		progressed = true
		if err := errors.Join(errs...); err != nil || ctx.Err() != nil || oneUnit {
			return progressed, err
		}
		if running, err := e.running(ctx, c.ID); err != nil || !running {
			return progressed, err
		}
	}
}

// ---- runs ----

// execute runs one unit: it writes the run as running, asks the fleet,
// and writes the result. When ctx ends during the call nothing more is
// written: the run stays "running" and is run again on resume.
func (e *Engine) execute(ctx context.Context, c campaignRow, r Run, st Step, log zerolog.Logger) error {
	start := e.clock.Now()
	if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_runs SET state = ?, attempts = attempts + 1, started_at = ? WHERE campaign_id = ? AND seq = ?`,
		RunRunning, campaigndb.Time(start), c.ID, r.Seq); err != nil {
		return fmt.Errorf("run %d: %w", r.Seq, err)
	}
	// A run sent again after a restart keeps its action id: the agent then
	// answers the action it still runs instead of refusing a second one.
	opts := kit.RunOptions{Timeout: time.Duration(st.Timeout), Params: st.Params, ID: fmt.Sprintf("%s.run%d", c.ID, r.Seq)}
	var res RunResult
	var status report.Status
	var callErr error
	switch r.Kind {
	case StepChecks:
		var rep *report.Report
		rep, callErr = e.fleet.RunChecks(ctx, r.Node, st.Checks, opts)
		if callErr == nil {
			res.Report, status = rep, rep.Status
			res.Metrics = pick(rep, c.Spec.Metrics, false)
		}
	case StepPairs:
		var rep *report.Report
		rep, callErr = e.fleet.RunMulti(ctx, r.Members(), st.Checks[0], opts)
		if callErr == nil {
			res.Report, status = rep, rep.Status
			res.Metrics = pick(rep, c.Spec.Metrics, true)
		}
	case StepAction:
		var ar kit.ActionResult
		ar, res.Samples, callErr = e.action(ctx, r.Node, st, opts)
		if callErr == nil {
			res.Action = &ar
			status = report.Pass
			if !ar.OK {
				status = report.Fail
			}
			res.Metrics = ParseActionMetrics(ar.Output)
			for _, s := range res.Samples {
				status = report.Worse(status, s.Status)
			}
		}
	default:
		callErr = fmt.Errorf("unknown step kind %q", r.Kind)
	}
	if ctx.Err() != nil {
		return nil
	}
	outcome, errText := OutcomeOK, ""
	if callErr != nil {
		outcome, errText, status = classify(callErr), callErr.Error(), report.Error
		log.Warn().Err(callErr).Str("step", r.Step).Msg("run did not complete")
	}
	now := e.clock.Now()
	err := e.db.Tx(ctx, func(tx *sqldb.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE burnin_runs SET state = ?, status = ?, outcome = ?, error = ?, finished_at = ?, result = ? WHERE campaign_id = ? AND seq = ?`,
			RunDone, string(status), outcome, errText, campaigndb.Time(now), campaigndb.JSON(res), c.ID, r.Seq); err != nil {
			return err
		}
		// The agent's own inventory beats what the coordinator knew at
		// start (serials, HCAs): keep the latest full one.
		if res.Report != nil && len(res.Report.Inventory.GPUs) > 0 && r.Kind == StepChecks {
			if _, err := tx.ExecContext(ctx, `UPDATE burnin_nodes SET inventory = ? WHERE campaign_id = ? AND node = ?`,
				campaigndb.JSON(res.Report.Inventory), c.ID, r.Node); err != nil {
				return fmt.Errorf("inventory: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("run %d: %w", r.Seq, err)
	}
	log.Debug().Str("step", r.Step).Int("repeat", r.Repeat).Str("status", string(status)).Msg("run done")
	return nil
}

// action runs an agent action and, when the step asks, polls the sample
// checks while it runs (temperatures during stress).
func (e *Engine) action(ctx context.Context, node string, st Step, opts kit.RunOptions) (kit.ActionResult, []Sample, error) {
	if len(st.SampleChecks) == 0 {
		ar, err := e.fleet.RunAction(ctx, node, st.Action, st.Params, opts)
		return ar, nil, err
	}
	sctx, stop := context.WithCancel(ctx)
	var samples []Sample
	var wg sync.WaitGroup
	wg.Add(1)
	kit.Go(e.clock, func() {
		defer wg.Done()
		every := time.Duration(st.SampleEvery)
		for {
			if err := kit.Sleep(sctx, e.clock, every); err != nil {
				return
			}
			rep, err := e.fleet.RunChecks(sctx, node, st.SampleChecks, kit.RunOptions{Timeout: every})
			if sctx.Err() != nil {
				return
			}
			s := Sample{At: e.clock.Now()}
			if err != nil {
				s.Error = err.Error()
			} else {
				s.Status = rep.Status
				for _, cr := range rep.Checks {
					for k, v := range cr.Metrics {
						if s.Metrics == nil {
							s.Metrics = map[string]float64{}
						}
						s.Metrics[k] = v
					}
					s.Findings = append(s.Findings, cr.Findings...)
				}
			}
			samples = append(samples, s)
		}
	})
	ar, err := e.fleet.RunAction(ctx, node, st.Action, st.Params, opts)
	stop()
	wg.Wait()
	return ar, samples, err
}

// pick keeps the compared metrics a report carries; a pair's numbers are
// named nccl.allreduce2.* (the baselines package's 2-node name).
func pick(rep *report.Report, metrics []Metric, pair bool) map[string]float64 {
	want := map[string]bool{}
	for _, m := range metrics {
		want[m.Name] = true
	}
	out := map[string]float64{}
	for _, c := range rep.Checks {
		for k, v := range c.Metrics {
			if pair {
				if rest, ok := strings.CutPrefix(k, "nccl.allreduce."); ok {
					k = "nccl.allreduce2." + rest
				}
			}
			if want[k] && finite(v) {
				out[k] = v
			}
		}
	}
	return out
}

// classify names why a run did not come back.
func classify(err error) string {
	switch {
	case errors.Is(err, kit.ErrUnreachable):
		return OutcomeUnreachable
	case errors.Is(err, kit.ErrRefused):
		return OutcomeRefused
	case errors.Is(err, kit.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return OutcomeTimeout
	default:
		return OutcomeError
	}
}
