//go:build linux && cgo

package nvmlprobe

import (
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// withBusIDs makes the mock's GetPciInfo return each device's bus id: the
// mock servers fill only the PCI device id.
func withBusIDs(s *server.Server) *server.Server {
	for _, d := range s.Devices {
		dev := d.(*server.Device)
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for i, c := range "0000" + strings.ToUpper(dev.PciBusID) {
				p.BusId[i] = int8(c)
			}
			return p, nvml.SUCCESS
		}
	}
	return s
}

func dev(s *server.Server, i int) *server.Device { return s.Devices[i].(*server.Device) }

// TestReadBareMock: the mock implements identity, memory and MIG only;
// every other query panics ("method is nil") and must read as unsupported.
func TestReadBareMock(t *testing.T) {
	t.Parallel()
	srv := withBusIDs(dgxa100.New())
	st, err := Read(srv)
	if err != nil {
		t.Fatal(err)
	}
	if st.DriverVersion != "550.54.15" || st.CUDAVersion != "12.4" || st.AttachedGPUs != 8 || len(st.GPUs) != 8 {
		t.Fatalf("driver %q cuda %q attached %d gpus %d", st.DriverVersion, st.CUDAVersion, st.AttachedGPUs, len(st.GPUs))
	}
	if len(st.Errors) != 0 {
		t.Errorf("a missing method was recorded as an error: %v", st.Errors)
	}
	for i, g := range st.GPUs {
		if g.Index != i || !strings.HasSuffix(g.Name, "NVIDIA A100-SXM4-40GB") || !strings.HasPrefix(g.UUID, "GPU-") || g.Architecture != "Ampere" {
			t.Errorf("GPU %d identity: %+v", i, g)
		}
		if want := "0000:0" + string(rune('0'+i)) + ":00.0"; g.PCIBusID != want {
			t.Errorf("GPU %d bus id %q, want %q", i, g.PCIBusID, want)
		}
		if g.MemoryTotalMiB == nil || *g.MemoryTotalMiB != 40960 || g.MIGEnabled == nil || *g.MIGEnabled {
			t.Errorf("GPU %d memory %v mig %v", i, g.MemoryTotalMiB, g.MIGEnabled)
		}
		if g.ECC.Volatile.Uncorrectable != nil || g.RemappedRows != nil || g.TemperatureC != nil || g.PowerDrawW != nil ||
			g.ClockEvents != nil || g.Fabric != nil || g.ECCEnabled != nil || g.PersistenceMode != nil || g.Processes != nil {
			t.Errorf("GPU %d: an unimplemented query produced a value: %+v", i, g)
		}
	}
}

func fieldBytes(v uint64) [8]byte {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], v)
	return b
}

