package coordinator

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/internal/membership"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/sim/faultnet"
)

// fastGossip detects a dead member in about a second: fast enough for a
// test, slow enough that a member starved by the race detector on two CPUs
// is not declared dead.
func fastGossip(c *membership.Config) {
	c.ProbeInterval = 200 * time.Millisecond
	c.ProbeTimeout = 100 * time.Millisecond
	c.GossipInterval = 50 * time.Millisecond
	c.SuspicionMult = 3
	c.PushPullInterval = time.Second
	c.TCPTimeout = 2 * time.Second
	c.RejoinInterval = 300 * time.Millisecond
}

// gossipNet is an in-memory network (memberlist's MockNetwork) behind a
// faultnet.Network, with a transport per member made before any member starts.
type gossipNet struct {
	faults     *faultnet.Network
	transports map[string]memberlist.Transport
}

func newGossipNet(t *testing.T, names ...string) *gossipNet {
	var network memberlist.MockNetwork
	g := &gossipNet{faults: faultnet.New(), transports: map[string]memberlist.Transport{}}
	for _, n := range names {
		g.transports[n] = g.faults.Wrap(network.NewTransport(n))
	}
	t.Cleanup(g.faults.Close)
	return g
}

// gossipServer starts a coordinator with gossip on the test network: mTLS
// when ca is set, else insecure; encrypted when keyring is set.
func gossipServer(t *testing.T, gn *gossipNet, ca *testCA, keyring [][]byte) *Server {
	t.Helper()
	dir := t.TempDir()
	cfg := Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: dir, HeartbeatInterval: time.Second,
		Gossip: &membership.FileConfig{Bind: "127.0.0.1"}}
	if keyring != nil {
		kf := filepath.Join(t.TempDir(), "gossip.keys")
		if err := os.WriteFile(kf, membership.FormatKeyring(keyring), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg.Gossip.KeyringFile = kf
	}
	opts := Options{Logger: zerolog.Nop(), Version: "test", Gossip: func(c *membership.Config) {
		fastGossip(c)
		c.Transport = gn.transports[DefaultGossipName]
	}}
	if ca != nil {
		f := ca.files(pki.Request{Kind: pki.KindCoordinator, Name: "coord", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
		cfg.TLS = TLSConfig{CertFile: f.CertFile, KeyFile: f.KeyFile, CAFile: f.CAFile, TrustDomain: testTD}
		var err error
		if opts, _, err = Secure(cfg, opts); err != nil {
			t.Fatal(err)
		}
	} else {
		cfg.Insecure = true
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(t, s) })
	if s.GossipAddr() == "" {
		t.Fatal("gossip on, but the coordinator has no gossip address")
	}
	return s
}

// gossipAgent is an agent's gossip member joined to the coordinator.
func gossipAgent(t *testing.T, gn *gossipNet, s *Server, name string, keyring [][]byte) *membership.Pool {
	t.Helper()
	c := membership.LoopbackConfig(name)
	fastGossip(&c)
	c.Transport = gn.transports[name]
	c.Join = []string{s.GossipAddr()}
	c.Keyring = keyring
	c.Meta.Labels = map[string]string{"rack": "r1"}
	p, err := membership.New(c, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown() })
	return p
}

func withGossip(addr string) agentOpt {
	return func(h *pb.Hello, _ *fakeAgent) { h.GossipAddr = addr }
}

func gossipSees(s *Server, name string, want membership.State) func() bool {
	return func() bool {
		m, ok := s.GossipPool().Member(name)
		return ok && m.State == want
	}
}

