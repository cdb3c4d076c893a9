package sweep

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Kind is a verdict: what the sweep concluded about a node, a pair or a
// leaf-to-leaf path that is not simply fine.
type Kind string

const (
	// GPUSide: slow alone (NVLink, a GPU), confirmed by a repeat.
	GPUSide Kind = "gpu-side"
	// NetworkSide: fine alone, slow with every partner (its HCA, cable or
	// port).
	NetworkSide Kind = "network-side"
	// Link: only pairs across one leaf-to-leaf path are slow.
	Link Kind = "link"
	// Transient: slow once, fine on repeat.
	Transient Kind = "transient"
	// Inconclusive: the sweep could not decide (no baseline, errors, no
	// reference free, too close to call).
	Inconclusive Kind = "inconclusive"
	// Unreachable: the node's agent was gone (at the start or mid-sweep).
	Unreachable Kind = "unreachable"
)

// Subject kinds.
const (
	SubjectNode = "node"
	SubjectPair = "pair" // two nodes: a transient or undecided slow pair
	SubjectLink = "link" // two leaves
)

// Verdict is one conclusion with the runs it rests on.
type Verdict struct {
	// Subject is a node, "A|B" for a pair, "LEAF|LEAF" for a link.
	Subject     string `json:"subject"`
	SubjectKind string `json:"subject_kind"`
	Verdict     Kind   `json:"verdict"`
	// Deviation is the median shortfall below baseline (a fraction) of the
	// slow readings that decided it; 0 when none did.
	Deviation float64  `json:"deviation"`
	Threshold float64  `json:"threshold"`
	Nodes     []string `json:"nodes,omitempty"`
	Leaves    []string `json:"leaves,omitempty"`
	Reason    string   `json:"reason"`
	// Evidence lists the tests, oldest first.
	Evidence []Evidence  `json:"evidence"`
	Drain    *DrainState `json:"drain,omitempty"`
}

// Evidence is one test as a verdict cites it.
type Evidence struct {
	Test      int       `json:"test"` // TestRecord.Seq
	Round     int       `json:"round"`
	Wave      int       `json:"wave"`
	Purpose   Purpose   `json:"purpose"`
	Nodes     []string  `json:"nodes"`
	Outcome   Outcome   `json:"outcome"`
	GBps      float64   `json:"gbps,omitempty"`
	Baseline  float64   `json:"baseline_gbps,omitempty"`
	Scope     string    `json:"baseline_scope,omitempty"`
	Deviation float64   `json:"deviation,omitempty"`
	Error     string    `json:"error,omitempty"`
	At        time.Time `json:"at,omitzero"`
}

// RoundSummary is one round as run.
type RoundSummary struct {
	Round     int       `json:"round"`
	Phase     Phase     `json:"phase"`
	Waves     int       `json:"waves"` // 1 + repeat waves
	Tests     int       `json:"tests"`
	Started   time.Time `json:"started,omitzero"`
	Ended     time.Time `json:"ended,omitzero"`
	DurationS float64   `json:"duration_s"`
}

// Report is a sweep's result. Times are on the campaign clock.
type Report struct {
	ID        string    `json:"id"`
	Spec      Spec      `json:"spec"`
	State     State     `json:"state"`
	Error     string    `json:"error,omitempty"`
	Started   time.Time `json:"started"`
	Ended     time.Time `json:"ended,omitzero"`
	DurationS float64   `json:"duration_s"`

	Rounds      []RoundSummary `json:"rounds"`
	RoundCount  int            `json:"round_count"`
	RepeatWaves int            `json:"repeat_waves"`
	// AllReduceRuns counts all_reduce runs started (single and multi-node,
	// failed ones and re-runs after a restart included).
	AllReduceRuns int `json:"allreduce_runs"`
	SingleRuns    int `json:"single_runs"`
	PairRuns      int `json:"pair_runs"`

	Tested   int           `json:"tested"` // nodes selected for testing
	Passed   []string      `json:"passed"`
	Verdicts []Verdict     `json:"verdicts"`
	Counts   map[Kind]int  `json:"counts"`
	Skipped  []Skip        `json:"skipped"`
	Coverage Coverage      `json:"coverage"`
	Drains   []DrainRecord `json:"drains,omitempty"`
	Progress *Progress     `json:"progress,omitempty"` // while running
	// Incomplete, on a done sweep, says why it could not test: no node
	// was measured (every one unreachable, skipped or in error). Such a
	// sweep is no evidence of a healthy fleet.
	Incomplete string `json:"incomplete,omitempty"`
}

