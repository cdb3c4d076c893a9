package rollout

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// Inspection outcomes. Inconclusive is never a pass: the rollout pauses.
const (
	outcomePass         = "pass"
	outcomeFail         = "fail"
	outcomeInconclusive = "inconclusive"
)

type judgement struct {
	outcome  string
	summary  string
	evidence []string
}

// judgeReport decides a post-upgrade inspection:
//
//   - the report's driver must be the target (else fail; unknown is
//     inconclusive);
//   - every requested check must have answered: a fail fails; an error, a
//     missing result, or a skip of a required check or of one that ran
//     before the upgrade is inconclusive; pass and warn pass;
//   - the NCCL metric is compared with the node's pre-upgrade baseline:
//     more than max_regression below fails; a missing or non-finite value
//     or baseline is inconclusive.
func judgeReport(r *run, n *nodeRec, rep *report.Report) judgement {
	v := r.Spec.Validation
	var fails, unsure, notes []string
	if rep == nil {
		return judgement{outcome: outcomeInconclusive, summary: "no report"}
	}
	target := r.targetDriver(n)
	switch got := rep.Inventory.DriverVersion; {
	case got == "":
		unsure = append(unsure, "the report names no driver version")
	case !sameVersion(got, target):
		fails = append(fails, fmt.Sprintf("driver is %s, want %s", got, target))
	}
	for _, name := range v.Checks {
		c := rep.Check(name)
		if c == nil {
			unsure = append(unsure, name+": no result")
			continue
		}
		switch c.Status {
		case report.Fail:
			fails = append(fails, name+" failed"+findingText(c))
		case report.Error:
			unsure = append(unsure, name+" could not decide"+reasonText(c.Reason))
		case report.Skip:
			pre, ran := n.Pre[name]
			switch {
			case slices.Contains(v.Require, name):
				unsure = append(unsure, name+" skipped but required"+reasonText(c.Reason))
			case ran && (pre == report.Pass || pre == report.Warn):
				unsure = append(unsure, fmt.Sprintf("%s skipped but was %s before the upgrade%s", name, pre, reasonText(c.Reason)))
			}
		case report.Warn:
			notes = append(notes, name+" warned"+findingText(c))
		}
	}
	// A GPU check that skipped, or a report that saw no GPU, measured
	// nothing: inconclusive, whatever the spec requires.
	for _, m := range kit.MissingData(rep, false) {
		if c := rep.Check(m.Check); c != nil && slices.Contains(v.Require, m.Check) {
			continue // said above
		}
		if pre, ran := n.Pre[m.Check]; ran && (pre == report.Pass || pre == report.Warn) {
			continue // said above
		}
		unsure = append(unsure, m.String())
	}
	if v.compares() {
		switch cmp := compareBaseline(r, n, rep); cmp.Verdict {
		case baselines.Fail:
			fails = append(fails, cmp.Reason)
		case baselines.Pass:
			notes = append(notes, cmp.Reason)
		case "":
			notes = append(notes, "NCCL comparison waived: "+n.BaselineFrom)
		default:
			unsure = append(unsure, "NCCL comparison inconclusive: "+cmp.Reason)
		}
	}
	switch {
	case len(fails) > 0:
		return judgement{outcome: outcomeFail, summary: strings.Join(fails, "; "), evidence: append(fails, unsure...)}
	case len(unsure) > 0:
		return judgement{outcome: outcomeInconclusive, summary: strings.Join(unsure, "; "), evidence: unsure}
	}
	sum := fmt.Sprintf("%d checks, driver %s", len(v.Checks), rep.Inventory.DriverVersion)
	return judgement{outcome: outcomePass, summary: sum, evidence: notes}
}

// compareBaseline judges the NCCL metric against the node's pre-upgrade
// baseline with the baselines rule (shortfall over the threshold fails;
// exactly at it passes; NaN or nothing to compare is inconclusive). An
// empty verdict means an operator waived the comparison.
func compareBaseline(r *run, n *nodeRec, rep *report.Report) baselines.Comparison {
	v := r.Spec.Validation
	if n.BaselineFrom == waived {
		return baselines.Comparison{}
	}
	measured, why := metricValue(rep, v.NCCLCheck, v.Metric)
	if why != "" {
		return baselines.Comparison{Verdict: baselines.Inconclusive, Reason: why}
	}
	var b *baselines.Baseline
	if n.Baseline > 0 && finite(n.Baseline) {
		st, err := baselines.NewStats([]float64{n.Baseline})
		if err == nil {
			b = &baselines.Baseline{
				Key: baselines.Key{Metric: v.Metric, Scope: baselines.NodeScope(n.Name),
					Stack: baselines.Stack{Driver: n.FromDriver}},
				Direction: baselines.HigherBetter, Samples: st, Value: n.Baseline,
				Note: n.BaselineFrom,
			}
		}
	}
	c := baselines.Compare(b, measured, baselines.Stack{Driver: rep.Inventory.DriverVersion},
		baselines.CompareOptions{Threshold: float64(v.MaxRegression)})
	if c.Verdict != baselines.Inconclusive {
		c.Reason = fmt.Sprintf("%s %.1f vs %.1f before the upgrade (%s): %.1f%% below, limit %.0f%%",
			v.Metric, measured, n.Baseline, n.BaselineFrom, 100*c.Deviation, 100*float64(v.MaxRegression))
	}
	return c
}

// waived marks a baseline an operator chose to go without.
const waived = "waived by operator"

// metricValue reads a check's metric; why says what is missing.
func metricValue(rep *report.Report, check, metric string) (float64, string) {
	c := rep.Check(check)
	switch {
	case c == nil:
		return 0, check + ": no result"
	case c.Status == report.Error || c.Status == report.Skip:
		return 0, fmt.Sprintf("%s %s%s", check, c.Status, reasonText(c.Reason))
	}
	val, ok := c.Metrics[metric]
	switch {
	case !ok:
		return 0, fmt.Sprintf("%s reported no %s", check, metric)
	case !finite(val):
		return 0, fmt.Sprintf("%s %s is %v", check, metric, val)
	case val < 0:
		return 0, fmt.Sprintf("%s %s is negative (%v)", check, metric, val)
	}
	return val, ""
}

// failedChecks lists the checks that failed, with their first findings.
func failedChecks(rep *report.Report) []string {
	var out []string
	for i := range rep.Checks {
		c := &rep.Checks[i]
		if c.Status == report.Fail {
			out = append(out, c.Name+" failed"+findingText(c))
		}
	}
	return out
}

func findingText(c *report.CheckResult) string {
	if len(c.Findings) == 0 {
		return reasonText(c.Reason)
	}
	parts := make([]string, 0, 3)
	for i, f := range c.Findings {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(c.Findings)-3))
			break
		}
		parts = append(parts, fmt.Sprintf("%s %s: %s", f.Component, f.Code, clip(f.Message, 200)))
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

func reasonText(r string) string {
	if r == "" {
		return ""
	}
	return ": " + clip(r, 300)
}
