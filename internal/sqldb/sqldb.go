// Package sqldb is the one door to SQL for the coordinator's store, the
// baselines and the campaign engines: it opens a database by URL (SQLite,
// the embedded default, or PostgreSQL), says which Dialect it speaks, and
// runs every write through Tx, which first calls the fence hook (nil by
// default) so that a coordinator which lost its leadership cannot write.
//
// Queries are written with ? placeholders in the SQL both databases
// accept (see Dialect); DB and Tx rebind them on the way in.
package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/mattn/go-sqlite3"
)

// Target is a parsed database URL.
type Target struct {
	Dialect Dialect
	// Path is the SQLite file (Dialect SQLite).
	Path string
	// URL is the PostgreSQL connection URL (Dialect Postgres).
	URL string
}

// String is the target for logs and errors: a PostgreSQL password is
// replaced by xxxxx.
func (t Target) String() string {
	if t.Dialect == SQLite {
		return "sqlite:" + t.Path
	}
	u, err := url.Parse(t.URL)
	if err != nil {
		return "postgres://(unparsable)"
	}
	return u.Redacted()
}

// Parse reads a database URL: "sqlite:PATH" or a bare path is SQLite (the
// default); "postgres://..." or "postgresql://..." is PostgreSQL, in the
// URL form libpq and pgx accept (host, port, user, password, dbname,
// sslmode, host=/socket/dir for a unix socket...).
func Parse(raw string) (Target, error) {
	s := strings.TrimSpace(raw)
	if s == "" {
		return Target{}, errors.New("database URL is empty (want sqlite:PATH, a file path, or postgres://...)")
	}
	lower := strings.ToLower(s)
	switch {
	case strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"):
		if _, err := pgx.ParseConfig(s); err != nil {
			return Target{}, fmt.Errorf("database URL %s: %w", redact(s), err)
		}
		return Target{Dialect: Postgres, URL: s}, nil
	case strings.HasPrefix(lower, "sqlite:"):
		p := strings.TrimPrefix(s[len("sqlite:"):], "//")
		if p == "" {
			return Target{}, fmt.Errorf("database URL %q names no SQLite file", raw)
		}
		return Target{Dialect: SQLite, Path: p}, nil
	case strings.Contains(s, "://"):
		return Target{}, fmt.Errorf("database URL %s: unknown scheme (want sqlite:PATH, a file path, or postgres://...)", redact(s))
	}
	return Target{Dialect: SQLite, Path: s}, nil
}

func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return "(unparsable URL)"
}

// Fence runs first in every write transaction (Tx). Returning an error
// aborts the transaction before anything is written: "ha" checks there
// that this coordinator still holds the leader lease, so a paused old
// leader cannot write after another took over.
type Fence func(ctx context.Context, tx *Tx) error

// Options configure Open. Zero values take the defaults.
type Options struct {
	// MaxOpen bounds the pool (default 4 on SQLite, 16 on PostgreSQL).
	MaxOpen int
	// ReadOnly opens a SQLite pool that refuses writes (query_only); on
	// PostgreSQL it sets default_transaction_read_only.
	ReadOnly bool
	// NoCreate refuses to create a missing SQLite file.
	NoCreate bool
	// Setup statements run on every new connection (SQLite pragmas, a
	// PostgreSQL SET).
	Setup []string
	// SQLiteParams are extra go-sqlite3 DSN parameters (_cache_size...),
	// merged over the defaults.
	SQLiteParams url.Values
	// Fence is the write fence (nil: none).
	Fence Fence
}

// DB is an open database: a database/sql pool plus its dialect and fence.
type DB struct {
	db      *sql.DB
	dialect Dialect
	target  Target
	fence   Fence
}

// Open opens the database at rawURL and checks that it answers.
func Open(ctx context.Context, rawURL string, opts Options) (*DB, error) {
	t, err := Parse(rawURL)
	if err != nil {
		return nil, err
	}
	return OpenTarget(ctx, t, opts)
}

// OpenTarget is Open for a parsed URL.
func OpenTarget(ctx context.Context, t Target, opts Options) (*DB, error) {
	db, err := Connect(t, opts)
	if err != nil {
		return nil, err
	}
	if err := db.db.PingContext(ctx); err != nil {
		_ = db.Close() // the ping error is the one to report
		return nil, fmt.Errorf("open %s: %w", t, err)
	}
	return db, nil
}

