package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// Event kinds.
const (
	EventStateChange    = "state_change"
	EventOperatorAction = "operator_action"
	EventRefused        = "refused"    // the coordinator refused something an agent sent
	EventConnection     = "connection" // streams opened, replaced, closed
	// EventAudit records an action taken by or for a campaign: who
	// decided it and why (coordinator.Server.Audit).
	EventAudit = "audit"
)

// Event is one line of the event log.
type Event struct {
	ID      int64
	Time    time.Time
	Node    string // empty for fleet-wide events
	Kind    string
	Actor   string
	Message string
}

// EventQuery selects events: Node narrows to one node, Kind to one kind;
// Limit bounds the rows (default 50, at most 10,000).
type EventQuery struct {
	Node  string
	Kind  string
	Limit int
}

func insertEvent(ctx context.Context, ex interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}, e Event) error {
	_, err := ex.ExecContext(ctx, `INSERT INTO events (time, node, kind, actor, message) VALUES (?, ?, ?, ?, ?)`,
		ms(e.Time), e.Node, e.Kind, e.Actor, clip(e.Message))
	return err
}

// AddEvent appends an event.
func (s *Store) AddEvent(ctx context.Context, e Event) error {
	if e.Time.IsZero() {
		e.Time = s.opts.Now()
	}
	if err := s.w.Tx(ctx, func(tx *sqldb.Tx) error { return insertEvent(ctx, tx, e) }); err != nil {
		return fmt.Errorf("add event: %w", err)
	}
	return nil
}

// Events returns the newest events that match, oldest of them first.
func (s *Store) Events(ctx context.Context, q EventQuery) ([]Event, error) {
	limit := clampLimit(q.Limit)
	// Each filter has its own index (events_node, events_kind); the
	// planner picks one and checks the other on the rows it walks.
	query := `SELECT id, time, node, kind, actor, message FROM events`
	var where []string
	var args []any
	if q.Node != "" {
		where, args = append(where, "node = ?"), append(args, q.Node)
	}
	if q.Kind != "" {
		where, args = append(where, "kind = ?"), append(args, q.Kind)
	}
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	rows, err := s.r.QueryContext(ctx, query+" ORDER BY id DESC LIMIT ?", append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.Node, &e.Kind, &e.Actor, &e.Message); err != nil {
			return nil, fmt.Errorf("list events: %w", err)
		}
		e.Time = fromMS(at)
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}
