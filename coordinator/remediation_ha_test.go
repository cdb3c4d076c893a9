package coordinator

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// stuckCollect is a fleet whose collect-bundle action hangs until its
// caller gives up: a leader stopped while an RMA's evidence is gathered.
type stuckCollect struct {
	kit.Fleet
	entered chan struct{}
}

func (f *stuckCollect) RunAction(ctx context.Context, node, action string, params map[string]string, o kit.RunOptions) (kit.ActionResult, error) {
	if action != "collect-bundle" {
		return f.Fleet.RunAction(ctx, node, action, params, o)
	}
	select {
	case f.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return kit.ActionResult{}, ctx.Err()
}

// haRemedServer is one coordinator of an HA pair on url, its campaigns
// on a simulated fleet and the wall clock (the two share no virtual one);
// mods change its configuration.
func haRemedServer(t *testing.T, url string, fleet func(*simfleet.Fleet) kit.Fleet, log *syncBuf, mods ...func(*Config)) *Server {
	t.Helper()
	f, err := simfleet.New(simfleet.Config{Nodes: 4, NodesPerLeaf: 4, Seed: 7, NoisePct: -1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), StoreURL: url,
		HeartbeatInterval: time.Second, Insecure: true, HA: HAConfig{Enabled: true, LeaseTTL: time.Second}}
	for _, m := range mods {
		m(&cfg)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, Options{Logger: zerolog.New(log), Version: "test", Fleet: fleet(f)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// Two coordinators on one PostgreSQL: the ladder runs on the leader only,
// fed from the store with a result the follower's agent sent; the
// follower lists it from the store and refuses approve and cancel with
// the leader's address; the leader is stopped in the middle of the
// remediation, and the other goes on with it from the store.
func TestHARemediationRunsOnTheLeader(t *testing.T) {
	url := pgtest.URL(t)
	ctx := tctx(t)
	var logA, logB syncBuf
	stuck := &stuckCollect{entered: make(chan struct{}, 1)}
	a := haRemedServer(t, url, func(f *simfleet.Fleet) kit.Fleet { stuck.Fleet = f; return stuck }, &logA)
	aStopped := false
	defer func() {
		if !aStopped {
			stopServer(t, a)
		}
	}()
	testwait.For(t, 10*time.Second, "a to lead", func() (bool, string) { return leading(a), logA.text() })
	var rf *remedFleet
	b := haRemedServer(t, url, func(f *simfleet.Fleet) kit.Fleet { rf = &remedFleet{Fleet: f}; return rf }, &logB)
	defer stopServer(t, b)
	ra, rb := pb.NewRemediationServiceClient(dial(t, a)), pb.NewRemediationServiceClient(dial(t, b))

	// The node's agent is connected to the follower; its failing result
	// is stored there.
	node := "gpu-0002"
	ag := mustConnect(t, b, node)
	ag.sendResult(result(node, true))
	ag.ack(10 * time.Second)

	list := func(c pb.RemediationServiceClient) []remediation.Remediation {
		doc, err := c.RemediationList(ctx, &pb.RemediationListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return decode[struct {
			Remediations []remediation.Remediation `json:"remediations"`
		}](t, doc.GetBody()).Remediations
	}
	testwait.For(t, 15*time.Second, "the leader to open a remediation from the stored result", func() (bool, string) {
		l := list(rb) // the follower reads the store
		return len(l) > 0, logA.text()
	})
	l := list(ra)
	if len(l) != 1 || l[0].Node != node || l[0].Component != "GPU3" || l[0].Step != remediation.StepReplace || l[0].State != remediation.StateShadow {
		t.Fatalf("remediations %+v, want one shadow replace of %s GPU3", l, node)
	}
	id := l[0].ID
	if !strings.Contains(logA.text(), "opened: replace on GPU3") || strings.Contains(logB.text(), "opened:") {
		t.Errorf("the remediation was not opened by the leader alone:\na: %s\nb: %s", logA.text(), logB.text())
	}

	// The follower refuses the changes, naming the leader.
	for what, call := range map[string]func() error{
		"approve": func() error { _, err := rb.RemediationApprove(ctx, &pb.RemediationRef{Id: id}); return err },
		"cancel":  func() error { _, err := rb.RemediationCancel(ctx, &pb.RemediationRef{Id: id, Reason: "x"}); return err },
	} {
		if err := call(); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), notLeaderPrefix+a.GRPCAddr().String()) {
			t.Errorf("follower %s: %v, want FailedPrecondition naming %s", what, err, a.GRPCAddr())
		}
	}

	// The leader runs it: drained, then stuck gathering the RMA's bundle.
	if _, err := ra.RemediationApprove(ctx, &pb.RemediationRef{Id: id}); err != nil {
		t.Fatalf("leader approve: %v", err)
	}
	select {
	case <-stuck.entered:
	case <-ctx.Done():
		t.Fatal("the leader never reached the collect action")
	}
	stopServer(t, a) // hands the lease on mid-remediation
	aStopped = true
	testwait.For(t, 10*time.Second, "b to take over", func() (bool, string) { return leading(b), logB.text() })

	// B's term goes on from the store: the evidence is gathered there.
	var r remediation.Remediation
	testwait.For(t, 15*time.Second, "the new leader to open the RMA", func() (bool, string) {
		doc, err := rb.RemediationShow(ctx, &pb.RemediationRef{Id: id})
		if err != nil {
			t.Fatal(err)
		}
		r = decode[remediation.Remediation](t, doc.GetBody())
		return r.RMA != nil, string(r.State) + ": " + r.Reason
	})
	if r.State != remediation.StateRMA || !r.Drained || r.RMA.Evidence.Bundle != node+":/var/lib/fleetcheck-agent/bundles/"+node+".tar.gz" {
		t.Fatalf("after the takeover: %s drained %v bundle %q", r.State, r.Drained, r.RMA.Evidence.Bundle)
	}
	if got := rf.actions(); len(got) != 1 || got[0] != node+" collect-bundle map[]" {
		t.Errorf("b's actions %q", got)
	}
}

// xidResult is a scheduled result of node with one Xid 13 on GPU0 (an
// application Xid: it counts towards the Xid rule, it triggers nothing
// by itself).
func xidResult(node string) *pb.Result {
	id, seq := nextID(node)
	now := time.Now().UnixMilli() + int64(seq)
	return &pb.Result{Id: id, Node: node, StartedUnixMs: now - 100, FinishedUnixMs: now, Status: "warn", Full: true,
		Checks: []*pb.CheckResult{{Name: "gpu.xid", Status: "warn", Findings: []*pb.Finding{
			{Severity: "warn", Component: "GPU0", Code: "XID_13", Message: "Graphics Engine Exception", Action: "restart_app"}}}}}
}

// The escalation rules' windows survive a takeover: two Xid 13s on one
// GPU before the leader stops and one after add up to the default rule's
// three within an hour, and the new leader opens the GPU reset.
func TestHAEscalationWindowsSurviveTakeover(t *testing.T) {
	url := pgtest.URL(t)
	ctx := tctx(t)
	fast := func(c *Config) { c.Remediation.Rules.Correlate.Window = config.Duration(time.Second) }
	var logA, logB syncBuf
	a := haRemedServer(t, url, func(f *simfleet.Fleet) kit.Fleet { return f }, &logA, fast)
	aStopped := false
	defer func() {
		if !aStopped {
			stopServer(t, a)
		}
	}()
	testwait.For(t, 10*time.Second, "a to lead", func() (bool, string) { return leading(a), logA.text() })
	b := haRemedServer(t, url, func(f *simfleet.Fleet) kit.Fleet { return f }, &logB, fast)
	defer stopServer(t, b)

	node := "gpu-0003"
	ag := mustConnect(t, b, node)
	for range 2 {
		ag.sendResult(xidResult(node))
		ag.ack(10 * time.Second)
	}
	last, err := b.Store().LastCheckSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 15*time.Second, "the leader's feed to read both results", func() (bool, string) {
		v, _, err := a.camp.remed().Cursor(ctx, remedCursor)
		return err == nil && v == strconv.FormatInt(last, 10), fmt.Sprintf("cursor %q (%v), last %d", v, err, last)
	})
	stopServer(t, a)
	aStopped = true
	testwait.For(t, 10*time.Second, "b to take over", func() (bool, string) { return leading(b), logB.text() })
	testwait.For(t, 10*time.Second, "b to recall the windows", func() (bool, string) {
		return strings.Contains(logB.text(), "windows recalled"), logB.text()
	})
	if rs, err := b.camp.remed().List(ctx, node, ""); err != nil || len(rs) != 0 {
		t.Fatalf("before the third Xid: %+v, %v", rs, err)
	}
	ag.sendResult(xidResult(node))
	ag.ack(10 * time.Second)
	var rs []remediation.Remediation
	testwait.For(t, 30*time.Second, "the new leader to escalate the third Xid 13", func() (bool, string) {
		rs, err = b.camp.remed().List(ctx, node, "")
		return err == nil && len(rs) > 0, fmt.Sprintf("%v %v", err, logB.text())
	})
	if len(rs) != 1 || rs[0].Component != "GPU0" || rs[0].Step != remediation.StepResetGPU || rs[0].Trigger.Source != "rule" {
		t.Fatalf("remediations after the takeover: %+v", rs)
	}
}
