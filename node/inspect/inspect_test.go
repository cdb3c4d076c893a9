package inspect

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
)

const examples = "../../examples/bundles"

func loadExampleConfig(t testing.TB) *config.Config {
	t.Helper()
	cfg, err := config.Load("../../examples/node-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func analyze(t testing.TB, name string, cfg *config.Config) Result {
	t.Helper()
	b, err := bundle.Open(filepath.Join(examples, name))
	if err != nil {
		t.Fatal(err)
	}
	list, err := checks.Select(registry.All(), nil, true)
	if err != nil {
		t.Fatal(err)
	}
	return Run(context.Background(), b, Options{Config: cfg, Checks: list})
}

// TestExampleBundlesGolden pins the whole report of each example bundle.
// Refresh with UPDATE_GOLDEN=1 after a deliberate change, and read the diff.
func TestExampleBundlesGolden(t *testing.T) {
	t.Parallel()
	cfg := loadExampleConfig(t)
	for _, name := range []string{"h100-healthy", "h100-xid79-ecc", "h100-ibdown-pcie"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			res := analyze(t, name, cfg)
			for i := range res.Report.Checks {
				res.Report.Checks[i].DurationMS = 0
			}
			var buf bytes.Buffer
			if err := report.WriteJSON(&buf, res.Report); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", name+".golden.json")
			if os.Getenv("UPDATE_GOLDEN") != "" {
				if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with UPDATE_GOLDEN=1 to create)", err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Errorf("report differs from %s; got:\n%s", golden, buf.String())
			}
		})
	}
}

// TestExampleBundlesVerdicts states what each bundle must show, independent
// of the golden files' wording.
func TestExampleBundlesVerdicts(t *testing.T) {
	t.Parallel()
	cfg := loadExampleConfig(t)
	type want struct {
		check, status, code, component string
	}
	cases := map[string]struct {
		node  report.Status
		wants []want
	}{
		"h100-healthy": {node: report.Pass},
		"h100-xid79-ecc": {node: report.Fail, wants: []want{
			{"gpu.inventory", "fail", "GPU_MISSING_FROM_DRIVER", ""},
			{"gpu.xid", "fail", "", "GPU3"},
			{"gpu.ecc", "fail", "ECC_UNCORRECTABLE", "GPU3"},
		}},
		"h100-ibdown-pcie": {node: report.Fail, wants: []want{
			{"ib.ports", "fail", "IB_PORT_DOWN", "mlx5_4/1"},
			{"gpu.pcie", "fail", "PCIE_WIDTH_DEGRADED", "GPU2"},
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := analyze(t, name, cfg).Report
			if r.Status != tc.node {
				t.Errorf("node status %s, want %s", r.Status, tc.node)
			}
			if tc.node == report.Pass {
				for _, c := range r.Checks {
					if c.Status == report.Fail || c.Status == report.Error {
						t.Errorf("healthy bundle: %s is %s (%s %v)", c.Name, c.Status, c.Reason, c.Findings)
					}
				}
			}
			for _, w := range tc.wants {
				c := r.Check(w.check)
				if c == nil {
					t.Fatalf("no %s in report", w.check)
				}
				if string(c.Status) != w.status {
					t.Errorf("%s status %s, want %s (%s)", w.check, c.Status, w.status, c.Reason)
				}
				found := false
				for _, f := range c.Findings {
					if (w.code == "" || f.Code == w.code) && (w.component == "" || f.Component == w.component) {
						found = true
					}
				}
				if !found {
					t.Errorf("%s: no finding code=%q component=%q in %+v", w.check, w.code, w.component, c.Findings)
				}
			}
		})
	}
}

func TestReportJSONHasNoNaN(t *testing.T) {
	t.Parallel()
	r := analyze(t, "h100-healthy", loadExampleConfig(t)).Report
	// encoding/json refuses NaN and ±Inf, so marshalling is the check.
	if _, err := json.Marshal(r); err != nil {
		t.Fatalf("report does not marshal: %v", err)
	}
	if len(r.Checks) == 0 {
		t.Fatal("no checks in report")
	}
}

// BenchmarkAnalyzeBundle is the figure: one 8-GPU / 8-HCA bundle,
// opened and judged by every check, per iteration.
func BenchmarkAnalyzeBundle(b *testing.B) {
	cfg := loadExampleConfig(b)
	list, _ := checks.Select(registry.All(), nil, true)
	dir := filepath.Join(examples, "h100-healthy")
	b.ReportAllocs()
	for b.Loop() {
		bd, err := bundle.Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		res := Run(context.Background(), bd, Options{Config: cfg, Checks: list})
		if res.Report.Status != report.Pass {
			b.Fatalf("status %s", res.Report.Status)
		}
	}
}

// BenchmarkAnalyzePackedBundle is the same node as a .tar.gz bundle (what
// `collect` writes by default): unpacked into memory, so no file syscalls.
func BenchmarkAnalyzePackedBundle(b *testing.B) {
	cfg := loadExampleConfig(b)
	list, _ := checks.Select(registry.All(), nil, true)
	packed := filepath.Join(b.TempDir(), "h100-healthy.tar.gz")
	w, err := bundle.Create(packed, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	src := filepath.Join(examples, "h100-healthy")
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		return w.AddFile(filepath.ToSlash(rel), data)
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		bd, err := bundle.Open(packed)
		if err != nil {
			b.Fatal(err)
		}
		res := Run(context.Background(), bd, Options{Config: cfg, Checks: list})
		if res.Report.Status != report.Pass {
			b.Fatalf("status %s", res.Report.Status)
		}
	}
}

// TestUnreachableGPUOnSim: a GPU nvidia-smi cannot talk to (the simulator
// prints nvidia-smi's own "Unable to determine the device handle" line and
// exits 15, as a real node does) fails gpu.inventory naming its PCI bus id;
// the other GPU checks judge the seven GPUs that answer instead of erroring.
func TestUnreachableGPUOnSim(t *testing.T) {
	t.Parallel()
	n, err := sim.New(sim.DefaultSpec("gpu-017"))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.AddFault(sim.GPUUnreachable{GPU: 4}); err != nil {
		t.Fatal(err)
	}
	list, err := checks.Select(registry.All(), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	cfg.Expect.GPUCount = 8
	r := Run(context.Background(), n, Options{Config: cfg, Checks: list}).Report
	inv := r.Check("gpu.inventory")
	if inv == nil || inv.Status != report.Fail {
		t.Fatalf("gpu.inventory: %+v", inv)
	}
	var lost *report.Finding
	for i, f := range inv.Findings {
		if f.Code == "GPU_UNREACHABLE" {
			lost = &inv.Findings[i]
		}
	}
	bus := sim.DefaultSpec("gpu-017").GPUs[4].BusID
	if lost == nil || lost.PCIBusID != bus || lost.Severity != report.SevFail {
		t.Fatalf("no GPU_UNREACHABLE finding for %s: %+v", bus, inv.Findings)
	}
	if inv.Metrics["gpu.count"] != 7 || inv.Metrics["gpu.unreachable_count"] != 1 {
		t.Errorf("metrics %v", inv.Metrics)
	}
	for _, name := range []string{"gpu.config", "gpu.ecc", "gpu.thermal", "gpu.pcie", "gpu.processes", "gpu.fabric"} {
		if c := r.Check(name); c == nil || c.Status == report.Error {
			t.Errorf("%s: %+v, want it judged on the GPUs that answer", name, c)
		}
	}
}
