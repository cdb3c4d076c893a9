package triage

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/gpu"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/probe/kmsg"
)

// The accounting fixture's jobs run 04:00-04:30 UTC on 2 Dec 2026.
var (
	jobStart = time.Date(2026, 12, 2, 4, 0, 0, 0, time.UTC)
	jobEnd   = jobStart.Add(30 * time.Minute)
)

// accountingJobs are sacct's jobs from testdata/sacct-accounting.txt
// (sacct --parsable2 with slurmdbd: job steps, "CANCELLED by UID").
func accountingJobs(t *testing.T) map[string]Job {
	t.Helper()
	data, err := os.ReadFile("testdata/sacct-accounting.txt")
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := ParseSacct(string(data), time.UTC, "sacct")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Job{}
	for _, j := range jobs {
		if len(j.Nodes) == 1 {
			j.Nodes = ExpandHostlist(j.Nodes[0])
		}
		out[j.ID] = j
	}
	return out
}

// xidLine is the fixture line of an Xid code, with the GPU's bus.
func xidLine(t *testing.T, code string) string {
	t.Helper()
	f, err := os.Open("testdata/xid_lines.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := sc.Text(); !strings.HasPrefix(l, "#") && strings.Contains(l, "): "+code+",") {
			return l
		}
	}
	t.Fatalf("no Xid %s line in testdata/xid_lines.txt", code)
	return ""
}

// kline is one kernel log line at a time, as `dmesg -T` prints it.
type kline struct {
	at   time.Time
	code string
}

// xidResult runs the real gpu.xid check over a kernel log of fixture lines
// with `dmesg -T` stamps, as the agent does at `at`.
func xidResult(t *testing.T, node string, at time.Time, lines ...kline) Result {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("[" + l.at.Format(time.ANSIC) + "] " + xidLine(t, l.code) + "\n")
	}
	klog, err := kmsg.Parse([]byte(b.String()), at, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The fixture lines' GPUs: 0000:05:00 is GPU3, 0000:0f:00 is GPU0.
	snap := &snapshot.Snapshot{Kernel: klog, GPU: &snapshot.GPUState{GPUs: []snapshot.GPU{{Index: 0, PCIBusID: "0000:0f:00.0"}, {Index: 3, PCIBusID: "0000:05:00.0"}}}}
	res := gpu.Xid{}.Run(checks.Input{Snap: snap, Config: config.Defaults(), Now: at})
	if len(lines) > 0 && len(res.Findings) == 0 {
		t.Fatalf("gpu.xid found nothing in %q: %s", b.String(), res.Reason)
	}
	return Result{Node: node, At: at, Check: report.CheckResult{Name: "gpu.xid", Status: res.Status, Reason: res.Reason, Findings: res.Findings, Metrics: res.Metrics}}
}

