package baselines

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// SchemaVersion is the version of the tables this package owns.
const SchemaVersion = 1

// schemaV1 creates the tables. IF NOT EXISTS everywhere: NewStore runs it
// on every start, next to whatever migrations the database's owner runs.
const schemaV1 = `
CREATE TABLE IF NOT EXISTS baselines_schema_version (
	version    INTEGER NOT NULL PRIMARY KEY,
	applied_at TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS baselines (
	id            INTEGER PRIMARY KEY,
	metric        TEXT    NOT NULL,
	scope         TEXT    NOT NULL,
	driver        TEXT    NOT NULL,
	nccl          TEXT    NOT NULL,
	rdma_stack    TEXT    NOT NULL,
	version       INTEGER NOT NULL,
	direction     TEXT    NOT NULL CHECK (direction IN ('higher', 'lower')),
	value         REAL    NOT NULL,
	threshold     REAL    NOT NULL,
	sample_count  INTEGER NOT NULL,
	sample_median REAL    NOT NULL,
	sample_mad    REAL    NOT NULL,
	sample_min    REAL    NOT NULL,
	sample_max    REAL    NOT NULL,
	sample_values TEXT    NOT NULL, -- JSON array, ascending
	taken_at      TEXT    NOT NULL, -- RFC 3339, UTC
	who           TEXT    NOT NULL,
	from_run      TEXT    NOT NULL,
	note          TEXT    NOT NULL,
	stored_at     TEXT    NOT NULL,
	UNIQUE (metric, scope, driver, nccl, rdma_stack, version)
);
CREATE INDEX IF NOT EXISTS baselines_scope_metric ON baselines(scope, metric);
`

const columns = `metric, scope, driver, nccl, rdma_stack, version, direction, value, threshold,
	sample_count, sample_median, sample_mad, sample_min, sample_max, sample_values,
	taken_at, who, from_run, note`

// keyWhere selects one key's rows.
const keyWhere = `metric = ? AND scope = ? AND driver = ? AND nccl = ? AND rdma_stack = ?`

// latestOnly keeps the newest version of each key.
const latestOnly = `version = (SELECT MAX(b2.version) FROM baselines b2 WHERE b2.metric = b.metric
	AND b2.scope = b.scope AND b2.driver = b.driver AND b2.nccl = b.nccl AND b2.rdma_stack = b.rdma_stack)`

// Store keeps baselines in tables of their own (SQLite or PostgreSQL), in a database
// someone else opened (the coordinator's). Safe for concurrent use.
type Store struct {
	db  *sqldb.DB // writes, and reads without a reader
	rd  *sqldb.DB // reads
	now func() time.Time
	// reader is WithReader's pool, given the writer's dialect at NewStore.
	reader *sql.DB
}

// Option configures NewStore.
type Option func(*Store)

// WithClock sets the clock that stamps versions (default time.Now).
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// WithReader sends reads to r, for owners that keep a read-only pool
// beside a single writer connection.
func WithReader(r *sql.DB) Option { return func(s *Store) { s.reader = r } }

// WithSQLReader is WithReader for a sqldb pool.
func WithSQLReader(r *sqldb.DB) Option { return func(s *Store) { s.rd = r } }

// NewStore creates the baselines tables in db when missing and records
// their schema version in baselines_schema_version. db must allow writes;
// its owner keeps it open for the store's life. A database whose tables
// are newer than this code gives ErrSchemaTooNew.
func NewStore(db *sql.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("baselines store: nil database")
	}
	return NewSQLStore(sqldb.Wrap(db, sqldb.SQLite, nil), opts...)
}

