// Package store keeps the coordinator's durable state in SQLite (the
// default) or PostgreSQL, one implementation over the two dialects of
// internal/sqldb: nodes and
// their inventory history, results (one row per inspection pass) and check
// results (one row per check on one node), the latest status of every check
// of every node, daily summaries that outlive retention, and the event log.
//
// On SQLite the database lives in one file in a data directory, in WAL mode with
// synchronous=NORMAL: a committed transaction survives a crash of the
// process (the WAL is on disk), while only an OS crash or power loss can
// take the last few commits back. Results go through a writer goroutine
// (one on SQLite, Options.Writers on PostgreSQL, a node's results always on
// the same one) that groups many of them into one transaction; Ingest
// returns only after the transaction holding its result committed.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// FileName is the database file's name inside the data directory.
const FileName = "fleetcheck.db"

// Sentinel errors; test them with errors.Is.
var (
	ErrClosed         = errors.New("store closed")
	ErrNotFound       = errors.New("not found")
	ErrIDConflict     = errors.New("result id already stored for another node")
	ErrInvalid        = errors.New("invalid result")
	ErrSchemaTooNew   = errors.New("database schema is newer than this fleetcheck")
	ErrNotInitialized = errors.New("no fleetcheck database")
	ErrLocked         = errors.New("data directory in use by another process")
	ErrBackupPostgres = errors.New("the store is on PostgreSQL: back it up with pg_dump (docs/store.md)")
)

// Options configure Open. Zero values take the defaults.
type Options struct {
	// Dir is the data directory; it is created when missing. It holds
	// the SQLite database unless URL names one.
	Dir string
	// URL, when set, is the database: postgres://... for PostgreSQL, or
	// sqlite:PATH (internal/sqldb.Parse).
	URL string
	// Fence, when set, runs first in every write transaction
	// (sqldb.Fence): a coordinator that lost its lease writes nothing.
	Fence sqldb.Fence
	// MaxBatch is the most results one transaction commits (default 512).
	MaxBatch int
	// BatchDelay is how long the writer waits for more results once one is
	// queued and the batch is not full (default 2ms; negative: do not wait,
	// commit what is queued).
	BatchDelay time.Duration
	// QueueSize bounds the results waiting for the writers (default
	// 8192, shared among them); Ingest blocks when it is full.
	QueueSize int
	// Writers is how many writers commit results on PostgreSQL, each in
	// its own transaction on its own connection, so that one batch is
	// built while another is on the server (default 4, 1..MaxWriters).
	// Every result of a node goes to the same writer: batches of
	// different writers touch different rows (no lock waits, no
	// deadlocks on the per-node tables) and a node's results are stored
	// in the order they came. SQLite has one writer whatever this says.
	Writers int
	// Logger receives the store's log lines.
	Logger zerolog.Logger
	// Now is the clock (default time.Now); tests set it.
	Now func() time.Time
	// OnCommit, when set, is called by the writer after each committed
	// batch with its size and the time the transaction took (metrics).
	// It runs on the writer goroutine, so it must not block.
	OnCommit func(results int, took time.Duration)
	// Feed, when set, is what one reader of every stored result (the
	// remediation feed) reads of their metrics. Ingest keeps those apart
	// in each check result's row (a few numbers of ~350), and a read with
	// ChecksRead.Feed takes them from there instead of the whole metrics:
	// reading them all back cost about as much as storing them.
	Feed *ChecksRead
}

func (o *Options) defaults() {
	if o.MaxBatch <= 0 {
		o.MaxBatch = 512
	}
	if o.BatchDelay == 0 {
		o.BatchDelay = 2 * time.Millisecond
	}
	if o.BatchDelay < 0 {
		o.BatchDelay = 0
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 8192
	}
	if o.Writers <= 0 {
		o.Writers = DefaultWriters
	}
	o.Writers = min(o.Writers, MaxWriters)
	if o.Now == nil {
		o.Now = time.Now
	}
}

// DefaultWriters and MaxWriters bound Options.Writers.
const (
	DefaultWriters = 4
	MaxWriters     = 16
)

// Store is an open database. Its methods are safe for concurrent use.
type Store struct {
	opts   Options
	log    zerolog.Logger
	d      sqldb.Dialect
	path   string       // the SQLite file
	target sqldb.Target // the PostgreSQL database
	// On SQLite w has one connection (one writer at a time) and r the
	// readers WAL lets run beside it; on PostgreSQL both are pools.
	w *sqldb.DB
	r *sqldb.DB

	// mu guards closed and the send side of ingest against Close.
	mu     sync.RWMutex
	closed bool
	// ingest is each writer's queue; a node's results go to
	// ingest[s.shard(node)], whose writer also owns that node's entries
	// of inv.
	ingest     []chan *ingestReq
	writers    sync.WaitGroup
	writerDone chan struct{}
	ckptStop   chan struct{}
	ckptDone   chan struct{}
	lock       *os.File // held while open

	batches   atomic.Uint64
	committed atomic.Uint64
	commitNS  atomic.Uint64

	inv    []invCache   // per writer: what it knows of its nodes' stored inventories
	orders metricOrders // each check's metric names in JSON order (jsonenc.go)
}

