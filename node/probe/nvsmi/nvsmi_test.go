package nvsmi

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

var fixtures = []string{"h100x8_v12.xml", "a100_mig_v12.xml", "a10g_v11.xml"}

func TestGolden(t *testing.T) {
	t.Parallel()
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			st, err := Parse(data)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got, err := json.MarshalIndent(st, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			golden := filepath.Join("testdata", strings.TrimSuffix(name, ".xml")+".golden.json")
			if os.Getenv("UPDATE_GOLDEN") != "" {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (refresh with UPDATE_GOLDEN=1)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s differs from %s (refresh with UPDATE_GOLDEN=1 after checking the diff):\n%s",
					name, golden, firstDiff(string(want), string(got)))
			}
		})
	}
}

func firstDiff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return "line " + strconv.Itoa(i+1) + ":\n- " + w + "\n+ " + g
		}
	}
	return "(no line differs)"
}

// TestFixtureFacts pins the facts the checks rely on, in words, so a golden
// refresh cannot silently change them.
func TestFixtureFacts(t *testing.T) {
	t.Parallel()
	h100 := mustParseFile(t, "h100x8_v12.xml")
	if len(h100.GPUs) != 8 || h100.AttachedGPUs != 8 || h100.DriverVersion != "535.161.08" || h100.CUDAVersion != "12.2" {
		t.Fatalf("h100: %d GPUs, attached %d, driver %q, cuda %q", len(h100.GPUs), h100.AttachedGPUs, h100.DriverVersion, h100.CUDAVersion)
	}
	g0 := h100.GPUs[0]
	if g0.PCIBusID != "0000:19:00.0" || g0.Index != 0 || h100.GPUs[4].PCIBusID != "0000:9b:00.0" {
		t.Errorf("bus ids: %q %q", g0.PCIBusID, h100.GPUs[4].PCIBusID)
	}
	if g0.SlowdownTempC != nil || g0.ShutdownTempC != nil {
		t.Errorf("T.Limit offsets taken as absolute thresholds: slow %v shut %v", g0.SlowdownTempC, g0.ShutdownTempC)
	}
	if !g0.ClockEvents["hw_slowdown"] || !g0.ClockEvents["hw_power_brake_slowdown"] || g0.ClockEvents["hw_thermal_slowdown"] {
		t.Errorf("clock events: %v", g0.ClockEvents)
	}
	if g0.ECC.Aggregate.Uncorrectable == nil || *g0.ECC.Aggregate.Uncorrectable != 0 {
		t.Errorf("aggregate uncorrectable: %v", g0.ECC.Aggregate.Uncorrectable)
	}
	if g0.RemappedRows == nil || g0.RetiredPages != nil {
		t.Errorf("remapped %v retired %v", g0.RemappedRows, g0.RetiredPages)
	}
	if g0.Fabric == nil || g0.Fabric.State != "Completed" || g0.Fabric.Status != "Success" {
		t.Errorf("fabric: %+v", g0.Fabric)
	}
	if g0.PCIe != (snapshot.PCIeLink{GenCurrent: 5, GenMax: 5, WidthCurrent: 16, WidthMax: 16, ReplayCounter: g0.PCIe.ReplayCounter}) {
		t.Errorf("pcie: %+v", g0.PCIe)
	}

	a100 := mustParseFile(t, "a100_mig_v12.xml")
	if len(a100.GPUs) != 1 || a100.AttachedGPUs != 4 {
		t.Fatalf("a100: %d GPUs, attached %d", len(a100.GPUs), a100.AttachedGPUs)
	}
	a := a100.GPUs[0]
	if a.RemappedRows != nil || a.Fabric != nil || a.MIGEnabled == nil || !*a.MIGEnabled || a.UtilizationPct != nil {
		t.Errorf("a100: remapped %v fabric %v mig %v util %v", a.RemappedRows, a.Fabric, a.MIGEnabled, a.UtilizationPct)
	}
	if a.SlowdownTempC == nil || *a.SlowdownTempC != 89 || *a.ShutdownTempC != 92 || *a.MaxOperatingC != 85 {
		t.Errorf("a100 thresholds: %v %v %v", a.SlowdownTempC, a.ShutdownTempC, a.MaxOperatingC)
	}

	a10 := mustParseFile(t, "a10g_v11.xml")
	g := a10.GPUs[0]
	if !g.ClockEvents["gpu_idle"] || len(g.ClockEvents) != 9 {
		t.Errorf("a10g throttle reasons: %v", g.ClockEvents)
	}
	if g.PowerDrawW == nil || *g.PowerDrawW != 25.58 || g.PowerLimitW == nil || *g.PowerLimitW != 300 {
		t.Errorf("a10g power: %v %v", g.PowerDrawW, g.PowerLimitW)
	}
	if g.PCIe.WidthCurrent != 8 || g.PCIe.WidthMax != 16 || g.PCIe.GenCurrent != 1 || g.PCIe.GenMax != 4 {
		t.Errorf("a10g pcie: %+v", g.PCIe)
	}
	if len(g.Processes) != 1 || g.Processes[0].PID != 725 || g.Processes[0].Name != "/usr/lib/xorg/Xorg" ||
		g.Processes[0].Type != "G" || *g.Processes[0].UsedMemoryMiB != 22 {
		t.Errorf("a10g processes: %+v", g.Processes)
	}
	if g.MemoryTempC != nil || g.MIGEnabled != nil || g.PCIBusID != "0000:00:1e.0" {
		t.Errorf("a10g: memtemp %v mig %v bus %q", g.MemoryTempC, g.MIGEnabled, g.PCIBusID)
	}
}

