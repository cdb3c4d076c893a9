package fleettest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/agent/spool"
	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Timing. Agents pass every second (the smallest interval their config
// allows) and retry a lost coordinator every 100 ms. The heartbeat is not
// shorter than a second: under -race on two shared cores, sixteen agents
// running the real parsers can starve a goroutine for most of a second, and
// three silent intervals end a stream. Deadlines are generous for the same
// reason.
const (
	heartbeat  = time.Second
	passEvery  = time.Second
	retryEvery = 100 * time.Millisecond
	waitLong   = 20 * time.Second
)

// passiveChecks names every passive check, as `fleetcheck check` would.
func passiveChecks(t testing.TB) []string {
	t.Helper()
	list, err := checks.Select(registry.All(), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(list))
	for _, c := range list {
		names = append(names, c.Name())
	}
	return names
}

// ---------------------------------------------------------------- logs

// logBuffer keeps everything the fleet logs, shown only when a test fails
// (t.Log from a goroutine that outlives the test would panic).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	lines := strings.Split(strings.TrimRight(b.buf.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---------------------------------------------------------------- coordinator

// fleet is one coordinator (restartable on the same data directory and
// address) and the agents a test starts against it.
type fleet struct {
	t    *testing.T
	dir  string
	logs *logBuffer

	// tune, when set, adjusts every coordinator's config and options
	// before it starts (gossip, mutual TLS: gossip_test.go).
	tune func(*coordinator.Config, *coordinator.Options)

	mu   sync.Mutex
	addr string // "127.0.0.1:0" until the first start picks a port
	srv  *coordinator.Server
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	return newFleetWith(t, nil)
}

// newFleetWith is newFleet with every coordinator's config and options
// adjusted by tune.
func newFleetWith(t *testing.T, tune func(*coordinator.Config, *coordinator.Options)) *fleet {
	t.Helper()
	f := &fleet{t: t, dir: t.TempDir(), logs: &logBuffer{}, addr: "127.0.0.1:0", tune: tune}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last log lines:\n%s", f.logs.tail(80))
		}
	})
	f.startCoordinator()
	// Registered before any agent's cleanup, so it runs after them.
	t.Cleanup(func() { f.stopCoordinator(false) })
	return f
}

func (f *fleet) logger(component string) zerolog.Logger {
	return zerolog.New(f.logs).Level(zerolog.InfoLevel).With().Timestamp().Str("component", component).Logger()
}

