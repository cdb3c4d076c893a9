package sim

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"strings"
	"time"
)

// Clock is where a simulated node reads the time. A virtual clock lets a
// fleet run days of simulated time in seconds.
type Clock interface {
	Now() time.Time
}

// ClockFunc adapts a function to Clock.
type ClockFunc func() time.Time

// Now calls f.
func (f ClockFunc) Now() time.Time { return f() }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// KernelLogFormat chooses how the simulated `dmesg` stamps its lines.
type KernelLogFormat int

const (
	// LogSinceBoot is plain `dmesg`: "[  123.456789] ..." seconds since boot.
	LogSinceBoot KernelLogFormat = iota
	// LogCtime is `dmesg -T`: "[Sat Nov 28 01:58:17 2026] ...".
	LogCtime
	// LogISO is `dmesg --time-format iso`: "2026-11-28T01:33:41,902311+00:00 ...".
	LogISO
)

// GPUModel is what all GPUs of one SKU share.
type GPUModel struct {
	Name         string // product_name, "NVIDIA H100 80GB HBM3"
	Architecture string // "Hopper"
	DeviceID     uint16 // PCI device id, 0x2330
	SubsystemID  uint16 // PCI subsystem device id (vendor is NVIDIA), 0x16c1
	MemoryMiB    uint64 // fb_memory_usage/total
	ReservedMiB  uint64
	BAR1MiB      uint64
	PCIeGen      int // max (and healthy current) link generation
	PCIeWidth    int // max (and healthy current) link width
	PowerLimitW  float64
	MinPowerW    float64
	IdlePowerW   float64
	MaxClockMHz  int // graphics/SM max
	MemClockMHz  int
	MaxVideoMHz  int
	IdleClockMHz int
	VideoMHz     int
	VoltageMV    float64

	BoardPartNumber string
	GPUPartNumber   string
	InforomImage    string
	InforomOEM      string
	InforomECC      string

	NVLinks    int     // links per GPU
	NVLinkGBps float64 // per-link speed `nvidia-smi nvlink --status` prints

	// TLimit: the driver reports temperatures as T.Limit margins (Hopper);
	// otherwise as absolute thresholds (Ampere).
	TLimit bool
	// SlowdownC, ShutdownC, MaxOperatingC, MaxMemC are absolute thresholds.
	SlowdownC, ShutdownC, MaxOperatingC, MaxMemC float64
	// SRAMSplit: ECC SRAM uncorrectable is split into parity and SEC-DED, with
	// threshold and per-source counters; the Hopper-era XML also carries
	// inforom_bbx_flush and sparse_operation_mode (all as on driver 535).
	SRAMSplit bool
	// RemapBanks is the row-remapper histogram's "max" bank count.
	RemapBanks int
	// PowerBrakeAtIdle: healthy H100s show hw_slowdown and
	// hw_power_brake_slowdown Active at idle.
	PowerBrakeAtIdle bool
	// Fabric: the GPU sits on an NVSwitch fabric (fabric state Completed, not N/A).
	Fabric bool
}

// H100SXM is the NVIDIA H100 80GB HBM3 (SXM5) as an HGX board reports it on
// driver 535 (values from the real 8×H100 capture in shared/fixtures).
func H100SXM() GPUModel {
	return GPUModel{
		Name: "NVIDIA H100 80GB HBM3", Architecture: "Hopper",
		DeviceID: 0x2330, SubsystemID: 0x16c1,
		MemoryMiB: 81559, ReservedMiB: 551, BAR1MiB: 131072,
		PCIeGen: 5, PCIeWidth: 16,
		PowerLimitW: 700, MinPowerW: 200, IdlePowerW: 67,
		MaxClockMHz: 1980, MemClockMHz: 2619, MaxVideoMHz: 1545, IdleClockMHz: 86, VideoMHz: 765,
		VoltageMV:       670,
		BoardPartNumber: "692-2G520-0200-000", GPUPartNumber: "2330-885-A1",
		InforomImage: "G520.0200.00.05", InforomOEM: "2.1", InforomECC: "7.16",
		NVLinks: 18, NVLinkGBps: 26.562,
		TLimit:    true,
		SlowdownC: 87, ShutdownC: 93, MaxOperatingC: 85, MaxMemC: 95,
		SRAMSplit: true, RemapBanks: 2560, PowerBrakeAtIdle: true, Fabric: true,
	}
}

