package gpu

import (
	"fmt"
	"sort"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Inventory is gpu.inventory: the GPUs the driver shows against the count
// and model expected and against the NVIDIA GPUs on the PCI bus. A GPU that
// fell off the bus is still a PCI function but no longer a driver GPU; a
// driver that hangs while GPUs sit on the bus is a fault, not "no data".
//
// It reads both sources itself (Needs is nil): a failed or missing
// nvidia-smi means something different depending on what the PCI bus holds.
// GPUs bound to another driver (vfio-pci for pass-through) are not expected
// to show in nvidia-smi and are left out of the comparison.
//
// GPUs are expected when expect.gpu_count says so, or the node's labels do
// (nvidia.com/gpu.count=N, a baseline-sku with xN, a sku naming a GPU
// model such as sku=h100), or the PCI bus holds NVIDIA GPUs. A node that is
// expected to have GPUs and shows none fails, whatever else skipped: a
// node with nothing measured is not healthy (docs/design.md "Statuses"). It
// skips only when nothing suggests GPUs.
//
// A GPU nvidia-smi names but cannot talk to ("Unable to determine the
// device handle for GPU0000:9B:00.0: Unknown Error") fails GPU_UNREACHABLE
// with its PCI bus id and action reboot (a GPU that fell off the bus comes
// back only with a node reboot; if it does not, reseat or replace it). The
// other GPUs are still judged by every check.
//
// Metrics: gpu.count (GPUs the driver shows: 0 when there is no driver
// view, left out only when the driver failed) and gpu.unreachable_count.
type Inventory struct{}

// Name implements checks.Check.
func (Inventory) Name() string { return "gpu.inventory" }

// Needs implements checks.Check: nil, the check judges missing sources itself.
func (Inventory) Needs() []snapshot.Source { return nil }

// Disruptive implements checks.Check.
func (Inventory) Disruptive() bool { return false }

// Run implements checks.Check.
func (Inventory) Run(in checks.Input) checks.Result {
	if in.Snap == nil {
		return checks.Errorf("no snapshot")
	}
	cfg := conf(in)
	exp := expectedGPUs(in)
	want := exp.count
	src := in.Snap.Source(snapshot.SrcNvidiaSMI)
	onBus, pciKnown := busGPUs(in.Snap)

	switch {
	case src.State == snapshot.StateFailed || src.State == snapshot.StateTimeout:
		why := sourceReason(src)
		res := checks.Result{Status: report.Pass}
		switch {
		case len(onBus) > 0:
			res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
				Code: CodeDriverNotResponding, Action: report.ActionReboot,
				Message: fmt.Sprintf("the driver is not answering (%s: %s) while the PCI bus holds %d NVIDIA GPU(s)",
					snapshot.SrcNvidiaSMI, why, len(onBus))})
			return res
		case exp.some:
			res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
				Code: CodeDriverNotResponding, Action: report.ActionReboot,
				Message: fmt.Sprintf("the driver is not answering (%s: %s); expected %s", snapshot.SrcNvidiaSMI, why, exp)})
			return res
		}
		return checks.Errorf("%s: %s", snapshot.SrcNvidiaSMI, why)

	case src.State != snapshot.StateOK:
		why := src.Error
		if why == "" {
			why = "no " + string(snapshot.SrcNvidiaSMI)
		}
		res := checks.Result{Status: report.Pass}
		res.Metric("gpu.count", 0)
		switch {
		case len(onBus) > 0:
			res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
				Code: CodeDriverMissing, Action: report.ActionDrain,
				Message: fmt.Sprintf("the PCI bus holds %d NVIDIA GPU(s) but there is no driver view of them (%s)", len(onBus), why)})
			return res
		case exp.some:
			bus := "no NVIDIA GPU on the PCI bus"
			if !pciKnown {
				bus = "the PCI bus was not read"
			}
			res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
				Code: CodeGPUCountLow, Action: report.ActionDrain,
				Message: fmt.Sprintf("expected %s, found none: %s and %s", exp, why, bus)})
			return res
		}
		res.Status, res.Reason = report.Skip, why
		return res
	}

	if in.Snap.GPU == nil {
		return checks.Errorf("no GPU state in the snapshot although %s is ok", snapshot.SrcNvidiaSMI)
	}
	st := in.Snap.GPU
	res := checks.Result{Status: report.Pass}
	res.Metric("gpu.count", float64(len(st.GPUs)))
	res.Metric("gpu.unreachable_count", float64(len(st.Unreachable)))
	if len(st.GPUs) == 0 && len(st.Unreachable) == 0 && len(onBus) == 0 && !exp.some {
		res.Status, res.Reason = report.Skip, "the driver reports no GPUs and none is on the PCI bus or expected"
		return res
	}

	lost := withBusIDs(st, onBus)
	unreachable(&res, lost)
	switch n := len(st.GPUs); {
	case want > 0 && n < want:
		res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
			Code: CodeGPUCountLow, Action: report.ActionReseat,
			Message: fmt.Sprintf("the driver shows %d GPU(s), expected %s", n, exp)})
	case want > 0 && n > want:
		res.Add(report.Finding{Severity: report.SevWarn, Component: checks.NodeComponent,
			Code: CodeGPUCountHigh, Action: report.ActionNone,
			Message: fmt.Sprintf("the driver shows %d GPU(s), expected %s: is the expectation right for this node?", n, exp)})
	case n == 0 && exp.some && len(st.Unreachable) == 0:
		res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
			Code: CodeGPUCountLow, Action: report.ActionReseat,
			Message: fmt.Sprintf("the driver shows no GPU, expected %s", exp)})
	}

	missingFromDriver(&res, st.GPUs, lost, onBus)
	models(&res, st.GPUs, cfg.Expect.GPUModel)

	if len(st.Errors) > 0 {
		shown := st.Errors
		if len(shown) > 3 {
			shown = shown[:3]
		}
		res.Add(report.Finding{Severity: report.SevWarn, Component: checks.NodeComponent,
			Code: CodeGPUQueryErrors, Action: report.ActionMonitor,
			Message: fmt.Sprintf("%d GPU queries failed: %s", len(st.Errors), strings.Join(shown, "; "))})
	}
	return res
}

