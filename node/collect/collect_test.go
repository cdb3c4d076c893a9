package collect

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	"github.com/fleetcheck/fleetcheck/node/inspect"
)

func simNode(t *testing.T, faults ...sim.Fault) *sim.Node {
	t.Helper()
	spec := sim.DefaultSpec("gpu-017")
	at := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	spec.Clock = sim.ClockFunc(func() time.Time { return at })
	n, err := sim.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range faults {
		if err := n.AddFault(f); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func statuses(r report.Report) map[string]report.Status {
	m := map[string]report.Status{}
	for _, c := range r.Checks {
		m[c.Name] = c.Status
	}
	return m
}

// TestCollectThenAnalyzeMatchesDirect: a bundle collected from a host must
// judge the same as inspecting the host directly, for both packings.
func TestCollectThenAnalyzeMatchesDirect(t *testing.T) {
	t.Parallel()
	for _, packed := range []bool{false, true} {
		name := "dir"
		if packed {
			name = "tar.gz"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			n := simNode(t, append(sim.GPUFellOffBus(5), sim.ECCUncorrectable{GPU: 3, Count: 2}, sim.IBPortDown{HCA: "mlx5_4"})...)
			list, err := checks.Select(registry.All(), nil, true)
			if err != nil {
				t.Fatal(err)
			}
			cfg := config.Defaults()
			direct := inspect.Run(context.Background(), n, inspect.Options{Config: cfg, Checks: list})

			out := filepath.Join(t.TempDir(), "gpu-017")
			if packed {
				out += ".tar.gz"
			}
			w, err := bundle.Create(out, n.Now())
			if err != nil {
				t.Fatal(err)
			}
			sum, err := Collect(context.Background(), n, w, Options{AllReduce: true, Version: "test"})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if sum.Files < 100 {
				t.Errorf("collected only %d files", sum.Files)
			}
			b, err := bundle.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			if b.Name() != "gpu-017" {
				t.Errorf("bundle hostname %q", b.Name())
			}
			replayed := inspect.Run(context.Background(), b, inspect.Options{Config: cfg, Checks: list})
			if got, want := statuses(replayed.Report), statuses(direct.Report); !reflect.DeepEqual(got, want) {
				t.Errorf("statuses differ:\nbundle %v\ndirect %v", got, want)
			}
			for _, c := range []string{"gpu.ecc", "ib.ports", "gpu.inventory", "gpu.xid"} {
				if s := statuses(replayed.Report)[c]; s != report.Fail {
					t.Errorf("%s = %s after collect, want fail", c, s)
				}
			}
		})
	}
}

// TestCollectRecordsHungTool: a hung nvidia-smi is evidence (timeout in
// the manifest, gpu checks error), not an absence.
func TestCollectRecordsHungTool(t *testing.T) {
	t.Parallel()
	n := simNode(t, sim.HungNvidiaSMI{})
	dir := filepath.Join(t.TempDir(), "b")
	w, err := bundle.Create(dir, n.Now())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	sum, err := Collect(ctx, timeoutHost{n}, w, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st := sum.Sources[snapshot.SrcNvidiaSMI]; st.State != snapshot.StateTimeout {
		t.Fatalf("nvidia-smi source %+v, want timeout", st)
	}
	b, err := bundle.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	list, _ := checks.Select(registry.All(), []string{"gpu.ecc"}, false)
	r := inspect.Run(context.Background(), b, inspect.Options{Checks: list}).Report
	if r.Checks[0].Status != report.Error {
		t.Errorf("gpu.ecc on a hung nvidia-smi: %s (%s), want error", r.Checks[0].Status, r.Checks[0].Reason)
	}
}

// timeoutHost gives each capture a short deadline, as the live host does
// with its per-tool timeout.
type timeoutHost struct{ *sim.Node }

func (h timeoutHost) Capture(ctx context.Context, src snapshot.Source) host.Capture {
	ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	return h.Node.Capture(ctx, src)
}
