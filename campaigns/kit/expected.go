package kit

import (
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// gpuNodeChecks read sources every GPU node has (nvidia-smi, the kernel
// log, the PCI bus): in a campaign their skip means the data is missing,
// not that the check does not apply. ibNodeChecks read the HCAs' sysfs:
// missing data on a node known to have HCAs.
var (
	gpuNodeChecks = []string{"gpu.inventory", "gpu.ecc", "gpu.xid", "gpu.thermal", "gpu.pcie"}
	ibNodeChecks  = []string{"ib.ports", "ib.counters"}
)

// Missing is one check whose data a campaign expected and did not get.
type Missing struct {
	Check  string
	Reason string
}

// noGPU is the Missing.Check of a report that saw no GPU at all.
const noGPU = "inventory"

func (m Missing) String() string {
	if m.Check == noGPU {
		return "nothing measured: " + m.Reason
	}
	if m.Reason == "" {
		return m.Check + " skipped where data was expected"
	}
	return m.Check + " skipped where data was expected: " + m.Reason
}

// MissingData lists what a campaign's report of a GPU node lacks: a skip
// of a GPU check, of an IB check on a node with HCAs (hasHCAs: the
// coordinator's inventory or the report says so), and a report that saw
// no GPU at all. docs/design.md: in campaigns a skip where data was expected
// is inconclusive, never a pass. Checks the campaign did not ask for are
// not judged; the GPU count is judged when gpu.inventory ran (its probe
// read nvidia-smi).
func MissingData(rep *report.Report, hasHCAs bool) []Missing {
	if rep == nil {
		return nil
	}
	var out []Missing
	want := map[string]bool{}
	for _, c := range gpuNodeChecks {
		want[c] = true
	}
	if hasHCAs || len(rep.Inventory.HCAs) > 0 {
		for _, c := range ibNodeChecks {
			want[c] = true
		}
	}
	gpuAsked := false
	for _, c := range rep.Checks {
		if want[c.Name] && c.Status == report.Skip {
			out = append(out, Missing{Check: c.Name, Reason: c.Reason})
		}
		gpuAsked = gpuAsked || c.Name == "gpu.inventory"
	}
	if gpuAsked && len(rep.Inventory.GPUs) == 0 {
		out = append(out, Missing{Check: noGPU, Reason: "the report shows no GPU"})
	}
	return out
}
