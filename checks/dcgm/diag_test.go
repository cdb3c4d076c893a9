package dcgm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	dcgmprobe "github.com/fleetcheck/fleetcheck/node/probe/dcgm"
)

func diagSnap(d *snapshot.DCGMDiag) *snapshot.Snapshot {
	s := &snapshot.Snapshot{DCGM: d}
	s.SetSource(snapshot.SrcDCGMDiag, snapshot.SourceState{State: snapshot.StateOK})
	return s
}

func gpuTest(cat, name string, id int, status string, warnings ...string) snapshot.DCGMTest {
	return snapshot.DCGMTest{Category: cat, Name: name, EntityGroup: "GPU", EntityID: id, Status: status, Warnings: warnings}
}

func TestDCGMDiagContract(t *testing.T) {
	t.Parallel()
	c := DCGMDiag{}
	if c.Name() != "dcgm.diag" || !c.Disruptive() || len(c.Needs()) != 1 || c.Needs()[0] != snapshot.SrcDCGMDiag {
		t.Errorf("contract: %s %v %v", c.Name(), c.Disruptive(), c.Needs())
	}
}

func TestDCGMDiagTable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		tests   []snapshot.DCGMTest
		status  report.Status
		want    []report.Finding // component, code, action, severity checked; message by substrings
		msg     map[string][]string
		metrics map[string]float64
		reason  string
	}{
		{
			name:    "all pass",
			tests:   []snapshot.DCGMTest{gpuTest("Hardware", "memory", 0, "Pass"), gpuTest("Hardware", "memory", 1, "Pass")},
			status:  report.Pass,
			metrics: map[string]float64{MetricDCGMPassed: 2, MetricDCGMFailed: 0, MetricDCGMWarned: 0, MetricDCGMSkipped: 0},
		},
		{
			name: "fail per entity, tests grouped with warnings",
			tests: []snapshot.DCGMTest{
				gpuTest("Hardware", "memory", 3, "Fail", "DBE during memory test (DCGM error 95)"),
				gpuTest("Integration", "pcie", 3, "Fail", "replay rate too high"),
				gpuTest("Hardware", "memory", 10, "Fail"),
				gpuTest("Hardware", "memory", 2, "Pass"),
			},
			status: report.Fail,
			want: []report.Finding{
				{Severity: report.SevFail, Component: "GPU3", Code: CodeDCGMTestFailed, Action: report.ActionDrain},
				{Severity: report.SevFail, Component: "GPU10", Code: CodeDCGMTestFailed, Action: report.ActionDrain},
			},
			msg:     map[string][]string{"GPU3": {"failed 2 test(s) on GPU3", "Hardware/memory (DBE during memory test (DCGM error 95))", "Integration/pcie (replay rate too high)"}},
			metrics: map[string]float64{MetricDCGMFailed: 3, MetricDCGMPassed: 1},
		},
		{
			name: "node-wide and non-GPU entities go to node",
			tests: []snapshot.DCGMTest{
				{Category: "Deployment", Name: "Persistence Mode", EntityID: -1, Status: "FAIL", Warnings: []string{"persistence mode disabled"}},
				{Category: "Hardware", Name: "cpu_eud", EntityGroup: "CPU", EntityID: 1, Status: "Fail"},
			},
			status: report.Fail,
			want:   []report.Finding{{Severity: report.SevFail, Component: "node", Code: CodeDCGMTestFailed, Action: report.ActionDrain}},
			msg:    map[string][]string{"node": {"Deployment/Persistence Mode (persistence mode disabled)", "Hardware/cpu_eud (CPU 1)"}},
		},
		{
			name:   "warn only",
			tests:  []snapshot.DCGMTest{gpuTest("Integration", "pcie", 5, "Warn", "replays"), gpuTest("Hardware", "memory", 5, "Pass")},
			status: report.Warn,
			want:   []report.Finding{{Severity: report.SevWarn, Component: "GPU5", Code: CodeDCGMTestWarning, Action: report.ActionMonitor}},
		},
		{
			name:   "skips do not hide a pass",
			tests:  []snapshot.DCGMTest{gpuTest("Stress", "targeted_power", 0, "Skip"), gpuTest("Hardware", "memory", 0, "Pass")},
			status: report.Pass, metrics: map[string]float64{MetricDCGMSkipped: 1, MetricDCGMPassed: 1},
		},
		{
			name:   "nothing ran: skip",
			tests:  []snapshot.DCGMTest{gpuTest("Stress", "targeted_power", 0, "Skip"), gpuTest("Hardware", "memory", 0, "Not Run")},
			status: report.Skip, reason: "no dcgm test ran (2 results skipped or not run)",
			metrics: map[string]float64{MetricDCGMSkipped: 2},
		},
		{
			name:   "unknown status is not a pass",
			tests:  []snapshot.DCGMTest{gpuTest("Hardware", "memory", 0, "Exploded")},
			status: report.Warn,
			want:   []report.Finding{{Severity: report.SevWarn, Component: "GPU0", Code: CodeDCGMStatusUnknown, Action: report.ActionMonitor}},
		},
		{
			name:   "no tests: error",
			tests:  nil,
			status: report.Error, reason: "no tests",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := runCheck(t, DCGMDiag{}, diagSnap(&snapshot.DCGMDiag{Version: "4.1.1", Tests: c.tests}), nil)
			if r.Status != c.status {
				t.Fatalf("status = %s, want %s (%q %+v)", r.Status, c.status, r.Reason, r.Findings)
			}
			if len(r.Findings) != len(c.want) {
				t.Fatalf("findings = %+v, want %d", r.Findings, len(c.want))
			}
			for i, w := range c.want {
				f := r.Findings[i]
				if f.Severity != w.Severity || f.Component != w.Component || f.Code != w.Code || f.Action != w.Action {
					t.Errorf("finding %d = %+v, want %+v", i, f, w)
				}
			}
			for comp, subs := range c.msg {
				var msg string
				for _, f := range r.Findings {
					if f.Component == comp {
						msg = f.Message
					}
				}
				for _, s := range subs {
					if !strings.Contains(msg, s) {
						t.Errorf("%s message %q lacks %q", comp, msg, s)
					}
				}
			}
			for k, v := range c.metrics {
				if r.Metrics[k] != v {
					t.Errorf("metric %s = %v, want %v", k, r.Metrics[k], v)
				}
			}
			if !strings.Contains(r.Reason, c.reason) {
				t.Errorf("reason = %q, want %q", r.Reason, c.reason)
			}
		})
	}
}

