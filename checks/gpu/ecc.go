package gpu

import (
	"fmt"
	"sort"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// ECC is gpu.ecc: uncorrectable ECC errors, row remapping (Ampere and
// later), page retirement (before Ampere), the SRAM error threshold and the
// recovery action or reset the driver asks for. Correctable errors are
// normal wear, corrected in hardware: they are metrics only.
type ECC struct{}

// Name implements checks.Check.
func (ECC) Name() string { return "gpu.ecc" }

// Needs implements checks.Check.
func (ECC) Needs() []snapshot.Source { return []snapshot.Source{snapshot.SrcNvidiaSMI} }

// Disruptive implements checks.Check.
func (ECC) Disruptive() bool { return false }

// Run implements checks.Check.
func (ECC) Run(in checks.Input) checks.Result {
	gs, res, ok := gpus(in)
	if !ok {
		return res
	}
	maxRetired := conf(in).Limits.RetiredPagesMax
	judged := 0
	for _, g := range gs {
		if eccGPU(&res, g, maxRetired) {
			judged++
		}
	}
	if judged == 0 {
		return checks.Skipf("no GPU reports ECC counters, row remapping, retired pages or a recovery state (ECC off or not supported)")
	}
	return res
}

// eccGPU judges one GPU and reports whether it had anything to judge.
func eccGPU(res *checks.Result, g snapshot.GPU, maxRetired uint64) bool {
	judged := false
	counts := func(set string, c snapshot.ECCCounts) {
		if c.Uncorrectable != nil {
			judged = true
			res.Metric(metric(g, "ecc."+set+"_uncorrectable_count"), float64(*c.Uncorrectable))
		}
		if c.Correctable != nil {
			res.Metric(metric(g, "ecc."+set+"_correctable_count"), float64(*c.Correctable))
		}
	}
	counts("volatile", g.ECC.Volatile)
	counts("aggregate", g.ECC.Aggregate)

	vol, agg := g.ECC.Volatile.Uncorrectable, g.ECC.Aggregate.Uncorrectable
	if (vol != nil && *vol > 0) || (agg != nil && *agg > 0) {
		res.Add(finding(g, report.SevFail, CodeECCUncorrectable, report.ActionDrain,
			"uncorrectable ECC errors: %s volatile, %s aggregate%s",
			countText(vol), countText(agg), detailText(g.ECC)))
	}

	if t := g.ECC.SRAMThresholdExceeded; t != nil {
		judged = true
		if *t {
			res.Add(finding(g, report.SevFail, CodeSRAMThresholdExceeded, report.ActionReplace,
				"SRAM uncorrectable errors are over the threshold for replacement%s", detailText(g.ECC)))
		}
	}

	if rr := g.RemappedRows; rr != nil {
		judged = true
		res.Metric(metric(g, "remapped_rows.correctable_count"), float64(rr.Correctable))
		res.Metric(metric(g, "remapped_rows.uncorrectable_count"), float64(rr.Uncorrectable))
		res.Metric(metric(g, "remapped_rows.pending_flag"), boolMetric(rr.Pending))
		res.Metric(metric(g, "remapped_rows.failure_flag"), boolMetric(rr.Failure))
		if rr.Failure {
			res.Add(finding(g, report.SevFail, CodeRowRemapFailure, report.ActionReplace,
				"row remapping failed (%d rows remapped for uncorrectable, %d for correctable errors): no spare rows left",
				rr.Uncorrectable, rr.Correctable))
		}
		if rr.Pending {
			res.Add(finding(g, report.SevWarn, CodeRowRemapPending, report.ActionResetGPU,
				"a row remap is pending (%d uncorrectable, %d correctable rows so far): reset the GPU to apply it",
				rr.Uncorrectable, rr.Correctable))
		}
	}

	if rp := g.RetiredPages; rp != nil {
		judged = true
		var total uint64
		if rp.SingleBit != nil {
			total += *rp.SingleBit
			res.Metric(metric(g, "retired_pages.single_bit_count"), float64(*rp.SingleBit))
		}
		if rp.DoubleBit != nil {
			total += *rp.DoubleBit
			res.Metric(metric(g, "retired_pages.double_bit_count"), float64(*rp.DoubleBit))
		}
		if total > maxRetired {
			res.Add(finding(g, report.SevFail, CodeRetiredPagesLimit, report.ActionReplace,
				"%d retired pages (%s single-bit, %s double-bit), limit %d",
				total, countText(rp.SingleBit), countText(rp.DoubleBit), maxRetired))
		}
		if rp.Pending != nil && *rp.Pending {
			res.Add(finding(g, report.SevWarn, CodeRetiredPagesPending, report.ActionResetGPU,
				"a page retirement is pending: reset the GPU to apply it"))
		}
	}

	if a := strings.TrimSpace(g.RecoveryAction); a != "" {
		judged = true
		if act, needed := recoveryAction(a); needed {
			res.Add(finding(g, report.SevFail, CodeRecoveryAction, act,
				"the driver asks for recovery: %q", a))
		}
	}
	if r := g.ResetRequired; r != nil {
		judged = true
		if *r {
			res.Add(finding(g, report.SevWarn, CodeResetRequired, report.ActionResetGPU,
				"the driver reports that the GPU needs a reset"))
		}
	}
	if d := g.DrainAndReset; d != nil {
		judged = true
		if *d {
			res.Add(finding(g, report.SevWarn, CodeDrainAndReset, report.ActionDrain,
				"the driver recommends draining the GPU and resetting it"))
		}
	}
	return judged
}

// recoveryAction maps gpu_recovery_action onto the report's actions; needed
// is false for "None".
func recoveryAction(a string) (act report.Action, needed bool) {
	switch strings.ToLower(a) {
	case "none":
		return report.ActionNone, false
	case "gpu reset", "bus reset":
		return report.ActionResetGPU, true
	case "node reboot", "system reboot":
		return report.ActionReboot, true
	case "drain p2p", "drain and reset":
		return report.ActionDrain, true
	}
	// An action this code does not know yet still asks for something: take
	// the GPU out of service until someone reads the message.
	return report.ActionDrain, true
}

func countText(p *uint64) string {
	if p == nil {
		return "unknown"
	}
	return fmt.Sprint(*p)
}

// detailText lists the non-zero uncorrectable counters by name.
func detailText(e snapshot.ECC) string {
	var parts []string
	for _, set := range []struct {
		name string
		c    snapshot.ECCCounts
	}{{"volatile", e.Volatile}, {"aggregate", e.Aggregate}} {
		keys := make([]string, 0, len(set.c.Detail))
		for k, v := range set.c.Detail {
			if v > 0 && (strings.Contains(k, "uncorrectable") || strings.HasPrefix(k, "double_bit.")) &&
				!strings.HasSuffix(k, ".total") {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s %s=%d", set.name, k, set.c.Detail[k]))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}