// startCoordinator starts a coordinator on the fleet's data directory, on
// the same address as before so that running agents find it again.
func (f *fleet) startCoordinator() *coordinator.Server {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.srv != nil {
		f.t.Fatal("coordinator already running")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		cfg := coordinator.Config{
			Listen: f.addr, HTTPListen: "off", DataDir: f.dir,
			HeartbeatInterval: heartbeat, Insecure: true,
		}
		opts := coordinator.Options{Logger: f.logger("coordinator"), Version: "fleettest"}
		if f.tune != nil {
			f.tune(&cfg, &opts)
		}
		srv, err := coordinator.New(cfg, opts)
		if err != nil {
			f.t.Fatal(err)
		}
		err = srv.Start(context.Background())
		if err == nil {
			f.srv = srv
			f.addr = srv.GRPCAddr().String()
			return srv
		}
		// The old listener's port can take a moment to be free again.
		if time.Now().After(deadline) {
			f.t.Fatalf("start coordinator on %s: %v", f.addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopCoordinator stops it. abrupt drops every connection at once (gRPC's
// hard stop instead of the graceful one): the closest one process gets to
// killing the coordinator. Either way an acknowledged result is committed
// already; queued ones are committed by the store's close.
func (f *fleet) stopCoordinator(abrupt bool) {
	f.mu.Lock()
	srv := f.srv
	f.srv = nil
	f.mu.Unlock()
	if srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if abrupt {
		cancel()
	}
	if err := srv.Stop(ctx); err != nil {
		f.t.Errorf("stop coordinator: %v", err)
	}
}

func (f *fleet) server() *coordinator.Server {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.srv == nil {
		f.t.Fatal("coordinator not running")
	}
	return f.srv
}

func (f *fleet) address() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addr
}

func (f *fleet) store() *store.Store { return f.server().Store() }

// openStore opens the data directory of a stopped coordinator, to audit it.
func (f *fleet) openStore() *store.Store {
	f.t.Helper()
	st, err := store.Open(context.Background(), store.Options{Dir: f.dir, Logger: zerolog.Nop()})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { st.Close() })
	return st
}

// operator is a client of the operator API.
func (f *fleet) operator() pb.OperatorServiceClient {
	f.t.Helper()
	cc, err := grpc.NewClient(f.address(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { cc.Close() })
	return pb.NewOperatorServiceClient(cc)
}

// ---------------------------------------------------------------- agents

// node is a simulated node and its agent, which the test stops and starts
// again on the same state directory.
type node struct {
	name string
	sim  *sim.Node
	cfg  *agent.Config
	f    *fleet
	tap  *tap
	gate *gate
	m    *meter
	// extra options for every start of the agent (gossip_test.go).
	extra []agent.Option

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan error
}

type nodeOpt func(*node)

// every sets the pass interval.
func every(d time.Duration) nodeOpt {
	return func(n *node) { n.cfg.Interval = config.Duration(d) }
}

// withFaults injects faults into the simulated node before its first pass.
func withFaults(fs ...sim.Fault) nodeOpt {
	return func(n *node) {
		for _, x := range fs {
			if err := n.sim.AddFault(x); err != nil {
				n.f.t.Fatalf("%s: add fault: %v", n.name, err)
			}
		}
	}
}

// withShared lets the nodes of a large fleet share their sysfs layout.
func withShared(sh *sim.Shared) func(*sim.Spec) {
	return func(s *sim.Spec) { s.Shared = sh }
}

func (f *fleet) newNode(name string, spec func(*sim.Spec), opts ...nodeOpt) *node {
	f.t.Helper()
	s := sim.DefaultSpec(name)
	s.Labels = map[string]string{"sku": "h100", "rack": "r" + name[len(name)-1:]}
	if spec != nil {
		spec(&s)
	}
	sn, err := sim.New(s)
	if err != nil {
		f.t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.Node = name
	cfg.Labels = s.Labels
	cfg.Coordinator = f.address()
	cfg.Insecure = true
	cfg.StateDir = f.t.TempDir()
	cfg.Interval = config.Duration(passEvery)
	cfg.PassTimeout = config.Duration(30 * time.Second)
	n := &node{name: name, sim: sn, cfg: cfg, f: f, tap: &tap{}, gate: &gate{}, m: &meter{}}
	for _, o := range opts {
		o(n)
	}
	return n
}

// start runs the node's agent until stop; a second start after a stop is a
// restart on the same state directory (spool and counter state kept).
func (n *node) start() {
	n.f.t.Helper()
	opts := append([]agent.Option{
		agent.WithVersion("fleettest"),
		agent.WithBackoff(fixedBackoff(retryEvery)),
		agent.WithMetrics(n.m),
		agent.WithDialOptions(
			grpc.WithContextDialer(n.gate.dial),
			grpc.WithChainStreamInterceptor(n.tap.intercept),
		),
	}, n.extra...)
	a, err := agent.New(n.cfg, n.sim, n.f.logger("agent"), opts...)
	if err != nil {
		n.f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	n.mu.Lock()
	if n.cancel != nil {
		n.mu.Unlock()
		cancel()
		n.f.t.Fatalf("%s: agent already running", n.name)
	}
	n.cancel, n.done = cancel, done
	n.mu.Unlock()
	go func() { done <- a.Run(ctx) }()
	n.f.t.Cleanup(n.stop)
}

// stop kills the agent (its context ends: the stream drops, a pass in
// progress is abandoned) and waits for it to return.
func (n *node) stop() {
	n.mu.Lock()
	cancel, done := n.cancel, n.done
	n.cancel, n.done = nil, nil
	n.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			n.f.t.Errorf("%s: agent: %v", n.name, err)
		}
	case <-time.After(10 * time.Second):
		n.f.t.Errorf("%s: agent did not stop within 10s", n.name)
	}
}

// kill is the agent dying: its connections close before it can say
// goodbye (a clean stop, stop, leaves its node "left").
func (n *node) kill() {
	n.gate.sever()
	n.stop()
	n.gate.heal()
}

// spooled lists the result ids left in a stopped agent's spool.
func (n *node) spooled() []string {
	n.f.t.Helper()
	sp, err := spool.Open(n.cfg.StateDir+"/spool", spool.Limits{}, zerolog.Nop())
	if err != nil {
		n.f.t.Fatal(err)
	}
	var ids []string
	for _, e := range sp.After(0, 0) {
		ids = append(ids, e.ID)
	}
	return ids
}

type fixedBackoff time.Duration

func (b fixedBackoff) Next(int) time.Duration { return time.Duration(b) }

// gate is the agent's dialer: loopback only, and a switch that cuts the
// agent off (existing connections closed, new ones refused) and heals it.
type gate struct {
	mu    sync.Mutex
	cut   bool
	conns []net.Conn
}

var errCut = errors.New("connection cut by the test")

func (g *gate) dial(ctx context.Context, addr string) (net.Conn, error) {
	if host, _, err := net.SplitHostPort(addr); err != nil || host != "127.0.0.1" {
		return nil, fmt.Errorf("refusing to dial %q: tests reach 127.0.0.1 only", addr)
	}
	// Held across the dial so that a cut cannot miss a connection being made.
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cut {
		return nil, errCut
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	g.conns = append(g.conns, c)
	return c, nil
}

// sever closes the agent's connections and refuses new ones until heal.
func (g *gate) sever() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cut = true
	for _, c := range g.conns {
		c.Close()
	}
	g.conns = nil
}

func (g *gate) heal() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cut = false
}

// tap watches the agent's stream from the agent's side: every result it
// sends and every ack it receives. With dropAcks set, acks are lost on the
// way (the coordinator stored the result; the agent never hears of it).
// With forgetKnown set, the welcome's known result ids are removed, as if
// the coordinator's list (24 h, 1,000 ids) did not reach back that far: the
// agent then resends what it holds unacknowledged.
type tap struct {
	dropAcks    atomic.Bool
	forgetKnown atomic.Bool

	mu      sync.Mutex
	sent    map[string]int  // result id → times sent
	acked   map[string]int  // result id → acks received (refusals not counted)
	dupAcks map[string]bool // result ids acked as duplicates
	dropped int
}

func (tp *tap) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
	streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &tappedStream{ClientStream: cs, tap: tp}, nil
}

type tappedStream struct {
	grpc.ClientStream
	tap *tap
}

func (s *tappedStream) SendMsg(m any) error {
	err := s.ClientStream.SendMsg(m)
	if am, ok := m.(*pb.AgentMessage); ok && err == nil && am.GetResult() != nil {
		s.tap.mu.Lock()
		if s.tap.sent == nil {
			s.tap.sent = map[string]int{}
		}
		s.tap.sent[am.GetResult().GetId()]++
		s.tap.mu.Unlock()
	}
	return err
}

func (s *tappedStream) RecvMsg(m any) error {
	for {
		if err := s.ClientStream.RecvMsg(m); err != nil {
			return err
		}
		cm, ok := m.(*pb.CoordinatorMessage)
		if ok && cm.GetWelcome() != nil && s.tap.forgetKnown.Load() {
			cm.GetWelcome().KnownResultIds = nil
		}
		if !ok || cm.GetAck() == nil {
			return nil
		}
		ack := cm.GetAck()
		s.tap.mu.Lock()
		if s.tap.dropAcks.Load() {
			s.tap.dropped++
			s.tap.mu.Unlock()
			continue
		}
		if ack.GetRefused() == "" {
			if s.tap.acked == nil {
				s.tap.acked = map[string]int{}
			}
			s.tap.acked[ack.GetResultId()]++
			if ack.GetDuplicate() {
				if s.tap.dupAcks == nil {
					s.tap.dupAcks = map[string]bool{}
				}
				s.tap.dupAcks[ack.GetResultId()] = true
			}
		}
		s.tap.mu.Unlock()
		return nil
	}
}

func (tp *tap) ackedIDs() []string {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	out := make([]string, 0, len(tp.acked))
	for id := range tp.acked {
		out = append(out, id)
	}
	return out
}

func (tp *tap) sentIDs() map[string]int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	out := make(map[string]int, len(tp.sent))
	for id, n := range tp.sent {
		out[id] = n
	}
	return out
}

func (tp *tap) ackedAsDuplicate(id string) bool {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.dupAcks[id]
}

func (tp *tap) ackCount() int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return len(tp.acked)
}