func TestGossipDeadIsOnlyAHint(t *testing.T) {
	gn := newGossipNet(t, DefaultGossipName, "gpu-001", "gpu-002")
	s := gossipServer(t, gn, nil, nil)
	p1 := gossipAgent(t, gn, s, "gpu-001", nil)
	p2 := gossipAgent(t, gn, s, "gpu-002", nil)
	a1 := mustConnect(t, s, "gpu-001", withGossip(p1.LocalMember().Addr))
	a2 := mustConnect(t, s, "gpu-002", withGossip(p2.LocalMember().Addr))
	if a1.welcome.GetGossipAddr() != s.GossipAddr() {
		t.Errorf("Welcome.gossip_addr = %q, want the coordinator's %q", a1.welcome.GetGossipAddr(), s.GossipAddr())
	}
	a1.sendResult(result("gpu-001", false))
	a2.sendResult(result("gpu-002", false))
	testwait.Until(t, 5*time.Second, "both healthy", func() bool {
		return stateIs(t, s, "gpu-001", StateHealthy)() && stateIs(t, s, "gpu-002", StateHealthy)()
	})

	testwait.Until(t, 10*time.Second, "both members alive in the coordinator's pool", func() bool {
		return gossipSees(s, "gpu-001", membership.StateAlive)() && gossipSees(s, "gpu-002", membership.StateAlive)()
	})

	// Cut gpu-001's gossip; its agent stream stays up.
	gn.faults.Partition(p1.LocalMember().Addr)
	testwait.Until(t, 15*time.Second, "gpu-001 unreachable from gossip", stateIs(t, s, "gpu-001", StateUnreachable))
	n := nodeOf(t, s, "gpu-001")
	if !strings.HasPrefix(n.StateReason, "gossip: ") || !strings.Contains(n.StateReason, "stream still connected") {
		t.Errorf("reason = %q, want it to say gossip and that the stream is up", n.StateReason)
	}
	if !n.Connected {
		t.Error("a gossip hint marked the node disconnected")
	}
	// Campaigns see what the stream and the results say, not the hint.
	nodes, err := s.Fleet().Nodes(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, cn := range nodes {
		if cn.Name == "gpu-001" && (cn.State != StateHealthy || !cn.Connected) {
			t.Errorf("campaign view of gpu-001 = %s connected=%v, want healthy and connected", cn.State, cn.Connected)
		}
	}
	if st := nodeOf(t, s, "gpu-002").State; st != StateHealthy {
		t.Errorf("gpu-002 = %s, want healthy: only the cut member is a hint", st)
	}
	// A new result while cut keeps the hint (only a failure outranks it).
	a1.sendResult(result("gpu-001", false))
	if a := a1.ack(5 * time.Second); a == nil {
		t.Fatal("no ack")
	}
	if st := nodeOf(t, s, "gpu-001").State; st != StateUnreachable {
		t.Errorf("after a passing result while cut: %s, want unreachable", st)
	}

	// Heal: the rejoin loop brings the member back, and the hint clears.
	gn.faults.Heal()
	testwait.Until(t, 15*time.Second, "gpu-001 healthy again after heal", stateIs(t, s, "gpu-001", StateHealthy))
	evs := eventsOf(t, s, "gpu-001")
	if !hasEvent(evs, "gossip: member stopped answering probes") || !hasEvent(evs, "answers probes again") {
		t.Errorf("events do not tell the gossip story: %q", evs)
	}

	// A clean leave is noted and changes no state.
	if err := p2.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 10*time.Second, "gpu-002 left", gossipSees(s, "gpu-002", membership.StateLeft))
	testwait.Until(t, 5*time.Second, "leave event", func() bool { return hasEvent(eventsOf(t, s, "gpu-002"), "left the gossip pool") })
	if st := nodeOf(t, s, "gpu-002").State; st != StateHealthy {
		t.Errorf("gpu-002 after a clean gossip leave = %s, want healthy (the stream decides)", st)
	}
}

func TestGossipDeadDoesNotHideAFailure(t *testing.T) {
	gn := newGossipNet(t, DefaultGossipName, "gpu-001")
	s := gossipServer(t, gn, nil, nil)
	p1 := gossipAgent(t, gn, s, "gpu-001", nil)
	a1 := mustConnect(t, s, "gpu-001", withGossip(p1.LocalMember().Addr))
	a1.sendResult(result("gpu-001", true))
	testwait.Until(t, 5*time.Second, "failed", stateIs(t, s, "gpu-001", StateFailed))
	testwait.Until(t, 10*time.Second, "member alive", gossipSees(s, "gpu-001", membership.StateAlive))
	gn.faults.Partition(p1.LocalMember().Addr)
	testwait.Until(t, 15*time.Second, "member dead", gossipSees(s, "gpu-001", membership.StateDead))
	// The pool's view changes before its event reaches the coordinator:
	// wait until the node record took the death (the state is decided under
	// the same lock), then see that it stayed failed.
	testwait.Until(t, 10*time.Second, "the coordinator handling the death", func() bool {
		e := s.reg.lookup("gpu-001")
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.gossip == membership.StateDead
	})
	if st := nodeOf(t, s, "gpu-001").State; st != StateFailed {
		t.Errorf("a failed node gossip reports dead = %s, want failed (results are the stronger evidence)", st)
	}
}

