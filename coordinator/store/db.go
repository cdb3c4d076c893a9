package store

import "database/sql"

// OpenDB opens another writable handle on the database for packages that
// keep tables of their own beside the store's (baselines, campaigns). It
// is a pool separate from the results writer, so a campaign's transaction
// never queues behind a batch of results or the other way round; SQLite
// still takes one write at a time, which the immediate transactions and
// the busy timeout of the writer's DSN make wait instead of fail. The
// caller closes it before closing the store.
func (s *Store) OpenDB() *sql.DB {
	db := openDB(writerDSN(s.path, "rw"))
	db.SetMaxOpenConns(4)
	db.SetMaxIdleConns(4)
	return db
}

// ReaderDB is the store's read-only pool, for readers of those tables
// (baselines.WithReader). The store owns and closes it.
func (s *Store) ReaderDB() *sql.DB { return s.r }
