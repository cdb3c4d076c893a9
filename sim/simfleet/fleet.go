// Package simfleet is an in-process simulated GPU fleet that implements
// kit.Fleet on a virtual clock, so campaigns (the sweep first) run
// against a thousand nodes in wall seconds, deterministically per seed.
//
// The model is the part of a fleet that all_reduce bandwidth sees:
//
//   - every node has an intra-node bus bandwidth (default 480 GB/s, 8×H100
//     over NVLink) and a network side (8×400G InfiniBand);
//   - nodes sit on leaf switches (label leaf=, NodesPerLeaf per leaf) and in
//     racks (label rack=);
//   - a pair's 2-node bus bandwidth is InterGBps (default 450 GB/s) times the
//     smallest factor among both nodes' GPU and network sides and, when the
//     pair crosses leaves, the leaf-to-leaf path between them;
//   - every measurement carries uniform noise of ±NoisePct (default 3 %)
//     drawn from the seed, the node or pair and its run number, so results
//     do not depend on the order goroutines run in;
//   - a single-node run takes SingleRun (60 s) and a 2-node run PairRun
//     (90 s) of simulated time.
//
// Faults (see faults.go): GPU-side and network-side degraded nodes, a
// degraded leaf-to-leaf path, transient slowness, a node dying mid-sweep,
// a busy node whose agent refuses disruptive checks.
//
// Reports: RunChecks and RunMulti return a report whose nccl.allreduce check
// carries nccl.allreduce.busbw_gbps at 8 GiB, built directly from the model
// (for a thousand nodes rendering and parsing nccl-tests text would be the
// simulator's whole cost). With Config.Render, single-node runs instead go
// through sim.Node and the real all_reduce_perf parser and checks, and so do
// passive checks asked for by name; 2-node runs stay direct because the
// single-node simulator has no multi-node output.
package simfleet

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/checks/nccl"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/selector"
)

// CheckAllReduce is the check the model measures.
const CheckAllReduce = "nccl.allreduce"

// allReduceBytes is the largest message size, all_reduce_perf -e 8G.
const allReduceBytes = 8 << 30

// Config shapes a simulated fleet. Zero fields take the defaults.
type Config struct {
	Nodes        int    // default 16
	NodesPerLeaf int    // default 32
	NodesPerRack int    // default 4
	NamePrefix   string // default "gpu-"
	SKU          string // the sku label, default "h100"
	// Kernel and VBIOS, when set, complete the nodes' inventory so that a
	// compatibility matrix with kernel and VBIOS rules (examples/matrix.yaml)
	// can judge them; unset, the matrix finds them unknown.
	Kernel, VBIOS string
	// IntraGBps is a healthy node's single-node busbw; InterGBps a healthy
	// pair's 2-node busbw.
	IntraGBps float64 // default 480
	InterGBps float64 // default 450
	// NoisePct is the half-width of the uniform measurement noise, in
	// percent. Negative means none.
	NoisePct float64 // default 3
	// SingleRun and PairRun are the simulated durations of a run.
	SingleRun time.Duration // default 60s
	PairRun   time.Duration // default 90s
	// Start is the clock's reading at New.
	Start time.Time // default 2026-03-02T02:00:00Z
	Seed  uint64
	// Render sends single-node runs and passive checks through sim.Node and
	// the real parsers and checks (small fleets, demos).
	Render bool
}

func (c *Config) defaults() {
	if c.Nodes == 0 {
		c.Nodes = 16
	}
	if c.NodesPerLeaf == 0 {
		c.NodesPerLeaf = 32
	}
	if c.NodesPerRack == 0 {
		c.NodesPerRack = 4
	}
	if c.NamePrefix == "" {
		c.NamePrefix = "gpu-"
	}
	if c.SKU == "" {
		c.SKU = "h100"
	}
	if c.IntraGBps == 0 {
		c.IntraGBps = 480
	}
	if c.InterGBps == 0 {
		c.InterGBps = 450
	}
	switch {
	case c.NoisePct == 0:
		c.NoisePct = 3
	case c.NoisePct < 0:
		c.NoisePct = 0
	}
	if c.SingleRun == 0 {
		c.SingleRun = 60 * time.Second
	}
	if c.PairRun == 0 {
		c.PairRun = 90 * time.Second
	}
	if c.Start.IsZero() {
		c.Start = time.Date(2026, 3, 2, 2, 0, 0, 0, time.UTC)
	}
}

// Fleet is a simulated fleet. It is safe for concurrent use.
type Fleet struct {
	cfg    Config
	clock  *Clock
	render *renderer // nil unless Config.Render

	mu       sync.Mutex
	order    []*node
	byName   map[string]*node
	leaves   map[string]bool
	paths    map[[2]string]float64
	pairRuns map[string]int

	singles, multis, refused, unreachable atomic.Int64
}

