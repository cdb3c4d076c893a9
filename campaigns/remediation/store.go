package remediation

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

var events = campaigndb.EventLog{Table: "remediation_events", Key: "remediation_id", Index: "remediation_events_item", Noun: "remediation"}

// schema is the remediation_ tables: portable SQL (sqldb translates the
// DDL; TEXT times in campaigndb's fixed width, so they sort; JSON in TEXT).
var schema = campaigndb.Schema{Name: "remediation", Current: `
CREATE TABLE IF NOT EXISTS remediation_items (
	id         TEXT    NOT NULL PRIMARY KEY,
	seq        INTEGER NOT NULL,
	node       TEXT    NOT NULL,
	component  TEXT    NOT NULL,
	state      TEXT    NOT NULL,
	data       TEXT    NOT NULL, -- JSON Remediation
	created_at TEXT    NOT NULL,
	due_at     TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS remediation_items_state ON remediation_items(state, due_at);
CREATE INDEX IF NOT EXISTS remediation_items_node ON remediation_items(node, component);
CREATE TABLE IF NOT EXISTS remediation_jobs (
	id   INTEGER PRIMARY KEY,
	at   TEXT NOT NULL,
	data TEXT NOT NULL -- JSON JobEvent
);
` + cursorsDDL + events.DDL(), Steps: []campaigndb.Step{
	{What: "feed cursors", Up: func(ctx context.Context, tx *sqldb.Tx) error { return campaigndb.ExecDDL(ctx, tx, cursorsDDL) }},
}}

// cursorsDDL keeps where a reader of the coordinator's results is (the
// leader's feed, campaign_lead.go), so the next leader goes on from there.
const cursorsDDL = `
CREATE TABLE IF NOT EXISTS remediation_cursors (
	name  TEXT NOT NULL PRIMARY KEY,
	value TEXT NOT NULL,
	at    TEXT NOT NULL
);
`

// Cursor returns the named cursor's value; ok is false when none is kept.
func (e *Engine) Cursor(ctx context.Context, name string) (string, bool, error) {
	var v string
	err := e.d.DB.QueryRowContext(ctx, `SELECT value FROM remediation_cursors WHERE name = ?`, name).Scan(&v)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", false, nil
	case err != nil:
		return "", false, fmt.Errorf("remediation cursor %s: %w", name, err)
	}
	return v, true, nil
}

// SetCursor keeps the named cursor's value (through the engine's
// database: under a lease the write is fenced).
func (e *Engine) SetCursor(ctx context.Context, name, value string) error {
	return e.d.DB.Tx(ctx, func(tx *sqldb.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE remediation_cursors SET value = ?, at = ? WHERE name = ?`, value, campaigndb.Time(e.now()), name)
		if err != nil {
			return fmt.Errorf("remediation cursor %s: %w", name, err)
		}
		if n, err := res.RowsAffected(); err == nil && n > 0 {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO remediation_cursors (name, value, at) VALUES (?, ?, ?)`, name, value, campaigndb.Time(e.now())); err != nil {
			return fmt.Errorf("remediation cursor %s: %w", name, err)
		}
		return nil
	})
}

// Event is one line of a remediation's history.
type Event = campaigndb.Event

func insertItem(ctx context.Context, q campaigndb.Querier, r *Remediation, seq int) error {
	if _, err := q.ExecContext(ctx, `INSERT INTO remediation_items (id, seq, node, component, state, data, created_at, due_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		r.ID, seq, r.Node, r.Component, string(r.State), campaigndb.JSON(r), campaigndb.Time(r.CreatedAt), campaigndb.Time(r.DueAt)); err != nil {
		return fmt.Errorf("record remediation %s: %w", r.ID, err)
	}
	return nil
}

func saveItem(ctx context.Context, q campaigndb.Querier, r *Remediation) error {
	ev := r.Events
	r.Events = nil // kept in their own table
	defer func() { r.Events = ev }()
	if _, err := q.ExecContext(ctx, `UPDATE remediation_items SET state = ?, data = ?, due_at = ? WHERE id = ?`,
		string(r.State), campaigndb.JSON(r), campaigndb.Time(r.DueAt), r.ID); err != nil {
		return fmt.Errorf("save remediation %s: %w", r.ID, err)
	}
	return nil
}

// loadItems reads remediations (where filters them), newest first.
func loadItems(ctx context.Context, q campaigndb.Querier, where string, args ...any) ([]Remediation, error) {
	rows, err := q.QueryContext(ctx, `SELECT data FROM remediation_items `+where+` ORDER BY seq DESC`, args...)
	if err != nil {
		return nil, fmt.Errorf("list remediations: %w", err)
	}
	defer rows.Close()
	var out []Remediation
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("list remediations: %w", err)
		}
		var r Remediation
		if err := json.Unmarshal([]byte(data), &r); err != nil {
			return nil, fmt.Errorf("list remediations: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list remediations: %w", err)
	}
	return out, nil
}

func maxSeq(ctx context.Context, q campaigndb.Querier) (int, error) {
	var v sql.NullInt64
	if err := q.QueryRowContext(ctx, `SELECT MAX(seq) FROM remediation_items`).Scan(&v); err != nil {
		return 0, fmt.Errorf("remediation seq: %w", err)
	}
	return int(v.Int64), nil
}

func insertJob(ctx context.Context, q campaigndb.Querier, j JobEvent) error {
	if _, err := q.ExecContext(ctx, `INSERT INTO remediation_jobs (at, data) VALUES (?, ?)`, campaigndb.Time(j.At), campaigndb.JSON(j)); err != nil {
		return fmt.Errorf("record job event: %w", err)
	}
	return nil
}

func loadJobs(ctx context.Context, q campaigndb.Querier, limit int) ([]JobEvent, error) {
	rows, err := q.QueryContext(ctx, `SELECT data FROM remediation_jobs ORDER BY id DESC LIMIT ?`, limit)
	if err != nil {
		return nil, fmt.Errorf("job events: %w", err)
	}
	defer rows.Close()
	var out []JobEvent
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("job events: %w", err)
		}
		var j JobEvent
		if err := json.Unmarshal([]byte(data), &j); err != nil {
			return nil, fmt.Errorf("job events: %w", err)
		}
		out = append(out, j)
	}
	return out, rows.Err()
}

// DrainRecords are the ladder's drains since since, from its event log:
// the breaker keeps its window in memory, and a restarted coordinator
// restores what the ladder drained into it.
func (e *Engine) DrainRecords(ctx context.Context, since time.Time) ([]kit.DrainRecord, error) {
	rows, err := e.d.DB.QueryContext(ctx, `SELECT node, at FROM remediation_events WHERE at >= ? AND what LIKE 'drained;%'`, campaigndb.Time(since))
	if err != nil {
		return nil, fmt.Errorf("remediation drain records: %w", err)
	}
	defer rows.Close()
	var out []kit.DrainRecord
	for rows.Next() {
		var r kit.DrainRecord
		var at string
		if err := rows.Scan(&r.Node, &at); err != nil {
			return nil, fmt.Errorf("remediation drain records: %w", err)
		}
		r.Campaign, r.At = Actor, campaigndb.ParseTime(at)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("remediation drain records: %w", err)
	}
	return out, nil
}
