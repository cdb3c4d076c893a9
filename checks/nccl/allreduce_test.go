package nccl

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	ncclprobe "github.com/fleetcheck/fleetcheck/node/probe/nccl"
)

func u64(v uint64) *uint64   { return &v }
func f64(v float64) *float64 { return &v }

// row builds a validated row whose out-of-place busbw is the better one.
func row(size uint64, busbw float64, wrong uint64) snapshot.AllReduceRow {
	return snapshot.AllReduceRow{
		SizeBytes: size, Count: size / 4, Type: "float", RedOp: "sum",
		OutOfPlace: snapshot.AllReduceResult{TimeUS: 100, AlgBW: busbw / 1.75, BusBW: busbw, Wrong: u64(wrong)},
		InPlace:    snapshot.AllReduceResult{TimeUS: 101, AlgBW: busbw / 1.75, BusBW: busbw - 1, Wrong: u64(0)},
	}
}

// healthyRun is a finished 8 GiB run at the given busbw.
func healthyRun(busbw float64) *snapshot.AllReduceRun {
	return &snapshot.AllReduceRun{
		Rows:        []snapshot.AllReduceRow{row(1<<20, 9.2, 0), row(8<<30, busbw, 0), row(1<<30, busbw*0.96, 0)},
		AvgBusBW:    f64(busbw / 4),
		OutOfBounds: u64(0),
		Devices:     8,
	}
}

func snapWith(run *snapshot.AllReduceRun) *snapshot.Snapshot {
	s := &snapshot.Snapshot{AllReduce: run}
	s.SetSource(snapshot.SrcAllReduce, snapshot.SourceState{State: snapshot.StateOK})
	return s
}

func ncclConfig(min, base, maxDev float64, transport string) *config.Config {
	c := config.Defaults()
	c.NCCL.MinBusBWGBps = min
	c.NCCL.BaselineGBps = base
	c.NCCL.MaxDeviation = maxDev
	c.NCCL.ExpectTransport = transport
	return c
}

// runCheck goes through checks.Run so source gating, defaults and sorting
// are exercised as in production.
func runCheck(t *testing.T, c checks.Check, s *snapshot.Snapshot, cfg *config.Config) report.CheckResult {
	t.Helper()
	out := checks.Run([]checks.Check{c}, checks.Input{Snap: s, Config: cfg})
	if len(out) != 1 {
		t.Fatalf("%d results", len(out))
	}
	r := out[0]
	for k, v := range r.Metrics {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Errorf("metric %s = %v", k, v)
		}
		if k != strings.ToLower(k) {
			t.Errorf("metric %s not lowercase", k)
		}
	}
	for _, f := range r.Findings {
		if f.Component == "" || f.Code == "" || f.Message == "" || f.Action == "" {
			t.Errorf("incomplete finding %+v", f)
		}
		if f.Code != strings.ToUpper(f.Code) {
			t.Errorf("code %q not upper-snake", f.Code)
		}
	}
	return r
}

func codes(r report.CheckResult) []string {
	var out []string
	for _, f := range r.Findings {
		out = append(out, f.Code)
	}
	return out
}

func TestAllReduceContract(t *testing.T) {
	t.Parallel()
	c := AllReduce{}
	if c.Name() != "nccl.allreduce" || !c.Disruptive() || len(c.Needs()) != 1 || c.Needs()[0] != snapshot.SrcAllReduce {
		t.Errorf("contract: %s %v %v", c.Name(), c.Disruptive(), c.Needs())
	}
}