// keyAgent answers GossipKeyOp the way the agent does: applies it to its
// pool and reports.
func keyAgent(a *fakeAgent, p *membership.Pool, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case m := <-a.in:
			op := m.GetGossipKey()
			if op == nil {
				continue
			}
			var err error
			switch op.GetOp() {
			case pb.GossipKeyOp_OP_INSTALL:
				err = p.InstallKey(op.GetKey())
			case pb.GossipKeyOp_OP_USE:
				err = p.UseKey(op.GetKey())
			case pb.GossipKeyOp_OP_REMOVE:
				err = p.RemoveKey(op.GetKey())
			}
			st := &pb.GossipKeyStatus{OpId: op.GetOpId(), Keys: int32(len(p.Keys()))}
			if err != nil {
				st.Error = err.Error()
			}
			a.send(&pb.AgentMessage{Msg: &pb.AgentMessage_GossipKeyStatus{GossipKeyStatus: st}})
		}
	}
}

func TestGossipKeyRotationKeepsMembers(t *testing.T) {
	old := bytes.Repeat([]byte{1}, 32)
	next := bytes.Repeat([]byte{2}, 32)
	names := []string{"gpu-001", "gpu-002", "gpu-003"}
	gn := newGossipNet(t, append([]string{DefaultGossipName}, names...)...)
	ca := newTestCA(t)
	s := gossipServer(t, gn, ca, [][]byte{old})
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	pools := map[string]*membership.Pool{}
	for _, n := range names {
		p := gossipAgent(t, gn, s, n, [][]byte{old})
		pools[n] = p
		a, err := connectCreds(t, s, ca.creds(pki.KindNode, n), n, withGossip(p.LocalMember().Addr))
		if err != nil {
			t.Fatal(err)
		}
		go keyAgent(a, p, stop)
	}
	allAlive := func() bool { return s.GossipPool().NumAlive() == len(names)+1 }
	testwait.Until(t, 10*time.Second, "pool formed", allAlive)

	op := operatorWith(t, s, ca.creds(pki.KindAdmin, "alice"))
	ctx := context.Background()
	// An agent certificate may not rotate keys.
	if _, err := operatorWith(t, s, ca.creds(pki.KindNode, "gpu-001")).GossipKeys(ctx, &pb.GossipKeysRequest{
		Op: pb.GossipKeyOp_OP_INSTALL, Key: next}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("agent certificate rotating keys: %v, want PermissionDenied", err)
	}
	round := func(o pb.GossipKeyOp_Op, key []byte, wantKeys int) {
		t.Helper()
		resp, err := op.GossipKeys(ctx, &pb.GossipKeysRequest{Op: o, Key: key, Reason: "quarterly rotation"})
		if err != nil {
			t.Fatalf("%v: %v", o, err)
		}
		if resp.GetApplied() != int32(len(names)) || resp.GetFailed() != 0 {
			t.Fatalf("%v: applied %d failed %d: %v", o, resp.GetApplied(), resp.GetFailed(), resp.GetNodes())
		}
		if len(resp.GetKeyFingerprints()) != wantKeys {
			t.Errorf("%v: coordinator holds %d keys, want %d", o, len(resp.GetKeyFingerprints()), wantKeys)
		}
		for n, p := range pools {
			if len(p.Keys()) != wantKeys {
				t.Errorf("%v: %s holds %d keys, want %d", o, n, len(p.Keys()), wantKeys)
			}
		}
		// Five probe rounds (a ping and its ack each, every member) pass
		// with every member still alive.
		delivered := gn.faults.Delivered()
		testwait.Value(t, 10*time.Second, fmt.Sprintf("%v: five probe rounds", o), gn.faults.Delivered,
			func(n uint64) bool { return n >= delivered+10*uint64(len(names)+1) })
		if !allAlive() {
			t.Fatalf("%v: members lost: %+v", o, s.GossipPool().Members())
		}
	}
	// Using a key no agent installed fails everywhere: the round lists
	// every node, and the coordinator, which switches last, keeps its key.
	stray := bytes.Repeat([]byte{9}, 32)
	resp, err := op.GossipKeys(ctx, &pb.GossipKeysRequest{Op: pb.GossipKeyOp_OP_USE, Key: stray})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetFailed() != int32(len(names)) || resp.GetApplied() != 0 {
		t.Errorf("use of a key nobody has: applied %d failed %d, want 0 and %d", resp.GetApplied(), resp.GetFailed(), len(names))
	}
	if fps := resp.GetKeyFingerprints(); len(fps) != 1 || fps[0] != membership.Fingerprint(old) {
		t.Errorf("coordinator keys after a failed round = %v, want the old key only", fps)
	}
	round(pb.GossipKeyOp_OP_INSTALL, next, 2)
	round(pb.GossipKeyOp_OP_USE, next, 2)
	for n, p := range pools {
		if !bytes.Equal(p.Keys()[0], next) {
			t.Errorf("%s does not encrypt with the new key", n)
		}
	}
	round(pb.GossipKeyOp_OP_REMOVE, old, 1)

	saved, err := membership.ReadKeyringFile(filepath.Join(s.cfg.DataDir, gossipKeyringFile))
	if err != nil {
		t.Fatalf("rotated keyring not saved: %v", err)
	}
	if len(saved) != 1 || !bytes.Equal(saved[0], next) {
		t.Errorf("saved keyring = %d keys, want only the new one", len(saved))
	}
	list, err := op.GossipKeys(ctx, &pb.GossipKeysRequest{})
	if err != nil || len(list.GetKeyFingerprints()) != 1 || list.GetKeyFingerprints()[0] != membership.Fingerprint(next) {
		t.Errorf("list = %v, %v; want the new key's fingerprint only", list.GetKeyFingerprints(), err)
	}
	evs, err := op.ListEvents(ctx, &pb.ListEventsRequest{Limit: 50})
	if err != nil {
		t.Fatal(err)
	}
	var audit []string
	for _, e := range evs.GetEvents() {
		audit = append(audit, e.GetActor()+" "+e.GetMessage())
	}
	all := strings.Join(audit, "\n")
	for _, want := range []string{"gossip.key.install: key " + membership.Fingerprint(next) + ": quarterly rotation",
		"gossip.key.remove.done", "admin:alice"} {
		if !strings.Contains(all, want) {
			t.Errorf("audit log lacks %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, string(next)) {
		t.Error("a key itself reached the audit log")
	}
}

func TestGossipKeysRefused(t *testing.T) {
	key := bytes.Repeat([]byte{3}, 16)
	t.Run("insecure coordinator", func(t *testing.T) {
		gn := newGossipNet(t, DefaultGossipName)
		s := gossipServer(t, gn, nil, [][]byte{key})
		_, err := operator(t, s).GossipKeys(context.Background(), &pb.GossipKeysRequest{Op: pb.GossipKeyOp_OP_INSTALL, Key: bytes.Repeat([]byte{4}, 16)})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "mTLS") {
			t.Errorf("rotation on an insecure coordinator: %v, want FailedPrecondition naming mTLS", err)
		}
	})
	t.Run("no keyring", func(t *testing.T) {
		gn := newGossipNet(t, DefaultGossipName)
		s := gossipServer(t, gn, nil, nil)
		_, err := operator(t, s).GossipKeys(context.Background(), &pb.GossipKeysRequest{})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("keys without encryption: %v, want FailedPrecondition", err)
		}
	})
	t.Run("gossip off", func(t *testing.T) {
		s := testServer(t, t.TempDir(), nil)
		resp, err := operator(t, s).GossipMembers(context.Background(), &pb.GossipMembersRequest{})
		if err != nil || resp.GetEnabled() {
			t.Errorf("members with gossip off = %v, %v; want enabled=false", resp, err)
		}
	})
}

