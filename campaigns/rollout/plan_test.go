package rollout

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/compat"
)

func TestPlanExclusionsAndWaves(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	f := newFakeFleet(clk, 16)
	f.set("gpu-002", func(n *fnode) { n.vbios = "96.00.74.00.01" }) // known bad with the target
	f.set("gpu-003", func(n *fnode) { n.gpu = "NVIDIA B200" })      // no rule for this model
	f.set("gpu-004", func(n *fnode) { n.driver = "550.90.7" })      // already there (08 = 8)
	f.set("gpu-005", func(n *fnode) { n.disconnect = true })        // planned all the same, marked
	f.set("gpu-006", func(n *fnode) { n.kernel = "" })              // the kernel rule cannot be judged
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
		"gpu-006": ExcludedUnknown, "gpu-007": ExcludedIncompatible,
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
	// 11 eligible: canary 2, then 3, then 50 % of the 9 after the canary
	// (5, rounded up), then the last entry again for the last one.
	var sizes, budgets []int
	for _, w := range p.Waves {
		sizes = append(sizes, len(w.Nodes))
		budgets = append(budgets, w.Budget)
	}
	if !equalInts(sizes, []int{2, 3, 5, 1}) || !equalInts(budgets, []int{0, 1, 2, 0}) {
		t.Fatalf("sizes %v budgets %v", sizes, budgets)
	}
	if p.Waves[0].Nodes[0].Name != "gpu-001" || p.Waves[0].Nodes[1].Name != "gpu-008" || p.Waves[0].Nodes[0].Driver != oldDriver {
		t.Fatalf("canary %+v", p.Waves[0])
	}
	// The disconnected node keeps its place in name order, marked.
	if n := p.Waves[1].Nodes[0]; n.Name != "gpu-005" || !n.Disconnected ||
		n.Note != "disconnected at plan time: will be waited for 2m0s (connect_grace) at its turn" {
		t.Fatalf("wave 1 %+v", p.Waves[1])
	}
	for _, w := range p.Waves {
		for _, n := range w.Nodes {
			if n.Name != "gpu-005" && (n.Disconnected || n.Note != "") {
				t.Errorf("%s marked: %+v", n.Name, n)
			}
		}
	}
	if p.MaxUnavailable != 1 || p.FleetSize != 16 || p.Selected != 16 {
		t.Fatalf("max unavailable %d fleet %d selected %d", p.MaxUnavailable, p.FleetSize, p.Selected)
	}
}

// TestPlanCanaryPrefersConnected: an automatic canary is taken from the
// connected nodes; the disconnected one keeps its name-order place in the
// waves. Planning the same fleet state twice gives the same plan.
func TestPlanCanaryPrefersConnected(t *testing.T) {
	t.Parallel()
	f := newFakeFleet(newManualClock(), 4)
	f.set("gpu-001", func(n *fnode) { n.disconnect = true })
	spec := baseSpec()
	spec.Waves = []Amount{Percent(100)}
	var first string
	for i := range 2 {
		p, err := Plan(context.Background(), spec, f, mustMatrix(t))
		if err != nil {
			t.Fatal(err)
		}
		got := planLine(p)
		if want := "canary: gpu-002 | wave 1: gpu-001(away) gpu-003 gpu-004"; got != want {
			t.Fatalf("plan %q, want %q", got, want)
		}
		if i == 0 {
			first = got
		} else if got != first {
			t.Fatalf("plan changed: %q then %q", first, got)
		}
	}
	// A named canary is kept even while away: the operator chose it.
	spec.CanaryNodes = []string{"gpu-001"}
	p, err := Plan(context.Background(), spec, f, mustMatrix(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := planLine(p); got != "canary: gpu-001(away) | wave 1: gpu-002 gpu-003 gpu-004" {
		t.Fatalf("plan %q", got)
	}
}

func planLine(p *PlanResult) string {
	var waves []string
	for _, w := range p.Waves {
		var names []string
		for _, n := range w.Nodes {
			if n.Disconnected {
				n.Name += "(away)"
			}
			names = append(names, n.Name)
		}
		waves = append(waves, w.Name+": "+strings.Join(names, " "))
	}
	return strings.Join(waves, " | ")
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
