package baselines

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

const (
	h100    = "h100-sxm-80g-x8-nvlink-ib400x8"
	h100Raw = "h100-sxm-80g-x8-nvlink"
)

var (
	stackA = Stack{Driver: "535.161.08", NCCL: "2.21.5", RDMAStack: "MLNX_OFED 23.10-1.1.9.0"}
	stackB = Stack{Driver: "550.54.15", NCCL: "2.21.5", RDMAStack: "MLNX_OFED 23.10-1.1.9.0"}
)

func at(metric string, scope Scope, stack Stack, v float64, version int) Baseline {
	b := *one(metric, HigherBetter, v)
	b.Key = Key{Metric: metric, Scope: scope, Stack: stack}
	b.Version = version
	return b
}

// finders runs a test against Static and against a Store holding the same
// baselines: both must resolve alike.
func finders(t *testing.T, bs ...Baseline) map[string]Finder {
	t.Helper()
	s := newStore(t)
	for _, b := range bs {
		for v := 1; v <= b.Version; v++ {
			if _, err := s.Set(t.Context(), b); err != nil {
				t.Fatal(err)
			}
		}
	}
	return map[string]Finder{"static": Static(bs), "store": s}
}

func TestResolve(t *testing.T) {
	t.Parallel()
	bw := MetricAllReduceBusBW
	tests := []struct {
		name       string
		bs         []Baseline
		node, sku  string
		stack      Stack
		scope      Scope
		value      float64
		fallback   bool
		otherStack bool
		reason     string
	}{
		{
			name: "node's own",
			bs:   []Baseline{at(bw, NodeScope("gpu-1"), stackA, 470, 1), at(bw, SKUScope(h100), stackA, 480, 1)},
			node: "gpu-1", sku: h100, stack: stackA,
			scope: NodeScope("gpu-1"), value: 470, reason: "baseline node:gpu-1 v1",
		},
		{
			name: "falls back to the SKU",
			bs:   []Baseline{at(bw, NodeScope("gpu-2"), stackA, 470, 1), at(bw, SKUScope(h100), stackA, 480, 1)},
			node: "gpu-1", sku: h100, stack: stackA,
			scope: SKUScope(h100), value: 480, fallback: true, reason: "no baseline at node:gpu-1; baseline sku:" + h100,
		},
		{
			name: "falls back to the SKU without its network part",
			bs:   []Baseline{at(bw, SKUScope(h100Raw), Stack{}, 480, 1)},
			node: "gpu-1", sku: h100, stack: stackA,
			scope: SKUScope(h100Raw), value: 480, fallback: true, reason: "no baseline at node:gpu-1, sku:" + h100 + "; baseline sku:" + h100Raw,
		},
		{
			name: "latest version wins",
			bs:   []Baseline{at(bw, NodeScope("gpu-1"), stackA, 470, 3)},
			node: "gpu-1", sku: h100, stack: stackA,
			scope: NodeScope("gpu-1"), value: 470, reason: "v3",
		},
		{
			name: "same stack at the SKU beats another stack at the node",
			bs:   []Baseline{at(bw, NodeScope("gpu-1"), stackA, 470, 1), at(bw, SKUScope(h100), stackB, 480, 1)},
			node: "gpu-1", sku: h100, stack: stackB,
			scope: SKUScope(h100), value: 480, fallback: true,
		},
		{
			name: "another stack only when nothing agrees",
			bs:   []Baseline{at(bw, NodeScope("gpu-1"), stackA, 470, 1)},
			node: "gpu-1", sku: h100, stack: stackB,
			scope: NodeScope("gpu-1"), value: 470, otherStack: true, reason: "taken under another stack",
		},
		{
			name: "the closest stack at one scope",
			bs: []Baseline{
				at(bw, NodeScope("gpu-1"), Stack{}, 460, 1),
				at(bw, NodeScope("gpu-1"), Stack{Driver: stackA.Driver}, 465, 1),
				at(bw, NodeScope("gpu-1"), stackA, 470, 1),
				at(bw, NodeScope("gpu-1"), stackB, 475, 1),
			},
			node: "gpu-1", stack: stackA,
			scope: NodeScope("gpu-1"), value: 470,
		},
		{
			name: "unknown stack agrees with any",
			bs:   []Baseline{at(bw, SKUScope(h100), Stack{}, 480, 1)},
			node: "gpu-1", sku: h100, stack: stackB,
			scope: SKUScope(h100), value: 480, fallback: true,
		},
		{
			name: "other metric ignored",
			bs:   []Baseline{at(MetricAllReduce2BusBW, NodeScope("gpu-1"), stackA, 470, 1)},
			node: "gpu-1", sku: h100, stack: stackA,
			reason: "no baseline for nccl.allreduce.busbw_gbps at node:gpu-1, sku:" + h100 + ", sku:" + h100Raw,
		},
		{
			name:   "nothing to look under",
			stack:  stackA,
			reason: "no node or SKU",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for kind, f := range finders(t, tc.bs...) {
				r, err := Resolve(t.Context(), f, bw, tc.node, tc.sku, tc.stack)
				if err != nil {
					t.Fatalf("%s: %v", kind, err)
				}
				if tc.scope == "" {
					if r.Baseline != nil {
						t.Errorf("%s: found %v, want none", kind, r.Baseline)
					}
					c := CompareResolved(r, 480, tc.stack, CompareOptions{})
					if c.Verdict != Inconclusive || !strings.Contains(c.Reason, tc.reason) {
						t.Errorf("%s: no baseline compares %s: %q", kind, c.Verdict, c.Reason)
					}
					continue
				}
				if r.Baseline == nil {
					t.Fatalf("%s: none found (%s)", kind, r.Reason)
				}
				if r.Scope != tc.scope || r.Baseline.Value != tc.value || r.Fallback != tc.fallback || r.OtherStack != tc.otherStack {
					t.Errorf("%s: %s %v fallback %v other %v, want %s %v %v %v", kind, r.Scope, r.Baseline.Value, r.Fallback, r.OtherStack, tc.scope, tc.value, tc.fallback, tc.otherStack)
				}
				if !strings.Contains(r.Reason, tc.reason) {
					t.Errorf("%s: reason %q lacks %q", kind, r.Reason, tc.reason)
				}
				c := CompareResolved(r, r.Baseline.Value*0.9, tc.stack, CompareOptions{})
				if c.Verdict != Pass || c.Scope != tc.scope {
					t.Errorf("%s: compare %s at %s", kind, c.Verdict, c.Scope)
				}
				if (len(c.Warnings) > 0) != tc.otherStack {
					t.Errorf("%s: warnings %q with other stack %v", kind, c.Warnings, tc.otherStack)
				}
				if tc.fallback && !strings.Contains(c.Reason, "; no baseline at node:gpu-1") {
					t.Errorf("%s: comparison %q does not say the node had none", kind, c.Reason)
				}
			}
		})
	}
}