// Progress is where a running sweep stands.
type Progress struct {
	ID         string `json:"id"`
	State      State  `json:"state"`
	Phase      Phase  `json:"phase"`
	Round      int    `json:"round"` // the round running, or the last one run once done
	Wave       int    `json:"wave"`
	WaveDone   int    `json:"wave_done"`
	WaveTotal  int    `json:"wave_total"`
	Singles    int    `json:"singles_done"`
	SinglesAll int    `json:"singles_total"`
	Pairs      int    `json:"pairs_done"` // every multi-node test, rounds 2 and 3
	PairsAll   int    `json:"pairs_total"`
	Nodes      int    `json:"nodes"`
	// Waiting says what the sweep waits for: agents not connected yet,
	// within the connect grace (before the first round, or when a test's
	// turn comes, as after a coordinator restart).
	Waiting string `json:"waiting,omitempty"`
	// Incomplete: as Report.Incomplete, for a done sweep.
	Incomplete string `json:"incomplete,omitempty"`
}

func evidenceOf(t *TestRecord) Evidence {
	e := Evidence{
		Test: t.Seq, Round: t.Phase.Round(), Wave: t.Wave, Purpose: t.Purpose,
		Nodes: slices.Clone(t.Nodes), Outcome: t.Outcome, GBps: t.GBps,
		Deviation: t.Deviation, Error: t.Error, At: t.Ended,
	}
	if t.Baseline != nil {
		e.Baseline, e.Scope = t.Baseline.GBps, t.Baseline.Scope
	}
	return e
}

// slowDeviation is the median deviation of the slow and near readings.
func slowDeviation(ts []*TestRecord) float64 {
	var d []float64
	for _, t := range ts {
		if t.Outcome == OutSlow || t.Outcome == OutNear {
			d = append(d, t.Deviation)
		}
	}
	return median(d)
}

func lastError(ts []*TestRecord) string {
	for i := len(ts) - 1; i >= 0; i-- {
		if ts[i].Error != "" {
			return ts[i].Error
		}
	}
	return ""
}

// nodeCall is a node's verdict in the making.
type nodeCall struct {
	kind     Kind // "" = pass
	reason   string
	evidence []*TestRecord
	dev      float64
}

// rank orders kinds: the worst call about a node wins.
func rank(k Kind) int {
	switch k {
	case Unreachable:
		return 6
	case GPUSide:
		return 5
	case NetworkSide:
		return 4
	case Inconclusive:
		return 3
	case Transient:
		return 2
	}
	return 0
}

func (c *nodeCall) raise(k Kind, reason string, dev float64, ev ...*TestRecord) {
	if rank(k) > rank(c.kind) {
		c.kind, c.reason, c.dev = k, reason, dev
		c.evidence = append(slices.Clone(ev), c.evidence...)
		return
	}
	c.evidence = append(c.evidence, ev...)
}

