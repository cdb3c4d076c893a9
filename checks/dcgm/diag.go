package dcgm

import (
	"fmt"
	"sort"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// dcgm.diag finding codes.
const (
	CodeDCGMTestFailed    = "DCGM_TEST_FAILED"
	CodeDCGMTestWarning   = "DCGM_TEST_WARNING"
	CodeDCGMStatusUnknown = "DCGM_STATUS_UNKNOWN"
)

// dcgm.diag metrics: entity results by outcome.
const (
	MetricDCGMFailed  = "dcgm.tests_failed_count"
	MetricDCGMPassed  = "dcgm.tests_passed_count"
	MetricDCGMWarned  = "dcgm.tests_warned_count"
	MetricDCGMSkipped = "dcgm.tests_skipped_count" // Skip and Not Run
)

// DCGMDiag is the dcgm.diag check. Findings are grouped per entity (GPU<i>,
// or node for node-wide tests and non-GPU entities), listing each test with
// its warnings. A failed test drains: DCGM's tests find hardware faults
// and node states (pending row remaps, corrupt InfoROM) that make the node
// unfit for jobs, and the check only runs on an idle or drained node, so a
// failure is not some job's doing. Warnings ask to monitor. When every
// result was skipped or not run the check skips: nothing was decided.
//
// dcgmi exits 226 when the diagnostic ran and found a failure; the probe
// still parses that output, and this check judges the parsed tests only.
type DCGMDiag struct{}

var _ checks.Check = DCGMDiag{}

// Name is the check's fixed name.
func (DCGMDiag) Name() string { return "dcgm.diag" }

// Needs the dcgmi diag output.
func (DCGMDiag) Needs() []snapshot.Source { return []snapshot.Source{snapshot.SrcDCGMDiag} }

// Disruptive: the diagnostic loads the GPUs.
func (DCGMDiag) Disruptive() bool { return true }

type entityNotes struct {
	component string
	fails     []string
	warns     []string
	unknown   []string
}

// Run judges the diagnostic.
func (DCGMDiag) Run(in checks.Input) checks.Result {
	if in.Snap == nil || in.Snap.DCGM == nil {
		return checks.Errorf("%s: no parsed diagnostic", snapshot.SrcDCGMDiag)
	}
	diag := in.Snap.DCGM
	if len(diag.Tests) == 0 {
		return checks.Errorf("%s: the diagnostic reported no tests", snapshot.SrcDCGMDiag)
	}

	byEntity := map[string]*entityNotes{}
	notes := func(t snapshot.DCGMTest) *entityNotes {
		c := component(t)
		n := byEntity[c]
		if n == nil {
			n = &entityNotes{component: c}
			byEntity[c] = n
		}
		return n
	}
	var passed, failed, warned, skipped, unknown int
	for _, t := range diag.Tests {
		switch snapshot.NormalizeDCGMStatus(t.Status) {
		case snapshot.DCGMPass:
			passed++
		case snapshot.DCGMFail:
			failed++
			n := notes(t)
			n.fails = append(n.fails, describe(t))
		case snapshot.DCGMWarn:
			warned++
			n := notes(t)
			n.warns = append(n.warns, describe(t))
		case snapshot.DCGMSkip, snapshot.DCGMNotRun:
			skipped++
		default:
			unknown++
			n := notes(t)
			n.unknown = append(n.unknown, fmt.Sprintf("%s status %q", testName(t), quote(t.Status)))
		}
	}

	res := checks.Result{Status: report.Pass}
	res.Metric(MetricDCGMFailed, float64(failed))
	res.Metric(MetricDCGMPassed, float64(passed))
	res.Metric(MetricDCGMWarned, float64(warned))
	res.Metric(MetricDCGMSkipped, float64(skipped))
	if passed+failed+warned+unknown == 0 {
		res.Status = report.Skip
		res.Reason = fmt.Sprintf("no dcgm test ran (%d results skipped or not run)", skipped)
		return res
	}

	tool := "dcgmi diag"
	if diag.Level > 0 {
		tool = fmt.Sprintf("dcgmi diag -r %d", diag.Level)
	}
	comps := make([]string, 0, len(byEntity))
	for c := range byEntity {
		comps = append(comps, c)
	}
	sort.Strings(comps)
	for _, c := range comps {
		n := byEntity[c]
		if len(n.fails) > 0 {
			res.Add(report.Finding{Severity: report.SevFail, Component: c, Code: CodeDCGMTestFailed,
				Message: fmt.Sprintf("%s failed %d test(s) on %s: %s", tool, len(n.fails), c, strings.Join(n.fails, "; ")),
				Action:  report.ActionDrain})
		}
		if len(n.warns) > 0 {
			res.Add(report.Finding{Severity: report.SevWarn, Component: c, Code: CodeDCGMTestWarning,
				Message: fmt.Sprintf("%s warned on %d test(s) on %s: %s", tool, len(n.warns), c, strings.Join(n.warns, "; ")),
				Action:  report.ActionMonitor})
		}
		if len(n.unknown) > 0 {
			res.Add(report.Finding{Severity: report.SevWarn, Component: c, Code: CodeDCGMStatusUnknown,
				Message: fmt.Sprintf("%s gave results fleetcheck cannot read on %s: %s", tool, c, strings.Join(n.unknown, "; ")),
				Action:  report.ActionMonitor})
		}
	}
	return res
}

// component names a result's entity: GPU<i> for a GPU, node otherwise.
func component(t snapshot.DCGMTest) string {
	g := strings.ToUpper(t.EntityGroup)
	if (g == "" || g == "GPU") && t.EntityID >= 0 {
		return checks.GPUComponent(t.EntityID)
	}
	return checks.NodeComponent
}

func testName(t snapshot.DCGMTest) string {
	name := t.Name
	if t.Category != "" {
		name = t.Category + "/" + name
	}
	// Non-GPU entities are reported on the node; say which one.
	if g := strings.ToUpper(t.EntityGroup); g != "" && g != "GPU" && t.EntityID >= 0 {
		name += fmt.Sprintf(" (%s %d)", t.EntityGroup, t.EntityID)
	}
	return name
}

func describe(t snapshot.DCGMTest) string {
	s := testName(t)
	if len(t.Warnings) == 0 {
		return s
	}
	ws := make([]string, len(t.Warnings))
	for i, w := range t.Warnings {
		ws[i] = quote(w)
	}
	return s + " (" + strings.Join(ws, " | ") + ")"
}
