package gpu

import (
	"fmt"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Fabric is gpu.fabric: the NVSwitch fabric of HGX/DGX nodes, as the GPUs'
// fabric registration, the Fabric Manager version and the NVSwitch
// driver's SXid lines show it.
//
// A node is judged as an NVSwitch node when a GPU reports a fabric state
// (nil or "Not Supported" means none), when the kernel log holds SXid
// lines, or when expect.nvswitch is true; expect.nvswitch false, or none of
// these, skips with "no NVSwitch fabric".
//
//   - Fabric Manager must match the driver version exactly: a known pair
//     that differs fails FABRIC_MANAGER_MISMATCH (action drain: the node
//     needs the matching nvidia-fabricmanager before it takes work; a
//     mismatch leaves the fabric "In Progress" and CUDA fails with 802).
//   - A GPU whose fabric state is "In Progress" or "Not Started" fails
//     FABRIC_NOT_READY (action reboot, after making sure Fabric Manager
//     runs and matches); within the first 10 minutes after boot it only
//     warns, as Fabric Manager may still be training the fabric.
//   - "Completed" with a status other than Success fails FABRIC_FAILED
//     (action reboot); a state this check does not know warns.
//   - SXid lines in the kernel log (when that source is ok), within
//     xid.lookback, not before a driver load or boot, and new since the
//     previous run: "Fatal" ones fail SXID_FATAL (action reboot: the
//     NVSwitch needs a reset that only a reboot gives), others warn
//     SXID_NONFATAL (action monitor). One finding per switch and SXid.
//   - expect.nvswitch true with no GPU reporting a fabric state fails
//     FABRIC_MISSING, except on pre-Hopper GPUs, which never report it:
//     those are judged on Fabric Manager and SXids alone, and skip when
//     neither is known.
//
// Metrics: fabric.gpu_count, fabric.ready_gpu_count, sxid.event_count, sxid.fatal_event_count,
// sxid.new_event_count.
type Fabric struct{}

var _ checks.Check = Fabric{}

// Name is the check's fixed name.
func (Fabric) Name() string { return "gpu.fabric" }

// Needs nil: the check gates itself. Fabric state is per GPU and comes from
// nvidia-smi (or NVML), but SXid lines in the kernel log and the Fabric
// Manager version are judged without it: a node whose nvidia-smi is absent
// or failing may be the one whose NVSwitches are failing.
func (Fabric) Needs() []snapshot.Source { return nil }

// Disruptive is false: the check only reads the snapshot.
func (Fabric) Disruptive() bool { return false }

// fabricSettle is how long after boot Fabric Manager may still be
// registering GPUs.
const fabricSettle = 10 * time.Minute

type sxidKey struct {
	device string
	bus    string
	code   int
	fatal  bool
}

// Run judges the fabric.
func (Fabric) Run(in checks.Input) checks.Result {
	if in.Snap == nil {
		return checks.Errorf("no snapshot")
	}
	cfg := conf(in)
	snap := in.Snap
	expect := cfg.Expect.NVSwitch
	if expect != nil && !*expect {
		return checks.Skipf("no NVSwitch fabric (expect.nvswitch is false)")
	}
	gate, noGPUs := checks.SourceGate(snap, snapshot.SrcNvidiaSMI)
	if !noGPUs && snap.GPU == nil {
		return checks.Errorf("nvidia-smi: source is ok but holds no GPU data")
	}
	sx := collectSXids(in, cfg.Xid.Lookback.D(defaultLookback))
	if noGPUs {
		return sxidsOnly(in, gate, sx)
	}

	var fabricGPUs []snapshot.GPU
	preHopper := false
	for _, g := range snap.GPU.GPUs {
		if g.Fabric == nil || strings.EqualFold(g.Fabric.State, "Not Supported") || g.Fabric.State == "" {
			if isPreHopper(g) {
				preHopper = true
			}
			continue
		}
		fabricGPUs = append(fabricGPUs, g)
	}
	if len(fabricGPUs) == 0 && sx.total == 0 && expect == nil {
		return checks.Skipf("no NVSwitch fabric: no GPU reports a fabric state and the kernel log has no SXid")
	}

	res := checks.Result{Status: report.Pass}
	judged := false

	mismatch := false
	fm := versionCore(snap.Versions.FabricManager)
	drv := versionCore(snap.GPU.DriverVersion)
	if drv == "" {
		drv = versionCore(snap.Versions.Driver)
	}
	if fm != "" && drv != "" {
		judged = true
		if fm != drv {
			mismatch = true
			res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent, Code: CodeFMMismatch,
				Message: fmt.Sprintf("Fabric Manager %s does not match driver %s; they must match exactly (install nvidia-fabricmanager %s)",
					snap.Versions.FabricManager, drv, drv),
				Action: report.ActionDrain})
		}
	}

	if expect != nil && *expect && len(fabricGPUs) == 0 && !preHopper {
		res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent, Code: CodeFabricMissing,
			Message: "expect.nvswitch is true but no GPU reports an NVSwitch fabric state",
			Action:  report.ActionReboot})
		judged = true
	}

	ready := 0
	for _, g := range fabricGPUs {
		judged = true
		if f := fabricFinding(g, snap, fm, mismatch); f != nil {
			res.Add(*f)
			continue
		}
		ready++
	}
	res.Metric("fabric.gpu_count", float64(len(fabricGPUs)))
	res.Metric("fabric.ready_gpu_count", float64(ready))

	if sx.add(&res) {
		judged = true
	}

	if !judged {
		res.Status = report.Skip
		res.Reason = "pre-Hopper GPUs report no fabric state, and neither the Fabric Manager version nor SXid lines are known"
	}
	return res
}

