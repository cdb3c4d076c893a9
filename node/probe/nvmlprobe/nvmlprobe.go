//go:build linux && cgo

package nvmlprobe

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Open loads and initializes NVML. closeFn shuts it down and may be called
// more than once. When libnvidia-ml.so.1 does not load the error wraps
// ErrUnavailable.
func Open() (lib nvml.Interface, closeFn func(), err error) {
	lib = nvml.New()
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, nil, fmt.Errorf("%w: libnvidia-ml.so.1 did not load", ErrUnavailable)
	default:
		return nil, nil, fmt.Errorf("nvml init: %w", ret)
	}
	var once sync.Once
	// Shut down at the end: nothing is left to do with a failed shutdown.
	return lib, func() { once.Do(func() { _ = lib.Shutdown() }) }, nil
}

// Collect opens NVML, reads the GPUs and closes it again.
func Collect() (*snapshot.GPUState, error) {
	lib, closeFn, err := Open()
	if err != nil {
		return nil, err
	}
	defer closeFn()
	return Read(lib)
}

// Read queries every GPU that NVML counts. GPU indexes are NVML's, which
// follow the PCI bus order as nvidia-smi's do.
func Read(lib nvml.Interface) (*snapshot.GPUState, error) {
	if lib == nil {
		return nil, fmt.Errorf("nvml: no library")
	}
	r := &reader{lib: lib, symbols: map[string]bool{}}
	count, ok := call(r, -1, "DeviceGetCount", lib.DeviceGetCount)
	if !ok || count < 0 {
		if r.err != nil {
			return nil, r.err
		}
		return nil, fmt.Errorf("nvml: DeviceGetCount: not supported")
	}
	st := &snapshot.GPUState{AttachedGPUs: count}
	st.DriverVersion, _ = call(r, -1, "SystemGetDriverVersion", lib.SystemGetDriverVersion)
	if v, ok := call(r, -1, "SystemGetCudaDriverVersion", lib.SystemGetCudaDriverVersion); ok {
		st.CUDAVersion = cudaVersion(v)
	}
	for i := 0; i < count; i++ {
		failed := len(r.errs)
		dev, ok := call(r, i, "DeviceGetHandleByIndex", func() (nvml.Device, nvml.Return) { return lib.DeviceGetHandleByIndex(i) })
		if !ok || dev == nil {
			if len(r.errs) > failed {
				// NVML counts the GPU but cannot talk to it (GPU_IS_LOST,
				// UNKNOWN): what nvidia-smi prints as "Unable to determine
				// the device handle". Its bus id is not known from here.
				st.Unreachable = append(st.Unreachable, snapshot.UnreachableGPU{Index: i, Error: r.errs[len(r.errs)-1]})
			}
			continue
		}
		st.GPUs = append(st.GPUs, r.device(i, dev))
	}
	st.Errors = r.errs
	return st, nil
}

type reader struct {
	lib     nvml.Interface
	symbols map[string]bool
	errs    []string
	err     error // the last failure, for DeviceGetCount
}

// call runs one NVML query. SUCCESS gives the value. ERROR_NOT_SUPPORTED,
// ERROR_FUNCTION_NOT_FOUND, ERROR_NOT_FOUND and a panic (a partial
// implementation) give ok=false quietly; other failures are recorded
// against the GPU (-1: the system) and also give ok=false.
func call[T any](r *reader, gpu int, what string, f func() (T, nvml.Return)) (T, bool) {
	v, ret := try(f)
	switch ret {
	case nvml.SUCCESS:
		return v, true
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND, nvml.ERROR_NOT_FOUND:
	default:
		where := "nvml"
		if gpu >= 0 {
			where = fmt.Sprintf("GPU%d", gpu)
		}
		r.err = fmt.Errorf("%s: %s: %w", where, what, ret)
		r.errs = append(r.errs, r.err.Error())
	}
	var zero T
	return zero, false
}