// Stats counts the writer's work since Open.
type Stats struct {
	Batches    uint64        // transactions committed by the writers
	Results    uint64        // results in them, duplicates included
	CommitTime time.Duration // time spent in those transactions, summed over the writers
	Writers    int           // how many writers commit results
}

// Stats returns the writers' counters.
func (s *Store) Stats() Stats {
	return Stats{
		Batches:    s.batches.Load(),
		Results:    s.committed.Load(),
		CommitTime: time.Duration(s.commitNS.Load()),
		Writers:    len(s.ingest),
	}
}

// dsn builds a go-sqlite3 connection string. The file: form keeps odd
// characters in the path from being taken for parameters.
func dsn(path string, params url.Values) string {
	u := url.URL{Scheme: "file", Opaque: (&url.URL{Path: path}).EscapedPath(), RawQuery: params.Encode()}
	return u.String()
}

func writerDSN(path string, mode string) string {
	return dsn(path, url.Values{
		"mode":             {mode},
		"_journal_mode":    {"WAL"},
		"_synchronous":     {"NORMAL"},
		"_busy_timeout":    {"10000"},
		"_txlock":          {"immediate"},
		"_foreign_keys":    {"0"},
		"_stmt_cache_size": {"64"},
		"_cache_size":      {"-65536"},
	})
}

func readerDSN(path string) string {
	return dsn(path, url.Values{
		"mode":             {"rw"},
		"_busy_timeout":    {"10000"},
		"_query_only":      {"1"},
		"_stmt_cache_size": {"32"},
	})
}

// Open opens (creating when needed) the database, brings its schema up to
// date and starts the writer: PostgreSQL when opts.URL says postgres://,
// else the SQLite file (opts.URL's sqlite:PATH, or FileName in opts.Dir).
// Close it when done.
func Open(ctx context.Context, opts Options) (*Store, error) {
	opts.defaults()
	path := ""
	if opts.URL != "" {
		t, err := sqldb.Parse(opts.URL)
		if err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
		if t.Dialect == sqldb.Postgres {
			return openPostgres(ctx, opts, t)
		}
		path = t.Path
	} else {
		if opts.Dir == "" {
			return nil, errors.New("open store: no data directory")
		}
		path = filepath.Join(opts.Dir, FileName)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	lock, err := lockDir(path + ".lock")
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	s, err := openStore(ctx, opts, path)
	if err != nil {
		_ = lock.Close() // the open error is the one to report
		return nil, err
	}
	s.lock = lock
	return s, nil
}

func newStore(opts Options, d sqldb.Dialect, w, r *sqldb.DB, writers int) *Store {
	s := &Store{
		opts:       opts,
		log:        opts.Logger,
		d:          d,
		w:          w,
		r:          r,
		ingest:     make([]chan *ingestReq, writers),
		inv:        make([]invCache, writers),
		writerDone: make(chan struct{}),
		ckptStop:   make(chan struct{}),
		ckptDone:   make(chan struct{}),
	}
	for i := range s.ingest {
		s.ingest[i] = make(chan *ingestReq, max(1, opts.QueueSize/writers))
	}
	return s
}

// startWriters starts one writer per queue; writerDone closes when all
// have finished.
func (s *Store) startWriters() {
	for i := range s.ingest {
		s.writers.Add(1)
		go func() {
			defer s.writers.Done()
			s.writer(i)
		}()
	}
	go func() {
		s.writers.Wait()
		close(s.writerDone)
	}()
}

// shard is the writer that stores node's results.
func (s *Store) shard(node string) int {
	if len(s.ingest) == 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(node)) // hash writes never fail
	return int(h.Sum32() % uint32(len(s.ingest)))
}

