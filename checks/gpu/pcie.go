package gpu

import (
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// PCIe is gpu.pcie: the GPU's PCIe link against its maximum.
//
// Width does not change with load, so a narrower link than the maximum is
// a fault: a badly seated card or riser. Generation does: an idle GPU drops
// to Gen1 to save power. A GPU below its maximum generation is flagged only
// when a sibling runs faster at the same moment and the GPU itself is not
// idle (gpu_idle not active); all GPUs slow together is an idle node.
//
// nvidia-smi's numbers come first; the kernel's sysfs view of the same bus
// id is the ground truth where nvidia-smi has none, and a narrowed width
// seen in either is reported.
type PCIe struct{}

// Name implements checks.Check.
func (PCIe) Name() string { return "gpu.pcie" }

// Needs implements checks.Check.
func (PCIe) Needs() []snapshot.Source { return []snapshot.Source{snapshot.SrcNvidiaSMI} }

// Disruptive implements checks.Check.
func (PCIe) Disruptive() bool { return false }

type link struct {
	g                snapshot.GPU
	gen, genMax      int
	width, widthMax  int
	sysWidth, sysMax int
}

// Run implements checks.Check.
func (PCIe) Run(in checks.Input) checks.Result {
	gs, res, ok := gpus(in)
	if !ok {
		return res
	}
	sysfs := map[string]snapshot.PCIDevice{}
	for _, d := range in.Snap.PCI {
		sysfs[snapshot.NormalizeBusID(d.Address)] = d
	}
	links := make([]link, 0, len(gs))
	for _, g := range gs {
		l := link{g: g, gen: g.PCIe.GenCurrent, genMax: g.PCIe.GenMax, width: g.PCIe.WidthCurrent, widthMax: g.PCIe.WidthMax}
		if d, found := sysfs[snapshot.NormalizeBusID(g.PCIBusID)]; found && g.PCIBusID != "" {
			l.sysWidth, l.sysMax = d.CurrentLinkWidth, d.MaxLinkWidth
			if l.width == 0 || l.widthMax == 0 {
				l.width, l.widthMax = l.sysWidth, l.sysMax
			}
			if l.gen == 0 {
				l.gen = speedGen(d.CurrentLinkSpeed)
			}
			if l.genMax == 0 {
				l.genMax = speedGen(d.MaxLinkSpeed)
			}
		}
		links = append(links, l)
	}

	judged := false
	for i, l := range links {
		g := l.g
		if l.width > 0 {
			res.Metric(metric(g, "pcie.width_lanes"), float64(l.width))
		}
		if l.gen > 0 {
			res.Metric(metric(g, "pcie.link_gen"), float64(l.gen))
		}
		if g.PCIe.ReplayCounter != nil {
			res.Metric(metric(g, "pcie.replay_count"), float64(*g.PCIe.ReplayCounter))
		}
		if (l.width > 0 && l.widthMax > 0) || (l.sysWidth > 0 && l.sysMax > 0) || (l.gen > 0 && l.genMax > 0) {
			judged = true
		}

		switch {
		case l.width > 0 && l.widthMax > 0 && l.width < l.widthMax:
			res.Add(finding(g, report.SevFail, CodePCIeWidthDegraded, report.ActionReseat,
				"PCIe link at x%d of x%d", l.width, l.widthMax))
		case l.sysWidth > 0 && l.sysMax > 0 && l.sysWidth < l.sysMax:
			res.Add(finding(g, report.SevFail, CodePCIeWidthDegraded, report.ActionReseat,
				"PCIe link at x%d of x%d per sysfs (the driver reports x%d of x%d)", l.sysWidth, l.sysMax, l.width, l.widthMax))
		}

		if l.gen == 0 || l.genMax == 0 || l.gen >= l.genMax || g.ClockEvents["gpu_idle"] {
			continue
		}
		fastest, who := 0, -1
		for j, s := range links {
			if j != i && s.gen > fastest {
				fastest, who = s.gen, j
			}
		}
		if bar := min(fastest, l.genMax); l.gen < bar {
			res.Add(finding(g, report.SevWarn, CodePCIeGenDegraded, report.ActionMonitor,
				"PCIe Gen%d of Gen%d while %s runs at Gen%d", l.gen, l.genMax, checks.GPUComponent(links[who].g.Index), fastest))
		}
	}
	if !judged {
		return checks.Skipf("no GPU reports its PCIe link width or generation")
	}
	return res
}

// speedGen turns a sysfs link speed ("32.0 GT/s PCIe") into a generation.
func speedGen(s string) int {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	switch {
	case v >= 120:
		return 7
	case v >= 60:
		return 6
	case v >= 30:
		return 5
	case v >= 15:
		return 4
	case v >= 7.5:
		return 3
	case v >= 4.5:
		return 2
	case v >= 2:
		return 1
	}
	return 0
}
