// Package pgtest starts a real PostgreSQL (Debian's postgresql package,
// /usr/lib/postgresql/*/bin) for tests: initdb into a temporary directory,
// a unix socket there and 127.0.0.1 on a free port, fsync off, stopped
// when the tests end. One server serves a test package; every test gets a
// fresh database of its own (URL).
//
// Without the binaries a test skips loudly, and fails under CI=true
// (internal/needs): .ci/run installs postgresql.
//
// initdb and postgres refuse to run as root, and CI runs as root: the
// server then runs as the postgres user the package creates, in a
// directory under /tmp that user can reach.
package pgtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, for the admin connection

	"github.com/fleetcheck/fleetcheck/internal/needs"
)

// BinDirEnv overrides where initdb and postgres are looked for.
const BinDirEnv = "FLEETCHECK_PG_BIN"

// Install is how to get the binaries, for skip messages.
const Install = "apt-get install postgresql"

// BinDir returns the directory holding initdb and postgres: $FLEETCHECK_PG_BIN,
// else PostgreSQL 15's Debian path, else the newest /usr/lib/postgresql/N/bin.
func BinDir() (string, error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		return d, checkBin(d)
	}
	if checkBin("/usr/lib/postgresql/15/bin") == nil {
		return "/usr/lib/postgresql/15/bin", nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if checkBin(d) == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("no PostgreSQL server binaries (initdb, postgres) in /usr/lib/postgresql/*/bin (%s, or set %s)", Install, BinDirEnv)
}

func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func checkBin(dir string) error {
	for _, b := range []string{"initdb", "postgres"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return fmt.Errorf("%s: %w", b, err)
		}
	}
	return nil
}

// Server is one running (or stopped) PostgreSQL cluster.
type Server struct {
	bin     string
	root    string // temporary directory: data/, sock/, server.log
	port    int
	cred    *syscall.Credential // nil when not running as root
	cmd     *exec.Cmd
	exited  chan struct{}
	mu      sync.Mutex
	dbCount atomic.Int64
}

// Start runs initdb in a new temporary directory and starts the server.
// Close stops it and removes the directory.
func Start(ctx context.Context) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, PostgreSQL needs the postgres user (created by %s): %w", Install, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	removeStale()
	// Not t.TempDir: go test's directories are 0700 root, which the
	// postgres user cannot enter, and the server outlives single tests.
	s.root, err = os.MkdirTemp("", "fleetcheck-pgtest-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = s.Close() // the start error is the one to report
		}
	}()
	if err := os.Chmod(s.root, 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{"data", "sock"} {
		p := filepath.Join(s.root, d)
		if err := os.Mkdir(p, 0o700); err != nil {
			return nil, err
		}
		if err := s.chown(p); err != nil {
			return nil, err
		}
	}
	initdb := s.command(ctx, "initdb", "-D", s.dataDir(), "-U", "postgres", "-A", "trust",
		"--no-sync", "--encoding=UTF8", "--locale=C", "--no-instructions")
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if err := s.Restart(ctx); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// removeStale deletes what killed test binaries left: directories of
// servers that are gone (Pdeathsig stopped them, nothing removed the
// files), older than an hour so that one being set up is never touched.
func removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "fleetcheck-pgtest-*"))
	for _, d := range dirs {
		fi, err := os.Stat(d)
		if err != nil || time.Since(fi.ModTime()) < time.Hour {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(d, "data", "postmaster.pid")); err == nil {
			line, _, _ := strings.Cut(string(b), "\n")
			if pid, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && syscall.Kill(pid, 0) == nil {
				continue // still running
			}
		}
		_ = os.RemoveAll(d) // best effort: a leftover is only disk space
	}
}

func (s *Server) chown(path string) error {
	if s.cred == nil {
		return nil
	}
	return os.Chown(path, int(s.cred.Uid), int(s.cred.Gid))
}

func (s *Server) dataDir() string { return filepath.Join(s.root, "data") }

// SocketDir is the directory of the server's unix socket.
func (s *Server) SocketDir() string { return filepath.Join(s.root, "sock") }

// Port is the server's TCP port on 127.0.0.1 (also the socket's number).
func (s *Server) Port() int { return s.port }

// Tool is the path of one of the server's client programs (pg_dump,
// pg_restore, psql): the same version as the server.
func (s *Server) Tool(name string) string { return filepath.Join(s.bin, name) }

// LogPath is the server's log file.
func (s *Server) LogPath() string { return filepath.Join(s.root, "server.log") }

func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.root
	// A test binary that dies without cleanup takes the server with it:
	// SIGINT is PostgreSQL's fast shutdown.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGINT}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

