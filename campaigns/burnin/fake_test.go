package burnin

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// fakeNode is one scripted node.
type fakeNode struct {
	name   string
	labels map[string]string
	busbw  float64 // single-node busbw at the largest size
	net    float64 // factor on every pair it joins
	// fail makes a check fail with this finding.
	fail map[string]report.Finding
	// serials overrides GPU serials by index.
	serials     map[int]string
	unreachable bool
	tempC       float64
	// blank: the agent sees no GPU and every GPU and IB check skips (a
	// node whose driver is not loaded, say).
	blank bool
	// awayUntil: the agent is not connected before then (reconnecting
	// after a coordinator restart).
	awayUntil time.Time
}

// bounded refuses what the coordinator refuses: a run timeout outside
// its bounds (fleetTimeout in coordinator/fleet.go).
func bounded(opts kit.RunOptions) error {
	if t := opts.Timeout; t != 0 && (t < kit.MinRunTimeout || t > kit.MaxRunTimeout) {
		return fmt.Errorf("timeout %s: must be between %s and %s", t, kit.MinRunTimeout, kit.MaxRunTimeout)
	}
	return nil
}

func (f *fakeFleet) connectedLocked(n *fakeNode) bool {
	return !n.unreachable && !f.clock.Now().Before(n.awayUntil)
}

// fakeFleet is a kit.Fleet over scripted nodes. Every call is
// counted, so tests can tell what ran how often.
type fakeFleet struct {
	clock *simfleet.Clock

	mu    sync.Mutex
	nodes map[string]*fakeNode
	order []string
	calls map[string]int // "node|what" → count
	// actionIDs are the ids RunAction was given, by "node|action".
	actionIDs map[string][]string
	// block, when set, is called before a call returns (tests stop the
	// engine mid-run with it).
	block func(ctx context.Context, node, what string) error
}

var _ kit.Fleet = (*fakeFleet)(nil)

func newFakeFleet(n int) *fakeFleet {
	f := &fakeFleet{clock: simfleet.NewClock(time.Date(2026, 5, 4, 8, 0, 0, 0, time.UTC)), nodes: map[string]*fakeNode{}, calls: map[string]int{}}
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("gpu-%03d", i)
		// Deterministic spread of ±1 % around 480.
		bw := 480 * (1 + 0.01*float64(i%5-2)/2)
		f.nodes[name] = &fakeNode{name: name, labels: map[string]string{"rack": "r1", "batch": "new"}, busbw: bw, net: 1, fail: map[string]report.Finding{}, tempC: 70 + float64(i%4)}
		f.order = append(f.order, name)
	}
	return f
}

func (f *fakeFleet) node(name string) *fakeNode {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodes[name]
}

func (f *fakeFleet) count(node, what string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[node+"|"+what]
}

func (f *fakeFleet) inventory(n *fakeNode) report.Inventory {
	inv := report.Inventory{DriverVersion: "535.161.08", CUDAVersion: "12.2", RDMAStack: "MLNX_OFED 23.10"}
	for i := range 8 {
		serial := fmt.Sprintf("SN-%s-%d", n.name, i)
		if s, ok := n.serials[i]; ok {
			serial = s
		}
		inv.GPUs = append(inv.GPUs, report.GPU{Index: i, Name: "NVIDIA H100 80GB HBM3", Serial: serial,
			UUID: "GPU-" + serial, PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x19+i*0x10), MemoryTotalMiB: 81559})
	}
	for i := range 8 {
		inv.HCAs = append(inv.HCAs, report.HCA{Name: fmt.Sprintf("mlx5_%d", i), Model: "MT4129", FWVersion: "28.39.1002",
			Ports: []report.Port{{Port: 1, State: "ACTIVE", PhysState: "LinkUp", RateGbps: 400, LinkLayer: "InfiniBand"}}})
	}
	return inv
}

func (f *fakeFleet) Nodes(_ context.Context, sel string) ([]kit.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []kit.Node
	for _, name := range f.order {
		n := f.nodes[name]
		if sel != "" && !matchSel(sel, n) {
			continue
		}
		out = append(out, kit.Node{Name: n.name, Labels: n.labels, State: "healthy", Activity: "idle", Connected: f.connectedLocked(n), Inventory: f.inventory(n)})
	}
	return out, nil
}