var _ kit.Fleet = (*Fleet)(nil)

type node struct {
	name   string
	labels map[string]string
	leaf   string

	gpu, net float64 // factors; 1 is healthy

	transient     float64
	transientRuns int
	transientGPU  bool
	transientSet  bool

	diesAfter int // run count after which it dies; -1 never
	dead      bool
	busy      bool

	runs       int // all_reduce runs it took part in
	singleRuns int
}

// New builds a healthy fleet.
func New(cfg Config) (*Fleet, error) {
	cfg.defaults()
	if cfg.Nodes < 0 || cfg.NodesPerLeaf < 1 || cfg.NodesPerRack < 1 {
		return nil, fmt.Errorf("simfleet: bad shape: %d nodes, %d per leaf, %d per rack", cfg.Nodes, cfg.NodesPerLeaf, cfg.NodesPerRack)
	}
	if !(cfg.IntraGBps > 0) || !(cfg.InterGBps > 0) {
		return nil, fmt.Errorf("simfleet: bandwidths must be positive, got %v and %v", cfg.IntraGBps, cfg.InterGBps)
	}
	f := &Fleet{
		cfg:      cfg,
		clock:    NewClock(cfg.Start),
		byName:   make(map[string]*node, cfg.Nodes),
		leaves:   map[string]bool{},
		paths:    map[[2]string]float64{},
		pairRuns: map[string]int{},
	}
	width := len(fmt.Sprint(cfg.Nodes))
	width = max(width, 4)
	leafWidth := max(len(fmt.Sprint((cfg.Nodes+cfg.NodesPerLeaf-1)/cfg.NodesPerLeaf)), 2)
	rackWidth := max(len(fmt.Sprint((cfg.Nodes+cfg.NodesPerRack-1)/cfg.NodesPerRack)), 3)
	for i := range cfg.Nodes {
		name := fmt.Sprintf("%s%0*d", cfg.NamePrefix, width, i+1)
		leaf := fmt.Sprintf("leaf-%0*d", leafWidth, i/cfg.NodesPerLeaf+1)
		n := &node{
			name: name,
			leaf: leaf,
			labels: map[string]string{
				"sku":  cfg.SKU,
				"leaf": leaf,
				"rack": fmt.Sprintf("rack-%0*d", rackWidth, i/cfg.NodesPerRack+1),
			},
			gpu: 1, net: 1, diesAfter: -1,
		}
		f.order = append(f.order, n)
		f.byName[name] = n
		f.leaves[leaf] = true
	}
	if cfg.Render {
		f.render = newRenderer(cfg, f.clock)
	}
	return f, nil
}

// Clock is the fleet's virtual clock.
func (f *Fleet) Clock() *Clock { return f.clock }

// Config is the fleet's configuration with defaults filled in.
func (f *Fleet) Config() Config { return f.cfg }

// Inject adds a fault. A fault of the same kind on the same node or path
// replaces the earlier one.
func (f *Fleet) Inject(ft Fault) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return ft.apply(f)
}

func (f *Fleet) nodeFor(name string) (*node, error) {
	n, ok := f.byName[name]
	if !ok {
		return nil, fmt.Errorf("%w: no node %q", ErrBadFault, name)
	}
	return n, nil
}

// Names lists the nodes in name order.
func (f *Fleet) Names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.order))
	for i, n := range f.order {
		out[i] = n.name
	}
	return out
}

// Leaves lists the leaf switches in name order.
func (f *Fleet) Leaves() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.leaves))
	for l := range f.leaves {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}

// Leaf is the node's leaf switch ("" for an unknown node).
func (f *Fleet) Leaf(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n, ok := f.byName[name]; ok {
		return n.leaf
	}
	return ""
}

// Stats counts what the fleet was asked to do.
type Stats struct {
	SingleRuns  int64 // single-node all_reduce runs started
	MultiRuns   int64 // multi-node all_reduce runs started
	Refused     int64 // requests a busy agent refused
	Unreachable int64 // requests that found a node gone
}

// Stats returns the counters so far.
func (f *Fleet) Stats() Stats {
	return Stats{
		SingleRuns:  f.singles.Load(),
		MultiRuns:   f.multis.Load(),
		Refused:     f.refused.Load(),
		Unreachable: f.unreachable.Load(),
	}
}

