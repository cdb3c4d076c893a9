package burnin

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// nodeFacts is what the verdict needs to know of one node.
type nodeFacts struct {
	Name      string
	SKU       string
	Stack     baselines.Stack
	Inventory report.Inventory
	// Early reasons were found before testing (not drained).
	Early []Reason
	// Runs are the node's single-node runs, done.
	Runs []Run
}

// decision is one node's verdict with its evidence.
type decision struct {
	Verdict  Verdict
	Evidence Evidence
}

// resolver returns the SKU baseline resolution for a metric (prefetched,
// so the verdict stays a pure function).
type resolver func(metric, sku string, stack baselines.Stack) baselines.Resolution

// isPairMetric: pairs steps report their numbers under nccl.allreduce2.*
// (see pairMetrics), the name the baselines package gives 2-node runs.
func isPairMetric(m string) bool { return strings.HasPrefix(m, "nccl.allreduce2.") }

// decide applies the verdict rules to every node of a campaign.
//
//   - Every check status listed in reject_on rejects, with the check's
//     findings as the reason (error as inconclusive).
//   - A run that did not come back (unreachable, refused, timed out), a
//     requested check missing from the report, or a skip of a check the
//     suite asked for on purpose (a disruptive one) is inconclusive.
//   - A failed agent action rejects.
//   - Each compared metric's value is the median of the node's repeats. A
//     required metric without a value is inconclusive. Beyond the metric's
//     floor rejects; more than max_deviation short of the SKU baseline
//     rejects; no SKU baseline is inconclusive unless baseline.missing is
//     "peers".
//   - Among nodes of the same SKU with a value (at least outlier.min_peers
//     of them), a node more than min_shortfall below the median AND
//     further than mads median absolute deviations from it is an outlier
//     and rejected, even above every floor.
//   - Pairs: a pair run is bad when it failed, has no number, or its
//     number fails the same floor, baseline and outlier rules among pairs.
//     A node whose every pair is bad is rejected when that says it is the
//     culprit: it had two or more partners, or its partner did fine
//     elsewhere; otherwise the pair is inconclusive for both.
//   - Parts rejected in an earlier campaign are called out as repeat
//     offenders (and reject only with reject_repeat_offenders).
func decide(spec *Spec, nodes []nodeFacts, pairs []Run, resolve resolver, prior map[string][]Offence) map[string]decision {
	rejectOn := map[report.Status]bool{}
	for _, s := range spec.RejectOn {
		rejectOn[report.Status(s)] = true
	}
	expected := expectedChecks(spec.Suite)
	stepChecks := map[string][]string{}
	for _, st := range spec.Suite.Steps {
		stepChecks[st.Name] = st.Checks
	}
	out := make(map[string]decision, len(nodes))
	reasons := make(map[string][]Reason, len(nodes))
	notes := make(map[string][]string, len(nodes))
	numbers := make(map[string][]Number, len(nodes))

	for _, n := range nodes {
		rs := slices.Clone(n.Early)
		for _, r := range n.Runs {
			rs = append(rs, runReasons(r, rejectOn, expected, stepChecks[r.Step])...)
			if r.Outcome == OutcomeOK {
				// A skip of a check every GPU node answers is missing
				// data: inconclusive, never a pass.
				at := fmt.Sprintf("step %s, repeat %d", r.Step, r.Repeat)
				for _, m := range kit.MissingData(r.Result.Report, len(n.Inventory.HCAs) > 0) {
					if expected[m.Check] {
						continue // already said by reportReasons
					}
					rs = append(rs, Reason{Code: ReasonInconclusive, Step: r.Step, Check: m.Check, Message: at + ": " + m.String()})
				}
			}
		}
		reasons[n.Name] = rs
	}

	// Per-node values of the single-node metrics, and the peer groups.
	type groupKey struct{ sku, metric string }
	values := map[string]map[string][]float64{}
	groups := map[groupKey][]float64{}
	for _, n := range nodes {
		vals := map[string][]float64{}
		for _, r := range n.Runs {
			for k, v := range r.Result.Metrics {
				if finite(v) && !isPairMetric(k) {
					vals[k] = append(vals[k], v)
				}
			}
		}
		values[n.Name] = vals
		for _, m := range spec.Metrics {
			if isPairMetric(m.Name) {
				continue
			}
			if s := vals[m.Name]; len(s) > 0 {
				k := groupKey{n.SKU, m.Name}
				groups[k] = append(groups[k], median(s))
			}
		}
	}
	type peerStat struct {
		med, mad float64
		n        int
	}
	stats := map[groupKey]peerStat{}
	for k, vs := range groups {
		m := median(vs)
		stats[k] = peerStat{med: m, mad: mad(vs, m), n: len(vs)}
	}

	for _, n := range nodes {
		for _, m := range spec.Metrics {
			if isPairMetric(m.Name) {
				continue
			}
			samples := values[n.Name][m.Name]
			if len(samples) == 0 {
				if m.Required && len(n.Early) == 0 {
					reasons[n.Name] = append(reasons[n.Name], Reason{Code: ReasonInconclusive, Metric: m.Name,
						Message: fmt.Sprintf("no %s measured", m.Name)})
				}
				continue
			}
			num := Number{Metric: m.Name, Direction: m.Direction, Value: median(samples), Samples: samples}
			ps := stats[groupKey{n.SKU, m.Name}]
			var rs []Reason
			var ns []string
			num, rs, ns = judgeNumber(spec, m, num, ps.med, ps.mad, ps.n, resolve(m.Name, n.SKU, n.Stack), n.Stack)
			reasons[n.Name] = append(reasons[n.Name], rs...)
			notes[n.Name] = append(notes[n.Name], ns...)
			numbers[n.Name] = append(numbers[n.Name], num)
		}
	}

	if len(pairs) > 0 {
		skuOf := map[string]string{}
		stackOf := map[string]baselines.Stack{}
		for _, n := range nodes {
			skuOf[n.Name], stackOf[n.Name] = n.SKU, n.Stack
		}
		pr, pn, pnotes := judgePairs(spec, pairs, skuOf, stackOf, rejectOn, resolve)
		for node, rs := range pr {
			reasons[node] = append(reasons[node], rs...)
		}
		for node, ns := range pn {
			numbers[node] = append(numbers[node], ns...)
		}
		for node, ns := range pnotes {
			notes[node] = append(notes[node], ns...)
		}
	}

	for _, n := range nodes {
		rs := reasons[n.Name]
		parts := nodeParts(n.Name, n.Inventory)
		var offences []Offence
		for _, p := range parts {
			for _, o := range prior[p.Identity] {
				o.Part = p
				offences = append(offences, o)
			}
		}
		if len(offences) > 0 && spec.RejectRepeatOffenders {
			for _, o := range offences {
				rs = append(rs, Reason{Code: ReasonRepeat, Component: o.Part.Component,
					Message: fmt.Sprintf("%s %s (%s %s) was rejected in campaign %s on %s: %s",
						o.Part.Kind, o.Part.Component, o.Part.IdentityKind, o.Part.Identity, o.Campaign, o.Node, o.Reason)})
			}
		}
		v := Accepted
		if len(rs) > 0 {
			v = Rejected
			implicate(parts, rs)
		}
		if rs == nil {
			rs = []Reason{}
		}
		out[n.Name] = decision{Verdict: v, Evidence: Evidence{
			Reasons: rs, Numbers: nonNilNumbers(numbers[n.Name]), Parts: parts,
			RepeatOffenders: offences, Notes: dedupe(notes[n.Name]),
		}}
	}
	return out
}