func TestGossipConfig(t *testing.T) {
	for _, tt := range []struct {
		yaml, want string
	}{
		{"data_dir: /x\ninsecure: true\ngossip:\n  bind: 127.0.0.1:7946\n", ""},
		{"data_dir: /x\ninsecure: true\ngossip:\n  bind: 0.0.0.0\n", "advertise"},
		{"data_dir: /x\ninsecure: true\ngossip:\n  bind: localhost\n", "neither IP"},
		{"data_dir: /x\ninsecure: true\ngossip:\n  bind: 127.0.0.1\n  join: [nope]\n", "join"},
		// Shared with every config and spec (config.DecodeStrict): a second
		// document would be ignored, so it is refused.
		{"data_dir: /x\ninsecure: true\n---\nretention_days: 1\n", "more than one YAML document"},
	} {
		_, err := ParseConfig([]byte(tt.yaml))
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q: %v", tt.yaml, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q: error %v, want it to mention %q", tt.yaml, err, tt.want)
		}
	}
}

// TestGossipDocConfig loads the coordinator block of docs/gossip.md.
func TestGossipDocConfig(t *testing.T) {
	doc, err := os.ReadFile("../docs/gossip.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```yaml\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/gossip.md has no yaml block")
	}
	c, err := ParseConfig([]byte(block))
	if err != nil {
		t.Fatalf("docs/gossip.md coordinator block: %v", err)
	}
	if !c.Gossip.Enabled() || c.Gossip.ClusterLabel == "" || c.Gossip.KeyringFile == "" {
		t.Errorf("doc block parsed to %+v, want gossip on with a label and a keyring", c.Gossip)
	}
}

