package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"runtime/pprof"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// ---------------------------------------------------------------- hosts

// fakeHost is a node with nothing on it: every command source is absent,
// the file tree empty. Sources in hang block until the caller's context
// ends, like a stuck nvidia-smi behind a well-behaved runner.
type fakeHost struct {
	host.Host // nil unless wrapping a bundle
	hang      map[snapshot.Source]bool
}

func (f *fakeHost) Name() string {
	if f.Host != nil {
		return f.Host.Name()
	}
	return "fake"
}

func (f *fakeHost) Now() time.Time {
	if f.Host != nil {
		return f.Host.Now()
	}
	return time.Now()
}

func (f *fakeHost) FS() fs.FS {
	if f.Host != nil {
		return f.Host.FS()
	}
	return fstest.MapFS{}
}

func (f *fakeHost) Capture(ctx context.Context, src snapshot.Source) host.Capture {
	if f.hang[src] {
		<-ctx.Done()
		return host.Capture{State: snapshot.StateTimeout, Err: string(src) + " hung"}
	}
	if f.Host != nil {
		return f.Host.Capture(ctx, src)
	}
	return host.Absent("not on the test host")
}

// ---------------------------------------------------------------- network

// testNet is an in-memory network whose listener the test swaps: nil
// means the coordinator is down (connection refused).
type testNet struct {
	mu  sync.Mutex
	lis *bufconn.Listener
}

func (n *testNet) dial(ctx context.Context, _ string) (net.Conn, error) {
	n.mu.Lock()
	l := n.lis
	n.mu.Unlock()
	if l == nil {
		return nil, errors.New("connection refused (test: coordinator down)")
	}
	return l.DialContext(ctx)
}

// serve starts c on the network and returns a func that stops it.
func (n *testNet) serve(t *testing.T, c *fakeCoord) func() {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	fleetcheckv1.RegisterAgentServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	n.mu.Lock()
	n.lis = lis
	n.mu.Unlock()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			n.mu.Lock()
			n.lis = nil
			n.mu.Unlock()
			srv.Stop()
		})
	}
	t.Cleanup(stop)
	return stop
}

// ---------------------------------------------------------------- coordinator

// fakeCoord is a coordinator written against the generated server
// interface: it welcomes, stores results once by id, acks (duplicates with
// the flag), records work statuses and heartbeats in arrival order.
type fakeCoord struct {
	fleetcheckv1.UnimplementedAgentServiceServer
	heartbeatMs int64

	mu         sync.Mutex
	refuse     string // non-empty: refuse hellos with FailedPrecondition
	noAck      bool   // store but do not ack (a coordinator dying before its ack)
	silent     bool   // send nothing after the welcome
	refuseRes  string // non-empty: refuse every result with this reason
	noWelcome  bool   // take the hello and never answer
	gossipAddr string // announced in the welcome
	columns    bool   // the welcome says metric_columns
	known      []string
	connects   int
	connectAt  []time.Time
	hellos     []*fleetcheckv1.Hello
	results    map[string]*fleetcheckv1.Result
	receipts   map[string]int
	mismatch   []string // ids resent with different content
	events     []string // arrival order: "result:ID", "status:WORK:STATE:RESULT"
	statuses   []*fleetcheckv1.WorkStatus
	actions    []*fleetcheckv1.ActionStatus
	gossipKeys []*fleetcheckv1.GossipKeyStatus
	heartbeats int
	conn       *coordConn
	// db, when set, is a store several coordinators share (failover
	// tests): it dedupes by id across them and names known results.
	db *sharedDB
}

type coordConn struct {
	out chan *fleetcheckv1.CoordinatorMessage
	cut context.CancelFunc
}

func newFakeCoord() *fakeCoord {
	return &fakeCoord{heartbeatMs: 500, results: map[string]*fleetcheckv1.Result{}, receipts: map[string]int{}}
}