func TestAllReduceTable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		run     *snapshot.AllReduceRun
		cfg     *config.Config
		status  report.Status
		codes   []string
		metrics map[string]float64
		absent  []string // metrics that must not be reported
		msg     []string // substrings of the first finding's message
		reason  string
	}{
		{
			name: "healthy, no baseline, no floor: pass with metrics", run: healthyRun(479.02), cfg: config.Defaults(),
			status:  report.Pass,
			metrics: map[string]float64{MetricBusBW: 479.02, MetricSize: 8 << 30, MetricAvgBusBW: 479.02 / 4, MetricWrong: 0},
			absent:  []string{MetricDeviation, MetricBaseline},
		},
		{
			name: "nil config uses the defaults", run: healthyRun(479.02), cfg: nil, status: report.Pass,
		},
		{
			name: "largest size judged, max of in/out-of-place", cfg: ncclConfig(400, 0, 0, ""),
			run: func() *snapshot.AllReduceRun {
				r := healthyRun(300)
				r.Rows[1].InPlace.BusBW = 450 // in-place is better at 8 GiB
				return r
			}(),
			status: report.Pass, metrics: map[string]float64{MetricBusBW: 450},
		},
		{
			name: "below the floor", run: healthyRun(366.76), cfg: ncclConfig(400, 0, 0, ""),
			status: report.Fail, codes: []string{CodeNCCLBusBWLow},
			msg: []string{"366.8 GB/s at 8 GiB", "floor of 400.0 GB/s", "transport unknown"},
		},
		{
			name: "30 % below baseline is not above the limit", run: healthyRun(280), cfg: ncclConfig(0, 400, 0.30, ""),
			status: report.Pass, metrics: map[string]float64{MetricDeviation: 0.30000000000000004, MetricBaseline: 400},
		},
		{
			name: "exactly 0.30 with a zero config limit uses the default", run: healthyRun(70), cfg: ncclConfig(0, 100, 0, ""),
			status: report.Pass,
		},
		{
			name: "just over 30 % below baseline", run: healthyRun(279.9), cfg: ncclConfig(0, 400, 0.30, ""),
			status: report.Fail, codes: []string{CodeNCCLBelowBaseline},
			msg: []string{"279.9 GB/s at 8 GiB", "30.0% below the baseline of 400.0 GB/s", "limit 30%"},
		},
		{
			name: "custom tighter limit", run: healthyRun(366.76), cfg: ncclConfig(0, 479, 0.10, ""),
			status: report.Fail, codes: []string{CodeNCCLBelowBaseline}, msg: []string{"23.4% below"},
		},
		{
			name: "faster than baseline: negative deviation", run: healthyRun(500), cfg: ncclConfig(0, 400, 0.3, ""),
			status: report.Pass, metrics: map[string]float64{MetricDeviation: -0.25},
		},
		{
			name: "wrong at one size, OOB failed", cfg: config.Defaults(),
			run: func() *snapshot.AllReduceRun {
				r := healthyRun(477)
				r.Rows[0].OutOfPlace.Wrong = u64(8192)
				r.Rows[0].InPlace.Wrong = u64(8192)
				r.OutOfBounds = u64(16384)
				r.OutOfBoundsFailed = true
				return r
			}(),
			status: report.Fail, codes: []string{CodeNCCLDataCorruption},
			metrics: map[string]float64{MetricWrong: 16384, MetricBusBW: 477},
			msg:     []string{"16384 wrong elements at 1 message size (1 MiB)", "out of bounds values: 16384 FAILED"},
		},
		{
			name: "wrong at many sizes, listed smallest first and bounded", cfg: config.Defaults(),
			run: func() *snapshot.AllReduceRun {
				r := healthyRun(477)
				r.Rows = nil
				for i := 30; i >= 25; i-- {
					r.Rows = append(r.Rows, row(1<<i, 400, 1))
				}
				return r
			}(),
			status: report.Fail, codes: []string{CodeNCCLDataCorruption}, metrics: map[string]float64{MetricWrong: 6},
			msg: []string{"6 wrong elements at 6 message sizes (32 MiB, 64 MiB, 128 MiB, 256 MiB, and 2 more)"},
		},
		{
			name: "OOB failed alone (old layout, no counts)", cfg: config.Defaults(),
			run: func() *snapshot.AllReduceRun {
				r := healthyRun(128)
				for i := range r.Rows {
					r.Rows[i].OutOfPlace.Wrong, r.Rows[i].InPlace.Wrong = nil, nil
				}
				r.OutOfBounds = u64(3)
				r.OutOfBoundsFailed = true
				return r
			}(),
			status: report.Fail, codes: []string{CodeNCCLDataCorruption}, absent: []string{MetricWrong},
			msg: []string{"out of bounds values: 3 FAILED"},
		},
		{
			name: "socket fallback where IB expected", cfg: ncclConfig(0, 0, 0, "IB"),
			run:    func() *snapshot.AllReduceRun { r := healthyRun(11.2); r.Transport = "Socket"; return r }(),
			status: report.Fail, codes: []string{CodeNCCLSocketFallback}, msg: []string{"NET/Socket", "11.2 GB/s"},
		},
		{
			name: "socket transport without an expectation passes", cfg: config.Defaults(),
			run:    func() *snapshot.AllReduceRun { r := healthyRun(11.2); r.Transport = "Socket"; return r }(),
			status: report.Pass,
		},
		{
			name: "IB with GDR named in messages", cfg: ncclConfig(500, 0, 0, "IB"),
			run:    func() *snapshot.AllReduceRun { r := healthyRun(460); r.Transport = "IB"; r.GPUDirect = true; return r }(),
			status: report.Fail, codes: []string{CodeNCCLBusBWLow}, msg: []string{"transport IB with GPUDirect RDMA"},
		},
		{
			name: "test failure without rows", cfg: config.Defaults(),
			run: &snapshot.AllReduceRun{Failures: []string{
				"node-b:1:2 [0] misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer",
				"node-b: Test NCCL failure common.cu:1005 'remote process exited or there was a network error / '",
				" .. node-b pid 30108: Test failure common.cu:891",
			}, ExitCode: 3},
			status: report.Fail, codes: []string{CodeNCCLFailure},
			msg: []string{"all_reduce_perf failed: node-b: Test NCCL failure common.cu:1005", "first NCCL warning: node-b:1:2", "2 more failure lines", "exit status 3"},
		},
		{
			name: "NCCL WARN only, no rows: failed run", cfg: config.Defaults(),
			run:    &snapshot.AllReduceRun{Failures: []string{"h:1:1 [0] NCCL WARN Cuda failure 'out of memory'"}},
			status: report.Fail, codes: []string{CodeNCCLFailure},
		},
		{
			name: "NCCL WARN with a complete run only warns", cfg: config.Defaults(),
			run: func() *snapshot.AllReduceRun {
				r := healthyRun(470)
				r.Failures = []string{"h:1:1 [0] NCCL WARN NET/IB : Got async event : GID table change"}
				return r
			}(),
			status: report.Warn, codes: []string{CodeNCCLWarning}, metrics: map[string]float64{MetricBusBW: 470},
		},
		{
			name: "non-zero exit without failure lines", cfg: config.Defaults(),
			run:    func() *snapshot.AllReduceRun { r := healthyRun(470); r.ExitCode = 1; return r }(),
			status: report.Fail, codes: []string{CodeNCCLFailure}, msg: []string{"exited with status 1"},
		},
		{
			name: "failure lines and slow bandwidth both reported", cfg: ncclConfig(400, 0, 0, ""),
			run: func() *snapshot.AllReduceRun {
				r := healthyRun(100)
				r.Failures = []string{"h: Test failure common.cu:891"}
				return r
			}(),
			status: report.Fail, codes: []string{CodeNCCLBusBWLow, CodeNCCLFailure},
		},
		{
			name: "no rows and no failures: error", cfg: config.Defaults(),
			run: &snapshot.AllReduceRun{}, status: report.Error, reason: "no result rows",
		},
		{
			name: "cut short before the summary: error, metrics kept", cfg: config.Defaults(),
			run: func() *snapshot.AllReduceRun {
				r := healthyRun(470)
				r.AvgBusBW, r.OutOfBounds = nil, nil
				return r
			}(),
			status: report.Error, reason: "cut short", metrics: map[string]float64{MetricBusBW: 470},
		},
		{
			name: "NaN busbw in a hand-built run is an error, not a metric", cfg: config.Defaults(),
			run:    func() *snapshot.AllReduceRun { r := healthyRun(math.NaN()); return r }(),
			status: report.Error, absent: []string{MetricBusBW},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := runCheck(t, AllReduce{}, snapWith(c.run), c.cfg)
			if r.Status != c.status {
				t.Fatalf("status = %s, want %s (reason %q, findings %+v)", r.Status, c.status, r.Reason, r.Findings)
			}
			got := codes(r)
			if strings.Join(got, ",") != strings.Join(c.codes, ",") {
				t.Errorf("codes = %v, want %v", got, c.codes)
			}
			for k, v := range c.metrics {
				if g, ok := r.Metrics[k]; !ok || math.Abs(g-v) > 1e-9 {
					t.Errorf("metric %s = %v (present %v), want %v", k, g, ok, v)
				}
			}
			for _, k := range c.absent {
				if _, ok := r.Metrics[k]; ok {
					t.Errorf("metric %s reported", k)
				}
			}
			for _, s := range c.msg {
				if len(r.Findings) == 0 || !strings.Contains(r.Findings[0].Message, s) {
					t.Errorf("first message lacks %q: %+v", s, r.Findings)
				}
			}
			if !strings.Contains(r.Reason, c.reason) {
				t.Errorf("reason = %q, want %q", r.Reason, c.reason)
			}
		})
	}
}