func TestBucket(t *testing.T) {
	t.Parallel()
	jobs := accountingJobs(t)
	at := func(m int) time.Time { return jobStart.Add(time.Duration(m) * time.Minute) }
	clean := func(node string, m int) Result {
		return Result{Node: node, At: at(m), Check: report.CheckResult{Name: "gpu.ecc", Status: report.Pass}}
	}
	eccFail := Result{Node: "gpu-01", At: at(20), Check: report.CheckResult{Name: "gpu.ecc", Status: report.Fail, Findings: []report.Finding{
		{Severity: report.SevFail, Component: "GPU3", Code: gpu.CodeECCUncorrectable, Action: report.ActionDrain, Message: "2 uncorrectable ECC errors (volatile DRAM)"}}}}
	// Xid 13 at 04:29:30 on every node of job 4101: one crash.
	var crash []Result
	for _, n := range []string{"gpu-02", "gpu-03", "gpu-04"} {
		crash = append(crash, xidResult(t, n, at(31), kline{at(29).Add(30 * time.Second), "13"}))
	}
	tests := []struct {
		name    string
		job     string
		results []Result
		peers   []Result
		bucket  Bucket
		rule    string
		events  []JobEvent // the coordinator's
	}{
		{"xid 79 during a failed job", "4101", []Result{clean("gpu-01", 5), xidResult(t, "gpu-01", at(31), kline{at(29), "79"})}, nil,
			Hardware, "xid 79: a hardware Xid in the catalog", nil},
		{"double-bit ECC Xid 48", "4101", []Result{xidResult(t, "gpu-01", at(31), kline{at(28), "48"})}, nil,
			Hardware, "xid 48: a hardware Xid in the catalog", nil},
		{"contained ECC Xid 94 killed the job", "4101", []Result{xidResult(t, "gpu-01", at(31), kline{at(29), "94"})}, nil,
			Hardware, "xid 94: a hardware Xid in the catalog", nil},
		{"uncorrectable ECC in gpu.ecc", "4101", []Result{clean("gpu-01", 5), eccFail}, nil,
			Hardware, "gpu.ecc ECC_UNCORRECTABLE: fail", nil},
		{"a node failure with an Xid 79 is hardware", "4104", []Result{xidResult(t, "gpu-01", at(31), kline{at(29), "79"})}, nil,
			Hardware, "xid 79: a hardware Xid in the catalog", nil},
		{"xid 13 on every node of the job at once", "4101", []Result{xidResult(t, "gpu-01", at(31), kline{at(29).Add(30 * time.Second), "13"})}, crash,
			Application, "correlate: 4+ nodes within 2m", nil},
		// The agent reports each line once, in the run after it.
		{"xid 13 three times in an hour on one GPU escalates", "4101", []Result{xidResult(t, "gpu-01", at(6), kline{at(5), "13"}),
			xidResult(t, "gpu-01", at(16), kline{at(15), "13"}), xidResult(t, "gpu-01", at(26), kline{at(25), "13"})}, nil,
			Hardware, "xid 13: 3 in 1h", nil},
		{"xid 13 on this node alone, job failed", "4101", []Result{xidResult(t, "gpu-01", at(31), kline{at(29), "13"})}, nil,
			Application, "job state FAILED without a hardware fault", nil},
		{"failed job, clean node", "4101", []Result{clean("gpu-01", 5), clean("gpu-01", 35)}, nil,
			Application, "job state FAILED without a hardware fault", nil},
		{"out of memory", "4106", []Result{clean("gpu-01", 5)}, nil,
			Application, "job state OUT_OF_MEMORY", nil},
		{"timeout", "4102", []Result{clean("gpu-01", 5)}, nil,
			Scheduling, "job state TIMEOUT without a hardware fault", nil},
		{"cancelled by its owner", "4103", nil, nil,
			Scheduling, "job state CANCELLED without a hardware fault", nil},
		{"preempted", "4105", nil, nil,
			Scheduling, "job state PREEMPTED without a hardware fault", nil},
		{"node failure without a fault", "4104", []Result{clean("gpu-01", 5)}, nil,
			Scheduling, "job state NODE_FAIL without a hardware fault", nil},
		{"an xid 79 hours before the job is not its cause", "4102", []Result{xidResult(t, "gpu-01", at(-170), kline{at(-180), "79"})}, nil,
			Scheduling, "job state TIMEOUT without a hardware fault", nil},
		{"completed, clean", "4107", []Result{clean("gpu-01", 5)}, nil,
			Unknown, "no fault", nil},
		{"still running, clean", "4108", nil, nil,
			Unknown, "no fault", nil},
		{"no job: an application xid alone", "", []Result{xidResult(t, "gpu-01", at(31), kline{at(29), "13"})}, nil,
			Application, "xid 13: application Xid without a hardware fault", nil},
		// No job named: the node's question. Its newest job was
		// cancelled an hour before the GPU fell off the bus; the Xid is
		// the answer, not the cancel.
		{"no job named: a fault after the newest job", "", []Result{xidResult(t, "gpu-01", at(95), kline{at(90), "79"})}, nil,
			Hardware, "xid 79: a hardware Xid in the catalog", nil},
		// The peers' results are not readable, but the coordinator's
		// remediation engine saw the crash on its configured 3 nodes.
		{"the coordinator's job event", "4101", []Result{xidResult(t, "gpu-01", at(31), kline{at(29), "13"})}, nil,
			Application, "correlate: the coordinator's job event", []JobEvent{{At: at(29), Job: "4101", Xid: 13, Nodes: []string{"gpu-01", "gpu-02", "gpu-03"},
				Reason: "application Xid 13 on 3 nodes within 2m: one job's crash, no node drained"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var js []Job
			if tc.job != "" {
				js = []Job{jobs[tc.job]}
			} else if tc.name == "no job named: a fault after the newest job" {
				js = []Job{jobs["4107"], jobs["4103"]}
			}
			rep := Build(Input{Node: "gpu-01", Job: tc.job, Jobs: js, Results: tc.results, Peers: tc.peers, JobEvents: tc.events,
				Since: jobStart.Add(-6 * time.Hour), Until: jobEnd.Add(time.Hour)})
			if rep.Bucket != tc.bucket || rep.Rule != tc.rule {
				t.Fatalf("bucket %s by %q (%s), want %s by %q\ntimeline: %+v", rep.Bucket, rep.Rule, rep.Reason, tc.bucket, tc.rule, rep.Timeline)
			}
			if rep.Reason == "" {
				t.Fatal("no reason")
			}
		})
	}
}

func TestParseSacct(t *testing.T) {
	t.Parallel()
	jobs := accountingJobs(t)
	if len(jobs) != 8 {
		t.Fatalf("%d jobs, want 8 (steps left out): %v", len(jobs), jobs)
	}
	j := jobs["4101"]
	want := []string{"gpu-01", "gpu-02", "gpu-03", "gpu-04"}
	if j.BaseState() != "FAILED" || j.ExitCode != "1:0" || !j.Start.Equal(jobStart) || !j.End.Equal(jobEnd) || strings.Join(j.Nodes, ",") != strings.Join(want, ",") {
		t.Fatalf("job 4101 = %+v", j)
	}
	if c := jobs["4103"]; c.BaseState() != "CANCELLED" || c.State != "CANCELLED by 1000" || !c.Ended() {
		t.Fatalf("job 4103 = %+v", c)
	}
	if r := jobs["4108"]; !r.End.IsZero() || r.Ended() {
		t.Fatalf("running job 4108 = %+v", r)
	}

	// What the real sacct --completion printed (TestRealSlurm's capture).
	data, err := os.ReadFile("testdata/sacct-completion.txt")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseSacct(string(data), time.UTC, "sacct --completion")
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, j := range got {
		states[j.ID] = j.BaseState() + " " + j.ExitCode + " " + strings.Join(j.Nodes, ",")
		if j.Start.IsZero() || j.End.IsZero() {
			t.Fatalf("job %s without times: %+v", j.ID, j)
		}
	}
	wantStates := map[string]string{"1": "COMPLETED 0:0 fc-node1", "2": "FAILED 3:0 fc-node1", "3": "CANCELLED 0:0 fc-node1"}
	for id, w := range wantStates {
		if states[id] != w {
			t.Fatalf("sacct --completion jobs = %v, want %v", states, wantStates)
		}
	}
	// What the real sacct printed from slurmdbd (TestRealSlurmAccounting's
	// capture, without -X): the batch step is left out.
	data, err = os.ReadFile("testdata/sacct-slurmdbd.txt")
	if err != nil {
		t.Fatal(err)
	}
	got, err = ParseSacct(string(data), time.UTC, "sacct")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].ID != "1" || got[0].BaseState() != "FAILED" || got[0].ExitCode != "3:0" || got[0].Start.IsZero() {
		t.Fatalf("sacct from slurmdbd = %+v", got)
	}
	if _, err := ParseSacct("1|2|3\n", time.UTC, "sacct"); err == nil {
		t.Fatal("a header without JobID parsed")
	}
}

