package baselines_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/nccl"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/inspect"
)

// TestReferenceFilesLoad: every shipped figure parses, validates, carries
// its source, and the set covers the SKUs the issue asks for.
func TestReferenceFilesLoad(t *testing.T) {
	t.Parallel()
	refs, err := baselines.Reference()
	if err != nil {
		t.Fatal(err)
	}
	want := map[baselines.Key]float64{
		{Metric: baselines.MetricAllReduceBusBW, Scope: "sku:h100-sxm-80g-x8-nvlink"}:          480,
		{Metric: baselines.MetricAllReduce2BusBW, Scope: "sku:h100-sxm-80g-x8-nvlink-ib400x8"}: 469.21,
		{Metric: baselines.MetricAllReduceBusBW, Scope: "sku:a100-sxm-80g-x8-nvlink"}:          230,
		{Metric: baselines.MetricAllReduceBusBW, Scope: "sku:a100-sxm-40g-x8-nvlink"}:          230,
		{Metric: baselines.MetricAllReduce2BusBW, Scope: "sku:a100-sxm-80g-x8-nvlink-ib200x8"}: 192,
		{Metric: baselines.MetricAllReduce2BusBW, Scope: "sku:a100-sxm-40g-x8-nvlink-ib200x8"}: 192,
	}
	if len(refs) != len(want) {
		t.Errorf("%d references, want %d", len(refs), len(want))
	}
	for _, b := range refs {
		v, ok := want[b.Key]
		if !ok {
			t.Errorf("unexpected reference %v", b)
			continue
		}
		if b.Value != v || b.Direction != baselines.HigherBetter || b.Samples.Count != 1 {
			t.Errorf("%v: want %v, higher is better, one sample", b, v)
		}
		if b.FromRun == "" || b.Note == "" || b.Who == "" || b.TakenAt.IsZero() {
			t.Errorf("%v lacks its provenance: from_run %q, who %q, taken %v", b, b.FromRun, b.Who, b.TakenAt)
		}
		if b.Version != 0 || !b.Stack.IsZero() {
			t.Errorf("%v: references carry no version and no stack", b)
		}
	}
}

// TestMetricNamesMatchTheCheck: the single-node baseline metric is the one
// nccl.allreduce reports.
func TestMetricNamesMatchTheCheck(t *testing.T) {
	t.Parallel()
	if baselines.MetricAllReduceBusBW != nccl.MetricBusBW {
		t.Errorf("baselines %q, check %q", baselines.MetricAllReduceBusBW, nccl.MetricBusBW)
	}
}

// TestExampleBundlesAgainstReference runs the real pipeline over the
// example bundles (real fixture formats): the inventory's SKU finds the
// shipped H100 reference through the base SKU, and the check's busbw
// compares against it.
func TestExampleBundlesAgainstReference(t *testing.T) {
	t.Parallel()
	refs, err := baselines.Reference()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"h100-healthy", "h100-ibdown-pcie"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h, err := bundle.Open(filepath.Join("..", "examples", "bundles", name))
			if err != nil {
				t.Fatal(err)
			}
			snap := inspect.Read(context.Background(), h, inspect.Want{AllReduce: true})
			sku := baselines.SKUFromInventory(inspect.Inventory(snap), nil)
			if sku != "h100-sxm-80g-x8-nvlink-ib400x8" {
				t.Fatalf("SKU %q", sku)
			}
			stack := baselines.StackFromVersions(snap.Versions)
			if stack.RDMAStack == "" {
				t.Errorf("stack %v: the bundle names its RDMA stack", stack)
			}
			res := inspect.Judge(snap, []checks.Check{nccl.AllReduce{}}, config.Defaults(), nil)
			cr := res.Report.Check("nccl.allreduce")
			if cr == nil {
				t.Fatal("no nccl.allreduce result")
			}
			busbw, ok := cr.Metrics[baselines.MetricAllReduceBusBW]
			if !ok {
				t.Fatalf("no %s in %v", baselines.MetricAllReduceBusBW, cr.Metrics)
			}
			r, err := baselines.Resolve(t.Context(), baselines.Static(refs), baselines.MetricAllReduceBusBW, snap.Hostname, sku, stack)
			if err != nil {
				t.Fatal(err)
			}
			if r.Scope != "sku:h100-sxm-80g-x8-nvlink" || !r.Fallback {
				t.Fatalf("resolved %+v", r)
			}
			c := baselines.CompareResolved(r, busbw, stack, baselines.CompareOptions{})
			if c.Verdict == baselines.Inconclusive || len(c.Warnings) != 0 {
				t.Errorf("comparison %+v", c)
			}
			t.Logf("%s: %s", name, c.Reason)
		})
	}
}