// NewSQLStore is NewStore on either database sqldb opens.
func NewSQLStore(db *sqldb.DB, opts ...Option) (*Store, error) {
	if db == nil {
		return nil, errors.New("baselines store: nil database")
	}
	s := &Store{db: db, rd: db, now: time.Now}
	for _, o := range opts {
		o(s)
	}
	if s.reader != nil {
		s.rd = sqldb.Wrap(s.reader, db.Dialect(), nil)
	}
	ctx := context.Background()
	err := s.writeTx(ctx, func(q querier) error {
		if _, err := q.ExecContext(ctx, db.Dialect().DDL(schemaV1)); err != nil {
			return fmt.Errorf("create tables: %w", err)
		}
		var v sql.NullInt64
		if err := q.QueryRowContext(ctx, `SELECT MAX(version) FROM baselines_schema_version`).Scan(&v); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		switch {
		case !v.Valid:
			_, err := q.ExecContext(ctx, `INSERT INTO baselines_schema_version (version, applied_at) VALUES (?, ?)`,
				SchemaVersion, s.now().UTC().Format(time.RFC3339Nano))
			if err != nil {
				return fmt.Errorf("record schema version: %w", err)
			}
		case v.Int64 > SchemaVersion:
			return fmt.Errorf("%w: tables at version %d, this fleetcheck knows %d", ErrSchemaTooNew, v.Int64, SchemaVersion)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("baselines store: %w", err)
	}
	return s, nil
}

// querier is what a transaction and a pool share.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// writeTx runs fn in a write transaction (sqldb.Tx) that holds the
// baselines' write lock from its first statement: SQLite's BEGIN
// IMMEDIATE, a transaction-scoped advisory lock on PostgreSQL. A key's
// next version is read and then written, which two writers at once would
// otherwise both take.
func (s *Store) writeTx(ctx context.Context, fn func(q querier) error) error {
	return s.db.Tx(ctx, func(tx *sqldb.Tx) error {
		if tx.Dialect() == sqldb.Postgres {
			if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(writeLock)); err != nil {
				return fmt.Errorf("lock baselines: %w", err)
			}
		}
		return fn(tx)
	})
}

// writeLock is the baselines' PostgreSQL advisory lock key.
const writeLock = 0x62736c6e // "bsln"

// Set stores b as the key's next version and returns that version (the
// store numbers versions; b.Version is ignored). Value 0 takes the
// samples' median; TakenAt zero takes the store's clock.
func (s *Store) Set(ctx context.Context, b Baseline) (int, error) {
	b, err := s.prepare(b)
	if err != nil {
		return 0, fmt.Errorf("set baseline: %w", err)
	}
	var v int
	err = s.writeTx(ctx, func(q querier) error {
		var ierr error
		v, ierr = s.insert(ctx, q, b)
		return ierr
	})
	if err != nil {
		return 0, fmt.Errorf("set baseline %s: %w", b.Key, err)
	}
	return v, nil
}

func (s *Store) prepare(b Baseline) (Baseline, error) {
	b, err := b.normalize()
	if err != nil {
		return Baseline{}, err
	}
	if b.TakenAt.IsZero() {
		b.TakenAt = s.now().UTC()
	}
	return b, nil
}

// insert writes b as its key's next version, inside a write transaction.
func (s *Store) insert(ctx context.Context, q querier, b Baseline) (int, error) {
	var v int
	err := q.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) + 1 FROM baselines WHERE `+keyWhere,
		b.Metric, string(b.Scope), b.Stack.Driver, b.Stack.NCCL, b.Stack.RDMAStack).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("next version: %w", err)
	}
	values, err := json.Marshal(nonNil(b.Samples.Values))
	if err != nil {
		return 0, fmt.Errorf("encode samples: %w", err)
	}
	_, err = q.ExecContext(ctx, `INSERT INTO baselines (`+columns+`, stored_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		b.Metric, string(b.Scope), b.Stack.Driver, b.Stack.NCCL, b.Stack.RDMAStack, v,
		string(b.Direction), b.Value, b.Threshold,
		b.Samples.Count, b.Samples.Median, b.Samples.MAD, b.Samples.Min, b.Samples.Max, string(values),
		b.TakenAt.UTC().Format(time.RFC3339Nano), b.Who, b.FromRun, b.Note,
		s.now().UTC().Format(time.RFC3339Nano))
	if err != nil {
		return 0, fmt.Errorf("insert version %d: %w", v, err)
	}
	return v, nil
}

func nonNil(v []float64) []float64 {
	if v == nil {
		return []float64{}
	}
	return v
}

// Record stores the median of samples as the key's next version. The
// direction and threshold carry over from the key's latest version; a new
// key takes the direction from the metric's unit (DirectionFor) and the
// default threshold. Use Set for a metric whose unit says nothing.
func (s *Store) Record(ctx context.Context, key Key, samples []float64, who, fromRun, note string) (Baseline, error) {
	k, err := key.Normalize()
	if err != nil {
		return Baseline{}, fmt.Errorf("record baseline: %w", err)
	}
	st, err := NewStats(samples)
	if err != nil {
		return Baseline{}, fmt.Errorf("record baseline %s: %w", k, err)
	}
	var out Baseline
	err = s.writeTx(ctx, func(q querier) error {
		b := Baseline{Key: k, Samples: st, Who: who, FromRun: fromRun, Note: note}
		prev, err := s.latest(ctx, q, k)
		switch {
		case err == nil:
			b.Direction, b.Threshold = prev.Direction, prev.Threshold
		case errors.Is(err, ErrNotFound):
			d, ok := DirectionFor(k.Metric)
			if !ok {
				return fmt.Errorf("%w: the unit of %s does not say whether higher or lower is better: set the baseline with a direction", ErrInvalid, k.Metric)
			}
			b.Direction = d
		default:
			return err
		}
		if b, err = s.prepare(b); err != nil {
			return err
		}
		v, err := s.insert(ctx, q, b)
		if err != nil {
			return err
		}
		b.Version = v
		out = b
		return nil
	})
	if err != nil {
		return Baseline{}, fmt.Errorf("record baseline %s: %w", k, err)
	}
	return out, nil
}

// Get returns the key's latest version, or ErrNotFound.
func (s *Store) Get(ctx context.Context, key Key) (Baseline, error) {
	k, err := key.Normalize()
	if err != nil {
		return Baseline{}, fmt.Errorf("get baseline: %w", err)
	}
	b, err := s.latest(ctx, s.rd, k)
	if err != nil {
		return Baseline{}, fmt.Errorf("get baseline %s: %w", k, err)
	}
	return b, nil
}

