package fleettest

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/internal/membership"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/sim/faultnet"
)

// Gossip on real loopback sockets: the coordinator and real agents each
// gossip over a memberlist UDP/TCP transport bound to and advertised on
// 127.0.0.1, wrapped by one faultnet.Network per fleet so a test can
// partition a member while its agent stream stays up.

// gossipTimings detect a dead member in two to eight seconds (suspicion
// timeout 1.2 s with a confirmation, 7.2 s without). Not faster: every
// member of a test fleet shares one process and two loaded cores with the
// race detector, and a member starved for a moment must be able to refute
// its suspicion before it is declared dead, or the tests that assert nobody
// flapped fail for the machine's sake (with 200 ms probes and a 600 ms
// suspicion, a stall of little more than half a second could do it).
// memberlist keeps gossiping to a dead member for PushPullInterval
// (GossipToTheDeadTime): after that only the rejoin loop brings it back.
func gossipTimings(c *membership.Config) {
	c.ProbeInterval = 400 * time.Millisecond
	c.ProbeTimeout = 200 * time.Millisecond
	c.GossipInterval = 50 * time.Millisecond
	c.SuspicionMult = 3
	c.PushPullInterval = 2 * time.Second
	c.TCPTimeout = 2 * time.Second
	c.RejoinInterval = 300 * time.Millisecond
}

// detectWithin bounds how long a partitioned member takes to be marked
// unreachable, or a healed one alive again: the suspicion timeout is 7.2 s
// at most, plus scheduling delays (testwait scales it under -race). A
// deadline, not a wait: tests go on as soon as the condition holds.
const detectWithin = 12 * time.Second

// holdFor is how long a test watches that nothing changes (nobody flapped,
// a left member stays left): longer than a probe round plus the shortest
// suspicion timeout (0.4 + 1.2 s), so a member that stopped answering
// would have been declared dead within it.
const holdFor = 2500 * time.Millisecond

const gossipLabel = "fleettest"

// gossipBlock is the `gossip:` block of every member: loopback, bind and
// advertise, port chosen by the kernel (the transports below bind).
func gossipBlock(keyFile string) *membership.FileConfig {
	return &membership.FileConfig{Bind: "127.0.0.1:0", Advertise: "127.0.0.1", ClusterLabel: gossipLabel, KeyringFile: keyFile}
}

// gossipSetup says how newGossipFleet builds its coordinator.
type gossipSetup struct {
	// pinPort restarts the coordinator on the gossip port it first got,
	// as a production coordinator with a fixed gossip.bind port does.
	pinPort bool
	// keyFile turns gossip encryption on (every member's keyring_file).
	keyFile string
	// ca serves mutual TLS with a certificate from ca instead of plaintext.
	ca *fleetCA
}

// newGossipFleet starts a coordinator with gossip behind a faultnet.Network.
func newGossipFleet(t *testing.T, gs gossipSetup) (*fleet, *faultnet.Network) {
	t.Helper()
	faults := faultnet.New()
	// Registered before the fleet's cleanups, so it runs after every member
	// has shut down.
	t.Cleanup(faults.Close)
	var coordFiles pki.Files
	if gs.ca != nil {
		coordFiles = gs.ca.issue(pki.KindCoordinator, "coord", net.IPv4(127, 0, 0, 1))
	}
	port := 0 // the coordinator's gossip port, once pinned
	f := newFleetWith(t, func(cfg *coordinator.Config, opts *coordinator.Options) {
		cfg.Gossip = gossipBlock(gs.keyFile)
		logger := opts.Logger
		opts.Gossip = func(c *membership.Config) {
			gossipTimings(c)
			tr, bound, err := coordTransport(faults, port, logger)
			if err != nil {
				t.Errorf("coordinator gossip transport: %v", err)
				return
			}
			if gs.pinPort {
				port = bound
			}
			c.Transport = tr
		}
		if gs.ca != nil {
			cfg.Insecure = false
			cfg.TLS = coordinator.TLSConfig{CertFile: coordFiles.CertFile, KeyFile: coordFiles.KeyFile,
				CAFile: coordFiles.CAFile, TrustDomain: fleetTD}
			o, _, err := coordinator.Secure(*cfg, *opts)
			if err != nil {
				t.Fatal(err)
			}
			*opts = o
		}
	})
	if f.server().GossipPool() == nil {
		t.Fatal("gossip configured, but the coordinator has no gossip pool")
	}
	return f, faults
}

