// Package nvsmi parses `nvidia-smi -q -x` output into a snapshot.GPUState.
//
// nvidia-smi's XML is not promised to stay compatible, so the parser reads
// only the elements it knows, ignores the rest, and accepts the schema
// generations seen in the field (v11 and older: clocks_throttle_reasons,
// single/double-bit ECC, power_readings; v12: clocks_event_reasons, SRAM/DRAM
// ECC; v13: average/instant power draw). A value printed as "N/A",
// "[Not Supported]" or left out becomes a nil pointer: unknown is not zero and
// never an error. Only input that is not an nvidia-smi XML document is an
// error.
package nvsmi

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Parse reads one `nvidia-smi -q -x` document. GPUs keep the file's order,
// which is nvidia-smi's (PCI bus) order, and take their index from it.
//
// A GPU nvidia-smi cannot talk to is not an element but a line of text,
// before or instead of the document ("Unable to determine the device
// handle for GPU0000:9B:00.0: Unknown Error"); a <gpu> element whose
// identity reads "Unknown Error" is the same GPU seen another way. Both
// become GPUState.Unreachable entries, and a capture holding nothing else
// is still a valid (empty) GPU state.
func Parse(data []byte) (*snapshot.GPUState, error) {
	data, lost := splitHandleErrors(data)
	if len(lost) > 0 && len(bytes.TrimSpace(data)) == 0 {
		return &snapshot.GPUState{Unreachable: lost}, nil
	}
	st, err := parseDocument(data)
	if err != nil {
		return nil, err
	}
	st.Unreachable = append(lost, st.Unreachable...)
	return st, nil
}

func parseDocument(data []byte) (*snapshot.GPUState, error) {
	d, err := parseTree(string(data))
	if err == nil && d.nodes[0].name != "nvidia_smi_log" {
		err = fmt.Errorf("%w: root element is <%s>, not <nvidia_smi_log>", errSyntax, d.nodes[0].name)
	}
	if err != nil {
		// nvidia-smi prints its failures ("NVIDIA-SMI has failed because it
		// couldn't communicate with the NVIDIA driver") as plain text: show it.
		if head := firstLine(data); head != "" && head[0] != '<' {
			return nil, fmt.Errorf("parse nvidia-smi xml: not XML, starts %q: %w", head, err)
		}
		return nil, fmt.Errorf("parse nvidia-smi xml: %w", err)
	}
	const root = 0
	st := &snapshot.GPUState{
		DriverVersion: text(d.get(root, "driver_version")),
		CUDAVersion:   text(d.get(root, "cuda_version")),
	}
	if n, ok := parseUint(d.get(root, "attached_gpus")); ok && n <= 1<<16 {
		st.AttachedGPUs = int(n)
	}
	pos := 0
	for c := d.nodes[root].first; c != none; c = d.nodes[c].next {
		if d.nodes[c].name != "gpu" {
			continue
		}
		if why, lost := unknownIdentity(d, c); lost {
			st.Unreachable = append(st.Unreachable, snapshot.UnreachableGPU{
				PCIBusID: snapshot.NormalizeBusID(firstText(d.get(c, "pci/pci_bus_id"), d.nodes[c].id)), Index: pos, Error: why})
		} else {
			st.GPUs = append(st.GPUs, convertGPU(d, c, pos))
		}
		pos++
	}
	return st, nil
}

// unknownIdentity reports a <gpu> element nvidia-smi printed without being
// able to query the GPU: its name and UUID both read "Unknown Error" (or
// another error word), not a value.
func unknownIdentity(d *document, n int32) (string, bool) {
	name := strings.Trim(strings.TrimSpace(d.get(n, "product_name")), "[]")
	uuid := strings.Trim(strings.TrimSpace(d.get(n, "uuid")), "[]")
	if name == uuid && (name == "Unknown Error" || name == "GPU is lost") {
		return name, true
	}
	return "", false
}

