package sim

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// FaultKind names a kind of injected fault.
type FaultKind string

// The fault kinds. Each changes the node's raw output the way the real
// failure does; see the fault types for what exactly.
const (
	KindECCUncorrectable FaultKind = "ecc_uncorrectable"
	KindRowRemapPending  FaultKind = "row_remap_pending"
	KindRowRemapFailure  FaultKind = "row_remap_failure"
	KindXid              FaultKind = "xid"
	KindGPUMissing       FaultKind = "gpu_missing"
	KindThermalSlowdown  FaultKind = "thermal_slowdown"
	KindPCIeDowntrained  FaultKind = "pcie_downtrained"
	KindIBPortDown       FaultKind = "ib_port_down"
	KindIBRateDrop       FaultKind = "ib_rate_drop"
	KindIBSymbolErrors   FaultKind = "ib_symbol_errors"
	KindNVLinkDegraded   FaultKind = "nvlink_degraded"
	KindNVLinkErrors     FaultKind = "nvlink_errors"
	KindHungNvidiaSMI    FaultKind = "hung_nvidia_smi"
	KindGhostProcess     FaultKind = "ghost_process"
	KindSlowNode         FaultKind = "slow_node"
	KindPeerMemMissing   FaultKind = "peermem_missing"
	KindFabricNotReady   FaultKind = "fabric_not_ready"
	KindNCCLWrongResults FaultKind = "nccl_wrong_results"
	KindDCGMFailure      FaultKind = "dcgm_failure"
	KindGPUUnreachable   FaultKind = "gpu_unreachable"
)

// TargetNode is the target of node-wide faults.
const TargetNode = "node"

// ErrBadFault is returned (wrapped) by AddFault for a fault whose target does
// not exist on the node or whose parameters are out of range.
var ErrBadFault = errors.New("sim: bad fault")

// Fault is an injected failure. A fault of the same kind and target
// replaces an earlier one, except Xid, whose events accumulate.
type Fault interface {
	Kind() FaultKind
	// Target names what the fault hits: "GPU3" (the GPU's index in the
	// spec, which is PCI bus order), an HCA name ("mlx5_4"), or "node".
	Target() string
	// apply records the fault in a view; sealed so every fault is one the
	// renderers know.
	apply(v *view, s *Spec)
}

func gpuTarget(i int) string { return "GPU" + strconv.Itoa(i) }

// ECCUncorrectable sets the GPU's DRAM uncorrectable ECC counters
// (volatile and aggregate) to Count. After Reboot only the aggregate keeps it.
type ECCUncorrectable struct {
	GPU   int
	Count uint64
}

// RowRemapPending marks a row remap pending. A Reboot applies it: the row
// stays remapped, no longer pending.
type RowRemapPending struct{ GPU int }

// RowRemapFailure marks the row remapper as failed (no spare rows left).
type RowRemapFailure struct{ GPU int }

// Xid appends an `NVRM: Xid (PCI:...)` line for the GPU to the kernel log,
// stamped at At (zero: the time it is added; a later At shows once the clock
// gets there, an At before the last boot never shows). Message defaults to
// the text the driver prints for Code; PID and Process default per code
// (-1 prints pid='<unknown>'). Reboot drops it.
type Xid struct {
	GPU     int
	Code    int
	Message string
	PID     int
	Process string
	At      time.Time
}

// GPUMissing removes the GPU from nvidia-smi (and attached_gpus) while it
// stays on the PCI bus: a GPU that fell off the bus.
type GPUMissing struct{ GPU int }

// GPUUnreachable leaves the GPU known to the driver but unable to answer
// (NVML_ERROR_UNKNOWN / GPU_IS_LOST): nvidia-smi prints "Unable to
// determine the device handle for GPU<bdf>: Unknown Error" before the XML
// of the other GPUs and exits 15. It stays on the PCI bus.
type GPUUnreachable struct{ GPU int }

// ThermalSlowdown runs the GPU hot (TempC, default 92) with
// hw_thermal_slowdown and sw_thermal_slowdown Active and clocks pulled down.
type ThermalSlowdown struct {
	GPU   int
	TempC float64
}

// PCIeDowntrained drops the GPU's current link width (default x8), in the
// XML and in sysfs.
type PCIeDowntrained struct {
	GPU   int
	Width int
}

// IBPortDown takes the HCA's port down: state "1: DOWN", phys_state
// "3: Disabled"; traffic counters stop and link_downed counts one.
type IBPortDown struct{ HCA string }

// IBRateDrop makes the port train at a lower rate (e.g. 200: "200 Gb/sec (4X HDR)").
type IBRateDrop struct {
	HCA  string
	Gbps int
}

