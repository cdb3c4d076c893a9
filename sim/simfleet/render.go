package simfleet

import (
	"context"
	"fmt"
	"sync"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	"github.com/fleetcheck/fleetcheck/node/inspect"
)

// renderer runs checks through sim.Node: the node prints all_reduce_perf
// text at the modelled bandwidth and the real parser and check read it.
type renderer struct {
	cfg    Config
	clock  *Clock
	shared *sim.Shared

	mu    sync.Mutex
	nodes map[string]*renderNode
}

type renderNode struct {
	mu sync.Mutex // one inspection at a time: the slowdown is set per run
	n  *sim.Node
}

func newRenderer(cfg Config, clock *Clock) *renderer {
	return &renderer{cfg: cfg, clock: clock, shared: sim.NewShared(), nodes: map[string]*renderNode{}}
}

func (r *renderer) node(name string) (*renderNode, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rn, ok := r.nodes[name]; ok {
		return rn, nil
	}
	spec := sim.DefaultSpec(name)
	spec.Seed = r.cfg.Seed
	spec.Clock = r.clock
	spec.Shared = r.shared
	spec.Labels = map[string]string{"sku": r.cfg.SKU}
	spec.BusBWGBps = r.cfg.IntraGBps
	spec.DCGMDiag = true // burn-in suites run dcgm.diag
	// The fleet draws the noise; the node prints what it is given.
	spec.NoisePct = 0
	n, err := sim.New(spec)
	if err != nil {
		return nil, fmt.Errorf("simulate node %s: %w", name, err)
	}
	rn := &renderNode{n: n}
	r.nodes[name] = rn
	return rn, nil
}

// run inspects the simulated node with the named checks; bw is the
// single-node busbw to render when nccl.allreduce is among them.
func (r *renderer) run(ctx context.Context, name string, names []string, bw float64) (*report.Report, error) {
	list, err := checks.Select(registry.All(), names, true)
	if err != nil {
		return nil, fmt.Errorf("select checks: %w", err)
	}
	rn, err := r.node(name)
	if err != nil {
		return nil, err
	}
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if bw > 0 {
		if err := rn.n.AddFault(sim.SlowNode{Factor: bw / r.cfg.IntraGBps}); err != nil {
			return nil, fmt.Errorf("model bandwidth: %w", err)
		}
	}
	res := inspect.Run(ctx, rn.n, inspect.Options{Checks: list})
	rep := res.Report
	return &rep, nil
}
