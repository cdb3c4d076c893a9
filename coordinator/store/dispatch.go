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
