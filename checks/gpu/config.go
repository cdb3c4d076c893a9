package gpu

import (
	"fmt"
	"sort"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Config is gpu.config: ECC, persistence, MIG and compute mode against
// expect.*; a mode without an expectation is judged by the GPUs' majority,
// since one GPU set differently from its siblings is drift. A pending ECC
// mode that differs from the current one warns: it changes at the next
// reset, whether anyone meant it or not.
type Config struct{}

// Name implements checks.Check.
func (Config) Name() string { return "gpu.config" }

// Needs implements checks.Check.
func (Config) Needs() []snapshot.Source { return []snapshot.Source{snapshot.SrcNvidiaSMI} }

// Disruptive implements checks.Check.
func (Config) Disruptive() bool { return false }

// mode is one configuration setting read off every GPU.
type mode struct {
	what         string // "ECC mode"
	mismatch     string // code when it differs from the expectation (fail)
	inconsistent string // code when it differs from the majority (warn)
	action       report.Action
	fix          string
	value        func(snapshot.GPU) string // "" when the GPU does not report it
	want         string                    // "" without an expectation
	// unreported is what a GPU that does not report the setting runs
	// with, when that is certain: a GPU without MIG runs with it off.
	unreported string
}

func boolMode(p *bool) string {
	if p == nil {
		return ""
	}
	return onOff(*p)
}

func expectBool(p *bool) string {
	if p == nil {
		return ""
	}
	return onOff(*p)
}

// normMode makes "Exclusive Process" and "exclusive_process" one value.
func normMode(s string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), " ", "_")
}

func modes(e config.Expect) []mode {
	return []mode{
		{
			what: "ECC mode", mismatch: CodeECCModeMismatch, inconsistent: CodeECCModeInconsistent,
			action: report.ActionResetGPU, fix: "set it with nvidia-smi -e, then reset the GPU",
			value: func(g snapshot.GPU) string { return boolMode(g.ECCEnabled) },
			want:  expectBool(e.ECCEnabled),
		},
		{
			what: "persistence mode", mismatch: CodePersistenceModeMismatch, inconsistent: CodePersistenceModeInconsistent,
			action: report.ActionNone, fix: "set it with nvidia-smi -pm or the nvidia-persistenced service",
			value: func(g snapshot.GPU) string { return boolMode(g.PersistenceMode) },
			want:  expectBool(e.PersistenceMode),
		},
		{
			what: "MIG mode", mismatch: CodeMIGModeMismatch, inconsistent: CodeMIGModeInconsistent,
			action: report.ActionResetGPU, fix: "set it with nvidia-smi -mig, then reset the GPU",
			value:      func(g snapshot.GPU) string { return boolMode(g.MIGEnabled) },
			want:       expectBool(e.MIGEnabled),
			unreported: onOff(false),
		},
		{
			what: "compute mode", mismatch: CodeComputeModeMismatch, inconsistent: CodeComputeModeInconsistent,
			action: report.ActionNone, fix: "set it with nvidia-smi -c",
			value: func(g snapshot.GPU) string { return normMode(g.ComputeMode) },
			want:  normMode(e.ComputeMode),
		},
	}
}

// Run implements checks.Check.
func (Config) Run(in checks.Input) checks.Result {
	gs, res, ok := gpus(in)
	if !ok {
		return res
	}
	known := false
	for _, m := range modes(conf(in).Expect) {
		if m.want != "" {
			known = true
			expected(&res, gs, m)
			continue
		}
		if majority(&res, gs, m) {
			known = true
		}
	}
	for _, g := range gs {
		if g.ECCEnabled != nil && g.ECCPending != nil && *g.ECCEnabled != *g.ECCPending {
			res.Add(finding(g, report.SevWarn, CodeECCModePending, report.ActionResetGPU,
				"ECC mode is %s and becomes %s at the next GPU reset", onOff(*g.ECCEnabled), onOff(*g.ECCPending)))
		}
	}
	if !known {
		return checks.Skipf("no GPU reports its ECC, persistence or compute mode and nothing is expected")
	}
	return res
}

func expected(res *checks.Result, gs []snapshot.GPU, m mode) {
	for _, g := range gs {
		v := m.value(g)
		if v == "" {
			v = m.unreported
		}
		switch {
		case v == "":
			res.Add(finding(g, report.SevWarn, CodeConfigUnknown, report.ActionMonitor,
				"%s is not reported; expected %s", m.what, m.want))
		case v != m.want:
			res.Add(finding(g, report.SevFail, m.mismatch, m.action,
				"%s is %s, expected %s: %s", m.what, v, m.want, m.fix))
		}
	}
}

// majority warns about GPUs whose setting differs from most of their
// siblings; with a tie there is no majority and the node gets one warning.
// It reports whether any GPU reported the setting.
func majority(res *checks.Result, gs []snapshot.GPU, m mode) bool {
	count := map[string]int{}
	for _, g := range gs {
		if v := m.value(g); v != "" {
			count[v]++
		}
	}
	if len(count) < 2 {
		return len(count) > 0
	}
	type vc struct {
		v string
		n int
	}
	var list []vc
	for v, n := range count {
		list = append(list, vc{v, n})
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].n != list[j].n {
			return list[i].n > list[j].n
		}
		return list[i].v < list[j].v
	})
	if list[0].n == list[1].n {
		parts := make([]string, len(list))
		for i, e := range list {
			parts[i] = fmt.Sprintf("%d %s", e.n, e.v)
		}
		res.Add(report.Finding{Severity: report.SevWarn, Component: checks.NodeComponent,
			Code: m.inconsistent, Action: m.action,
			Message: fmt.Sprintf("GPUs disagree on %s: %s; %s", m.what, strings.Join(parts, ", "), m.fix)})
		return true
	}
	top := list[0]
	for _, g := range gs {
		if v := m.value(g); v != "" && v != top.v {
			res.Add(finding(g, report.SevWarn, m.inconsistent, m.action,
				"%s is %s while %d of %d GPUs have %s: %s", m.what, v, top.n, len(gs), top.v, m.fix))
		}
	}
	return true
}