// buildVerdicts turns the analysis into verdicts, the nodes that passed,
// and the nodes skipped mid-sweep.
func buildVerdicts(rec *Record, a *analysis) ([]Verdict, []string, []Skip) {
	thr := a.spec.Threshold
	var verdicts []Verdict
	var passed []string
	var skipped []Skip
	for _, n := range rec.Unreachable {
		verdicts = append(verdicts, Verdict{Subject: n, SubjectKind: SubjectNode, Verdict: Unreachable,
			Threshold: thr, Nodes: []string{n}, Reason: fmt.Sprintf("agent not connected: waited %v after the sweep started; not tested", rec.Spec.connectGrace()), Evidence: []Evidence{}})
	}
	for _, n := range a.order {
		if t := a.lost[n]; t != nil {
			if t.Outcome == OutRefused {
				skipped = append(skipped, Skip{Node: n, Reason: "agent refused disruptive tests mid-sweep: " + t.Error})
				continue
			}
			reason := "agent disconnected during test " + fmt.Sprint(t.Seq)
			if t.NotRun {
				reason = t.Error
			}
			verdicts = append(verdicts, Verdict{Subject: n, SubjectKind: SubjectNode, Verdict: Unreachable,
				Threshold: thr, Nodes: []string{n}, Reason: reason, Evidence: []Evidence{evidenceOf(t)}})
			continue
		}
		c := a.callNode(n)
		if c.kind == "" {
			passed = append(passed, n)
			continue
		}
		v := Verdict{Subject: n, SubjectKind: SubjectNode, Verdict: c.kind, Deviation: c.dev, Threshold: thr,
			Nodes: []string{n}, Reason: c.reason}
		if l := a.leaf[n]; l != "" {
			v.Leaves = []string{l}
		}
		v.Evidence = evidenceList(c.evidence)
		verdicts = append(verdicts, v)
	}
	verdicts = append(verdicts, a.pathVerdicts()...)
	return verdicts, passed, skipped
}

func evidenceList(ts []*TestRecord) []Evidence {
	seen := map[int]bool{}
	var sorted []*TestRecord
	for _, t := range ts {
		if !seen[t.Seq] {
			seen[t.Seq] = true
			sorted = append(sorted, t)
		}
	}
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Seq < sorted[j].Seq })
	out := make([]Evidence, len(sorted))
	for i, t := range sorted {
		out[i] = evidenceOf(t)
	}
	return out
}

