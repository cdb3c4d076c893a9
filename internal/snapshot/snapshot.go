// Package snapshot holds the normalized view of one node that probes produce
// and checks read. It has no behaviour beyond small helpers: probes fill it,
// checks judge it, and nothing here touches the host.
package snapshot

import "time"

// Source names one raw input of a snapshot. The names double as the keys of
// a bundle manifest's "sources" object, so they must not change.
type Source string

const (
	SrcNvidiaSMI  Source = "nvidia-smi.xml"        // nvidia-smi -q -x (or NVML on live hosts)
	SrcNVLink     Source = "nvidia-smi-nvlink.txt" // nvidia-smi nvlink --status / -e
	SrcKernelLog  Source = "dmesg.txt"             // dmesg / dmesg -T / --time-format iso / kmsg
	SrcAllReduce  Source = "all_reduce_perf.txt"   // nccl-tests all_reduce_perf stdout
	SrcDCGMDiag   Source = "dcgmi-diag.json"       // dcgmi diag -r N -j stdout
	SrcVersions   Source = "versions.json"         // kernel, fabric manager, rdma stack
	SrcInfiniBand Source = "sysfs-infiniband"      // /sys/class/infiniband tree
	SrcPCI        Source = "sysfs-pci"             // /sys/bus/pci/devices tree
	SrcModules    Source = "proc-modules"          // /proc/modules
	SrcUptime     Source = "proc-uptime"           // /proc/uptime
	SrcDriver     Source = "proc-driver-version"   // /proc/driver/nvidia/version
)

// State says how reading a source went.
type State string

const (
	StateAbsent  State = "absent"  // the host does not have it: checks skip
	StateOK      State = "ok"      // read and parsed
	StateFailed  State = "failed"  // the tool ran and failed, or the data did not parse: checks error
	StateTimeout State = "timeout" // the tool hung: checks error
)

// SourceState records the outcome of one source, with the reason when it was
// not ok. A parse error is recorded as StateFailed with the parser's message.
type SourceState struct {
	State    State  `json:"status"`
	ExitCode int    `json:"exit_code,omitempty"`
	Error    string `json:"error,omitempty"`
	// Via says which path produced the data ("nvml", "nvidia-smi", "bundle", "sim").
	Via string `json:"via,omitempty"`
}

// Snapshot is everything one probe pass learned about a node.
type Snapshot struct {
	Hostname    string
	CollectedAt time.Time
	// Uptime is the node's uptime at CollectedAt; zero when unknown. Plain
	// dmesg timestamps are seconds since boot and need it to become wall time.
	Uptime time.Duration

	Sources map[Source]SourceState

	GPU       *GPUState     // nil unless SrcNvidiaSMI is ok
	PCI       []PCIDevice   // NVIDIA and Mellanox functions found on the PCI bus
	NVLink    *NVLinkState  // nil unless SrcNVLink is ok
	Kernel    *KernelLog    // nil unless SrcKernelLog is ok
	HCAs      []HCA         // InfiniBand / RoCE adapters under /sys/class/infiniband
	AllReduce *AllReduceRun // nil unless SrcAllReduce is ok
	DCGM      *DCGMDiag     // nil unless SrcDCGMDiag is ok
	Versions  Versions
	// Modules lists loaded kernel module names (from /proc/modules); nil when unknown.
	Modules []string
}

// Source returns the recorded state of src, StateAbsent when nothing was recorded.
func (s *Snapshot) Source(src Source) SourceState {
	if s == nil || s.Sources == nil {
		return SourceState{State: StateAbsent}
	}
	st, ok := s.Sources[src]
	if !ok {
		return SourceState{State: StateAbsent}
	}
	return st
}

// SetSource records the outcome of one source.
func (s *Snapshot) SetSource(src Source, st SourceState) {
	if s.Sources == nil {
		s.Sources = make(map[Source]SourceState)
	}
	s.Sources[src] = st
}

// HasModule reports whether a kernel module is loaded; ok is false when the
// module list is unknown.
func (s *Snapshot) HasModule(name string) (loaded, ok bool) {
	if s.Modules == nil {
		return false, false
	}
	for _, m := range s.Modules {
		if m == name {
			return true, true
		}
	}
	return false, true
}