// TestReadFullDevice fills every query on one H100 and checks the mapping
// onto the snapshot, names as the XML parser spells them.
func TestReadFullDevice(t *testing.T) {
	t.Parallel()
	srv := withBusIDs(dgxh100.New())
	d := dev(srv, 3)
	d.GetSerialFunc = func() (string, nvml.Return) { return "1650124031592", nvml.SUCCESS }
	d.GetVbiosVersionFunc = func() (string, nvml.Return) { return "96.00.74.00.0D", nvml.SUCCESS }
	d.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, nvml.SUCCESS }
	d.GetEccModeFunc = func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
		return nvml.FEATURE_ENABLED, nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	d.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) { return nvml.COMPUTEMODE_EXCLUSIVE_PROCESS, nvml.SUCCESS }
	d.GetTotalEccErrorsFunc = func(e nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
		switch {
		case e == nvml.MEMORY_ERROR_TYPE_UNCORRECTED && c == nvml.VOLATILE_ECC:
			return 2, nvml.SUCCESS
		case e == nvml.MEMORY_ERROR_TYPE_UNCORRECTED:
			return 5, nvml.SUCCESS
		case c == nvml.VOLATILE_ECC:
			return 10, nvml.SUCCESS
		}
		return 100, nvml.SUCCESS
	}
	d.GetMemoryErrorCounterFunc = func(e nvml.MemoryErrorType, c nvml.EccCounterType, l nvml.MemoryLocation) (uint64, nvml.Return) {
		if l != nvml.MEMORY_LOCATION_DRAM {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if e == nvml.MEMORY_ERROR_TYPE_UNCORRECTED {
			return 1, nvml.SUCCESS
		}
		return 7, nvml.SUCCESS
	}
	d.GetSramEccErrorStatusFunc = func() (nvml.EccSramErrorStatus, nvml.Return) {
		return nvml.EccSramErrorStatus{VolatileUncParity: 1, AggregateUncSecDed: 4, BThresholdExceeded: 1}, nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 3, 1, true, false, nvml.SUCCESS }
	d.GetRetiredPagesFunc = func(nvml.PageRetirementCause) ([]uint64, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 71, nvml.SUCCESS }
	d.GetTemperatureThresholdFunc = func(th nvml.TemperatureThresholds) (uint32, nvml.Return) {
		switch th {
		case nvml.TEMPERATURE_THRESHOLD_SLOWDOWN:
			return 90, nvml.SUCCESS
		case nvml.TEMPERATURE_THRESHOLD_SHUTDOWN:
			return 95, nvml.SUCCESS
		}
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetFieldValuesFunc = func(vals []nvml.FieldValue) nvml.Return {
		for i := range vals {
			switch vals[i].FieldId {
			case nvml.FI_DEV_MEMORY_TEMP:
				vals[i].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
				vals[i].Value = fieldBytes(63)
			case nvml.FI_DEV_GET_GPU_RECOVERY_ACTION:
				vals[i].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
				vals[i].Value = fieldBytes(uint64(nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET))
			}
		}
		return nvml.SUCCESS
	}
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 312400, nvml.SUCCESS }
	d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) { return 700000, nvml.SUCCESS }
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 97}, nvml.SUCCESS }
	d.GetClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 1755, nvml.SUCCESS }
	d.GetMaxClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 1980, nvml.SUCCESS }
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
		return nvml.ClocksThrottleReasonHwSlowdown | nvml.ClocksThrottleReasonHwPowerBrakeSlowdown, nvml.SUCCESS
	}
	d.GetCurrPcieLinkGenerationFunc = func() (int, nvml.Return) { return 5, nvml.SUCCESS }
	d.GetMaxPcieLinkGenerationFunc = func() (int, nvml.Return) { return 5, nvml.SUCCESS }
	d.GetCurrPcieLinkWidthFunc = func() (int, nvml.Return) { return 8, nvml.SUCCESS }
	d.GetMaxPcieLinkWidthFunc = func() (int, nvml.Return) { return 16, nvml.SUCCESS }
	d.GetPcieReplayCounterFunc = func() (int, nvml.Return) { return 67, nvml.SUCCESS }
	d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
		return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.SUCCESS), CliqueId: 32766,
			ClusterUuid: [16]uint8{0xa1, 0xb2, 15: 0x01}}, nvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 40 << 30}, {Pid: 77, UsedGpuMemory: math.MaxUint64}}, nvml.SUCCESS
	}
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 77}}, nvml.SUCCESS
	}
	srv.SystemGetProcessNameFunc = func(pid int) (string, nvml.Return) {
		if pid == 4242 {
			return "python3", nvml.SUCCESS
		}
		return "", nvml.ERROR_NO_PERMISSION
	}

	st, err := Read(srv)
	if err != nil {
		t.Fatal(err)
	}
	g := st.GPUs[3]
	check := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %#v, want %#v", what, got, want)
		}
	}
	check("name", g.Name, "NVIDIA H100 80GB HBM3")
	check("arch", g.Architecture, "Hopper")
	check("bus", g.PCIBusID, "0000:03:00.0")
	check("serial", g.Serial, "1650124031592")
	check("vbios", g.VBIOS, "96.00.74.00.0D")
	check("persistence", g.PersistenceMode, ptr(true))
	check("ecc", []*bool{g.ECCEnabled, g.ECCPending}, []*bool{ptr(true), ptr(false)})
	check("compute mode", g.ComputeMode, "Exclusive_Process")
	check("volatile", g.ECC.Volatile, snapshot.ECCCounts{Correctable: ptr[uint64](10), Uncorrectable: ptr[uint64](2),
		Detail: map[string]uint64{"dram_correctable": 7, "dram_uncorrectable": 1, "sram_correctable": 0,
			"sram_uncorrectable_parity": 1, "sram_uncorrectable_secded": 0}})
	check("aggregate unc", g.ECC.Aggregate.Uncorrectable, ptr[uint64](5))
	check("aggregate secded", g.ECC.Aggregate.Detail["sram_uncorrectable_secded"], uint64(4))
	check("sram threshold", g.ECC.SRAMThresholdExceeded, ptr(true))
	check("remapped", g.RemappedRows, &snapshot.RemappedRows{Correctable: 3, Uncorrectable: 1, Pending: true})
	check("retired", g.RetiredPages, (*snapshot.RetiredPages)(nil))
	check("temps", []*float64{g.TemperatureC, g.MemoryTempC, g.SlowdownTempC, g.ShutdownTempC, g.MaxOperatingC},
		[]*float64{ptr(71.0), ptr(63.0), ptr(90.0), ptr(95.0), nil})
	check("recovery", g.RecoveryAction, "Drain and Reset")
	check("power", []*float64{g.PowerDrawW, g.PowerLimitW}, []*float64{ptr(312.4), ptr(700.0)})
	check("util", g.UtilizationPct, ptr(97.0))
	check("clocks", []*float64{g.SMClockMHz, g.MaxSMClockMHz}, []*float64{ptr(1755.0), ptr(1980.0)})
	check("clock events", g.ClockEvents, map[string]bool{"gpu_idle": false, "applications_clocks_setting": false,
		"sw_power_cap": false, "hw_slowdown": true, "sync_boost": false, "sw_thermal_slowdown": false,
		"hw_thermal_slowdown": false, "hw_power_brake_slowdown": true, "display_clocks_setting": false})
	check("pcie", g.PCIe, snapshot.PCIeLink{GenCurrent: 5, GenMax: 5, WidthCurrent: 8, WidthMax: 16, ReplayCounter: ptr[uint64](67)})
	check("fabric", g.Fabric, &snapshot.Fabric{State: "Completed", Status: "Success", CliqueID: "32766",
		ClusterUUID: "a1b20000-0000-0000-0000-000000000001"})
	check("processes", g.Processes, []snapshot.GPUProcess{
		{PID: 4242, Name: "python3", Type: "C", UsedMemoryMiB: ptr[uint64](40960)},
		{PID: 77, Type: "C+G"},
	})
	// A process name NVML will not give is no error: containers hide them.
	if len(st.Errors) != 0 {
		t.Errorf("errors: %q", st.Errors)
	}
	if other := st.GPUs[2]; other.TemperatureC != nil || other.Name != "NVIDIA H100 80GB HBM3" {
		t.Errorf("GPU2 picked up GPU3's values: %+v", other)
	}
}

