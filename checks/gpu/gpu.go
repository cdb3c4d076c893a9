// Package gpu holds the gpu.* checks. It judges the node's GPUs as
// nvidia-smi or NVML report them (gpu.inventory, gpu.config, gpu.ecc,
// gpu.thermal, gpu.pcie, gpu.processes), what the driver says about them
// beyond their own counters: gpu.xid (Xid lines in the kernel log),
// gpu.nvlink (NVLink state and error counters) and gpu.fabric (NVSwitch
// fabric, Fabric Manager, SXids), and gpu.peermem (GPUDirect RDMA's
// kernel module).
//
// Findings name a GPU as "GPU<i>" (its index in nvidia-smi order) and carry
// its PCI bus id; findings about the node as a whole use "node".
//
// Actions, and why:
//   - Uncorrectable ECC errors, a recovery action of "Drain P2P" or "Drain
//     and Reset", and thermal slowdown take the GPU out of service: drain.
//     A GPU throttling for heat slows every collective on the node, which is
//     the expensive kind of failure.
//   - Row-remap failure, a retired-page count over the limit and an SRAM
//     error threshold exceeded are worn-out memory: replace.
//   - A pending row remap or page retirement, a reset the driver asks for,
//     a pending ECC mode and a MIG mode to change: reset_gpu.
//   - A narrowed PCIe link and a GPU on the bus that the driver does not
//     show: reseat. A driver that hangs while GPUs sit on the bus: reboot.
//   - Processes left holding memory on an idle node: restart_app (the
//     owner must clean up); memory held with no process to blame: reset_gpu.
//   - Drift of persistence or compute mode is fixed live (nvidia-smi -pm /
//     -c): none, with the command in the message.
//
// Metrics (per GPU i). Names end in their unit (metricunits_test.go lists
// the suffixes): _count for counts, _flag for 0/1, _c, _w, _mib, _lanes,
// _gen for a PCIe generation.
//
//	gpu.count, gpu.unreachable_count                     gpu.inventory
//	gpu<i>.ecc.volatile_uncorrectable_count              gpu.ecc
//	gpu<i>.ecc.volatile_correctable_count
//	gpu<i>.ecc.aggregate_uncorrectable_count
//	gpu<i>.ecc.aggregate_correctable_count
//	gpu<i>.remapped_rows.correctable_count
//	gpu<i>.remapped_rows.uncorrectable_count
//	gpu<i>.remapped_rows.pending_flag                    0 or 1
//	gpu<i>.remapped_rows.failure_flag                    0 or 1
//	gpu<i>.retired_pages.single_bit_count
//	gpu<i>.retired_pages.double_bit_count
//	gpu<i>.temperature_c                                 gpu.thermal
//	gpu<i>.memory_temperature_c
//	gpu<i>.power_w
//	gpu<i>.pcie.link_gen                                 gpu.pcie (current link)
//	gpu<i>.pcie.width_lanes
//	gpu<i>.pcie.replay_count
//	gpu<i>.process_count                                 gpu.processes
//	gpu<i>.memory_used_mib
//
// A value the GPU does not report is left out, never written as zero.
package gpu

