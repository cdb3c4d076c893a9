package membership

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/sim/faultnet"
	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// testLogger is silent unless MEMBERSHIP_TEST_LOG is set: memberlist keeps
// logging from its goroutines after a test ends, where t.Log would panic.
func testLogger() zerolog.Logger {
	if os.Getenv("MEMBERSHIP_TEST_LOG") != "" {
		return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(zerolog.DebugLevel).With().Timestamp().Logger()
	}
	return zerolog.Nop()
}

// fastConfig is LoopbackConfig with failure detection about five times faster
// than production: a suspicion timeout of 3 × 200 ms for pools under ten, up
// to six times that until a peer confirms. Not faster: these tests share two CPUs
// with the race detector and other packages' tests, and a starved member
// must not be declared dead.
func fastConfig(name string) Config {
	c := LoopbackConfig(name)
	c.ProbeInterval = 200 * time.Millisecond
	c.ProbeTimeout = 100 * time.Millisecond
	c.GossipInterval = 50 * time.Millisecond
	c.SuspicionMult = 3
	c.PushPullInterval = time.Second
	c.TCPTimeout = 2 * time.Second
	c.RejoinInterval = -1
	return c
}

// stateIs reports whether p holds every named member in state want.
func stateIs(p *Pool, want State, names ...string) bool {
	for _, name := range names {
		if m, ok := p.Member(name); !ok || m.State != want {
			return false
		}
	}
	return true
}

// recorder keeps every event a Pool delivered.
type recorder struct {
	mu     sync.Mutex
	events []recorded
}

type recorded struct {
	kind   string
	member Member
	at     time.Time
}

var _ Events = (*recorder)(nil)

func (r *recorder) add(kind string, m Member) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recorded{kind: kind, member: m, at: time.Now()})
}

func (r *recorder) NodeJoined(m Member)  { r.add("joined", m) }
func (r *recorder) NodeLeft(m Member)    { r.add("left", m) }
func (r *recorder) NodeUpdated(m Member) { r.add("updated", m) }

// find returns the latest event of kind about name.
func (r *recorder) find(kind, name string) (recorded, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.events) - 1; i >= 0; i-- {
		if e := r.events[i]; e.kind == kind && e.member.Name == name {
			return e, true
		}
	}
	return recorded{}, false
}

func (r *recorder) count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.kind == kind {
			n++
		}
	}
	return n
}

// mockCluster is n members on a memberlist.MockNetwork behind one
// faultnet.Network. Nothing is joined yet.
type mockCluster struct {
	faults *faultnet.Network
	pools  []*Pool
	recs   []*recorder
	// logs are each member's warnings and errors (memberlist's refusals
	// among them): proof that a member looked at what it refused.
	logs []*lockedBuffer
}

func nodeName(i int) string { return fmt.Sprintf("n%d", i) }

// newMockCluster starts n members; modify, when not nil, adjusts each
// member's config and may read the addresses of the members started before.
func newMockCluster(t *testing.T, n int, modify func(i int, c *Config, started []*Pool)) *mockCluster {
	t.Helper()
	var network memberlist.MockNetwork
	mc := &mockCluster{faults: faultnet.New()}
	// MockNetwork's maps are not locked: every transport exists before any
	// member starts using the network.
	transports := make([]memberlist.NodeAwareTransport, n)
	for i := range n {
		transports[i] = mc.faults.Wrap(network.NewTransport(nodeName(i)))
	}
	t.Cleanup(func() {
		for _, p := range mc.pools {
			if err := p.Shutdown(); err != nil {
				t.Errorf("shutdown %s: %v", p.cfg.NodeName, err)
			}
		}
		mc.faults.Close()
	})
	for i := range n {
		c := fastConfig(nodeName(i))
		c.Transport = transports[i]
		if modify != nil {
			modify(i, &c, mc.pools)
		}
		rec, logs := &recorder{}, &lockedBuffer{}
		logger := testLogger()
		if os.Getenv("MEMBERSHIP_TEST_LOG") == "" {
			logger = zerolog.New(logs).Level(zerolog.WarnLevel)
		}
		p, err := New(c, logger, rec)
		if err != nil {
			t.Fatalf("start %s: %v", c.NodeName, err)
		}
		mc.pools = append(mc.pools, p)
		mc.recs = append(mc.recs, rec)
		mc.logs = append(mc.logs, logs)
	}
	return mc
}

func (mc *mockCluster) addr(i int) string { return mc.pools[i].LocalMember().Addr }

// joinAll joins members 1..n-1 to member 0 and waits until all see all.
func (mc *mockCluster) joinAll(t *testing.T, idx ...int) {
	t.Helper()
	for _, i := range idx {
		if _, err := mc.pools[i].Join([]string{mc.addr(0)}); err != nil {
			t.Fatalf("%s join: %v", nodeName(i), err)
		}
	}
	mc.waitAlive(t, append([]int{0}, idx...)...)
}

// waitAlive waits until each of the members idx holds all of them alive.
func (mc *mockCluster) waitAlive(t *testing.T, idx ...int) {
	t.Helper()
	names := make([]string, len(idx))
	for k, i := range idx {
		names[k] = nodeName(i)
	}
	for _, i := range idx {
		p := mc.pools[i]
		testwait.For(t, 10*time.Second, fmt.Sprintf("%s holding all of %v alive", nodeName(i), names), func() (bool, string) {
			return stateIs(p, StateAlive, names...), fmt.Sprintf("%+v", p.Members())
		})
	}
}

func upTo(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// firstOther returns the first event of kind about a member other than self.
func (r *recorder) firstOther(kind, self string) (recorded, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.kind == kind && e.member.Name != self {
			return e, true
		}
	}
	return recorded{}, false
}
