package store

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// OpenDB opens another writable handle on the database for packages that
// keep tables of their own beside the store's (baselines, campaigns). It
// is a pool separate from the results writer, so a campaign's transaction
// never queues behind a batch of results or the other way round; SQLite
// still takes one write at a time, which the immediate transactions and
// the busy timeout of the writer's DSN make wait instead of fail. The
// caller closes it before closing the store.
func (s *Store) OpenDB() *sql.DB {
	db, err := s.connectShared()
	if err != nil {
		// Unreachable: Open parsed and connected with the same target.
		panic(fmt.Sprintf("store: open another pool on %s: %v", s.Where(), err))
	}
	return db.SQL()
}

// OpenSQLDB is OpenDB with the dialect and the store's write fence:
// what campaign engines and baselines use to run on either database.
func (s *Store) OpenSQLDB(ctx context.Context) (*sqldb.DB, error) {
	db, err := s.connectShared()
	if err != nil {
		return nil, err
	}
	if err := db.SQL().PingContext(ctx); err != nil {
		_ = db.Close() // the ping error is the one to report
		return nil, fmt.Errorf("open %s: %w", s.Where(), err)
	}
	return db, nil
}

func (s *Store) connectShared() (*sqldb.DB, error) {
	if s.d == sqldb.Postgres {
		return sqldb.Connect(s.target, sqldb.Options{MaxOpen: 8, Fence: s.opts.Fence})
	}
	db := openDB(writerDSN(s.path, "rw"))
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	return sqldb.Wrap(db, sqldb.SQLite, s.opts.Fence), nil
}

// ReaderDB is the store's read-only pool, for readers of those tables
// (baselines.WithReader). The store owns and closes it.
func (s *Store) ReaderDB() *sql.DB { return s.r.SQL() }

// ReaderSQLDB is ReaderDB with its dialect.
func (s *Store) ReaderSQLDB() *sqldb.DB { return s.r }
