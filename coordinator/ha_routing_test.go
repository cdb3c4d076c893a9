package coordinator

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/leader"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// haCoord starts one of several coordinators on the PostgreSQL at url,
// its campaigns on its own agent streams (no simulated fleet).
func haCoord(t testing.TB, url string, ttl time.Duration, log *syncBuf, mod func(*Config, *Options)) *Server {
	t.Helper()
	cfg := Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), StoreURL: url,
		HeartbeatInterval: time.Second, Insecure: true, HA: HAConfig{Enabled: true, LeaseTTL: ttl}}
	opts := Options{Logger: zerolog.New(log), Version: "test"}
	if mod != nil {
		mod(&cfg, &opts)
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(t, s) })
	return s
}

func routingClient(t *testing.T, s *Server, creds credentials.TransportCredentials) pb.RoutingServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewRoutingServiceClient(cc)
}

// The leader's campaigns and an operator's check reach agents connected
// to another coordinator: checks, a multi-node run across coordinators,
// actions and a sweep, with their reports.
func TestHARoutesWorkToAgentsOnOtherCoordinators(t *testing.T) {
	url := pgtest.URL(t)
	ctx := tctx(t)
	var logA, logB syncBuf
	a := haCoord(t, url, 10*time.Minute, &logA, nil)
	testwait.For(t, 10*time.Second, "a to lead", func() (bool, string) { return leading(a), logA.text() })
	b := haCoord(t, url, 10*time.Minute, &logB, nil)
	fabric := sim.NewFabric()
	onB1 := startSimAgent(t, b, fabric, "gpu-001", nil)
	startSimAgent(t, b, fabric, "gpu-002", nil)
	startSimAgent(t, a, fabric, "gpu-003", nil)
	f := a.Fleet()
	waitConnected(t, f, "gpu-001", "gpu-002", "gpu-003")
	if leading(b) {
		t.Fatal("two leaders")
	}
	opts := kit.RunOptions{Timeout: 20 * time.Second}

	nodes, err := f.Nodes(ctx, "name=gpu-001")
	if err != nil || len(nodes) != 1 || !nodes[0].Connected || nodes[0].Activity != "idle" {
		t.Fatalf("the leader's view of a node on b: %+v %v", nodes, err)
	}
	rep, err := f.RunChecks(ctx, "gpu-001", []string{"gpu.ecc", "ib.ports"}, opts)
	if err != nil {
		t.Fatalf("check on b's node: %v\n%s", err, logB.text())
	}
	if rep.Node != "gpu-001" || rep.Status != "pass" || len(rep.Checks) != 2 || rep.Check("gpu.ecc") == nil || rep.CollectedAt == "" {
		t.Fatalf("report: %+v", rep)
	}
	// Refusals come back as refusals.
	if _, err := f.RunChecks(ctx, "gpu-001", []string{"dcgm.diag"}, opts); !errors.Is(err, kit.ErrRefused) || !strings.Contains(err.Error(), "not enabled") {
		t.Errorf("disabled check on b's node: %v", err)
	}
	if _, err := f.RunAction(ctx, "gpu-002", "rm-rf", nil, opts); !errors.Is(err, kit.ErrRefused) || !strings.Contains(err.Error(), "not in the agent's config") {
		t.Errorf("unknown action on b's node: %v", err)
	}

	// A multi-node run whose launcher is here and whose peer is on b.
	rep, err = f.RunMulti(ctx, []string{"gpu-003", "gpu-001"}, "nccl.allreduce", opts)
	if err != nil {
		t.Fatalf("multi across coordinators: %v", err)
	}
	if c := rep.Check("nccl.allreduce"); rep.Node != "gpu-003" || c == nil || c.Status != "pass" {
		t.Fatalf("2-node report: %+v", rep)
	}
	// And one launched on b.
	if _, err := f.RunMulti(ctx, []string{"gpu-002", "gpu-003"}, "nccl.allreduce", opts); err != nil {
		t.Fatalf("multi launched on b: %v", err)
	}

	res, err := f.RunAction(ctx, "gpu-001", "driver-upgrade", map[string]string{"version": "550.54.15"}, opts)
	if err != nil || !res.OK || !strings.Contains(res.Output, "installed NVIDIA driver 550.54.15") {
		t.Fatalf("upgrade on b's node: %+v %v", res, err)
	}
	if onB1.node.Driver() != "550.54.15" {
		t.Fatalf("sim driver %s", onB1.node.Driver())
	}
	if !strings.Contains(logB.text(), "routing: action from the leader") {
		t.Error("b logged no routed action")
	}

	// A sweep on the leader covers the nodes on b.
	ca := pb.NewCampaignServiceClient(dial(t, a))
	doc, err := ca.SweepStart(ctx, &pb.SpecRequest{Spec: []byte("selector: ''\n")})
	if err != nil {
		t.Fatal(err)
	}
	id := doc.GetId()
	var sr sweep.Report
	testwait.For(t, 60*time.Second, "the sweep to finish", func() (bool, string) {
		doc, err := ca.SweepReport(ctx, &pb.CampaignRef{Id: id})
		if err != nil {
			return false, err.Error()
		}
		sr = decode[sweep.Report](t, doc.GetBody())
		return sr.State != sweep.StateRunning, string(sr.State)
	})
	if sr.State != sweep.StateDone || sr.Tested != 3 || sr.Incomplete != "" || sr.SingleRuns < 3 {
		t.Fatalf("sweep: %s tested %d, %d single runs, skipped %+v: %s %s", sr.State, sr.Tested, sr.SingleRuns, sr.Skipped, sr.Error, sr.Incomplete)
	}

	// An operator's check on either coordinator reaches every node.
	for name, s := range map[string]*Server{"a": a, "b": b} {
		st, err := operator(t, s).RunCheck(ctx, &pb.RunCheckRequest{Selector: "", Checks: []string{"gpu.ecc"}, TimeoutMs: 20000})
		if err != nil {
			t.Fatal(err)
		}
		var final *pb.RunCheckProgress
		for {
			p, err := st.Recv()
			if err != nil {
				t.Fatalf("check on %s: %v", name, err)
			}
			if p.GetFinal() {
				final = p
				break
			}
		}
		if final.GetTotal() != 3 || final.GetDone() != 3 || final.GetUnreachable() != 0 || final.GetFailed() != 0 {
			t.Errorf("check on %s: %+v", name, final)
		}
		for _, o := range final.GetOutcomes() {
			if o.GetStatus() != "pass" || o.GetResultId() == "" {
				t.Errorf("check on %s: %s: %+v", name, o.GetNode(), o)
			}
		}
	}
}