func (s *Store) latest(ctx context.Context, q querier, k Key) (Baseline, error) {
	bs, err := s.query(ctx, q, `SELECT `+columns+` FROM baselines WHERE `+keyWhere+` ORDER BY version DESC LIMIT 1`,
		k.Metric, string(k.Scope), k.Stack.Driver, k.Stack.NCCL, k.Stack.RDMAStack)
	if err != nil {
		return Baseline{}, err
	}
	if len(bs) == 0 {
		return Baseline{}, ErrNotFound
	}
	return bs[0], nil
}

// History returns every version of the key, oldest first, or ErrNotFound.
func (s *Store) History(ctx context.Context, key Key) ([]Baseline, error) {
	k, err := key.Normalize()
	if err != nil {
		return nil, fmt.Errorf("baseline history: %w", err)
	}
	bs, err := s.query(ctx, s.rd, `SELECT `+columns+` FROM baselines WHERE `+keyWhere+` ORDER BY version`,
		k.Metric, string(k.Scope), k.Stack.Driver, k.Stack.NCCL, k.Stack.RDMAStack)
	if err != nil {
		return nil, fmt.Errorf("baseline history %s: %w", k, err)
	}
	if len(bs) == 0 {
		return nil, fmt.Errorf("baseline history %s: %w", k, ErrNotFound)
	}
	return bs, nil
}

// Filter selects baselines for List and Export; zero fields match all.
type Filter struct {
	Metric string
	Scope  Scope     // one scope exactly
	Kind   ScopeKind // node, sku or link
	Stack  *Stack    // one stack exactly (empty fields included)
	// AllVersions lists every version instead of each key's latest.
	AllVersions bool
}

// List returns the baselines the filter selects, ordered by metric,
// scope, stack and version.
func (s *Store) List(ctx context.Context, f Filter) ([]Baseline, error) {
	var where []string
	var args []any
	if f.Metric != "" {
		where, args = append(where, "metric = ?"), append(args, f.Metric)
	}
	if f.Scope != "" {
		sc, err := ParseScope(string(f.Scope))
		if err != nil {
			return nil, fmt.Errorf("list baselines: %w", err)
		}
		where, args = append(where, "scope = ?"), append(args, string(sc))
	}
	if f.Kind != "" {
		switch f.Kind {
		case ScopeNode, ScopeSKU, ScopeLink:
		default:
			return nil, fmt.Errorf("list baselines: %w: scope kind %q", ErrInvalid, f.Kind)
		}
		p := string(f.Kind) + ":"
		where, args = append(where, "substr(scope, 1, ?) = ?"), append(args, len(p), p)
	}
	if f.Stack != nil {
		st := f.Stack.Normalize()
		where = append(where, "driver = ? AND nccl = ? AND rdma_stack = ?")
		args = append(args, st.Driver, st.NCCL, st.RDMAStack)
	}
	if !f.AllVersions {
		where = append(where, latestOnly)
	}
	q := `SELECT ` + columns + ` FROM baselines b`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY metric, scope, driver, nccl, rdma_stack, version`
	bs, err := s.query(ctx, s.rd, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list baselines: %w", err)
	}
	return bs, nil
}

// Candidates implements Finder: the latest version of each stack's
// baseline for metric at scope.
func (s *Store) Candidates(ctx context.Context, metric string, scope Scope) ([]Baseline, error) {
	return s.List(ctx, Filter{Metric: metric, Scope: scope})
}

// query reads rows to the end before returning, so no statement stays
// open while the caller runs another (the owner's pool may hold a single
// connection).
func (s *Store) query(ctx context.Context, q querier, query string, args ...any) ([]Baseline, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Baseline
	for rows.Next() {
		var b Baseline
		var scope, dir, values, taken string
		err := rows.Scan(&b.Metric, &scope, &b.Stack.Driver, &b.Stack.NCCL, &b.Stack.RDMAStack, &b.Version,
			&dir, &b.Value, &b.Threshold,
			&b.Samples.Count, &b.Samples.Median, &b.Samples.MAD, &b.Samples.Min, &b.Samples.Max, &values,
			&taken, &b.Who, &b.FromRun, &b.Note)
		if err != nil {
			return nil, fmt.Errorf("read baseline row: %w", err)
		}
		b.Scope, b.Direction = Scope(scope), Direction(dir)
		if err := json.Unmarshal([]byte(values), &b.Samples.Values); err != nil {
			return nil, fmt.Errorf("baseline %s v%d: sample values: %w", b.Key, b.Version, err)
		}
		if b.TakenAt, err = time.Parse(time.RFC3339Nano, taken); err != nil {
			return nil, fmt.Errorf("baseline %s v%d: taken_at: %w", b.Key, b.Version, err)
		}
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read baselines: %w", err)
	}
	return out, nil
}
