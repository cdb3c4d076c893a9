package sqldb_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

func TestCopySQLiteToPostgresMovesEveryRow(t *testing.T) {
	ctx := context.Background()
	src, err := sqldb.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "src.db"), sqldb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	for _, q := range []string{
		`CREATE TABLE things (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, score REAL NOT NULL DEFAULT 0, raw BLOB, at INTEGER NOT NULL)`,
		`CREATE INDEX things_name ON things(name)`,
		`CREATE TABLE kv (k TEXT NOT NULL, v TEXT, PRIMARY KEY (k)) WITHOUT ROWID`,
		`CREATE TABLE app_schema_version (version INTEGER NOT NULL PRIMARY KEY, applied_at INTEGER NOT NULL)`,
		`INSERT INTO app_schema_version VALUES (1, 111), (2, 222)`,
		`INSERT INTO kv VALUES ('b', 'two'), ('a', NULL), ('quote''s', 'it''s')`,
	} {
		if _, err := src.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for i := 0; i < 2500; i++ {
		if _, err := src.ExecContext(ctx, `INSERT INTO things (name, score, raw, at) VALUES (?, ?, ?, ?)`,
			"n"+string(rune('a'+i%26)), float64(i)/3, []byte{byte(i), 0, byte(i >> 8)}, int64(1_764_000_000_000)+int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	// A gap in the ids: the copy keeps ids, and new rows come after the last.
	if _, err := src.ExecContext(ctx, `DELETE FROM things WHERE id BETWEEN 10 AND 19`); err != nil {
		t.Fatal(err)
	}

	dst, err := sqldb.Open(ctx, pgtest.URL(t), sqldb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	// The target's own set-up made the version table (later applied_at).
	for _, q := range []string{
		`CREATE TABLE app_schema_version (version BIGINT NOT NULL PRIMARY KEY, applied_at BIGINT NOT NULL)`,
		`INSERT INTO app_schema_version VALUES (1, 999), (2, 999)`,
	} {
		if _, err := dst.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	opts := sqldb.CopyOptions{Versions: []string{"app_schema_version"}, BatchRows: 1000}
	got, err := sqldb.CopySQLiteToPostgres(ctx, src, dst, opts)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]sqldb.TableCopy{}
	for _, c := range got {
		byName[c.Table] = c
		if !c.OK() {
			t.Errorf("%s: %+v", c.Table, c)
		}
	}
	if c := byName["things"]; c.SourceRows != 2490 || !c.Created {
		t.Errorf("things: %+v, want 2490 rows in a created table", c)
	}
	if c := byName["kv"]; c.TargetRows != 3 {
		t.Errorf("kv: %+v", c)
	}
	var applied int64
	if err := dst.QueryRowContext(ctx, `SELECT applied_at FROM app_schema_version WHERE version = 2`).Scan(&applied); err != nil || applied != 222 {
		t.Errorf("version rows: applied_at %d %v, want the source's 222", applied, err)
	}
	var id int64
	if err := dst.QueryRowContext(ctx, `INSERT INTO things (name, at) VALUES ('new', 0) RETURNING id`).Scan(&id); err != nil || id != 2501 {
		t.Errorf("next id after the copy: %d %v, want 2501", id, err)
	}
	var raw []byte
	var score float64
	if err := dst.QueryRowContext(ctx, `SELECT raw, score FROM things WHERE id = ?`, 300).Scan(&raw, &score); err != nil ||
		string(raw) != string([]byte{299 % 256, 0, 1}) || score != float64(299)/3 {
		t.Errorf("row 300: raw %v score %v %v", raw, score, err)
	}

	// Again: the target holds rows now.
	if _, err := sqldb.CopySQLiteToPostgres(ctx, src, dst, opts); !errors.Is(err, sqldb.ErrNotEmpty) {
		t.Fatalf("copy into a non-empty target: %v, want ErrNotEmpty", err)
	}
	opts.Replace = true
	got, err = sqldb.CopySQLiteToPostgres(ctx, src, dst, opts)
	if err != nil {
		t.Fatalf("copy with Replace: %v", err)
	}
	for _, c := range got {
		if c.Table == "things" && (c.TargetRows != 2490 || c.Created) {
			t.Errorf("replaced things: %+v", c)
		}
	}
	// A target at other schema versions is refused.
	if _, err := dst.ExecContext(ctx, `INSERT INTO app_schema_version VALUES (3, 0)`); err != nil {
		t.Fatal(err)
	}
	if _, err := sqldb.CopySQLiteToPostgres(ctx, src, dst, opts); err == nil {
		t.Fatal("copy onto a target at another schema version succeeded")
	}
	if _, err := sqldb.CopySQLiteToPostgres(ctx, dst, src, opts); err == nil {
		t.Fatal("copy from PostgreSQL to SQLite accepted")
	}
}
