package report

import (
	"fmt"
	"strings"
	"testing"
)

// TestFindingsByCause: the IB port-down node of the demo. The store hands
// back a result's checks newest-inserted first (ib.counters before
// ib.ports); the port being down must still come first, before the
// link_downed rise it caused.
func TestFindingsByCause(t *testing.T) {
	t.Parallel()
	order := []string{"gpu.inventory", "gpu.xid", "ib.ports", "ib.counters"}
	results := []CheckResult{
		{Name: "ib.counters", Status: Fail, Findings: []Finding{
			{Severity: SevFail, Component: "mlx5_4/1", Code: "IB_COUNTER_RISING", Action: ActionReseat},
		}},
		{Name: "ib.ports", Status: Fail, Findings: []Finding{
			{Severity: SevFail, Component: "node", Code: "IB_PORTS_MISSING", Action: ActionDrain},
			{Severity: SevFail, Component: "mlx5_4/1", Code: "IB_PORT_DOWN", Action: ActionReseat},
			{Severity: SevWarn, Component: "mlx5_0/1", Code: "IB_SYSFS_UNREADABLE", Action: ActionMonitor},
		}},
		{Name: "custom.check", Status: Warn, Findings: []Finding{
			{Severity: SevWarn, Component: "node", Code: "CUSTOM", Action: ActionMonitor},
		}},
		{Name: "gpu.xid", Status: Warn, Findings: []Finding{
			{Severity: SevWarn, Component: "GPU2", Code: "XID_13", Action: ActionRestartApp},
		}},
	}
	got := FindingsByCause(results, order)
	var codes []string
	for _, f := range got {
		codes = append(codes, f.Component+" "+f.Code)
	}
	want := []string{
		"mlx5_4/1 IB_PORT_DOWN", "node IB_PORTS_MISSING", "mlx5_4/1 IB_COUNTER_RISING",
		"GPU2 XID_13", "mlx5_0/1 IB_SYSFS_UNREADABLE", "node CUSTOM",
	}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Errorf("order:\n got %v\nwant %v", codes, want)
	}
	if results[0].Name != "ib.counters" || results[1].Findings[0].Code != "IB_PORTS_MISSING" {
		t.Errorf("FindingsByCause modified its input")
	}
}

// TestTableSaysHowManySkipped: a report that passes with checks skipped
// says so in its first line.
func TestTableSaysHowManySkipped(t *testing.T) {
	t.Parallel()
	r := Report{Node: "vm", Checks: []CheckResult{
		{Name: "gpu.inventory", Status: Skip, Reason: "nvidia-smi not found"},
		{Name: "gpu.xid", Status: Pass},
		{Name: "ib.ports", Status: Skip, Reason: "no /sys/class/infiniband"},
	}}
	r.Summarize()
	var b strings.Builder
	if err := WriteTable(&b, &r); err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(b.String(), "\n")
	if !strings.HasPrefix(first, "node vm: PASS (2 of 3 checks skipped)") {
		t.Errorf("first line %q", first)
	}
	if !strings.Contains(b.String(), "gpu.inventory  skip    nvidia-smi not found") {
		t.Errorf("skip row missing:\n%s", b.String())
	}
}