// handleErrorPrefixes are how nvidia-smi says it cannot talk to one GPU;
// the bus id follows, with or without a space ("GPU0000:9B:00.0",
// "GPU 0000:0B:00.0"), then ": " and the NVML error.
var handleErrorPrefixes = []string{
	"Unable to determine the device handle for GPU",
	"Unable to detect the device handle for GPU",
}

// splitHandleErrors takes nvidia-smi's per-GPU handle errors out of data.
func splitHandleErrors(data []byte) ([]byte, []snapshot.UnreachableGPU) {
	if !bytes.Contains(data, []byte("device handle for GPU")) {
		return data, nil
	}
	var lost []snapshot.UnreachableGPU
	var rest []byte
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i+1], data[i+1:]
		} else {
			data = nil
		}
		if g, ok := handleError(string(bytes.TrimSpace(line))); ok {
			lost = append(lost, g)
			continue
		}
		rest = append(rest, line...)
	}
	return rest, lost
}

func handleError(line string) (snapshot.UnreachableGPU, bool) {
	for _, p := range handleErrorPrefixes {
		tail, ok := strings.CutPrefix(line, p)
		if !ok {
			continue
		}
		tail = strings.TrimSpace(tail)
		// The bus id holds colons but no ": ": the error follows the first.
		bus, why, ok := strings.Cut(tail, ": ")
		if !ok || !looksLikeBusID(bus) {
			return snapshot.UnreachableGPU{}, false
		}
		return snapshot.UnreachableGPU{PCIBusID: snapshot.NormalizeBusID(bus), Index: -1, Error: strings.TrimSpace(why)}, true
	}
	return snapshot.UnreachableGPU{}, false
}

// looksLikeBusID accepts "0000:9B:00.0" and "00000000:9B:00.0".
func looksLikeBusID(s string) bool {
	if len(s) < 7 || len(s) > 16 || strings.Count(s, ":") != 2 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == ':' || c == '.') {
			return false
		}
	}
	return true
}