func (c *fakeCoord) Connect(st grpc.BidiStreamingServer[fleetcheckv1.AgentMessage, fleetcheckv1.CoordinatorMessage]) error {
	c.mu.Lock()
	c.connects++
	c.connectAt = append(c.connectAt, time.Now())
	refuse := c.refuse
	c.mu.Unlock()
	first, err := st.Recv()
	if err != nil {
		return err
	}
	h := first.GetHello()
	if h == nil {
		return status.Error(codes.InvalidArgument, "hello first")
	}
	c.mu.Lock()
	c.hellos = append(c.hellos, h)
	known := c.known
	if c.db != nil {
		known = c.db.ids()
	}
	gossipAddr, columns := c.gossipAddr, c.columns
	c.mu.Unlock()
	if refuse != "" {
		return status.Error(codes.FailedPrecondition, refuse)
	}
	if c.noWelcome {
		<-st.Context().Done()
		return st.Context().Err()
	}
	if err := st.Send(&fleetcheckv1.CoordinatorMessage{Msg: &fleetcheckv1.CoordinatorMessage_Welcome{Welcome: &fleetcheckv1.Welcome{
		CoordinatorVersion: "test", ProtocolVersion: "1.0", KnownResultIds: known, HeartbeatIntervalMs: c.heartbeatMs,
		GossipAddr: gossipAddr, MetricColumns: columns,
	}}}); err != nil {
		return err
	}
	ctx, cut := context.WithCancel(st.Context())
	defer cut()
	conn := &coordConn{out: make(chan *fleetcheckv1.CoordinatorMessage, 256), cut: cut}
	c.mu.Lock()
	c.conn = conn
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.conn == conn {
			c.conn = nil
		}
		c.mu.Unlock()
	}()
	in := make(chan *fleetcheckv1.AgentMessage)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case in <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	hb := time.NewTicker(time.Duration(c.heartbeatMs) * time.Millisecond)
	defer hb.Stop()
	for {
		select {
		case <-ctx.Done():
			return status.Error(codes.Unavailable, "connection cut by the test")
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case m := <-conn.out:
			if err := st.Send(m); err != nil {
				return err
			}
		case <-hb.C:
			c.mu.Lock()
			silent := c.silent
			c.mu.Unlock()
			if silent {
				continue
			}
			if err := st.Send(&fleetcheckv1.CoordinatorMessage{Msg: &fleetcheckv1.CoordinatorMessage_Heartbeat{
				Heartbeat: &fleetcheckv1.Heartbeat{UnixMs: time.Now().UnixMilli()}}}); err != nil {
				return err
			}
		case m := <-in:
			if reply := c.handle(m); reply != nil {
				if err := st.Send(reply); err != nil {
					return err
				}
			}
		}
	}
}

func (c *fakeCoord) handle(m *fleetcheckv1.AgentMessage) *fleetcheckv1.CoordinatorMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch x := m.GetMsg().(type) {
	case *fleetcheckv1.AgentMessage_Result:
		r := x.Result
		c.receipts[r.GetId()]++
		c.events = append(c.events, "result:"+r.GetId())
		dup := false
		if old, ok := c.results[r.GetId()]; ok {
			dup = true
			if !proto.Equal(old, r) {
				c.mismatch = append(c.mismatch, r.GetId())
			}
		} else {
			c.results[r.GetId()] = r
		}
		if c.db != nil {
			dup = !c.db.insert(r.GetId())
		}
		if c.noAck || c.silent {
			return nil
		}
		if c.refuseRes != "" {
			return &fleetcheckv1.CoordinatorMessage{Msg: &fleetcheckv1.CoordinatorMessage_Ack{Ack: &fleetcheckv1.Ack{
				ResultId: r.GetId(), Refused: c.refuseRes}}}
		}
		return &fleetcheckv1.CoordinatorMessage{Msg: &fleetcheckv1.CoordinatorMessage_Ack{Ack: &fleetcheckv1.Ack{
			ResultId: r.GetId(), Duplicate: dup, StoredUnixMs: time.Now().UnixMilli()}}}
	case *fleetcheckv1.AgentMessage_WorkStatus:
		ws := x.WorkStatus
		c.statuses = append(c.statuses, ws)
		c.events = append(c.events, fmt.Sprintf("status:%s:%s:%s", ws.GetWorkId(), ws.GetState(), ws.GetResultId()))
	case *fleetcheckv1.AgentMessage_ActionStatus:
		c.actions = append(c.actions, x.ActionStatus)
	case *fleetcheckv1.AgentMessage_GossipKeyStatus:
		c.gossipKeys = append(c.gossipKeys, x.GossipKeyStatus)
	case *fleetcheckv1.AgentMessage_Heartbeat:
		c.heartbeats++
	}
	return nil
}

// send sends any message on the current stream.
func (c *fakeCoord) send(t *testing.T, m *fleetcheckv1.CoordinatorMessage) {
	t.Helper()
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		t.Fatal("send: no agent connected")
	}
	conn.out <- m
}

// actionState returns the first status of state for an action id, nil
// when none came yet.
func (c *fakeCoord) actionState(id string, st fleetcheckv1.ActionStatus_State) *fleetcheckv1.ActionStatus {
	var out *fleetcheckv1.ActionStatus
	c.get(func(c *fakeCoord) {
		for _, a := range c.actions {
			if a.GetActionId() == id && a.GetState() == st {
				out = a
				return
			}
		}
	})
	return out
}

// runChecks sends a request on the current stream.
func (c *fakeCoord) runChecks(t *testing.T, rc *fleetcheckv1.RunChecks) {
	t.Helper()
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		t.Fatal("runChecks: no agent connected")
	}
	conn.out <- &fleetcheckv1.CoordinatorMessage{Msg: &fleetcheckv1.CoordinatorMessage_RunChecks{RunChecks: rc}}
}