// IBSymbolErrors makes symbol_error rise by PerPass on every snapshot of the
// file tree that reads it (the count stays after the fault is cleared, as a
// real counter does).
type IBSymbolErrors struct {
	HCA     string
	PerPass uint64
}

// NVLinkDegraded makes the GPU's last Links links inactive and multiplies
// all_reduce busbw by Factor (0: the share of links still up).
type NVLinkDegraded struct {
	GPU    int
	Links  int
	Factor float64
}

// NVLinkErrors makes one link's replay errors rise by PerPass on every
// `nvidia-smi nvlink` capture.
type NVLinkErrors struct {
	GPU     int
	Link    int
	PerPass uint64
}

// HungNvidiaSMI makes every nvidia-smi call block until its context ends,
// then return a timeout: a driver stuck in D state.
type HungNvidiaSMI struct{}

// GhostProcess leaves a process holding MiB of the GPU's memory with no job.
type GhostProcess struct {
	GPU  int
	MiB  uint64
	PID  int    // default derived from the GPU
	Name string // default "python3"
}

// SlowNode multiplies all_reduce bandwidth by Factor (0 < Factor <= 1 for slow).
type SlowNode struct{ Factor float64 }

// PeerMemMissing unloads nvidia_peermem: GPUDirect RDMA is off.
type PeerMemMissing struct{}

// FabricNotReady leaves the NVSwitch fabric "In Progress" (Fabric Manager
// not running or mismatched); CUDA, and so all_reduce_perf, cannot start.
type FabricNotReady struct{}

// NCCLWrongResults makes all_reduce_perf report Count wrong elements at the
// largest sizes (data corruption), so the footer says FAILED.
type NCCLWrongResults struct{ Count uint64 }

// DCGMFailure makes a dcgmi diag test fail on the GPU with Warning. Test is a
// DCGM test name ("GPU Memory", "PCIe", "Diagnostic"); it must run at the
// spec's level to show.
type DCGMFailure struct {
	GPU     int
	Test    string
	Warning string
}

func (ECCUncorrectable) Kind() FaultKind { return KindECCUncorrectable }
func (RowRemapPending) Kind() FaultKind  { return KindRowRemapPending }
func (RowRemapFailure) Kind() FaultKind  { return KindRowRemapFailure }
func (Xid) Kind() FaultKind              { return KindXid }
func (GPUMissing) Kind() FaultKind       { return KindGPUMissing }
func (ThermalSlowdown) Kind() FaultKind  { return KindThermalSlowdown }
func (PCIeDowntrained) Kind() FaultKind  { return KindPCIeDowntrained }
func (IBPortDown) Kind() FaultKind       { return KindIBPortDown }
func (IBRateDrop) Kind() FaultKind       { return KindIBRateDrop }
func (IBSymbolErrors) Kind() FaultKind   { return KindIBSymbolErrors }
func (NVLinkDegraded) Kind() FaultKind   { return KindNVLinkDegraded }
func (NVLinkErrors) Kind() FaultKind     { return KindNVLinkErrors }
func (HungNvidiaSMI) Kind() FaultKind    { return KindHungNvidiaSMI }
func (GhostProcess) Kind() FaultKind     { return KindGhostProcess }
func (SlowNode) Kind() FaultKind         { return KindSlowNode }
func (PeerMemMissing) Kind() FaultKind   { return KindPeerMemMissing }
func (FabricNotReady) Kind() FaultKind   { return KindFabricNotReady }
func (NCCLWrongResults) Kind() FaultKind { return KindNCCLWrongResults }
func (DCGMFailure) Kind() FaultKind      { return KindDCGMFailure }
func (GPUUnreachable) Kind() FaultKind   { return KindGPUUnreachable }

func (f ECCUncorrectable) Target() string { return gpuTarget(f.GPU) }
func (f RowRemapPending) Target() string  { return gpuTarget(f.GPU) }
func (f RowRemapFailure) Target() string  { return gpuTarget(f.GPU) }
func (f Xid) Target() string              { return gpuTarget(f.GPU) }
func (f GPUMissing) Target() string       { return gpuTarget(f.GPU) }
func (f ThermalSlowdown) Target() string  { return gpuTarget(f.GPU) }
func (f PCIeDowntrained) Target() string  { return gpuTarget(f.GPU) }
func (f IBPortDown) Target() string       { return f.HCA }
func (f IBRateDrop) Target() string       { return f.HCA }
func (f IBSymbolErrors) Target() string   { return f.HCA }
func (f NVLinkDegraded) Target() string   { return gpuTarget(f.GPU) }
func (f NVLinkErrors) Target() string     { return gpuTarget(f.GPU) }
func (HungNvidiaSMI) Target() string      { return TargetNode }
func (f GhostProcess) Target() string     { return gpuTarget(f.GPU) }
func (SlowNode) Target() string           { return TargetNode }
func (PeerMemMissing) Target() string     { return TargetNode }
func (FabricNotReady) Target() string     { return TargetNode }
func (NCCLWrongResults) Target() string   { return TargetNode }
func (f DCGMFailure) Target() string      { return gpuTarget(f.GPU) }
func (f GPUUnreachable) Target() string   { return gpuTarget(f.GPU) }