// try runs f, turning a panic into ERROR_NOT_SUPPORTED.
func try[T any](f func() (T, nvml.Return)) (v T, ret nvml.Return) {
	defer func() {
		if recover() != nil {
			var zero T
			v, ret = zero, nvml.ERROR_NOT_SUPPORTED
		}
	}()
	return f()
}

// has reports whether the loaded library exports a symbol. Calling a
// function that an older driver lacks would jump to a null address, which no
// recover can catch, so queries newer than R450 are guarded by this.
func (r *reader) has(symbol string) bool {
	if v, ok := r.symbols[symbol]; ok {
		return v
	}
	found := false
	func() {
		defer func() { _ = recover() }()
		if ext := r.lib.Extensions(); ext != nil {
			found = ext.LookupSymbol(symbol) == nil
		}
	}()
	r.symbols[symbol] = found
	return found
}

func (r *reader) device(i int, d nvml.Device) snapshot.GPU {
	g := snapshot.GPU{Index: i}
	g.Name, _ = call(r, i, "GetName", d.GetName)
	g.UUID, _ = call(r, i, "GetUUID", d.GetUUID)
	g.Serial, _ = call(r, i, "GetSerial", d.GetSerial)
	g.VBIOS, _ = call(r, i, "GetVbiosVersion", d.GetVbiosVersion)
	if a, ok := call(r, i, "GetArchitecture", d.GetArchitecture); ok {
		g.Architecture = archName(a)
	}
	if p, ok := call(r, i, "GetPciInfo", d.GetPciInfo); ok {
		if id := cString(p.BusId[:]); id != "" {
			g.PCIBusID = snapshot.NormalizeBusID(id)
		} else if id := cString(p.BusIdLegacy[:]); id != "" {
			g.PCIBusID = snapshot.NormalizeBusID(id)
		}
	}
	if m, ok := call(r, i, "GetMemoryInfo", d.GetMemoryInfo); ok {
		g.MemoryTotalMiB = ptr(m.Total / (1 << 20))
		g.MemoryUsedMiB = ptr(m.Used / (1 << 20))
	}

	if v, ok := call(r, i, "GetPersistenceMode", d.GetPersistenceMode); ok {
		g.PersistenceMode = ptr(v == nvml.FEATURE_ENABLED)
	}
	type modes struct{ current, pending int }
	if m, ok := call(r, i, "GetEccMode", func() (modes, nvml.Return) {
		c, p, ret := d.GetEccMode()
		return modes{int(c), int(p)}, ret
	}); ok {
		g.ECCEnabled = ptr(m.current == int(nvml.FEATURE_ENABLED))
		g.ECCPending = ptr(m.pending == int(nvml.FEATURE_ENABLED))
	}
	if m, ok := call(r, i, "GetMigMode", func() (modes, nvml.Return) {
		c, p, ret := d.GetMigMode()
		return modes{c, p}, ret
	}); ok {
		g.MIGEnabled = ptr(m.current == nvml.DEVICE_MIG_ENABLE)
	}
	if v, ok := call(r, i, "GetComputeMode", d.GetComputeMode); ok {
		g.ComputeMode = computeModeName(v)
	}

	r.ecc(i, d, &g)
	r.pages(i, d, &g)

	if v, ok := call(r, i, "GetTemperature", func() (uint32, nvml.Return) { return d.GetTemperature(nvml.TEMPERATURE_GPU) }); ok {
		g.TemperatureC = ptr(float64(v))
	}
	g.SlowdownTempC = r.threshold(i, d, nvml.TEMPERATURE_THRESHOLD_SLOWDOWN)
	g.ShutdownTempC = r.threshold(i, d, nvml.TEMPERATURE_THRESHOLD_SHUTDOWN)
	g.MaxOperatingC = r.threshold(i, d, nvml.TEMPERATURE_THRESHOLD_GPU_MAX)
	r.fields(i, d, &g)

	if v, ok := call(r, i, "GetPowerUsage", d.GetPowerUsage); ok {
		g.PowerDrawW = ptr(float64(v) / 1000)
	}
	if v, ok := call(r, i, "GetEnforcedPowerLimit", d.GetEnforcedPowerLimit); ok {
		g.PowerLimitW = ptr(float64(v) / 1000)
	}
	if u, ok := call(r, i, "GetUtilizationRates", d.GetUtilizationRates); ok {
		g.UtilizationPct = ptr(float64(u.Gpu))
	}
	if v, ok := call(r, i, "GetClockInfo", func() (uint32, nvml.Return) { return d.GetClockInfo(nvml.CLOCK_SM) }); ok {
		g.SMClockMHz = ptr(float64(v))
	}
	if v, ok := call(r, i, "GetMaxClockInfo", func() (uint32, nvml.Return) { return d.GetMaxClockInfo(nvml.CLOCK_SM) }); ok {
		g.MaxSMClockMHz = ptr(float64(v))
	}
	g.ClockEvents = r.clockEvents(i, d)

	g.PCIe.GenCurrent, _ = call(r, i, "GetCurrPcieLinkGeneration", d.GetCurrPcieLinkGeneration)
	g.PCIe.GenMax, _ = call(r, i, "GetMaxPcieLinkGeneration", d.GetMaxPcieLinkGeneration)
	g.PCIe.WidthCurrent, _ = call(r, i, "GetCurrPcieLinkWidth", d.GetCurrPcieLinkWidth)
	g.PCIe.WidthMax, _ = call(r, i, "GetMaxPcieLinkWidth", d.GetMaxPcieLinkWidth)
	if v, ok := call(r, i, "GetPcieReplayCounter", d.GetPcieReplayCounter); ok && v >= 0 {
		g.PCIe.ReplayCounter = ptr(uint64(v))
	}

	g.Fabric = r.fabric(i, d)
	g.Processes = r.processes(i, d)
	return g
}

