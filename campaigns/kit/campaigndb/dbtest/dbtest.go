// Package dbtest opens the databases campaign store tests run on: a
// SQLite file in the test's temp dir, and a fresh database on a real
// PostgreSQL (internal/pgtest; skipped loudly on a dev box without it,
// a failure under CI=true). Each runs a test on both, so every engine is
// shown to work on the same store either way.
package dbtest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// SQLite opens a new SQLite database file in the test's temp dir.
func SQLite(t testing.TB) *sqldb.DB {
	t.Helper()
	return OpenSQLite(t, filepath.Join(t.TempDir(), "fc.db"))
}

// OpenSQLite opens (creating) the SQLite database at path, closed when the
// test ends; opening the same path again is a coordinator restart.
func OpenSQLite(t testing.TB, path string) *sqldb.DB {
	t.Helper()
	db, err := sqldb.Open(context.Background(), path, sqldb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Postgres opens a new, empty database on the package's PostgreSQL
// (pgtest.Shared: the test package's TestMain calls pgtest.Main).
func Postgres(t testing.TB) *sqldb.DB {
	t.Helper()
	db, err := sqldb.Open(context.Background(), pgtest.URL(t), sqldb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// Each runs fn as a subtest per dialect, with a new database opener.
func Each(t *testing.T, fn func(t *testing.T, open func(testing.TB) *sqldb.DB)) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) { fn(t, SQLite) })
	t.Run("postgres", func(t *testing.T) { fn(t, Postgres) })
}

// Conv turns one stored value into what an earlier release wrote.
type Conv func(v any) any

// OldMillis is a time column as unix milliseconds (0: unset), as some
// tables of the previous release stored times.
func OldMillis(v any) any {
	s, _ := v.(string)
	if b, ok := v.([]byte); ok {
		s = string(b)
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return int64(0)
	}
	return t.UnixMilli()
}

// OldText is a time column as the previous release's variable-width
// RFC 3339 text (trailing zeros of the fraction dropped).
func OldText(v any) any {
	s, _ := v.(string)
	if b, ok := v.([]byte); ok {
		s = string(b)
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return s
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// Downgrade turns a SQLite database this release wrote into one the
// previous release would have left: every table of tables is dropped and
// made again by oldDDL (the previous release's schema, verbatim), its
// rows copied back through conv[table][column]; the engine's version
// table then says 1. Opening the result with the current code is a
// coordinator upgraded in place.
func Downgrade(t testing.TB, db *sqldb.DB, engine, oldDDL string, tables []string, conv map[string]map[string]Conv) {
	t.Helper()
	ctx := context.Background()
	saved := map[string][][]any{}
	cols := map[string][]string{}
	for _, tb := range tables {
		rows, err := db.QueryContext(ctx, `SELECT * FROM `+tb)
		if err != nil {
			t.Fatal(err)
		}
		cols[tb], err = rows.Columns()
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			vals := make([]any, len(cols[tb]))
			ptrs := make([]any, len(vals))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			for i, c := range cols[tb] {
				if f := conv[tb][c]; f != nil {
					vals[i] = f(vals[i])
				}
			}
			saved[tb] = append(saved[tb], vals)
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
	}
	err := db.Tx(ctx, func(tx *sqldb.Tx) error {
		for _, tb := range tables {
			if _, err := tx.ExecContext(ctx, `DROP TABLE `+tb); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, `DROP TABLE `+engine+`_schema_version`); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, oldDDL); err != nil { // SQLite takes the whole script
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+engine+`_schema_version (version, applied_at) VALUES (1, '')`); err != nil {
			return err
		}
		for _, tb := range tables {
			q := `INSERT INTO ` + tb + ` (` + strings.Join(cols[tb], ", ") + `) VALUES (` +
				strings.TrimSuffix(strings.Repeat("?, ", len(cols[tb])), ", ") + `)`
			for _, vals := range saved[tb] {
				if _, err := tx.ExecContext(ctx, q, vals...); err != nil {
					return fmt.Errorf("%s: %w", tb, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("downgrade %s tables: %v", engine, err)
	}
}

// Version reads an engine's schema version.
func Version(t testing.TB, db *sqldb.DB, engine string) int {
	t.Helper()
	var v int
	if err := db.QueryRowContext(context.Background(), `SELECT MAX(version) FROM `+engine+`_schema_version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}
