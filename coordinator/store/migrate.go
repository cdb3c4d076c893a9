package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// A migration moves the schema one version up. Migrations are only ever
// appended: a released database may be at any earlier version.
type migration struct {
	version int
	name    string
	sql     string // SQLite's form; PostgreSQL runs its DDL translation
	// pg, when set, replaces the translation on PostgreSQL.
	pg string
	// fn runs after sql in the same transaction, for steps SQL cannot do.
	fn func(ctx context.Context, tx *sqldb.Tx) error
}

func (m migration) sqlFor(d sqldb.Dialect) string {
	if d == sqldb.Postgres && m.pg != "" {
		return m.pg
	}
	return d.DDL(m.sql)
}

// migrations returns the numbered list of schema steps, version 1 first.
func migrations() []migration {
	return []migration{
		{version: 1, name: "nodes, results, check results, latest check per node, events", sql: schemaV1,
			pg: sqldb.Postgres.DDL(schemaV1) + pgResultsSeq + pgUpdatedInPlace("node_checks")},
		// A PostgreSQL database starts at the current schema, with no
		// version 1 rows to backfill (migrate --from copies summaries).
		{version: 2, name: "inventory history and daily check summaries", sql: schemaV2 + schemaV2Backfill,
			pg: sqldb.Postgres.DDL(schemaV2) + pgUpdatedInPlace("check_summaries"), fn: seedInventoryHistory},
		{version: 3, name: "work dispatched to nodes, events by kind", sql: schemaV3,
			pg: sqldb.Postgres.DDL(schemaV3) + pgDispatchesSeq},
		{version: 4, name: "what triggered each result", sql: schemaV4},
		{version: 5, name: "which coordinator holds each node's stream, and its activity", sql: schemaV5},
		{version: 6, name: "check results' metrics kept inline and uncompressed up to a page (PostgreSQL)", pg: pgChecksInline},
		{version: 7, name: "the metrics the remediation feed reads, kept apart in each check result", sql: schemaV7},
		{version: 8, name: "daily summaries hold only what retention folded in; raw check results are added up when read",
			sql: schemaV8(sqldb.SQLite), pg: schemaV8(sqldb.Postgres)},
		{version: 9, name: "check results' large metrics compressed with lz4 (PostgreSQL)", pg: pgChecksLZ4},
	}
}

// Times are unix milliseconds; JSON columns hold the report's JSON shapes.
const schemaV1 = `
CREATE TABLE nodes (
	name             TEXT PRIMARY KEY,
	labels           TEXT NOT NULL DEFAULT '{}',
	state            TEXT NOT NULL DEFAULT 'initializing',
	state_reason     TEXT NOT NULL DEFAULT '',
	state_since      INTEGER NOT NULL DEFAULT 0,
	first_seen       INTEGER NOT NULL DEFAULT 0,
	last_seen        INTEGER NOT NULL DEFAULT 0,
	inventory        TEXT NOT NULL DEFAULT '{}',
	agent_version    TEXT NOT NULL DEFAULT '',
	protocol_version TEXT NOT NULL DEFAULT '',
	connected        INTEGER NOT NULL DEFAULT 0,
	has_full         INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE results (
	id       TEXT PRIMARY KEY,
	node     TEXT NOT NULL,
	work_id  TEXT NOT NULL DEFAULT '',
	started  INTEGER NOT NULL,
	finished INTEGER NOT NULL,
	status   TEXT NOT NULL,
	"full"   INTEGER NOT NULL DEFAULT 0,
	stored   INTEGER NOT NULL
);

CREATE TABLE check_results (
	id          INTEGER PRIMARY KEY,
	result_id   TEXT NOT NULL,
	node        TEXT NOT NULL,
	check_name  TEXT NOT NULL,
	status      TEXT NOT NULL,
	reason      TEXT NOT NULL DEFAULT '',
	findings    TEXT NOT NULL DEFAULT '[]',
	metrics     TEXT NOT NULL DEFAULT '{}',
	duration_ms REAL NOT NULL DEFAULT 0,
	finished    INTEGER NOT NULL,
	stored      INTEGER NOT NULL
);
-- One index per row is what ingest can afford at 20,000 rows a second:
-- listings walk a node's rows newest first (by check too, filtering).
-- Retention walks both tables in rowid order, which is stored order.
CREATE INDEX check_results_node_finished ON check_results(node, finished);

-- The newest status of each check of each node: what the node's state is
-- derived from. A result delivered late never overrides a newer one.
CREATE TABLE node_checks (
	node       TEXT NOT NULL,
	check_name TEXT NOT NULL,
	status     TEXT NOT NULL,
	detail     TEXT NOT NULL DEFAULT '',
	result_id  TEXT NOT NULL,
	finished   INTEGER NOT NULL,
	PRIMARY KEY (node, check_name)
) WITHOUT ROWID;

CREATE TABLE events (
	id      INTEGER PRIMARY KEY AUTOINCREMENT,
	time    INTEGER NOT NULL,
	node    TEXT NOT NULL DEFAULT '',
	kind    TEXT NOT NULL,
	actor   TEXT NOT NULL DEFAULT '',
	message TEXT NOT NULL DEFAULT ''
);
CREATE INDEX events_node ON events(node, id);
`