// GPUFellOffBus is the usual pair for a GPU lost in service: Xid 79 in the
// kernel log and the GPU gone from nvidia-smi.
func GPUFellOffBus(gpu int) []Fault {
	return []Fault{Xid{GPU: gpu, Code: 79}, GPUMissing{GPU: gpu}}
}

// UncorrectableECCEvent is what a contained uncorrectable DRAM error looks
// like on Hopper: the counters, Xid 94 (the application killed), Xid 63 (a
// row marked for remapping) and the remap pending until the next reset.
func UncorrectableECCEvent(gpu int, count uint64) []Fault {
	return []Fault{ECCUncorrectable{GPU: gpu, Count: count}, Xid{GPU: gpu, Code: 94}, Xid{GPU: gpu, Code: 63}, RowRemapPending{GPU: gpu}}
}

// view is the node's fault state folded per component. It is rebuilt on
// every change and never modified afterwards, so renderers read it unlocked.
type view struct {
	gpus []gpuFaults
	hcas []hcaFaults

	hung           bool
	peermemMissing bool
	fabricNotReady bool
	slow           float64 // busbw multiplier, 1 when healthy
	ncclWrong      uint64
	gpusPresent    int
	burning        bool // a gpu-burn action runs: GPUs hot, at full power
}

type gpuFaults struct {
	missing      bool
	unreachable  bool // missing from the XML, named in a handle error line
	eccVolatile  uint64
	eccAggregate uint64
	remapPending bool
	remapApplied uint64 // pending remaps a reboot applied
	remapFailure bool
	hotC         float64 // 0 when not hot
	width        int     // 0 when healthy
	linksDown    int
	linkFactor   float64 // busbw multiplier from NVLink loss, 1 when healthy
	ghost        *GhostProcess
	dcgm         []DCGMFailure
}

type hcaFaults struct {
	down          bool
	rate          int // 0 when healthy
	symbolPerPass uint64
}

func (f ECCUncorrectable) apply(v *view, _ *Spec) {
	g := &v.gpus[f.GPU]
	g.eccVolatile += f.Count
	g.eccAggregate += f.Count
}
func (f RowRemapPending) apply(v *view, _ *Spec) { v.gpus[f.GPU].remapPending = true }
func (f RowRemapFailure) apply(v *view, _ *Spec) { v.gpus[f.GPU].remapFailure = true }
func (Xid) apply(_ *view, _ *Spec)               {}
func (f GPUMissing) apply(v *view, _ *Spec)      { v.gpus[f.GPU].missing = true }
func (f GPUUnreachable) apply(v *view, _ *Spec) {
	v.gpus[f.GPU].missing, v.gpus[f.GPU].unreachable = true, true
}
func (f ThermalSlowdown) apply(v *view, _ *Spec) {
	t := f.TempC
	if t == 0 {
		t = 92
	}
	v.gpus[f.GPU].hotC = t
}
func (f PCIeDowntrained) apply(v *view, _ *Spec) {
	w := f.Width
	if w == 0 {
		w = 8
	}
	v.gpus[f.GPU].width = w
}
func (f IBPortDown) apply(v *view, s *Spec) { v.hcas[s.hcaIndex(f.HCA)].down = true }
func (f IBRateDrop) apply(v *view, s *Spec) { v.hcas[s.hcaIndex(f.HCA)].rate = f.Gbps }
func (f IBSymbolErrors) apply(v *view, s *Spec) {
	v.hcas[s.hcaIndex(f.HCA)].symbolPerPass += f.PerPass
}
func (f NVLinkDegraded) apply(v *view, _ *Spec) {
	g := &v.gpus[f.GPU]
	g.linksDown = f.Links
	g.linkFactor = f.Factor
}
func (NVLinkErrors) apply(_ *view, _ *Spec)   {}
func (HungNvidiaSMI) apply(v *view, _ *Spec)  { v.hung = true }
func (f GhostProcess) apply(v *view, _ *Spec) { g := f; v.gpus[f.GPU].ghost = &g }
func (f SlowNode) apply(v *view, _ *Spec)     { v.slow *= f.Factor }
func (PeerMemMissing) apply(v *view, _ *Spec) { v.peermemMissing = true }
func (FabricNotReady) apply(v *view, _ *Spec) { v.fabricNotReady = true }
func (f NCCLWrongResults) apply(v *view, _ *Spec) {
	v.ncclWrong += f.Count
}
func (f DCGMFailure) apply(v *view, _ *Spec) {
	v.gpus[f.GPU].dcgm = append(v.gpus[f.GPU].dcgm, f)
}

