package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// RecordDispatch records that work workID goes to nodes. The coordinator
// calls it before it sends the work, so that a result naming workID is
// later accepted from exactly these nodes, whenever it arrives.
func (s *Store) RecordDispatch(ctx context.Context, workID string, nodes []string, at time.Time) error {
	if workID == "" || len(workID) > maxIDLen {
		return fmt.Errorf("%w: work id must be 1..%d bytes", ErrInvalid, maxIDLen)
	}
	if len(nodes) == 0 {
		return nil
	}
	if at.IsZero() {
		at = s.opts.Now()
	}
	err := s.w.Tx(ctx, func(tx *sqldb.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO dispatches (work_id, node, stored) VALUES (?, ?, ?)
		ON CONFLICT (work_id, node) DO NOTHING`)
		if err != nil {
			return err
		}
		defer func() { _ = stmt.Close() }() // the statement's work is done; the inserts' errors count
		for _, n := range nodes {
			if _, err := stmt.ExecContext(ctx, workID, n, ms(at)); err != nil {
				return fmt.Errorf("to %s: %w", n, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record dispatch %s: %w", workID, err)
	}
	return nil
}

// Dispatched reports whether work workID was sent to node.
func (s *Store) Dispatched(ctx context.Context, workID, node string) (bool, error) {
	var one int
	err := s.r.QueryRowContext(ctx, `SELECT 1 FROM dispatches WHERE work_id = ? AND node = ?`, workID, node).Scan(&one)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("look up dispatch %s: %w", workID, err)
	}
	return true, nil
}

// maxStaleDispatchRows bounds what MultiDispatches reads.
const maxStaleDispatchRows = 100_000

// MultiDispatches returns, by node, the works sent to between 2 and
// maxNodes nodes (multi-node runs have a few; a fleet-wide check has
// many) and stored in [from, to). A new leader reads them to call off
// the peer reservations a leader that died left behind.
func (s *Store) MultiDispatches(ctx context.Context, from, to time.Time, maxNodes int) (map[string][]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT work_id, node FROM dispatches
		WHERE stored >= ? AND stored < ? AND work_id IN (
			SELECT work_id FROM dispatches WHERE stored >= ? AND stored < ?
			GROUP BY work_id HAVING COUNT(*) BETWEEN 2 AND ?)
		LIMIT ?`, ms(from), ms(to), ms(from), ms(to), maxNodes, maxStaleDispatchRows)
	if err != nil {
		return nil, fmt.Errorf("list multi-node dispatches: %w", err)
	}
	defer func() { _ = rows.Close() }() // read-only; the scan's errors count
	out := map[string][]string{}
	for rows.Next() {
		var work, node string
		if err := rows.Scan(&work, &node); err != nil {
			return nil, fmt.Errorf("list multi-node dispatches: %w", err)
		}
		out[node] = append(out[node], work)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list multi-node dispatches: %w", err)
	}
	return out, nil
}