// callNode decides one node that was neither lost nor skipped.
func (a *analysis) callNode(n string) nodeCall {
	var c nodeCall
	reps := a.spec.maxRepeats()
	if s := a.series["single:"+n]; s != nil {
		switch s.dec {
		case decSlow:
			d := slowDeviation(s.done)
			c.raise(GPUSide, fmt.Sprintf("single-node all_reduce %s below baseline in %s: slow alone (NVLink or a GPU)",
				pctText(d), runsText(s.done)), d, s.done...)
			return c
		case decTransient:
			c.raise(Transient, "single-node all_reduce slow once, fine on repeat", slowDeviation(s.done), s.done...)
		case decError:
			c.raise(Inconclusive, "single-node all_reduce gave no usable result: "+lastError(s.done), 0, s.done...)
			return c
		case decNoBaseline:
			c.raise(Inconclusive, "no single-node baseline (node or SKU): "+lastError(s.done), 0, s.done...)
		case decPending:
			c.raise(Inconclusive, fmt.Sprintf("single-node all_reduce still too close to the threshold after %d runs", len(s.done)), 0, s.done...)
			return c
		}
	}
	if !a.interEligible(n) {
		return c
	}
	p := a.pairOf[n]
	var pairTests []*TestRecord
	if p != nil {
		pairTests = p.done
	}
	if m := a.mutualOf[n]; m != nil {
		pairTests = append(slices.Clone(pairTests), m.done...)
	}
	if l := a.loc(n); l != nil {
		ev := append(slices.Clone(pairTests), l.done...)
		switch l.dec {
		case decSlow:
			d := slowDeviation(ev)
			partners := 0
			seen := map[string]bool{}
			for _, t := range ev {
				for _, m := range t.Nodes {
					if m != n && !seen[m] && (t.Outcome == OutSlow || t.Outcome == OutNear) {
						seen[m] = true
						partners++
					}
				}
			}
			why := fmt.Sprintf("fine alone, 2-node all_reduce %s below baseline with %d partner(s) (%s), the last a reference that passed: its HCA, cable or port",
				pctText(d), partners, runsText(ev))
			if cross := l.done[len(l.done)-1].Cross; cross != "" {
				why += "; no reference on its leaf, so the test crossed path " + cross
			}
			c.raise(NetworkSide, why, d, ev...)
		case decTransient:
			c.raise(Transient, "2-node all_reduce with a reference slow once, fine on repeat", slowDeviation(ev), ev...)
		case decFine:
		case decPending:
			c.raise(Inconclusive, fmt.Sprintf("2-node all_reduce with a reference still too close to the threshold after %d runs", len(l.done)), 0, ev...)
		default:
			c.raise(Inconclusive, "2-node all_reduce with a reference gave no usable result: "+lastError(l.done), 0, ev...)
		}
		return c
	}
	if a.cleared[n] {
		return c // fine with another suspect of its leaf
	}
	switch {
	case a.mutualOf[n] != nil:
		c.raise(Inconclusive, "slow with another suspect of its leaf, and no reference was free to tell which", 0, pairTests...)
	case p == nil || p.dec == decLost || p.dec == decError:
		c.raise(Inconclusive, "no 2-node test: no reference node was free to pair with", 0, pairTests...)
	case p.dec == decSlow:
		c.raise(Inconclusive, "in a slow pair, but no reference node was free to localise against", 0, pairTests...)
	case p.dec == decNoBaseline:
		c.raise(Inconclusive, "no 2-node baseline (link or SKU): "+lastError(pairTests), 0, pairTests...)
	case p.dec == decPending:
		c.raise(Inconclusive, fmt.Sprintf("2-node all_reduce still too close to the threshold after %d runs (max %d repeats)", len(pairTests), reps), 0, pairTests...)
	}
	return c
}

// memberEvidence is what round 3 found about a node: its tests with a
// reference or with another suspect.
func (a *analysis) memberEvidence(n string) []*TestRecord {
	var ev []*TestRecord
	if m := a.mutualOf[n]; m != nil {
		ev = append(ev, m.done...)
	}
	if l := a.loc(n); l != nil {
		ev = append(ev, l.done...)
	}
	return ev
}