const schemaV2 = `
CREATE TABLE inventory_history (
	id             INTEGER PRIMARY KEY,
	node           TEXT NOT NULL,
	time           INTEGER NOT NULL,
	hash           TEXT NOT NULL,
	driver_version TEXT NOT NULL DEFAULT '',
	gpu_serials    TEXT NOT NULL DEFAULT '[]',
	hca_firmware   TEXT NOT NULL DEFAULT '{}',
	inventory      TEXT NOT NULL
);
CREATE INDEX inventory_history_node ON inventory_history(node, id);

-- Per node, check and UTC day: kept when retention drops the raw rows.
CREATE TABLE check_summaries (
	node              TEXT NOT NULL,
	check_name        TEXT NOT NULL,
	day               TEXT NOT NULL,
	pass              INTEGER NOT NULL DEFAULT 0,
	warn              INTEGER NOT NULL DEFAULT 0,
	fail              INTEGER NOT NULL DEFAULT 0,
	error             INTEGER NOT NULL DEFAULT 0,
	skip              INTEGER NOT NULL DEFAULT 0,
	duration_ms_total REAL NOT NULL DEFAULT 0,
	PRIMARY KEY (node, check_name, day)
) WITHOUT ROWID;
`

const schemaV2Backfill = `
-- Raw rows from version 1 become the summaries' first days.
INSERT INTO check_summaries (node, check_name, day, pass, warn, fail, error, skip, duration_ms_total)
SELECT node, check_name, strftime('%Y-%m-%d', finished / 1000, 'unixepoch'),
       SUM(status = 'pass'), SUM(status = 'warn'), SUM(status = 'fail'),
       SUM(status = 'error'), SUM(status = 'skip'), SUM(duration_ms)
FROM check_results GROUP BY 1, 2, 3;
`

// Version 3: which node was sent which work, so a result naming a work id
// is accepted only from a node the work went to, also after a restart
// (rows are pruned with raw results, in stored order); and events listed
// by kind for the audit log.
const schemaV3 = `
CREATE TABLE dispatches (
	work_id TEXT NOT NULL,
	node    TEXT NOT NULL,
	stored  INTEGER NOT NULL
);
CREATE UNIQUE INDEX dispatches_work_node ON dispatches(work_id, node);
CREATE INDEX events_kind ON events(kind, id);
`

// Version 4: what started each pass (schedule, request, after_action), so
// a drill times detection by the agent's schedule only. Rows from before
// read ” (unknown).
const schemaV4 = `
ALTER TABLE results ADD COLUMN triggered_by TEXT NOT NULL DEFAULT '';
`

// Version 5: the coordinator that holds each node's agent stream (its
// holder id and the address others reach it at), so that several
// coordinators over one database route work to the node's owner
// (docs/ha.md); and the activity the agent last reported, for campaigns
// run by a coordinator the agent is not connected to.
const schemaV5 = `
ALTER TABLE nodes ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN owner_addr TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN activity TEXT NOT NULL DEFAULT '';
`

