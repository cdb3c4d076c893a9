package sweep

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaign"
	"github.com/fleetcheck/fleetcheck/config"
	"github.com/fleetcheck/fleetcheck/report"
	"github.com/fleetcheck/fleetcheck/simfleet"
)

// reconnecting is a simulated fleet whose named agents are away until a
// time on its clock, as after a coordinator restart.
type reconnecting struct {
	campaign.Fleet
	clock *simfleet.Clock
	mu    sync.Mutex
	until map[string]time.Time
}

func (r *reconnecting) away(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.until[name]
	return ok && r.clock.Now().Before(t)
}

func (r *reconnecting) Nodes(ctx context.Context, sel string) ([]campaign.Node, error) {
	ns, err := r.Fleet.Nodes(ctx, sel)
	for i := range ns {
		if r.away(ns[i].Name) {
			ns[i].Connected, ns[i].State = false, "unreachable"
		}
	}
	return ns, err
}

func (r *reconnecting) RunChecks(ctx context.Context, node string, checks []string, opts campaign.RunOptions) (*report.Report, error) {
	if r.away(node) {
		return nil, fmt.Errorf("node %s: %w", node, campaign.ErrUnreachable)
	}
	return r.Fleet.RunChecks(ctx, node, checks, opts)
}

func (r *reconnecting) RunMulti(ctx context.Context, nodes []string, check string, opts campaign.RunOptions) (*report.Report, error) {
	for _, n := range nodes {
		if r.away(n) {
			return nil, fmt.Errorf("node %s: %w", n, campaign.ErrUnreachable)
		}
	}
	return r.Fleet.RunMulti(ctx, nodes, check, opts)
}

// TestSweepWaitsForReconnectingAgents: a sweep started while agents are
// still reconnecting waits for them (up to connect_grace after its start)
// and tests those that come back; one that stays away is unreachable, with
// the reason, and not among the passed.
func TestSweepWaitsForReconnectingAgents(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simfleet.Config{Nodes: 16, Seed: 3}, nil)
	clk := h.fleet.Clock()
	start := clk.Now()
	fleet := &reconnecting{Fleet: h.calls, clock: clk, until: map[string]time.Time{
		"gpu-0003": start.Add(40 * time.Second),
		"gpu-0007": start.Add(24 * time.Hour),
	}}
	eng, err := New(Config{Fleet: fleet, Store: h.store, Baselines: referenceSource(t), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := eng.Sweep(context.Background(), Spec{ConnectGrace: 0})
	if err != nil {
		t.Fatal(err)
	}
	passed := strings.Join(rep.Passed, ",")
	if !strings.Contains(passed, "gpu-0003") || strings.Contains(passed, "gpu-0007") || rep.Tested != 15 {
		t.Fatalf("tested %d, passed %v\n%s", rep.Tested, rep.Passed, describe(rep))
	}
	v := verdictOf(rep, "gpu-0007")
	if v == nil || v.Verdict != Unreachable || v.Reason != "agent not connected: waited 2m0s after the sweep started; not tested" {
		t.Fatalf("gpu-0007 verdict %+v", v)
	}
}

func TestSweepConnectGraceRange(t *testing.T) {
	t.Parallel()
	for _, g := range []time.Duration{time.Second, 48 * time.Hour} {
		s := Spec{}.WithDefaults()
		s.ConnectGrace = config.Duration(g)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "connect_grace") {
			t.Errorf("connect_grace %v: %v", g, err)
		}
	}
}