// A100SXM is the NVIDIA A100-SXM4-80GB on driver 535 (values from the real
// A100 XML capture in shared/fixtures).
func A100SXM() GPUModel {
	return GPUModel{
		Name: "NVIDIA A100-SXM4-80GB", Architecture: "Ampere",
		DeviceID: 0x20b2, SubsystemID: 0x1463,
		MemoryMiB: 81920, ReservedMiB: 664, BAR1MiB: 131072,
		PCIeGen: 4, PCIeWidth: 16,
		PowerLimitW: 400, MinPowerW: 100, IdlePowerW: 61,
		MaxClockMHz: 1410, MemClockMHz: 1593, MaxVideoMHz: 1290, IdleClockMHz: 210, VideoMHz: 585,
		VoltageMV:       712.5,
		BoardPartNumber: "692-2G506-0210-002", GPUPartNumber: "20B2-895-A1",
		InforomImage: "G506.0210.00.04", InforomOEM: "2.1", InforomECC: "6.16",
		NVLinks: 12, NVLinkGBps: 25,
		SlowdownC: 89, ShutdownC: 92, MaxOperatingC: 85, MaxMemC: 95,
		// nvidia-smi reports no fabric state for A100 (the real capture says N/A).
		RemapBanks: 640,
	}
}

// GPUSpec is one GPU slot of the node. Index order is PCI bus order, which
// is nvidia-smi order on a healthy node; faults name GPUs by this index.
type GPUSpec struct {
	Model    GPUModel
	BusID    string // "0000:19:00.0", lowercase
	Serial   string
	UUID     string
	VBIOS    string
	ModuleID int
}

// HCASpec is one RDMA adapter with one port.
type HCASpec struct {
	Name      string // mlx5_0
	Model     string // hca_type, "MT4129"
	FWVersion string
	BoardID   string
	BusID     string // its PCI function, "0000:18:00.0"
	DeviceID  uint16 // PCI device id, 0x1021 for ConnectX-7
	RateGbps  int    // healthy port rate
	LinkLayer string // "InfiniBand" or "Ethernet"
	// PCIeGen, PCIeWidth are the adapter's PCIe link.
	PCIeGen, PCIeWidth int
}

// NVSwitchSpec is one NVSwitch PCI function.
type NVSwitchSpec struct {
	BusID    string
	DeviceID uint16
}

// Spec describes a simulated node. DefaultSpec fills every field; a caller
// usually changes a few and passes it to New.
type Spec struct {
	Name string
	// Seed varies serials, UUIDs, counters and NCCL noise between nodes that
	// share a name pattern; the same Name and Seed render the same bytes.
	Seed   uint64
	Labels map[string]string
	// Clock is the node's time; nil means the wall clock.
	Clock Clock
	// Boot is when the node booted. Zero means Uptime before the clock's
	// reading at New.
	Boot time.Time
	// Uptime is the uptime at New when Boot is zero; zero means a derived
	// 5 to 40 days.
	Uptime time.Duration

	GPUs       []GPUSpec
	NVSwitches []NVSwitchSpec
	HCAs       []HCASpec

	Driver          string // "535.161.08"
	DriverBuildDate string // as /proc/driver/nvidia/version prints it
	CUDA            string // "12.2"
	FabricManager   string // "" when the node runs none
	Kernel          string
	RDMAStack       string
	NCCL            string
	NCCLTests       string // nccl-tests version printed in all_reduce_perf's header
	DCGM            string
	// DCGMDiag makes `dcgmi diag` available; DCGMLevel is the -r level it runs.
	DCGMDiag  bool
	DCGMLevel int
	// PeerMem loads nvidia_peermem (GPUDirect RDMA).
	PeerMem bool
	// BusBWGBps is all_reduce_perf's modelled busbw at the largest size on a
	// healthy node; NoisePct its relative noise (1 sigma, percent).
	BusBWGBps float64
	NoisePct  float64
	// MultiBusBWGBps is a healthy pair's busbw at the largest size in a
	// 2-node all_reduce_perf over the HCAs; 0 means 0.95 × BusBWGBps.
	MultiBusBWGBps float64
	// MaxBytes is all_reduce_perf's -e (largest message); 8 GiB by default.
	MaxBytes uint64
	// NCCLDebugInfo adds NCCL_DEBUG=INFO lines (version, NET/IB) to the output.
	NCCLDebugInfo bool
	// KernelLogFormat chooses the dmesg stamp shape.
	KernelLogFormat KernelLogFormat
	// CPUs is the logical CPU count (/proc/uptime idle time scales with it).
	CPUs int
	// Shared, when set, lets nodes of the same shape share their file-tree
	// layout: give every node of a large simulated fleet the same one.
	Shared *Shared
	// Fabric, when set, joins the node to a cluster: a multi-node run
	// launched on any member reaches the others by name (and only them).
	Fabric *Fabric
	// ActionDelay is how long a driver upgrade or rollback action takes
	// before the node reboots with the new driver (wall time; 0: at once).
	ActionDelay time.Duration
}

