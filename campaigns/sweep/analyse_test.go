package sweep

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// readings builds finished tests from a compact form: "f" fine, "n0.31"
// near with that deviation, "s" slow, "e" error, "u" the subject lost,
// "r" the reference lost, "b" no baseline.
func readings(spec string) []*TestRecord {
	var out []*TestRecord
	for i, r := range strings.Fields(spec) {
		t := &TestRecord{Seq: i + 1, State: TestDone, Nodes: []string{"x", "ref"}}
		switch r[0] {
		case 'f':
			t.Outcome, t.Deviation = OutFine, 0.02
		case 's':
			t.Outcome, t.Deviation = OutSlow, 0.45
		case 'n':
			t.Outcome = OutNear
			fmt.Sscanf(r[1:], "%g", &t.Deviation)
		case 'e':
			t.Outcome = OutError
		case 'u':
			t.Outcome, t.Lost = OutUnreachable, []string{"x"}
		case 'r':
			t.Outcome, t.Lost = OutUnreachable, []string{"ref"}
		case 'b':
			t.Outcome = OutNoBaseline
		}
		out = append(out, t)
	}
	return out
}

func TestDecide(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		runs    string
		confirm bool
		repeats int
		want    decision
	}{
		{"", true, 2, decPending},
		{"f", true, 2, decFine},
		{"s", false, 2, decSlow},
		{"s", true, 2, decPending}, // confirm a slow reading
		{"s", true, 0, decSlow},    // no repeats allowed: call it
		{"s s", true, 2, decSlow},
		{"s f", true, 2, decTransient},   // slow once, fine on repeat
		{"s n0.29", true, 2, decPending}, // still unclear
		{"s n0.29 n0.29", true, 2, decTransient},
		{"s n0.31 n0.29", true, 2, decSlow}, // median of 0.45, 0.31, 0.29
		{"n0.31", false, 2, decPending},     // near the threshold: repeat
		{"n0.31 n0.31 n0.31", false, 2, decSlow},
		{"n0.29 n0.31 n0.29", false, 2, decFine},
		{"n0.31 f", false, 2, decFine},
		{"n0.29 s", false, 2, decSlow},
		{"n0.31", false, 0, decSlow}, // no repeats: the reading decides
		{"n0.30", false, 0, decFine}, // exactly at the threshold passes
		{"e", true, 2, decPending},   // an error is retried once
		{"e e", true, 2, decError},
		{"e f", true, 2, decFine},
		{"e", true, -1, decError},
		{"u", true, 2, decLost},
		{"r", true, 2, decPending}, // the reference was lost: another one
		{"r r r", true, 2, decLost},
		{"r f", true, 2, decFine},
		{"b", true, 2, decNoBaseline},
	} {
		t.Run(strings.ReplaceAll(c.runs, " ", "_")+fmt.Sprintf("/confirm=%v/repeats=%d", c.confirm, c.repeats), func(t *testing.T) {
			t.Parallel()
			reps := c.repeats
			if reps < 0 {
				reps = 0
			}
			if got := decide(readings(c.runs), 0.30, c.confirm, reps, "x"); got != c.want {
				t.Fatalf("decide(%q) = %s, want %s", c.runs, got, c.want)
			}
		})
	}
}

// A test record set for classifying whole scenarios without a fleet.
type script struct {
	rec   Record
	tests []TestRecord
}

func newScript(nodes map[string]string) *script {
	s := &script{rec: Record{ID: "s", Spec: Spec{}.WithDefaults(), State: StateRunning}}
	var names []string
	for n := range nodes {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		s.rec.Nodes = append(s.rec.Nodes, NodeInfo{Name: n, Labels: map[string]string{"leaf": nodes[n]}})
	}
	return s
}

func (s *script) add(p Phase, purpose Purpose, series string, out Outcome, dev float64, nodes ...string) {
	s.tests = append(s.tests, TestRecord{Seq: len(s.tests) + 1, Phase: p, Purpose: purpose, Series: series,
		Nodes: nodes, State: TestDone, Attempts: 1, Outcome: out, Deviation: dev, GBps: 100})
}