// Versions are the software versions that matter for compatibility and for
// the baseline key. Empty means unknown.
type Versions struct {
	Driver        string `json:"driver,omitempty"`
	CUDA          string `json:"cuda,omitempty"`
	Kernel        string `json:"kernel,omitempty"`
	FabricManager string `json:"fabric_manager,omitempty"`
	RDMAStack     string `json:"rdma_stack,omitempty"` // "MLNX_OFED 23.10-1.1.9.0", "DOCA 2.10.0", "inbox"
	NCCL          string `json:"nccl,omitempty"`
	DCGM          string `json:"dcgm,omitempty"`
}

// GPUState is what nvidia-smi -q -x or NVML says about the node's GPUs.
type GPUState struct {
	DriverVersion string
	CUDAVersion   string
	// AttachedGPUs is the count the driver reports; it can differ from
	// len(GPUs) with MIG or masked devices.
	AttachedGPUs int
	GPUs         []GPU
	// Errors lists queries that failed for a reason other than "not
	// supported" (NVML returning GPU_IS_LOST, UNKNOWN...), each naming the
	// GPU and the call. The rest of the state is still valid.
	Errors []string `json:",omitempty"`
	// Unreachable lists GPUs the driver knows but nvidia-smi cannot talk
	// to ("Unable to determine the device handle for GPU0000:9B:00.0:
	// Unknown Error"). They are not in GPUs.
	Unreachable []UnreachableGPU `json:",omitempty"`
}

// UnreachableGPU is a GPU nvidia-smi named but could not query.
type UnreachableGPU struct {
	PCIBusID string // normalized like GPU.PCIBusID
	// Index is its position in nvidia-smi order when known, -1 otherwise.
	Index int
	Error string // "Unknown Error", "GPU is lost"
}

// GPU is one physical GPU. Pointer fields are nil when the value is not
// reported, "N/A" or "[Not Supported]": unknown is not zero.
type GPU struct {
	Index          int    // position in nvidia-smi order (PCI bus order)
	Name           string // "NVIDIA H100 80GB HBM3"
	Architecture   string // "Hopper"
	UUID           string
	Serial         string
	PCIBusID       string // normalized "0000:19:00.0", lowercase, 4-digit domain
	VBIOS          string
	MemoryTotalMiB *uint64
	MemoryUsedMiB  *uint64

	PersistenceMode *bool
	ECCEnabled      *bool // current ECC mode
	ECCPending      *bool // pending ECC mode (after reset)
	MIGEnabled      *bool // current MIG mode; nil when not supported
	ComputeMode     string

	ECC           ECC
	RetiredPages  *RetiredPages // pre-Ampere page retirement; nil when N/A
	RemappedRows  *RemappedRows // Ampere+ row remapping; nil when N/A
	ResetRequired *bool         // gpu_reset_status/reset_required
	DrainAndReset *bool         // gpu_reset_status/drain_and_reset_recommended
	// RecoveryAction is gpu_recovery_action from newer drivers ("None",
	// "GPU Reset", "Node Reboot", "Drain P2P", "Drain and Reset"); empty when absent.
	RecoveryAction string

	TemperatureC   *float64
	MemoryTempC    *float64
	SlowdownTempC  *float64 // gpu_temp_slow_threshold (absolute °C)
	ShutdownTempC  *float64
	MaxOperatingC  *float64 // gpu_temp_max_gpu_threshold / target
	PowerDrawW     *float64
	PowerLimitW    *float64
	UtilizationPct *float64
	SMClockMHz     *float64
	MaxSMClockMHz  *float64
	// ClockEvents maps a normalized reason name (gpu_idle, sw_power_cap,
	// hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown,
	// sw_thermal_slowdown, sync_boost, applications_clocks_setting,
	// display_clocks_setting) to whether it is active. From either
	// clocks_event_reasons or the older clocks_throttle_reasons.
	ClockEvents map[string]bool

	PCIe PCIeLink

	// Fabric is the NVSwitch fabric registration; nil when N/A (no fabric).
	Fabric *Fabric

	Processes []GPUProcess
}

// ECC holds ECC error counters. Total* sum the kinds that the schema offers,
// so old (single/double bit) and new (SRAM/DRAM) schemas compare.
type ECC struct {
	Volatile  ECCCounts
	Aggregate ECCCounts
	// SRAMThresholdExceeded is aggregate/sram_threshold_exceeded when reported.
	SRAMThresholdExceeded *bool
}