// DefaultSpec is an 8×H100 SXM HGX node with eight ConnectX-7 NDR 400
// InfiniBand ports, on the pinned driver 535 stack.
func DefaultSpec(name string) Spec {
	// Bus numbers and module ids of the real HGX H100 capture; each HCA sits
	// on the PCIe switch of one GPU.
	h100Buses := [8]string{"19", "3b", "4c", "5d", "9b", "bb", "cb", "db"}
	h100HCABuses := [8]string{"18", "2a", "3a", "5c", "9a", "ab", "ba", "da"}
	h100Modules := [8]int{2, 4, 1, 3, 7, 5, 6, 8}
	s := Spec{
		Name:            name,
		Labels:          map[string]string{"sku": "h100"},
		Driver:          "535.161.08",
		DriverBuildDate: "Tue Mar  5 22:42:23 UTC 2024",
		CUDA:            "12.2",
		FabricManager:   "535.161.08",
		Kernel:          "5.15.0-105-generic",
		RDMAStack:       "MLNX_OFED 23.10-1.1.9.0",
		NCCL:            "2.21.5",
		NCCLTests:       "2.19.4",
		DCGM:            "3.3.5",
		DCGMLevel:       1,
		PeerMem:         true,
		BusBWGBps:       480,
		// 2-node over 8×NDR 400: the shipped reference baseline (baselines/).
		MultiBusBWGBps: 469,
		NoisePct:       0.6,
		MaxBytes:       8 << 30,
		CPUs:           224,
	}
	m := H100SXM()
	for i := range 8 {
		s.GPUs = append(s.GPUs, GPUSpec{
			Model:    m,
			BusID:    "0000:" + h100Buses[i] + ":00.0",
			VBIOS:    "96.00.74.00.0D",
			ModuleID: h100Modules[i],
		})
		s.HCAs = append(s.HCAs, HCASpec{
			Name: fmt.Sprintf("mlx5_%d", i), Model: "MT4129", FWVersion: "28.39.1002",
			BoardID: "MT_0000000838", BusID: "0000:" + h100HCABuses[i] + ":00.0",
			DeviceID: 0x1021, RateGbps: 400, LinkLayer: "InfiniBand", PCIeGen: 5, PCIeWidth: 16,
		})
	}
	for i := range 4 {
		s.NVSwitches = append(s.NVSwitches, NVSwitchSpec{BusID: fmt.Sprintf("0000:%02x:00.0", 5+i), DeviceID: 0x22a3})
	}
	return s
}

// A100Spec is an 8×A100-SXM4-80GB HGX node with eight ConnectX-6 HDR 200
// InfiniBand ports.
func A100Spec(name string) Spec {
	a100Buses := [8]string{"07", "0f", "47", "4e", "87", "90", "b7", "bd"}
	a100HCABuses := [8]string{"0c", "12", "4b", "54", "8d", "94", "ba", "cc"}
	s := DefaultSpec(name)
	s.Labels = map[string]string{"sku": "a100"}
	s.BusBWGBps = 230
	s.MultiBusBWGBps = 192 // 2-node over 8×HDR 200, as baselines/ ships it
	s.GPUs, s.HCAs, s.NVSwitches = nil, nil, nil
	m := A100SXM()
	for i := range 8 {
		s.GPUs = append(s.GPUs, GPUSpec{
			Model: m, BusID: "0000:" + a100Buses[i] + ":00.0", VBIOS: "92.00.45.00.06", ModuleID: i + 1,
		})
		s.HCAs = append(s.HCAs, HCASpec{
			Name: fmt.Sprintf("mlx5_%d", i), Model: "MT4123", FWVersion: "20.39.1002",
			BoardID: "MT_0000000223", BusID: "0000:" + a100HCABuses[i] + ":00.0",
			DeviceID: 0x101b, RateGbps: 200, LinkLayer: "InfiniBand", PCIeGen: 4, PCIeWidth: 16,
		})
	}
	for i := range 6 {
		s.NVSwitches = append(s.NVSwitches, NVSwitchSpec{BusID: fmt.Sprintf("0000:%02x:00.0", 0xc4+i), DeviceID: 0x1af1})
	}
	return s
}

