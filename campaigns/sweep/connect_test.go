package sweep

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// reconnecting is a simulated fleet whose named agents are away until a
// time on its clock, as after a coordinator restart.
type reconnecting struct {
	kit.Fleet
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

func (r *reconnecting) Nodes(ctx context.Context, sel string) ([]kit.Node, error) {
	ns, err := r.Fleet.Nodes(ctx, sel)
	for i := range ns {
		if r.away(ns[i].Name) {
			ns[i].Connected, ns[i].State = false, "unreachable"
		}
	}
	return ns, err
}

func (r *reconnecting) RunChecks(ctx context.Context, node string, checks []string, opts kit.RunOptions) (*report.Report, error) {
	if r.away(node) {
		return nil, fmt.Errorf("node %s: %w", node, kit.ErrUnreachable)
	}
	return r.Fleet.RunChecks(ctx, node, checks, opts)
}

func (r *reconnecting) RunMulti(ctx context.Context, nodes []string, check string, opts kit.RunOptions) (*report.Report, error) {
	for _, n := range nodes {
		if r.away(n) {
			return nil, fmt.Errorf("node %s: %w", n, kit.ErrUnreachable)
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
	eng, err := New(context.Background(), kit.Deps{Fleet: fleet, Clock: clk}, Options{Store: h.store, Baselines: referenceSource(t)})
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

// TestSweepResumeWaitsForAgents: a coordinator killed in the middle of
// round 1 restarts with every agent still away (they reconnect with
// backoff). The resumed sweep waits for each test's nodes, up to
// connect_grace from the test's turn: agents back within it are tested
// and pass, none of their tests lost to the restart; agents that stay
// away are unreachable after the wait, never passed, and the sweep says
// it could not test.
func TestSweepResumeWaitsForAgents(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		away time.Duration // after the restart
		back bool
	}{
		{"agents back within the grace", 40 * time.Second, true},
		{"agents away past the grace", 24 * time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, simfleet.Config{Nodes: 8, Seed: 5}, nil)
			clk := h.fleet.Clock()
			fleet := &reconnecting{Fleet: h.calls, clock: clk, until: map[string]time.Time{}}
			engine := func() *Engine {
				e, err := New(context.Background(), kit.Deps{Fleet: fleet, Clock: clk},
					Options{Store: h.store, Baselines: referenceSource(t), NewID: func(time.Time) string { return "sweep-1" }})
				if err != nil {
					t.Fatal(err)
				}
				return e
			}
			ctx, cancel := context.WithCancel(context.Background())
			var mu sync.Mutex
			runs := 0
			h.calls.after = func(string) {
				mu.Lock()
				defer mu.Unlock()
				if runs++; runs == 3 {
					cancel() // the coordinator dies in the middle of round 1
				}
			}
			if _, err := engine().Sweep(ctx, Spec{Concurrency: 2}); !errors.Is(err, context.Canceled) {
				t.Fatalf("interrupted sweep: %v", err)
			}
			h.calls.after = nil
			before := len(h.calls.list())
			restart := clk.Now()
			fleet.mu.Lock()
			for i := 1; i <= 8; i++ {
				fleet.until[fmt.Sprintf("gpu-%04d", i)] = restart.Add(tc.away)
			}
			fleet.mu.Unlock()

			reps, err := engine().Resume(context.Background())
			if err != nil || len(reps) != 1 {
				t.Fatalf("resume: %d reports, %v", len(reps), err)
			}
			rep := reps[0]
			if rep.State != StateDone {
				t.Fatalf("state %s\n%s", rep.State, describe(rep))
			}
			if tc.back {
				if len(rep.Passed) != 8 || rep.Incomplete != "" || len(rep.Verdicts) != 0 {
					t.Fatalf("passed %v, incomplete %q\n%s", rep.Passed, rep.Incomplete, describe(rep))
				}
				if len(h.calls.list()) == before {
					t.Fatal("no test ran after the restart")
				}
				return
			}
			if len(rep.Passed) != 0 {
				t.Fatalf("passed %v with every agent away\n%s", rep.Passed, describe(rep))
			}
			if got := len(h.calls.list()) - before; got != 0 {
				t.Errorf("%d runs sent to nodes that were away", got)
			}
			for i := 1; i <= 8; i++ {
				n := fmt.Sprintf("gpu-%04d", i)
				v := verdictOf(rep, n)
				if v == nil || v.Verdict != Unreachable || !strings.Contains(v.Reason, "waited 2m0s after its turn came") {
					t.Errorf("%s verdict %+v", n, v)
				}
			}
			if !strings.HasPrefix(rep.Incomplete, "could not test: no all_reduce measured on any of the 8 selected nodes: 8 unreachable") {
				t.Errorf("incomplete %q", rep.Incomplete)
			}
			if waited := clk.Now().Sub(restart); waited < 2*time.Minute {
				t.Errorf("gave up after %v, before the 2m grace", waited)
			}
		})
	}
}