func nonNilNumbers(n []Number) []Number {
	if n == nil {
		return []Number{}
	}
	return n
}

func dedupe(s []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// expectedChecks are checks the suite asks for on purpose, whose skip
// means missing data: every check of a checks step that is not passive.
func expectedChecks(su *Suite) map[string]bool {
	passive := map[string]bool{}
	for _, c := range PassiveChecks() {
		passive[c] = true
	}
	out := map[string]bool{}
	for _, st := range su.Steps {
		if st.Kind == StepPairs {
			continue
		}
		for _, c := range st.Checks {
			if !passive[c] {
				out[c] = true
			}
		}
	}
	return out
}

// runReasons reads one single-node run.
func runReasons(r Run, rejectOn map[report.Status]bool, expected map[string]bool, requested []string) []Reason {
	var out []Reason
	at := fmt.Sprintf("step %s, repeat %d", r.Step, r.Repeat)
	if r.Outcome != OutcomeOK {
		return []Reason{{Code: ReasonInconclusive, Step: r.Step,
			Message: fmt.Sprintf("%s did not run: %s: %s", at, r.Outcome, r.Error)}}
	}
	if a := r.Result.Action; a != nil && !a.OK {
		msg := a.Message
		if msg == "" {
			msg = "the action reported failure"
		}
		out = append(out, Reason{Code: ReasonActionFailed, Step: r.Step, Message: fmt.Sprintf("%s: %s", at, msg)})
	}
	if rep := r.Result.Report; rep != nil {
		out = append(out, reportReasons(rep, at, r.Step, rejectOn, expected, requested)...)
	}
	for _, s := range r.Result.Samples {
		if s.Error != "" {
			continue // a missed sample is not evidence either way
		}
		if rejectOn[s.Status] && s.Status != report.Error {
			for _, f := range s.Findings {
				out = append(out, Reason{Code: ReasonCheckFailed, Step: r.Step, Component: f.Component,
					Message: fmt.Sprintf("%s, during the action at %s: %s %s: %s", at, s.At.UTC().Format("15:04:05"), f.Code, f.Component, f.Message)})
			}
			if len(s.Findings) == 0 {
				out = append(out, Reason{Code: ReasonCheckFailed, Step: r.Step,
					Message: fmt.Sprintf("%s, during the action: sampled checks %s", at, s.Status)})
			}
		}
	}
	return out
}

// reportReasons turns a report's check results into reasons.
func reportReasons(rep *report.Report, at, step string, rejectOn map[report.Status]bool, expected map[string]bool, requested []string) []Reason {
	var out []Reason
	for _, c := range rep.Checks {
		switch {
		case c.Status == report.Error:
			why := c.Reason
			if why == "" {
				why = "the check could not decide"
			}
			out = append(out, Reason{Code: ReasonInconclusive, Step: step, Check: c.Name,
				Message: fmt.Sprintf("%s: %s error: %s", at, c.Name, why)})
		case c.Status == report.Skip && expected[c.Name]:
			out = append(out, Reason{Code: ReasonInconclusive, Step: step, Check: c.Name,
				Message: fmt.Sprintf("%s: %s skipped where data was expected: %s", at, c.Name, c.Reason)})
		case rejectOn[c.Status] && (c.Status == report.Fail || c.Status == report.Warn):
			if len(c.Findings) == 0 {
				out = append(out, Reason{Code: ReasonCheckFailed, Step: step, Check: c.Name,
					Message: fmt.Sprintf("%s: %s %s", at, c.Name, c.Status)})
			}
			for _, f := range c.Findings {
				if f.Severity == report.SevWarn && c.Status == report.Fail && !rejectOn[report.Warn] {
					continue
				}
				out = append(out, Reason{Code: ReasonCheckFailed, Step: step, Check: c.Name, Component: f.Component,
					Message: fmt.Sprintf("%s: %s %s: %s %s: %s", at, c.Name, c.Status, f.Code, f.Component, f.Message)})
			}
		}
	}
	for _, name := range requested {
		if rep.Check(name) == nil {
			out = append(out, Reason{Code: ReasonInconclusive, Step: step, Check: name,
				Message: fmt.Sprintf("%s: %s missing from the report", at, name)})
		}
	}
	return out
}

// judgeNumber compares one node's value with the floor, the SKU baseline
// and the campaign's peers.
func judgeNumber(spec *Spec, m Metric, num Number, med, madv float64, peers int, res baselines.Resolution, stack baselines.Stack) (Number, []Reason, []string) {
	what := "identical nodes"
	if num.Pair != "" {
		what = "pairs of identical nodes"
	}
	var rs []Reason
	var notes []string
	if worseThanFloor(num.Value, m.Floor, m.Direction) {
		num.BelowFloor = true
		rs = append(rs, Reason{Code: ReasonBelowFloor, Metric: m.Name,
			Message: fmt.Sprintf("%s %s is beyond the floor %s", m.Name, fnum(num.Value), fnum(m.Floor))})
	}
	cmp := baselines.CompareResolved(res, num.Value, stack, baselines.CompareOptions{Threshold: spec.Baseline.MaxDeviation})
	num.BaselineVerdict = string(cmp.Verdict)
	num.BaselineNote = cmp.Reason
	if res.Baseline != nil {
		num.Baseline = res.Baseline.Value
		num.BaselineScope = string(res.Scope)
		num.BaselineVersion = res.Baseline.Version
		num.Deviation = cmp.Deviation
	}
	notes = append(notes, cmp.Warnings...)
	switch cmp.Verdict {
	case baselines.Fail:
		rs = append(rs, Reason{Code: ReasonBelowBaseline, Metric: m.Name, Message: cmp.Reason})
	case baselines.Inconclusive:
		// Only a required number needs a baseline; an optional one is
		// compared with what exists.
		if m.Required && spec.Baseline.Missing == MissingReject {
			rs = append(rs, Reason{Code: ReasonInconclusive, Metric: m.Name,
				Message: fmt.Sprintf("%s: no usable SKU baseline (%s); set baseline.missing: peers to let peers decide", m.Name, cmp.Reason)})
		} else {
			notes = append(notes, fmt.Sprintf("%s: no usable SKU baseline (%s); judged against peers only", m.Name, cmp.Reason))
		}
	}
	num.Peers = peers
	if peers > 0 && finite(med) {
		num.CampaignMedian, num.MAD = med, madv
		num.MedianShortfall = shortfall(num.Value, med, m.Direction)
	}
	if peers >= spec.Outlier.MinPeers && finite(med) {
		if spec.Outlier.outlier(num.Value, med, madv, m.Direction) {
			num.Outlier = true
			rs = append(rs, Reason{Code: ReasonPeerOutlier, Metric: m.Name,
				Message: fmt.Sprintf("%s %s is %s below the campaign median %s of %d %s and %s from it (limits %s and %g MADs)",
					m.Name, fnum(num.Value), pct(num.MedianShortfall), fnum(med), peers, what, madText(math.Abs(num.Value-med), madv), pct(spec.Outlier.MinShortfall), spec.Outlier.MADs)})
		}
	} else {
		notes = append(notes, fmt.Sprintf("%s: %d %s measured, fewer than outlier.min_peers %d: peers not compared", m.Name, peers, what, spec.Outlier.MinPeers))
		if m.Required && cmp.Verdict == baselines.Inconclusive && spec.Baseline.Missing == MissingPeers {
			rs = append(rs, Reason{Code: ReasonInconclusive, Metric: m.Name,
				Message: fmt.Sprintf("%s %s compared with nothing: no SKU baseline and %d peer(s), fewer than %d", m.Name, fnum(num.Value), peers, spec.Outlier.MinPeers)})
		}
	}
	return num, rs, notes
}

// madText says how far a value is from the median in MADs; a MAD of 0
// (the others all measured the same) has no finite ratio.
func madText(dist, madv float64) string {
	if madv == 0 {
		return "the others all measured the same (MAD 0)"
	}
	return strconv.FormatFloat(dist/madv, 'f', 1, 64) + " MADs"
}

// judgePairs applies the pair rules; it returns reasons, numbers and notes
// by node.
func judgePairs(spec *Spec, pairs []Run, skuOf map[string]string, stackOf map[string]baselines.Stack,
	rejectOn map[report.Status]bool, resolve resolver) (map[string][]Reason, map[string][]Number, map[string][]string) {
	reasons := map[string][]Reason{}
	numbers := map[string][]Number{}
	notes := map[string][]string{}
	type pairEval struct {
		run  Run
		bad  bool
		why  []string
		vals map[string]float64
	}
	evals := make([]*pairEval, 0, len(pairs))
	for _, r := range pairs {
		pe := &pairEval{run: r, vals: map[string]float64{}}
		if r.Outcome != OutcomeOK {
			pe.bad = true
			pe.why = append(pe.why, fmt.Sprintf("did not run: %s: %s", r.Outcome, r.Error))
		} else if rep := r.Result.Report; rep != nil {
			for _, c := range rep.Checks {
				if rejectOn[c.Status] {
					pe.bad = true
					w := fmt.Sprintf("%s %s", c.Name, c.Status)
					if len(c.Findings) > 0 {
						w += ": " + c.Findings[0].Code + " " + c.Findings[0].Message
					} else if c.Reason != "" {
						w += ": " + c.Reason
					}
					pe.why = append(pe.why, w)
				}
			}
		}
		for k, v := range r.Result.Metrics {
			if isPairMetric(k) && finite(v) {
				pe.vals[k] = v
			}
		}
		evals = append(evals, pe)
	}
	// Peer statistics among pairs of the same SKU (the launcher's).
	type gk struct{ sku, metric string }
	groups := map[gk][]float64{}
	for _, pe := range evals {
		for k, v := range pe.vals {
			g := gk{skuOf[pe.run.Node], k}
			groups[g] = append(groups[g], v)
		}
	}
	for _, m := range spec.Metrics {
		if !isPairMetric(m.Name) {
			continue
		}
		for _, pe := range evals {
			v, ok := pe.vals[m.Name]
			if !ok {
				if m.Required && pe.run.Outcome == OutcomeOK {
					pe.bad = true
					pe.why = append(pe.why, "no "+m.Name+" measured")
				}
				continue
			}
			sku := skuOf[pe.run.Node]
			vs := groups[gk{sku, m.Name}]
			med := median(vs)
			num := Number{Metric: m.Name, Direction: m.Direction, Value: v, Samples: []float64{v}, Pair: pairID(pe.run)}
			stack := stackOf[pe.run.Node]
			res := resolve(m.Name, sku, stack)
			num, rs, ns := judgeNumber(spec, m, num, med, mad(vs, med), len(vs), res, stack)
			if len(rs) > 0 {
				// The full comparison is in the numbers; the reason stays short.
				var codes []string
				for _, r := range rs {
					codes = append(codes, r.Code)
				}
				pe.bad = true
				pe.why = append(pe.why, fmt.Sprintf("%s %s (%s)", m.Name, fnum(v), strings.Join(codes, ", ")))
			}
			for _, member := range pe.run.Members() {
				numbers[member] = append(numbers[member], num)
				notes[member] = append(notes[member], ns...)
			}
		}
	}
	byNode := map[string][]*pairEval{}
	for _, pe := range evals {
		for _, member := range pe.run.Members() {
			byNode[member] = append(byNode[member], pe)
		}
	}
	hasGood := func(node string) bool {
		for _, pe := range byNode[node] {
			if !pe.bad {
				return true
			}
		}
		return false
	}
	for node, list := range byNode {
		if hasGood(node) {
			continue
		}
		partners := map[string]bool{}
		for _, pe := range list {
			for _, m := range pe.run.Members() {
				if m != node {
					partners[m] = true
				}
			}
		}
		culprit := len(partners) >= 2
		for p := range partners {
			if hasGood(p) {
				culprit = true
			}
		}
		var why []string
		for _, pe := range list {
			why = append(why, fmt.Sprintf("with %s (round %d, repeat %d): %s", strings.Join(others(pe.run.Members(), node), ","), pe.run.Round, pe.run.Repeat, strings.Join(pe.why, "; ")))
		}
		sort.Strings(why)
		if culprit {
			reasons[node] = append(reasons[node], Reason{Code: ReasonPairSlow, Metric: MetricPairBusBW,
				Message: fmt.Sprintf("every 2-node run with %d partner(s) was bad: %s", len(partners), strings.Join(why, " | "))})
		} else {
			reasons[node] = append(reasons[node], Reason{Code: ReasonInconclusive, Metric: MetricPairBusBW,
				Message: "2-node runs were bad and no other partner tells which node is at fault: " + strings.Join(why, " | ")})
		}
	}
	return reasons, numbers, notes
}

// pairID names one pair run: its nodes, round and repeat.
func pairID(r Run) string {
	return fmt.Sprintf("%s round %d repeat %d", strings.Join(r.Members(), "+"), r.Round, r.Repeat)
}

func others(members []string, self string) []string {
	var out []string
	for _, m := range members {
		if m != self {
			out = append(out, m)
		}
	}
	return out
}

// nodeParts lists the node's GPUs and HCAs by identity. A GPU is known by
// its serial, else its UUID, else its slot; the report's inventory carries
// no HCA serial, so an HCA is known by its slot (node and device name),
// with model and firmware recorded beside it.
func nodeParts(node string, inv report.Inventory) []Part {
	var out []Part
	for _, g := range inv.GPUs {
		comp := "GPU" + strconv.Itoa(g.Index)
		p := Part{Kind: "gpu", Component: comp, Model: g.Name, Firmware: g.VBIOSVersion, PCIBusID: g.PCIBusID}
		switch {
		case usableSerial(g.Serial):
			p.Identity, p.IdentityKind = "gpu-serial:"+strings.TrimSpace(g.Serial), "serial"
		case usableSerial(g.UUID):
			p.Identity, p.IdentityKind = "gpu-uuid:"+strings.TrimSpace(g.UUID), "uuid"
		default:
			p.Identity, p.IdentityKind = "gpu-slot:"+node+"/"+comp, "slot"
		}
		out = append(out, p)
	}
	for _, h := range inv.HCAs {
		out = append(out, Part{Kind: "hca", Component: h.Name, Model: h.Model, Firmware: h.FWVersion,
			Identity: "hca-slot:" + node + "/" + h.Name, IdentityKind: "slot"})
	}
	if out == nil {
		out = []Part{}
	}
	return out
}

// usableSerial refuses the placeholders tools print for "unknown".
func usableSerial(s string) bool {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "", "n/a", "[n/a]", "0", "none", "unknown", "not supported", "[not supported]":
		return false
	}
	return true
}

// implicate marks the parts a rejection points at: only those a reason
// names by its component (a finding about that GPU or HCA port). A reason
// about no part (a slow node, an outlier, a slow pair) or an inconclusive
// step implicates nothing: marking every part would make healthy parts
// repeat offenders in their next node.
func implicate(parts []Part, rs []Reason) {
	for _, r := range rs {
		if r.Code == ReasonRepeat || r.Code == ReasonInconclusive {
			continue
		}
		if i := partIndex(parts, r.Component); i >= 0 {
			parts[i].Implicated = true
		}
	}
}

// partIndex finds a finding's component among the parts: GPU<i>, an HCA
// name, or an HCA port "mlx5_4/1".
func partIndex(parts []Part, comp string) int {
	if comp == "" || comp == "node" {
		return -1
	}
	hca, _, _ := strings.Cut(comp, "/")
	for i, p := range parts {
		if p.Component == comp || (p.Kind == "hca" && p.Component == hca) {
			return i
		}
	}
	return -1
}

func fnum(v float64) string { return strconv.FormatFloat(v, 'g', 5, 64) }

func pct(f float64) string {
	s := strconv.FormatFloat(f*100, 'f', 1, 64)
	return strings.TrimSuffix(s, ".0") + "%"
}