// hash64 is the source of every derived identity and value, so the same
// name and seed always give the same node.
func hash64(seed uint64, parts ...string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return mix64(h.Sum64())
}

// mix64 is a finalizer (splitmix64) that spreads FNV's weak low bits.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// unit maps a hash to [0, 1).
func unit(h uint64) float64 { return float64(h>>11) / float64(1<<53) }

// fillDerived completes identities the caller left empty.
func (s *Spec) fillDerived() {
	for i := range s.GPUs {
		g := &s.GPUs[i]
		idx := fmt.Sprint(i)
		if g.Serial == "" {
			g.Serial = fmt.Sprintf("16501240%05d", hash64(s.Seed, s.Name, "serial", idx)%100000)
		}
		if g.UUID == "" {
			a := hash64(s.Seed, s.Name, "uuid-a", idx)
			b := hash64(s.Seed, s.Name, "uuid-b", idx)
			g.UUID = fmt.Sprintf("GPU-%08x-%04x-%04x-%04x-%012x",
				uint32(a>>32), uint16(a>>16), uint16(a), uint16(b>>48), b&0xffffffffffff)
		}
		if g.ModuleID == 0 {
			g.ModuleID = i + 1
		}
		g.BusID = strings.ToLower(g.BusID)
	}
	for i := range s.HCAs {
		s.HCAs[i].BusID = strings.ToLower(s.HCAs[i].BusID)
		if s.HCAs[i].LinkLayer == "" {
			s.HCAs[i].LinkLayer = "InfiniBand"
		}
	}
	if s.MaxBytes == 0 {
		s.MaxBytes = 8 << 30
	}
	if s.MultiBusBWGBps == 0 {
		s.MultiBusBWGBps = 0.95 * s.BusBWGBps
	}
	if s.CPUs == 0 {
		s.CPUs = 1
	}
	if s.NCCLTests == "" {
		s.NCCLTests = "2.19.4"
	}
	if s.DCGMLevel == 0 {
		s.DCGMLevel = 1
	}
	if s.Uptime == 0 {
		// 5 to 40 days: long enough for lifetime counters to look lived-in.
		days := 5 + float64(hash64(s.Seed, s.Name, "uptime")%3500)/100
		s.Uptime = time.Duration(days * 24 * float64(time.Hour)).Round(time.Second)
	}
}

// ibRateText is the sysfs rate string for a port speed.
func ibRateText(gbps int) string {
	switch gbps {
	case 800:
		return "800 Gb/sec (4X XDR)"
	case 400:
		return "400 Gb/sec (4X NDR)"
	case 200:
		return "200 Gb/sec (4X HDR)"
	case 100:
		return "100 Gb/sec (4X EDR)"
	case 56:
		return "56 Gb/sec (4X FDR)"
	case 50:
		return "50 Gb/sec (2X HDR)"
	case 40:
		return "40 Gb/sec (4X QDR)"
	case 25:
		return "25 Gb/sec (1X EDR)"
	case 20:
		return "20 Gb/sec (4X DDR)"
	default:
		return "10 Gb/sec (4X SDR)"
	}
}

// pcieSpeed is the sysfs link speed string for a PCIe generation.
func pcieSpeed(gen int) string {
	switch gen {
	case 1:
		return "2.5 GT/s PCIe"
	case 2:
		return "5.0 GT/s PCIe"
	case 3:
		return "8.0 GT/s PCIe"
	case 4:
		return "16.0 GT/s PCIe"
	case 6:
		return "64.0 GT/s PCIe"
	default:
		return "32.0 GT/s PCIe"
	}
}