func TestParseScontrol(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("testdata/scontrol-show-job.txt")
	if err != nil {
		t.Fatal(err)
	}
	jobs := ParseScontrolJobs(string(data), time.UTC)
	if len(jobs) != 3 {
		t.Fatalf("%d jobs: %+v", len(jobs), jobs)
	}
	if j := jobs[1]; j.ID != "2" || j.BaseState() != "FAILED" || j.ExitCode != "3:0" || j.Reason != "NonZeroExitCode" || j.End.IsZero() || strings.Join(j.Nodes, ",") != "fc-node1" {
		t.Fatalf("job 2 = %+v", j)
	}
	line := "NodeName=gpu-01 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 Reason=fleetcheck: gpu.xid: Xid 79 [root@2026-12-02T04:31:10]"
	st, e := ParseScontrolNode(line, "gpu-01", time.UTC)
	if st != "IDLE+DRAIN" || e == nil || !e.At.Equal(jobEnd.Add(70*time.Second)) || e.Detail != `node IDLE+DRAIN: "fleetcheck: gpu.xid: Xid 79" (by root)` {
		t.Fatalf("node: %s %+v", st, e)
	}
	if _, e := ParseScontrolNode("NodeName=gpu-01 State=IDLE Reason=(null)", "gpu-01", time.UTC); e != nil {
		t.Fatalf("a node in service has a drain: %+v", e)
	}
}