func TestDCGMDiagSourceGate(t *testing.T) {
	t.Parallel()
	if r := runCheck(t, DCGMDiag{}, &snapshot.Snapshot{}, nil); r.Status != report.Skip {
		t.Errorf("absent: %+v", r)
	}
	s := &snapshot.Snapshot{}
	s.SetSource(snapshot.SrcDCGMDiag, snapshot.SourceState{State: snapshot.StateTimeout, Error: "dcgmi timed out after 15m0s"})
	if r := runCheck(t, DCGMDiag{}, s, nil); r.Status != report.Error || !strings.Contains(r.Reason, "timed out") {
		t.Errorf("timeout: %+v", r)
	}
	if r := runCheck(t, DCGMDiag{}, diagSnap(nil), nil); r.Status != report.Error {
		t.Errorf("ok without data: %+v", r)
	}
}

func TestDCGMDiagFixtures(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "..", "node", "probe", "dcgm", "testdata")
	read := func(name string) *snapshot.DCGMDiag {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		d, err := dcgmprobe.Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	r3 := runCheck(t, DCGMDiag{}, diagSnap(read("dcgm-3.1.0__diag__8gpu__from-NVIDIA-DCGM-JsonResult-test__with-banner-and-nulls.json.txt")), nil)
	if r3.Status != report.Pass || r3.Metrics[MetricDCGMPassed] != 17 || len(r3.Findings) != 0 {
		t.Errorf("3.1.0: %+v", r3)
	}

	d4 := read("SYNTHETIC__dcgm-4.1.1__diag-r3__h100x8__gpu3-memory-FAIL_gpu5-pcie-WARN.json")
	d4.Level = 3 // set by the probe that ran dcgmi
	r4 := runCheck(t, DCGMDiag{}, diagSnap(d4), nil)
	if r4.Status != report.Fail || len(r4.Findings) != 2 {
		t.Fatalf("4.1.1: %+v", r4)
	}
	f, w := r4.Findings[0], r4.Findings[1]
	if f.Component != "GPU3" || f.Code != CodeDCGMTestFailed || !strings.HasPrefix(f.Message, "dcgmi diag -r 3 failed 1 test(s) on GPU3: Hardware/memory") || !strings.Contains(f.Message, "row remapping failed") {
		t.Errorf("fail finding %+v", f)
	}
	if w.Component != "GPU5" || w.Code != CodeDCGMTestWarning || !strings.Contains(w.Message, "Integration/pcie") {
		t.Errorf("warn finding %+v", w)
	}
	if r4.Metrics[MetricDCGMFailed] != 1 || r4.Metrics[MetricDCGMWarned] != 1 || r4.Metrics[MetricDCGMSkipped] != 10 || r4.Metrics[MetricDCGMPassed] != 46 {
		t.Errorf("metrics %v", r4.Metrics)
	}
}