// Nodes lists nodes matching a label selector ("" = all), in name order.
func (f *Fleet) Nodes(ctx context.Context, sel string) ([]kit.Node, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s, err := selector.Parse(sel)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []kit.Node
	for _, n := range f.order {
		if !s.Matches(n.name, n.labels) {
			continue
		}
		cn := kit.Node{
			Name:      n.name,
			Labels:    mapsClone(n.labels),
			State:     "healthy",
			Activity:  "idle",
			Connected: !n.dead,
			Inventory: f.inventory(),
		}
		if n.busy {
			cn.Activity = "busy"
		}
		if n.dead {
			cn.State = "unreachable"
		}
		out = append(out, cn)
	}
	return out, nil
}

// inventory is an 8×H100 SXM node with eight NDR 400 InfiniBand ports,
// so baselines.SKUFromInventory names it h100-sxm-80g-x8-nvlink-ib400x8,
// the SKU of the shipped reference baselines.
func (f *Fleet) inventory() report.Inventory {
	inv := report.Inventory{DriverVersion: "535.161.08", CUDAVersion: "12.2", RDMAStack: "MLNX_OFED 23.10-1.1.9.0",
		Kernel: f.cfg.Kernel}
	for i := range 8 {
		inv.GPUs = append(inv.GPUs, report.GPU{Index: i, Name: "NVIDIA H100 80GB HBM3", MemoryTotalMiB: 81559,
			VBIOSVersion: f.cfg.VBIOS})
		inv.HCAs = append(inv.HCAs, report.HCA{Name: fmt.Sprintf("mlx5_%d", i), Model: "MT4129", FWVersion: "28.39.1002",
			Ports: []report.Port{{Port: 1, State: "ACTIVE", PhysState: "LinkUp", RateGbps: 400, LinkLayer: "InfiniBand"}}})
	}
	return inv
}

