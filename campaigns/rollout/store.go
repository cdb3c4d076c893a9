package rollout

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// ErrSchemaTooNew: the rollout tables were written by a newer fleetcheck.
var ErrSchemaTooNew = campaigndb.ErrSchemaTooNew

// Every table is prefixed rollout_ and sits in the coordinator's database
// beside its own. Version 2 stores times as campaigndb's text (version 1
// had unix milliseconds).
const currentSchema = `
CREATE TABLE IF NOT EXISTS rollout_runs (
	id           TEXT PRIMARY KEY,
	name         TEXT NOT NULL DEFAULT '',
	spec         TEXT NOT NULL,
	plan         TEXT NOT NULL,
	phase        TEXT NOT NULL,
	wave         INTEGER NOT NULL DEFAULT 0,
	paused       INTEGER NOT NULL DEFAULT 0,
	paused_at    TEXT NOT NULL DEFAULT '',
	pause_reason TEXT NOT NULL DEFAULT '',
	soak_until   TEXT NOT NULL DEFAULT '',
	accepted     INTEGER NOT NULL DEFAULT 0,
	halt_reason  TEXT NOT NULL DEFAULT '',
	evidence     TEXT NOT NULL DEFAULT '[]',
	created      TEXT NOT NULL,
	updated      TEXT NOT NULL,
	finished     TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS rollout_nodes (
	rollout       TEXT NOT NULL,
	node          TEXT NOT NULL,
	wave          INTEGER NOT NULL,
	seq           INTEGER NOT NULL,
	state         TEXT NOT NULL,
	since         TEXT NOT NULL,
	deadline      TEXT NOT NULL DEFAULT '',
	op            TEXT NOT NULL DEFAULT 'upgrade',
	from_driver   TEXT NOT NULL DEFAULT '',
	drained_by_us INTEGER NOT NULL DEFAULT 0,
	drained_at    TEXT NOT NULL DEFAULT '',
	after_undrain TEXT NOT NULL DEFAULT '',
	baseline      REAL NOT NULL DEFAULT 0,
	baseline_from TEXT NOT NULL DEFAULT '',
	pre           TEXT NOT NULL DEFAULT '',
	hold          TEXT NOT NULL DEFAULT '',
	reason        TEXT NOT NULL DEFAULT '',
	evidence      TEXT NOT NULL DEFAULT '[]',
	upgrades      INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (rollout, node)
);
CREATE TABLE IF NOT EXISTS rollout_events (
	id         INTEGER PRIMARY KEY,
	rollout    TEXT NOT NULL,
	time       TEXT NOT NULL,
	node       TEXT NOT NULL DEFAULT '',
	kind       TEXT NOT NULL,
	from_state TEXT NOT NULL DEFAULT '',
	to_state   TEXT NOT NULL DEFAULT '',
	message    TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS rollout_events_by_rollout ON rollout_events (rollout, id);
`

var schema = campaigndb.Schema{Name: "rollout", Current: currentSchema, Steps: []campaigndb.Step{{
	What: "times as text instead of unix milliseconds",
	Up: func(ctx context.Context, tx *sqldb.Tx) error {
		ms := campaigndb.MillisToTime
		return errors.Join(
			campaigndb.Rebuild(ctx, tx, currentSchema, "rollout_runs", map[string]func(any) (any, error){
				"paused_at": ms, "soak_until": ms, "created": ms, "updated": ms, "finished": ms}),
			campaigndb.Rebuild(ctx, tx, currentSchema, "rollout_nodes", map[string]func(any) (any, error){
				"since": ms, "deadline": ms, "drained_at": ms}),
			campaigndb.Rebuild(ctx, tx, currentSchema, "rollout_events", map[string]func(any) (any, error){"time": ms}))
	},
}}}

type store struct {
	db *sqldb.DB
}