func TestAllReduceActions(t *testing.T) {
	t.Parallel()
	want := map[string]report.Action{
		CodeNCCLDataCorruption: report.ActionDrain,
		CodeNCCLBusBWLow:       report.ActionDrain,
		CodeNCCLBelowBaseline:  report.ActionDrain,
		CodeNCCLSocketFallback: report.ActionDrain,
		CodeNCCLFailure:        report.ActionMonitor,
	}
	run := healthyRun(10)
	run.Transport = "Socket"
	run.Rows[0].InPlace.Wrong = u64(1)
	run.Failures = []string{"h: Test NCCL failure common.cu:1 'x'"}
	r := runCheck(t, AllReduce{}, snapWith(run), ncclConfig(100, 400, 0.3, "IB"))
	if len(r.Findings) != len(want) {
		t.Fatalf("findings = %+v", r.Findings)
	}
	for _, f := range r.Findings {
		if f.Action != want[f.Code] || f.Component != checks.NodeComponent || f.Severity != report.SevFail {
			t.Errorf("%s: %+v", f.Code, f)
		}
	}
}

func TestAllReduceSourceGate(t *testing.T) {
	t.Parallel()
	absent := runCheck(t, AllReduce{}, &snapshot.Snapshot{}, nil)
	if absent.Status != report.Skip {
		t.Errorf("absent source: %s", absent.Status)
	}
	s := &snapshot.Snapshot{}
	s.SetSource(snapshot.SrcAllReduce, snapshot.SourceState{State: snapshot.StateFailed, Error: "parse all_reduce_perf output: no result rows"})
	if r := runCheck(t, AllReduce{}, s, nil); r.Status != report.Error || !strings.Contains(r.Reason, "no result rows") {
		t.Errorf("failed source: %+v", r)
	}
	if r := runCheck(t, AllReduce{}, snapWith(nil), nil); r.Status != report.Error {
		t.Errorf("ok source without a run: %+v", r)
	}
}