// ecc fills the totals from GetTotalEccErrors and, where the driver has
// them, the DRAM and SRAM counters under the element names nvidia-smi uses.
func (r *reader) ecc(i int, d nvml.Device, g *snapshot.GPU) {
	sets := []struct {
		counts  *snapshot.ECCCounts
		counter nvml.EccCounterType
		name    string
	}{
		{&g.ECC.Volatile, nvml.VOLATILE_ECC, "volatile"},
		{&g.ECC.Aggregate, nvml.AGGREGATE_ECC, "aggregate"},
	}
	for _, s := range sets {
		if v, ok := call(r, i, "GetTotalEccErrors("+s.name+",uncorrected)", func() (uint64, nvml.Return) {
			return d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, s.counter)
		}); ok {
			s.counts.Uncorrectable = ptr(v)
		}
		if v, ok := call(r, i, "GetTotalEccErrors("+s.name+",corrected)", func() (uint64, nvml.Return) {
			return d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, s.counter)
		}); ok {
			s.counts.Correctable = ptr(v)
		}
		for _, k := range []struct {
			typ  nvml.MemoryErrorType
			name string
		}{{nvml.MEMORY_ERROR_TYPE_CORRECTED, "dram_correctable"}, {nvml.MEMORY_ERROR_TYPE_UNCORRECTED, "dram_uncorrectable"}} {
			if v, ok := call(r, i, "GetMemoryErrorCounter("+s.name+","+k.name+")", func() (uint64, nvml.Return) {
				return d.GetMemoryErrorCounter(k.typ, s.counter, nvml.MEMORY_LOCATION_DRAM)
			}); ok {
				s.counts.Detail = put(s.counts.Detail, k.name, v)
			}
		}
	}
	if !r.has("nvmlDeviceGetSramEccErrorStatus") {
		return
	}
	if s, ok := call(r, i, "GetSramEccErrorStatus", d.GetSramEccErrorStatus); ok {
		v, a := &g.ECC.Volatile, &g.ECC.Aggregate
		v.Detail = put(v.Detail, "sram_correctable", s.VolatileCor)
		v.Detail = put(v.Detail, "sram_uncorrectable_parity", s.VolatileUncParity)
		v.Detail = put(v.Detail, "sram_uncorrectable_secded", s.VolatileUncSecDed)
		a.Detail = put(a.Detail, "sram_correctable", s.AggregateCor)
		a.Detail = put(a.Detail, "sram_uncorrectable_parity", s.AggregateUncParity)
		a.Detail = put(a.Detail, "sram_uncorrectable_secded", s.AggregateUncSecDed)
		g.ECC.SRAMThresholdExceeded = ptr(s.BThresholdExceeded != 0)
	}
}