func mapsClone(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// RunChecks runs checks on one node. nccl.allreduce is the single-node
// all_reduce of the model; other checks are skipped unless Config.Render.
func (f *Fleet) RunChecks(ctx context.Context, name string, names []string, opts kit.RunOptions) (*report.Report, error) {
	disruptive := slices.Contains(names, CheckAllReduce) || slices.Contains(names, "dcgm.diag")
	f.mu.Lock()
	n, err := f.admitLocked([]string{name}, disruptive)
	if err != nil {
		f.mu.Unlock()
		return nil, err
	}
	var bw float64
	dies := false
	if slices.Contains(names, CheckAllReduce) {
		f.singles.Add(1)
		nd := n[0]
		dies = f.startRunLocked(nd)
		factor := nd.gpu
		if nd.transientRuns > 0 && nd.transientGPU {
			factor = math.Min(factor, nd.transient)
			nd.transientRuns--
		}
		bw = f.cfg.IntraGBps * factor * f.noise("single", nd.name, nd.singleRuns)
		nd.singleRuns++
	}
	f.mu.Unlock()

	dur := time.Duration(0)
	if slices.Contains(names, CheckAllReduce) {
		dur = f.cfg.SingleRun
	}
	if err := f.wait(ctx, []string{name}, dur, dies, opts); err != nil {
		return nil, err
	}

	if f.render != nil {
		r, err := f.render.run(ctx, name, names, bw)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
		return r, nil
	}
	return f.directReport(name, names, bw), nil
}

// RunMulti runs a multi-node all_reduce across nodes; nodes[0] launches.
func (f *Fleet) RunMulti(ctx context.Context, names []string, check string, opts kit.RunOptions) (*report.Report, error) {
	if check != CheckAllReduce {
		return nil, fmt.Errorf("run %s across %d nodes: only %s runs across nodes", check, len(names), CheckAllReduce)
	}
	if len(names) < 2 {
		return nil, fmt.Errorf("run %s: %d nodes given, a multi-node run needs at least two", check, len(names))
	}
	seen := map[string]bool{}
	for _, nm := range names {
		if seen[nm] {
			return nil, fmt.Errorf("run %s: node %s named twice", check, nm)
		}
		seen[nm] = true
	}
	f.mu.Lock()
	ns, err := f.admitLocked(names, true)
	if err != nil {
		f.mu.Unlock()
		return nil, err
	}
	f.multis.Add(1)
	factor := 1.0
	dies := false
	for _, n := range ns {
		dies = f.startRunLocked(n) || dies
		factor = math.Min(factor, math.Min(n.gpu, n.net))
		if n.transientRuns > 0 {
			factor = math.Min(factor, n.transient)
			n.transientRuns--
		}
	}
	for i := range ns {
		for j := i + 1; j < len(ns); j++ {
			if ns[i].leaf != ns[j].leaf {
				if p, ok := f.paths[pathKey(ns[i].leaf, ns[j].leaf)]; ok {
					factor = math.Min(factor, p)
				}
			}
		}
	}
	key := pairName(names)
	run := f.pairRuns[key]
	f.pairRuns[key] = run + 1
	bw := f.cfg.InterGBps * factor * f.noise("multi", key, run)
	f.mu.Unlock()

	if err := f.wait(ctx, names, f.cfg.PairRun, dies, opts); err != nil {
		return nil, err
	}
	return f.directReport(names[0], []string{CheckAllReduce}, bw), nil
}

// RunAction refuses every action: the simulated agents configure none.
func (f *Fleet) RunAction(ctx context.Context, name, action string, _ map[string]string, _ kit.RunOptions) (kit.ActionResult, error) {
	if err := ctx.Err(); err != nil {
		return kit.ActionResult{}, err
	}
	return kit.ActionResult{}, fmt.Errorf("node %s: action %q is not in the agent's config: %w", name, action, kit.ErrRefused)
}

// admitLocked finds the nodes and refuses the run as their agents would.
func (f *Fleet) admitLocked(names []string, disruptive bool) ([]*node, error) {
	out := make([]*node, 0, len(names))
	for _, nm := range names {
		n, ok := f.byName[nm]
		if !ok || n.dead {
			f.unreachable.Add(1)
			return nil, fmt.Errorf("node %s: %w", nm, kit.ErrUnreachable)
		}
		if disruptive && n.busy {
			f.refused.Add(1)
			return nil, fmt.Errorf("node %s is busy, disruptive checks need it idle or drained: %w", nm, kit.ErrRefused)
		}
		out = append(out, n)
	}
	return out, nil
}

// startRunLocked counts a run on the node and says whether the node dies
// during it.
func (f *Fleet) startRunLocked(n *node) bool {
	n.runs++
	return n.diesAfter >= 0 && n.runs > n.diesAfter
}

// wait lets the run's simulated time pass. A node that dies does so
// halfway through; a timeout shorter than the run ends it early.
func (f *Fleet) wait(ctx context.Context, names []string, dur time.Duration, dies bool, opts kit.RunOptions) error {
	if dies {
		if err := f.clock.Sleep(ctx, dur/2); err != nil {
			return err
		}
		f.mu.Lock()
		var gone string
		for _, nm := range names {
			if n := f.byName[nm]; n.diesAfter >= 0 && n.runs > n.diesAfter {
				n.dead = true
				if gone == "" {
					gone = nm
				}
			}
		}
		f.mu.Unlock()
		f.unreachable.Add(1)
		return fmt.Errorf("node %s disconnected during the run: %w", gone, kit.ErrUnreachable)
	}
	if opts.Timeout > 0 && opts.Timeout < dur {
		if err := f.clock.Sleep(ctx, opts.Timeout); err != nil {
			return err
		}
		return fmt.Errorf("run on %s after %s: %w", pairName(names), opts.Timeout, kit.ErrTimeout)
	}
	return f.clock.Sleep(ctx, dur)
}

// noise is 1 ± NoisePct/100, uniform, from the seed, what was measured
// and its run number.
func (f *Fleet) noise(kind, key string, run int) float64 {
	if f.cfg.NoisePct <= 0 {
		return 1
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%d\x00%s\x00%s\x00%d", f.cfg.Seed, kind, key, run)
	u := float64(mix64(h.Sum64())>>11) / float64(1<<53)
	return 1 + f.cfg.NoisePct/100*(2*u-1)
}

// mix64 is splitmix64's finalizer: FNV's low bits alone are weak.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// pairName names a set of nodes independent of order.
func pairName(names []string) string {
	s := slices.Clone(names)
	sort.Strings(s)
	out := s[0]
	for _, n := range s[1:] {
		out += "|" + n
	}
	return out
}

// directReport builds the report an agent would send, from the model.
func (f *Fleet) directReport(name string, names []string, bw float64) *report.Report {
	r := &report.Report{
		Node:        name,
		CollectedAt: f.clock.Now().UTC().Format(time.RFC3339),
	}
	for _, c := range names {
		cr := report.CheckResult{Name: c, Findings: []report.Finding{}}
		if c == CheckAllReduce {
			cr.Status = report.Pass
			cr.Metrics = map[string]float64{
				nccl.MetricBusBW: math.Round(bw*100) / 100, // nccl-tests prints two decimals
				nccl.MetricSize:  allReduceBytes,
			}
		} else {
			cr.Status = report.Skip
			cr.Reason = "simfleet models only " + CheckAllReduce + " (Config.Render runs the others)"
		}
		r.Checks = append(r.Checks, cr)
	}
	r.Summarize()
	return r
}
