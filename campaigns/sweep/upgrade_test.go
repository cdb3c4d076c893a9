package sweep

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
)

// sweepV1 is the previous release's schema, verbatim.
const sweepV1 = `
CREATE TABLE IF NOT EXISTS sweep_schema_version (
	version    INTEGER NOT NULL PRIMARY KEY,
	applied_at TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS sweep_runs (
	id      TEXT    NOT NULL PRIMARY KEY,
	state   TEXT    NOT NULL,
	phase   TEXT    NOT NULL,
	wave    INTEGER NOT NULL,
	created TEXT    NOT NULL, -- RFC 3339, UTC, campaign clock
	ended   TEXT    NOT NULL DEFAULT '',
	error   TEXT    NOT NULL DEFAULT '',
	record  TEXT    NOT NULL, -- Record JSON without state, phase, wave, report
	report  TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS sweep_runs_created ON sweep_runs(created);
CREATE TABLE IF NOT EXISTS sweep_tests (
	sweep_id TEXT    NOT NULL,
	seq      INTEGER NOT NULL,
	phase    TEXT    NOT NULL,
	wave     INTEGER NOT NULL,
	state    TEXT    NOT NULL,
	data     TEXT    NOT NULL, -- TestRecord JSON
	PRIMARY KEY (sweep_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sweep_drains (
	sweep_id TEXT NOT NULL,
	node     TEXT NOT NULL,
	state    TEXT NOT NULL,
	data     TEXT NOT NULL, -- DrainRecord JSON
	PRIMARY KEY (sweep_id, node)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sweep_coverage (
	node         TEXT    NOT NULL PRIMARY KEY,
	last_covered INTEGER NOT NULL, -- unix ms, campaign clock
	sweep_id     TEXT    NOT NULL
) WITHOUT ROWID;
`

// A coordinator upgraded in place keeps its sweeps: tables the previous
// release wrote (variable-width times, coverage in unix ms) open with
// this release's code, the running sweep still running, coverage kept.
func TestUpgradeKeepsSweeps(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	db := openDB(t, path)
	s := sqliteStore(t, db)
	t0 := time.Date(2026, 3, 2, 2, 0, 0, 500e6, time.UTC)
	for _, r := range []Record{
		{ID: "old", State: StateRunning, Created: t0, Nodes: []NodeInfo{{Name: "n1"}}},
		{ID: "new", State: StateRunning, Created: t0.Add(time.Second), Nodes: []NodeInfo{{Name: "n2"}}},
	} {
		if err := s.CreateSweep(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	end := t0.Add(time.Hour + 250*time.Millisecond)
	if err := s.Finish(ctx, "old", StateDone, "", &Report{ID: "old"}, []string{"n1"}, end); err != nil {
		t.Fatal(err)
	}
	dbtest.Downgrade(t, db, "sweep", sweepV1, []string{"sweep_runs", "sweep_tests", "sweep_drains", "sweep_coverage"},
		map[string]map[string]dbtest.Conv{
			"sweep_runs":     {"created": dbtest.OldText, "ended": dbtest.OldText},
			"sweep_coverage": {"last_covered": dbtest.OldMillis},
		})

	s2 := sqliteStore(t, openDB(t, path)) // the upgraded coordinator
	if v := dbtest.Version(t, db, "sweep"); v != sqlTables.Version() {
		t.Fatalf("schema version %d after the upgrade, want %d", v, sqlTables.Version())
	}
	list, err := s2.Sweeps(ctx)
	if err != nil || len(list) != 2 || list[0].ID != "new" || list[0].State != StateRunning || list[1].State != StateDone || !list[1].Ended.Equal(end) {
		t.Fatalf("sweeps after the upgrade: %+v, %v", list, err)
	}
	cov, err := s2.Coverage(ctx)
	if err != nil || !cov["n1"].Equal(end.Truncate(time.Millisecond)) {
		t.Fatalf("coverage after the upgrade: %v, %v", cov, err)
	}
}
