package kit

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// BreakerTable is the shared breaker's ledger: one row per node drained
// within the window, by whichever coordinator (Share).
const BreakerTable = "fleetcheck_breaker"

// breakerLock is the transaction-level advisory lock every ledger
// decision holds: the count and the new row of one Allow are never
// interleaved with another coordinator's.
const breakerLock int64 = 0x666c62726b72 // "flbrkr"

// sharedTimeout bounds one ledger transaction (Allow has no context).
const sharedTimeout = 10 * time.Second

// Share makes the breaker's window one for every coordinator on the
// PostgreSQL database db: Allow counts and records drains in the ledger
// table (BreakerTable) inside a transaction serialized with an advisory
// lock, so three coordinators together drain at most the limit, not
// three times it. Release and Restore write there too; Records and State
// read it. The records the breaker holds already are written first.
//
// A drain Allow cannot record (the database unreachable) is refused:
// the breaker fails closed. db must be unfenced: the drain policy and the
// remediation ladder ask on every coordinator, not only the leader. The
// window's times are each coordinator's clock: their clocks must agree
// to well within the window.
func (b *Breaker) Share(ctx context.Context, db *sqldb.DB) error {
	if db.Dialect() != sqldb.Postgres {
		return errors.New("breaker: a shared window needs PostgreSQL")
	}
	err := db.Tx(ctx, func(tx *sqldb.Tx) error {
		// Two coordinators starting at once would race CREATE TABLE.
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, breakerLock); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+BreakerTable+` (
			node     TEXT PRIMARY KEY,
			campaign TEXT NOT NULL,
			at_ms    BIGINT NOT NULL)`)
		return err
	})
	if err != nil {
		return fmt.Errorf("breaker: ledger: %w", err)
	}
	b.mu.Lock()
	held := make([]DrainRecord, 0, len(b.recs))
	for _, r := range b.recs {
		held = append(held, r)
	}
	b.shared, b.pushed = db, map[string]time.Time{}
	b.mu.Unlock()
	b.restoreShared(held)
	return nil
}

func (b *Breaker) allowShared(campaign, node string, fleetSize int) error {
	ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
	defer cancel()
	now := b.clock.Now()
	var refused error
	err := b.shared.Tx(ctx, func(tx *sqldb.Tx) error {
		refused = nil // a retried transaction decides anew
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, breakerLock); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+BreakerTable+` WHERE at_ms <= ?`, now.Add(-b.cfg.Window).UnixMilli()); err != nil {
			return err
		}
		var n, again int
		if err := tx.QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE node = ?) FROM `+BreakerTable, node).Scan(&n, &again); err != nil {
			return err
		}
		if again == 0 {
			if lim := b.limit(fleetSize); lim >= 0 && n+1 > lim {
				refused = fmt.Errorf("drain %s for %s: %w: %d of %d nodes drained by campaigns within %v across coordinators (limit %d)",
					node, campaign, ErrBreakerOpen, n, fleetSize, b.cfg.Window, lim)
				return nil
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO `+BreakerTable+` (node, campaign, at_ms) VALUES (?, ?, ?)
			ON CONFLICT (node) DO UPDATE SET campaign = excluded.campaign, at_ms = excluded.at_ms`, node, campaign, now.UnixMilli())
		return err
	})
	if err != nil {
		return fmt.Errorf("drain %s for %s: %w: the shared window cannot be read: %v", node, campaign, ErrBreakerOpen, err)
	}
	if refused != nil {
		return refused
	}
	b.mu.Lock()
	b.recs[node] = DrainRecord{Node: node, Campaign: campaign, At: now}
	b.mu.Unlock()
	return nil
}

// releaseShared gives the slot back; if the ledger cannot be reached the
// slot stays taken until the window forgets it (the safe side).
func (b *Breaker) releaseShared(campaign, node string) {
	ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
	defer cancel()
	_, _ = b.shared.ExecContext(ctx, `DELETE FROM `+BreakerTable+` WHERE node = ? AND campaign = ?`, node, campaign) // see above
}

// restoreShared writes restored records the ledger lacks (or holds
// older); each is written once per process, since engines restore on
// every reload.
func (b *Breaker) restoreShared(recs []DrainRecord) {
	cut := b.clock.Now().Add(-b.cfg.Window)
	b.mu.Lock()
	var todo []DrainRecord
	for _, r := range recs {
		if !r.At.After(cut) {
			continue
		}
		if at, ok := b.pushed[r.Node]; ok && !r.At.After(at) {
			continue
		}
		todo = append(todo, r)
	}
	b.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
	defer cancel()
	err := b.shared.Tx(ctx, func(tx *sqldb.Tx) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, breakerLock); err != nil {
			return err
		}
		for _, r := range todo {
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+BreakerTable+` (node, campaign, at_ms) VALUES (?, ?, ?)
				ON CONFLICT (node) DO UPDATE SET campaign = excluded.campaign, at_ms = excluded.at_ms
				WHERE `+BreakerTable+`.at_ms < excluded.at_ms`, r.Node, r.Campaign, r.At.UnixMilli()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return // the mirror keeps them; the next restore tries again
	}
	b.mu.Lock()
	for _, r := range todo {
		if at, ok := b.pushed[r.Node]; !ok || r.At.After(at) {
			b.pushed[r.Node] = r.At
		}
	}
	b.mu.Unlock()
}

// sharedRecords are the ledger's drains within the window, oldest first.
func (b *Breaker) sharedRecords() ([]DrainRecord, error) {
	ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
	defer cancel()
	rows, err := b.shared.QueryContext(ctx, `SELECT node, campaign, at_ms FROM `+BreakerTable+` WHERE at_ms > ?`,
		b.clock.Now().Add(-b.cfg.Window).UnixMilli())
	if err != nil {
		return nil, err
	}
	defer func() { _ = rows.Close() }() // rows.Err below is what counts
	var out []DrainRecord
	for rows.Next() {
		var r DrainRecord
		var ms int64
		if err := rows.Scan(&r.Node, &r.Campaign, &ms); err != nil {
			return nil, err
		}
		r.At = time.UnixMilli(ms)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].At.Equal(out[j].At) {
			return out[i].At.Before(out[j].At)
		}
		return out[i].Node < out[j].Node
	})
	return out, nil
}