func mustParseFile(t *testing.T, name string) *snapshot.GPUState {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	st, err := Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return st
}

// doc wraps GPU bodies in a minimal nvidia-smi document.
func doc(gpus ...string) []byte {
	var b strings.Builder
	b.WriteString(`<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log><driver_version>550.54.15</driver_version><attached_gpus>` + strconv.Itoa(len(gpus)) + `</attached_gpus>`)
	for _, g := range gpus {
		b.WriteString(`<gpu id="00000000:9B:00.0">` + g + `</gpu>`)
	}
	b.WriteString(`</nvidia_smi_log>`)
	return []byte(b.String())
}

func one(t *testing.T, body string) snapshot.GPU {
	t.Helper()
	st, err := Parse(doc(body))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if len(st.GPUs) != 1 {
		t.Fatalf("%d GPUs", len(st.GPUs))
	}
	return st.GPUs[0]
}

func TestTraps(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		body  string
		check func(t *testing.T, g snapshot.GPU)
	}{
		{"remapped rows bare N/A", `<remapped_rows>N/A</remapped_rows>`, func(t *testing.T, g snapshot.GPU) {
			if g.RemappedRows != nil {
				t.Errorf("got %+v, want nil", g.RemappedRows)
			}
		}},
		{"remapped rows pending and failed", `<remapped_rows><remapped_row_corr>3</remapped_row_corr><remapped_row_unc>2</remapped_row_unc>
			<remapped_row_pending>Yes</remapped_row_pending><remapped_row_failure>Yes</remapped_row_failure></remapped_rows>`,
			func(t *testing.T, g snapshot.GPU) {
				want := snapshot.RemappedRows{Correctable: 3, Uncorrectable: 2, Pending: true, Failure: true}
				if g.RemappedRows == nil || *g.RemappedRows != want {
					t.Errorf("got %+v, want %+v", g.RemappedRows, want)
				}
			}},
		{"throttle reasons (old schema)", `<clocks_throttle_reasons><clocks_throttle_reason_hw_thermal_slowdown>Active</clocks_throttle_reason_hw_thermal_slowdown>
			<clocks_throttle_reason_gpu_idle>Not Active</clocks_throttle_reason_gpu_idle><clocks_throttle_reason_sync_boost>N/A</clocks_throttle_reason_sync_boost></clocks_throttle_reasons>`,
			func(t *testing.T, g snapshot.GPU) {
				want := map[string]bool{"hw_thermal_slowdown": true, "gpu_idle": false}
				if !reflect.DeepEqual(g.ClockEvents, want) {
					t.Errorf("got %v, want %v", g.ClockEvents, want)
				}
			}},
		{"event reasons (new schema)", `<clocks_event_reasons><clocks_event_reason_sw_thermal_slowdown>Active</clocks_event_reason_sw_thermal_slowdown></clocks_event_reasons>`,
			func(t *testing.T, g snapshot.GPU) {
				if want := map[string]bool{"sw_thermal_slowdown": true}; !reflect.DeepEqual(g.ClockEvents, want) {
					t.Errorf("got %v, want %v", g.ClockEvents, want)
				}
			}},
		{"no reasons at all", ``, func(t *testing.T, g snapshot.GPU) {
			if g.ClockEvents != nil {
				t.Errorf("got %v, want nil", g.ClockEvents)
			}
		}},
		{"not supported values", `<fb_memory_usage><total>[Not Supported]</total><used>N/A</used></fb_memory_usage>
			<persistence_mode>[Not Supported]</persistence_mode><compute_mode>N/A</compute_mode>
			<temperature><gpu_temp>Not Supported</gpu_temp><memory_temp>N/A</memory_temp></temperature>
			<gpu_power_readings><power_draw>[Not Supported]</power_draw><current_power_limit>N/A</current_power_limit></gpu_power_readings>
			<utilization><gpu_util>N/A</gpu_util></utilization><ecc_mode><current_ecc>N/A</current_ecc><pending_ecc>N/A</pending_ecc></ecc_mode>
			<ecc_errors><volatile><sram_correctable>N/A</sram_correctable><dram_uncorrectable>N/A</dram_uncorrectable></volatile></ecc_errors>
			<pci><pci_gpu_link_info><link_widths><max_link_width>N/A</max_link_width></link_widths></pci_gpu_link_info><replay_counter>N/A</replay_counter></pci>
			<gpu_recovery_action>N/A</gpu_recovery_action>`,
			func(t *testing.T, g snapshot.GPU) {
				if g.MemoryTotalMiB != nil || g.MemoryUsedMiB != nil || g.PersistenceMode != nil || g.ComputeMode != "" ||
					g.TemperatureC != nil || g.MemoryTempC != nil || g.PowerDrawW != nil || g.PowerLimitW != nil ||
					g.UtilizationPct != nil || g.ECCEnabled != nil || g.ECCPending != nil ||
					g.ECC.Volatile.Correctable != nil || g.ECC.Volatile.Uncorrectable != nil || g.ECC.Volatile.Detail != nil ||
					g.PCIe.WidthMax != 0 || g.PCIe.ReplayCounter != nil || g.RecoveryAction != "" {
					t.Errorf("a not-supported value became a value: %+v", g)
				}
			}},
		{"missing everything", ``, func(t *testing.T, g snapshot.GPU) {
			if g.RemappedRows != nil || g.RetiredPages != nil || g.Fabric != nil || g.ResetRequired != nil ||
				g.ECC.Aggregate.Uncorrectable != nil || g.Processes != nil || g.PCIBusID != "0000:9b:00.0" {
				t.Errorf("got %+v", g)
			}
		}},
		{"old ECC schema with totals", `<ecc_errors><volatile>
			<single_bit><device_memory>4</device_memory><register_file>1</register_file><l1_cache>N/A</l1_cache><total>5</total></single_bit>
			<double_bit><device_memory>2</device_memory><register_file>0</register_file><total>2</total></double_bit></volatile>
			<aggregate><single_bit><device_memory>7</device_memory><total>N/A</total></single_bit>
			<double_bit><device_memory>1</device_memory><register_file>2</register_file><total>N/A</total></double_bit></aggregate></ecc_errors>`,
			func(t *testing.T, g snapshot.GPU) {
				v, a := g.ECC.Volatile, g.ECC.Aggregate
				if !eq(v.Correctable, 5) || !eq(v.Uncorrectable, 2) || v.Detail["double_bit.device_memory"] != 2 {
					t.Errorf("volatile: %v %v %v", v.Correctable, v.Uncorrectable, v.Detail)
				}
				// Totals printed as N/A: the parts are summed.
				if !eq(a.Correctable, 7) || !eq(a.Uncorrectable, 3) {
					t.Errorf("aggregate: %v %v", a.Correctable, a.Uncorrectable)
				}
			}},
		{"SRAM split into parity and SEC-DED", `<ecc_errors><volatile><sram_correctable>10</sram_correctable>
			<sram_uncorrectable_parity>1</sram_uncorrectable_parity><sram_uncorrectable_secded>2</sram_uncorrectable_secded>
			<dram_correctable>5</dram_correctable><dram_uncorrectable>4</dram_uncorrectable></volatile>
			<aggregate><sram_uncorrectable>9</sram_uncorrectable><sram_uncorrectable_parity>4</sram_uncorrectable_parity>
			<sram_uncorrectable_secded>5</sram_uncorrectable_secded><dram_uncorrectable>0</dram_uncorrectable>
			<sram_threshold_exceeded>Yes</sram_threshold_exceeded></aggregate></ecc_errors>`,
			func(t *testing.T, g snapshot.GPU) {
				if !eq(g.ECC.Volatile.Uncorrectable, 7) || !eq(g.ECC.Volatile.Correctable, 15) {
					t.Errorf("volatile: %v %v", g.ECC.Volatile.Uncorrectable, g.ECC.Volatile.Correctable)
				}
				// sram_uncorrectable beside its split parts is not counted twice.
				if !eq(g.ECC.Aggregate.Uncorrectable, 9) || g.ECC.Aggregate.Correctable != nil {
					t.Errorf("aggregate: %v %v", g.ECC.Aggregate.Uncorrectable, g.ECC.Aggregate.Correctable)
				}
				if g.ECC.SRAMThresholdExceeded == nil || !*g.ECC.SRAMThresholdExceeded {
					t.Errorf("threshold: %v", g.ECC.SRAMThresholdExceeded)
				}
			}},
		{"retired pages (pre-Ampere)", `<retired_pages><multiple_single_bit_retirement><retired_count>3</retired_count></multiple_single_bit_retirement>
			<double_bit_retirement><retired_count>1</retired_count></double_bit_retirement><pending_retirement>Yes</pending_retirement></retired_pages>`,
			func(t *testing.T, g snapshot.GPU) {
				rp := g.RetiredPages
				if rp == nil || !eq(rp.SingleBit, 3) || !eq(rp.DoubleBit, 1) || rp.Pending == nil || !*rp.Pending {
					t.Errorf("got %+v", rp)
				}
			}},
		{"retired pages pending blacklist (older)", `<retired_pages><pending_blacklist>No</pending_blacklist></retired_pages>`,
			func(t *testing.T, g snapshot.GPU) {
				if g.RetiredPages == nil || g.RetiredPages.Pending == nil || *g.RetiredPages.Pending {
					t.Errorf("got %+v", g.RetiredPages)
				}
			}},
		{"T.Limit offsets are not thresholds", `<temperature><gpu_temp>41 C</gpu_temp><gpu_temp_tlimit>44 C</gpu_temp_tlimit>
			<gpu_temp_max_tlimit_threshold>-8 C</gpu_temp_max_tlimit_threshold><gpu_temp_slow_tlimit_threshold>-2 C</gpu_temp_slow_tlimit_threshold>
			<gpu_temp_max_gpu_tlimit_threshold>0 C</gpu_temp_max_gpu_tlimit_threshold><gpu_target_temperature>83 C</gpu_target_temperature></temperature>`,
			func(t *testing.T, g snapshot.GPU) {
				if !feq(g.TemperatureC, 41) || g.SlowdownTempC != nil || g.ShutdownTempC != nil || !feq(g.MaxOperatingC, 83) {
					t.Errorf("temp %v slow %v shut %v max %v", g.TemperatureC, g.SlowdownTempC, g.ShutdownTempC, g.MaxOperatingC)
				}
			}},
		{"absolute thresholds beside T.Limit ones", `<temperature><gpu_temp>85 C</gpu_temp><gpu_temp_slow_tlimit_threshold>-2 C</gpu_temp_slow_tlimit_threshold>
			<gpu_temp_slow_threshold>90 C</gpu_temp_slow_threshold><gpu_temp_max_threshold>95 C</gpu_temp_max_threshold>
			<gpu_temp_max_gpu_threshold>87 C</gpu_temp_max_gpu_threshold><memory_temp>70 C</memory_temp></temperature>`,
			func(t *testing.T, g snapshot.GPU) {
				if !feq(g.SlowdownTempC, 90) || !feq(g.ShutdownTempC, 95) || !feq(g.MaxOperatingC, 87) || !feq(g.MemoryTempC, 70) {
					t.Errorf("slow %v shut %v max %v mem %v", g.SlowdownTempC, g.ShutdownTempC, g.MaxOperatingC, g.MemoryTempC)
				}
			}},
		{"v13 average and instant power", `<gpu_power_readings><average_power_draw>312.40 W</average_power_draw>
			<instant_power_draw>330.11 W</instant_power_draw><current_power_limit>700.00 W</current_power_limit></gpu_power_readings>`,
			func(t *testing.T, g snapshot.GPU) {
				if !feq(g.PowerDrawW, 312.4) || !feq(g.PowerLimitW, 700) {
					t.Errorf("draw %v limit %v", g.PowerDrawW, g.PowerLimitW)
				}
			}},
		{"v13 instant only", `<gpu_power_readings><average_power_draw>N/A</average_power_draw><instant_power_draw>99.5 W</instant_power_draw></gpu_power_readings>`,
			func(t *testing.T, g snapshot.GPU) {
				if !feq(g.PowerDrawW, 99.5) {
					t.Errorf("draw %v", g.PowerDrawW)
				}
			}},
		{"old power_readings prefer enforced limit", `<power_readings><power_draw>25.5 W</power_draw><power_limit>250.00 W</power_limit>
			<enforced_power_limit>200.00 W</enforced_power_limit></power_readings>`,
			func(t *testing.T, g snapshot.GPU) {
				if !feq(g.PowerDrawW, 25.5) || !feq(g.PowerLimitW, 200) {
					t.Errorf("draw %v limit %v", g.PowerDrawW, g.PowerLimitW)
				}
			}},
		{"PCIe link and bus id", `<pci><pci_bus_id>00000000:1B:00.0</pci_bus_id><pci_gpu_link_info><pcie_gen><max_link_gen>5</max_link_gen>
			<current_link_gen>1</current_link_gen></pcie_gen><link_widths><max_link_width>16x</max_link_width><current_link_width>4x</current_link_width>
			</link_widths></pci_gpu_link_info><replay_counter>12</replay_counter></pci>`,
			func(t *testing.T, g snapshot.GPU) {
				want := snapshot.PCIeLink{GenCurrent: 1, GenMax: 5, WidthCurrent: 4, WidthMax: 16}
				got := g.PCIe
				got.ReplayCounter = nil
				if got != want || !eq(g.PCIe.ReplayCounter, 12) || g.PCIBusID != "0000:1b:00.0" {
					t.Errorf("got %+v (bus %q)", g.PCIe, g.PCIBusID)
				}
			}},
		{"fabric N/A", `<fabric><state>N/A</state><status>N/A</status></fabric>`, func(t *testing.T, g snapshot.GPU) {
			if g.Fabric != nil {
				t.Errorf("got %+v", g.Fabric)
			}
		}},
		{"fabric in progress", `<fabric><state>In Progress</state><status>N/A</status><cliqueId>4</cliqueId>
			<clusterUuid>a1b2c3d4-0000-0000-0000-000000000000</clusterUuid></fabric>`, func(t *testing.T, g snapshot.GPU) {
			want := snapshot.Fabric{State: "In Progress", CliqueID: "4", ClusterUUID: "a1b2c3d4-0000-0000-0000-000000000000"}
			if g.Fabric == nil || *g.Fabric != want {
				t.Errorf("got %+v", g.Fabric)
			}
		}},
		{"processes", `<processes><process_info><pid>4242</pid><type>C</type><process_name>python3 &amp; co</process_name>
			<used_memory>40960 MiB</used_memory></process_info><process_info><pid>77</pid><type>C+G</type><process_name>x</process_name>
			<used_memory>N/A</used_memory></process_info></processes>`,
			func(t *testing.T, g snapshot.GPU) {
				if len(g.Processes) != 2 || g.Processes[0].PID != 4242 || g.Processes[0].Name != "python3 & co" ||
					!eq(g.Processes[0].UsedMemoryMiB, 40960) || g.Processes[1].UsedMemoryMiB != nil || g.Processes[1].Type != "C+G" {
					t.Errorf("got %+v", g.Processes)
				}
			}},
		{"modes and reset status", `<persistence_mode>Enabled</persistence_mode><mig_mode><current_mig>Disabled</current_mig></mig_mode>
			<ecc_mode><current_ecc>Disabled</current_ecc><pending_ecc>Enabled</pending_ecc></ecc_mode><compute_mode>Exclusive_Process</compute_mode>
			<gpu_reset_status><reset_required>Yes</reset_required><drain_and_reset_recommended>No</drain_and_reset_recommended></gpu_reset_status>
			<gpu_recovery_action>Drain and Reset</gpu_recovery_action>`,
			func(t *testing.T, g snapshot.GPU) {
				if !bv(g.PersistenceMode, true) || !bv(g.MIGEnabled, false) || !bv(g.ECCEnabled, false) || !bv(g.ECCPending, true) ||
					g.ComputeMode != "Exclusive_Process" || !bv(g.ResetRequired, true) || !bv(g.DrainAndReset, false) ||
					g.RecoveryAction != "Drain and Reset" {
					t.Errorf("got %+v", g)
				}
			}},
		{"memory in GiB and clocks", `<fb_memory_usage><total>80 GiB</total><used>512 KiB</used></fb_memory_usage>
			<clocks><sm_clock>1755 MHz</sm_clock></clocks><max_clocks><sm_clock>1980 MHz</sm_clock></max_clocks>`,
			func(t *testing.T, g snapshot.GPU) {
				if !eq(g.MemoryTotalMiB, 81920) || !eq(g.MemoryUsedMiB, 0) || !feq(g.SMClockMHz, 1755) || !feq(g.MaxSMClockMHz, 1980) {
					t.Errorf("mem %v/%v clocks %v/%v", g.MemoryTotalMiB, g.MemoryUsedMiB, g.SMClockMHz, g.MaxSMClockMHz)
				}
			}},
		{"unknown elements and attributes ignored", `<future_thing a="1"><x>y</x></future_thing><product_name new="yes">NVIDIA B200</product_name><empty/>`,
			func(t *testing.T, g snapshot.GPU) {
				if g.Name != "NVIDIA B200" {
					t.Errorf("name %q", g.Name)
				}
			}},
		{"NaN and Inf are not numbers", `<temperature><gpu_temp>NaN C</gpu_temp><memory_temp>Inf C</memory_temp></temperature>
			<utilization><gpu_util>-Inf %</gpu_util></utilization>`,
			func(t *testing.T, g snapshot.GPU) {
				if g.TemperatureC != nil || g.MemoryTempC != nil || g.UtilizationPct != nil {
					t.Errorf("temp %v mem %v util %v", g.TemperatureC, g.MemoryTempC, g.UtilizationPct)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.check(t, one(t, c.body))
		})
	}
}