import (
	"fmt"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Finding codes. They are stable: dashboards and drain reasons key on them.
const (
	// gpu.inventory
	CodeDriverNotResponding  = "DRIVER_NOT_RESPONDING"
	CodeDriverMissing        = "GPU_DRIVER_MISSING"
	CodeGPUCountLow          = "GPU_COUNT_LOW"
	CodeGPUCountHigh         = "GPU_COUNT_HIGH"
	CodeGPUMissingFromDriver = "GPU_MISSING_FROM_DRIVER"
	CodeGPUModelMismatch     = "GPU_MODEL_MISMATCH"
	CodeGPUModelMixed        = "GPU_MODEL_MIXED"
	CodeGPUQueryErrors       = "GPU_QUERY_ERRORS"
	CodeGPUUnreachable       = "GPU_UNREACHABLE"

	// gpu.config
	CodeECCModeMismatch             = "ECC_MODE_MISMATCH"
	CodeECCModePending              = "ECC_MODE_PENDING"
	CodeECCModeInconsistent         = "ECC_MODE_INCONSISTENT"
	CodePersistenceModeMismatch     = "PERSISTENCE_MODE_MISMATCH"
	CodePersistenceModeInconsistent = "PERSISTENCE_MODE_INCONSISTENT"
	CodeMIGModeMismatch             = "MIG_MODE_MISMATCH"
	CodeMIGModeInconsistent         = "MIG_MODE_INCONSISTENT"
	CodeComputeModeMismatch         = "COMPUTE_MODE_MISMATCH"
	CodeComputeModeInconsistent     = "COMPUTE_MODE_INCONSISTENT"
	CodeConfigUnknown               = "GPU_CONFIG_UNKNOWN"

	// gpu.ecc
	CodeECCUncorrectable      = "ECC_UNCORRECTABLE"
	CodeRowRemapFailure       = "ROW_REMAP_FAILURE"
	CodeRowRemapPending       = "ROW_REMAP_PENDING"
	CodeRetiredPagesLimit     = "RETIRED_PAGES_LIMIT"
	CodeRetiredPagesPending   = "RETIRED_PAGES_PENDING"
	CodeRecoveryAction        = "GPU_RECOVERY_ACTION"
	CodeResetRequired         = "GPU_RESET_REQUIRED"
	CodeDrainAndReset         = "GPU_DRAIN_AND_RESET_RECOMMENDED"
	CodeSRAMThresholdExceeded = "SRAM_THRESHOLD_EXCEEDED"

	// gpu.thermal
	CodeGPUTempHigh     = "GPU_TEMP_HIGH"
	CodeGPUTempWarn     = "GPU_TEMP_WARN"
	CodeMemoryTempHigh  = "MEMORY_TEMP_HIGH"
	CodeThermalSlowdown = "THERMAL_SLOWDOWN"
	CodeHWSlowdown      = "HW_SLOWDOWN"

	// gpu.pcie
	CodePCIeWidthDegraded = "PCIE_WIDTH_DEGRADED"
	CodePCIeGenDegraded   = "PCIE_GEN_DEGRADED"

	// gpu.processes
	CodeGhostProcess = "GHOST_PROCESS"
	CodeGhostMemory  = "GHOST_MEMORY"
)

// conf returns the input's config, or the defaults when there is none.
func conf(in checks.Input) *config.Config {
	if in.Config != nil {
		return in.Config
	}
	return config.Defaults()
}

// gpus returns the GPU list of a check whose runner has already made sure
// the nvidia-smi source is ok; ok is false with a result to return when
// there is nothing to judge.
func gpus(in checks.Input) ([]snapshot.GPU, checks.Result, bool) {
	if in.Snap == nil || in.Snap.GPU == nil {
		return nil, checks.Errorf("no GPU state in the snapshot although %s is ok", snapshot.SrcNvidiaSMI), false
	}
	if len(in.Snap.GPU.GPUs) == 0 {
		return nil, checks.Skipf("the driver reports no GPUs (gpu.inventory judges whether there should be some)"), false
	}
	return in.Snap.GPU.GPUs, checks.Result{Status: report.Pass}, true
}

func finding(g snapshot.GPU, sev report.Severity, code string, action report.Action, format string, a ...any) report.Finding {
	return report.Finding{
		Severity:  sev,
		Component: checks.GPUComponent(g.Index),
		PCIBusID:  g.PCIBusID,
		Code:      code,
		Message:   fmt.Sprintf(format, a...),
		Action:    action,
	}
}

// metric names a per-GPU metric: gpu<i>.<what>.
func metric(g snapshot.GPU, what string) string {
	return fmt.Sprintf("gpu%d.%s", g.Index, what)
}

func boolMetric(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func onOff(b bool) string {
	if b {
		return "enabled"
	}
	return "disabled"
}

func formatC(v float64) string { return fmt.Sprintf("%.0f °C", v) }

func formatW(v float64) string { return fmt.Sprintf("%.0f W", v) }