func convertGPU(d *document, n int32, index int) snapshot.GPU {
	get := func(path string) string { return d.get(n, path) }
	g := snapshot.GPU{
		Index:          index,
		Name:           text(get("product_name")),
		Architecture:   text(get("product_architecture")),
		UUID:           text(get("uuid")),
		Serial:         text(get("serial")),
		VBIOS:          text(get("vbios_version")),
		MemoryTotalMiB: mebibytes(get("fb_memory_usage/total")),
		MemoryUsedMiB:  mebibytes(get("fb_memory_usage/used")),

		PersistenceMode: parseBool(get("persistence_mode")),
		ECCEnabled:      parseBool(get("ecc_mode/current_ecc")),
		ECCPending:      parseBool(get("ecc_mode/pending_ecc")),
		MIGEnabled:      parseBool(get("mig_mode/current_mig")),
		ComputeMode:     text(get("compute_mode")),

		RetiredPages:   retiredPages(d, d.child(n, "retired_pages")),
		RemappedRows:   remappedRows(d, d.child(n, "remapped_rows")),
		ResetRequired:  parseBool(get("gpu_reset_status/reset_required")),
		DrainAndReset:  parseBool(get("gpu_reset_status/drain_and_reset_recommended")),
		RecoveryAction: text(get("gpu_recovery_action")),

		// Only the absolute thresholds: the *_tlimit_* forms are offsets
		// from the T.Limit and can be negative.
		TemperatureC:   floatPtr(get("temperature/gpu_temp")),
		MemoryTempC:    floatPtr(get("temperature/memory_temp")),
		SlowdownTempC:  floatPtr(get("temperature/gpu_temp_slow_threshold")),
		ShutdownTempC:  floatPtr(get("temperature/gpu_temp_max_threshold")),
		MaxOperatingC:  firstFloat(get("temperature/gpu_temp_max_gpu_threshold"), get("temperature/gpu_target_temperature")),
		UtilizationPct: floatPtr(get("utilization/gpu_util")),
		SMClockMHz:     floatPtr(get("clocks/sm_clock")),
		MaxSMClockMHz:  floatPtr(get("max_clocks/sm_clock")),
		ClockEvents:    clockEvents(d, d.child(n, "clocks_event_reasons"), d.child(n, "clocks_throttle_reasons")),

		PCIe: snapshot.PCIeLink{
			GenCurrent:    smallInt(get("pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
			GenMax:        smallInt(get("pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
			WidthCurrent:  smallInt(get("pci/pci_gpu_link_info/link_widths/current_link_width")),
			WidthMax:      smallInt(get("pci/pci_gpu_link_info/link_widths/max_link_width")),
			ReplayCounter: uintPtr(get("pci/replay_counter")),
		},
		Fabric:    fabric(d, d.child(n, "fabric")),
		Processes: processes(d, d.child(n, "processes")),
	}

	if bus := firstText(get("pci/pci_bus_id"), d.nodes[n].id); bus != "" {
		g.PCIBusID = snapshot.NormalizeBusID(bus)
	}

	// v12+ drivers put power under gpu_power_readings, older ones under
	// power_readings; v13 splits the draw into average and instant.
	for _, p := range []int32{d.child(n, "gpu_power_readings"), d.child(n, "power_readings")} {
		if g.PowerDrawW == nil {
			g.PowerDrawW = firstFloat(d.get(p, "power_draw"), d.get(p, "average_power_draw"), d.get(p, "instant_power_draw"))
		}
		if g.PowerLimitW == nil {
			g.PowerLimitW = firstFloat(d.get(p, "current_power_limit"), d.get(p, "enforced_power_limit"), d.get(p, "power_limit"))
		}
	}

	ecc := d.child(n, "ecc_errors")
	g.ECC.Volatile = eccCounts(d, d.child(ecc, "volatile"))
	g.ECC.Aggregate = eccCounts(d, d.child(ecc, "aggregate"))
	g.ECC.SRAMThresholdExceeded = parseBool(d.get(ecc, "aggregate/sram_threshold_exceeded"))
	return g
}

// clockEvents merges the reason lists under either element name and strips
// the generation-specific prefix, so "clocks_throttle_reason_hw_slowdown" and
// "clocks_event_reason_hw_slowdown" both become "hw_slowdown".
func clockEvents(d *document, lists ...int32) map[string]bool {
	var m map[string]bool
	for _, l := range lists {
		if l == none {
			continue
		}
		for c := d.nodes[l].first; c != none; c = d.nodes[c].next {
			name := d.nodes[c].name
			switch {
			case strings.HasPrefix(name, "clocks_event_reason_"):
				name = name[len("clocks_event_reason_"):]
			case strings.HasPrefix(name, "clocks_throttle_reason_"):
				name = name[len("clocks_throttle_reason_"):]
			}
			b := parseBool(d.nodes[c].text)
			if b == nil || name == "" {
				continue
			}
			if m == nil {
				m = make(map[string]bool, 12)
			}
			m[strings.Clone(name)] = *b
		}
	}
	return m
}

// eccCounts keeps every numeric counter in Detail and sums the totals from
// whichever schema is present. SRAM uncorrectable is either one counter or,
// on newer drivers, split into parity and SEC-DED: take the split when it is
// there so nothing is counted twice.
func eccCounts(d *document, set int32) snapshot.ECCCounts {
	var c snapshot.ECCCounts
	if set == none {
		return c
	}
	for it := d.nodes[set].first; it != none; it = d.nodes[it].next {
		name := d.nodes[it].name
		if first := d.nodes[it].first; first != none {
			for ch := first; ch != none; ch = d.nodes[ch].next {
				if v, ok := parseUint(d.nodes[ch].text); ok {
					c.Detail = put(c.Detail, name+"."+d.nodes[ch].name, v)
				}
			}
			continue
		}
		if v, ok := parseUint(d.nodes[it].text); ok {
			c.Detail = put(c.Detail, strings.Clone(name), v)
		}
	}
	if c.Detail == nil {
		return c
	}
	m := c.Detail
	if _, split := anyOf(m, "sram_uncorrectable_parity", "sram_uncorrectable_secded"); split {
		c.Uncorrectable = sumOf(m, "sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable")
	} else {
		c.Uncorrectable = sumOf(m, "sram_uncorrectable", "dram_uncorrectable")
	}
	c.Correctable = sumOf(m, "sram_correctable", "dram_correctable")
	if c.Uncorrectable == nil {
		c.Uncorrectable = bitTotal(m, "double_bit")
	}
	if c.Correctable == nil {
		c.Correctable = bitTotal(m, "single_bit")
	}
	return c
}

// bitTotal reads the old schema's <total>, or sums its parts when the total
// is N/A.
func bitTotal(d map[string]uint64, group string) *uint64 {
	if v, ok := d[group+".total"]; ok {
		return &v
	}
	var sum uint64
	found := false
	prefix := group + "."
	for k, v := range d {
		if strings.HasPrefix(k, prefix) {
			sum = addSat(sum, v)
			found = true
		}
	}
	if !found {
		return nil
	}
	return &sum
}

func retiredPages(d *document, n int32) *snapshot.RetiredPages {
	if n == none {
		return nil
	}
	rp := snapshot.RetiredPages{
		SingleBit: uintPtr(d.get(n, "multiple_single_bit_retirement/retired_count")),
		DoubleBit: uintPtr(d.get(n, "double_bit_retirement/retired_count")),
		Pending:   parseBool(d.get(n, "pending_retirement")),
	}
	if rp.Pending == nil {
		rp.Pending = parseBool(d.get(n, "pending_blacklist"))
	}
	if rp.SingleBit == nil && rp.DoubleBit == nil && rp.Pending == nil {
		return nil
	}
	return &rp
}

// remappedRows is nil when the element is absent or the bare string "N/A"
// (A100 with MIG on), and when none of its values can be read.
func remappedRows(d *document, n int32) *snapshot.RemappedRows {
	if n == none {
		return nil
	}
	corr, okC := parseUint(d.get(n, "remapped_row_corr"))
	unc, okU := parseUint(d.get(n, "remapped_row_unc"))
	pending := parseBool(d.get(n, "remapped_row_pending"))
	failure := parseBool(d.get(n, "remapped_row_failure"))
	if !okC && !okU && pending == nil && failure == nil {
		return nil
	}
	rr := &snapshot.RemappedRows{Correctable: corr, Uncorrectable: unc}
	if pending != nil {
		rr.Pending = *pending
	}
	if failure != nil {
		rr.Failure = *failure
	}
	return rr
}

// fabric is nil when the GPU has no NVSwitch fabric: nvidia-smi then prints
// N/A (or Not Supported) for the state.
func fabric(d *document, n int32) *snapshot.Fabric {
	state := text(d.get(n, "state"))
	if state == "" {
		return nil
	}
	return &snapshot.Fabric{
		State:       state,
		Status:      text(d.get(n, "status")),
		CliqueID:    firstText(d.get(n, "cliqueId"), d.get(n, "clique_id")),
		ClusterUUID: firstText(d.get(n, "clusterUuid"), d.get(n, "cluster_uuid")),
	}
}

func processes(d *document, n int32) []snapshot.GPUProcess {
	var out []snapshot.GPUProcess
	for p := d.child(n, "process_info"); p != none; p = d.nodes[p].next {
		if d.nodes[p].name != "process_info" {
			continue
		}
		pid, ok := parseUint(d.get(p, "pid"))
		if !ok || pid > 1<<31 {
			pid = 0
		}
		out = append(out, snapshot.GPUProcess{
			PID:           int(pid),
			Name:          text(d.get(p, "process_name")),
			Type:          text(d.get(p, "type")),
			UsedMemoryMiB: mebibytes(d.get(p, "used_memory")),
		})
	}
	return out
}

// --- value parsing ---

// text trims a value and maps nvidia-smi's "no value" spellings to "". The
// result is a copy: a substring would keep the whole document alive for as
// long as the snapshot lives.
func text(s string) string {
	s = strings.TrimSpace(s)
	switch s {
	case "N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error", "[Unknown Error]":
		return ""
	}
	return strings.Clone(s)
}

func firstText(vals ...string) string {
	for _, v := range vals {
		if t := text(v); t != "" {
			return t
		}
	}
	return ""
}

// parseBool reads the three yes/no vocabularies nvidia-smi uses.
func parseBool(s string) *bool {
	var v bool
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "enabled", "yes", "active", "true":
		v = true
	case "disabled", "no", "not active", "false":
		v = false
	default:
		return nil
	}
	return &v
}

// number splits "67.74 W", "16x" or "-8 C" into the number and its unit.
// Only plain decimal notation is accepted, so "NaN" and "Inf" never pass.
func number(s string) (float64, string, bool) {
	s = strings.TrimSpace(s)
	end := 0
	if end < len(s) && (s[end] == '-' || s[end] == '+') {
		end++
	}
	digits := 0
	for end < len(s) && (s[end] >= '0' && s[end] <= '9' || s[end] == '.') {
		if s[end] != '.' {
			digits++
		}
		end++
	}
	if digits == 0 {
		return 0, "", false
	}
	v, err := strconv.ParseFloat(s[:end], 64)
	if err != nil {
		return 0, "", false
	}
	return v, strings.TrimSpace(s[end:]), true
}

func floatPtr(s string) *float64 {
	v, _, ok := number(s)
	if !ok {
		return nil
	}
	return &v
}

func firstFloat(vals ...string) *float64 {
	for _, s := range vals {
		if p := floatPtr(s); p != nil {
			return p
		}
	}
	return nil
}

// parseUint reads a counter; it must be a whole non-negative number.
func parseUint(s string) (uint64, bool) {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, ' '); i >= 0 {
		s = s[:i]
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

func uintPtr(s string) *uint64 {
	v, ok := parseUint(s)
	if !ok {
		return nil
	}
	return &v
}

// smallInt reads link generations and widths ("5", "16x"); 0 when unknown.
func smallInt(s string) int {
	v, _, ok := number(s)
	if !ok || v < 0 || v > 1024 || v != float64(int(v)) {
		return 0
	}
	return int(v)
}

// mebibytes reads "81559 MiB"; other binary units are converted.
func mebibytes(s string) *uint64 {
	v, unit, ok := number(s)
	if !ok || v < 0 {
		return nil
	}
	switch unit {
	case "MiB", "MB", "":
	case "GiB", "GB":
		v *= 1024
	case "KiB", "KB":
		v /= 1024
	default:
		return nil
	}
	if v >= 1<<53 {
		return nil
	}
	u := uint64(v)
	return &u
}

func put(m map[string]uint64, k string, v uint64) map[string]uint64 {
	if m == nil {
		m = make(map[string]uint64, 8)
	}
	m[k] = v
	return m
}

func anyOf(m map[string]uint64, keys ...string) (uint64, bool) {
	for _, k := range keys {
		if v, ok := m[k]; ok {
			return v, true
		}
	}
	return 0, false
}

// sumOf adds the keys present; nil when none is.
func sumOf(m map[string]uint64, keys ...string) *uint64 {
	var sum uint64
	found := false
	for _, k := range keys {
		if v, ok := m[k]; ok {
			sum = addSat(sum, v)
			found = true
		}
	}
	if !found {
		return nil
	}
	return &sum
}

// addSat adds without wrapping: a corrupt counter must not sum to a small number.
func addSat(a, b uint64) uint64 {
	if a+b < a {
		return ^uint64(0)
	}
	return a + b
}

func firstLine(data []byte) string {
	data = bytes.TrimSpace(data)
	if i := bytes.IndexByte(data, '\n'); i >= 0 {
		data = data[:i]
	}
	if len(data) > 120 {
		data = data[:120]
	}
	return strings.TrimSpace(string(data))
}