func TestExpandHostlist(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"gpu-[01-03,07],login1": "gpu-01,gpu-02,gpu-03,gpu-07,login1",
		"fc-node1":              "fc-node1",
		"a[8-10]b":              "a8b,a9b,a10b",
		"r[1-2]-n[1-2]":         "r[1-2]-n[1-2]", // several ranges: scontrol's to expand
		"":                      "",
	} {
		if got := strings.Join(ExpandHostlist(in), ","); got != want {
			t.Errorf("ExpandHostlist(%q) = %q, want %q", in, got, want)
		}
	}
	if n := len(ExpandHostlist("n[1-100000]")); n != MaxJobNodes {
		t.Fatalf("%d names, want the bound %d", n, MaxJobNodes)
	}
}

// TestTableGolden prints a whole triage (a job, its Xid 79, the check's
// change, the coordinator's drain and Slurm's) against a golden file;
// UPDATE_GOLDEN=1 rewrites it.
func TestTableGolden(t *testing.T) {
	t.Parallel()
	jobs := accountingJobs(t)
	at := func(m int) time.Time { return jobStart.Add(time.Duration(m) * time.Minute) }
	eccPass := Result{Node: "gpu-01", At: at(5), Check: report.CheckResult{Name: "gpu.ecc", Status: report.Pass}}
	eccFail := Result{Node: "gpu-01", At: at(31), Check: report.CheckResult{Name: "gpu.ecc", Status: report.Fail, Findings: []report.Finding{
		{Severity: report.SevFail, Component: "GPU3", Code: gpu.CodeECCUncorrectable, Action: report.ActionDrain}}}}
	in := Input{Node: "gpu-01", Job: "4101", Jobs: []Job{jobs["4101"]},
		Results: []Result{eccPass, xidResult(t, "gpu-01", at(5)), xidResult(t, "gpu-01", at(31), kline{at(29), "79"}), eccFail},
		Events: []Event{
			{At: at(31).Add(2 * time.Second), Kind: "state_change", Actor: "coordinator", Message: "healthy -> failed: gpu.xid fail (GPU3 XID_79)"},
			{At: at(31).Add(3 * time.Second), Kind: "audit", Actor: "drain-policy", Message: "drain gpu-01: gpu.xid fail"},
		},
		Entries: []Entry{{At: at(31).Add(4 * time.Second), Source: SourceSlurm, Kind: KindDrain, Node: "gpu-01", Detail: `node IDLE+DRAIN: "fleetcheck: gpu.xid: GPU3 XID_79" (by root)`}},
		Since:   jobStart.Add(-time.Hour), Until: jobEnd.Add(time.Hour),
		Notes: []string{"sacct not found: finished jobs only as long as slurmctld keeps them (MinJobAge)"},
	}
	rep := Build(in)
	var b bytes.Buffer
	if err := WriteTable(&b, rep, time.UTC); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "triage-table.golden")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if b.String() != string(want) {
		t.Fatalf("table differs from %s (UPDATE_GOLDEN=1 rewrites it):\n%s", golden, b.String())
	}
}

// BenchmarkBuild is a busy day of one node in a 64-node job: 10,000
// check results (an Xid 79 among them) and 64 peers' Xid results.
func BenchmarkBuild(b *testing.B) {
	at := func(s int) time.Time { return jobStart.Add(time.Duration(s) * time.Second) }
	var results, peers []Result
	for i := range 10000 {
		st := report.Pass
		var fs []report.Finding
		if i == 5001 { // a gpu.xid result
			st, fs = report.Fail, []report.Finding{xid79(at(i * 8))}
		}
		name := []string{"gpu.ecc", "gpu.xid", "gpu.thermal", "ib.ports"}[i%4]
		if name != "gpu.xid" {
			fs = nil
		}
		results = append(results, Result{Node: "gpu-01", At: at(i * 8), Check: report.CheckResult{Name: name, Status: st, Findings: fs}})
	}
	for n := range 64 {
		peers = append(peers, Result{Node: fmt.Sprintf("gpu-%02d", n+2), At: at(600), Check: report.CheckResult{Name: "gpu.xid", Status: report.Pass}})
	}
	job := Job{ID: "4101", State: "FAILED", ExitCode: "1:0", Start: jobStart, End: at(80000), Nodes: []string{"gpu-01"}}
	in := Input{Node: "gpu-01", Job: "4101", Jobs: []Job{job}, Results: results, Peers: peers, Since: jobStart.Add(-time.Hour), Until: at(90000)}
	b.ReportAllocs()
	for b.Loop() {
		if rep := Build(in); rep.Bucket != Hardware {
			b.Fatalf("bucket %s", rep.Bucket)
		}
	}
}
