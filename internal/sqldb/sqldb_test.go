package sqldb_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// both runs f against a fresh SQLite file and a fresh PostgreSQL database.
func both(t *testing.T, f func(t *testing.T, db *sqldb.DB)) {
	for _, d := range []string{"sqlite", "postgres"} {
		t.Run(d, func(t *testing.T) {
			u := "sqlite:" + filepath.Join(t.TempDir(), "t.db")
			if d == "postgres" {
				u = pgtest.URL(t)
			}
			db, err := sqldb.Open(context.Background(), u, sqldb.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			if db.Dialect().String() != d {
				t.Fatalf("dialect %v, want %s", db.Dialect(), d)
			}
			f(t, db)
		})
	}
}

const schema = `CREATE TABLE items (
	id    INTEGER PRIMARY KEY AUTOINCREMENT,
	name  TEXT NOT NULL UNIQUE,
	n     INTEGER NOT NULL DEFAULT 0,
	at    INTEGER NOT NULL DEFAULT 0,
	score REAL NOT NULL DEFAULT 0,
	body  BLOB
)`

func count(t *testing.T, db *sqldb.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM items`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestTxCommitsUpsertsAndRollsBack(t *testing.T) {
	both(t, func(t *testing.T, db *sqldb.DB) {
		ctx := context.Background()
		if _, err := db.ExecContext(ctx, db.Dialect().DDL(schema)); err != nil {
			t.Fatal(err)
		}
		var id int64
		err := db.Tx(ctx, func(tx *sqldb.Tx) error {
			// Unix milliseconds and a double must survive: 64-bit columns.
			return tx.QueryRowContext(ctx, `INSERT INTO items (name, n, at, score, body) VALUES (?, ?, ?, ?, ?) RETURNING id`,
				"a", 1, int64(1_764_000_000_000), 0.1, []byte{0, 1, 2}).Scan(&id)
		})
		if err != nil || id != 1 {
			t.Fatalf("insert: id %d, %v", id, err)
		}
		err = db.Tx(ctx, func(tx *sqldb.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO items (name, n) VALUES (?, ?)
				ON CONFLICT (name) DO UPDATE SET n = items.n + excluded.n`, "a", 41)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		var n, at int64
		var score float64
		var body []byte
		if err := db.QueryRowContext(ctx, `SELECT n, at, score, body FROM items WHERE name = ?`, "a").Scan(&n, &at, &score, &body); err != nil {
			t.Fatal(err)
		}
		if n != 42 || at != 1_764_000_000_000 || score != 0.1 || string(body) != "\x00\x01\x02" {
			t.Fatalf("row after upsert: n=%d at=%d score=%v body=%v", n, at, score, body)
		}

		boom := errors.New("boom")
		err = db.Tx(ctx, func(tx *sqldb.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO items (name) VALUES (?)`, "b"); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) || count(t, db) != 1 {
			t.Fatalf("a failed transaction must leave nothing: err %v, rows %d", err, count(t, db))
		}
		func() {
			defer func() { _ = recover() }()
			_ = db.Tx(ctx, func(tx *sqldb.Tx) error {
				if _, err := tx.ExecContext(ctx, `INSERT INTO items (name) VALUES (?)`, "c"); err != nil {
					return err
				}
				panic("writer panics")
			})
		}()
		if count(t, db) != 1 {
			t.Fatal("a panicking transaction must roll back")
		}
		err = db.Tx(ctx, func(tx *sqldb.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO items (name) VALUES (?)`, "a")
			return err
		})
		if !sqldb.IsUniqueViolation(err) {
			t.Fatalf("duplicate name: want a unique violation, got %v", err)
		}
		// The pool is still usable after all of that.
		if err := db.Tx(ctx, func(tx *sqldb.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO items (name) VALUES (?)`, "d")
			return err
		}); err != nil || count(t, db) != 2 {
			t.Fatalf("after failures: %v, rows %d", err, count(t, db))
		}
	})
}

func TestFenceRunsFirstAndStopsTheWrite(t *testing.T) {
	both(t, func(t *testing.T, db *sqldb.DB) {
		ctx := context.Background()
		if _, err := db.ExecContext(ctx, db.Dialect().DDL(schema)+`;
			CREATE TABLE lease (token INTEGER NOT NULL)`); err != nil {
			// PostgreSQL's extended protocol takes one statement at a time.
			if _, err := db.ExecContext(ctx, db.Dialect().DDL(schema)); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `CREATE TABLE lease (token INTEGER NOT NULL)`); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO lease (token) VALUES (?)`, 7); err != nil {
			t.Fatal(err)
		}
		myToken := 7
		fenced := errors.New("not the leader")
		calls := 0
		db.SetFence(func(ctx context.Context, tx *sqldb.Tx) error {
			calls++
			var cur int
			if err := tx.QueryRowContext(ctx, `SELECT token FROM lease`).Scan(&cur); err != nil {
				return err
			}
			if cur != myToken {
				return fenced
			}
			return nil
		})
		write := func() error {
			return db.Tx(ctx, func(tx *sqldb.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO items (name) VALUES (?)`, strings.Repeat("x", calls))
				return err
			})
		}
		if err := write(); err != nil || count(t, db) != 1 {
			t.Fatalf("the leader writes: %v", err)
		}
		if _, err := db.ExecContext(ctx, `UPDATE lease SET token = ?`, 8); err != nil {
			t.Fatal(err)
		}
		ran := false
		err := db.Tx(ctx, func(*sqldb.Tx) error { ran = true; return nil })
		if !errors.Is(err, fenced) || ran {
			t.Fatalf("an old leader's write must stop at the fence: err %v, body ran %v", err, ran)
		}
		if err := write(); !errors.Is(err, fenced) || count(t, db) != 1 {
			t.Fatalf("fenced write: %v, rows %d", err, count(t, db))
		}
		if calls != 3 {
			t.Fatalf("fence ran %d times, want once per transaction (3)", calls)
		}
	})
}

func TestCopyFromLoadsRowsInTheTransaction(t *testing.T) {
	both(t, func(t *testing.T, db *sqldb.DB) {
		ctx := context.Background()
		if _, err := db.ExecContext(ctx, db.Dialect().DDL(schema)); err != nil {
			t.Fatal(err)
		}
		rows := make([][]any, 500)
		for i := range rows {
			rows[i] = []any{"item" + strings.Repeat("i", i%7) + string(rune('a'+i%26)) + itoa(i), int64(i), []byte{byte(i)}}
		}
		err := db.Tx(ctx, func(tx *sqldb.Tx) error {
			n, err := tx.CopyFrom(ctx, "items", []string{"name", "n", "body"}, rows)
			if err != nil {
				return err
			}
			if n != 500 {
				t.Errorf("copied %d rows, want 500", n)
			}
			// The copied rows are visible in the same transaction.
			var c int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM items WHERE n >= ?`, 250).Scan(&c); err != nil {
				return err
			}
			if c != 250 {
				t.Errorf("%d rows with n >= 250 inside the transaction, want 250", c)
			}
			return nil
		})
		if err != nil || count(t, db) != 500 {
			t.Fatalf("copy: %v, rows %d", err, count(t, db))
		}
		err = db.Tx(ctx, func(tx *sqldb.Tx) error {
			if _, err := tx.CopyFrom(ctx, "items", []string{"name"}, [][]any{{"new1"}, {"new2"}}); err != nil {
				return err
			}
			return errors.New("changed my mind")
		})
		if err == nil || count(t, db) != 500 {
			t.Fatalf("a rolled back copy must leave nothing: %v, rows %d", err, count(t, db))
		}
	})
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// Two transactions that take two rows' locks in opposite orders: the
// server aborts one as a deadlock, and Retryable says trying it again may
// commit. Other errors are not retryable.
func TestRetryableOnARealDeadlock(t *testing.T) {
	ctx := context.Background()
	db, err := sqldb.Open(ctx, pgtest.URL(t), sqldb.Options{MaxOpen: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, sqldb.Postgres.DDL(schema)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO items (name) VALUES ('a'), ('b')`); err != nil {
		t.Fatal(err)
	}
	// Each holds its first row before either asks for its second.
	var held sync.WaitGroup
	held.Add(2)
	errs := make(chan error, 2)
	for _, order := range [][2]string{{"a", "b"}, {"b", "a"}} {
		go func() {
			errs <- db.Tx(ctx, func(tx *sqldb.Tx) error {
				if _, err := tx.ExecContext(ctx, `UPDATE items SET n = n + 1 WHERE name = ?`, order[0]); err != nil {
					held.Done()
					return err
				}
				held.Done()
				held.Wait()
				_, err := tx.ExecContext(ctx, `UPDATE items SET n = n + 1 WHERE name = ?`, order[1])
				return err
			})
		}()
	}
	var failed []error
	for range 2 {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) != 1 {
		t.Fatalf("errors %v, want one transaction aborted", failed)
	}
	if !sqldb.Retryable(failed[0]) {
		t.Fatalf("deadlock %v: not retryable", failed[0])
	}
	_, err = db.ExecContext(ctx, `INSERT INTO items (name) VALUES ('a')`)
	if err == nil || sqldb.Retryable(err) || !sqldb.IsUniqueViolation(err) {
		t.Fatalf("unique violation %v: want an error that is not retryable", err)
	}
	if sqldb.Retryable(errors.New("deadlock")) {
		t.Fatal("a plain error is retryable")
	}
}