// A death another member gossips and the accused refutes within the
// confirmation wait (a healed member's stale view of the others) changes
// no state; one that stands makes the node unreachable. The events are fed
// to the coordinator's sink directly: which member's word memberlist took
// is not what this test is about.
func TestGossipRefutedDeathIsNotAFlap(t *testing.T) {
	gn := newGossipNet(t, DefaultGossipName)
	s := gossipServer(t, gn, nil, nil)
	a := mustConnect(t, s, "gpu-001")
	a.sendResult(result("gpu-001", false))
	testwait.Until(t, 5*time.Second, "gpu-001 healthy", stateIs(t, s, "gpu-001", StateHealthy))
	sink := gossipEvents{s: s, self: DefaultGossipName, deaths: s.gossipDeaths}
	member := membership.Member{Name: "gpu-001", Addr: "127.0.0.1:7946", Meta: membership.Meta{Role: membership.RoleAgent}}
	before := len(eventsOf(t, s, "gpu-001"))

	dead, alive := member, member
	dead.State, alive.State = membership.StateDead, membership.StateAlive
	ran := s.gossipDeaths.ran.Load()
	sink.NodeLeft(dead)
	sink.NodeJoined(alive) // refuted at once
	// The confirmation of the refuted death ran (counted), and changed nothing.
	testwait.Value(t, 10*s.gossipDeaths.wait+5*time.Second, "the refuted death's confirmation to run",
		func() int64 { return s.gossipDeaths.ran.Load() - ran }, func(n int64) bool { return n >= 1 })
	if evs := eventsOf(t, s, "gpu-001"); len(evs) != before {
		t.Fatalf("a refuted gossip death changed gpu-001: %q", evs[before:])
	}
	if st := nodeOf(t, s, "gpu-001").State; st != StateHealthy {
		t.Fatalf("after a refuted gossip death gpu-001 is %s, want healthy", st)
	}

	sink.NodeLeft(dead) // this one stands
	testwait.Until(t, 5*time.Second, "gpu-001 unreachable once the death stood", stateIs(t, s, "gpu-001", StateUnreachable))
	if r := nodeOf(t, s, "gpu-001").StateReason; !strings.HasPrefix(r, "gossip: ") {
		t.Errorf("reason %q, want gossip's", r)
	}
}