// validate checks a fault against the node's spec.
func (s *Spec) validate(f Fault) error {
	gpu := func(i int) error {
		if i < 0 || i >= len(s.GPUs) {
			return fmt.Errorf("%w: %s: node has %d GPUs", ErrBadFault, f.Kind(), len(s.GPUs))
		}
		return nil
	}
	hca := func(name string) error {
		if s.hcaIndex(name) < 0 {
			return fmt.Errorf("%w: %s: no HCA %q", ErrBadFault, f.Kind(), name)
		}
		return nil
	}
	switch f := f.(type) {
	case ECCUncorrectable:
		return gpu(f.GPU)
	case RowRemapPending:
		return gpu(f.GPU)
	case RowRemapFailure:
		return gpu(f.GPU)
	case Xid:
		if f.Code <= 0 {
			return fmt.Errorf("%w: xid code %d", ErrBadFault, f.Code)
		}
		return gpu(f.GPU)
	case GPUMissing:
		return gpu(f.GPU)
	case GPUUnreachable:
		return gpu(f.GPU)
	case ThermalSlowdown:
		return gpu(f.GPU)
	case PCIeDowntrained:
		if f.Width < 0 || f.Width > 32 {
			return fmt.Errorf("%w: pcie width %d", ErrBadFault, f.Width)
		}
		return gpu(f.GPU)
	case IBPortDown:
		return hca(f.HCA)
	case IBRateDrop:
		if f.Gbps <= 0 {
			return fmt.Errorf("%w: ib rate %d", ErrBadFault, f.Gbps)
		}
		return hca(f.HCA)
	case IBSymbolErrors:
		return hca(f.HCA)
	case NVLinkDegraded:
		if err := gpu(f.GPU); err != nil {
			return err
		}
		if f.Links < 0 || f.Links > s.GPUs[f.GPU].Model.NVLinks || f.Factor < 0 || math.IsNaN(f.Factor) {
			return fmt.Errorf("%w: nvlink degraded links=%d factor=%g", ErrBadFault, f.Links, f.Factor)
		}
	case NVLinkErrors:
		if err := gpu(f.GPU); err != nil {
			return err
		}
		if f.Link < 0 || f.Link >= s.GPUs[f.GPU].Model.NVLinks {
			return fmt.Errorf("%w: nvlink %d", ErrBadFault, f.Link)
		}
	case GhostProcess:
		return gpu(f.GPU)
	case SlowNode:
		if !(f.Factor > 0) || math.IsInf(f.Factor, 0) {
			return fmt.Errorf("%w: slow node factor %g", ErrBadFault, f.Factor)
		}
	case DCGMFailure:
		if f.Test == "" {
			return fmt.Errorf("%w: dcgm failure without a test name", ErrBadFault)
		}
		return gpu(f.GPU)
	case HungNvidiaSMI, PeerMemMissing, FabricNotReady, NCCLWrongResults:
	default:
		return fmt.Errorf("%w: unknown fault %T", ErrBadFault, f)
	}
	return nil
}

func (s *Spec) hcaIndex(name string) int {
	for i := range s.HCAs {
		if s.HCAs[i].Name == name {
			return i
		}
	}
	return -1
}

// xidDefaults is what the driver prints after the code for the Xids a drill
// injects most; other codes get a generic text.
func xidDefaults(code int) (msg string, pid int, process string) {
	switch code {
	case 13:
		return "Graphics SM Warp Exception on (GPC 1, TPC 2, SM 0): Out Of Range Address", 0, ""
	case 31:
		return "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_1e000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ", 0, ""
	case 43:
		return "Ch 00000008", 0, ""
	case 45:
		return "Ch 00000008", 0, ""
	case 48:
		return "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.", -1, ""
	case 63:
		return "Row Remapper: New row (0x00000000a3e0c100) marked for remapping, reset gpu to activate.", -1, ""
	case 64:
		return "Row Remapper Error: (0x00000002eebc4100) - All reserved rows for bank are remapped", -1, ""
	case 74:
		return "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)", -1, ""
	case 79:
		return "GPU has fallen off the bus.", -1, ""
	case 92:
		return "High single-bit ECC error rate", -1, ""
	case 94:
		return "Ch 00000008", 0, ""
	case 95:
		return "Uncontained: FBHUB. RST: Yes, D-RST: No", -1, ""
	case 119:
		return "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).", 0, "nvidia-smi"
	default:
		return "Ch 00000001", -1, ""
	}
}
