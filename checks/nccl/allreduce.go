package nccl

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// nccl.allreduce finding codes.
const (
	CodeNCCLFailure        = "NCCL_FAILURE"
	CodeNCCLWarning        = "NCCL_WARNING"
	CodeNCCLDataCorruption = "NCCL_DATA_CORRUPTION"
	CodeNCCLBusBWLow       = "NCCL_BUSBW_LOW"
	CodeNCCLBelowBaseline  = "NCCL_BELOW_BASELINE"
	CodeNCCLSocketFallback = "NCCL_SOCKET_FALLBACK"
)

// nccl.allreduce metrics. The deviation is the shortfall below the
// baseline as a fraction of it (0.25 = 25 % slower; negative = faster),
// reported only when a baseline is configured.
const (
	MetricBusBW     = "nccl.allreduce.busbw_gbps"     // at the largest size
	MetricSize      = "nccl.allreduce.size_bytes"     // that size
	MetricAvgBusBW  = "nccl.allreduce.avg_busbw_gbps" // the tool's average over all sizes
	MetricBaseline  = "nccl.allreduce.baseline_gbps"
	MetricDeviation = "nccl.allreduce.deviation_ratio"
	MetricWrong     = "nccl.allreduce.wrong_count" // #wrong summed over sizes, when validated
)

// DefaultMaxDeviation is used when the config leaves nccl.max_deviation at
// zero: a zero tolerance on a noisy bandwidth would fail every run.
const DefaultMaxDeviation = 0.30

// deviationEpsilon keeps a shortfall of exactly the limit (30 % of 400 is
// 120, computed as 0.30000000000000004) from failing on rounding.
const deviationEpsilon = 1e-9

// AllReduce is the nccl.allreduce check: the all_reduce_perf run judged at
// its largest message size (the average includes latency-bound small
// sizes), against a floor, a baseline and the expected transport.
//
// Actions: wrong results drain (a GPU or link corrupts data); bandwidth
// below floor or baseline and a TCP fallback drain (a slow node slows every
// job it joins; its links need checking); a failed test run only asks to
// monitor, because the failure line alone does not say which node or part
// is at fault (in a multi-node run it may be the peer), while the failed
// status still blocks acceptance. The transport is only known when the run
// had NCCL_DEBUG=INFO; it is named in every bandwidth message.
type AllReduce struct{}

var _ checks.Check = AllReduce{}

// Name is the check's fixed name.
func (AllReduce) Name() string { return "nccl.allreduce" }

// Needs the all_reduce_perf output.
func (AllReduce) Needs() []snapshot.Source { return []snapshot.Source{snapshot.SrcAllReduce} }

// Disruptive: the test takes every GPU and the network.
func (AllReduce) Disruptive() bool { return true }

// Run judges the run.
func (AllReduce) Run(in checks.Input) checks.Result {
	if in.Snap == nil || in.Snap.AllReduce == nil {
		return checks.Errorf("%s: no parsed run", snapshot.SrcAllReduce)
	}
	run := in.Snap.AllReduce
	cfg := in.Config
	if cfg == nil {
		cfg = config.Defaults()
	}
	res := checks.Result{Status: report.Pass}

	failed := judgeFailures(&res, run)
	judgeCorruption(&res, run)

	row, ok := run.Largest()
	if !ok {
		if len(res.Findings) > 0 {
			return res
		}
		return checks.Errorf("%s: no result rows", snapshot.SrcAllReduce)
	}
	busbw := row.BusBW()
	if !finite(busbw) || busbw < 0 {
		res.Status = report.Worse(res.Status, report.Error)
		res.Reason = fmt.Sprintf("bus bandwidth at %s is not a number", sizeText(row.SizeBytes))
		return res
	}
	res.Metric(MetricBusBW, busbw)
	res.Metric(MetricSize, float64(row.SizeBytes))
	if run.AvgBusBW != nil && finite(*run.AvgBusBW) {
		res.Metric(MetricAvgBusBW, *run.AvgBusBW)
	}
	where := fmt.Sprintf("%.1f GB/s at %s (%s)", busbw, sizeText(row.SizeBytes), transportText(run))

	if floor := cfg.NCCL.MinBusBWGBps; floor > 0 && busbw < floor {
		res.Add(report.Finding{
			Severity:  report.SevFail,
			Component: checks.NodeComponent,
			Code:      CodeNCCLBusBWLow,
			Message:   fmt.Sprintf("all-reduce bus bandwidth %s is below the floor of %.1f GB/s", where, floor),
			Action:    report.ActionDrain,
		})
	}
	if base := cfg.NCCL.BaselineGBps; base > 0 && finite(base) {
		dev := (base - busbw) / base
		res.Metric(MetricBaseline, base)
		res.Metric(MetricDeviation, dev)
		limit := cfg.NCCL.MaxDeviation
		if limit <= 0 {
			limit = DefaultMaxDeviation
		}
		if dev > limit+deviationEpsilon {
			res.Add(report.Finding{
				Severity:  report.SevFail,
				Component: checks.NodeComponent,
				Code:      CodeNCCLBelowBaseline,
				Message: fmt.Sprintf("all-reduce bus bandwidth %s is %.1f%% below the baseline of %.1f GB/s (limit %.0f%%): check the node's NVLink and network links",
					where, dev*100, base, limit*100),
				Action: report.ActionDrain,
			})
		}
	}
	if cfg.NCCL.ExpectTransport == "IB" && run.Transport == "Socket" {
		res.Add(report.Finding{
			Severity:  report.SevFail,
			Component: checks.NodeComponent,
			Code:      CodeNCCLSocketFallback,
			Message: fmt.Sprintf("NCCL fell back to TCP sockets (NET/Socket) where InfiniBand is expected; bus bandwidth %.1f GB/s at %s: check the HCAs, the RDMA stack and NCCL_IB_HCA",
				busbw, sizeText(row.SizeBytes)),
			Action: report.ActionDrain,
		})
	}
	// A run whose output stops before the summary was cut short: its
	// largest size may not be the one asked for, so a clean result here
	// decides nothing.
	if !failed && run.AvgBusBW == nil && run.OutOfBounds == nil && res.Status != report.Fail {
		res.Status = report.Error
		res.Reason = fmt.Sprintf("all_reduce_perf output ends before its summary lines (last size %s): the run was cut short", sizeText(row.SizeBytes))
	}
	return res
}