// Retention deletes the oldest rows in stored order: SQLite's rowid, and
// on PostgreSQL (which has none) a sequence column of the tables whose key
// is not one already (check_results has its id).
const pgResultsSeq = `
ALTER TABLE results ADD COLUMN seq BIGINT GENERATED BY DEFAULT AS IDENTITY;
CREATE INDEX results_seq ON results(seq);
`

// pgUpdatedInPlace leaves room in a table's pages for new row versions:
// every batch updates thousands of node_checks and check_summaries rows,
// and a row whose new version fits in its own page is a HOT update, with
// no index entry to add. Measured on the store benchmark: see
// docs/store.md.
func pgUpdatedInPlace(table string) string {
	return "\nALTER TABLE " + table + " SET (fillfactor = 50);\n"
}

// Version 6, PostgreSQL only: a check result's row is compressed (TOAST)
// only past 8,160 bytes instead of 2 KB, so the counters of ib.counters
// (~7 KB of JSON) and gpu.ecc (~2.6 KB) are stored as sent. pglz was the
// server's largest function at ingest; without it the server spent 20 %
// less CPU per check result in the fleet benchmark (docs/scale.md).
// Rows written before keep their form; both read the same.
const pgChecksInline = `
ALTER TABLE check_results SET (toast_tuple_target = 8160);
`

// Version 9, PostgreSQL only: the metrics of a row past 2 KB (ib.counters,
// ~7 KB of JSON, gpu.ecc, ~2.6 KB) are compressed with lz4, inline,
// about 5 to 1. Version 6 had taken pglz off, the server's largest
// function at ingest; lz4 is several times faster, and every byte not
// written saves the server more than compressing it costs: a result's
// rows are ~16 KB, and writing them (new pages, WAL) was most of the
// server's work. Readers see the same text; rows written before keep
// their form. A server built without lz4 keeps version 6's.
const pgChecksLZ4 = `
DO $$
BEGIN
	ALTER TABLE check_results ALTER COLUMN metrics SET COMPRESSION lz4;
	ALTER TABLE check_results RESET (toast_tuple_target);
EXCEPTION WHEN feature_not_supported THEN
	RAISE NOTICE 'no lz4 in this server: check results stay uncompressed';
END
$$;
`

// Version 7: the few metrics the remediation feed reads of every stored
// result (Options.Feed), kept apart at ingest, so that the leader reads
// back a few numbers per check result instead of ~350 (about 7 KB for
// ib.counters). Empty on rows from before: the feed reads their metrics.
const schemaV7 = `
ALTER TABLE check_results ADD COLUMN feed_metrics TEXT NOT NULL DEFAULT '';
`

// Version 8: ingest no longer adds every check result to its day's
// summary (one more row updated per check result); retention folds the
// rows it drops into the summaries, and a read adds the rows still kept
// (Summaries). The summaries written before held the kept rows too: they
// are taken out here, and days left empty go.
func schemaV8(d sqldb.Dialect) string {
	return `
UPDATE check_summaries SET
	pass = check_summaries.pass - raw.pass, warn = check_summaries.warn - raw.warn,
	fail = check_summaries.fail - raw.fail, error = check_summaries.error - raw.error,
	skip = check_summaries.skip - raw.skip,
	duration_ms_total = check_summaries.duration_ms_total - raw.duration_ms
FROM (SELECT node, check_name, ` + utcDay(d, "finished") + ` AS day,
		SUM(CASE WHEN status = 'pass' THEN 1 ELSE 0 END) AS pass, SUM(CASE WHEN status = 'warn' THEN 1 ELSE 0 END) AS warn,
		SUM(CASE WHEN status = 'fail' THEN 1 ELSE 0 END) AS fail, SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END) AS error,
		SUM(CASE WHEN status = 'skip' THEN 1 ELSE 0 END) AS skip, SUM(duration_ms) AS duration_ms
	FROM check_results GROUP BY 1, 2, 3) AS raw
WHERE check_summaries.node = raw.node AND check_summaries.check_name = raw.check_name AND check_summaries.day = raw.day;
DELETE FROM check_summaries WHERE pass <= 0 AND warn <= 0 AND fail <= 0 AND error <= 0 AND skip <= 0;
`
}