// The owner refuses work whose fencing token is not the lease's: an old
// leader that was paused and wakes after a takeover reaches no agent.
func TestHARoutedWorkFencedAfterTakeover(t *testing.T) {
	url := pgtest.URL(t)
	ctx := tctx(t)
	var logA, logB syncBuf
	a := haCoord(t, url, 10*time.Minute, &logA, nil)
	testwait.For(t, 10*time.Second, "a to lead", func() (bool, string) { return leading(a), logA.text() })
	b := haCoord(t, url, time.Second, &logB, nil)
	ag := mustConnect(t, b, "gpu-001", withVersion(ProtocolVersion), func(h *pb.Hello, _ *fakeAgent) {
		h.EnabledActions = []string{"driver-upgrade"}
	})
	testwait.Until(t, 10*time.Second, "a to see gpu-001 on b", func() bool {
		n, err := a.Fleet().Nodes(ctx, "name=gpu-001")
		return err == nil && len(n) == 1 && n[0].Connected
	})

	// Directly: a stale token, and an action without one.
	rc := routingClient(t, b, insecure.NewCredentials())
	tok := a.token()
	if tok == 0 {
		t.Fatal("the leader has no token")
	}
	act := &pb.RunAction{ActionId: "a-1", Action: "driver-upgrade", Params: map[string]string{"version": "550.54.15"}, TimeoutMs: 5000}
	for name, token := range map[string]int64{"stale": tok - 1, "none": 0, "future": tok + 7} {
		res, err := rc.RouteAction(ctx, &pb.RoutedAction{FencingToken: token, Node: "gpu-001", Action: act, TimeoutMs: 5000})
		if err != nil || res.GetError() != pb.RouteError_ROUTE_ERROR_FENCED {
			t.Errorf("%s token: %v %v, want FENCED", name, res, err)
		}
	}

	// Requests out of bounds, or for work never recorded as dispatched.
	many := make([]string, 65)
	for i := range many {
		many[i] = "gpu-001"
	}
	ok := func(mod func(*pb.RoutedWork)) *pb.RoutedWork {
		r := &pb.RoutedWork{Node: "gpu-001", TimeoutMs: 5000, Run: &pb.RunChecks{WorkId: "w-never-sent", Checks: []string{"gpu.ecc"}}}
		mod(r)
		return r
	}
	for name, req := range map[string]*pb.RoutedWork{
		"no run":        ok(func(r *pb.RoutedWork) { r.Run = nil }),
		"bad node":      ok(func(r *pb.RoutedWork) { r.Node = "gpu 1; reboot" }),
		"bad check":     ok(func(r *pb.RoutedWork) { r.Run.Checks = []string{"GPU.ECC"} }),
		"no timeout":    ok(func(r *pb.RoutedWork) { r.TimeoutMs = 0 }),
		"huge timeout":  ok(func(r *pb.RoutedWork) { r.TimeoutMs = 1 << 50 }),
		"long work id":  ok(func(r *pb.RoutedWork) { r.Run.WorkId = strings.Repeat("w", 129) }),
		"many peers":    ok(func(r *pb.RoutedWork) { r.Run.Participants = many }),
		"never sent":    ok(func(*pb.RoutedWork) {}),
		"bad parameter": ok(func(r *pb.RoutedWork) { r.Run.Params = map[string]string{"Bad Name": "x"} }),
	} {
		res, err := rc.RouteWork(ctx, req)
		if err != nil || res.GetError() != pb.RouteError_ROUTE_ERROR_INVALID {
			t.Errorf("%s: %v %v, want INVALID", name, res, err)
		}
	}
	select {
	case m := <-ag.in:
		if m.GetRunChecks() != nil {
			t.Fatalf("an invalid request reached the agent: %v", m)
		}
	default:
	}

	// a freezes; its lease runs out and b takes over.
	if _, err := a.camp.deps.DB.SQL().ExecContext(ctx, `UPDATE `+leader.Table+` SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "b to take over", func() (bool, string) { return leading(b), logB.text() })
	if !a.camp.lease.Leading() {
		t.Fatal("a should still believe it leads")
	}
	// a wakes and sends an upgrade through b: refused before the agent.
	_, err := a.Fleet().RunAction(ctx, "gpu-001", "driver-upgrade", map[string]string{"version": "550.54.15"}, kit.RunOptions{Timeout: 10 * time.Second})
	if !errors.Is(err, kit.ErrRefused) || !strings.Contains(err.Error(), "is stale") {
		t.Fatalf("old leader's upgrade: %v, want refused as stale", err)
	}
	select {
	case m := <-ag.in:
		if m.GetRunAction() != nil {
			t.Fatalf("the agent got the old leader's action: %v", m)
		}
	default:
	}
	// Its call-off of a multi-node run still reaches the peer: ending a
	// run only releases the peer's reservation.
	res, err := rc.RouteEndMulti(ctx, &pb.RoutedEndMulti{FencingToken: tok, Node: "gpu-001",
		End: &pb.EndMulti{MultiId: "w-old", Launcher: "gpu-002", AbortReason: "the leader's term ended"}})
	if err != nil || res.GetError() != 0 {
		t.Fatalf("old leader's call-off: %v %v", res, err)
	}
	if m := ag.next(10 * time.Second); m.GetEndMulti().GetMultiId() != "w-old" {
		t.Fatalf("the peer got %v, want the call-off", m)
	}
	// The new leader's token is the lease's: b runs its own work locally,
	// and its token is accepted by the owner's check.
	if kind, msg, err := (&routingService{s: b}).admit(ctx, b.token(), false); err != nil || kind != 0 {
		t.Fatalf("the new leader's token: %v %s %v", kind, msg, err)
	}
}

// The node's stream moves to a third coordinator during the call, and
// its first owner is killed (its row left pointing at a dead address):
// the call waits like for a lost stream, finds the node again, sends the
// same request there and completes, the agent running it once.
func TestHARoutedCallFollowsTheNode(t *testing.T) {
	url := pgtest.URL(t)
	ctx := tctx(t)
	var logA, logB, logC syncBuf
	a := haCoord(t, url, 10*time.Minute, &logA, nil)
	testwait.For(t, 10*time.Second, "a to lead", func() (bool, string) { return leading(a), logA.text() })
	b := haCoord(t, url, 10*time.Minute, &logB, nil)
	c := haCoord(t, url, 10*time.Minute, &logC, nil)
	f := a.Fleet()
	opts := kit.RunOptions{Timeout: 30 * time.Second}
	type out struct {
		rep any
		err error
	}

	t.Run("check moves b to c", func(t *testing.T) {
		onB := mustConnect(t, b, "gpu-001")
		done := make(chan out, 1)
		go func() {
			rep, err := f.RunChecks(ctx, "gpu-001", []string{"gpu.ecc"}, opts)
			done <- out{rep, err}
		}()
		rc := onB.next(10 * time.Second).GetRunChecks()
		if rc == nil {
			t.Fatal("b's agent got no RunChecks")
		}
		onB.workStatus(rc.GetWorkId(), pb.WorkStatus_STATE_ACCEPTED, "", "")
		onB.close() // the agent fails over to c mid-run
		onC := mustConnect(t, c, "gpu-001")
		again := onC.next(10 * time.Second).GetRunChecks()
		if again == nil || again.GetWorkId() != rc.GetWorkId() {
			t.Fatalf("c's stream got %v, want the same work %s", again, rc.GetWorkId())
		}
		r := result("gpu-001", true)
		r.WorkId = rc.GetWorkId()
		onC.sendResult(r)
		o := <-done
		if o.err != nil {
			t.Fatalf("call: %v\nb:%s\nc:%s", o.err, logB.text(), logC.text())
		}
		if rep := o.rep.(*report.Report); rep.Node != "gpu-001" || rep.Status != "fail" || rep.Check("gpu.ecc") == nil {
			t.Fatalf("report: %+v", rep)
		}
		onC.close()
	})

	t.Run("result delivered before the request comes again", func(t *testing.T) {
		onC := mustConnect(t, c, "gpu-002")
		done := make(chan out, 1)
		go func() {
			rep, err := f.RunChecks(ctx, "gpu-002", []string{"gpu.ecc"}, opts)
			done <- out{rep, err}
		}()
		rc := onC.next(10 * time.Second).GetRunChecks()
		if rc == nil {
			t.Fatal("c's agent got no RunChecks")
		}
		onC.workStatus(rc.GetWorkId(), pb.WorkStatus_STATE_ACCEPTED, "", "")
		onC.close()
		// On b it flushes its spool first (b stores the result, nobody
		// there waits for it), then answers the repeated request DONE.
		onB := mustConnect(t, b, "gpu-002")
		r := result("gpu-002", false)
		r.WorkId = rc.GetWorkId()
		onB.sendResult(r)
		// The ack and the repeated request, in either order.
		var ack *pb.Ack
		var again *pb.RunChecks
		for ack == nil || again == nil {
			m := onB.next(10 * time.Second)
			if m.GetAck() != nil {
				ack = m.GetAck()
			}
			if m.GetRunChecks() != nil {
				again = m.GetRunChecks()
			}
		}
		if ack.GetRefused() != "" || again.GetWorkId() != rc.GetWorkId() {
			t.Fatalf("on b: ack %v, request %v", ack, again)
		}
		onB.workStatus(rc.GetWorkId(), pb.WorkStatus_STATE_DONE, "already done", r.GetId())
		o := <-done
		if o.err != nil {
			t.Fatalf("call: %v", o.err)
		}
		onB.close()
	})

	t.Run("check with a frozen owner", func(t *testing.T) {
		// An owner that takes the call and never answers (SIGSTOPped).
		frozen := &frozenRouting{calls: make(chan struct{}, 8)}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		pb.RegisterRoutingServiceServer(gs, frozen)
		go gs.Serve(lis) //nolint:errcheck // ends with Stop below
		defer gs.Stop()
		onB := mustConnect(t, b, "gpu-004")
		onB.close()
		testwait.Until(t, 10*time.Second, "b to see gpu-004 go", func() bool {
			o, _, err := a.Store().NodeOwner(ctx, "gpu-004")
			return err == nil && o == ""
		})
		if _, err := a.camp.deps.DB.SQL().ExecContext(ctx, `UPDATE nodes SET connected = 1, owner = 'frozen-holder', owner_addr = $1 WHERE name = 'gpu-004'`, lis.Addr().String()); err != nil {
			t.Fatal(err)
		}
		done := make(chan out, 1)
		go func() {
			rep, err := f.RunChecks(ctx, "gpu-004", []string{"gpu.ecc"}, opts)
			done <- out{rep, err}
		}()
		select {
		case <-frozen.calls:
		case <-time.After(10 * time.Second):
			t.Fatal("the frozen owner got no call")
		}
		// The agent leaves the frozen owner for c.
		onC := mustConnect(t, c, "gpu-004")
		rc := onC.next(10 * time.Second).GetRunChecks()
		if rc == nil {
			t.Fatal("c's stream got no RunChecks")
		}
		r := result("gpu-004", false)
		r.WorkId = rc.GetWorkId()
		onC.sendResult(r)
		o := <-done
		if o.err != nil {
			t.Fatalf("call: %v", o.err)
		}
		if !strings.Contains(logA.text(), "the node moved during the call") {
			t.Error("a did not say it followed the node")
		}
	})

	t.Run("action with a dead owner", func(t *testing.T) {
		actions := func(h *pb.Hello, _ *fakeAgent) { h.EnabledActions = []string{"driver-upgrade"} }
		onB := mustConnect(t, b, "gpu-003", actions)
		testwait.Until(t, 10*time.Second, "gpu-003 owned by b", func() bool {
			o, _, err := a.Store().NodeOwner(ctx, "gpu-003")
			return err == nil && o == b.holder
		})
		onB.close()
		testwait.Until(t, 10*time.Second, "b to see gpu-003 go", func() bool {
			o, _, err := a.Store().NodeOwner(ctx, "gpu-003")
			return err == nil && o == ""
		})
		// As b killed -9 leaves it: the row still names b, at an address
		// where nothing listens any more.
		dead, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		deadAddr := dead.Addr().String()
		dead.Close()
		if _, err := a.camp.deps.DB.SQL().ExecContext(ctx, `UPDATE nodes SET connected = 1, owner = 'dead-holder', owner_addr = $1 WHERE name = 'gpu-003'`, deadAddr); err != nil {
			t.Fatal(err)
		}
		done := make(chan out, 1)
		go func() {
			res, err := f.RunAction(ctx, "gpu-003", "driver-upgrade", map[string]string{"version": "550.54.15"}, opts)
			done <- out{res, err}
		}()
		testwait.For(t, 10*time.Second, "a to fail to reach the dead owner", func() (bool, string) {
			return strings.Contains(logA.text(), "did not answer"), ""
		})
		onC := mustConnect(t, c, "gpu-003", actions)
		ra := onC.next(10 * time.Second).GetRunAction()
		if ra == nil || ra.GetAction() != "driver-upgrade" || ra.GetParams()["version"] != "550.54.15" {
			t.Fatalf("c's stream got %v", ra)
		}
		onC.send(&pb.AgentMessage{Msg: &pb.AgentMessage_ActionStatus{ActionStatus: &pb.ActionStatus{ActionId: ra.GetActionId(), State: pb.ActionStatus_STATE_DONE, Message: "upgraded"}}})
		o := <-done
		if o.err != nil || !o.rep.(kit.ActionResult).OK {
			t.Fatalf("action: %+v %v", o.rep, o.err)
		}
	})
}

// RoutingService takes coordinators only: over mutual TLS a node's or an
// operator's certificate is refused, a coordinator's let through; and the
// leader's work reaches an agent on another coordinator over mTLS.
func TestHARoutingOverMutualTLS(t *testing.T) {
	url := pgtest.URL(t)
	ctx := tctx(t)
	ca := newTestCA(t)
	secure := func(name string) func(*Config, *Options) {
		return func(cfg *Config, opts *Options) {
			f := ca.files(pki.Request{Kind: pki.KindCoordinator, Name: name, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
			cfg.Insecure = false
			cfg.TLS = TLSConfig{CertFile: f.CertFile, KeyFile: f.KeyFile, CAFile: f.CAFile, TrustDomain: testTD}
			o, _, err := Secure(*cfg, *opts)
			if err != nil {
				t.Fatal(err)
			}
			*opts = o
		}
	}
	var logA, logB syncBuf
	a := haCoord(t, url, 10*time.Minute, &logA, secure("coord-a"))
	testwait.For(t, 10*time.Second, "a to lead", func() (bool, string) { return leading(a), logA.text() })
	b := haCoord(t, url, 10*time.Minute, &logB, secure("coord-b"))

	req := &pb.RoutedWork{FencingToken: 0, Node: "gpu-404", TimeoutMs: 5000,
		Run: &pb.RunChecks{WorkId: "w-1", Checks: []string{"gpu.ecc"}, TimeoutMs: 4000}}
	for _, kind := range []pki.Kind{pki.KindNode, pki.KindAdmin} {
		_, err := routingClient(t, b, ca.creds(kind, "gpu-001")).RouteWork(ctx, req)
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s certificate: %v, want PermissionDenied", kind, err)
		}
	}
	res, err := routingClient(t, b, ca.creds(pki.KindCoordinator, "coord-c")).RouteWork(ctx, req)
	if err != nil || res.GetError() != pb.RouteError_ROUTE_ERROR_NOT_HERE {
		t.Fatalf("coordinator certificate: %v %v, want NOT_HERE", res, err)
	}

	ag, err := connectCreds(t, b, ca.creds(pki.KindNode, "gpu-001"), "gpu-001", onRun(func(ag *fakeAgent, rc *pb.RunChecks) {
		ag.workStatus(rc.GetWorkId(), pb.WorkStatus_STATE_ACCEPTED, "", "")
		r := result("gpu-001", false)
		r.WorkId = rc.GetWorkId()
		ag.sendResult(r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	_ = ag
	testwait.Until(t, 10*time.Second, "a to see gpu-001 on b", func() bool {
		n, err := a.Fleet().Nodes(ctx, "name=gpu-001")
		return err == nil && len(n) == 1 && n[0].Connected
	})
	rep, err := a.Fleet().RunChecks(ctx, "gpu-001", []string{"gpu.ecc"}, kit.RunOptions{Timeout: 20 * time.Second})
	if err != nil || rep.Status != "pass" {
		t.Fatalf("routed over mTLS: %+v %v\n%s", rep, err, logA.text())
	}
}

// An agent that failed over to c before b noticed its old stream end:
// when b's stream ends at last, the node stays c's, connected, in the
// state c gave it (b's detach changes nothing; docs/ha.md, routing).
func TestHAOldStreamEndLeavesTheNewOwner(t *testing.T) {
	url := pgtest.URL(t)
	var logB, logC syncBuf
	b := haCoord(t, url, 10*time.Minute, &logB, nil)
	c := haCoord(t, url, 10*time.Minute, &logC, nil)
	onB := mustConnect(t, b, "gpu-001")
	onC := mustConnect(t, c, "gpu-001")
	n := nodeOf(t, c, "gpu-001")
	if n.Owner != c.holder || n.OwnerAddr != c.GRPCAddr().String() || !n.Connected {
		t.Fatalf("after the failover: %+v", n)
	}
	onB.close()
	testwait.For(t, 10*time.Second, "b to see its stream end", func() (bool, string) {
		return strings.Contains(logB.text(), "moved to another coordinator"), logB.text()
	})
	n = nodeOf(t, c, "gpu-001")
	if n.Owner != c.holder || !n.Connected || n.State == StateUnreachable {
		t.Fatalf("after b's old stream ended: %+v", n)
	}
	// c's own detach is recorded.
	onC.close()
	testwait.Until(t, 10*time.Second, "gpu-001 unreachable after c's stream ends", stateIs(t, c, "gpu-001", StateUnreachable))
	if n := nodeOf(t, c, "gpu-001"); n.Owner != "" || n.Connected {
		t.Fatalf("after c's stream ended: %+v", n)
	}
}

// frozenRouting takes routed calls and never answers them until the
// caller gives up: a coordinator stopped with SIGSTOP.
type frozenRouting struct {
	pb.UnimplementedRoutingServiceServer
	calls chan struct{}
}

func (f *frozenRouting) RouteWork(ctx context.Context, _ *pb.RoutedWork) (*pb.RoutedOutcome, error) {
	f.calls <- struct{}{}
	<-ctx.Done()
	return nil, ctx.Err()
}

// BenchmarkHARoutedRunChecks is one check's round trip from the leader's
// fleet to an agent on another coordinator (routed) and on the leader
// itself (local), both over one PostgreSQL: what routing adds to a call.
func BenchmarkHARoutedRunChecks(b *testing.B) {
	url := pgtest.URL(b)
	var logA, logB syncBuf
	a := haCoord(b, url, 10*time.Minute, &logA, nil)
	testwait.For(b, 10*time.Second, "a to lead", func() (bool, string) { return leading(a), logA.text() })
	f := haCoord(b, url, 10*time.Minute, &logB, nil)
	answer := onRun(func(ag *fakeAgent, rc *pb.RunChecks) {
		ag.workStatus(rc.GetWorkId(), pb.WorkStatus_STATE_ACCEPTED, "", "")
		r := result(ag.node, false)
		r.WorkId = rc.GetWorkId()
		ag.sendResult(r)
	})
	mustConnect(b, f, "gpu-routed", answer)
	mustConnect(b, a, "gpu-local", answer)
	ctx := context.Background()
	testwait.Until(b, 10*time.Second, "both nodes seen by the leader", func() bool {
		n, err := a.Fleet().Nodes(ctx, "name in (gpu-routed,gpu-local)")
		return err == nil && len(n) == 2 && n[0].Connected && n[1].Connected
	})
	for _, node := range []string{"gpu-local", "gpu-routed"} {
		b.Run(strings.TrimPrefix(node, "gpu-"), func(b *testing.B) {
			for b.Loop() {
				if _, err := a.Fleet().RunChecks(ctx, node, []string{"gpu.ecc"}, kit.RunOptions{Timeout: 20 * time.Second}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A multi-node run whose call ends (the leader's term did) is called off
// on its peers on other coordinators too, after the call's context is
// gone: else they stay reserved and the next leader's runs are refused.
func TestHARoutedMultiCalledOffWhenItsCallEnds(t *testing.T) {
	url := pgtest.URL(t)
	ctx := tctx(t)
	var logA, logB syncBuf
	a := haCoord(t, url, 10*time.Minute, &logA, nil)
	testwait.For(t, 10*time.Second, "a to lead", func() (bool, string) { return leading(a), logA.text() })
	b := haCoord(t, url, 10*time.Minute, &logB, nil)
	multi := func(h *pb.Hello, _ *fakeAgent) { h.MultiNode = true }
	peer := mustConnect(t, b, "gpu-002", multi, onRun(func(ag *fakeAgent, rc *pb.RunChecks) {
		if rc.GetRole() == pb.MultiRole_MULTI_ROLE_PEER {
			ag.workStatus(rc.GetWorkId(), pb.WorkStatus_STATE_ACCEPTED, "", "")
		}
	}))
	launcher := mustConnect(t, a, "gpu-001", multi)
	testwait.Until(t, 10*time.Second, "a to see gpu-002 on b", func() bool {
		n, err := a.Fleet().Nodes(ctx, "name=gpu-002")
		return err == nil && len(n) == 1 && n[0].Connected
	})
	call, end := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := a.Fleet().RunMulti(call, []string{"gpu-001", "gpu-002"}, "nccl.allreduce", kit.RunOptions{Timeout: 30 * time.Second})
		done <- err
	}()
	rc := launcher.next(10 * time.Second).GetRunChecks()
	if rc.GetRole() != pb.MultiRole_MULTI_ROLE_LAUNCHER {
		t.Fatalf("launcher got %v", rc)
	}
	end() // the term ends with the launch in flight
	if err := <-done; err == nil {
		t.Fatal("the call went on after its context ended")
	}
	off := peer.next(10 * time.Second).GetEndMulti()
	if off.GetMultiId() != rc.GetMultiId() || off.GetAbortReason() == "" {
		t.Fatalf("the peer on b got %v, want the run called off", off)
	}
}