func (s *script) single(n string, outs ...Outcome) {
	for _, o := range outs {
		dev := 0.01
		if o == OutSlow {
			dev = 0.45
		}
		s.add(PhaseIntra, PurposeSingle, "single:"+n, o, dev, n)
	}
}

func (s *script) pair(a, b string, o Outcome) {
	dev := 0.02
	if o == OutSlow {
		dev = 0.4
	}
	s.add(PhaseInter, PurposePair, "pair:"+linkKey(a, b), o, dev, a, b)
}

func (s *script) loc(purpose Purpose, n, ref string, outs ...Outcome) {
	for _, o := range outs {
		dev := 0.02
		if o == OutSlow {
			dev = 0.42
		}
		s.add(PhaseLocalise, purpose, "loc:"+n, o, dev, n, ref)
	}
}

func (s *script) probe(p, q string, o Outcome) {
	dev := 0.02
	if o == OutSlow {
		dev = 0.5
	}
	s.add(PhaseLocalise, PurposeProbe, "path:"+linkKey(s.leafOf(p), s.leafOf(q)), o, dev, p, q)
}

func (s *script) leafOf(n string) string {
	for _, x := range s.rec.Nodes {
		if x.Name == n {
			return x.Labels["leaf"]
		}
	}
	return ""
}

// verdicts judges the nodes the script tested (a node in the sweep that
// no test touched would rightly be inconclusive).
func (s *script) verdicts() map[string]Kind {
	used := map[string]bool{}
	for _, t := range s.tests {
		for _, n := range t.Nodes {
			used[n] = true
		}
	}
	rec := s.rec
	rec.Nodes = nil
	for _, n := range s.rec.Nodes {
		if used[n.Name] {
			rec.Nodes = append(rec.Nodes, n)
		}
	}
	a := analyse(&rec, s.tests)
	vs, _, _ := buildVerdicts(&rec, a)
	out := map[string]Kind{}
	for _, v := range vs {
		out[v.Subject] = v.Verdict
	}
	return out
}

