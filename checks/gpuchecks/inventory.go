package gpuchecks

import (
	"fmt"
	"sort"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/report"
	"github.com/fleetcheck/fleetcheck/snapshot"
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
	want := cfg.Expect.GPUCount
	src := in.Snap.Source(snapshot.SrcNvidiaSMI)
	onBus, pciKnown := busGPUs(in.Snap)

	switch {
	case src.State == snapshot.StateFailed || src.State == snapshot.StateTimeout:
		why := sourceReason(src)
		if len(onBus) > 0 {
			res := checks.Result{Status: report.Pass}
			res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
				Code: CodeDriverNotResponding, Action: report.ActionReboot,
				Message: fmt.Sprintf("the driver is not answering (%s: %s) while the PCI bus holds %d NVIDIA GPU(s)",
					snapshot.SrcNvidiaSMI, why, len(onBus))})
			return res
		}
		return checks.Errorf("%s: %s", snapshot.SrcNvidiaSMI, why)

	case src.State != snapshot.StateOK:
		why := src.Error
		if why == "" {
			why = "no " + string(snapshot.SrcNvidiaSMI)
		}
		res := checks.Result{Status: report.Pass}
		switch {
		case len(onBus) > 0:
			res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
				Code: CodeDriverMissing, Action: report.ActionDrain,
				Message: fmt.Sprintf("the PCI bus holds %d NVIDIA GPU(s) but there is no driver view of them (%s)", len(onBus), why)})
			return res
		case want > 0 && pciKnown:
			res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
				Code: CodeGPUCountLow, Action: report.ActionDrain,
				Message: fmt.Sprintf("expected %d GPU(s), found none: no NVIDIA GPU on the PCI bus and %s", want, why)})
			return res
		case want > 0:
			return checks.Errorf("expected %d GPU(s) but cannot count them: %s and no PCI scan", want, why)
		}
		return checks.Skipf("%s", why)
	}

	if in.Snap.GPU == nil {
		return checks.Errorf("no GPU state in the snapshot although %s is ok", snapshot.SrcNvidiaSMI)
	}
	st := in.Snap.GPU
	res := checks.Result{Status: report.Pass}
	res.Metric("gpu.count", float64(len(st.GPUs)))
	if len(st.GPUs) == 0 && len(onBus) == 0 && want == 0 {
		return checks.Skipf("the driver reports no GPUs and none is on the PCI bus or expected")
	}

	switch n := len(st.GPUs); {
	case want > 0 && n < want:
		res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent,
			Code: CodeGPUCountLow, Action: report.ActionReseat,
			Message: fmt.Sprintf("the driver shows %d GPU(s), expected %d", n, want)})
	case want > 0 && n > want:
		res.Add(report.Finding{Severity: report.SevWarn, Component: checks.NodeComponent,
			Code: CodeGPUCountHigh, Action: report.ActionNone,
			Message: fmt.Sprintf("the driver shows %d GPU(s), expected %d: is expect.gpu_count right for this node?", n, want)})
	}

	missingFromDriver(&res, st.GPUs, onBus)
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

// missingFromDriver reports NVIDIA GPUs on the PCI bus that the driver does
// not list. When the driver gives no bus id for some GPU the lists cannot be
// matched one to one, so only the counts are compared.
func missingFromDriver(res *checks.Result, gpus []snapshot.GPU, onBus []string) {
	if len(onBus) == 0 {
		return
	}
	known := make(map[string]bool, len(gpus))
	matchable := true
	for _, g := range gpus {
		if g.PCIBusID == "" {
			matchable = false
		}
		known[snapshot.NormalizeBusID(g.PCIBusID)] = true
	}
	if !matchable {
		if len(onBus) > len(gpus) {
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