// TestAllReduceFixtures runs the check on the parsed nccl fixtures.
func TestAllReduceFixtures(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("..", "..", "node", "probe", "nccl", "testdata")
	cases := []struct {
		file   string
		cfg    *config.Config
		status report.Status
		codes  []string
		busbw  float64
	}{
		{"SYNTHETIC__h100x8_single-node_nvls_healthy_480GBps.txt", ncclConfig(400, 480, 0.3, ""), report.Pass, nil, 479.02},
		// 370 vs 480 is 23.6 % below: inside 30 %, outside 20 %.
		{"SYNTHETIC__h100x8_single-node_DEGRADED_nvls-off_370GBps.txt", ncclConfig(0, 480, 0.3, ""), report.Pass, nil, 366.76},
		{"SYNTHETIC__h100x8_single-node_DEGRADED_nvls-off_370GBps.txt", ncclConfig(0, 480, 0.2, ""), report.Fail, []string{CodeNCCLBelowBaseline}, 366.76},
		{"SYNTHETIC__h100x8_single-node_DATA-CORRUPTION_wrong.txt", config.Defaults(), report.Fail, []string{CodeNCCLDataCorruption}, 477.04},
		{"nccl-tests-issue309__h100x16_2node_cx7-ndr400_good_469GBps.txt", ncclConfig(400, 450, 0.3, "IB"), report.Pass, nil, 469.21},
		{"nccl-tests-v2.19.4__a100x8_single-node_dkh__provenance-unidentified.txt", ncclConfig(0, 230, 0.3, ""), report.Pass, nil, 182.90},
		{"skypilot-nebius__h100x16_2node_ib__table-excerpt.txt", ncclConfig(0, 0, 0, "IB"), report.Pass, nil, 477.42},
		{"SYNTHETIC__v100x8_single-node_OLD-LAYOUT_error-column.txt", config.Defaults(), report.Pass, nil, 128.26},
		{"SYNTHETIC__h100x16_2node_DEBUG-INFO_ib-gdrdma.txt", ncclConfig(0, 0, 0, "IB"), report.Pass, nil, 461.21},
		{"SYNTHETIC__h100x16_2node_DEBUG-INFO_SOCKET-FALLBACK.txt", ncclConfig(0, 460, 0.3, "IB"), report.Fail,
			[]string{CodeNCCLBelowBaseline, CodeNCCLSocketFallback}, 11.19},
		{"SYNTHETIC__h100x16_2node_TEST-NCCL-FAILURE_no-rows.txt", config.Defaults(), report.Fail, []string{CodeNCCLFailure}, -1},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(filepath.Join(dir, c.file))
			if err != nil {
				t.Fatal(err)
			}
			run, err := ncclprobe.Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			r := runCheck(t, AllReduce{}, snapWith(run), c.cfg)
			if r.Status != c.status || strings.Join(codes(r), ",") != strings.Join(c.codes, ",") {
				t.Fatalf("status %s codes %v, want %s %v (%+v)", r.Status, codes(r), c.status, c.codes, r.Findings)
			}
			if got, ok := r.Metrics[MetricBusBW]; c.busbw >= 0 && (!ok || got != c.busbw) {
				t.Errorf("busbw metric = %v, want %v", got, c.busbw)
			}
		})
	}
}

func TestSizeText(t *testing.T) {
	t.Parallel()
	for n, want := range map[uint64]string{8: "8 B", 1024: "1 KiB", 8 << 30: "8 GiB", 17179869184: "16 GiB", 1000: "1000 B", 3 << 20: "3 MiB"} {
		if got := sizeText(n); got != want {
			t.Errorf("sizeText(%d) = %q, want %q", n, got, want)
		}
	}
}