// matchSel understands the "k=v" and "name in (a,b)" forms the tests use.
func matchSel(sel string, n *fakeNode) bool {
	if one, ok := strings.CutPrefix(sel, "name="); ok {
		return n.name == one
	}
	if rest, ok := strings.CutPrefix(sel, "name in ("); ok {
		return slices.Contains(strings.Split(strings.TrimSuffix(rest, ")"), ","), n.name)
	}
	k, v, _ := strings.Cut(sel, "=")
	return n.labels[k] == v
}

func (f *fakeFleet) record(ctx context.Context, node, what string) (*fakeNode, error) {
	f.mu.Lock()
	f.calls[node+"|"+what]++
	n := f.nodes[node]
	block := f.block
	away := n != nil && !f.connectedLocked(n)
	f.mu.Unlock()
	if n == nil || away {
		return nil, fmt.Errorf("node %s: %w", node, kit.ErrUnreachable)
	}
	if block != nil {
		if err := block(ctx, node, what); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (f *fakeFleet) RunChecks(ctx context.Context, node string, checks []string, opts kit.RunOptions) (*report.Report, error) {
	what := strings.Join(checks, ",")
	if len(checks) > 3 {
		what = "passive"
	}
	if lvl := opts.Params["level"]; lvl != "" {
		what += ":" + lvl
	}
	if err := bounded(opts); err != nil {
		return nil, fmt.Errorf("run %s on %s: %w", what, node, err)
	}
	n, err := f.record(ctx, node, what)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	runNo := f.calls[node+"|"+what]
	f.mu.Unlock()
	rep := &report.Report{Node: node, CollectedAt: f.clock.Now().UTC().Format(time.RFC3339), Inventory: f.inventory(n)}
	if n.blank {
		rep.Inventory.GPUs, rep.Inventory.HCAs = nil, nil
	}
	for _, c := range checks {
		cr := report.CheckResult{Name: c, Status: report.Pass, Findings: []report.Finding{}}
		if n.blank && (strings.HasPrefix(c, "gpu.") || strings.HasPrefix(c, "ib.")) {
			cr.Status, cr.Reason = report.Skip, "no GPU or HCA seen"
			rep.Checks = append(rep.Checks, cr)
			continue
		}
		switch c {
		case "nccl.allreduce":
			// Repeats differ a little, as real runs do.
			cr.Metrics = map[string]float64{MetricBusBW: n.busbw * (1 + 0.002*float64(runNo%3-1))}
		case "gpu.thermal":
			cr.Metrics = map[string]float64{}
			for g := range 8 {
				cr.Metrics[fmt.Sprintf("gpu%d.temperature_c", g)] = n.tempC + float64(g)
			}
		}
		if fd, ok := n.fail[c]; ok {
			cr.Status = report.Status(fd.Severity)
			cr.Findings = append(cr.Findings, fd)
		}
		rep.Checks = append(rep.Checks, cr)
	}
	rep.Summarize()
	return rep, nil
}

func (f *fakeFleet) RunMulti(ctx context.Context, nodes []string, check string, opts kit.RunOptions) (*report.Report, error) {
	if err := bounded(opts); err != nil {
		return nil, fmt.Errorf("run %s on %v: %w", check, nodes, err)
	}
	factor := 1.0
	for _, name := range nodes {
		n, err := f.record(ctx, name, "multi")
		if err != nil {
			return nil, err
		}
		factor = min(factor, n.net)
	}
	if err := f.clock.Sleep(ctx, 90*time.Second); err != nil {
		return nil, err
	}
	rep := &report.Report{Node: nodes[0], Checks: []report.CheckResult{{Name: check, Status: report.Pass, Findings: []report.Finding{},
		Metrics: map[string]float64{MetricBusBW: 450 * factor}}}}
	rep.Summarize()
	return rep, nil
}

func (f *fakeFleet) RunAction(ctx context.Context, node, action string, params map[string]string, opts kit.RunOptions) (kit.ActionResult, error) {
	if err := bounded(opts); err != nil {
		return kit.ActionResult{}, fmt.Errorf("action %s on %s: %w", action, node, err)
	}
	f.mu.Lock()
	if f.actionIDs == nil {
		f.actionIDs = map[string][]string{}
	}
	f.actionIDs[node+"|"+action] = append(f.actionIDs[node+"|"+action], opts.ID)
	f.mu.Unlock()
	if _, err := f.record(ctx, node, "action:"+action); err != nil {
		return kit.ActionResult{}, err
	}
	switch action {
	case ActionPCIeBandwidth:
		return kit.ActionResult{OK: true, Message: "nvbandwidth done",
			Output: "host_to_device_memcpy_ce\nmetric pcie.h2d_bandwidth_gbps 55.1\nmetric pcie.d2h_bandwidth_gbps 54.8\n"}, nil
	case ActionGPUStress:
		d, err := time.ParseDuration(params["duration"])
		if err != nil {
			return kit.ActionResult{}, fmt.Errorf("bad duration: %w", err)
		}
		if err := f.clock.Sleep(ctx, d); err != nil {
			return kit.ActionResult{}, err
		}
		return kit.ActionResult{OK: true, Message: "gpu-burn: 0 errors"}, nil
	}
	return kit.ActionResult{}, fmt.Errorf("action %s: %w", action, kit.ErrRefused)
}

// harness is an engine over a fake fleet and a fresh database.
type harness struct {
	t     *testing.T
	db    *sqldb.DB
	path  string
	fleet *fakeFleet
	drain *drain.None
	base  *baselines.Store
	eng   *Engine
}

func openDB(t *testing.T, path string) *sqldb.DB { return dbtest.OpenSQLite(t, path) }

func TestMain(m *testing.M) { pgtest.Main(m) }

func newHarness(t *testing.T, nodes int) *harness {
	t.Helper()
	return newHarnessOn(t, nodes, nil)
}

// newHarnessOn is newHarness on db (nil: a SQLite file of the test's).
func newHarnessOn(t *testing.T, nodes int, db *sqldb.DB) *harness {
	t.Helper()
	h := &harness{t: t, path: filepath.Join(t.TempDir(), "fc.db"), fleet: newFakeFleet(nodes), drain: drain.NewNone(nil), db: db}
	if h.db == nil {
		h.db = openDB(t, h.path)
	}
	var err error
	h.base, err = baselines.NewSQLStore(h.db, baselines.WithClock(h.fleet.clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	h.eng = h.newEngine(nil)
	return h
}

func (h *harness) newEngine(br *kit.Breaker) *Engine {
	h.t.Helper()
	e, err := New(context.Background(), kit.Deps{DB: h.db, Fleet: h.fleet, Drainer: h.drain, Breaker: br, Clock: h.fleet.clock, Logger: zerolog.New(io.Discard)},
		Options{Baselines: h.base, Poll: time.Second})
	if err != nil {
		h.t.Fatal(err)
	}
	return e
}

// setSKUBaselines stores the references the default suites compare with.
func (h *harness) setSKUBaselines() {
	h.t.Helper()
	ctx := context.Background()
	for _, b := range []struct {
		metric, sku string
		v           float64
	}{
		{MetricBusBW, "h100-sxm-80g-x8-nvlink", 480},
		{MetricPairBusBW, "h100-sxm-80g-x8-nvlink-ib400x8", 450},
	} {
		st, err := baselines.NewStats([]float64{b.v})
		if err != nil {
			h.t.Fatal(err)
		}
		if _, err := h.base.Set(ctx, baselines.Baseline{Key: baselines.Key{Metric: b.metric, Scope: baselines.SKUScope(b.sku),
			Stack: baselines.Stack{Driver: "535.161.08"}}, Direction: baselines.HigherBetter, Samples: st}); err != nil {
			h.t.Fatal(err)
		}
	}
}

func (h *harness) start(yaml string) string {
	h.t.Helper()
	spec, err := ParseSpec([]byte(yaml))
	if err != nil {
		h.t.Fatal(err)
	}
	id, err := h.eng.Start(context.Background(), spec)
	if err != nil {
		h.t.Fatal(err)
	}
	return id
}

// finish steps the engine until no campaign runs.
func (h *harness) finish(e *Engine) {
	h.t.Helper()
	ctx := context.Background()
	for i := 0; i < 10000; i++ {
		done, err := e.Done(ctx)
		if err != nil {
			h.t.Fatal(err)
		}
		if done {
			return
		}
		moved, err := e.Step(ctx)
		if err != nil {
			h.t.Fatal(err)
		}
		if !moved {
			h.fleet.clock.Advance(time.Second)
		}
	}
	h.t.Fatal("campaign did not finish")
}

func (h *harness) report(id string) *Report {
	h.t.Helper()
	r, err := h.eng.Report(context.Background(), id)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

func nodeOf(t *testing.T, r *Report, name string) NodeReport {
	t.Helper()
	for _, n := range r.Nodes {
		if n.Node == name {
			return n
		}
	}
	t.Fatalf("node %s not in report", name)
	return NodeReport{}
}

func hasReason(n NodeReport, code string) bool {
	for _, r := range n.Evidence.Reasons {
		if r.Code == code {
			return true
		}
	}
	return false
}