// The verdict table: stored readings in, verdicts out.
func TestVerdictClassification(t *testing.T) {
	t.Parallel()
	leaves := map[string]string{"a1": "L1", "a2": "L1", "a3": "L1", "b1": "L2", "b2": "L2", "b3": "L2"}
	for _, c := range []struct {
		name  string
		build func(s *script)
		want  map[string]Kind
	}{
		{"all fine", func(s *script) {
			for _, n := range []string{"a1", "a2", "a3", "b1", "b2", "b3"} {
				s.single(n, OutFine)
			}
			s.pair("a1", "b1", OutFine)
			s.pair("a2", "b2", OutFine)
			s.pair("a3", "b3", OutFine)
		}, map[string]Kind{}},
		{"gpu-side: slow alone twice", func(s *script) {
			s.single("a1", OutSlow, OutSlow)
		}, map[string]Kind{"a1": GPUSide}},
		{"transient alone", func(s *script) {
			s.single("a1", OutSlow, OutFine)
			s.pair("a1", "b1", OutFine)
		}, map[string]Kind{"a1": Transient}},
		{"network-side: pair slow, slow again with a same-leaf reference", func(s *script) {
			s.single("a1", OutFine)
			s.single("b1", OutFine)
			s.pair("a1", "b1", OutSlow)
			s.pair("a2", "b2", OutFine)
			s.pair("a3", "b3", OutFine)
			s.loc(PurposeMember, "a1", "a2", OutSlow)
			s.loc(PurposeMember, "b1", "b2", OutFine)
			s.probe("a3", "b3", OutFine)
		}, map[string]Kind{"a1": NetworkSide}},
		{"two bad nodes in one pair", func(s *script) {
			s.pair("a1", "b1", OutSlow)
			s.pair("a2", "b2", OutFine)
			s.loc(PurposeMember, "a1", "a2", OutSlow)
			s.loc(PurposeMember, "b1", "b2", OutSlow)
		}, map[string]Kind{"a1": NetworkSide, "b1": NetworkSide}},
		{"link: members fine on their leaves, probe across slow", func(s *script) {
			s.pair("a1", "b1", OutSlow)
			s.pair("a2", "b2", OutSlow)
			s.pair("a3", "b3", OutFine) // (a path need not fail every time to be called)
			s.loc(PurposeMember, "a1", "a3", OutFine)
			s.loc(PurposeMember, "b1", "b3", OutFine)
			s.probe("a3", "b3", OutSlow)
		}, map[string]Kind{"L1|L2": Link, "a2": Inconclusive, "b2": Inconclusive}},
		{"transient pair: members and path fine", func(s *script) {
			s.pair("a1", "b1", OutSlow)
			s.pair("a2", "b2", OutFine)
			s.pair("a3", "b3", OutFine)
			s.loc(PurposeMember, "a1", "a2", OutFine)
			s.loc(PurposeMember, "b1", "b2", OutFine)
			s.probe("a3", "b3", OutFine)
		}, map[string]Kind{"a1|b1": Transient}},
		{"slow pair, path not probed", func(s *script) {
			s.pair("a1", "b1", OutSlow)
			s.pair("a2", "b2", OutFine)
			s.loc(PurposeMember, "a1", "a2", OutFine)
			s.loc(PurposeMember, "b1", "b2", OutFine)
		}, map[string]Kind{"a1|b1": Inconclusive}},
		{"network-side leftover needs two slow runs", func(s *script) {
			s.single("a1", OutFine)
			s.loc(PurposeLeftover, "a1", "a2", OutSlow, OutSlow)
			s.pair("a2", "b2", OutFine)
		}, map[string]Kind{"a1": NetworkSide}},
		{"leftover slow once", func(s *script) {
			s.single("a1", OutFine)
			s.loc(PurposeLeftover, "a1", "a2", OutSlow, OutFine)
			s.pair("a2", "b2", OutFine)
		}, map[string]Kind{"a1": Transient}},
		{"no baseline is inconclusive, never a pass", func(s *script) {
			s.single("a1", OutNoBaseline)
			s.pair("a1", "b1", OutFine)
			s.single("b1", OutFine)
		}, map[string]Kind{"a1": Inconclusive}},
		{"errors twice", func(s *script) {
			s.single("a1", OutError, OutError)
		}, map[string]Kind{"a1": Inconclusive}},
		{"unknown leaves: a slow pair, both fine since, is transient, not a link", func(s *script) {
			s.rec.Nodes = append(s.rec.Nodes, NodeInfo{Name: "x1"}, NodeInfo{Name: "x2"})
			s.pair("x1", "a1", OutSlow)
			s.pair("a2", "b2", OutFine)
			s.pair("a3", "b3", OutFine)
			s.loc(PurposeMember, "x1", "a2", OutFine)
			s.loc(PurposeMember, "a1", "a3", OutFine)
		}, map[string]Kind{"a1|x1": Transient}},
		{"lost mid-sweep", func(s *script) {
			s.single("a1", OutFine)
			s.single("b1", OutFine)
			s.tests = append(s.tests, TestRecord{Seq: len(s.tests) + 1, Phase: PhaseInter, Purpose: PurposePair,
				Series: "pair:a1|b1", Nodes: []string{"a1", "b1"}, State: TestDone, Outcome: OutUnreachable, Lost: []string{"b1"}})
			s.pair("a2", "b2", OutFine)
			s.loc(PurposeLeftover, "a1", "a2", OutFine)
		}, map[string]Kind{"b1": Unreachable}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newScript(leaves)
			c.build(s)
			got := s.verdicts()
			if len(got) != len(c.want) {
				t.Fatalf("verdicts %v, want %v", got, c.want)
			}
			for k, v := range c.want {
				if got[k] != v {
					t.Fatalf("verdicts %v, want %v", got, c.want)
				}
			}
		})
	}
}

func leafNodes(leaves, perLeaf int) ([]string, func(string) string) {
	var nodes []string
	leaf := map[string]string{}
	for l := range leaves {
		for i := range perLeaf {
			n := fmt.Sprintf("n%02d-%02d", l, i)
			nodes = append(nodes, n)
			leaf[n] = fmt.Sprintf("L%02d", l)
		}
	}
	return nodes, func(n string) string { return leaf[n] }
}