func TestIndexFollowsFileOrder(t *testing.T) {
	t.Parallel()
	data := []byte(`<nvidia_smi_log><attached_gpus>3</attached_gpus>
		<gpu id="00000000:19:00.0"><uuid>GPU-a</uuid></gpu><gpu id="00000000:3B:00.0"><uuid>GPU-b</uuid></gpu></nvidia_smi_log>`)
	st, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if st.AttachedGPUs != 3 || len(st.GPUs) != 2 {
		t.Fatalf("attached %d, gpus %d", st.AttachedGPUs, len(st.GPUs))
	}
	for i, want := range []string{"0000:19:00.0", "0000:3b:00.0"} {
		if st.GPUs[i].Index != i || st.GPUs[i].PCIBusID != want {
			t.Errorf("GPU %d: index %d bus %q", i, st.GPUs[i].Index, st.GPUs[i].PCIBusID)
		}
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"empty":             ``,
		"driver message":    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
		"truncated":         `<?xml version="1.0" ?><nvidia_smi_log><gpu id="x"><product_name>NVIDIA`,
		"wrong root":        `<html><body>502</body></html>`,
		"mismatched tags":   `<nvidia_smi_log><gpu></nvidia_smi_log></gpu>`,
		"stray end tag":     `</nvidia_smi_log>`,
		"bad entity":        `<nvidia_smi_log><driver_version>&bogus;</driver_version></nvidia_smi_log>`,
		"invalid utf-8":     "<nvidia_smi_log><driver_version>\xff\xfe</driver_version></nvidia_smi_log>",
		"unterminated tag":  `<nvidia_smi_log><gpu id="0000`,
		"unquoted attr":     `<nvidia_smi_log><gpu id=1></gpu></nvidia_smi_log>`,
		"unclosed comment":  `<nvidia_smi_log><!-- `,
		"unclosed doctype":  `<!DOCTYPE nvidia_smi_log SYSTEM "x`,
		"lt in attribute":   `<nvidia_smi_log a="<"></nvidia_smi_log>`,
		"name starts digit": `<nvidia_smi_log><1a>x</1a></nvidia_smi_log>`,
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st, err := Parse([]byte(in))
			if err == nil {
				t.Fatalf("no error; got %+v", st)
			}
			if !strings.HasPrefix(err.Error(), "parse nvidia-smi xml: ") {
				t.Errorf("error %q does not name the source", err)
			}
		})
	}
	_, err := Parse([]byte("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\nMore.\n"))
	if err == nil || !strings.Contains(err.Error(), "couldn't communicate") {
		t.Errorf("driver message not shown: %v", err)
	}
}

