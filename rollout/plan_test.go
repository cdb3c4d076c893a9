package rollout

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/compat"
)

func TestPlanExclusionsAndWaves(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	f := newFakeFleet(clk, 16)
	f.set("gpu-002", func(n *fnode) { n.vbios = "96.00.74.00.01" }) // known bad with the target
	f.set("gpu-003", func(n *fnode) { n.gpu = "NVIDIA B200" })      // no rule for this model
	f.set("gpu-004", func(n *fnode) { n.driver = "550.90.7" })      // already there (08 = 8)
	f.set("gpu-005", func(n *fnode) { n.disconnect = true })
	f.set("gpu-006", func(n *fnode) { n.kernel = "" }) // the kernel rule cannot be judged
	f.set("gpu-007", func(n *fnode) { n.kernel = "7.1.0-generic" })

	spec := baseSpec()
	two := 2
	spec.Canary = &two
	spec.Waves = []Amount{Count(3), Percent(50)}
	spec.FailureBudget.Wave = Percent(40)
	spec.MaxUnavailable = Percent(10)
	p, err := Plan(context.Background(), spec, f, mustMatrix(t))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, ex := range p.Excluded {
		kinds[ex.Node] = ex.Kind
	}
	want := map[string]string{
		"gpu-002": ExcludedIncompatible, "gpu-003": ExcludedUnknown, "gpu-004": ExcludedUpToDate,
		"gpu-005": ExcludedDisconnected, "gpu-006": ExcludedUnknown, "gpu-007": ExcludedIncompatible,
	}
	if len(kinds) != len(want) {
		t.Fatalf("excluded %+v", p.Excluded)
	}
	for n, k := range want {
		if kinds[n] != k {
			t.Errorf("%s: %q, want %q", n, kinds[n], k)
		}
	}
	for _, ex := range p.Excluded {
		if ex.Node == "gpu-002" && (!strings.Contains(ex.Reason, "Xid 79 on boot") || len(ex.Rules) == 0) {
			t.Errorf("gpu-002 reason %q rules %q", ex.Reason, ex.Rules)
		}
		if ex.Node == "gpu-006" && !strings.Contains(ex.Reason, "kernel") {
			t.Errorf("gpu-006 reason %q", ex.Reason)
		}
	}
	// 10 eligible: canary 2, then 3, then 50 % of the 8 after the canary
	// (4), then the last entry again for the last one.
	var sizes, budgets []int
	for _, w := range p.Waves {
		sizes = append(sizes, len(w.Nodes))
		budgets = append(budgets, w.Budget)
	}
	if !equalInts(sizes, []int{2, 3, 4, 1}) || !equalInts(budgets, []int{0, 1, 1, 0}) {
		t.Fatalf("sizes %v budgets %v", sizes, budgets)
	}
	if p.Waves[0].Nodes[0].Name != "gpu-001" || p.Waves[0].Nodes[1].Name != "gpu-008" || p.Waves[0].Nodes[0].Driver != oldDriver {
		t.Fatalf("canary %+v", p.Waves[0])
	}
	if p.MaxUnavailable != 1 || p.FleetSize != 16 || p.Selected != 16 {
		t.Fatalf("max unavailable %d fleet %d selected %d", p.MaxUnavailable, p.FleetSize, p.Selected)
	}
}

func TestPlanFabricManagerMustMove(t *testing.T) {
	t.Parallel()
	m, err := compat.Parse([]byte(testMatrix + `
fabric_manager:
  - driver: "*"
    gpu_model: 80GB HBM3
    version: same
    reason: a mismatched Fabric Manager leaves the fabric In Progress
`))
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeFleet(newManualClock(), 2)
	// The fake inventory has no Fabric Manager version: unknown, so excluded.
	p, err := Plan(context.Background(), baseSpec(), f, m)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Excluded) != 2 || p.Excluded[0].Kind != ExcludedUnknown {
		t.Fatalf("excluded %+v", p.Excluded)
	}
	// With the FM moving along, the target is allowed.
	spec := baseSpec()
	spec.Target.FabricManager = "same"
	if p, err = Plan(context.Background(), spec, f, m); err != nil || len(p.Excluded) != 0 {
		t.Fatalf("%v excluded %+v", err, p.Excluded)
	}
}

func TestPlanCanaryNodes(t *testing.T) {
	t.Parallel()
	f := newFakeFleet(newManualClock(), 6)
	f.set("gpu-002", func(n *fnode) { n.vbios = "96.00.74.00.01" })
	spec := baseSpec()
	spec.CanaryNodes = []string{"gpu-005"}
	p, err := Plan(context.Background(), spec, f, mustMatrix(t))
	if err != nil {
		t.Fatal(err)
	}
	if p.Waves[0].Nodes[0].Name != "gpu-005" || len(p.Waves[0].Nodes) != 1 {
		t.Fatalf("canary %+v", p.Waves[0])
	}
	spec.CanaryNodes = []string{"gpu-002"}
	if _, err := Plan(context.Background(), spec, f, mustMatrix(t)); err == nil || !strings.Contains(err.Error(), "excluded") {
		t.Fatalf("excluded canary: %v", err)
	}
	spec.CanaryNodes = []string{"gpu-099"}
	if _, err := Plan(context.Background(), spec, f, mustMatrix(t)); err == nil || !strings.Contains(err.Error(), "not selected") {
		t.Fatalf("unknown canary: %v", err)
	}
	if _, err := Plan(context.Background(), spec, f, nil); !errors.Is(err, ErrNoMatrix) {
		t.Fatalf("no matrix: %v", err)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
