package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// sharedDB is the one store behind several fake coordinators: a result
// is a row once, whichever coordinator took it.
type sharedDB struct {
	mu       sync.Mutex
	rows     map[string]bool
	receipts int
}

func newSharedDB() *sharedDB { return &sharedDB{rows: map[string]bool{}} }

// insert stores id; false when it was there already (a duplicate).
func (d *sharedDB) insert(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.receipts++
	if d.rows[id] {
		return false
	}
	d.rows[id] = true
	return true
}

func (d *sharedDB) ids() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.rows))
	for id := range d.rows {
		out = append(out, id)
	}
	return out
}

func (d *sharedDB) counts() (rows, receipts int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.rows), d.receipts
}

// liveCoord is a fake coordinator on a fixed 127.0.0.1 port that a test
// kills and starts again.
type liveCoord struct {
	*fakeCoord
	addr string
	mu   sync.Mutex
	srv  *grpc.Server
}

func startLive(t *testing.T, db *sharedDB) *liveCoord {
	t.Helper()
	c := newFakeCoord()
	c.db = db
	l := &liveCoord{fakeCoord: c, addr: "127.0.0.1:0"}
	l.start(t)
	t.Cleanup(l.kill)
	return l
}

func (l *liveCoord) start(t *testing.T) {
	t.Helper()
	lis, err := net.Listen("tcp", l.addr)
	if err != nil {
		t.Fatal(err)
	}
	l.addr = lis.Addr().String()
	srv := grpc.NewServer()
	fleetcheckv1.RegisterAgentServiceServer(srv, l.fakeCoord)
	go func() { _ = srv.Serve(lis) }()
	l.mu.Lock()
	l.srv = srv
	l.mu.Unlock()
}

