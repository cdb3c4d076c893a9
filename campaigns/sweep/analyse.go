package sweep

import (
	"slices"
	"sort"
)

// decision is what a series of measurements (one measurement and its
// repeats) says.
type decision string

const (
	decPending    decision = "pending" // measure again
	decFine       decision = "fine"
	decSlow       decision = "slow"
	decTransient  decision = "transient" // slow, then fine on repeat
	decError      decision = "error"     // no usable measurement after a retry
	decNoBaseline decision = "no_baseline"
	decLost       decision = "lost" // the node under test disconnected or refused
)

// decide reads a series of finished measurements, oldest first.
//
//   - fine at once: fine;
//   - slow at once: slow, or, when confirm is set, measured again: slow
//     again (or near) is slow, fine is transient;
//   - near the threshold: measured again, up to 1+maxRepeats times; a
//     clear reading ends it (fine → fine, or transient after an earlier
//     slow; slow → slow), otherwise the median decides;
//   - an error is retried once when repeats are allowed;
//   - a lost node ends the series when it is the node under test (subject;
//     "" = any); a lost reference asks for another run with a new one.
func decide(tests []*TestRecord, threshold float64, confirm bool, maxRepeats int, subject string) decision {
	if len(tests) == 0 {
		return decPending
	}
	last := tests[len(tests)-1]
	var nums []*TestRecord
	errs, refLost := 0, 0
	for _, t := range tests {
		switch t.Outcome {
		case OutFine, OutNear, OutSlow:
			nums = append(nums, t)
		case OutError:
			errs++
		case OutUnreachable, OutRefused:
			refLost++
		}
	}
	switch last.Outcome {
	case OutUnreachable, OutRefused:
		if subject == "" || slices.Contains(last.Lost, subject) || refLost > maxRepeats {
			return decLost
		}
		return decPending
	case OutNoBaseline:
		return decNoBaseline
	case OutError:
		if errs <= 1 && maxRepeats > 0 {
			return decPending
		}
		return decError
	}
	anySlow := false
	for _, t := range nums[:len(nums)-1] {
		if t.Outcome == OutSlow {
			anySlow = true
		}
	}
	switch last.Outcome {
	case OutFine:
		if anySlow {
			return decTransient
		}
		return decFine
	case OutSlow:
		if len(nums) == 1 && confirm && maxRepeats > 0 {
			return decPending
		}
		return decSlow
	}
	// near
	if len(nums) < 1+maxRepeats {
		return decPending
	}
	devs := make([]float64, len(nums))
	for i, t := range nums {
		devs[i] = t.Deviation
	}
	switch {
	case median(devs) > threshold:
		return decSlow
	case anySlow:
		return decTransient
	default:
		return decFine
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// series is one measurement series of a sweep.
type series struct {
	key     string
	purpose Purpose
	tests   []*TestRecord // every test of the series, in Seq order
	done    []*TestRecord // the finished ones
	dec     decision
}

// subject is the node the series judges ("" for pairs and probes).
func (s *series) subject() string {
	switch s.purpose {
	case PurposeSingle, PurposeMember, PurposeLeftover:
		return s.tests[0].Nodes[0]
	}
	return ""
}

// analysis is everything a sweep's stored tests say, recomputed from the
// store whenever the engine plans: planning and verdicts are functions of
// what is stored, so a restarted engine decides what the first would have.
type analysis struct {
	spec   Spec
	order  []string // node names in selection order
	nodes  map[string]NodeInfo
	leaf   map[string]string
	series map[string]*series
	// lost: node → the first test that found it gone or busy.
	lost map[string]*TestRecord
	// pairs are round 2's series in Seq order; pairOf maps a node to its.
	pairs  []*series
	pairOf map[string]*series
	// mutualOf maps a node to its round-3 test with another suspect;
	// cleared holds the nodes such a test found fine.
	mutualOf map[string]*series
	cleared  map[string]bool
	// pathPair maps a path to a node of the first slow pair across it
	// (whose SKU its probe takes); set by locSubjects.
	pathPair map[string]string
}

func analyse(rec *Record, tests []TestRecord) *analysis {
	spec := rec.Spec.WithDefaults()
	a := &analysis{
		spec:     spec,
		nodes:    make(map[string]NodeInfo, len(rec.Nodes)),
		leaf:     make(map[string]string, len(rec.Nodes)),
		series:   map[string]*series{},
		lost:     map[string]*TestRecord{},
		pairOf:   map[string]*series{},
		mutualOf: map[string]*series{},
		cleared:  map[string]bool{},
		pathPair: map[string]string{},
	}
	for _, n := range rec.Nodes {
		a.order = append(a.order, n.Name)
		a.nodes[n.Name] = n
		a.leaf[n.Name] = n.Labels[spec.LeafLabel]
	}
	var keys []string
	for i := range tests {
		t := &tests[i]
		s := a.series[t.Series]
		if s == nil {
			s = &series{key: t.Series, purpose: t.Purpose}
			a.series[t.Series] = s
			keys = append(keys, t.Series)
		}
		s.tests = append(s.tests, t)
		if t.State == TestDone {
			s.done = append(s.done, t)
			for _, n := range t.Lost {
				if a.lost[n] == nil {
					a.lost[n] = t
				}
			}
		}
	}
	for _, k := range keys {
		s := a.series[k]
		confirm := false
		switch s.purpose {
		case PurposeSingle:
			confirm = !spec.Repeat.NoConfirm
		case PurposeLeftover:
			// One partner only: a slow reading is checked once more
			// before a node is called network-side on it.
			confirm = true
		}
		s.dec = decide(s.done, spec.Threshold, confirm, spec.maxRepeats(), s.subject())
		switch s.purpose {
		case PurposePair:
			a.pairs = append(a.pairs, s)
			for _, n := range s.tests[0].Nodes {
				a.pairOf[n] = s
			}
		case PurposeMutual:
			for _, n := range s.tests[0].Nodes {
				a.mutualOf[n] = s
				if s.dec == decFine {
					a.cleared[n] = true
				}
			}
		}
	}
	return a
}

// intra is the node's round-1 decision ("" when it has none).
func (a *analysis) intra(node string) decision {
	if s := a.series["single:"+node]; s != nil {
		return s.dec
	}
	return ""
}

// loc is the node's round-3 series, or nil.
func (a *analysis) loc(node string) *series { return a.series["loc:"+node] }

// interEligible: round 1 let the node on to pairs. No single-node
// baseline, or no single-node run, is "untested", not failed.
func (a *analysis) interEligible(node string) bool {
	if a.lost[node] != nil {
		return false
	}
	switch a.intra(node) {
	case decFine, decTransient, decNoBaseline, "":
		return true
	}
	return false
}

// reference: a node that can vouch for a partner: not slow alone (fine,
// or no single-node baseline) and fine in a 2-node test (its round-2
// pair, with a reference, or with another suspect of its leaf), and not
// found slow since.
func (a *analysis) reference(node string) bool {
	if a.lost[node] != nil {
		return false
	}
	if d := a.intra(node); d != decFine && d != decNoBaseline {
		return false
	}
	if l := a.loc(node); l != nil {
		return l.dec == decFine
	}
	p := a.pairOf[node]
	return (p != nil && p.dec == decFine) || a.cleared[node]
}

// verified: round 3 found the node fine on the network side, with a
// reference or with another suspect of its leaf.
func (a *analysis) verified(node string) bool {
	if l := a.loc(node); l != nil {
		return l.dec == decFine || l.dec == decTransient
	}
	return a.cleared[node]
}

// crosses returns the two leaves a test between x and y crosses; ok is
// false on one leaf, or when a node's leaf is not known.
func (a *analysis) crosses(x, y string) (string, string, bool) {
	la, lb := a.leaf[x], a.leaf[y]
	return la, lb, la != "" && lb != "" && la != lb
}

// goodPaths are leaf pairs that carried a fine round-2 pair.
func (a *analysis) goodPaths() map[string]bool {
	out := map[string]bool{}
	for _, p := range a.pairs {
		if p.dec != decFine {
			continue
		}
		if la, lb, ok := a.crosses(p.tests[0].Nodes[0], p.tests[0].Nodes[1]); ok {
			out[linkKey(la, lb)] = true
		}
	}
	return out
}

// locSubjects lists, in a stable order, the nodes round 3 must test with
// a reference (members of slow pairs; nodes without a round-2 result) and
// the leaf-to-leaf paths it must probe.
func (a *analysis) locSubjects() (members, leftovers, paths []string) {
	seenPath := map[string]bool{}
	for _, p := range a.pairs {
		nodes := p.tests[0].Nodes
		switch p.dec {
		case decSlow:
			for _, n := range nodes {
				if a.lost[n] == nil {
					members = append(members, n)
				}
			}
			if la, lb, ok := a.crosses(nodes[0], nodes[1]); ok {
				k := linkKey(la, lb)
				if !seenPath[k] {
					seenPath[k] = true
					paths = append(paths, k)
					a.pathPair[k] = nodes[0]
				}
			}
		case decLost, decError:
			for _, n := range nodes {
				if a.lost[n] == nil {
					leftovers = append(leftovers, n)
				}
			}
		}
	}
	for _, n := range a.order {
		if a.interEligible(n) && a.pairOf[n] == nil {
			leftovers = append(leftovers, n)
		}
	}
	return members, leftovers, paths
}
