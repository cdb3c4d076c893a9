package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the lease row, read by the test
	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/coordinator/leader"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// haPostgres starts a PostgreSQL of the test's own and returns a fresh
// database's URL (cmd/fleetcheck has no pgtest.Main: no shared server).
func haPostgres(t *testing.T) string {
	t.Helper()
	if !pgtest.Available() {
		pgtest.Shared(t) // skips loudly (fails under CI=true)
	}
	ctx := context.Background()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	})
	name, err := srv.CreateDB(ctx, "ha")
	if err != nil {
		t.Fatal(err)
	}
	return srv.URLFor(name)
}

// haCoordinator runs one of several coordinators on url with mutual TLS
// (certificate id) over a simulated fleet of its own.
func haCoordinator(t *testing.T, url string, id issued, ttl time.Duration) *coordinator.Server {
	t.Helper()
	f, err := simfleet.New(simfleet.Config{Nodes: 4, NodesPerLeaf: 2, Seed: 3, NoisePct: -1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := coordinator.Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), StoreURL: url,
		HeartbeatInterval: time.Second,
		TLS:               coordinator.TLSConfig{CertFile: id.cert, KeyFile: id.key, CAFile: id.ca, TrustDomain: "fleet.test"},
		HA:                coordinator.HAConfig{Enabled: true, LeaseTTL: ttl}}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	opts, _, err := coordinator.Secure(cfg, coordinator.Options{Logger: zerolog.Nop(), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	opts.Fleet, opts.CampaignClock = f, f.Clock()
	s, err := coordinator.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return s
}

// leaseAddr is the address the lease row names, "" while nobody leads.
func leaseAddr(t *testing.T, db *sql.DB) string {
	t.Helper()
	var addr string
	err := db.QueryRow(`SELECT addr FROM ` + leader.Table + ` WHERE expires_at > now()`).Scan(&addr)
	if err != nil && err != sql.ErrNoRows {
		t.Logf("lease: %v", err) // the table may not exist yet
	}
	return addr
}

// Two coordinators on one PostgreSQL, mutual TLS: the operator's
// campaign changes sent to the follower land on the leader (the CLI
// follows the refusal), with the operator, not a coordinator, as the
// audit actor; a list of addresses whose first is down reaches the next;
// the follower's rollout reads are as current as the store.
func TestHACLIFollowsTheLeader(t *testing.T) {
	url := haPostgres(t)
	caDir := filepath.Join(t.TempDir(), "ca")
	if msg, code := execute(t, "certs", "init", "--dir", caDir, "--trust-domain", "fleet.test"); code != 0 {
		t.Fatal(msg)
	}
	admin := issue(t, caDir, "admin", "alice")
	// A's lease outlives any stall of this machine; B tries often.
	a := haCoordinator(t, url, issue(t, caDir, "coordinator", "coord-a", "--ip", "127.0.0.1"), time.Minute)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	aAddr := a.GRPCAddr().String()
	testwait.For(t, 20*time.Second, "a to lead", func() (bool, string) {
		got := leaseAddr(t, db)
		return got == aAddr, got
	})
	b := haCoordinator(t, url, issue(t, caDir, "coordinator", "coord-b", "--ip", "127.0.0.1"), time.Second)
	bAddr := b.GRPCAddr().String()
	creds := []string{"--cert", admin.cert, "--key", admin.key, "--ca", admin.ca}
	run := func(args ...string) string {
		t.Helper()
		out, code := execute(t, append(args, creds...)...)
		if code != exitOK {
			t.Fatalf("%s: exit %d: %s", strings.Join(args, " "), code, out)
		}
		return out
	}

	out := run("sweep", "start", "--selector", "sku=h100", "--note", "via the follower", "--coordinator", bAddr)
	if !strings.HasPrefix(out, "sweep ") || !strings.Contains(out, "started") {
		t.Fatalf("sweep start at the follower:\n%s", out)
	}
	sweepID := strings.Fields(out)[1]
	if out = run("sweep", "list", "--coordinator", bAddr); !strings.Contains(out, sweepID) {
		t.Fatalf("the follower's sweep list lacks %s:\n%s", sweepID, out)
	}
	// The leader runs it to the end (the rollout below needs its nodes).
	testwait.ForEvery(t, 30*time.Second, 50*time.Millisecond, "the sweep to finish", func() (bool, string) {
		out = run("sweep", "report", sweepID, "--coordinator", bAddr)
		return !strings.Contains(out, ": running,"), out
	})
	if !strings.Contains(out, "sweep "+sweepID+": done") {
		t.Fatalf("sweep report:\n%s", out)
	}

	spec := filepath.Join(t.TempDir(), "rollout.yaml")
	if err := os.WriteFile(spec, []byte("name: r550\nselector: sku=h100\ntarget: {driver: 550.90.07}\naction: driver-upgrade\ncanary: 1\napproval: manual\nwaves: [50%]\nmax_unavailable: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	matrix := filepath.Join(t.TempDir(), "matrix.yaml")
	if err := os.WriteFile(matrix, []byte("gpus:\n  - model: H100 80GB HBM3\n    drivers: [\"535.*\", \"550.*\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The first address is down: the CLI goes on to the follower, which
	// names the leader.
	out = run("rollout", "start", "-f", spec, "--matrix", matrix, "--coordinator", deadAddr(t)+","+bAddr)
	if !strings.HasPrefix(out, "rollout ") || !strings.Contains(out, "started") {
		t.Fatalf("rollout start through a dead address and the follower:\n%s", out)
	}
	rolloutID := strings.Fields(out)[1]
	if out = run("rollout", "status", rolloutID, "--coordinator", aAddr); !strings.Contains(out, rolloutID) {
		t.Fatalf("the leader's rollout status:\n%s", out)
	}
	// The follower built its rollout engine before this rollout began; its
	// reads come from the store, so they show it, and a change the leader
	// made to it since (a pause, sent to the follower and followed).
	if out = run("rollout", "list", "--coordinator", bAddr); !strings.Contains(out, rolloutID) {
		t.Fatalf("the follower's rollout list lacks %s:\n%s", rolloutID, out)
	}
	run("rollout", "pause", rolloutID, "--reason", "ha test", "--coordinator", bAddr)
	var st rollout.Status
	if err := json.Unmarshal([]byte(run("rollout", "status", rolloutID, "-o", "json", "--coordinator", bAddr)), &st); err != nil {
		t.Fatal(err)
	}
	if !st.Paused || st.PauseReason != "ha test" || len(st.Nodes) == 0 {
		t.Fatalf("the follower's rollout status: paused %v (%q), %d nodes", st.Paused, st.PauseReason, len(st.Nodes))
	}

	// Who the store says did it: the operator, for both.
	evs, err := a.Store().Events(context.Background(), store.EventQuery{Kind: store.EventAudit, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range evs {
		for _, action := range []string{"sweep.start", "rollout.start", "rollout.pause"} {
			if strings.HasPrefix(e.Message, action+":") {
				seen[action] = true
				if e.Actor != "admin:alice" {
					t.Errorf("%s recorded as %q, want admin:alice", e.Message, e.Actor)
				}
			}
		}
	}
	if len(seen) != 3 {
		t.Fatalf("audit events lack a start (%v):\n%+v", seen, evs)
	}

}