// sxidsOnly judges a node whose GPU view is missing (gate says why) on its
// SXid lines and Fabric Manager version alone. Without SXids the gate's
// skip or error stands; with them the findings decide, and a failed
// nvidia-smi still makes the result at least an error.
func sxidsOnly(in checks.Input, gate checks.Result, sx sxids) checks.Result {
	if sx.total == 0 {
		return gate
	}
	res := checks.Result{Status: report.Pass}
	snap := in.Snap
	fm, drv := versionCore(snap.Versions.FabricManager), versionCore(snap.Versions.Driver)
	if fm != "" && drv != "" && fm != drv {
		res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent, Code: CodeFMMismatch,
			Message: fmt.Sprintf("Fabric Manager %s does not match driver %s; they must match exactly (install nvidia-fabricmanager %s)",
				snap.Versions.FabricManager, drv, drv),
			Action: report.ActionDrain})
	}
	sx.add(&res)
	res.Reason = "judged on SXid lines only: " + gate.Reason
	if gate.Status == report.Error {
		res.Status = report.Worse(res.Status, report.Error)
	}
	return res
}

// add puts the SXid findings and metrics into res; it reports whether
// there were any SXid lines to judge.
func (sx sxids) add(res *checks.Result) bool {
	for _, k := range sx.order {
		res.Add(sx.groups[k].finding(k))
	}
	res.Metric("sxid.event_count", float64(sx.total))
	res.Metric("sxid.fatal_event_count", float64(sx.fatal))
	res.Metric("sxid.new_event_count", float64(sx.fresh))
	return sx.total > 0
}

// fabricFinding judges one GPU's fabric registration; nil when it is ready.
func fabricFinding(g snapshot.GPU, snap *snapshot.Snapshot, fm string, mismatch bool) *report.Finding {
	f := g.Fabric
	comp := checks.GPUComponent(g.Index)
	bus := snapshot.NormalizeBusID(g.PCIBusID)
	switch strings.ToLower(strings.TrimSpace(f.State)) {
	case "completed":
		st := strings.TrimSpace(f.Status)
		if st == "" || strings.EqualFold(st, "Success") || strings.EqualFold(st, "N/A") {
			return nil
		}
		return &report.Finding{Severity: report.SevFail, Component: comp, PCIBusID: bus, Code: CodeFabricFailed,
			Message: fmt.Sprintf("fabric registration completed with status %q", st), Action: report.ActionReboot}
	case "in progress", "not started":
		msg := fmt.Sprintf("fabric state %q", f.State)
		switch {
		case mismatch:
			msg += ": Fabric Manager does not match the driver (see " + CodeFMMismatch + ")"
		case fm == "":
			msg += ": Fabric Manager version unknown; is nvidia-fabricmanager installed and running, at the driver's version?"
		default:
			msg += ": check that nvidia-fabricmanager " + fm + " is running"
		}
		if snap.Uptime > 0 && snap.Uptime < fabricSettle {
			return &report.Finding{Severity: report.SevWarn, Component: comp, PCIBusID: bus, Code: CodeFabricNotReady,
				Message: msg + fmt.Sprintf(" (node up %s: may still be registering)", snap.Uptime.Round(time.Second)),
				Action:  report.ActionMonitor}
		}
		return &report.Finding{Severity: report.SevFail, Component: comp, PCIBusID: bus, Code: CodeFabricNotReady,
			Message: msg, Action: report.ActionReboot}
	}
	return &report.Finding{Severity: report.SevWarn, Component: comp, PCIBusID: bus, Code: CodeFabricStateUnknown,
		Message: fmt.Sprintf("unknown fabric state %q (status %q)", f.State, f.Status), Action: report.ActionMonitor}
}

