package gpu

import (
	"path"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Processes is gpu.processes: on a node that should be idle
// (processes.expect_idle), any process holding GPU memory that is not in
// processes.allowed is a ghost, typically left behind by a job killed with
// -9. Memory held with no process listed is a ghost too (or a process in
// another PID namespace), since only a GPU reset frees it. Without
// expect_idle the check only measures.
//
// A snapshot cannot tell whether a listed PID still exists; the finding
// names the PID for the operator to check (fuser -v /dev/nvidia*).
type Processes struct{}

// Name implements checks.Check.
func (Processes) Name() string { return "gpu.processes" }

// Needs implements checks.Check.
func (Processes) Needs() []snapshot.Source { return []snapshot.Source{snapshot.SrcNvidiaSMI} }

// Disruptive implements checks.Check.
func (Processes) Disruptive() bool { return false }

// idleSlackMiB is the memory an idle GPU may show as used with nothing
// running: driver and MIG-instance overhead (an A100 with four MIG
// instances shows 50 MiB). A CUDA context alone takes several hundred MiB,
// so a ghost is still well above it.
const idleSlackMiB = 256

// Run implements checks.Check.
func (Processes) Run(in checks.Input) checks.Result {
	gs, res, ok := gpus(in)
	if !ok {
		return res
	}
	pc := conf(in).Processes
	for _, g := range gs {
		res.Metric(metric(g, "process_count"), float64(len(g.Processes)))
		if g.MemoryUsedMiB != nil {
			res.Metric(metric(g, "memory_used_mib"), float64(*g.MemoryUsedMiB))
		}
		if !pc.ExpectIdle {
			continue
		}
		for _, p := range g.Processes {
			if allowed(p.Name, pc.Allowed) {
				continue
			}
			name := p.Name
			if name == "" {
				name = "(name unknown)"
			}
			mem := "an unknown amount of memory"
			if p.UsedMemoryMiB != nil {
				mem = formatMiB(*p.UsedMemoryMiB)
			}
			res.Add(finding(g, report.SevWarn, CodeGhostProcess, report.ActionRestartApp,
				"pid %d %s holds %s on a node that should be idle", p.PID, name, mem))
		}
		if len(g.Processes) == 0 && g.MemoryUsedMiB != nil && *g.MemoryUsedMiB > idleSlackMiB {
			res.Add(finding(g, report.SevWarn, CodeGhostMemory, report.ActionResetGPU,
				"%s of GPU memory in use with no process listed on a node that should be idle", formatMiB(*g.MemoryUsedMiB)))
		}
	}
	return res
}

// allowed matches a process by its full name or its base name, so
// "nv-hostengine" allows "/usr/bin/nv-hostengine".
func allowed(name string, list []string) bool {
	if name == "" {
		return false
	}
	base := path.Base(name)
	for _, a := range list {
		a = strings.TrimSpace(a)
		if a != "" && (a == name || a == base) {
			return true
		}
	}
	return false
}

func formatMiB(v uint64) string { return strconv.FormatUint(v, 10) + " MiB" }