// Connect is OpenTarget without the check that the database answers:
// connections are made when first used.
func Connect(t Target, opts Options) (*DB, error) {
	var db *sql.DB
	switch t.Dialect {
	case SQLite:
		db = openSQLite(t.Path, opts)
		if opts.MaxOpen <= 0 {
			opts.MaxOpen = 4
		}
	case Postgres:
		cfg, err := pgx.ParseConfig(t.URL)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", t, err)
		}
		if opts.ReadOnly {
			cfg.RuntimeParams["default_transaction_read_only"] = "on"
		}
		setup := opts.Setup
		var pgOpts []stdlib.OptionOpenDB
		if len(setup) > 0 {
			pgOpts = append(pgOpts, stdlib.OptionAfterConnect(func(ctx context.Context, c *pgx.Conn) error {
				for _, q := range setup {
					if _, err := c.Exec(ctx, q); err != nil {
						return fmt.Errorf("%s: %w", q, err)
					}
				}
				return nil
			}))
		}
		db = stdlib.OpenDB(*cfg, pgOpts...)
		if opts.MaxOpen <= 0 {
			opts.MaxOpen = 16
		}
	default:
		return nil, fmt.Errorf("open database: unknown dialect %v", t.Dialect)
	}
	db.SetMaxOpenConns(opts.MaxOpen)
	db.SetMaxIdleConns(opts.MaxOpen)
	if t.Dialect == Postgres {
		// A server restart or failover leaves dead connections behind;
		// recycling bounds how long the pool keeps any.
		db.SetConnMaxLifetime(30 * time.Minute)
	}
	return &DB{db: db, dialect: t.Dialect, target: t, fence: opts.Fence}, nil
}

// Wrap gives an already open pool the DB methods.
func Wrap(db *sql.DB, d Dialect, fence Fence) *DB {
	return &DB{db: db, dialect: d, fence: fence, target: Target{Dialect: d}}
}

// SQLiteDSN is the go-sqlite3 connection string Open uses for path: WAL,
// synchronous=NORMAL, a 10 s busy timeout, immediate write transactions
// (so two writers queue instead of failing on lock upgrade), plus extra.
// The file: form keeps odd characters in the path from being read as
// parameters.
func SQLiteDSN(path string, readOnly, create bool, extra url.Values) string {
	p := url.Values{
		"_busy_timeout":    {"10000"},
		"_stmt_cache_size": {"32"},
	}
	switch {
	case readOnly:
		p.Set("mode", "rw")
		p.Set("_query_only", "1")
	default:
		p.Set("mode", "rw")
		if create {
			p.Set("mode", "rwc")
		}
		p.Set("_journal_mode", "WAL")
		p.Set("_synchronous", "NORMAL")
		p.Set("_txlock", "immediate")
		p.Set("_foreign_keys", "0")
	}
	for k, v := range extra {
		p[k] = v
	}
	u := url.URL{Scheme: "file", Opaque: (&url.URL{Path: path}).EscapedPath(), RawQuery: p.Encode()}
	return u.String()
}

func openSQLite(path string, opts Options) *sql.DB {
	return OpenSQLiteDSN(SQLiteDSN(path, opts.ReadOnly, !opts.NoCreate, opts.SQLiteParams), opts.Setup...)
}

// OpenSQLiteDSN opens a go-sqlite3 pool on dsn without registering a
// driver name; each new connection runs the setup statements. The store
// uses it for its dedicated writer, readers and checkpointer.
func OpenSQLiteDSN(dsn string, setup ...string) *sql.DB {
	drv := &sqlite3.SQLiteDriver{ConnectHook: func(conn *sqlite3.SQLiteConn) error {
		for _, q := range setup {
			if _, err := conn.Exec(q, nil); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	}}
	return sql.OpenDB(sqliteConnector{dsn: dsn, drv: drv})
}

type sqliteConnector struct {
	dsn string
	drv *sqlite3.SQLiteDriver
}

func (c sqliteConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c sqliteConnector) Driver() driver.Driver                        { return c.drv }

// Dialect is the database's SQL flavour.
func (db *DB) Dialect() Dialect { return db.dialect }

// Target is where the database is (String redacts a password).
func (db *DB) Target() Target { return db.target }

// SQL is the underlying pool, for code that needs database/sql itself.
// Its queries are not rebound.
func (db *DB) SQL() *sql.DB { return db.db }

// SetFence replaces the write fence (nil: none). Set it before writers
// start; it is not synchronized with running transactions.
func (db *DB) SetFence(f Fence) { db.fence = f }

// Close closes the pool.
func (db *DB) Close() error { return db.db.Close() }

// ExecContext runs a statement outside a transaction (rebound). Writes
// that must be fenced go through Tx instead.
func (db *DB) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return db.db.ExecContext(ctx, db.dialect.Rebind(q), args...)
}

// QueryContext runs a query (rebound).
func (db *DB) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return db.db.QueryContext(ctx, db.dialect.Rebind(q), args...)
}

// QueryRowContext runs a query expected to return at most one row (rebound).
func (db *DB) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return db.db.QueryRowContext(ctx, db.dialect.Rebind(q), args...)
}

// IsUniqueViolation reports whether err is a unique or primary key
// constraint failure, on either database.
func IsUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "23505"
	}
	var se sqlite3.Error
	if errors.As(err, &se) {
		return se.ExtendedCode == sqlite3.ErrConstraintUnique || se.ExtendedCode == sqlite3.ErrConstraintPrimaryKey
	}
	return false
}

// Retryable reports whether err is a transaction PostgreSQL aborted so
// that another could go on, a deadlock (40P01) or a serialization failure
// (40001): the same transaction tried again may commit. On SQLite the
// busy timeout waits instead, and nothing is retryable.
func Retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}