// ECCCounts are one set (volatile or aggregate) of counters. Nil is unknown.
type ECCCounts struct {
	Correctable   *uint64
	Uncorrectable *uint64
	// Detail keeps each reported counter by its element name
	// ("dram_uncorrectable", "sram_uncorrectable_parity", "double_bit.device_memory"...).
	Detail map[string]uint64
}

// RetiredPages is the pre-Ampere dynamic page retirement state.
type RetiredPages struct {
	SingleBit *uint64
	DoubleBit *uint64
	Pending   *bool
}

// RemappedRows is the Ampere+ row remapper state.
type RemappedRows struct {
	Correctable   uint64
	Uncorrectable uint64
	Pending       bool
	Failure       bool
}

// PCIeLink is the GPU's PCIe link. Zero means unknown.
type PCIeLink struct {
	GenCurrent   int
	GenMax       int
	WidthCurrent int
	WidthMax     int
	// ReplayCounter counts PCIe replays; nil when unknown.
	ReplayCounter *uint64
}

// Fabric is the NVSwitch fabric registration state of one GPU.
type Fabric struct {
	State       string // "Completed", "In Progress", "Not Started", "Not Supported"
	Status      string // "Success" or an error text
	CliqueID    string
	ClusterUUID string
}

// GPUProcess is a process holding GPU memory.
type GPUProcess struct {
	PID           int
	Name          string
	Type          string // "C", "G", "C+G"
	UsedMemoryMiB *uint64
}

// PCIDevice is one PCI function read from /sys/bus/pci/devices.
type PCIDevice struct {
	Address string // "0000:19:00.0"
	Vendor  uint16 // 0x10de NVIDIA, 0x15b3 Mellanox
	Device  uint16
	Class   uint32 // 0x030200 3D controller, 0x030000 VGA
	Driver  string // bound driver name, "" when none or unknown
	// Link widths and speeds from sysfs; 0 when unknown.
	CurrentLinkWidth int
	MaxLinkWidth     int
	CurrentLinkSpeed string // "32.0 GT/s PCIe"
	MaxLinkSpeed     string
}

// VendorNVIDIA and VendorMellanox are PCI vendor ids.
const (
	VendorNVIDIA   uint16 = 0x10de
	VendorMellanox uint16 = 0x15b3
)

// IsNVIDIAGPU reports whether the function is an NVIDIA display or 3D
// controller (a GPU, not an NVSwitch or audio function).
func (d PCIDevice) IsNVIDIAGPU() bool {
	if d.Vendor != VendorNVIDIA {
		return false
	}
	base := d.Class >> 16
	sub := (d.Class >> 8) & 0xff
	return base == 0x03 && (sub == 0x00 || sub == 0x02)
}

// NVLinkState is the per-GPU NVLink status.
type NVLinkState struct {
	GPUs []NVLinkGPU
}

// NVLinkGPU lists one GPU's links.
type NVLinkGPU struct {
	Index int
	Name  string
	UUID  string
	Links []NVLink
}

// NVLink is one link. A link nvidia-smi prints as "<inactive>" is Active=false.
type NVLink struct {
	Link      int
	Active    bool
	SpeedGBps float64 // per-direction speed nvidia-smi reports; 0 when inactive
	// Errors maps counter name (replay, recovery, crc_flit, crc_data, ...) to value.
	Errors map[string]uint64
}

// KernelLog is the parsed kernel log.
type KernelLog struct {
	// Events are in log order; of each kind only the newest ones are kept
	// (kmsg.MaxEventsPerKind), the rest are counted in Dropped.
	Events []KernelEvent
	// Lines is the number of lines read, for evidence.
	Lines int
	// Dropped counts, per kind, the oldest events not kept; nil when none.
	Dropped map[KernelEventKind]int `json:",omitempty"`
}

// KernelEventKind distinguishes GPU Xids from NVSwitch SXids and other
// GPU-related lines (fallen off the bus without an Xid, GPU reset).
type KernelEventKind string

