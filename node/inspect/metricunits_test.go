package inspect

import (
	"context"
	"sort"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
)

// metricSuffixes are the endings a metric's last word may have (docs/design.md
// "Report": unit in the last word). Units first, then the dimensionless
// kinds.
var metricSuffixes = []string{
	"_gbps",    // GB/s (nccl-tests, NVLink) or Gb/s (IB port rate), as the tool prints it
	"_c",       // degrees Celsius
	"_w",       // watts
	"_bytes",   // bytes
	"_mib",     // MiB, as nvidia-smi reports memory
	"_ms",      // milliseconds
	"_seconds", // seconds
	"_mhz",     // clocks
	"_pct",     // percent
	"_lanes",   // PCIe link width
	"_gen",     // PCIe generation
	"_count",   // a count of things or events
	"_total",   // a running total
	"_ratio",   // a fraction
	"_flag",    // 0 or 1
}

// unitOK reports whether the metric's last word ends in a known suffix,
// or is one ("gpu.count", "xid.79.count").
func unitOK(name string) bool {
	last := name[strings.LastIndexByte(name, '.')+1:]
	for _, s := range metricSuffixes {
		if strings.HasSuffix(last, s) || last == s[1:] {
			return true
		}
	}
	return false
}

// TestMetricNamesEndInUnits walks every metric a full 8-GPU run reports:
// the simulated H100 node with every check, disruptive ones included, run
// twice (the second run has a previous state, so rise metrics appear), with
// faults that bring out the conditional metrics (Xids, ECC, a missing GPU,
// rising IB and NVLink errors, a baseline deviation), and the example
// bundles.
func TestMetricNamesEndInUnits(t *testing.T) {
	t.Parallel()
	spec := sim.DefaultSpec("gpu-017")
	spec.DCGMDiag = true
	n, err := sim.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(sim.GPUFellOffBus(5), sim.UncorrectableECCEvent(3, 2)...) {
		if err := n.AddFault(f); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []sim.Fault{
		sim.IBSymbolErrors{HCA: "mlx5_4", PerPass: 100},
		sim.NVLinkErrors{GPU: 1, Link: 2, PerPass: 10},
		sim.GPUUnreachable{GPU: 6},
		sim.Xid{GPU: 2, Code: 13},
	} {
		if err := n.AddFault(f); err != nil {
			t.Fatal(err)
		}
	}
	list, err := checks.Select(registry.All(), nil, true)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	cfg.Expect.GPUCount = 8
	cfg.NCCL.BaselineGBps = 480
	first := Run(context.Background(), n, Options{Config: cfg, Checks: list})
	second := Run(context.Background(), n, Options{Config: cfg, Checks: list, Prev: first.State})
	reports := []report.Report{first.Report, second.Report}
	for _, name := range []string{"h100-healthy", "h100-xid79-ecc", "h100-ibdown-pcie"} {
		reports = append(reports, analyze(t, name, loadExampleConfig(t)).Report)
	}

	seen := map[string]string{}
	for _, r := range reports {
		for _, c := range r.Checks {
			for m := range c.Metrics {
				seen[m] = c.Name
			}
		}
	}
	if len(seen) < 80 {
		t.Fatalf("only %d metrics seen: the run did not exercise the checks", len(seen))
	}
	var bad []string
	for m, check := range seen {
		if !unitOK(m) {
			bad = append(bad, check+": "+m)
		}
		if m != strings.ToLower(m) || strings.Contains(m, "..") {
			bad = append(bad, check+": "+m+" (not dotted lowercase)")
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("metric names without a unit in the last word (allowed %v):\n%s", metricSuffixes, strings.Join(bad, "\n"))
	}
	for _, want := range []string{"gpu1.nvlink.speed_gbps", "xid.13.count", "gpu3.ecc.volatile_uncorrectable_count",
		"ib.mlx5_4.port1.symbol_error_rise_count", "nccl.allreduce.deviation_ratio", "gpu.unreachable_count"} {
		if _, ok := seen[want]; !ok {
			t.Errorf("metric %s not reported: the walk misses a part of the checks", want)
		}
	}
}
