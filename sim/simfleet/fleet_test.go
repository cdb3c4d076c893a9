package simfleet

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/checks/nccl"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

func busbw(t *testing.T, r *report.Report) float64 {
	t.Helper()
	c := r.Check(CheckAllReduce)
	if c == nil {
		t.Fatalf("no %s in report", CheckAllReduce)
	}
	v, ok := c.Metrics[nccl.MetricBusBW]
	if !ok {
		t.Fatalf("no %s: %+v", nccl.MetricBusBW, c)
	}
	return v
}

func single(t *testing.T, f *Fleet, n string) float64 {
	t.Helper()
	r, err := f.RunChecks(context.Background(), n, []string{CheckAllReduce}, kit.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return busbw(t, r)
}

func pair(t *testing.T, f *Fleet, a, b string) float64 {
	t.Helper()
	r, err := f.RunMulti(context.Background(), []string{a, b}, CheckAllReduce, kit.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return busbw(t, r)
}

func near(got, want float64) bool { return math.Abs(got-want) < 0.01 }

func TestModel(t *testing.T) {
	t.Parallel()
	f, err := New(Config{Nodes: 96, NoisePct: -1})
	if err != nil {
		t.Fatal(err)
	}
	// leaves of 32: gpu-0001..0032 leaf-01, 0033..0064 leaf-02, 0065.. leaf-03
	for _, ft := range []Fault{
		GPUSlow{Node: "gpu-0001", Factor: 0.5},
		NetworkSlow{Node: "gpu-0002", Factor: 0.6},
		PathSlow{LeafA: "leaf-02", LeafB: "leaf-03", Factor: 0.55},
	} {
		if err := f.Inject(ft); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"healthy alone", single(t, f, "gpu-0003"), 480},
		{"gpu-side alone", single(t, f, "gpu-0001"), 240},
		{"network-side alone", single(t, f, "gpu-0002"), 480},
		{"healthy pair", pair(t, f, "gpu-0003", "gpu-0040"), 450},
		{"gpu-side in a pair", pair(t, f, "gpu-0001", "gpu-0004"), 225},
		{"network-side in a pair", pair(t, f, "gpu-0005", "gpu-0002"), 270},
		{"across the bad path", pair(t, f, "gpu-0040", "gpu-0070"), 247.5},
		{"same leaf, bad path elsewhere", pair(t, f, "gpu-0070", "gpu-0071"), 450},
		{"across a good path", pair(t, f, "gpu-0010", "gpu-0070"), 450},
	} {
		if !near(c.got, c.want) {
			t.Errorf("%s: %v GB/s, want %v", c.name, c.got, c.want)
		}
	}
	if got := f.Clock().Now().Sub(t0); got != 3*time.Minute+6*90*time.Second {
		t.Errorf("simulated time %v", got)
	}
	if s := f.Stats(); s.SingleRuns != 3 || s.MultiRuns != 6 {
		t.Errorf("stats %+v", s)
	}
}

func TestNoiseDeterministicAndBounded(t *testing.T) {
	t.Parallel()
	run := func() []float64 {
		f, err := New(Config{Nodes: 64, Seed: 7})
		if err != nil {
			t.Fatal(err)
		}
		var out []float64
		for _, n := range f.Names()[:20] {
			out = append(out, single(t, f, n), single(t, f, n))
		}
		return out
	}
	a, b := run(), run()
	varied := false
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("run %d: %v then %v with the same seed", i, a[i], b[i])
		}
		if a[i] < 480*0.97-0.01 || a[i] > 480*1.03+0.01 {
			t.Fatalf("run %d: %v outside ±3 %%", i, a[i])
		}
		if a[i] != a[0] {
			varied = true
		}
	}
	if !varied {
		t.Fatal("no noise")
	}
}

