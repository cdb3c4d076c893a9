package sim

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// gpuInfo holds a GPU's values that never change: derived once at New so a
// render only formats what faults and time move.
type gpuInfo struct {
	busUpper   string // "00000000:3B:00.0", nvidia-smi's form
	busByte    string // "3B"
	boardID    string // "0x3b00"
	idleTempC  int
	memTempC   int
	idlePowerW float64
	replays    int
	txKBs      int
	rxKBs      int
	bbxStamp   string
	bbxUS      int
	ghostPID   int
}

func deriveGPUs(s *Spec, boot time.Time) []gpuInfo {
	out := make([]gpuInfo, len(s.GPUs))
	for i, g := range s.GPUs {
		h := func(what string) uint64 { return hash64(s.Seed, s.Name, what, itoa(i)) }
		dom, bus, dev, fn := splitBDF(g.BusID)
		bb := strings.ToUpper(bus)
		flush := boot.Add(time.Duration(h("bbx")%(6*3600)) * time.Second).Add(time.Duration(h("bbx-ms")%1000) * time.Millisecond)
		out[i] = gpuInfo{
			busUpper:   strings.ToUpper(fmt.Sprintf("0000%s:%s:%s.%s", dom, bus, dev, fn)),
			busByte:    bb,
			boardID:    "0x" + strings.ToLower(bus) + "00",
			idleTempC:  29 + int(h("temp")%4),
			memTempC:   38 + int(h("memtemp")%3),
			idlePowerW: g.Model.IdlePowerW + float64(h("power")%600)/100,
			replays:    40 + int(h("replay")%45),
			txKBs:      500 + int(h("tx")%3500),
			rxKBs:      500 + int(h("rx")%300),
			bbxStamp:   flush.UTC().Format("2006/01/02 15:04:05.000"),
			bbxUS:      85000 + int(h("bbx-us")%10000),
			ghostPID:   100000 + int(h("pid")%3000000),
		}
	}
	return out
}

// splitBDF splits "0000:19:00.0" into its parts; malformed ids give zeros.
func splitBDF(bdf string) (dom, bus, dev, fn string) {
	dom, bus, dev, fn = "0000", "00", "00", "0"
	parts := strings.Split(bdf, ":")
	if len(parts) != 3 {
		return
	}
	df := strings.SplitN(parts[2], ".", 2)
	dom, bus, dev = parts[0], parts[1], df[0]
	if len(df) == 2 {
		fn = df[1]
	}
	return
}

// xmlWriter appends tab-indented elements, the way nvidia-smi prints them.
type xmlWriter struct{ b []byte }

func (w *xmlWriter) indent(d int) {
	for range d {
		w.b = append(w.b, '\t')
	}
}

func (w *xmlWriter) open(d int, name string) {
	w.indent(d)
	w.b = append(w.b, '<')
	w.b = append(w.b, name...)
	w.b = append(w.b, ">\n"...)
}

func (w *xmlWriter) close(d int, name string) {
	w.indent(d)
	w.b = append(w.b, "</"...)
	w.b = append(w.b, name...)
	w.b = append(w.b, ">\n"...)
}

func (w *xmlWriter) el(d int, name, val string) {
	w.indent(d)
	w.b = append(w.b, '<')
	w.b = append(w.b, name...)
	w.b = append(w.b, '>')
	w.b = appendEscaped(w.b, val)
	w.b = append(w.b, "</"...)
	w.b = append(w.b, name...)
	w.b = append(w.b, ">\n"...)
}

func (w *xmlWriter) elInt(d int, name string, v uint64, unit string) {
	w.indent(d)
	w.b = append(w.b, '<')
	w.b = append(w.b, name...)
	w.b = append(w.b, '>')
	w.b = strconv.AppendUint(w.b, v, 10)
	w.b = append(w.b, unit...)
	w.b = append(w.b, "</"...)
	w.b = append(w.b, name...)
	w.b = append(w.b, ">\n"...)
}