// kill stops the server at once, streams and all, as a dead process.
func (l *liveCoord) kill() {
	l.mu.Lock()
	srv := l.srv
	l.srv = nil
	l.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// connectedTo returns the coordinator the agent is streaming to, or nil.
func connectedTo(cs []*liveCoord) *liveCoord {
	for _, c := range cs {
		if c.connected() {
			return c
		}
	}
	return nil
}

// Three coordinators over one store: kill the agent's, it moves to
// another; kill one that stored a result but died before its ack, the
// next knows it (one store) and the agent drops it from its spool. In the end every pass
// the agent made is one row: none lost, none stored twice.
func TestFailoverBetweenCoordinators(t *testing.T) {
	t.Parallel()
	db := newSharedDB()
	cs := []*liveCoord{startLive(t, db), startLive(t, db), startLive(t, db)}
	cfg := testConfig(t)
	cfg.Coordinator = ""
	for _, c := range cs {
		cfg.Coordinators = append(cfg.Coordinators, c.addr)
	}
	ta := startAgent(t, cfg, &fakeHost{}, nil)

	var first *liveCoord
	testwait.Until(t, 5*time.Second, "the agent on a coordinator", func() bool { first = connectedTo(cs); return first != nil })
	if want := cs[firstEndpoint(cfg.Node, 3)]; first != want {
		t.Fatalf("agent started on %s, want its own place in the list, %s", first.addr, want.addr)
	}
	testwait.Until(t, 5*time.Second, "a stored result", func() bool { r, _ := db.counts(); return r >= 1 })

	first.kill()
	var second *liveCoord
	testwait.Until(t, 5*time.Second, "the agent on another coordinator", func() bool {
		second = connectedTo(cs)
		return second != nil && second != first
	})

	// This one stores and dies before acking.
	second.set(func(c *fakeCoord) { c.noAck = true })
	rows, _ := db.counts()
	testwait.Until(t, 5*time.Second, "a stored, unacknowledged result", func() bool {
		r, _ := db.counts()
		return r > rows && ta.spool.Len() > 0
	})
	second.kill()
	var third *liveCoord
	testwait.Until(t, 5*time.Second, "the agent on the last coordinator", func() bool {
		third = connectedTo(cs)
		return third != nil && third != first && third != second
	})

	// The first comes back; the agent stays where it is until that one fails.
	first.start(t)
	third.kill()
	testwait.Until(t, 5*time.Second, "the agent back on the first", func() bool { return connectedTo(cs) == first })

	testwait.Until(t, 10*time.Second, "every pass stored once, the spool empty", func() bool {
		var passes int
		ta.metrics.read(func(m *recMetrics) { passes = m.passes })
		r, _ := db.counts()
		return ta.spool.Len() == 0 && r == passes && passes >= 3
	})
	// The unacknowledged one was either named known in the next welcome
	// (and dropped unsent) or resent and acked as a duplicate.
	logs := ta.logs.String()
	if _, receipts := db.counts(); receipts <= len(db.ids()) && !strings.Contains(logs, `"already_stored":1`) {
		t.Errorf("the stored, unacknowledged result was neither known nor resent (%d receipts, %d rows)", receipts, len(db.ids()))
	}
	for _, c := range cs {
		if !strings.Contains(logs, `"coordinator":"`+c.addr+`"`) {
			t.Errorf("the log never names coordinator %s", c.addr)
		}
	}
}

// A host name with several addresses is several coordinators: each
// address dialled in turn, the name kept for TLS.
func TestEndpointsResolveANameToEachAddress(t *testing.T) {
	t.Parallel()
	lookup := func(_ context.Context, host string) ([]string, error) {
		switch host {
		case "coord.test":
			return []string{"127.0.0.3", "127.0.0.1", "127.0.0.2", "127.0.0.1"}, nil
		}
		return nil, errors.New("no such host")
	}
	got := endpoints(context.Background(), []string{"coord.test:7443", "127.0.0.9:7443", "dns:///other.test:7443", "gone.test:7443"}, lookup)
	want := []endpoint{
		{addr: "coord.test:7443", target: "passthrough:///127.0.0.1:7443", authority: "coord.test:7443"},
		{addr: "coord.test:7443", target: "passthrough:///127.0.0.2:7443", authority: "coord.test:7443"},
		{addr: "coord.test:7443", target: "passthrough:///127.0.0.3:7443", authority: "coord.test:7443"},
		{addr: "127.0.0.9:7443", target: "passthrough:///127.0.0.9:7443"},
		{addr: "dns:///other.test:7443", target: "dns:///other.test:7443"},
		{addr: "gone.test:7443", target: "gone.test:7443"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("endpoints:\n got %v\nwant %v", got, want)
	}
	if s := got[1].String(); s != "coord.test:7443 (127.0.0.2:7443)" {
		t.Errorf("String: %q", s)
	}
}

// One name, two coordinators behind it (over real TCP): killing the one
// the agent is on moves it to the other address.
func TestFailoverAcrossOneName(t *testing.T) {
	t.Parallel()
	db := newSharedDB()
	cs := []*liveCoord{startLive(t, db), startLive(t, db)}
	cfg := testConfig(t)
	cfg.Coordinator = ""
	cfg.Coordinators = []string{"coord.test:7443"}
	// The test's name resolves to two addresses; the dialer maps each to
	// a coordinator's real port on 127.0.0.1.
	lookup := func(_ context.Context, host string) ([]string, error) {
		if host != "coord.test" {
			return nil, errors.New("no such host")
		}
		return []string{"127.0.0.1", "127.0.0.2"}, nil
	}
	var mu sync.Mutex
	var dialled []string
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		mu.Lock()
		dialled = append(dialled, addr)
		mu.Unlock()
		real := map[string]string{"127.0.0.1:7443": cs[0].addr, "127.0.0.2:7443": cs[1].addr}[addr]
		if real == "" {
			return nil, errors.New("test: unexpected address " + addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", real)
	}
	ta := startAgent(t, cfg, &fakeHost{}, nil, withLookup(lookup), WithDialOptions(grpc.WithContextDialer(dial)))
	var on *liveCoord
	testwait.Until(t, 5*time.Second, "the agent on one address", func() bool { on = connectedTo(cs); return on != nil })
	on.kill()
	testwait.Until(t, 5*time.Second, "the agent on the other address", func() bool {
		c := connectedTo(cs)
		return c != nil && c != on
	})
	c := cs[0]
	if on == cs[0] {
		c = cs[1]
	}
	var h *fleetcheckv1.Hello
	c.get(func(c *fakeCoord) { h = c.hellos[len(c.hellos)-1] })
	if h.GetNode() != cfg.Node {
		t.Errorf("hello from %q", h.GetNode())
	}
	if !strings.Contains(ta.logs.String(), `"coordinator":"coord.test:7443 (127.0.0.`) {
		t.Errorf("the log does not name the name and the address:\n%s", ta.logs.String())
	}
}

// The backoff grows with whole rounds of failures: moving to the next
// coordinator waits attempt 0's backoff, a third round attempt 2's.
func TestRotationBacksOffByRounds(t *testing.T) {
	t.Parallel()
	r := &rotation{node: "gpu-001", addrs: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}}
	start := firstEndpoint("gpu-001", 3)
	var picked []string
	var rounds []int
	for range 7 {
		picked = append(picked, r.pick(context.Background()).addr)
		rounds = append(rounds, r.done(false))
	}
	if !slices.Equal(rounds, []int{0, 0, 0, 1, 1, 1, 2}) {
		t.Errorf("backoff attempts %v, want rounds 0 0 0 1 1 1 2", rounds)
	}
	for i, p := range picked {
		if want := r.addrs[(start+i)%3]; p != want {
			t.Errorf("pick %d: %s, want %s", i, p, want)
		}
	}
	r.pick(context.Background())
	if got := r.done(true); got != 0 {
		t.Errorf("after a healthy session the backoff starts over: attempt %d", got)
	}
	// A fleet spreads: 300 nodes over 3 coordinators, none empty or crowded.
	var per [3]int
	for i := range 300 {
		per[firstEndpoint(fmt.Sprintf("gpu-%03d", i), 3)]++
	}
	for i, n := range per {
		if n < 60 || n > 140 {
			t.Errorf("coordinator %d starts %d of 300 nodes", i, n)
		}
	}
}

func TestCoordinatorsConfig(t *testing.T) {
	t.Parallel()
	const base = "node: gpu-001\ninsecure: true\n"
	c, err := ParseConfig([]byte(base + "coordinators: [127.0.0.1:7443, 127.0.0.2:7443, 'dns:///coord.example:7443']\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.coordinatorAddrs(); len(got) != 3 || got[2] != "dns:///coord.example:7443" {
		t.Errorf("coordinators: %v", got)
	}
	c, err = ParseConfig([]byte(base + "coordinator: 127.0.0.1:7443\n"))
	if err != nil || !slices.Equal(c.coordinatorAddrs(), []string{"127.0.0.1:7443"}) {
		t.Errorf("coordinator: alone: %v %v", c, err)
	}
	many := "coordinators: ["
	for i := range 17 {
		many += "127.0.0." + strconv.Itoa(i+1) + ":7443,"
	}
	for _, tc := range []struct{ yaml, want string }{
		{"coordinator: 127.0.0.1:7443\ncoordinators: [127.0.0.2:7443]", "coordinator and coordinators: set one"},
		{"coordinators: []", "coordinator: the coordinator's address (host:port) is required (or coordinators: [a, b, c])"},
		{"coordinators: [127.0.0.1:7443, 127.0.0.1:7443]", `coordinators: "127.0.0.1:7443" twice`},
		{"coordinators: [127.0.0.1:7443, coord]", `coordinators "coord": want host:port`},
		{"coordinators: ['']", "coordinators: an empty address"},
		{many + "]", "coordinators 17 is out of range: must be within 1..16"},
	} {
		_, err := ParseConfig([]byte(base + tc.yaml + "\n"))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.yaml, err, tc.want)
		}
		if strings.HasPrefix(tc.yaml, "coordinators: [127.0.0.1:7443, 127.0.0.1") && errors.Is(err, config.ErrOutOfRange) {
			t.Errorf("%s: a duplicate is not a range error", tc.yaml)
		}
	}
}

// A paused coordinator (it takes the connection and the hello, and says
// nothing) is left after reconnect.hello_timeout for the next one.
func TestFailoverFromAFrozenCoordinator(t *testing.T) {
	t.Parallel()
	db := newSharedDB()
	frozen, good := startLive(t, db), startLive(t, db)
	frozen.set(func(c *fakeCoord) { c.noWelcome = true })
	cfg := testConfig(t)
	cfg.Coordinator = ""
	cfg.Node = "gpu-frozen-first"
	// The node's own first place is the frozen one.
	if firstEndpoint(cfg.Node, 2) == 0 {
		cfg.Coordinators = []string{frozen.addr, good.addr}
	} else {
		cfg.Coordinators = []string{good.addr, frozen.addr}
	}
	cfg.Reconnect.HelloTimeout = config.Duration(time.Second)
	a, err := New(cfg, &fakeHost{}, nopLogger(), WithBackoff(&recBackoff{wait: 10 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	start := time.Now()
	testwait.Until(t, 10*time.Second, "the agent welcomed by the other coordinator", func() bool { return good.connected() })
	var hellos int
	frozen.get(func(c *fakeCoord) { hellos = len(c.hellos) })
	if hellos == 0 {
		t.Fatal("the agent never tried the frozen coordinator first")
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("left the frozen coordinator after %s, before hello_timeout 1s", took)
	}
	testwait.Until(t, 5*time.Second, "a result stored", func() bool { r, _ := db.counts(); return r >= 1 })
}

// examples/agent-ha.yaml loads, and its agent would try each of the three
// coordinators in turn, each under its own name.
func TestExampleHAAgent(t *testing.T) {
	t.Parallel()
	c, err := LoadConfig("../examples/agent-ha.yaml")
	if err != nil {
		t.Fatalf("examples/agent-ha.yaml: %v", err)
	}
	if time.Duration(c.Reconnect.HelloTimeout) != 10*time.Second {
		t.Errorf("hello_timeout %s", time.Duration(c.Reconnect.HelloTimeout))
	}
	noDNS := func(context.Context, string) ([]string, error) { return nil, errors.New("no DNS in tests") }
	r := &rotation{node: c.Node, addrs: c.coordinatorAddrs(), lookup: noDNS}
	seen := map[string]bool{}
	for range 3 {
		seen[r.pick(context.Background()).addr] = true
		r.done(false)
	}
	if len(seen) != 3 {
		t.Errorf("three attempts tried %v, want each coordinator once", seen)
	}
}