// openStore creates or upgrades the tables.
func openStore(ctx context.Context, db *sqldb.DB, now time.Time) (*store, error) {
	if err := schema.Migrate(ctx, db, now); err != nil {
		return nil, fmt.Errorf("rollout store: %w", err)
	}
	return &store{db: db}, nil
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// create writes a new rollout with all its nodes.
func (s *store) create(ctx context.Context, r *run, evs []event) error {
	return s.tx(ctx, func(tx *sqldb.Tx) error {
		if err := writeRun(ctx, tx, r, true); err != nil {
			return err
		}
		for _, n := range r.nodes {
			if err := writeNode(ctx, tx, r.ID, n, true); err != nil {
				return err
			}
		}
		return writeEvents(ctx, tx, evs)
	})
}

// save writes the dirty rollouts and nodes and the events, in one
// transaction: the transitions a step decided are durable together, before
// any of them is acted on.
func (s *store) save(ctx context.Context, runs []*run, evs []event) error {
	return s.tx(ctx, func(tx *sqldb.Tx) error {
		for _, r := range runs {
			if r.dirty {
				if err := writeRun(ctx, tx, r, false); err != nil {
					return err
				}
			}
			for _, n := range r.nodes {
				if n.dirty {
					if err := writeNode(ctx, tx, r.ID, n, false); err != nil {
						return err
					}
				}
			}
		}
		return writeEvents(ctx, tx, evs)
	})
}

func (s *store) tx(ctx context.Context, fn func(tx *sqldb.Tx) error) error {
	if err := s.db.Tx(ctx, fn); err != nil {
		return fmt.Errorf("rollout store: %w", err)
	}
	return nil
}

func writeRun(ctx context.Context, ex execer, r *run, insert bool) error {
	evidence, err := json.Marshal(nonNil(r.Evidence))
	if err != nil {
		return fmt.Errorf("encode evidence: %w", err)
	}
	if insert {
		spec, err := json.Marshal(r.Spec)
		if err != nil {
			return fmt.Errorf("encode spec: %w", err)
		}
		plan, err := json.Marshal(r.Plan)
		if err != nil {
			return fmt.Errorf("encode plan: %w", err)
		}
		_, err = ex.ExecContext(ctx, `INSERT INTO rollout_runs (id, name, spec, plan, phase, wave, paused, paused_at,
			pause_reason, soak_until, accepted, halt_reason, evidence, created, updated, finished)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			r.ID, r.Spec.Name, string(spec), string(plan), string(r.Phase), r.Wave, campaigndb.Bool(r.Paused), tm(r.PauseAt),
			r.PauseReason, tm(r.SoakUntil), r.Accepted, r.HaltReason, string(evidence), tm(r.Created), tm(r.Updated), tm(r.Finished))
		if err != nil {
			return fmt.Errorf("insert rollout %s: %w", r.ID, err)
		}
		return nil
	}
	_, err = ex.ExecContext(ctx, `UPDATE rollout_runs SET phase = ?, wave = ?, paused = ?, paused_at = ?, pause_reason = ?,
		soak_until = ?, accepted = ?, halt_reason = ?, evidence = ?, updated = ?, finished = ? WHERE id = ?`,
		string(r.Phase), r.Wave, campaigndb.Bool(r.Paused), tm(r.PauseAt), r.PauseReason, tm(r.SoakUntil), r.Accepted,
		r.HaltReason, string(evidence), tm(r.Updated), tm(r.Finished), r.ID)
	if err != nil {
		return fmt.Errorf("update rollout %s: %w", r.ID, err)
	}
	return nil
}

func writeNode(ctx context.Context, ex execer, id string, n *nodeRec, insert bool) error {
	evidence, err := json.Marshal(nonNil(n.Evidence))
	if err != nil {
		return fmt.Errorf("encode evidence: %w", err)
	}
	pre := ""
	if n.PreDone {
		b, err := json.Marshal(n.Pre)
		if err != nil {
			return fmt.Errorf("encode pre-upgrade statuses: %w", err)
		}
		pre = string(b)
	}
	q := `UPDATE rollout_nodes SET wave = ?, seq = ?, state = ?, since = ?, deadline = ?, op = ?, from_driver = ?,
		drained_by_us = ?, drained_at = ?, after_undrain = ?, baseline = ?, baseline_from = ?, pre = ?, hold = ?,
		reason = ?, evidence = ?, upgrades = ? WHERE rollout = ? AND node = ?`
	if insert {
		q = `INSERT INTO rollout_nodes (wave, seq, state, since, deadline, op, from_driver, drained_by_us, drained_at,
			after_undrain, baseline, baseline_from, pre, hold, reason, evidence, upgrades, rollout, node)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	}
	_, err = ex.ExecContext(ctx, q, n.Wave, n.Seq, string(n.State), tm(n.Since), tm(n.Deadline), n.Op, n.FromDriver,
		campaigndb.Bool(n.DrainedByUs), tm(n.DrainedAt), string(n.After), n.Baseline, n.BaselineFrom, pre, n.Hold,
		n.Reason, string(evidence), n.Upgrades, id, n.Name)
	if err != nil {
		return fmt.Errorf("write node %s of %s: %w", n.Name, id, err)
	}
	return nil
}

func writeEvents(ctx context.Context, ex execer, evs []event) error {
	for _, e := range evs {
		if _, err := ex.ExecContext(ctx, `INSERT INTO rollout_events (rollout, time, node, kind, from_state, to_state, message)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, e.Rollout, tm(e.Time), e.Node, e.Kind, string(e.From), string(e.To), e.Message); err != nil {
			return fmt.Errorf("write event: %w", err)
		}
	}
	return nil
}

// load reads every rollout with its nodes.
func (s *store) load(ctx context.Context) ([]*run, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, spec, plan, phase, wave, paused, paused_at, pause_reason, soak_until,
		accepted, halt_reason, evidence, created, updated, finished FROM rollout_runs ORDER BY created, id`)
	if err != nil {
		return nil, fmt.Errorf("rollout store: load: %w", err)
	}
	var runs []*run
	byID := map[string]*run{}
	for rows.Next() {
		var (
			r                                          run
			spec, plan, phase, evidence                string
			pausedAt, soak, created, updated, finished string
		)
		if err := rows.Scan(&r.ID, &spec, &plan, &phase, &r.Wave, &r.Paused, &pausedAt, &r.PauseReason, &soak,
			&r.Accepted, &r.HaltReason, &evidence, &created, &updated, &finished); err != nil {
			rows.Close()
			return nil, fmt.Errorf("rollout store: load: %w", err)
		}
		r.Phase = Phase(phase)
		r.PauseAt, r.SoakUntil, r.Created, r.Updated, r.Finished = campaigndb.ParseTime(pausedAt), campaigndb.ParseTime(soak), campaigndb.ParseTime(created), campaigndb.ParseTime(updated), campaigndb.ParseTime(finished)
		r.Spec = &Spec{}
		if err := json.Unmarshal([]byte(spec), r.Spec); err != nil {
			rows.Close()
			return nil, fmt.Errorf("rollout store: %s: decode spec: %w", r.ID, err)
		}
		r.Plan = &PlanResult{}
		if err := json.Unmarshal([]byte(plan), r.Plan); err != nil {
			rows.Close()
			return nil, fmt.Errorf("rollout store: %s: decode plan: %w", r.ID, err)
		}
		r.Plan.Spec = r.Spec
		if err := json.Unmarshal([]byte(evidence), &r.Evidence); err != nil {
			rows.Close()
			return nil, fmt.Errorf("rollout store: %s: decode evidence: %w", r.ID, err)
		}
		r.byName = map[string]*nodeRec{}
		runs = append(runs, &r)
		byID[r.ID] = &r
	}
	if err := rows.Err(); err != nil {
		rows.Close()
		return nil, fmt.Errorf("rollout store: load: %w", err)
	}
	rows.Close()

	rows, err = s.db.QueryContext(ctx, `SELECT rollout, node, wave, seq, state, since, deadline, op, from_driver,
		drained_by_us, drained_at, after_undrain, baseline, baseline_from, pre, hold, reason, evidence, upgrades
		FROM rollout_nodes ORDER BY rollout, seq`)
	if err != nil {
		return nil, fmt.Errorf("rollout store: load nodes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			n                               nodeRec
			id, state, after, pre, evidence string
			since, deadline, drainedAt      string
		)
		if err := rows.Scan(&id, &n.Name, &n.Wave, &n.Seq, &state, &since, &deadline, &n.Op, &n.FromDriver,
			&n.DrainedByUs, &drainedAt, &after, &n.Baseline, &n.BaselineFrom, &pre, &n.Hold, &n.Reason, &evidence, &n.Upgrades); err != nil {
			return nil, fmt.Errorf("rollout store: load nodes: %w", err)
		}
		n.State, n.After = State(state), State(after)
		n.Since, n.Deadline, n.DrainedAt = campaigndb.ParseTime(since), campaigndb.ParseTime(deadline), campaigndb.ParseTime(drainedAt)
		if pre != "" {
			n.PreDone = true
			n.Pre = map[string]report.Status{}
			if err := json.Unmarshal([]byte(pre), &n.Pre); err != nil {
				return nil, fmt.Errorf("rollout store: %s/%s: decode pre-upgrade statuses: %w", id, n.Name, err)
			}
		}
		if err := json.Unmarshal([]byte(evidence), &n.Evidence); err != nil {
			return nil, fmt.Errorf("rollout store: %s/%s: decode evidence: %w", id, n.Name, err)
		}
		r, ok := byID[id]
		if !ok {
			continue // a node row without its rollout: ignored
		}
		r.nodes = append(r.nodes, &n)
		r.byName[n.Name] = &n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("rollout store: load nodes: %w", err)
	}
	return runs, nil
}

// Event is one line of a rollout's history, as History returns it.
type Event struct {
	Time    time.Time `json:"time"`
	Node    string    `json:"node,omitempty"`
	Kind    string    `json:"kind"`
	From    State     `json:"from,omitempty"`
	To      State     `json:"to,omitempty"`
	Message string    `json:"message,omitempty"`
}

// events reads a rollout's history, oldest first; node narrows it.
func (s *store) events(ctx context.Context, id, node string, limit int) ([]Event, error) {
	q := `SELECT time, node, kind, from_state, to_state, message FROM rollout_events WHERE rollout = ?`
	args := []any{id}
	if node != "" {
		q += ` AND node = ?`
		args = append(args, node)
	}
	q += ` ORDER BY id DESC LIMIT ?`
	args = append(args, limit)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("rollout store: events: %w", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		var t string
		var from, to string
		if err := rows.Scan(&t, &e.Node, &e.Kind, &from, &to, &e.Message); err != nil {
			return nil, fmt.Errorf("rollout store: events: %w", err)
		}
		e.Time, e.From, e.To = campaigndb.ParseTime(t), State(from), State(to)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("rollout store: events: %w", err)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// tm is how the rollout tables store a time.
func tm(t time.Time) string { return campaigndb.Time(t) }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