func orUnknownBus(u snapshot.UnreachableGPU) string {
	if u.PCIBusID != "" {
		return u.PCIBusID
	}
	return fmt.Sprintf("%d (bus id unknown)", u.Index)
}

// withBusIDs returns the unreachable GPUs, giving those without a bus id
// (NVML could not get a handle, so it could not ask) the NVIDIA GPUs on the
// PCI bus that no listed GPU holds, when there are exactly as many: both
// are in PCI bus order.
func withBusIDs(st *snapshot.GPUState, onBus []string) []snapshot.UnreachableGPU {
	lost := append([]snapshot.UnreachableGPU(nil), st.Unreachable...)
	var noBus []int
	taken := map[string]bool{}
	for i, u := range lost {
		if u.PCIBusID == "" {
			noBus = append(noBus, i)
		} else {
			taken[snapshot.NormalizeBusID(u.PCIBusID)] = true
		}
	}
	if len(noBus) == 0 {
		return lost
	}
	for _, g := range st.GPUs {
		if g.PCIBusID == "" {
			return lost // the lists cannot be matched
		}
		taken[snapshot.NormalizeBusID(g.PCIBusID)] = true
	}
	var free []string
	for _, a := range onBus {
		if !taken[a] {
			free = append(free, a)
		}
	}
	if len(free) == len(noBus) {
		for k, i := range noBus {
			lost[i].PCIBusID = free[k]
		}
	}
	return lost
}

// unreachable fails each GPU nvidia-smi could not talk to.
func unreachable(res *checks.Result, lost []snapshot.UnreachableGPU) {
	for _, u := range lost {
		comp := checks.NodeComponent
		if u.Index >= 0 {
			comp = checks.GPUComponent(u.Index)
		}
		why := u.Error
		if why == "" {
			why = "no answer"
		}
		res.Add(report.Finding{Severity: report.SevFail, Component: comp, PCIBusID: u.PCIBusID,
			Code: CodeGPUUnreachable, Action: report.ActionReboot,
			Message: fmt.Sprintf("the driver cannot talk to GPU %s (%s): reboot the node; reseat or replace the GPU if it stays unreachable", orUnknownBus(u), why)})
	}
}