// pages reads pre-Ampere page retirement and Ampere+ row remapping; each is
// nil where the GPU does not have it.
func (r *reader) pages(i int, d nvml.Device, g *snapshot.GPU) {
	var rp snapshot.RetiredPages
	if p, ok := call(r, i, "GetRetiredPages(single_bit)", func() ([]uint64, nvml.Return) {
		return d.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
	}); ok {
		rp.SingleBit = ptr(uint64(len(p)))
	}
	if p, ok := call(r, i, "GetRetiredPages(double_bit)", func() ([]uint64, nvml.Return) {
		return d.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
	}); ok {
		rp.DoubleBit = ptr(uint64(len(p)))
	}
	if v, ok := call(r, i, "GetRetiredPagesPendingStatus", d.GetRetiredPagesPendingStatus); ok {
		rp.Pending = ptr(v == nvml.FEATURE_ENABLED)
	}
	if rp.SingleBit != nil || rp.DoubleBit != nil || rp.Pending != nil {
		g.RetiredPages = &rp
	}

	if !r.has("nvmlDeviceGetRemappedRows") {
		return
	}
	if rr, ok := call(r, i, "GetRemappedRows", func() (snapshot.RemappedRows, nvml.Return) {
		corr, unc, pending, failed, ret := d.GetRemappedRows()
		return snapshot.RemappedRows{Correctable: clampCount(corr), Uncorrectable: clampCount(unc), Pending: pending, Failure: failed}, ret
	}); ok {
		g.RemappedRows = &rr
	}
}

func (r *reader) threshold(i int, d nvml.Device, t nvml.TemperatureThresholds) *float64 {
	v, ok := call(r, i, "GetTemperatureThreshold("+strconv.Itoa(int(t))+")", func() (uint32, nvml.Return) {
		return d.GetTemperatureThreshold(t)
	})
	if !ok || v == 0 {
		return nil
	}
	return ptr(float64(v))
}

// fields reads the values NVML offers only as field values: HBM
// temperature and the recovery action of R550+ drivers.
func (r *reader) fields(i int, d nvml.Device, g *snapshot.GPU) {
	vals := []nvml.FieldValue{
		{FieldId: nvml.FI_DEV_MEMORY_TEMP},
		{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION},
	}
	if _, ok := call(r, i, "GetFieldValues", func() (struct{}, nvml.Return) {
		return struct{}{}, d.GetFieldValues(vals)
	}); !ok {
		return
	}
	if v, ok := fieldValue(vals[0]); ok && v > 0 && v < 200 {
		g.MemoryTempC = ptr(v)
	}
	if v, ok := fieldValue(vals[1]); ok {
		g.RecoveryAction = recoveryActionName(nvml.DeviceGpuRecoveryAction(v))
	}
}

