package coordinator

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// haPolicyServer is one of several coordinators on url with the drain
// policy on, behind a breaker of maxCount drains (or maxShare of the
// fleet), through its own record-only adapter.
func haPolicyServer(t *testing.T, url string, adapter drain.Adapter, maxCount int, maxShare float64) *Server {
	t.Helper()
	cfg := Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), StoreURL: url,
		HeartbeatInterval: time.Second, Insecure: true, HA: HAConfig{Enabled: true, LeaseTTL: time.Minute}}
	cfg.Drain.Policy = DrainPolicyConfig{Actions: []string{"replace", "reseat"}}
	cfg.Breaker.MaxCount, cfg.Breaker.MaxShare = maxCount, maxShare
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, Options{Logger: zerolog.Nop(), Version: "test", Drain: adapter})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(t, s) })
	return s
}

// Two coordinators on one PostgreSQL, three agents on each, every node
// reporting an uncorrectable ECC error to its own coordinator: each
// coordinator's drain policy asks the breaker, and the breaker's window
// is one for both, so the fleet loses the limit (2), not twice it.
func TestHABreakerIsOneAcrossCoordinators(t *testing.T) {
	url := pgtest.URL(t)
	const limit = 2
	recA, recB := drain.NewNone(nil), drain.NewNone(nil)
	a := haPolicyServer(t, url, recA, limit, 0)
	b := haPolicyServer(t, url, recB, limit, 0)
	type placed struct {
		s    *Server
		rec  *drain.None
		node string
	}
	var nodes []placed
	for i := 1; i <= 6; i++ {
		p := placed{a, recA, fmt.Sprintf("gpu-%03d", i)}
		if i > 3 {
			p.s, p.rec = b, recB
		}
		nodes = append(nodes, p)
	}
	for _, p := range nodes {
		ag := mustConnect(t, p.s, p.node)
		ag.sendResult(result(p.node, true))
		ag.ack(5 * time.Second)
	}
	// Every node is either drained or refused by the breaker.
	drained := func() (n int, which []string) {
		for _, p := range nodes {
			if st, err := p.rec.Status(context.Background(), p.node); err == nil && st.Drained {
				n++
				which = append(which, p.node)
			}
		}
		return n, which
	}
	testwait.For(t, 30*time.Second, "every node drained or refused", func() (bool, string) {
		var pending []string
		for _, p := range nodes {
			st, err := p.rec.Status(context.Background(), p.node)
			refused := hasEvent(eventsOf(t, p.s, p.node), "audit: drain refused: gpu.ecc")
			if (err != nil || !st.Drained) && !refused {
				pending = append(pending, p.node)
			}
		}
		return len(pending) == 0, strings.Join(pending, ",")
	})
	if n, which := drained(); n != limit {
		t.Fatalf("%d nodes drained (%v) across two coordinators, limit %d", n, which, limit)
	}
	// Both coordinators' breakers say the same.
	for name, s := range map[string]*Server{"a": a, "b": b} {
		if st := s.camp.breaker.State(6); st.Drained != limit || !st.Open {
			t.Errorf("%s's breaker: %+v", name, st)
		}
	}
	// Refusals name the shared window.
	refusedOn := map[*Server]bool{}
	for _, p := range nodes {
		if hasEvent(eventsOf(t, p.s, p.node), "across coordinators") {
			refusedOn[p.s] = true
		}
	}
	if len(refusedOn) == 0 {
		t.Error("no refusal names the shared window")
	}
}

// max_share is of the whole fleet, not of the nodes connected to the
// coordinator asking: four healthy nodes join through b after a started,
// two failing ones through a; a share of 0.34 of six nodes is two drains,
// and a drains both (of its own two nodes the share would allow one).
func TestHABreakerShareIsOfTheWholeFleet(t *testing.T) {
	url := pgtest.URL(t)
	recA, recB := drain.NewNone(nil), drain.NewNone(nil)
	a := haPolicyServer(t, url, recA, 0, 0.34)
	b := haPolicyServer(t, url, recB, 0, 0.34)
	for i := 1; i <= 4; i++ {
		node := fmt.Sprintf("gpu-%03d", i)
		ag := mustConnect(t, b, node)
		ag.sendResult(result(node, false))
		ag.ack(5 * time.Second)
	}
	failing := []string{"gpu-005", "gpu-006"}
	for _, node := range failing {
		ag := mustConnect(t, a, node)
		ag.sendResult(result(node, true))
		ag.ack(5 * time.Second)
	}
	testwait.For(t, 30*time.Second, "both failing nodes drained or refused", func() (bool, string) {
		var pending []string
		for _, node := range failing {
			st, err := recA.Status(context.Background(), node)
			if (err != nil || !st.Drained) && !hasEvent(eventsOf(t, a, node), "audit: drain refused: gpu.ecc") {
				pending = append(pending, node)
			}
		}
		return len(pending) == 0, strings.Join(pending, ",")
	})
	for _, node := range failing {
		if st, err := recA.Status(context.Background(), node); err != nil || !st.Drained {
			t.Errorf("%s not drained (%+v, %v): events %v", node, st, err, eventsOf(t, a, node))
		}
	}
}