func TestTransientBusyDies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, err := New(Config{Nodes: 8, NoisePct: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, ft := range []Fault{
		Transient{Node: "gpu-0001", Factor: 0.5, GPUSide: true},
		Busy{Node: "gpu-0002"},
		Dies{Node: "gpu-0003", AfterRuns: 1},
	} {
		if err := f.Inject(ft); err != nil {
			t.Fatal(err)
		}
	}
	if got := single(t, f, "gpu-0001"); !near(got, 240) {
		t.Errorf("transient first run %v", got)
	}
	if got := single(t, f, "gpu-0001"); !near(got, 480) {
		t.Errorf("transient repeat %v", got)
	}
	if _, err := f.RunChecks(ctx, "gpu-0002", []string{CheckAllReduce}, kit.RunOptions{}); !errors.Is(err, kit.ErrRefused) {
		t.Errorf("busy: %v", err)
	}
	if _, err := f.RunChecks(ctx, "gpu-0002", []string{"gpu.ecc"}, kit.RunOptions{}); err != nil {
		t.Errorf("busy node refused a passive check: %v", err)
	}
	single(t, f, "gpu-0003")
	before := f.Clock().Now()
	_, err = f.RunMulti(ctx, []string{"gpu-0004", "gpu-0003"}, CheckAllReduce, kit.RunOptions{})
	if !errors.Is(err, kit.ErrUnreachable) {
		t.Fatalf("dying node: %v", err)
	}
	if d := f.Clock().Now().Sub(before); d != 45*time.Second {
		t.Errorf("died after %v, want halfway", d)
	}
	nodes, err := f.Nodes(ctx, "name in (gpu-0002,gpu-0003,gpu-0004)")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]any{"gpu-0002": {true, "busy"}, "gpu-0003": {false, "idle"}, "gpu-0004": {true, "idle"}}
	for _, n := range nodes {
		w := want[n.Name]
		if n.Connected != w[0] || n.Activity != w[1] {
			t.Errorf("%s: connected=%v activity=%s", n.Name, n.Connected, n.Activity)
		}
	}
	if _, err := f.RunChecks(ctx, "gpu-0003", []string{CheckAllReduce}, kit.RunOptions{}); !errors.Is(err, kit.ErrUnreachable) {
		t.Errorf("dead node: %v", err)
	}
	tr := f.Truth()
	if len(tr.Dead) != 1 || len(tr.Busy) != 1 || len(tr.Transient) != 1 {
		t.Errorf("truth %+v", tr)
	}
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	f, err := New(Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.RunChecks(context.Background(), "gpu-0001", []string{CheckAllReduce}, kit.RunOptions{Timeout: 10 * time.Second})
	if !errors.Is(err, kit.ErrTimeout) {
		t.Fatalf("err = %v", err)
	}
	if d := f.Clock().Now().Sub(t0); d != 10*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestLabelsAndSelector(t *testing.T) {
	t.Parallel()
	f, err := New(Config{Nodes: 70, NodesPerLeaf: 32, NodesPerRack: 4})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := f.Nodes(context.Background(), "leaf=leaf-03")
	if err != nil {
		t.Fatal(err)
	}
	if len(ns) != 6 || ns[0].Name != "gpu-0065" || ns[0].Labels["rack"] != "rack-017" || ns[0].Labels["sku"] != "h100" {
		t.Fatalf("got %d nodes, first %+v", len(ns), ns[0])
	}
	if _, err := f.Nodes(context.Background(), "leaf in ("); err == nil {
		t.Fatal("bad selector accepted")
	}
}

func TestScenario(t *testing.T) {
	t.Parallel()
	f, err := New(Config{Nodes: 1024, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := f.InjectScenario(Scenario{BadNodeShare: 0.01, SlowerMin: 0.35, SlowerMax: 0.60, BadPaths: 1, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.GPUSide) != 5 || len(tr.NetworkSide) != 5 || len(tr.Paths) != 1 {
		t.Fatalf("truth %+v", tr)
	}
}

// Render sends a single-node run through sim.Node and the real parser.
func TestRenderThroughParser(t *testing.T) {
	t.Parallel()
	f, err := New(Config{Nodes: 2, Render: true, NoisePct: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Inject(GPUSlow{Node: "gpu-0002", Factor: 0.5}); err != nil {
		t.Fatal(err)
	}
	r, err := f.RunChecks(context.Background(), "gpu-0002", []string{CheckAllReduce, "gpu.ecc"}, kit.RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := busbw(t, r); math.Abs(got-240) > 1 {
		t.Fatalf("rendered busbw %v, want ~240", got)
	}
	if c := r.Check("gpu.ecc"); c == nil || c.Status != report.Pass {
		t.Fatalf("gpu.ecc: %+v", c)
	}
	if r.Node != "gpu-0002" {
		t.Fatalf("node %q", r.Node)
	}
}