func TestPairingRespectsLeaves(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		leaves, perLeaf int
		wantPaths       int // distinct leaf pairs covered
	}{
		{32, 32, 32 * 31 / 2}, // the benchmark fleet: every path carries a pair
		{4, 8, 6},
		{2, 5, 1},
		{3, 1, 1},
		{8, 3, 12}, // too few nodes for all 28 paths
	} {
		t.Run(fmt.Sprintf("%dx%d", c.leaves, c.perLeaf), func(t *testing.T) {
			t.Parallel()
			nodes, leafOf := leafNodes(c.leaves, c.perLeaf)
			pairs, left := pairUp(nodes, leafOf, true, 42)
			seen := map[string]bool{}
			paths := map[string]bool{}
			same := 0
			for _, p := range pairs {
				for _, n := range p {
					if seen[n] {
						t.Fatalf("%s in two pairs", n)
					}
					seen[n] = true
				}
				if leafOf(p[0]) == leafOf(p[1]) {
					same++
				} else {
					paths[linkKey(leafOf(p[0]), leafOf(p[1]))] = true
				}
			}
			if len(seen)+len(left) != len(nodes) || len(left) > 1 {
				t.Fatalf("%d paired, %d left of %d", len(seen), len(left), len(nodes))
			}
			// Same-leaf pairs only when no other leaf has a node left: with
			// equal leaves, none.
			if same > 0 {
				t.Fatalf("%d same-leaf pairs", same)
			}
			if len(paths) < c.wantPaths {
				t.Fatalf("%d leaf-to-leaf paths covered, want %d", len(paths), c.wantPaths)
			}
			// Deterministic per seed, different across seeds.
			again, _ := pairUp(nodes, leafOf, true, 42)
			if !slices.Equal(pairs, again) {
				t.Fatal("same seed, different pairs")
			}
		})
	}
	// Lopsided leaves pair the big one with the others before itself.
	nodes, leafOf := leafNodes(1, 10)
	more, moreLeaf := leafNodes(3, 2)
	all := append(nodes, more[2:]...) // L00 ×10, L01 ×2, L02 ×2
	lf := func(n string) string {
		if slices.Contains(nodes, n) {
			return leafOf(n)
		}
		return moreLeaf(n)
	}
	pairs, _ := pairUp(all, lf, true, 1)
	same := 0
	for _, p := range pairs {
		if lf(p[0]) == lf(p[1]) {
			same++
		}
	}
	if same != 3 { // 10 on L00 against 4 elsewhere: 4 cross, 3 within
		t.Fatalf("%d same-leaf pairs, want 3: %v", same, pairs)
	}
	// Leaf-blind pairing still pairs everyone.
	p, left := pairUp(nodes, leafOf, false, 1)
	if len(p) != 5 || len(left) != 0 {
		t.Fatalf("random pairing: %v %v", p, left)
	}
}