// cut drops the current stream, as a network failure would.
func (c *fakeCoord) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		c.conn.cut()
	}
}

func (c *fakeCoord) set(f func(c *fakeCoord)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(c)
}

func (c *fakeCoord) get(f func(c *fakeCoord)) { c.set(f) }

func (c *fakeCoord) connected() bool {
	var ok bool
	c.get(func(c *fakeCoord) { ok = c.conn != nil })
	return ok
}

func (c *fakeCoord) stored() int {
	var n int
	c.get(func(c *fakeCoord) { n = len(c.results) })
	return n
}

// status returns the statuses received for a work id.
func (c *fakeCoord) statusOf(workID string) []*fleetcheckv1.WorkStatus {
	var out []*fleetcheckv1.WorkStatus
	c.get(func(c *fakeCoord) {
		for _, s := range c.statuses {
			if s.GetWorkId() == workID {
				out = append(out, s)
			}
		}
	})
	return out
}

func (c *fakeCoord) hasState(workID string, st fleetcheckv1.WorkStatus_State) *fleetcheckv1.WorkStatus {
	for _, s := range c.statusOf(workID) {
		if s.GetState() == st {
			return s
		}
	}
	return nil
}

// ---------------------------------------------------------------- agent side

// recMetrics records what the agent reports.
type recMetrics struct {
	mu         sync.Mutex
	passes     int // scheduled
	workPasses int
	spool      int
	dropped    map[string]int // by reason
	up         bool
	acked      int
	dupAcks    int
	refused    int
	work       map[string]int
	gossip     [3]int // alive, dead, left
}

func (m *recMetrics) PassDone(workID string, _ *report.Report, _ time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if workID == "" {
		m.passes++
	} else {
		m.workPasses++
	}
}

func (m *recMetrics) Spool(n int, _ int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.spool = n
}

func (m *recMetrics) SpoolDropped(reason string, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dropped == nil {
		m.dropped = map[string]int{}
	}
	m.dropped[reason] += n
}

func (m *recMetrics) Connected(up bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.up = up
}

func (m *recMetrics) Acked(dup bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.acked++
	if dup {
		m.dupAcks++
	}
}

func (m *recMetrics) Refused() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refused++
}

func (m *recMetrics) Work(outcome string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.work == nil {
		m.work = map[string]int{}
	}
	m.work[outcome]++
}

func (m *recMetrics) GossipMembers(alive, dead, left int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gossip = [3]int{alive, dead, left}
}

func (m *recMetrics) read(f func(m *recMetrics)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m)
}

// recBackoff waits a fixed time and records the attempts it was asked about.
type recBackoff struct {
	wait     time.Duration
	mu       sync.Mutex
	attempts []int
}

func (b *recBackoff) Next(attempt int) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.attempts = append(b.attempts, attempt)
	return b.wait
}

func (b *recBackoff) calls() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.attempts...)
}

// logBuf collects log lines from many goroutines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func testConfig(t *testing.T) *Config {
	t.Helper()
	c := DefaultConfig()
	c.Node = "gpu-001"
	c.Labels = map[string]string{"sku": "h100-sxm-8", "rack": "r12"}
	c.Coordinator = "passthrough:///coordinator"
	c.Insecure = true
	c.StateDir = t.TempDir()
	c.Interval = config.Duration(time.Second)
	return c
}

// testAgent is a running agent and what observes it.
type testAgent struct {
	*Agent
	metrics *recMetrics
	backoff *recBackoff
	logs    *logBuf
	stop    func()
}

func startAgent(t *testing.T, cfg *Config, h host.Host, tn *testNet, opts ...Option) *testAgent {
	t.Helper()
	ta := &testAgent{metrics: &recMetrics{}, backoff: &recBackoff{wait: 50 * time.Millisecond}, logs: &logBuf{}}
	all := []Option{
		WithBackoff(ta.backoff),
		WithMetrics(ta.metrics),
		WithTimeouts(2*time.Second, 0, 0),
		WithVersion("test"),
	}
	if tn != nil { // nil: the agent's own dialer, over loopback TCP
		all = append(all, WithDialOptions(grpc.WithContextDialer(tn.dial)))
	}
	all = append(all, opts...)
	a, err := New(cfg, h, zerolog.New(ta.logs).Level(zerolog.DebugLevel), all...)
	if err != nil {
		t.Fatalf("new agent: %v", err)
	}
	ta.Agent = a
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	ta.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("agent run: %v", err)
				}
			case <-time.After(5 * time.Second):
				var buf bytes.Buffer
				_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
				t.Errorf("agent did not stop within 5s; goroutines:\n%s", buf.String())
			}
		})
	}
	t.Cleanup(ta.stop)
	return ta
}

func nopLogger() zerolog.Logger { return zerolog.Nop() }
