package coordinator

import (
	"testing"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// TestSkippedChecksAreNotPasses: a node whose checks skipped is not
// described as "all checks pass", and a `check` whose checks all skipped
// on a node shows skip for it (an exit-1 outcome), never pass.
func TestSkippedChecksAreNotPasses(t *testing.T) {
	t.Parallel()
	skip := func(name, why string) report.CheckResult {
		return report.CheckResult{Name: name, Status: report.Skip, Reason: why}
	}
	pass := func(name string) report.CheckResult { return report.CheckResult{Name: name, Status: report.Pass} }

	allSkipped := &store.Result{Status: report.Pass, Checks: []report.CheckResult{
		skip("gpu.ecc", "nvidia-smi not found"), skip("ib.ports", "no /sys/class/infiniband"),
	}}
	if got := outcomeStatus(allSkipped); got != OutcomeSkip {
		t.Errorf("all skipped: outcome %q, want %q", got, OutcomeSkip)
	}
	if got, want := resultReason(allSkipped), "2 skipped: gpu.ecc (nvidia-smi not found), ib.ports (no /sys/class/infiniband)"; got != want {
		t.Errorf("reason %q, want %q", got, want)
	}
	some := &store.Result{Status: report.Pass, Checks: []report.CheckResult{
		pass("gpu.inventory"), skip("a", ""), skip("b", ""), skip("c", ""), skip("d", ""),
		{Name: "gpu.thermal", Status: report.Warn},
	}}
	if got := outcomeStatus(some); got != string(report.Pass) {
		t.Errorf("some skipped: outcome %q, want pass", got)
	}
	if got, want := resultReason(some), "gpu.thermal warn; 4 skipped: a, b, c, and 1 more"; got != want {
		t.Errorf("reason %q, want %q", got, want)
	}

	states := func(rs ...report.CheckResult) map[string]store.CheckState {
		m := map[string]store.CheckState{}
		for _, r := range rs {
			m[r.Name] = store.CheckState{Name: r.Name, Status: r.Status}
		}
		return m
	}
	st, why := deriveState(states(pass("gpu.inventory"), skip("gpu.ecc", ""), skip("ib.ports", "")), true)
	if st != StateHealthy || why != "pass (2 skipped)" {
		t.Errorf("state %q %q, want healthy \"pass (2 skipped)\"", st, why)
	}
	if st, why := deriveState(states(pass("gpu.inventory")), true); st != StateHealthy || why != "all checks pass" {
		t.Errorf("state %q %q", st, why)
	}
}

// TestStateReasonCauseFirst: the IB port-down node's state reason names
// the port before the counter its going down raised.
func TestStateReasonCauseFirst(t *testing.T) {
	t.Parallel()
	checks := map[string]store.CheckState{
		"ib.counters": {Name: "ib.counters", Status: report.Fail, Detail: "mlx5_4/1 IB_COUNTER_RISING"},
		"ib.ports":    {Name: "ib.ports", Status: report.Fail, Detail: "mlx5_4/1 IB_PORT_DOWN"},
		"gpu.ecc":     {Name: "gpu.ecc", Status: report.Pass},
	}
	st, why := deriveState(checks, true)
	if want := "ib.ports fail: mlx5_4/1 IB_PORT_DOWN; ib.counters fail: mlx5_4/1 IB_COUNTER_RISING"; st != StateFailed || why != want {
		t.Errorf("state %q reason %q, want failed %q", st, why, want)
	}
}