// meter is the agent's Metrics: what it did, for the test to wait on.
type meter struct {
	mu        sync.Mutex
	passes    int // inspections made (each spooled)
	spool     int
	connected bool
	acked     int
}

func (m *meter) PassDone(string, *report.Report, time.Duration) {
	m.mu.Lock()
	m.passes++
	m.mu.Unlock()
}

func (m *meter) Spool(results int, _ int64) {
	m.mu.Lock()
	m.spool = results
	m.mu.Unlock()
}

func (m *meter) SpoolDropped(string, int) {}

func (m *meter) Connected(up bool) {
	m.mu.Lock()
	m.connected = up
	m.mu.Unlock()
}

func (m *meter) Acked(bool) {
	m.mu.Lock()
	m.acked++
	m.mu.Unlock()
}

func (m *meter) Refused()      {}
func (m *meter) Work(_ string) {}

func (m *meter) read() (passes, spooled int, connected bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.passes, m.spool, m.connected
}

var _ agent.Metrics = (*meter)(nil)

// ---------------------------------------------------------------- checks on the store

// checkRows counts the stored check rows of each of a node's results.
func checkRows(t testing.TB, st *store.Store, node string) map[string]int {
	t.Helper()
	rows, err := st.Results(context.Background(), store.ResultQuery{Node: node, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, r := range rows {
		out[r.ResultID]++
	}
	return out
}

// summarized counts the check results a node's daily summaries hold.
func summarized(t testing.TB, st *store.Store, node string) int {
	t.Helper()
	sums, err := st.Summaries(context.Background(), node, "")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range sums {
		n += s.Pass + s.Warn + s.Fail + s.Error + s.Skip
	}
	return n
}

func stateOf(t testing.TB, st *store.Store, name string) store.Node {
	t.Helper()
	n, err := st.Node(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func stateIs(st func() *store.Store, name, state string) func() bool {
	return func() bool {
		n, err := st().Node(context.Background(), name)
		return err == nil && n.State == state
	}
}

// events returns a node's events as "kind: message", oldest first.
func events(t testing.TB, st *store.Store, node string) []string {
	t.Helper()
	evs, err := st.Events(context.Background(), store.EventQuery{Node: node, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.Kind+": "+e.Message)
	}
	return out
}

func hasEvent(evs []string, parts ...string) bool {
	for _, e := range evs {
		all := true
		for _, p := range parts {
			if !strings.Contains(e, p) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}