// missingFromDriver reports NVIDIA GPUs on the PCI bus that the driver does
// not list. When the driver gives no bus id for some GPU the lists cannot be
// matched one to one, so only the counts are compared.
func missingFromDriver(res *checks.Result, gpus []snapshot.GPU, lost []snapshot.UnreachableGPU, onBus []string) {
	if len(onBus) == 0 {
		return
	}
	known := make(map[string]bool, len(gpus)+len(lost))
	// An unreachable GPU has its own finding.
	for _, u := range lost {
		if u.PCIBusID != "" {
			known[snapshot.NormalizeBusID(u.PCIBusID)] = true
		}
	}
	matchable := true
	for _, g := range gpus {
		if g.PCIBusID == "" {
			matchable = false
		}
		known[snapshot.NormalizeBusID(g.PCIBusID)] = true
	}
	if !matchable {
		if len(onBus) > len(gpus)+len(lost) {
			res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
				Code: CodeGPUMissingFromDriver, Action: report.ActionReseat,
				Message: fmt.Sprintf("the PCI bus holds %d NVIDIA GPU(s), the driver shows %d", len(onBus), len(gpus))})
		}
		return
	}
	for _, addr := range onBus {
		if !known[addr] {
			res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent, PCIBusID: addr,
				Code: CodeGPUMissingFromDriver, Action: report.ActionReseat,
				Message: fmt.Sprintf("NVIDIA GPU %s is on the PCI bus but the driver does not show it (fallen off the bus?)", addr)})
		}
	}
}

// models checks the expected model and warns about a mix of models.
func models(res *checks.Result, gpus []snapshot.GPU, want string) {
	names := map[string]int{}
	for _, g := range gpus {
		if g.Name != "" {
			names[g.Name]++
		}
		if want == "" {
			continue
		}
		switch {
		case g.Name == "":
			res.Add(finding(g, report.SevWarn, CodeGPUModelMismatch, report.ActionMonitor,
				"the driver does not report the model; expected %q", want))
		case !strings.Contains(strings.ToLower(g.Name), strings.ToLower(want)):
			res.Add(finding(g, report.SevFail, CodeGPUModelMismatch, report.ActionDrain,
				"model %q, expected %q", g.Name, want))
		}
	}
	if len(names) > 1 {
		list := make([]string, 0, len(names))
		for n, c := range names {
			list = append(list, fmt.Sprintf("%d× %s", c, n))
		}
		sort.Strings(list)
		res.Add(report.Finding{Severity: report.SevWarn, Component: checks.NodeComponent,
			Code: CodeGPUModelMixed, Action: report.ActionMonitor,
			Message: "GPU models differ on one node: " + strings.Join(list, ", ")})
	}
}

// busGPUs lists the normalized addresses of NVIDIA GPUs on the PCI bus that
// the nvidia driver should own; known is false when the bus was not read.
func busGPUs(s *snapshot.Snapshot) (addrs []string, known bool) {
	known = s.Source(snapshot.SrcPCI).State == snapshot.StateOK || len(s.PCI) > 0
	for _, d := range s.PCI {
		if !d.IsNVIDIAGPU() {
			continue
		}
		// Bound elsewhere (vfio-pci for a VM): the driver is not meant to see it.
		if d.Driver != "" && d.Driver != "nvidia" {
			continue
		}
		addrs = append(addrs, snapshot.NormalizeBusID(d.Address))
	}
	sort.Strings(addrs)
	return addrs, known
}

func sourceReason(st snapshot.SourceState) string {
	switch {
	case st.Error != "":
		return st.Error
	case st.State == snapshot.StateTimeout:
		return "timed out"
	}
	return fmt.Sprintf("failed (exit %d)", st.ExitCode)
}
