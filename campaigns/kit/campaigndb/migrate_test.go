package campaigndb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var log = campaigndb.EventLog{Table: "t_events", Key: "t_id", Index: "t_events_t", Noun: "thing"}

func testSchema(steps ...campaigndb.Step) campaigndb.Schema {
	return campaigndb.Schema{Name: "t", Current: `
CREATE TABLE IF NOT EXISTS t_things (
	id    TEXT    NOT NULL PRIMARY KEY,
	n     INTEGER NOT NULL DEFAULT 0,
	at    TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS t_things_at ON t_things(at);
` + log.DDL(), Steps: steps}
}

// The migrator on both databases: a new database gets Current and the
// latest version; an older one runs only the steps above its version, in
// order, in one transaction; a newer one is refused.
func TestMigrate(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, open func(testing.TB) *sqldb.DB) {
		ctx := context.Background()
		db := open(t)
		now := time.Date(2026, 3, 2, 2, 0, 0, 0, time.UTC)
		var ran []string
		step := func(name string) campaigndb.Step {
			return campaigndb.Step{What: name, Up: func(context.Context, *sqldb.Tx) error { ran = append(ran, name); return nil }}
		}
		if err := testSchema(step("v2")).Migrate(ctx, db, now); err != nil {
			t.Fatal(err)
		}
		if len(ran) != 0 || dbtest.Version(t, db, "t") != 2 {
			t.Fatalf("a new database ran steps %v, version %d; want none and 2", ran, dbtest.Version(t, db, "t"))
		}
		if err := log.Record(ctx, db, "a", "n1", now, "made"); err != nil {
			t.Fatal(err)
		}
		if err := testSchema(step("v2"), step("v3"), step("v4")).Migrate(ctx, db, now); err != nil {
			t.Fatal(err)
		}
		if len(ran) != 2 || ran[0] != "v3" || ran[1] != "v4" || dbtest.Version(t, db, "t") != 4 {
			t.Fatalf("upgrade from 2 ran %v, version %d; want [v3 v4] and 4", ran, dbtest.Version(t, db, "t"))
		}
		// A failing step leaves the database as it was.
		broken := campaigndb.Step{What: "broken", Up: func(ctx context.Context, tx *sqldb.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO t_things (id) VALUES ('half')`); err != nil {
				return err
			}
			return errors.New("disk on fire")
		}}
		if err := testSchema(step("v2"), step("v3"), step("v4"), broken).Migrate(ctx, db, now); err == nil {
			t.Fatal("a failing step: want its error")
		}
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM t_things`).Scan(&n); err != nil || n != 0 || dbtest.Version(t, db, "t") != 4 {
			t.Fatalf("after a failed step: %d rows, version %d, %v; want 0 rows and 4", n, dbtest.Version(t, db, "t"), err)
		}
		if err := testSchema(step("v2")).Migrate(ctx, db, now); !errors.Is(err, campaigndb.ErrSchemaTooNew) {
			t.Fatalf("tables newer than the code: %v, want ErrSchemaTooNew", err)
		}
		evs, err := log.List(ctx, db, "a")
		if err != nil || len(evs) != 1 || evs[0].What != "made" || !evs[0].At.Equal(now) {
			t.Fatalf("events %+v, %v", evs, err)
		}
	})
}

// Rebuild and MillisToTime turn an earlier release's unix-ms column into
// text, keeping every row.
func TestRebuildConvertsMillis(t *testing.T) {
	ctx := context.Background()
	db := dbtest.SQLite(t)
	at := time.Date(2026, 3, 2, 2, 0, 0, 123e6, time.UTC)
	err := db.Tx(ctx, func(tx *sqldb.Tx) error {
		if _, err := tx.ExecContext(ctx, `CREATE TABLE t_things (id TEXT NOT NULL PRIMARY KEY, n INTEGER NOT NULL, at INTEGER NOT NULL, gone TEXT)`); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO t_things (id, n, at, gone) VALUES ('a', 7, ?, 'x'), ('b', 8, 0, 'y')`, at.UnixMilli())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Tx(ctx, func(tx *sqldb.Tx) error {
		return campaigndb.Rebuild(ctx, tx, testSchema().Current, "t_things", map[string]func(any) (any, error){"at": campaigndb.MillisToTime})
	})
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	r, err := db.QueryContext(ctx, `SELECT id, n, at FROM t_things`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var id, s string
		var n int
		if err := r.Scan(&id, &n, &s); err != nil {
			t.Fatal(err)
		}
		rows[id] = s
	}
	r.Close()
	if len(rows) != 2 || rows["a"] != campaigndb.Time(at) || rows["b"] != "" {
		t.Fatalf("rebuilt rows %v, want a at %s and b unset", rows, campaigndb.Time(at))
	}
}