func TestReadNotSupportedAndErrors(t *testing.T) {
	t.Parallel()
	srv := withBusIDs(dgxa100.New())
	for i := range srv.Devices {
		d := dev(srv, i)
		d.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED }
		d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 0, nvml.ERROR_FUNCTION_NOT_FOUND }
		d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
			return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_NOT_SUPPORTED}, nvml.SUCCESS
		}
	}
	// GPU 5 is failing: its power query errors and its handle for the
	// next read cannot be taken.
	dev(srv, 5).GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_GPU_IS_LOST }

	st, err := Read(srv)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range st.GPUs {
		if g.ECC.Volatile.Uncorrectable != nil || g.RemappedRows != nil || g.TemperatureC != nil || g.Fabric != nil {
			t.Errorf("GPU%d: not supported became a value: %+v", g.Index, g)
		}
	}
	if len(st.Errors) != 1 || !strings.HasPrefix(st.Errors[0], "GPU5: GetPowerUsage: ") {
		t.Errorf("errors = %q, want GPU5's power failure", st.Errors)
	}

	srv.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 5 {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return srv.Devices[i], nvml.SUCCESS
	}
	st, err = Read(srv)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GPUs) != 7 || st.AttachedGPUs != 8 || st.GPUs[5].Index != 6 || st.GPUs[5].PCIBusID != "0000:06:00.0" {
		t.Errorf("lost GPU: %d GPUs, attached %d, GPUs[5] = index %d %s", len(st.GPUs), st.AttachedGPUs, st.GPUs[5].Index, st.GPUs[5].PCIBusID)
	}
	if len(st.Errors) != 1 || !strings.HasPrefix(st.Errors[0], "GPU5: DeviceGetHandleByIndex: ") {
		t.Errorf("errors = %q", st.Errors)
	}
	// The lost GPU is named as unreachable (gpu.inventory fails it).
	if len(st.Unreachable) != 1 || st.Unreachable[0].Index != 5 || !strings.Contains(st.Unreachable[0].Error, "DeviceGetHandleByIndex") {
		t.Errorf("unreachable = %+v, want GPU5", st.Unreachable)
	}
}

func TestReadDeviceCountFails(t *testing.T) {
	t.Parallel()
	srv := dgxa100.New()
	srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNINITIALIZED }
	st, err := Read(srv)
	if err == nil || st != nil {
		t.Fatalf("Read = %v, %v; want an error", st, err)
	}
	if !errors.Is(err, nvml.ERROR_UNINITIALIZED) || !strings.Contains(err.Error(), "DeviceGetCount") {
		t.Errorf("error %q does not name the call or wrap the return", err)
	}
	if _, err := Read(nil); err == nil {
		t.Error("Read(nil) gave no error")
	}
}