// Restart starts a stopped server on the same data (and port, when it is
// still free): tests of what a database restart does to its clients.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("pgtest: server already running")
	}
	var last error
	for try := 0; try < 5; try++ {
		if s.port == 0 || try > 0 {
			p, err := freePort()
			if err != nil {
				return err
			}
			s.port = p
		}
		err := s.startOnce(ctx)
		if err == nil {
			return nil
		}
		last = err
		if !strings.Contains(err.Error(), "could not bind") && !strings.Contains(err.Error(), "could not create") {
			break
		}
	}
	return last
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close() //nolint:errcheck // a probe listener
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) startOnce(ctx context.Context) error {
	logf, err := os.OpenFile(s.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() //nolint:errcheck // the child has its own descriptor
	off, _ := logf.Seek(0, 2)
	// Not CommandContext: the server outlives the context that started it.
	cmd := s.command(context.Background(), "postgres", "-D", s.dataDir(),
		"-p", strconv.Itoa(s.port), "-k", s.SocketDir(), "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=300", "-c", "shared_buffers=64MB", "-c", "max_wal_size=1GB",
		"-c", "log_min_messages=warning", "-c", "log_destination=stderr", "-c", "logging_collector=off")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // its exit is seen through exited
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := ping(ctx, s.adminURL()); err == nil {
			s.cmd, s.exited = cmd, exited
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("postgres exited at start: %s", s.logSince(off))
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-exited
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("postgres did not answer within 30s: %s", s.logSince(off))
		}
	}
}

func (s *Server) logSince(off int64) string {
	b, _ := os.ReadFile(s.LogPath())
	if int64(len(b)) > off {
		b = b[off:]
	}
	return string(bytes.TrimSpace(b))
}

func ping(ctx context.Context, u string) error {
	db, err := sql.Open("pgx", u)
	if err != nil {
		return err
	}
	defer db.Close() //nolint:errcheck // a probe
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// Stop shuts the server down (fast shutdown: clients are disconnected),
// keeping its data for Restart.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return nil
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT) // an exited process is what we want
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
	return nil
}

// Close stops the server and removes its directory.
func (s *Server) Close() error {
	err := s.Stop()
	if s.root != "" {
		err = errors.Join(err, os.RemoveAll(s.root))
	}
	return err
}

// URLFor is the URL of database name, over the unix socket.
func (s *Server) URLFor(name string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", name, s.SocketDir(), s.port)
}

// TCPURLFor is the URL of database name over 127.0.0.1.
func (s *Server) TCPURLFor(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, name)
}

func (s *Server) adminURL() string { return s.URLFor("postgres") }

var unsafeName = regexp.MustCompile(`[^a-z0-9_]+`)

// CreateDB creates a new, empty database named after hint (made unique)
// and returns its name.
func (s *Server) CreateDB(ctx context.Context, hint string) (string, error) {
	name := unsafeName.ReplaceAllString(strings.ToLower(hint), "_")
	if len(name) > 40 {
		name = name[:40]
	}
	name = fmt.Sprintf("t%d_%s", s.dbCount.Add(1), name)
	if err := s.admin(ctx, `CREATE DATABASE "`+name+`"`); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return name, nil
}

// DropDB drops a database, disconnecting its clients.
func (s *Server) DropDB(ctx context.Context, name string) error {
	return s.admin(ctx, `DROP DATABASE IF EXISTS "`+name+`" WITH (FORCE)`)
}

func (s *Server) admin(ctx context.Context, q string) error {
	db, err := sql.Open("pgx", s.adminURL())
	if err != nil {
		return err
	}
	defer db.Close() //nolint:errcheck // a short admin connection
	_, err = db.ExecContext(ctx, q)
	return err
}

// Available reports whether the PostgreSQL binaries are installed.
func Available() bool {
	_, err := BinDir()
	return err == nil
}

// The package's shared server, started by the first test that asks.
var shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Shared returns the test package's server, starting it on first use; a
// missing PostgreSQL skips the test (fails it under CI=true). Main stops it.
func Shared(t testing.TB) *Server {
	t.Helper()
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		shared.srv, shared.err = Start(ctx)
	})
	if shared.err != nil {
		if _, err := BinDir(); err != nil {
			needs.Skip(t, "PostgreSQL: %v", err)
		}
		t.Fatalf("start PostgreSQL: %v", shared.err)
	}
	return shared.srv
}

// URL returns the URL (unix socket) of a fresh, empty database on the
// package's server, dropped when the test ends.
func URL(t testing.TB) string {
	t.Helper()
	s := Shared(t)
	name, err := s.CreateDB(context.Background(), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.DropDB(context.Background(), name); err != nil {
			t.Errorf("drop test database: %v", err)
		}
	})
	return s.URLFor(name)
}

// Main runs a test package and then stops its shared server:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	if shared.srv != nil {
		if err := shared.srv.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: stop PostgreSQL:", err)
		}
	}
	os.Exit(code)
}