func (w *xmlWriter) raw(s string) { w.b = append(w.b, s...) }

func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '&':
			b = append(b, "&amp;"...)
		case '<':
			b = append(b, "&lt;"...)
		case '>':
			b = append(b, "&gt;"...)
		default:
			b = append(b, c)
		}
	}
	return b
}

func active(b bool) string {
	if b {
		return "Active"
	}
	return "Not Active"
}

func yesNo(b bool) string {
	if b {
		return "Yes"
	}
	return "No"
}

// renderXML is `nvidia-smi -q -x` in the v12 schema of driver 535.
func (n *Node) renderXML(f frame) []byte {
	w := xmlWriter{b: make([]byte, 0, 1024+11*1024*len(n.spec.GPUs))}
	w.raw("<?xml version=\"1.0\" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v12.dtd\">\n<nvidia_smi_log>\n")
	w.el(1, "timestamp", f.now.Format("Mon Jan _2 15:04:05 2006"))
	w.el(1, "driver_version", f.driver)
	w.el(1, "cuda_version", n.spec.CUDA)
	w.elInt(1, "attached_gpus", uint64(f.v.gpusPresent), "")
	for i := range n.spec.GPUs {
		if f.v.gpus[i].missing {
			continue
		}
		n.appendGPU(&w, i, f)
	}
	w.raw("</nvidia_smi_log>\n")
	return w.b
}