// TestOldDriverSymbols: a driver before R535 has no ClocksEventReasons;
// the throttle-reason call with the same bits is used instead, and queries
// the driver does not export are not called at all.
func TestOldDriverSymbols(t *testing.T) {
	t.Parallel()
	srv := withBusIDs(dgxa100.New())
	srv.LookupSymbolFunc = func(name string) error {
		switch name {
		case "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetRemappedRows":
			return errors.New("undefined symbol")
		}
		return nil
	}
	d := dev(srv, 0)
	d.GetCurrentClocksThrottleReasonsFunc = func() (uint64, nvml.Return) {
		return nvml.ClocksThrottleReasonHwThermalSlowdown, nvml.SUCCESS
	}
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
		t.Error("event reasons called on a driver without the symbol")
		return 0, nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		t.Error("remapped rows called on a driver without the symbol")
		return 0, 0, false, false, nvml.SUCCESS
	}
	st, err := Read(srv)
	if err != nil {
		t.Fatal(err)
	}
	if g := st.GPUs[0]; !g.ClockEvents["hw_thermal_slowdown"] || g.ClockEvents["hw_slowdown"] || g.RemappedRows != nil {
		t.Errorf("clock events %v remapped %v", g.ClockEvents, g.RemappedRows)
	}
}

func TestFieldValueTypes(t *testing.T) {
	t.Parallel()
	mk := func(typ nvml.ValueType, raw uint64) nvml.FieldValue {
		return nvml.FieldValue{ValueType: uint32(typ), Value: fieldBytes(raw)}
	}
	cases := []struct {
		f    nvml.FieldValue
		want float64
		ok   bool
	}{
		{mk(nvml.VALUE_TYPE_DOUBLE, math.Float64bits(41.5)), 41.5, true},
		{mk(nvml.VALUE_TYPE_DOUBLE, math.Float64bits(math.NaN())), 0, false},
		{mk(nvml.VALUE_TYPE_UNSIGNED_INT, 63), 63, true},
		{mk(nvml.VALUE_TYPE_SIGNED_INT, uint64(uint32(0xfffffffe))), -2, true},
		{mk(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, 1<<40), 1 << 40, true},
		{mk(nvml.VALUE_TYPE_SIGNED_LONG_LONG, math.MaxUint64), -1, true},
		{mk(nvml.VALUE_TYPE_UNSIGNED_SHORT, 7), 7, true},
		{mk(nvml.VALUE_TYPE_COUNT, 1), 0, false},
		{nvml.FieldValue{NvmlReturn: uint32(nvml.ERROR_NOT_SUPPORTED)}, 0, false},
	}
	for i, c := range cases {
		got, ok := fieldValue(c.f)
		if ok != c.ok || got != c.want {
			t.Errorf("case %d: got %v,%v want %v,%v", i, got, ok, c.want, c.ok)
		}
	}
}

func TestNames(t *testing.T) {
	t.Parallel()
	if got := cudaVersion(12040); got != "12.4" {
		t.Errorf("cudaVersion(12040) = %q", got)
	}
	if got := cudaVersion(11080); got != "11.8" {
		t.Errorf("cudaVersion(11080) = %q", got)
	}
	if got := cudaVersion(0); got != "" {
		t.Errorf("cudaVersion(0) = %q", got)
	}
	if got := recoveryActionName(nvml.GPU_RECOVERY_ACTION_NODE_REBOOT); got != "Node Reboot" {
		t.Errorf("recovery action %q", got)
	}
	if got := recoveryActionName(99); got != "Unknown (99)" {
		t.Errorf("recovery action %q", got)
	}
	if got := computeModeName(nvml.COMPUTEMODE_DEFAULT); got != "Default" {
		t.Errorf("compute mode %q", got)
	}
}

// TestOpenWithoutLibrary: CI machines have no libnvidia-ml.so.1.
func TestOpenWithoutLibrary(t *testing.T) {
	lib, closeFn, err := Open()
	if err == nil {
		defer closeFn()
		if _, err := Read(lib); err != nil {
			t.Errorf("NVML opened but Read failed: %v", err)
		}
		t.Skip("NVML is present on this host")
	}
	if !errors.Is(err, ErrUnavailable) || !strings.HasPrefix(err.Error(), "NVML not available") {
		t.Errorf("Open error %q: want one starting with \"NVML not available\"", err)
	}
	if _, err := Collect(); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Collect error %v", err)
	}
}