func TestSelectNodesBudgetRotation(t *testing.T) {
	t.Parallel()
	var all []kit.Node
	for i := range 10 {
		n := kit.Node{Name: fmt.Sprintf("n%d", i), Connected: true, Activity: "idle"}
		for range 8 {
			n.Inventory.GPUs = append(n.Inventory.GPUs, report.GPU{})
		}
		all = append(all, n)
	}
	all[3].Activity = "busy"
	all[4].Connected = false
	spec := Spec{Budget: Budget{MaxShare: 0.3}}.WithDefaults()
	now := time.Date(2026, 3, 2, 2, 0, 0, 0, time.UTC)
	last := map[string]time.Time{"n0": now.Add(-24 * time.Hour), "n1": now.Add(-48 * time.Hour)}
	sel := selectNodes(all, spec, last)
	var got []string
	for _, n := range sel.take {
		got = append(got, n.Name)
	}
	// Never-covered first (by name), then the oldest covered.
	if want := []string{"n2", "n5", "n6"}; !slices.Equal(got, want) {
		t.Fatalf("took %v, want %v", got, want)
	}
	if len(sel.skipped) != 1 || sel.skipped[0].Node != "n3" || !slices.Equal(sel.unreachable, []string{"n4"}) {
		t.Fatalf("skipped %v unreachable %v", sel.skipped, sel.unreachable)
	}
	if sel.cov.NightsToCover != 4 || sel.cov.Cap != 3 || sel.cov.Deferred != 5 {
		t.Fatalf("coverage %+v", sel.cov)
	}
	// GPU-hours: 8 GPUs × 4 min = 0.533 GPU-hours a node.
	spec = Spec{Budget: Budget{MaxGPUHours: 2}}.WithDefaults()
	if sel := selectNodes(all, spec, nil); len(sel.take) != 3 || sel.cov.CapBy != "max_gpu_hours 2" {
		t.Fatalf("GPU-hour budget took %d (%s)", len(sel.take), sel.cov.CapBy)
	}
	// A budget that cannot meet the target is a gap.
	spec = Spec{Budget: Budget{MaxNodes: 1, CoverWithinNights: 7}}.WithDefaults()
	sel = selectNodes(all, spec, nil)
	cov := finishCoverage(sel.cov, []string{"n0"}, map[string]time.Time{"n0": now}, now)
	if !cov.Gap || cov.NightsToCover != 10 || cov.Note == "" {
		t.Fatalf("coverage %+v", cov)
	}
	// A node last covered beyond the target is overdue.
	cov = finishCoverage(Coverage{CoverWithinNights: 7, NightsToCover: 1}, []string{"a", "b", "c"},
		map[string]time.Time{"a": now, "b": now.Add(-8 * 24 * time.Hour)}, now)
	if !cov.Gap || !slices.Equal(cov.Overdue, []string{"b"}) || !slices.Equal(cov.NeverCovered, []string{"c"}) {
		t.Fatalf("coverage %+v", cov)
	}
}

func TestSpecValidate(t *testing.T) {
	t.Parallel()
	for _, s := range []Spec{
		{Threshold: 1.5},
		{Threshold: -0.1},
		{Budget: Budget{MaxShare: 2}},
		{Budget: Budget{MaxNodes: -1}},
		{Concurrency: -1},
		{Repeat: RepeatPolicy{Band: 0.5}},
	} {
		if err := s.WithDefaults().Validate(); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
	if err := (Spec{}).WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
}

// Pairs, references and probes stay within one SKU: a 2-node baseline is
// a SKU's.
func TestPlanKeepsSKUsApart(t *testing.T) {
	t.Parallel()
	rec := Record{ID: "s", Seed: 3, Spec: Spec{}.WithDefaults(), State: StateRunning}
	for i := range 12 {
		sku := "h100-sxm-80g-x8-nvlink-ib400x8"
		if i%3 == 0 {
			sku = "a100-sxm-80g-x8-nvlink-ib200x8"
		}
		rec.Nodes = append(rec.Nodes, NodeInfo{Name: fmt.Sprintf("n%02d", i), SKU: sku,
			Labels: map[string]string{"leaf": fmt.Sprintf("L%d", i%2)}})
	}
	a := analyse(&rec, nil)
	skuOf := func(n string) string { return a.nodes[n].SKU }
	pairs := planInter(&rec, a, 0)
	if len(pairs) != 6 {
		t.Fatalf("%d pairs", len(pairs))
	}
	var tests []TestRecord
	for i, p := range pairs {
		if skuOf(p.Nodes[0]) != skuOf(p.Nodes[1]) {
			t.Fatalf("pair across SKUs: %v", p.Nodes)
		}
		p.Seq, p.State, p.Outcome = i+1, TestDone, OutFine
		if i == 0 {
			p.Outcome, p.Deviation = OutSlow, 0.4
		}
		tests = append(tests, p)
	}
	a = analyse(&rec, tests)
	for _, l := range planLocalise(&rec, a, 0) {
		if skuOf(l.Nodes[0]) != skuOf(l.Nodes[1]) {
			t.Fatalf("%s test across SKUs: %v", l.Purpose, l.Nodes)
		}
	}
}