// pathVerdicts calls leaf-to-leaf paths (links) and slow pairs that no
// node explains. A path is a link when a probe across it (two references)
// is slow, or when two or more slow pairs across it share no node and
// every member was fine on its own leaf.
func (a *analysis) pathVerdicts() []Verdict {
	thr := a.spec.Threshold
	type pathCall struct {
		clean []*series // slow pairs across it whose members were all verified
		ev    []*TestRecord
	}
	paths := map[string]*pathCall{}
	var order []string
	for _, p := range a.pairs {
		if p.dec != decSlow {
			continue
		}
		ns := p.tests[0].Nodes
		la, lb, cross := a.crosses(ns[0], ns[1])
		clean := true
		var memberEv []*TestRecord
		for _, n := range ns {
			clean = clean && a.lost[n] == nil && a.verified(n)
			memberEv = append(memberEv, a.memberEvidence(n)...)
		}
		k := linkKey(la, lb)
		if cross {
			pc := paths[k]
			if pc == nil {
				pc = &pathCall{}
				paths[k] = pc
				order = append(order, k)
			}
			if clean {
				pc.clean = append(pc.clean, p)
				pc.ev = append(append(pc.ev, p.done...), memberEv...)
			}
		}
	}
	var out []Verdict
	for _, k := range order {
		pc := paths[k]
		la, lb := splitKey(k)
		probe := a.series["path:"+k]
		probeSlow := probe != nil && probe.dec == decSlow
		if probeSlow || len(pc.clean) >= 2 {
			ev := slices.Clone(pc.ev)
			var slowTests []*TestRecord
			var pairNames []string
			for _, p := range pc.clean {
				slowTests = append(slowTests, p.done...)
				pairNames = append(pairNames, p.key[len("pair:"):])
			}
			if probe != nil {
				ev = append(ev, probe.done...)
				if probeSlow {
					slowTests = append(slowTests, probe.done...)
				}
			}
			d := slowDeviation(slowTests)
			reason := fmt.Sprintf("2-node all_reduce across %s %s below baseline for pairs that share no node (%s)", k, pctText(d), runsText(slowTests))
			if len(pairNames) > 0 {
				reason += "; nodes of slow pair(s) " + strings.Join(pairNames, ", ") + " fine on their own leaves"
			}
			if probe != nil && !probeSlow {
				reason += "; a probe across it was fine: the path is slow for some flows only"
			}
			nodes := map[string]bool{}
			for _, t := range slowTests {
				for _, n := range t.Nodes {
					nodes[n] = true
				}
			}
			out = append(out, Verdict{Subject: k, SubjectKind: SubjectLink, Verdict: Link, Deviation: d, Threshold: thr,
				Nodes: sortedKeys(nodes), Leaves: []string{la, lb}, Reason: reason, Evidence: evidenceList(ev)})
			continue
		}
		for _, p := range pc.clean {
			out = append(out, a.pairVerdict(p, probe))
		}
	}
	// Slow pairs within one leaf (or of unknown leaves), both nodes fine
	// since: transient.
	for _, p := range a.pairs {
		ns := p.tests[0].Nodes
		if _, _, cross := a.crosses(ns[0], ns[1]); p.dec != decSlow || cross {
			continue
		}
		if a.lost[ns[0]] == nil && a.lost[ns[1]] == nil && a.verified(ns[0]) && a.verified(ns[1]) {
			out = append(out, a.pairVerdict(p, nil))
		}
	}
	return out
}

// pairVerdict calls a slow pair whose nodes were both fine in round 3:
// transient when its path (if any) was fine in a probe, else
// inconclusive.
func (a *analysis) pairVerdict(p *series, probe *series) Verdict {
	ns := p.tests[0].Nodes
	la, lb, cross := a.crosses(ns[0], ns[1])
	ev := append(append(slices.Clone(p.done), a.memberEvidence(ns[0])...), a.memberEvidence(ns[1])...)
	if probe != nil {
		ev = append(ev, probe.done...)
	}
	v := Verdict{Subject: linkKey(ns[0], ns[1]), SubjectKind: SubjectPair, Threshold: a.spec.Threshold,
		Nodes: []string{ns[0], ns[1]}, Leaves: uniqSorted(slices.DeleteFunc([]string{la, lb}, func(l string) bool { return l == "" })), Evidence: evidenceList(ev)}
	switch {
	case !cross:
		v.Verdict, v.Deviation = Transient, slowDeviation(p.done)
		v.Reason = "pair slow once; both nodes fine since"
	case probe != nil && probe.dec == decFine:
		v.Verdict, v.Deviation = Transient, slowDeviation(p.done)
		v.Reason = "pair slow once; both nodes fine on their own leaves, and the path " + linkKey(la, lb) + " fine in a probe"
	default:
		v.Verdict = Inconclusive
		v.Reason = "pair slow, both nodes fine on their own leaves, but the path " + linkKey(la, lb) + " could not be probed"
		if probe != nil {
			v.Reason += ": " + lastError(probe.done)
		}
	}
	return v
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func uniqSorted(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return slices.Compact(s)
}

func pctText(d float64) string { return fmt.Sprintf("%.1f%%", d*100) }

// runsText counts slow readings: "2 of 2 runs".
func runsText(ts []*TestRecord) string {
	slow := 0
	for _, t := range ts {
		if t.Outcome == OutSlow || t.Outcome == OutNear {
			slow++
		}
	}
	return fmt.Sprintf("%d of %d runs slow or near the limit", slow, len(ts))
}