func TestParseAcceptsXMLForms(t *testing.T) {
	t.Parallel()
	// Forms nvidia-smi does not write today but XML allows.
	in := `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE nvidia_smi_log [ <!ELEMENT nvidia_smi_log ANY> ]>
<!-- comment -->
<nvidia_smi_log>
  <driver_version><![CDATA[560.35.03]]></driver_version>
  <cuda_version>12&#46;6</cuda_version>
  <gpu id = '00000000:0A:00.0' ><product_name>A&#x42;C</product_name><uuid/></gpu>
</nvidia_smi_log>
trailing text`
	st, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if st.DriverVersion != "560.35.03" || st.CUDAVersion != "12.6" || len(st.GPUs) != 1 ||
		st.GPUs[0].Name != "ABC" || st.GPUs[0].PCIBusID != "0000:0a:00.0" {
		t.Errorf("got %+v", st)
	}
}

func eq(p *uint64, v uint64) bool    { return p != nil && *p == v }
func feq(p *float64, v float64) bool { return p != nil && *p == v }
func bv(p *bool, v bool) bool        { return p != nil && *p == v }

// TestUnreachableGPU: nvidia-smi names a GPU it cannot talk to in a line of
// text ("Unable to determine the device handle for GPU0000:9B:00.0: Unknown
// Error", as printed in NVIDIA/open-gpu-kernel-modules#387 and
// NVIDIA/nvidia-docker#1553), before the document of the GPUs it can read or
// instead of it. The inputs are the real H100 capture with GPU 9B's element
// taken out (or its identity turned into "Unknown Error") and that line added.
func TestUnreachableGPU(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("testdata", "h100x8_v12.xml"))
	if err != nil {
		t.Fatal(err)
	}
	full := string(data)
	start := strings.Index(full, `<gpu id="00000000:9B:00.0">`)
	end := start + strings.Index(full[start:], "</gpu>") + len("</gpu>\n")
	without9B := full[:start] + full[end:]
	elem := full[start:end]
	unknown9B := full[:start] +
		strings.NewReplacer("<product_name>NVIDIA H100 80GB HBM3</product_name>", "<product_name>Unknown Error</product_name>",
			"<uuid>GPU-2b6f61f9-8b00-3b57-d912-b62792120662</uuid>", "<uuid>Unknown Error</uuid>").Replace(elem) +
		full[end:]
	line := "Unable to determine the device handle for GPU0000:9B:00.0: Unknown Error\n"

	cases := []struct {
		name     string
		in       string
		gpus     int
		index    int
		nextIdx0 string // bus id of GPUs[4]
	}{
		{"line before the document", line + without9B, 7, -1, "0000:bb:00.0"},
		{"line after the document", without9B + line, 7, -1, "0000:bb:00.0"},
		{"old spelling with a space", strings.Replace(line, "GPU0000", "GPU 0000", 1) + without9B, 7, -1, "0000:bb:00.0"},
		{"only the line", line, 0, -1, ""},
		{"identity reads Unknown Error", unknown9B, 7, 4, "0000:bb:00.0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, err := Parse([]byte(tc.in))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := []snapshot.UnreachableGPU{{PCIBusID: "0000:9b:00.0", Index: tc.index, Error: "Unknown Error"}}
			if !reflect.DeepEqual(st.Unreachable, want) {
				t.Errorf("Unreachable = %+v, want %+v", st.Unreachable, want)
			}
			if len(st.GPUs) != tc.gpus {
				t.Fatalf("%d GPUs, want %d", len(st.GPUs), tc.gpus)
			}
			if tc.gpus > 4 && st.GPUs[4].PCIBusID != tc.nextIdx0 {
				t.Errorf("GPUs[4] is %s, want %s", st.GPUs[4].PCIBusID, tc.nextIdx0)
			}
		})
	}
}