func TestResolveLink(t *testing.T) {
	t.Parallel()
	m := MetricAllReduce2BusBW
	bs := []Baseline{at(m, LinkScope("gpu-1", "gpu-2"), stackA, 450, 1), at(m, SKUScope(h100), Stack{}, 469.21, 1)}
	for kind, f := range finders(t, bs...) {
		r, err := ResolveLink(t.Context(), f, m, "gpu-2", "gpu-1", h100, stackA)
		if err != nil || r.Baseline == nil || r.Scope != "link:gpu-1|gpu-2" || r.Fallback {
			t.Errorf("%s: pair: %+v %v", kind, r, err)
		}
		r, err = ResolveLink(t.Context(), f, m, "gpu-3", "gpu-1", h100, stackA)
		if err != nil || r.Baseline == nil || r.Scope != SKUScope(h100) || !r.Fallback {
			t.Errorf("%s: other pair: %+v %v", kind, r, err)
		}
	}
}

func TestResolveRejectsBadInput(t *testing.T) {
	t.Parallel()
	f := Static(nil)
	if _, err := Resolve(t.Context(), f, "BusBW", "gpu-1", "", Stack{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad metric: %v", err)
	}
	if _, err := Resolve(t.Context(), f, MetricAllReduceBusBW, "gpu 1", "", Stack{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad node: %v", err)
	}
	boom := errors.New("database is locked")
	if _, err := Resolve(t.Context(), failing{boom}, MetricAllReduceBusBW, "gpu-1", "", Stack{}); !errors.Is(err, boom) {
		t.Errorf("store error: %v", err)
	}
}

type failing struct{ err error }

func (f failing) Candidates(context.Context, string, Scope) ([]Baseline, error) { return nil, f.err }

func TestStaticTakesLatestVersion(t *testing.T) {
	t.Parallel()
	old := at(MetricAllReduceBusBW, NodeScope("n"), Stack{}, 400, 1)
	cur := at(MetricAllReduceBusBW, NodeScope("n"), Stack{}, 480, 2)
	cur.TakenAt = old.TakenAt.Add(-time.Hour) // versions, not times, order one key
	got, _ := Static{cur, old}.Candidates(t.Context(), MetricAllReduceBusBW, NodeScope("n"))
	if len(got) != 1 || got[0].Value != 480 {
		t.Errorf("candidates %v", got)
	}
}