// judgeFailures turns failure lines and a non-zero exit into findings and
// reports whether the run failed. NCCL WARN lines alone, in a run that
// measured every size, only warn: NCCL warns about recoverable events too.
func judgeFailures(res *checks.Result, run *snapshot.AllReduceRun) bool {
	var fails, warns []string
	for _, l := range run.Failures {
		if strings.Contains(l, "NCCL WARN") {
			warns = append(warns, l)
		} else {
			fails = append(fails, l)
		}
	}
	switch {
	case len(fails) > 0 || (len(warns) > 0 && len(run.Rows) == 0):
		lines := slices.Concat(fails, warns)
		msg := "all_reduce_perf failed: " + quote(lines[0])
		if len(fails) > 0 && len(warns) > 0 {
			msg += "; first NCCL warning: " + quote(warns[0])
		}
		if n := len(lines) - 1; n > 0 {
			msg += fmt.Sprintf(" (%d more failure lines)", n)
		}
		if run.ExitCode != 0 {
			msg += fmt.Sprintf("; exit status %d", run.ExitCode)
		}
		res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
			Code: CodeNCCLFailure, Message: msg, Action: report.ActionMonitor})
		return true
	case run.ExitCode != 0:
		res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
			Code:    CodeNCCLFailure,
			Message: fmt.Sprintf("all_reduce_perf exited with status %d", run.ExitCode), Action: report.ActionMonitor})
		if len(warns) > 0 {
			res.Findings[len(res.Findings)-1].Message += "; first NCCL warning: " + quote(warns[0])
		}
		return true
	case len(warns) > 0:
		msg := "NCCL warned during the run: " + quote(warns[0])
		if n := len(warns) - 1; n > 0 {
			msg += fmt.Sprintf(" (%d more)", n)
		}
		res.Add(report.Finding{Severity: report.SevWarn, Component: checks.NodeComponent,
			Code: CodeNCCLWarning, Message: msg, Action: report.ActionMonitor})
	}
	return false
}

// judgeCorruption fails on any #wrong at any size or a FAILED out-of-bounds
// footer: a collective that returns wrong data is worse than a slow one.
func judgeCorruption(res *checks.Result, run *snapshot.AllReduceRun) {
	var total uint64
	validated := false
	var sizes []uint64
	for _, r := range run.Rows {
		var n uint64
		for _, w := range []*uint64{r.OutOfPlace.Wrong, r.InPlace.Wrong} {
			if w != nil {
				validated = true
				n += *w
			}
		}
		if n > 0 {
			total += n
			sizes = append(sizes, r.SizeBytes)
		}
	}
	if validated {
		res.Metric(MetricWrong, float64(total))
	}
	if total == 0 && !run.OutOfBoundsFailed {
		return
	}
	var parts []string
	if total > 0 {
		slices.Sort(sizes)
		shown := make([]string, 0, 4)
		for i, s := range sizes {
			if i == 4 {
				shown = append(shown, fmt.Sprintf("and %d more", len(sizes)-4))
				break
			}
			shown = append(shown, sizeText(s))
		}
		noun := "sizes"
		if len(sizes) == 1 {
			noun = "size"
		}
		parts = append(parts, fmt.Sprintf("%d wrong elements at %d message %s (%s)", total, len(sizes), noun, strings.Join(shown, ", ")))
	}
	if run.OutOfBoundsFailed {
		oob := "FAILED"
		if run.OutOfBounds != nil {
			oob = fmt.Sprintf("%d FAILED", *run.OutOfBounds)
		}
		parts = append(parts, "out of bounds values: "+oob)
	}
	res.Add(report.Finding{
		Severity:  report.SevFail,
		Component: checks.NodeComponent,
		Code:      CodeNCCLDataCorruption,
		Message:   "all-reduce returned wrong data: " + strings.Join(parts, "; "),
		Action:    report.ActionDrain,
	})
}

func transportText(run *snapshot.AllReduceRun) string {
	switch {
	case run.Transport == "IB" && run.GPUDirect:
		return "transport IB with GPUDirect RDMA"
	case run.Transport != "":
		return "transport " + run.Transport
	default:
		return "transport unknown"
	}
}

// sizeText prints a message size the way operators pass it to -e ("8 GiB").
func sizeText(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	v := n
	for i < len(units)-1 && v >= 1024 && v%1024 == 0 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%d %s", v, units[i])
}