const (
	EventXid        KernelEventKind = "xid"
	EventSXid       KernelEventKind = "sxid"
	EventGPUReset   KernelEventKind = "gpu_reset"    // the driver reset a GPU: earlier Xids on it no longer count
	EventFellOffBus KernelEventKind = "fell_off_bus" // "GPU has fallen off the bus" without an Xid line
)

// KernelEvent is one parsed NVRM line.
type KernelEvent struct {
	Kind KernelEventKind
	Code int // Xid or SXid number; 0 for other kinds
	// PCIBusID is normalized like GPU.PCIBusID ("0000:9b:00.0"); empty when the line has none.
	PCIBusID string
	Device   string // "nvidia-nvswitch3" for SXid lines
	PID      int    // 0 when absent
	Process  string
	Message  string // the text after the code
	Fatal    bool   // SXid "Fatal"
	// Time is the wall-clock time of the line; zero when it cannot be told.
	Time time.Time
	// SinceBoot is the raw seconds-since-boot stamp of plain dmesg, when present.
	SinceBoot *time.Duration
	// DriverLoad marks the driver's load banner ("NVRM: loading NVIDIA UNIX
	// ... Kernel Module"), an EventGPUReset for every GPU. The driver
	// prints it after probing the GPUs, so lines seconds before it belong
	// to this load, not to the one before.
	DriverLoad bool `json:",omitempty"`
	Raw        string
}

// HCA is one RDMA adapter from /sys/class/infiniband.
type HCA struct {
	Name      string // mlx5_0
	Model     string // hca_type, "MT4129"
	FWVersion string
	BoardID   string
	NetDevice string // mapped network interface for RoCE, when known
	Ports     []IBPort
	// Errors lists files that could not be read or parsed, each naming the file.
	Errors []string
}

// IBPort is one port of an HCA.
type IBPort struct {
	Port      int
	State     string // "ACTIVE", "DOWN", "INIT", "ARMED"
	PhysState string // "LinkUp", "Disabled", "Polling"
	RateGbps  float64
	RateText  string // "400 Gb/sec (4X NDR)"
	LinkLayer string // "InfiniBand" or "Ethernet"
	// Counters are counters/ values as read (port_rcv_data/port_xmit_data are
	// raw 4-byte words); HWCounters are hw_counters/ values.
	Counters   map[string]uint64
	HWCounters map[string]uint64
}

// AllReduceRun is a parsed nccl-tests all_reduce_perf output.
type AllReduceRun struct {
	Rows []AllReduceRow
	// AvgBusBW is the "# Avg bus bandwidth" footer in GB/s; nil when absent.
	AvgBusBW *float64
	// OutOfBounds is the "# Out of bounds values : N" count; nil when absent.
	OutOfBounds       *uint64
	OutOfBoundsFailed bool
	// Failures holds "Test NCCL failure" and similar lines.
	Failures []string
	// Transport is "IB", "Socket" or "" (unknown) from NCCL_DEBUG=INFO lines.
	Transport string
	// GPUDirect is true when a channel line shows GDRDMA.
	GPUDirect   bool
	NCCLVersion string
	Devices     int // "#  Rank N ..." device lines
	ExitCode    int
}

// AllReduceRow is one message size: out-of-place and in-place results.
type AllReduceRow struct {
	SizeBytes  uint64
	Count      uint64
	Type       string
	RedOp      string
	OutOfPlace AllReduceResult
	InPlace    AllReduceResult
}

// AllReduceResult is time (µs), algbw and busbw (GB/s) and #wrong; Wrong is
// nil when not validated ("N/A").
type AllReduceResult struct {
	TimeUS float64
	AlgBW  float64
	BusBW  float64
	Wrong  *uint64
}

// DCGMDiag is a parsed dcgmi diag -j result.
type DCGMDiag struct {
	Level         int
	DriverVersion string
	Version       string
	Tests         []DCGMTest
}

// DCGMTest is one test's result for one entity.
type DCGMTest struct {
	Category string
	Name     string
	EntityID int    // GPU index; -1 for system-wide
	Status   string // "Pass", "Fail", "Warn", "Skip", "Not Run"
	Warnings []string
	// EntityGroup is DCGM 4's entity_group ("GPU", "CPU", ...): EntityID
	// is a GPU index only when it is "GPU" or empty (DCGM 3.x is GPU-only).
	EntityGroup string `json:",omitempty"`
}
