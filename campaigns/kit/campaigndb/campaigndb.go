// Package campaigndb holds what the campaign engines' SQLite stores share:
// how times and JSON columns are written, and each campaign's event log.
package campaigndb

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// Querier is what a transaction and a pool share.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Time writes t as RFC 3339 with nanoseconds in UTC (sortable text); the
// zero time as "".
func Time(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// ParseTime reads what Time wrote; "" and anything unreadable are the
// zero time.
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

// Event is one line of a campaign's history.
type Event struct {
	At   time.Time `json:"at"`
	Node string    `json:"node,omitempty"`
	What string    `json:"what"`
}

// EventLog is a campaign table's event log: Table has columns Key (the
// campaign's id), node, at and what, and an id that orders them.
type EventLog struct {
	Table, Key string
	Noun       string // "campaign", "drill": for errors
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
