package kit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// TestConnectGraceCoversAgentBackoff: after a coordinator restart an agent
// may wait up to its maximum reconnect backoff before it knocks again; the
// default grace must outlast that, or a restart skips nodes.
func TestConnectGraceCoversAgentBackoff(t *testing.T) {
	t.Parallel()
	if kit.DefaultConnectGrace < agent.DefaultReconnectMax {
		t.Fatalf("default connect grace %v is shorter than the agent's maximum reconnect backoff %v",
			kit.DefaultConnectGrace, agent.DefaultReconnectMax)
	}
	for _, tc := range []struct {
		in   time.Duration
		want time.Duration
		ok   bool
	}{
		{0, kit.DefaultConnectGrace, true},
		{time.Minute, time.Minute, true},
		{time.Second, time.Second, false},
		{-time.Minute, -time.Minute, false},
		{48 * time.Hour, 48 * time.Hour, false},
	} {
		d := tc.in
		err := kit.CheckConnectGrace(&d)
		if (err == nil) != tc.ok || d != tc.want {
			t.Errorf("CheckConnectGrace(%v) = %v, %v", tc.in, d, err)
		}
	}
}

func TestConnectWaits(t *testing.T) {
	t.Parallel()
	var w kit.ConnectWaits
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if since, over := w.Wait("c/n1", t0, time.Minute); !since.Equal(t0) || over {
		t.Fatalf("first wait: %v %v", since, over)
	}
	if since, over := w.Wait("c/n1", t0.Add(59*time.Second), time.Minute); !since.Equal(t0) || over {
		t.Fatalf("within grace: %v %v", since, over)
	}
	if _, over := w.Wait("c/n1", t0.Add(time.Minute), time.Minute); !over {
		t.Fatal("grace over not reported")
	}
	w.Done("c/n1")
	if !w.Since("c/n1").IsZero() {
		t.Fatal("Done kept the wait")
	}
}

func TestMissingData(t *testing.T) {
	t.Parallel()
	gpus := report.Inventory{GPUs: []report.GPU{{Index: 0}}}
	hcas := report.Inventory{GPUs: gpus.GPUs, HCAs: []report.HCA{{Name: "mlx5_0"}}}
	chk := func(name string, st report.Status) report.CheckResult {
		return report.CheckResult{Name: name, Status: st, Reason: "source absent"}
	}
	for _, tc := range []struct {
		name    string
		rep     *report.Report
		hasHCAs bool
		want    []string
	}{
		{"healthy", &report.Report{Inventory: gpus, Checks: []report.CheckResult{chk("gpu.inventory", report.Pass), chk("gpu.fabric", report.Skip)}}, false, nil},
		{"gpu check skipped", &report.Report{Inventory: gpus, Checks: []report.CheckResult{chk("gpu.xid", report.Skip)}}, false,
			[]string{"gpu.xid skipped where data was expected: source absent"}},
		{"ib skipped without HCAs", &report.Report{Inventory: gpus, Checks: []report.CheckResult{chk("ib.ports", report.Skip)}}, false, nil},
		{"ib skipped on a node with HCAs", &report.Report{Inventory: gpus, Checks: []report.CheckResult{chk("ib.ports", report.Skip)}}, true,
			[]string{"ib.ports skipped where data was expected: source absent"}},
		{"ib skipped, HCAs in the report", &report.Report{Inventory: hcas, Checks: []report.CheckResult{chk("ib.counters", report.Skip)}}, false,
			[]string{"ib.counters skipped where data was expected: source absent"}},
		{"no GPU seen", &report.Report{Checks: []report.CheckResult{chk("gpu.inventory", report.Pass)}}, false,
			[]string{"nothing measured: the report shows no GPU"}},
		{"no GPU asked", &report.Report{Checks: []report.CheckResult{chk("nccl.allreduce", report.Pass)}}, false, nil},
		{"no report", nil, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			for _, m := range kit.MissingData(tc.rep, tc.hasHCAs) {
				got = append(got, m.String())
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