func openStore(ctx context.Context, opts Options, path string) (*Store, error) {
	// The writer leaves checkpoints to the checkpointer goroutine, so a
	// commit never pays for copying the WAL into the database file.
	wdb := openDB(writerDSN(path, "rwc"), "PRAGMA wal_autocheckpoint = 0")
	wdb.SetMaxOpenConns(1)
	wdb.SetMaxIdleConns(1)
	wdb.SetConnMaxLifetime(0)
	wdb.SetConnMaxIdleTime(0)
	w := sqldb.Wrap(wdb, sqldb.SQLite, opts.Fence)
	if err := checkJournal(ctx, wdb); err != nil {
		_ = w.Close() // the open error is the one to report
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	if err := migrate(ctx, w, len(migrations()), opts.Now); err != nil {
		_ = w.Close() // the migration error is the one to report
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	rdb := openDB(readerDSN(path))
	rdb.SetMaxOpenConns(8)
	rdb.SetMaxIdleConns(8)
	s := newStore(opts, sqldb.SQLite, w, sqldb.Wrap(rdb, sqldb.SQLite, nil), 1)
	s.path = path
	ck := openDB(dsn(path, url.Values{"mode": {"rw"}, "_busy_timeout": {"10000"}}))
	ck.SetMaxOpenConns(1)
	s.startWriters()
	go s.checkpointer(ck)
	return s, nil
}

// openPostgres opens the store on PostgreSQL: a pool for writes (each
// results writer takes one connection of it; other writers run beside
// them, the server orders them) and one for reads. There is no data
// directory lock: several coordinators may share the database.
func openPostgres(ctx context.Context, opts Options, t sqldb.Target) (*Store, error) {
	w, err := sqldb.OpenTarget(ctx, t, sqldb.Options{MaxOpen: opts.Writers + 8, Fence: opts.Fence})
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if err := migrate(ctx, w, len(migrations()), opts.Now); err != nil {
		_ = w.Close() // the migration error is the one to report
		return nil, fmt.Errorf("open store %s: %w", t, err)
	}
	// Reads plan each statement with the tables as they are: a plan
	// cached while a table was small (a fresh database, which no ANALYZE
	// has seen for its first minute) stays in use as it grows, and one
	// scanned results whole for each id of the feed's look-up.
	r, err := sqldb.OpenTarget(ctx, t, sqldb.Options{MaxOpen: 16, Setup: []string{"SET plan_cache_mode = force_custom_plan"}})
	if err != nil {
		_ = w.Close() // the open error is the one to report
		return nil, fmt.Errorf("open store: %w", err)
	}
	s := newStore(opts, sqldb.Postgres, w, r, opts.Writers)
	s.target = t
	close(s.ckptDone) // no checkpointer: the server manages its WAL
	s.startWriters()
	return s, nil
}

func openDB(dsn string, setup ...string) *sql.DB { return sqldb.OpenSQLiteDSN(dsn, setup...) }

// WAL sizes, in frames (pages), for the checkpointer.
const (
	checkpointEvery  = 500 * time.Millisecond
	walRestartFrames = 64 << 10 // about 256 MiB of WAL: make writers wait for a full checkpoint
)

// checkpointer copies WAL frames into the database file in the
// background. A passive checkpoint never blocks the writer; only a WAL
// grown past walRestartFrames (readers kept it from being reset) gets a
// checkpoint that waits for the writer, so the file cannot grow unbounded.
func (s *Store) checkpointer(db *sql.DB) {
	defer close(s.ckptDone)
	defer func() { _ = db.Close() }() // the checkpointer's own connection; its checkpoints are done
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	for {
		select {
		case <-s.ckptStop:
			return
		case <-t.C:
		}
		var busy, frames, done int
		if err := db.QueryRow("PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &done); err != nil {
			s.log.Warn().Err(err).Msg("store: checkpoint")
			continue
		}
		if frames > walRestartFrames {
			if err := db.QueryRow("PRAGMA wal_checkpoint(RESTART)").Scan(&busy, &frames, &done); err != nil {
				s.log.Warn().Err(err).Msg("store: restart checkpoint")
			}
		}
	}
}

// checkJournal makes sure the pragma took: a file on a filesystem without
// shared memory would fall back silently and lose concurrency.
func checkJournal(ctx context.Context, db *sql.DB) error {
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("read journal mode: %w", err)
	}
	if mode != "wal" {
		return fmt.Errorf("journal mode is %q, want wal", mode)
	}
	return nil
}

// Path is the SQLite database file's path ("" on PostgreSQL).
func (s *Store) Path() string { return s.path }

// Where says where the database is, for logs: the SQLite file, or the
// PostgreSQL URL without its password.
func (s *Store) Where() string {
	if s.d == sqldb.Postgres {
		return s.target.String()
	}
	return s.path
}

// Dialect is the database's SQL flavour.
func (s *Store) Dialect() sqldb.Dialect { return s.d }

// Close stops accepting results, commits the ones already queued, and
// closes the database.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for _, q := range s.ingest {
		close(q)
	}
	s.mu.Unlock()
	<-s.writerDone
	if s.d == sqldb.Postgres {
		return errors.Join(s.r.Close(), s.w.Close())
	}
	close(s.ckptStop)
	<-s.ckptDone
	// A checkpoint now keeps the next open from replaying a long WAL.
	if _, err := s.w.SQL().Exec("PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		s.log.Warn().Err(err).Msg("store: checkpoint at close")
	}
	return errors.Join(s.r.Close(), s.w.Close(), s.lock.Close())
}

// SchemaVersion returns the schema version the database is at.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	return schemaVersion(ctx, s.r)
}

func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