// coordTransport is a loopback transport behind faults, on port (0: the
// kernel picks) and the port it bound. A pinned port just released by the
// previous coordinator may take a moment to be free again.
func coordTransport(faults *faultnet.Network, port int, logger zerolog.Logger) (memberlist.NodeAwareTransport, int, error) {
	var tr memberlist.NodeAwareTransport
	var err error
	if port == 0 {
		tr, err = faults.LoopbackTransport(membership.MemberlistLogger(logger))
	} else {
		deadline := time.Now().Add(3 * time.Second)
		for {
			var nt *memberlist.NetTransport
			nt, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{
				BindAddrs: []string{"127.0.0.1"}, BindPort: port,
				Logger: log.New(logger, "[membership] ", 0),
			})
			if err == nil {
				tr = faults.Wrap(nt)
				break
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if err != nil {
		return nil, 0, err
	}
	bound := 0
	if ap, ok := tr.(interface{ GetAutoBindPort() int }); ok {
		bound = ap.GetAutoBindPort()
	}
	return tr, bound, nil
}

// withGossip turns the agent's gossip on, behind faults. No join address:
// the agent joins the one its coordinator's Welcome announces.
func withGossip(faults *faultnet.Network, keyFile string) nodeOpt {
	return func(n *node) {
		n.cfg.Gossip = gossipBlock(keyFile)
		logger := n.f.logger("agent-gossip").With().Str("node", n.name).Logger()
		t := n.f.t
		n.extra = append(n.extra, agent.WithGossipConfig(func(c *membership.Config) {
			gossipTimings(c)
			tr, err := faults.LoopbackTransport(membership.MemberlistLogger(logger))
			if err != nil {
				t.Errorf("%s: gossip transport: %v", n.name, err)
				return
			}
			c.Transport = tr
		}))
	}
}

// ---------------------------------------------------------------- the pool

func (f *fleet) pool() *membership.Pool {
	f.t.Helper()
	p := f.server().GossipPool()
	if p == nil {
		f.t.Fatal("gossip is off on the coordinator")
	}
	return p
}

// gossipSees reports whether the coordinator's pool holds name in state want.
func (f *fleet) gossipSees(name string, want membership.State) func() bool {
	return func() bool {
		m, ok := f.pool().Member(name)
		return ok && m.State == want
	}
}

// allAlive reports whether every node is an alive agent member of the
// coordinator's pool, and nobody else but the coordinator is alive.
func (f *fleet) allAlive(nodes []*node) func() bool {
	return func() bool {
		p := f.pool()
		for _, n := range nodes {
			m, ok := p.Member(n.name)
			if !ok || m.State != membership.StateAlive || m.Meta.Role != membership.RoleAgent {
				return false
			}
		}
		return p.NumAlive() == len(nodes)+1
	}
}

// checkLoopback fails the test for any member not advertised on 127.0.0.1.
func (f *fleet) checkLoopback() {
	f.t.Helper()
	for _, m := range f.pool().Members() {
		if host, _, err := net.SplitHostPort(m.Addr); err != nil || host != "127.0.0.1" {
			f.t.Errorf("member %s advertises %q, want 127.0.0.1:PORT", m.Name, m.Addr)
		}
	}
}

// gossipFleetUp starts the nodes' agents and waits until every node is
// healthy and an alive member of the coordinator's pool.
func gossipFleetUp(t *testing.T, f *fleet, nodes []*node) {
	t.Helper()
	for _, n := range nodes {
		n.start()
	}
	for _, n := range nodes {
		testwait.Until(t, waitLong, n.name+" healthy", stateIs(f.store, n.name, coordinator.StateHealthy))
	}
	testwait.Until(t, waitLong, "every agent an alive member of the coordinator's pool", f.allAlive(nodes))
	f.checkLoopback()
}

func gossipNodes(f *fleet, faults *faultnet.Network, prefix string, count int, opts ...nodeOpt) []*node {
	f.t.Helper()
	nodes := make([]*node, count)
	for i := range nodes {
		nodes[i] = f.newNode(fmt.Sprintf("%s%d", prefix, i+1), nil, append([]nodeOpt{withGossip(faults, "")}, opts...)...)
	}
	return nodes
}

// campaignView is the node as campaigns see it (coordinator Fleet()).
func campaignView(t *testing.T, f *fleet, name string) (state, activity string, connected bool) {
	t.Helper()
	nodes, err := f.server().Fleet().Nodes(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Name == name {
			return n.State, n.Activity, n.Connected
		}
	}
	t.Fatalf("%s not in the campaign fleet view", name)
	return "", "", false
}

func gossipUnreachable(f *fleet, name string) func() bool {
	return func() bool {
		n, err := f.store().Node(context.Background(), name)
		return err == nil && n.State == coordinator.StateUnreachable && strings.HasPrefix(n.StateReason, "gossip:")
	}
}

// ---------------------------------------------------------------- tests

// A partition of one agent's gossip, its agent stream up, makes the node
// unreachable with a gossip reason within seconds, and nothing else: the
// stream stays connected, campaigns still see the node healthy and
// connected, nothing is drained, results keep being stored, and the other
// nodes are untouched. Healed, the member answers again and the node is
// healthy.
func TestGossipPartitionIsOnlyAHint(t *testing.T) {
	f, faults := newGossipFleet(t, gossipSetup{})
	nodes := gossipNodes(f, faults, "gpu-gp", 3)
	gossipFleetUp(t, f, nodes)
	victim, others := nodes[0], nodes[1:]
	m, _ := f.pool().Member(victim.name)

	cut := time.Now()
	faults.Partition(m.Addr)
	testwait.Until(t, detectWithin, victim.name+" unreachable from gossip", gossipUnreachable(f, victim.name))
	t.Logf("%s unreachable %s after its gossip was cut", victim.name, time.Since(cut).Round(time.Millisecond))

	n := stateOf(t, f.store(), victim.name)
	if !strings.Contains(n.StateReason, "agent stream still connected") {
		t.Errorf("reason %q does not say the agent stream is still connected", n.StateReason)
	}
	if !n.Connected {
		t.Error("a gossip partition marked the node disconnected")
	}
	if _, _, up := victim.m.read(); !up {
		t.Error("the agent's stream dropped during a gossip-only partition")
	}
	if !f.gossipSees(victim.name, membership.StateDead)() {
		m, _ := f.pool().Member(victim.name)
		t.Errorf("coordinator's pool has %s %s, want dead", victim.name, m.State)
	}
	// Campaigns see what the stream and the results say, not the hint.
	if st, act, conn := campaignView(t, f, victim.name); st != coordinator.StateHealthy || !conn || act == "drained" {
		t.Errorf("campaign view of %s: state %s activity %q connected %v; want healthy, connected, not drained", victim.name, st, act, conn)
	}
	// Results keep being stored while cut, and a passing one does not
	// clear the hint: only the member answering again does.
	acked := victim.tap.ackCount()
	testwait.Until(t, waitLong, "two more results acknowledged while cut", func() bool { return victim.tap.ackCount() >= acked+2 })
	if n := stateOf(t, f.store(), victim.name); n.State != coordinator.StateUnreachable {
		t.Errorf("after passing results while cut: %s (%s), want unreachable", n.State, n.StateReason)
	}
	for _, o := range others {
		if n := stateOf(t, f.store(), o.name); n.State != coordinator.StateHealthy || !n.Connected {
			t.Errorf("%s = %s connected=%v while another node's gossip is cut, want healthy and connected", o.name, n.State, n.Connected)
		}
		if !f.gossipSees(o.name, membership.StateAlive)() {
			t.Errorf("%s is not alive in the coordinator's pool", o.name)
		}
	}
	if faults.Dropped() == 0 && faults.Refused() == 0 {
		t.Error("the fault network dropped nothing: the partition did not bite")
	}
	// Cut long enough for the victim to declare every other member dead
	// (its longest suspicion timeout), so that the heal brings those stale
	// deaths to the pool; the others stay untouched meanwhile.
	noGossipEvents(t, f, faults, others, time.Until(cut.Add(staleViewAfter)))

	healed := time.Now()
	faults.Heal()
	testwait.Until(t, detectWithin, victim.name+" healthy again after the heal", stateIs(f.store, victim.name, coordinator.StateHealthy))
	testwait.Until(t, detectWithin, victim.name+" alive in the pool again", f.gossipSees(victim.name, membership.StateAlive))
	t.Logf("%s healthy %s after the heal", victim.name, time.Since(healed).Round(time.Millisecond))

	evs := events(t, f.store(), victim.name)
	if !hasEvent(evs, "healthy -> unreachable", "gossip: member stopped answering probes") ||
		!hasEvent(evs, "unreachable -> healthy", "answers probes again") {
		t.Errorf("%s's events do not tell the gossip story: %q", victim.name, evs)
	}
	for _, e := range evs {
		if strings.Contains(e, "drain") || strings.Contains(e, "reconnected") {
			t.Errorf("%s: event %q: a gossip hint must not drain or drop the stream", victim.name, e)
		}
	}
	// Each state change is an event: an untouched node has none to or
	// from unreachable, and none from gossip, from the start to the end of
	// a hold window after the heal (the healed member's view of the others,
	// gone stale while it was cut, reaches the pool right then).
	noGossipEvents(t, f, faults, others, holdAfterHeal)
}

// holdSteady watches for holdFor, and until the network has carried a
// few probe rounds more (members kept looking at each other), that cond
// holds at every look and that no node in nodes gets a new event speaking
// of unreachable or gossip: every state change is an event, so a flap
// between two looks is seen too.
func holdSteady(t *testing.T, f *fleet, faults *faultnet.Network, nodes []*node, what string, cond func() bool) {
	t.Helper()
	seen := map[string]int{}
	for _, n := range nodes {
		seen[n.name] = len(events(t, f.store(), n.name))
	}
	end := time.Now().Add(holdFor)
	// A probe is a ping and its ack; each member probes once a round.
	want := faults.Delivered() + uint64(2*3*(len(nodes)+1))
	testwait.Throughout(t, holdFor+detectWithin, what, func() (bool, string) {
		if !cond() {
			return false, fmt.Sprintf("%+v", f.pool().Members())
		}
		for _, n := range nodes {
			evs := events(t, f.store(), n.name) // newest first
			for _, e := range evs[:max(0, len(evs)-seen[n.name])] {
				if strings.Contains(e, "unreachable") || strings.Contains(e, "gossip") {
					return false, fmt.Sprintf("%s: event %q", n.name, e)
				}
			}
		}
		return true, ""
	}, func() (bool, string) {
		d := faults.Delivered()
		return time.Now().After(end) && d >= want, fmt.Sprintf("the network carried %d packets, want %d (three probe rounds)", d, want)
	})
}

// staleViewAfter is how long after its cut a partitioned member holds
// every other member dead: the longest suspicion timeout (7.2 s) and a
// probe round.
const staleViewAfter = 7600 * time.Millisecond

// holdAfterHeal is how long a test watches the event log after a heal: two
// push/pull intervals, by which the healed member's stale view has reached
// the coordinator, plus the coordinator's wait before it believes a death
// (two probe intervals).
const holdAfterHeal = 5 * time.Second

// noGossipEvents fails the test on the first event of any node in nodes
// that speaks of unreachable or gossip, from the node's first event to the
// end of window and until every member has had a push-pull round since
// (a stream opened or refused by the fault network: the views were
// exchanged, so a stale one had its chance to do harm). It reads the
// coordinator's event log, where every state change is recorded, so a
// flap between two reads is seen too.
func noGossipEvents(t *testing.T, f *fleet, faults *faultnet.Network, nodes []*node, window time.Duration) {
	t.Helper()
	end := time.Now().Add(window)
	streams := func() uint64 { return faults.Dialed() + faults.Refused() }
	want := streams() + uint64(len(f.pool().Members()))
	testwait.Throughout(t, window+detectWithin, "no gossip events on the nodes not partitioned", func() (bool, string) {
		for _, n := range nodes {
			for _, e := range events(t, f.store(), n.name) {
				if strings.Contains(e, "unreachable") || strings.Contains(e, "gossip") {
					return false, fmt.Sprintf("%s, not partitioned: event %q (all: %q)", n.name, e, events(t, f.store(), n.name))
				}
			}
		}
		return true, ""
	}, func() (bool, string) {
		n := streams()
		return time.Now().After(end) && n >= want, fmt.Sprintf("%d push-pull streams, want %d", n, want)
	})
}

// A partition that outlasts the suspicion timeout and memberlist's
// gossip-to-the-dead time leaves each side believing the other dead; only
// the rejoin loop (the cut member re-joining its seed, the coordinator
// re-joining dead members) brings the member back once healed.
func TestGossipLongPartitionHealsByRejoin(t *testing.T) {
	f, faults := newGossipFleet(t, gossipSetup{})
	nodes := gossipNodes(f, faults, "gpu-gl", 2)
	gossipFleetUp(t, f, nodes)
	victim := nodes[0]
	m, _ := f.pool().Member(victim.name)

	faults.Partition(m.Addr)
	testwait.Until(t, detectWithin, victim.name+" unreachable from gossip", gossipUnreachable(f, victim.name))
	// Past GossipToTheDeadTime (2 s) after the death: memberlist alone no
	// longer contacts the other side.
	// Held throughout, and until the cut has dropped more of the
	// victim's traffic (it kept trying: the cut was tested, not idle).
	hold := time.Now().Add(2500 * time.Millisecond)
	dropped := faults.Dropped() + faults.Refused()
	testwait.Throughout(t, 2500*time.Millisecond+detectWithin, victim.name+" unreachable and dead while partitioned", func() (bool, string) {
		if !gossipUnreachable(f, victim.name)() || !f.gossipSees(victim.name, membership.StateDead)() {
			return false, "came back while still partitioned: the cut leaks"
		}
		return true, ""
	}, func() (bool, string) {
		n := faults.Dropped() + faults.Refused()
		return time.Now().After(hold) && n > dropped, fmt.Sprintf("%d packets and streams cut since the death", n-dropped)
	})

	healed := time.Now()
	faults.Heal()
	testwait.Until(t, detectWithin, victim.name+" alive in the pool after a long partition", f.gossipSees(victim.name, membership.StateAlive))
	testwait.Until(t, detectWithin, victim.name+" healthy after a long partition", stateIs(f.store, victim.name, coordinator.StateHealthy))
	t.Logf("%s rejoined and healthy %s after the heal", victim.name, time.Since(healed).Round(time.Millisecond))
	if n := stateOf(t, f.store(), nodes[1].name); n.State != coordinator.StateHealthy {
		t.Errorf("%s = %s, want healthy", nodes[1].name, n.State)
	}
	if !f.allAlive(nodes)() {
		t.Errorf("pool after the heal: %+v", f.pool().Members())
	}
}

// An agent stopped cleanly leaves the pool: the coordinator sees its
// member left, never dead, and records an event; the node's state comes
// from the stream's end, not from gossip.
func TestGossipCleanStopIsLeft(t *testing.T) {
	f, faults := newGossipFleet(t, gossipSetup{})
	nodes := gossipNodes(f, faults, "gpu-gs", 2)
	gossipFleetUp(t, f, nodes)
	gone, stays := nodes[0], nodes[1]

	stopped := make(chan struct{})
	go func() { gone.stop(); close(stopped) }()
	sawDead := false
	testwait.Until(t, detectWithin, gone.name+" left the pool", func() bool {
		sawDead = sawDead || f.gossipSees(gone.name, membership.StateDead)()
		return f.gossipSees(gone.name, membership.StateLeft)()
	})

	<-stopped
	if sawDead {
		t.Errorf("%s was seen dead before it left: the leave was not announced", gone.name)
	}
	testwait.Until(t, waitLong, "the leave event", func() bool {
		return hasEvent(events(t, f.store(), gone.name), "connection: left the gossip pool")
	})

	// Its agent said goodbye on the stream: left, not unreachable.
	testwait.Until(t, waitLong, gone.name+" left from the stream's end", stateIs(f.store, gone.name, coordinator.StateLeft))
	// Longer than the suspicion timeout, while the pool keeps probing: a
	// left member stays left.
	holdSteady(t, f, faults, nodes, gone.name+" left in the pool", f.gossipSees(gone.name, membership.StateLeft))
	if n := stateOf(t, f.store(), gone.name); strings.HasPrefix(n.StateReason, "gossip:") || n.Connected {
		t.Errorf("%s after a clean stop: reason %q connected %v; want the stream's reason, not gossip's", gone.name, n.StateReason, n.Connected)
	}
	if n := stateOf(t, f.store(), stays.name); n.State != coordinator.StateHealthy || !f.gossipSees(stays.name, membership.StateAlive)() {
		t.Errorf("%s = %s, want healthy and alive", stays.name, n.State)
	}
	if got := f.pool().NumAlive(); got != 2 {
		t.Errorf("%d alive members, want 2 (coordinator and %s)", got, stays.name)
	}
}

// A restarted coordinator forms a new pool; every agent becomes an alive
// member of it again: with a new gossip port, from the address the Welcome
// announces; on the same port, through the rejoin loop (the agents joined
// that address before and are not told anything new).
func TestGossipCoordinatorRestart(t *testing.T) {
	for _, pin := range []bool{false, true} {
		name := "new port"
		if pin {
			name = "same port"
		}
		t.Run(name, func(t *testing.T) {
			f, faults := newGossipFleet(t, gossipSetup{pinPort: pin})
			nodes := gossipNodes(f, faults, "gpu-gr", 3)
			gossipFleetUp(t, f, nodes)
			before := f.server().GossipAddr()

			f.stopCoordinator(false)
			restarted := time.Now()
			f.startCoordinator()
			after := f.server().GossipAddr()
			if (after == before) != pin {
				t.Fatalf("coordinator gossip address %s before the restart, %s after (pinned: %v)", before, after, pin)
			}
			testwait.Until(t, waitLong, "every agent alive in the restarted coordinator's pool", f.allAlive(nodes))
			t.Logf("all %d agents alive in the new pool %s after the restart", len(nodes), time.Since(restarted).Round(time.Millisecond))
			f.checkLoopback()
			for _, n := range nodes {
				testwait.Until(t, waitLong, n.name+" healthy and connected", func() bool {
					s := stateOf(t, f.store(), n.name)
					return s.State == coordinator.StateHealthy && s.Connected
				})
			}
			// Stays so for a few probe rounds: nobody is flapping.
			holdSteady(t, f, faults, nodes, "every agent alive", f.allAlive(nodes))
		})
	}
}

// ---------------------------------------------------------------- mTLS

const fleetTD = "fleet.test"

// fleetCA issues certificates into the test's temporary directories.
type fleetCA struct {
	t  *testing.T
	ca *pki.CA
}

func newFleetCA(t *testing.T) *fleetCA {
	t.Helper()
	ca, err := pki.NewCA(fleetTD, pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &fleetCA{t: t, ca: ca}
}

func (c *fleetCA) issue(kind pki.Kind, name string, ips ...net.IP) pki.Files {
	c.t.Helper()
	leaf, err := c.ca.Issue(pki.Request{Kind: kind, Name: name, IPs: ips})
	if err != nil {
		c.t.Fatal(err)
	}
	dir := c.t.TempDir()
	certFile, keyFile, err := pki.WriteLeaf(dir, leaf, false)
	if err != nil {
		c.t.Fatal(err)
	}
	caFile, err := pki.WriteCACert(dir, c.ca.Cert, false)
	if err != nil {
		c.t.Fatal(err)
	}
	return pki.Files{CertFile: certFile, KeyFile: keyFile, CAFile: caFile}
}

// withTLS makes the agent speak mutual TLS with a node certificate.
func withTLS(ca *fleetCA) nodeOpt {
	return func(n *node) {
		files := ca.issue(pki.KindNode, n.name)
		n.cfg.Insecure = false
		n.cfg.TLS = agent.TLSConfig{CAFile: files.CAFile, CertFile: files.CertFile, KeyFile: files.KeyFile, TrustDomain: fleetTD}
	}
}

// adminOperator is an operator client with an admin certificate.
func adminOperator(t *testing.T, f *fleet, ca *fleetCA, name string) pb.OperatorServiceClient {
	t.Helper()
	r, err := pki.NewReloader(ca.issue(pki.KindAdmin, name), pki.ReloaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := pki.ClientCredentials(pki.ClientOptions{Reloader: r, TrustDomain: fleetTD})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(f.address(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewOperatorServiceClient(cc)
}

func newGossipKey(t *testing.T) []byte {
	t.Helper()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// A keyring rotation driven through the operator API reaches real agents
// over their mTLS streams: install, use, remove, each applied by every
// agent and the coordinator with no member lost on the way; every agent
// saves the rotated keyring in its state dir, and an agent restarted
// afterwards starts from it (its configured keyring_file holds only the
// removed key, with which it could not rejoin).
func TestGossipKeyRotationOverMTLS(t *testing.T) {
	ca := newFleetCA(t)
	old, next := newGossipKey(t), newGossipKey(t)
	keyFile := filepath.Join(t.TempDir(), "gossip.keys")
	if err := os.WriteFile(keyFile, membership.FormatKeyring([][]byte{old}), 0o600); err != nil {
		t.Fatal(err)
	}
	f, faults := newGossipFleet(t, gossipSetup{keyFile: keyFile, ca: ca})
	nodes := make([]*node, 3)
	for i := range nodes {
		nodes[i] = f.newNode(fmt.Sprintf("gpu-gk%d", i+1), nil, withTLS(ca), withGossip(faults, keyFile))
	}
	gossipFleetUp(t, f, nodes)

	op := adminOperator(t, f, ca, "alice")
	ctx := context.Background()
	list, err := op.GossipKeys(ctx, &pb.GossipKeysRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if fps := list.GetKeyFingerprints(); len(fps) != 1 || fps[0] != membership.Fingerprint(old) {
		t.Fatalf("coordinator keys before the rotation = %v, want only the old key's %s", fps, membership.Fingerprint(old))
	}

	round := func(o pb.GossipKeyOp_Op, key []byte, wantKeys int) {
		t.Helper()
		resp, err := op.GossipKeys(ctx, &pb.GossipKeysRequest{Op: o, Key: key, Reason: "fleettest rotation"})
		if err != nil {
			t.Fatalf("%v: %v", o, err)
		}
		if resp.GetApplied() != int32(len(nodes)) || resp.GetFailed() != 0 {
			t.Fatalf("%v: applied %d, failed %d: %v", o, resp.GetApplied(), resp.GetFailed(), resp.GetNodes())
		}
		if got := len(resp.GetKeyFingerprints()); got != wantKeys {
			t.Fatalf("%v: coordinator holds %d keys, want %d", o, got, wantKeys)
		}
		// Three probe rounds on the keys now in use (a ping and its ack
		// each, every member), every member alive throughout.
		until := time.Now().Add(holdFor)
		want := faults.Delivered() + uint64(2*3*(len(nodes)+1))
		testwait.Throughout(t, holdFor+detectWithin, fmt.Sprintf("%v: every member alive", o), func() (bool, string) {
			return f.allAlive(nodes)(), fmt.Sprintf("%+v", f.pool().Members())
		}, func() (bool, string) {
			d := faults.Delivered()
			return time.Now().After(until) && d >= want, fmt.Sprintf("%d packets delivered, want %d", d, want)
		})
	}
	round(pb.GossipKeyOp_OP_INSTALL, next, 2)
	round(pb.GossipKeyOp_OP_USE, next, 2)
	round(pb.GossipKeyOp_OP_REMOVE, old, 1)

	onlyNext := func(who, path string) {
		t.Helper()
		keys, err := membership.ReadKeyringFile(path)
		if err != nil {
			t.Errorf("%s: rotated keyring not saved: %v", who, err)
			return
		}
		if len(keys) != 1 || !bytes.Equal(keys[0], next) {
			t.Errorf("%s: saved keyring holds %d keys (%v), want only the new one %s", who, len(keys), fingerprintsOf(keys), membership.Fingerprint(next))
		}
	}
	for _, n := range nodes {
		onlyNext(n.name, filepath.Join(n.cfg.StateDir, "gossip.keyring"))
	}
	onlyNext("coordinator", filepath.Join(f.dir, "gossip.keyring"))
	list, err = op.GossipKeys(ctx, &pb.GossipKeysRequest{})
	if err != nil || len(list.GetKeyFingerprints()) != 1 || list.GetKeyFingerprints()[0] != membership.Fingerprint(next) {
		t.Errorf("coordinator keys after the rotation = %v, %v; want only the new key's", list.GetKeyFingerprints(), err)
	}

	// Restarted, an agent starts from the saved keyring and is back.
	r := nodes[0]
	r.stop()
	testwait.Until(t, detectWithin, r.name+" left", f.gossipSees(r.name, membership.StateLeft))
	r.start()
	testwait.Until(t, waitLong, r.name+" alive again after a restart with the rotated keyring", f.allAlive(nodes))
}

func fingerprintsOf(keys [][]byte) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = membership.Fingerprint(k)
	}
	return out
}