const pgDispatchesSeq = `
ALTER TABLE dispatches ADD COLUMN seq BIGINT GENERATED BY DEFAULT AS IDENTITY;
CREATE INDEX dispatches_seq ON dispatches(seq);
`

// seedInventoryHistory gives every known node a first history row from the
// inventory version 1 kept on the node.
func seedInventoryHistory(ctx context.Context, tx *sqldb.Tx) error {
	rows, err := tx.QueryContext(ctx, `SELECT name, inventory, last_seen FROM nodes WHERE inventory != '{}'`)
	if err != nil {
		return err
	}
	type seed struct {
		node string
		inv  report.Inventory
		at   int64
	}
	var seeds []seed
	for rows.Next() {
		var s seed
		var raw string
		if err := rows.Scan(&s.node, &raw, &s.at); err != nil {
			rows.Close()
			return err
		}
		if json.Unmarshal([]byte(raw), &s.inv) != nil {
			continue // an unreadable old inventory starts no history
		}
		seeds = append(seeds, s)
	}
	if err := rows.Err(); err != nil {
		_ = rows.Close() // the iteration error is the one to report
		return err
	}
	if err := rows.Close(); err != nil {
		return err
	}
	for _, s := range seeds {
		if err := insertInventory(ctx, tx, s.node, &s.inv, s.at); err != nil {
			return err
		}
	}
	return nil
}

type execQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func schemaVersion(ctx context.Context, db execQuerier) (int, error) {
	var v sql.NullInt64
	err := db.QueryRowContext(ctx, `SELECT MAX(version) FROM schema_version`).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return int(v.Int64), nil
}

// migrationLock is the PostgreSQL advisory lock key every migration step
// takes, so that coordinators starting together migrate one at a time.
const migrationLock = 0x666c6565 // "flee"

// migrate brings the schema to version target, one transaction per step so
// a failed step leaves the database at the previous version.
func migrate(ctx context.Context, db *sqldb.DB, target int, now func() time.Time) error {
	err := db.Tx(ctx, func(tx *sqldb.Tx) error {
		if err := lockMigrations(ctx, tx); err != nil {
			return err
		}
		// version is a key, not a rowid alias: no identity on PostgreSQL.
		_, err := tx.ExecContext(ctx, tx.Dialect().DDL(`CREATE TABLE IF NOT EXISTS schema_version (
		version    INTEGER NOT NULL,
		name       TEXT NOT NULL,
		applied_at INTEGER NOT NULL,
		PRIMARY KEY (version)
	)`))
		return err
	})
	if err != nil {
		return fmt.Errorf("create schema_version: %w", err)
	}
	cur, err := schemaVersion(ctx, db)
	if err != nil {
		return err
	}
	all := migrations()
	if cur > len(all) {
		return fmt.Errorf("%w: database at version %d, this build knows up to %d", ErrSchemaTooNew, cur, len(all))
	}
	for _, m := range all {
		if m.version <= cur || m.version > target {
			continue
		}
		if err := applyMigration(ctx, db, m, now()); err != nil {
			return fmt.Errorf("migrate to schema %d (%s): %w", m.version, m.name, err)
		}
	}
	return nil
}

func lockMigrations(ctx context.Context, tx *sqldb.Tx) error {
	if tx.Dialect() != sqldb.Postgres {
		return nil // SQLite's BEGIN IMMEDIATE already serializes writers
	}
	_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(migrationLock))
	return err
}

func applyMigration(ctx context.Context, db *sqldb.DB, m migration, at time.Time) error {
	return db.Tx(ctx, func(tx *sqldb.Tx) error {
		if err := lockMigrations(ctx, tx); err != nil {
			return err
		}
		// Another coordinator may have applied it while this one waited.
		if cur, err := schemaVersion(ctx, tx); err != nil || cur >= m.version {
			return err
		}
		if q := m.sqlFor(tx.Dialect()); q != "" { // a step may be one database's only
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		if m.fn != nil {
			if err := m.fn(ctx, tx); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)`,
			m.version, m.name, at.UnixMilli())
		return err
	})
}
