// Package campaigndb holds what the campaign engines' stores share: how
// times and JSON columns are written, the schema migrator and each
// campaign's event log. Every engine keeps its tables in the
// coordinator's database (SQLite or PostgreSQL, through internal/sqldb),
// prefixed with its name; queries are written once with ? placeholders in
// SQL both accept, and every write runs in a sqldb transaction (so a
// fence can refuse it).
package campaigndb

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// Querier is what a transaction and a database share (both rebind ?).
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ Querier = (*sqldb.DB)(nil)
	_ Querier = (*sqldb.Tx)(nil)
)

// timeLayout is RFC 3339 in UTC with all nine fraction digits: every time
// has the same width, so text order is time order (ORDER BY, <, >).
const timeLayout = "2006-01-02T15:04:05.000000000Z"

// Time writes t the one way campaign tables store times: RFC 3339 text,
// UTC, fixed width (see timeLayout); the zero time as "".
func Time(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(timeLayout)
}

// ParseTime reads what Time wrote, and the variable-width RFC 3339 of
// earlier releases; "" and anything unreadable are the zero time.
func ParseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// JSON encodes one of the engines' own types for a JSON column.
func JSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return "null" // only the engines' own types come here; they marshal
	}
	return string(b)
}

// Exec runs one write statement in its own transaction (through the
// database's fence) and returns how many rows it changed.
func Exec(ctx context.Context, db *sqldb.DB, q string, args ...any) (int64, error) {
	var n int64
	err := db.Tx(ctx, func(tx *sqldb.Tx) error {
		res, err := tx.ExecContext(ctx, q, args...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n, err
}

// Event is one line of a campaign's history.
type Event struct {
	At   time.Time `json:"at"`
	Node string    `json:"node,omitempty"`
	What string    `json:"what"`
}

// EventLog is a campaign table's event log: Table has columns Key (the
// campaign's id), node, at and what, and an id that orders them; DDL
// creates it, so every engine's log has the same shape.
type EventLog struct {
	Table, Key string
	Index      string // the index on (Key, id)
	Noun       string // "campaign", "drill": for errors
}

// DDL creates the log's table and index (SQLite form; sqldb translates).
func (l EventLog) DDL() string {
	return `CREATE TABLE IF NOT EXISTS ` + l.Table + ` (
	id   INTEGER PRIMARY KEY,
	` + l.Key + ` TEXT NOT NULL,
	node TEXT NOT NULL,
	at   TEXT NOT NULL,
	what TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ` + l.Index + ` ON ` + l.Table + `(` + l.Key + `, id);
`
}

// Add records one event.
func (l EventLog) Add(ctx context.Context, q Querier, id, node string, at time.Time, what string) error {
	if _, err := q.ExecContext(ctx, `INSERT INTO `+l.Table+` (`+l.Key+`, node, at, what) VALUES (?, ?, ?, ?)`,
		id, node, Time(at), what); err != nil {
		return fmt.Errorf("record %s event: %w", l.Noun, err)
	}
	return nil
}

// List returns a campaign's events, oldest first.
func (l EventLog) List(ctx context.Context, q Querier, id string) ([]Event, error) {
	rows, err := q.QueryContext(ctx, `SELECT at, node, what FROM `+l.Table+` WHERE `+l.Key+` = ? ORDER BY id`, id)
	if err != nil {
		return nil, fmt.Errorf("%s %s events: %w", l.Noun, id, err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		var at string
		if err := rows.Scan(&at, &e.Node, &e.What); err != nil {
			return nil, fmt.Errorf("%s %s events: %w", l.Noun, id, err)
		}
		e.At = ParseTime(at)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s %s events: %w", l.Noun, id, err)
	}
	return out, nil
}

// Record adds one event in its own transaction.
func (l EventLog) Record(ctx context.Context, db *sqldb.DB, id, node string, at time.Time, what string) error {
	return db.Tx(ctx, func(tx *sqldb.Tx) error { return l.Add(ctx, tx, id, node, at, what) })
}

// Held lists the nodes of a kind's unfinished campaigns for kit.Busy:
// query selects (node, campaign id); each is held by "kind id".
func Held(ctx context.Context, q Querier, kind, query string, args ...any) (map[string]string, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("running %s campaigns: %w", kind, err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var n, id string
		if err := rows.Scan(&n, &id); err != nil {
			return nil, fmt.Errorf("running %s campaigns: %w", kind, err)
		}
		out[n] = kind + " " + id
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("running %s campaigns: %w", kind, err)
	}
	return out, nil
}

// Bool is how campaign tables store a flag: INTEGER 0 or 1, bound as a Go
// int (PostgreSQL does not take a Go bool for a BIGINT). Scanning 0/1 back
// into a bool works on both databases.
func Bool(b bool) int {
	if b {
		return 1
	}
	return 0
}
