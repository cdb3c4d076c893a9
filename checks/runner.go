package checks

import (
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Run runs each check over the input and returns their results in order.
// Source states decide first: an absent source skips the check with the
// source's reason, a failed or timed-out one makes it an error. A check that
// panics is reported as an error rather than taking the caller down.
func Run(list []Check, in Input) []report.CheckResult {
	out := make([]report.CheckResult, 0, len(list))
	for _, c := range list {
		start := time.Now()
		res := runOne(c, in)
		cr := report.CheckResult{
			Name:       c.Name(),
			Status:     res.Status,
			Reason:     res.Reason,
			Findings:   res.Findings,
			Metrics:    res.Metrics,
			DurationMS: float64(time.Since(start).Microseconds()) / 1000,
		}
		if cr.Status == "" {
			cr.Status = report.Pass
		}
		if cr.Findings == nil {
			cr.Findings = []report.Finding{}
		}
		report.SortFindings(cr.Findings)
		out = append(out, cr)
	}
	return out
}

func runOne(c Check, in Input) (res Result) {
	for _, src := range c.Needs() {
		if r, blocked := SourceGate(in.Snap, src); blocked {
			return r
		}
	}
	defer func() {
		if p := recover(); p != nil {
			res = Errorf("check panicked: %v", p)
		}
	}()
	return c.Run(in)
}

// SourceGate says whether a source's state decides the check's outcome
// before it runs: absent → skip, failed/timeout → error.
func SourceGate(snap *snapshot.Snapshot, src snapshot.Source) (Result, bool) {
	st := snap.Source(src)
	switch st.State {
	case snapshot.StateOK:
		return Result{}, false
	case snapshot.StateAbsent:
		if st.Error != "" {
			return Skipf("%s", st.Error), true
		}
		return Skipf("no %s", src), true
	case snapshot.StateTimeout:
		return Errorf("%s: %s", src, orDefault(st.Error, "timed out")), true
	default:
		return Errorf("%s: %s", src, orDefault(st.Error, fmt.Sprintf("failed (exit %d)", st.ExitCode))), true
	}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// Select returns the checks to run: the named ones when names is non-empty
// (disruptive ones included, since they were asked for by name), otherwise
// every passive check, plus disruptive ones when allowed.
func Select(all []Check, names []string, disruptive bool) ([]Check, error) {
	if len(names) == 0 {
		var out []Check
		for _, c := range all {
			if !c.Disruptive() || disruptive {
				out = append(out, c)
			}
		}
		return out, nil
	}
	byName := make(map[string]Check, len(all))
	for _, c := range all {
		byName[c.Name()] = c
	}
	var out []Check
	seen := map[string]bool{}
	for _, n := range names {
		c, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("unknown check %q", n)
		}
		if !seen[n] {
			out = append(out, c)
			seen[n] = true
		}
	}
	return out, nil
}