// isPreHopper reports GPUs that never report a fabric state even on
// NVSwitch systems (A100 and older).
func isPreHopper(g snapshot.GPU) bool {
	switch strings.ToLower(g.Architecture) {
	case "ampere", "volta", "turing", "pascal":
		return true
	case "":
		n := strings.ToUpper(g.Name)
		return strings.Contains(n, "A100") || strings.Contains(n, "A800") || strings.Contains(n, "V100")
	}
	return false
}

type sxidGroup struct {
	count int
	last  snapshot.KernelEvent
}

type sxids struct {
	total, fatal, fresh int
	groups              map[sxidKey]*sxidGroup
	order               []sxidKey
}

// collectSXids gathers the SXid events that count, grouped per switch and
// code. A per-GPU reset marker does not cover a switch; a driver load or
// boot (bus id empty) does.
func collectSXids(in checks.Input, lookback time.Duration) sxids {
	out := sxids{groups: map[sxidKey]*sxidGroup{}}
	snap := in.Snap
	if snap.Source(snapshot.SrcKernelLog).State != snapshot.StateOK || snap.Kernel == nil {
		return out
	}
	f := newEventFilter(in, lookback)
	// A per-GPU reset marker does not cover a switch: judge against the
	// node-wide ones only.
	nodeWide := make([]snapshot.KernelEvent, len(snap.Kernel.Events))
	for i, e := range snap.Kernel.Events {
		if e.Kind == snapshot.EventGPUReset && e.PCIBusID != "" {
			e.Kind = "" // not a marker here
		}
		if e.Kind == snapshot.EventSXid {
			e.PCIBusID = "" // a switch, not a GPU: only node-wide resets cover it
		}
		nodeWide[i] = e
	}
	f.resetAfter = resetsAfter(nodeWide)
	for i, e := range snap.Kernel.Events {
		if e.Kind != snapshot.EventSXid || f.skipReason(i, e) != "" {
			continue
		}
		out.total++
		if e.Fatal {
			out.fatal++
		}
		if !f.isNew(e) {
			continue
		}
		out.fresh++
		k := sxidKey{device: e.Device, bus: snapshot.NormalizeBusID(e.PCIBusID), code: e.Code, fatal: e.Fatal}
		g := out.groups[k]
		if g == nil {
			g = &sxidGroup{}
			out.groups[k] = g
			out.order = append(out.order, k)
		}
		g.count++
		g.last = e
	}
	return out
}

func (g *sxidGroup) finding(k sxidKey) report.Finding {
	dev := k.device
	if dev == "" {
		dev = "NVSwitch"
	}
	kind := "non-fatal"
	if k.fatal {
		kind = "fatal"
	}
	msg := fmt.Sprintf("%s SXid %d (%s) %s", dev, k.code, kind, times(g.count))
	if at := eventTime(g.last); at != "" {
		msg += ", last at " + at
	}
	if m := strings.TrimSpace(g.last.Message); m != "" {
		msg += ": " + clip(m)
	}
	f := report.Finding{Severity: report.SevWarn, Component: checks.NodeComponent, PCIBusID: k.bus,
		Code: CodeSXidNonFatal, Message: msg, Action: report.ActionMonitor}
	if k.fatal {
		f.Severity, f.Code, f.Action = report.SevFail, CodeSXidFatal, report.ActionReboot
		f.Message += "; reboot the node to reset the NVSwitch"
	}
	return f
}

// versionCore keeps the first dotted number of a version string, so package
// revisions ("535.129.03-1") and prefixes ("v535.129.03") compare equal to
// the driver's.
func versionCore(v string) string {
	if i := strings.IndexAny(v, "0123456789"); i >= 0 {
		v = v[i:]
	} else {
		return ""
	}
	end := 0
	for end < len(v) && (v[end] >= '0' && v[end] <= '9' || v[end] == '.') {
		end++
	}
	return strings.TrimRight(v[:end], ".")
}