// fieldValue decodes one field by its value type; ok is false when NVML
// had no value for it.
func fieldValue(f nvml.FieldValue) (float64, bool) {
	if nvml.Return(f.NvmlReturn) != nvml.SUCCESS {
		return 0, false
	}
	b := f.Value[:]
	var v float64
	switch nvml.ValueType(f.ValueType) {
	case nvml.VALUE_TYPE_DOUBLE:
		v = math.Float64frombits(binary.NativeEndian.Uint64(b))
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		v = float64(binary.NativeEndian.Uint32(b))
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		v = float64(binary.NativeEndian.Uint64(b))
	case nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		v = float64(int64(binary.NativeEndian.Uint64(b)))
	case nvml.VALUE_TYPE_SIGNED_INT:
		v = float64(int32(binary.NativeEndian.Uint32(b)))
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		v = float64(binary.NativeEndian.Uint16(b))
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// clockEvents maps the reasons bitmask onto the XML parser's names. R535
// renamed "throttle" reasons to "event" reasons; older drivers only have the
// former, with the same bits.
func (r *reader) clockEvents(i int, d nvml.Device) map[string]bool {
	var mask uint64
	var ok bool
	if r.has("nvmlDeviceGetCurrentClocksEventReasons") {
		mask, ok = call(r, i, "GetCurrentClocksEventReasons", d.GetCurrentClocksEventReasons)
	} else {
		mask, ok = call(r, i, "GetCurrentClocksThrottleReasons", d.GetCurrentClocksThrottleReasons)
	}
	if !ok {
		return nil
	}
	// The bits of nvmlClocksEventReasons, named as nvidia-smi's XML names them.
	bits := [...]struct {
		bit  uint64
		name string
	}{
		{nvml.ClocksEventReasonGpuIdle, "gpu_idle"},
		{nvml.ClocksEventReasonApplicationsClocksSetting, "applications_clocks_setting"},
		{nvml.ClocksEventReasonSwPowerCap, "sw_power_cap"},
		{nvml.ClocksThrottleReasonHwSlowdown, "hw_slowdown"},
		{nvml.ClocksEventReasonSyncBoost, "sync_boost"},
		{nvml.ClocksEventReasonSwThermalSlowdown, "sw_thermal_slowdown"},
		{nvml.ClocksThrottleReasonHwThermalSlowdown, "hw_thermal_slowdown"},
		{nvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
		{nvml.ClocksEventReasonDisplayClockSetting, "display_clocks_setting"},
	}
	m := make(map[string]bool, len(bits))
	for _, b := range bits {
		m[b.name] = mask&b.bit != 0
	}
	return m
}

func (r *reader) fabric(i int, d nvml.Device) *snapshot.Fabric {
	if !r.has("nvmlDeviceGetGpuFabricInfo") {
		return nil
	}
	// The versioned GetGpuFabricInfoV needs R550 and hands back a handler
	// bound to a real device, which mocks cannot provide; the first
	// version (R525+) reports everything the snapshot holds.
	fi, ok := call(r, i, "GetGpuFabricInfo", d.GetGpuFabricInfo)
	if !ok {
		return nil
	}
	f := &snapshot.Fabric{CliqueID: strconv.FormatUint(uint64(fi.CliqueId), 10)}
	switch fi.State {
	case nvml.GPU_FABRIC_STATE_NOT_SUPPORTED:
		return nil
	case nvml.GPU_FABRIC_STATE_NOT_STARTED:
		f.State = "Not Started"
	case nvml.GPU_FABRIC_STATE_IN_PROGRESS:
		f.State = "In Progress"
	case nvml.GPU_FABRIC_STATE_COMPLETED:
		f.State = "Completed"
		// Like nvidia-smi, the status means something only once
		// registration has finished.
		if st := nvml.Return(fi.Status); st == nvml.SUCCESS {
			f.Status = "Success"
		} else {
			f.Status = st.Error()
		}
	default:
		f.State = "Unknown (" + strconv.Itoa(int(fi.State)) + ")"
	}
	if fi.ClusterUuid != [16]uint8{} {
		u := fi.ClusterUuid
		f.ClusterUUID = fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	}
	return f
}

// processes lists compute and graphics processes; one in both lists is
// "C+G", as nvidia-smi prints it.
func (r *reader) processes(i int, d nvml.Device) []snapshot.GPUProcess {
	var out []snapshot.GPUProcess
	byPID := map[uint32]int{}
	lists := []struct {
		typ  string
		what string
		f    func() ([]nvml.ProcessInfo, nvml.Return)
	}{
		{"C", "GetComputeRunningProcesses", d.GetComputeRunningProcesses},
		{"G", "GetGraphicsRunningProcesses", d.GetGraphicsRunningProcesses},
	}
	for _, l := range lists {
		procs, _ := call(r, i, l.what, l.f)
		for _, p := range procs {
			if j, seen := byPID[p.Pid]; seen {
				if out[j].Type != l.typ {
					out[j].Type = "C+G"
				}
				continue
			}
			gp := snapshot.GPUProcess{PID: int(p.Pid), Type: l.typ}
			if p.UsedGpuMemory != math.MaxUint64 {
				gp.UsedMemoryMiB = ptr(p.UsedGpuMemory / (1 << 20))
			}
			// Names of processes in other PID namespaces, or hidden from an
			// unprivileged agent, are unknown: that is not worth an error
			// on every pass.
			pid := int(p.Pid)
			if name, ret := try(func() (string, nvml.Return) { return r.lib.SystemGetProcessName(pid) }); ret == nvml.SUCCESS {
				gp.Name = name
			}
			byPID[p.Pid] = len(out)
			out = append(out, gp)
		}
	}
	return out
}

// cudaVersion turns 12040 into "12.4", as nvidia-smi prints it.
func cudaVersion(v int) string {
	if v <= 0 {
		return ""
	}
	return strconv.Itoa(v/1000) + "." + strconv.Itoa(v%1000/10)
}

func archName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "Volta"
	case nvml.DEVICE_ARCH_TURING:
		return "Turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "Ada Lovelace"
	case nvml.DEVICE_ARCH_HOPPER:
		return "Hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "Blackwell"
	case nvml.DEVICE_ARCH_RUBIN:
		return "Rubin"
	}
	return ""
}

// computeModeName spells compute modes as nvidia-smi's XML does.
func computeModeName(m nvml.ComputeMode) string {
	switch m {
	case nvml.COMPUTEMODE_DEFAULT:
		return "Default"
	case nvml.COMPUTEMODE_EXCLUSIVE_THREAD:
		return "Exclusive_Thread"
	case nvml.COMPUTEMODE_PROHIBITED:
		return "Prohibited"
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return "Exclusive_Process"
	}
	return ""
}

// recoveryActionName spells the action as nvidia-smi's gpu_recovery_action does.
func recoveryActionName(a nvml.DeviceGpuRecoveryAction) string {
	switch a {
	case nvml.GPU_RECOVERY_ACTION_NONE:
		return "None"
	case nvml.GPU_RECOVERY_ACTION_GPU_RESET:
		return "GPU Reset"
	case nvml.GPU_RECOVERY_ACTION_NODE_REBOOT:
		return "Node Reboot"
	case nvml.GPU_RECOVERY_ACTION_DRAIN_P2P:
		return "Drain P2P"
	case nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:
		return "Drain and Reset"
	case nvml.GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN:
		return "Recover IMEX Domain"
	case nvml.GPU_RECOVERY_ACTION_BUS_RESET:
		return "Bus Reset"
	case nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT:
		return "System Reboot"
	}
	return "Unknown (" + strconv.Itoa(int(a)) + ")"
}

// cString reads a NUL-terminated C char array.
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

func clampCount(v int) uint64 {
	if v < 0 {
		return 0
	}
	return uint64(v)
}

func put(m map[string]uint64, k string, v uint64) map[string]uint64 {
	if m == nil {
		m = make(map[string]uint64, 6)
	}
	m[k] = v
	return m
}

func ptr[T any](v T) *T { return &v }
