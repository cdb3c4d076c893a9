package coordinator

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	neturl "net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/campaignpb"
	"github.com/fleetcheck/fleetcheck/coordinator/leader"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// pausedFleet is a fleet whose check runs hang, whatever their context,
// until released: the leader's process frozen mid-campaign (SIGSTOP).
type pausedFleet struct {
	kit.Fleet
	release chan struct{}
	once    sync.Once
	calls   chan struct{} // one per run that reached the pause
}

func (f *pausedFleet) pause() {
	select {
	case f.calls <- struct{}{}:
	default: // the test waits for the first only
	}
	<-f.release
}

func (f *pausedFleet) unpause() { f.once.Do(func() { close(f.release) }) }

func (f *pausedFleet) RunChecks(ctx context.Context, node string, checks []string, o kit.RunOptions) (*report.Report, error) {
	f.pause()
	return f.Fleet.RunChecks(ctx, node, checks, o)
}

func (f *pausedFleet) RunMulti(ctx context.Context, nodes []string, check string, o kit.RunOptions) (*report.Report, error) {
	f.pause()
	return f.Fleet.RunMulti(ctx, nodes, check, o)
}

func haServer(t *testing.T, url string, ttl time.Duration, fleet func(*simfleet.Fleet) kit.Fleet, log *syncBuf) *Server {
	t.Helper()
	f, err := simfleet.New(simfleet.Config{Nodes: 8, NodesPerLeaf: 4, Seed: 7, NoisePct: -1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), StoreURL: url,
		HeartbeatInterval: time.Second, Insecure: true, HA: HAConfig{Enabled: true, LeaseTTL: ttl}}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, Options{Logger: zerolog.New(log), Version: "test", Fleet: fleet(f), CampaignClock: f.Clock()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func leading(s *Server) bool { return s.camp.lead.get() != nil }

// Two coordinators on one PostgreSQL: one leads and runs the sweep; the
// other refuses campaign changes with the leader's address and serves
// reads. The leader freezes mid-sweep and its lease runs out: the other
// takes over, resumes the sweep from the store and completes it, and the
// old leader, still believing it leads, is refused by the fence.
func TestHATakeoverResumesSweepAndFencesOldLeader(t *testing.T) {
	url := pgtest.URL(t)
	ctx := tctx(t)
	var logA, logB syncBuf
	pf := &pausedFleet{release: make(chan struct{}), calls: make(chan struct{}, 64)}
	// A renews rarely (it believes it leads for minutes); B's short TTL
	// makes it try often.
	a := haServer(t, url, 10*time.Minute, func(f *simfleet.Fleet) kit.Fleet { pf.Fleet = f; return pf }, &logA)
	defer stopServer(t, a)
	defer pf.unpause()
	testwait.For(t, 10*time.Second, "a to lead", func() (bool, string) { return leading(a), logA.text() })
	b := haServer(t, url, time.Second, func(f *simfleet.Fleet) kit.Fleet { return f }, &logB)
	defer stopServer(t, b)
	ca, cb := pb.NewCampaignServiceClient(dial(t, a)), pb.NewCampaignServiceClient(dial(t, b))

	// A follower refuses a start and names the leader.
	_, err := cb.SweepStart(ctx, &pb.SpecRequest{Spec: []byte("selector: ''\n")})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), notLeaderPrefix+a.GRPCAddr().String()) {
		t.Fatalf("follower start: %v, want FailedPrecondition naming %s", err, a.GRPCAddr())
	}
	if leading(b) {
		t.Fatal("two leaders")
	}
	if _, err := ca.SweepStart(ctx, &pb.SpecRequest{Spec: []byte("selector: ''\nnote: ha\n")}); err != nil {
		t.Fatalf("leader start: %v", err)
	}
	select { // A is frozen inside the sweep
	case <-pf.calls:
	case <-ctx.Done():
		t.Fatal("a's sweep never reached the fleet")
	}
	// Reads work on the follower.
	l, err := cb.SweepList(ctx, &pb.CampaignListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	list := campaignpb.SweepListFrom(l)
	if len(list) != 1 || list[0].State != sweep.StateRunning {
		t.Fatalf("follower's list: %+v", list)
	}
	id := list[0].ID

	// A stops renewing (frozen): its lease runs out.
	admin := a.camp.deps.DB.SQL()
	if _, err := admin.ExecContext(ctx, `UPDATE `+leader.Table+` SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	expired := time.Now()
	testwait.For(t, 10*time.Second, "b to take over", func() (bool, string) { return leading(b), logB.text() })
	took := time.Since(expired)
	t.Logf("takeover %s after the lease ran out (b's ttl 1s)", took)

	// A still believes it leads; its write is refused in the database.
	if !a.camp.lease.Leading() {
		t.Fatal("a should still believe it leads (its renewal is minutes away)")
	}
	err = a.camp.eng.Load().db.Tx(ctx, func(tx *sqldb.Tx) error {
		_, err := tx.ExecContext(ctx, `SELECT 1`)
		return err
	})
	if !errors.Is(err, leader.ErrNotLeader) || !strings.Contains(err.Error(), "token 1 is stale") {
		t.Fatalf("old leader's write: %v, want fenced", err)
	}

	// B resumed the sweep from its stored state and completes it.
	var rep sweep.Report
	testwait.For(t, 30*time.Second, "the resumed sweep to finish on b", func() (bool, string) {
		doc, err := cb.SweepReport(ctx, &pb.CampaignRef{Id: id})
		if err != nil {
			return false, err.Error()
		}
		rep = decode[sweep.Report](t, doc.GetBody())
		return rep.State != sweep.StateRunning, fmt.Sprintf("%s %+v", rep.State, rep.Progress)
	})
	if rep.State != sweep.StateDone {
		t.Fatalf("sweep %s: %s", rep.State, rep.Error)
	}
	if !strings.Contains(logB.text(), "resuming sweep") {
		t.Errorf("b did not resume the sweep:\n%s", logB.text())
	}
	// The frozen leader wakes: its sweep's writes are fenced, and the
	// result stands.
	pf.unpause()
	testwait.For(t, 10*time.Second, "a's woken sweep to be fenced", func() (bool, string) {
		return strings.Contains(logA.text(), "not the leader"), ""
	})
	doc, err := cb.SweepReport(ctx, &pb.CampaignRef{Id: id})
	if err != nil {
		t.Fatal(err)
	}
	if r := decode[sweep.Report](t, doc.GetBody()); r.State != sweep.StateDone {
		t.Fatalf("after the old leader woke: %s", r.State)
	}
}

// ha: needs PostgreSQL, and its numbers have ranges.
func TestHAConfig(t *testing.T) {
	base := Config{DataDir: t.TempDir(), Insecure: true}.WithDefaults()
	for name, tc := range map[string]struct {
		url  string
		ha   HAConfig
		want string
	}{
		"sqlite":        {"", HAConfig{Enabled: true}, "needs store_url: postgres"},
		"ttl too short": {"postgres://x@127.0.0.1/db", HAConfig{Enabled: true, LeaseTTL: time.Millisecond}, "ha.lease_ttl"},
		"ttl too long":  {"postgres://x@127.0.0.1/db", HAConfig{Enabled: true, LeaseTTL: time.Hour}, "ha.lease_ttl"},
		"off, sqlite":   {"", HAConfig{LeaseTTL: time.Second}, ""},
		"ok":            {"postgres://x@127.0.0.1/db", HAConfig{Enabled: true, LeaseTTL: 3 * time.Second}, ""},
	} {
		c := base
		c.StoreURL, c.HA = tc.url, tc.ha
		err := c.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

// The database goes away under a running sweep (PostgreSQL restarting)
// while the leader's lease outlasts the outage, so no new leader comes to
// resume it: the leader itself runs the sweep again from the store once
// the database is back, and it completes. Before, it stayed running until
// some later leader picked it up (a chaos run in CI stalled on it).
func TestHASweepOutlivesADatabaseOutageUnderOneLeader(t *testing.T) {
	url := pgtest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var log syncBuf
	pf := &pausedFleet{release: make(chan struct{}), calls: make(chan struct{}, 64)}
	// A lease of minutes: the outage ends long before a renewal is due.
	a := haServer(t, url, 10*time.Minute, func(f *simfleet.Fleet) kit.Fleet { pf.Fleet = f; return pf }, &log)
	defer stopServer(t, a)
	defer pf.unpause()
	testwait.For(t, 10*time.Second, "a to lead", func() (bool, string) { return leading(a), log.text() })
	ca := pb.NewCampaignServiceClient(dial(t, a))
	st, err := ca.SweepStart(ctx, &pb.SpecRequest{Spec: []byte("selector: ''\nnote: outage\n")})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	id := st.GetId()
	select { // the sweep is inside a fleet run
	case <-pf.calls:
	case <-ctx.Done():
		t.Fatal("the sweep never reached the fleet")
	}

	// The database refuses new connections and drops the coordinator's.
	srv := pgtest.Shared(t)
	admin, err := sql.Open("pgx", srv.URLFor("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close() //nolint:errcheck // the test's admin connection
	name := dbName(t, url)
	outage := func(on bool) {
		t.Helper()
		if _, err := admin.ExecContext(ctx, fmt.Sprintf(`ALTER DATABASE %q ALLOW_CONNECTIONS %t`, name, !on)); err != nil {
			t.Fatal(err)
		}
		if on {
			if _, err := admin.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, name); err != nil {
				t.Fatal(err)
			}
		}
	}
	outage(true)
	pf.unpause() // the run comes back; storing it fails
	testwait.For(t, 30*time.Second, "the sweep's run to stop on the store's error", func() (bool, string) {
		return strings.Contains(log.text(), "sweep stopped by an error"), log.text()
	})
	outage(false)
	if !leading(a) {
		t.Fatal("a stopped leading during the outage; this test is about a leader that stays")
	}

	var rep sweep.Report
	testwait.For(t, 45*time.Second, "the sweep to finish after the outage", func() (bool, string) {
		doc, err := ca.SweepReport(ctx, &pb.CampaignRef{Id: id})
		if err != nil {
			return false, err.Error()
		}
		rep = decode[sweep.Report](t, doc.GetBody())
		return rep.State != sweep.StateRunning, fmt.Sprintf("%s %+v", rep.State, rep.Progress)
	})
	if rep.State != sweep.StateDone {
		t.Fatalf("sweep %s: %s", rep.State, rep.Error)
	}
	if strings.Contains(log.text(), "resuming sweep") {
		t.Errorf("a new term resumed the sweep; it should have been the same term's retry:\n%s", log.text())
	}
}

// dbName is the database a pgtest URL names.
func dbName(t *testing.T, u string) string {
	t.Helper()
	p, err := neturl.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(p.Path, "/")
}
