package pgtest

import (
	"context"
	"database/sql"
	"os"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

func exec1(t *testing.T, url, q string, args ...any) {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func count(t *testing.T, url string) int {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestEachTestGetsItsOwnDatabaseOnSocketAndLoopback(t *testing.T) {
	a, b := URL(t), URL(t)
	if a == b {
		t.Fatal("two calls gave the same database")
	}
	exec1(t, a, `CREATE TABLE t (x int)`)
	exec1(t, a, `INSERT INTO t VALUES (1)`)
	exec1(t, b, `CREATE TABLE t (x int)`)
	if count(t, a) != 1 || count(t, b) != 0 {
		t.Fatal("databases are not separate")
	}
	s := Shared(t)
	var owner string
	db, err := sql.Open("pgx", s.TCPURLFor("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.QueryRow(`SELECT current_setting('listen_addresses') || ' fsync=' || current_setting('fsync')`).Scan(&owner); err != nil {
		t.Fatalf("over 127.0.0.1: %v", err)
	}
	if owner != "127.0.0.1 fsync=off" {
		t.Fatalf("server settings: %s", owner)
	}
}

func TestRestartKeepsTheData(t *testing.T) {
	if _, err := BinDir(); err != nil {
		Shared(t) // skips (fails in CI) with the reason
	}
	ctx := context.Background()
	s, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	name, err := s.CreateDB(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	u := s.URLFor(name)
	exec1(t, u, `CREATE TABLE t (x int)`)
	exec1(t, u, `INSERT INTO t VALUES (1), (2)`)
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := ping(ctx, u); err == nil {
		t.Fatal("a stopped server still answers")
	}
	if err := s.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, s.URLFor(name)); n != 2 {
		t.Fatalf("%d rows after restart, want 2", n)
	}
	root := s.root
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("Close left %s behind: %v", root, err)
	}
}

func TestMissingBinariesAreNamed(t *testing.T) {
	t.Setenv(BinDirEnv, t.TempDir())
	if _, err := BinDir(); err == nil {
		t.Fatal("an empty bin dir was accepted")
	}
	if _, err := Start(context.Background()); err == nil {
		t.Fatal("Start without binaries succeeded")
	}
}