func (n *Node) appendGPU(w *xmlWriter, i int, f frame) {
	g := &n.spec.GPUs[i]
	m := &g.Model
	info := &n.gpus[i]
	gf := &f.v.gpus[i]
	hot := gf.hotC > 0

	w.raw("\t<gpu id=\"" + info.busUpper + "\">\n")
	w.el(2, "product_name", m.Name)
	w.el(2, "product_brand", "NVIDIA")
	w.el(2, "product_architecture", m.Architecture)
	w.el(2, "display_mode", "Enabled")
	w.el(2, "display_active", "Disabled")
	w.el(2, "persistence_mode", "Enabled")
	w.el(2, "addressing_mode", "None")
	w.open(2, "mig_mode")
	w.el(3, "current_mig", "Disabled")
	w.el(3, "pending_mig", "Disabled")
	w.close(2, "mig_mode")
	w.raw("\t\t<mig_devices>\n\t\t\tNone\n\t\t</mig_devices>\n")
	w.el(2, "accounting_mode", "Disabled")
	w.el(2, "accounting_mode_buffer_size", "4000")
	w.open(2, "driver_model")
	w.el(3, "current_dm", "N/A")
	w.el(3, "pending_dm", "N/A")
	w.close(2, "driver_model")
	w.el(2, "serial", g.Serial)
	w.el(2, "uuid", g.UUID)
	w.elInt(2, "minor_number", uint64(i), "")
	w.el(2, "vbios_version", g.VBIOS)
	w.el(2, "multigpu_board", "No")
	w.el(2, "board_id", info.boardID)
	w.el(2, "board_part_number", m.BoardPartNumber)
	w.el(2, "gpu_part_number", m.GPUPartNumber)
	w.el(2, "gpu_fru_part_number", "N/A")
	w.elInt(2, "gpu_module_id", uint64(g.ModuleID), "")
	w.open(2, "inforom_version")
	w.el(3, "img_version", m.InforomImage)
	w.el(3, "oem_object", m.InforomOEM)
	w.el(3, "ecc_object", m.InforomECC)
	w.el(3, "pwr_object", "N/A")
	w.close(2, "inforom_version")
	if m.SRAMSplit {
		w.open(2, "inforom_bbx_flush")
		w.el(3, "latest_timestamp", info.bbxStamp)
		w.elInt(3, "latest_duration", uint64(info.bbxUS), " us")
		w.close(2, "inforom_bbx_flush")
	}
	w.open(2, "gpu_operation_mode")
	w.el(3, "current_gom", "N/A")
	w.el(3, "pending_gom", "N/A")
	w.close(2, "gpu_operation_mode")
	w.el(2, "gsp_firmware_version", f.driver)
	w.open(2, "gpu_virtualization_mode")
	w.el(3, "virtualization_mode", "None")
	w.el(3, "host_vgpu_mode", "N/A")
	w.close(2, "gpu_virtualization_mode")
	w.open(2, "gpu_reset_status")
	w.el(3, "reset_required", yesNo(gf.remapPending))
	w.el(3, "drain_and_reset_recommended", yesNo(gf.remapFailure))
	w.close(2, "gpu_reset_status")
	w.open(2, "ibmnpu")
	w.el(3, "relaxed_ordering_mode", "N/A")
	w.close(2, "ibmnpu")

	w.open(2, "pci")
	w.el(3, "pci_bus", info.busByte)
	w.el(3, "pci_device", "00")
	w.el(3, "pci_domain", "0000")
	w.el(3, "pci_device_id", fmt.Sprintf("%04X10DE", m.DeviceID))
	w.el(3, "pci_bus_id", info.busUpper)
	w.el(3, "pci_sub_system_id", fmt.Sprintf("%04X10DE", m.SubsystemID))
	w.open(3, "pci_gpu_link_info")
	w.open(4, "pcie_gen")
	gen := uint64(m.PCIeGen)
	w.elInt(5, "max_link_gen", gen, "")
	w.elInt(5, "current_link_gen", gen, "")
	w.elInt(5, "device_current_link_gen", gen, "")
	w.elInt(5, "max_device_link_gen", gen, "")
	w.elInt(5, "max_host_link_gen", gen, "")
	w.close(4, "pcie_gen")
	w.open(4, "link_widths")
	w.elInt(5, "max_link_width", uint64(m.PCIeWidth), "x")
	w.elInt(5, "current_link_width", uint64(n.gpuWidth(i, f.v)), "x")
	w.close(4, "link_widths")
	w.close(3, "pci_gpu_link_info")
	w.open(3, "pci_bridge_chip")
	w.el(4, "bridge_chip_type", "N/A")
	w.el(4, "bridge_chip_fw", "N/A")
	w.close(3, "pci_bridge_chip")
	w.elInt(3, "replay_counter", uint64(info.replays), "")
	w.el(3, "replay_rollover_counter", "0")
	w.elInt(3, "tx_util", uint64(info.txKBs), " KB/s")
	w.elInt(3, "rx_util", uint64(info.rxKBs), " KB/s")
	w.el(3, "atomic_caps_inbound", "N/A")
	w.el(3, "atomic_caps_outbound", "FETCHADD_32 FETCHADD_64 SWAP_32 SWAP_64 CAS_32 CAS_64")
	w.close(2, "pci")

	w.el(2, "fan_speed", "N/A")
	w.el(2, "performance_state", "P0")
	idle := !hot && gf.ghost == nil && !m.PowerBrakeAtIdle
	w.open(2, "clocks_event_reasons")
	w.el(3, "clocks_event_reason_gpu_idle", active(idle))
	w.el(3, "clocks_event_reason_applications_clocks_setting", "Not Active")
	w.el(3, "clocks_event_reason_sw_power_cap", "Not Active")
	w.el(3, "clocks_event_reason_hw_slowdown", active(hot || m.PowerBrakeAtIdle))
	w.el(3, "clocks_event_reason_hw_thermal_slowdown", active(hot))
	w.el(3, "clocks_event_reason_hw_power_brake_slowdown", active(m.PowerBrakeAtIdle))
	w.el(3, "clocks_event_reason_sync_boost", "Not Active")
	w.el(3, "clocks_event_reason_sw_thermal_slowdown", active(hot))
	w.el(3, "clocks_event_reason_display_clocks_setting", "Not Active")
	w.close(2, "clocks_event_reasons")
	if m.SRAMSplit {
		w.el(2, "sparse_operation_mode", "Disabled")
	}

	var used uint64
	if gf.ghost != nil {
		used = gf.ghost.MiB
	}
	w.open(2, "fb_memory_usage")
	w.elInt(3, "total", m.MemoryMiB, " MiB")
	w.elInt(3, "reserved", m.ReservedMiB, " MiB")
	w.elInt(3, "used", used, " MiB")
	w.elInt(3, "free", m.MemoryMiB-m.ReservedMiB-min(used, m.MemoryMiB-m.ReservedMiB-1)-1, " MiB")
	w.close(2, "fb_memory_usage")
	w.open(2, "bar1_memory_usage")
	w.elInt(3, "total", m.BAR1MiB, " MiB")
	w.el(3, "used", "1 MiB")
	w.elInt(3, "free", m.BAR1MiB-1, " MiB")
	w.close(2, "bar1_memory_usage")
	w.open(2, "cc_protected_memory_usage")
	w.el(3, "total", "0 MiB")
	w.el(3, "used", "0 MiB")
	w.el(3, "free", "0 MiB")
	w.close(2, "cc_protected_memory_usage")
	w.el(2, "compute_mode", "Default")
	util := "0 %"
	if hot {
		util = "100 %"
	}
	w.open(2, "utilization")
	w.el(3, "gpu_util", util)
	w.el(3, "memory_util", "0 %")
	w.el(3, "encoder_util", "0 %")
	w.el(3, "decoder_util", "0 %")
	w.el(3, "jpeg_util", "0 %")
	w.el(3, "ofa_util", "0 %")
	w.close(2, "utilization")
	for _, s := range [2]string{"encoder_stats", "fbc_stats"} {
		w.open(2, s)
		w.el(3, "session_count", "0")
		w.el(3, "average_fps", "0")
		w.el(3, "average_latency", "0")
		w.close(2, s)
	}
	w.open(2, "ecc_mode")
	w.el(3, "current_ecc", "Enabled")
	w.el(3, "pending_ecc", "Enabled")
	w.close(2, "ecc_mode")

	w.open(2, "ecc_errors")
	for _, set := range [2]struct {
		name string
		dram uint64
	}{{"volatile", gf.eccVolatile}, {"aggregate", gf.eccAggregate}} {
		w.open(3, set.name)
		w.el(4, "sram_correctable", "0")
		if m.SRAMSplit {
			w.el(4, "sram_uncorrectable_parity", "0")
			w.el(4, "sram_uncorrectable_secded", "0")
		} else {
			w.el(4, "sram_uncorrectable", "0")
		}
		w.el(4, "dram_correctable", "0")
		w.elInt(4, "dram_uncorrectable", set.dram, "")
		if m.SRAMSplit && set.name == "aggregate" {
			w.el(4, "sram_threshold_exceeded", "No")
		}
		w.close(3, set.name)
	}
	if m.SRAMSplit {
		w.open(3, "aggregate_uncorrectable_sram_sources")
		for _, s := range [5]string{"sram_l2", "sram_sm", "sram_microcontroller", "sram_pcie", "sram_other"} {
			w.el(4, s, "0")
		}
		w.close(3, "aggregate_uncorrectable_sram_sources")
	}
	w.close(2, "ecc_errors")

	w.open(2, "retired_pages")
	for _, s := range [2]string{"multiple_single_bit_retirement", "double_bit_retirement"} {
		w.open(3, s)
		w.el(4, "retired_count", "N/A")
		w.el(4, "retired_pagelist", "N/A")
		w.close(3, s)
	}
	w.el(3, "pending_blacklist", "N/A")
	w.el(3, "pending_retirement", "N/A")
	w.close(2, "retired_pages")

	// A pending remap used one spare row of a bank; a failure found a bank
	// with none left.
	unc, high, none := gf.remapApplied, gf.remapApplied, uint64(0)
	if gf.remapPending {
		unc, high = unc+1, high+1
	}
	if gf.remapFailure {
		unc, none = unc+8, none+1
	}
	w.open(2, "remapped_rows")
	w.el(3, "remapped_row_corr", "0")
	w.elInt(3, "remapped_row_unc", unc, "")
	w.el(3, "remapped_row_pending", yesNo(gf.remapPending))
	w.el(3, "remapped_row_failure", yesNo(gf.remapFailure))
	w.open(3, "row_remapper_histogram")
	w.elInt(4, "row_remapper_histogram_max", uint64(m.RemapBanks)-high-none, " bank(s)")
	w.elInt(4, "row_remapper_histogram_high", high, " bank(s)")
	w.el(4, "row_remapper_histogram_partial", "0 bank(s)")
	w.el(4, "row_remapper_histogram_low", "0 bank(s)")
	w.elInt(4, "row_remapper_histogram_none", none, " bank(s)")
	w.close(3, "row_remapper_histogram")
	w.close(2, "remapped_rows")

	temp := float64(info.idleTempC)
	memTemp := float64(info.memTempC)
	power := info.idlePowerW
	clock := m.IdleClockMHz
	switch {
	case hot:
		temp, memTemp = gf.hotC, gf.hotC-6
		power = m.PowerLimitW * 0.92
		clock = m.MaxClockMHz * 2 / 3
	case f.v.burning:
		// A stress load: warm, at full power and clocks, below slowdown.
		temp, memTemp = m.SlowdownC-12, m.SlowdownC-8
		power = m.PowerLimitW * 0.97
		clock = m.MaxClockMHz
	}
	w.open(2, "temperature")
	w.el(3, "gpu_temp", cTemp(temp))
	if m.TLimit {
		w.el(3, "gpu_temp_tlimit", cTemp(m.MaxOperatingC-temp))
		w.el(3, "gpu_temp_max_tlimit_threshold", cTemp(m.MaxOperatingC-m.ShutdownC))
		w.el(3, "gpu_temp_slow_tlimit_threshold", cTemp(m.MaxOperatingC-m.SlowdownC))
		w.el(3, "gpu_temp_max_gpu_tlimit_threshold", "0 C")
		w.el(3, "gpu_target_temperature", "N/A")
		w.el(3, "memory_temp", cTemp(memTemp))
		w.el(3, "gpu_temp_max_mem_tlimit_threshold", "0 C")
	} else {
		w.el(3, "gpu_temp_tlimit", "N/A")
		w.el(3, "gpu_temp_max_threshold", cTemp(m.ShutdownC))
		w.el(3, "gpu_temp_slow_threshold", cTemp(m.SlowdownC))
		w.el(3, "gpu_temp_max_gpu_threshold", cTemp(m.MaxOperatingC))
		w.el(3, "gpu_target_temperature", "N/A")
		w.el(3, "memory_temp", cTemp(memTemp))
		w.el(3, "gpu_temp_max_mem_threshold", cTemp(m.MaxMemC))
	}
	w.close(2, "temperature")
	w.open(2, "supported_gpu_target_temp")
	w.el(3, "gpu_target_temp_min", "N/A")
	w.el(3, "gpu_target_temp_max", "N/A")
	w.close(2, "supported_gpu_target_temp")
	w.open(2, "gpu_power_readings")
	w.el(3, "power_state", "P0")
	w.el(3, "power_draw", watts(power))
	limit := watts(m.PowerLimitW)
	w.el(3, "current_power_limit", limit)
	w.el(3, "requested_power_limit", limit)
	w.el(3, "default_power_limit", limit)
	w.el(3, "min_power_limit", watts(m.MinPowerW))
	w.el(3, "max_power_limit", limit)
	w.close(2, "gpu_power_readings")
	w.open(2, "module_power_readings")
	w.el(3, "power_state", "P0")
	for _, s := range [6]string{"power_draw", "current_power_limit", "requested_power_limit", "default_power_limit", "min_power_limit", "max_power_limit"} {
		w.el(3, s, "N/A")
	}
	w.close(2, "module_power_readings")
	w.open(2, "clocks")
	w.elInt(3, "graphics_clock", uint64(clock), " MHz")
	w.elInt(3, "sm_clock", uint64(clock), " MHz")
	w.elInt(3, "mem_clock", uint64(m.MemClockMHz), " MHz")
	w.elInt(3, "video_clock", uint64(m.VideoMHz), " MHz")
	w.close(2, "clocks")
	for _, s := range [2]string{"applications_clocks", "default_applications_clocks"} {
		w.open(2, s)
		w.elInt(3, "graphics_clock", uint64(m.MaxClockMHz), " MHz")
		w.elInt(3, "mem_clock", uint64(m.MemClockMHz), " MHz")
		w.close(2, s)
	}
	w.open(2, "deferred_clocks")
	w.el(3, "mem_clock", "N/A")
	w.close(2, "deferred_clocks")
	w.open(2, "max_clocks")
	w.elInt(3, "graphics_clock", uint64(m.MaxClockMHz), " MHz")
	w.elInt(3, "sm_clock", uint64(m.MaxClockMHz), " MHz")
	w.elInt(3, "mem_clock", uint64(m.MemClockMHz), " MHz")
	w.elInt(3, "video_clock", uint64(m.MaxVideoMHz), " MHz")
	w.close(2, "max_clocks")
	w.open(2, "max_customer_boost_clocks")
	w.elInt(3, "graphics_clock", uint64(m.MaxClockMHz), " MHz")
	w.close(2, "max_customer_boost_clocks")
	w.open(2, "clock_policy")
	w.el(3, "auto_boost", "N/A")
	w.el(3, "auto_boost_default", "N/A")
	w.close(2, "clock_policy")
	w.open(2, "voltage")
	w.el(3, "graphics_volt", strconv.FormatFloat(m.VoltageMV, 'f', 3, 64)+" mV")
	w.close(2, "voltage")
	w.open(2, "fabric")
	switch {
	case !m.Fabric:
		w.el(3, "state", "N/A")
		w.el(3, "status", "N/A")
	case f.v.fabricNotReady:
		w.el(3, "state", "In Progress")
		w.el(3, "status", "N/A")
	default:
		w.el(3, "state", "Completed")
		w.el(3, "status", "Success")
	}
	w.close(2, "fabric")
	w.open(2, "processes")
	if p := gf.ghost; p != nil {
		pid := p.PID
		if pid == 0 {
			pid = info.ghostPID
		}
		name := p.Name
		if name == "" {
			name = "python3"
		}
		w.open(3, "process_info")
		w.el(4, "gpu_instance_id", "N/A")
		w.el(4, "compute_instance_id", "N/A")
		w.elInt(4, "pid", uint64(pid), "")
		w.el(4, "type", "C")
		w.el(4, "process_name", name)
		w.elInt(4, "used_memory", p.MiB, " MiB")
		w.close(3, "process_info")
	}
	w.close(2, "processes")
	w.open(2, "accounted_processes")
	w.close(2, "accounted_processes")
	w.close(1, "gpu")
}

// gpuWidth is the GPU's current PCIe link width.
func (n *Node) gpuWidth(i int, v *view) int {
	if w := v.gpus[i].width; w > 0 {
		return w
	}
	return n.spec.GPUs[i].Model.PCIeWidth
}

func cTemp(c float64) string { return strconv.FormatFloat(c, 'f', 0, 64) + " C" }

func watts(w float64) string { return strconv.FormatFloat(w, 'f', 2, 64) + " W" }

// handleErrors is what nvidia-smi prints, before the document, for each GPU
// it cannot get a handle for; nil when it can talk to all of them.
func (n *Node) handleErrors(f frame) []byte {
	var b []byte
	for i := range f.v.gpus {
		if f.v.gpus[i].unreachable {
			b = append(b, "Unable to determine the device handle for GPU"+strings.ToUpper(n.spec.GPUs[i].BusID)+": Unknown Error\n"...)
		}
	}
	return b
}
