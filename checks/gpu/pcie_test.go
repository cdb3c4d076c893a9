package gpu

import (
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

func TestPCIe(t *testing.T) {
	t.Parallel()
	link := func(gen, genMax, w, wMax int) func(*snapshot.GPU) {
		return func(g *snapshot.GPU) {
			g.PCIe = snapshot.PCIeLink{GenCurrent: gen, GenMax: genMax, WidthCurrent: w, WidthMax: wMax}
		}
	}
	idle := func(g *snapshot.GPU) { g.ClockEvents["gpu_idle"] = true }
	allAt := func(gen int) *snapshot.Snapshot {
		gs := make([]snapshot.GPU, 8)
		for i := range gs {
			gs[i] = gpu(i, link(gen, 5, 16, 16))
		}
		return node(gs...)
	}
	sysfsNarrow := func() *snapshot.Snapshot {
		s := eight(-1)
		s.PCI = busFor(0, 1, 2, 3, 4, 5, 6, 7)
		s.PCI[6].CurrentLinkWidth = 8
		return s
	}
	sysfsOnly := func() *snapshot.Snapshot {
		s := node(gpu(0, link(0, 0, 0, 0)), gpu(1, link(0, 0, 0, 0)))
		s.PCI = busFor(0, 1)
		s.PCI[1].CurrentLinkWidth = 4
		s.PCI[1].CurrentLinkSpeed = "2.5 GT/s PCIe"
		return s
	}

	runTable(t, PCIe{}, []tcase{
		{name: "all Gen5 x16", snap: eight(-1), want: report.Pass,
			metrics: map[string]float64{"gpu0.pcie.link_gen": 5, "gpu0.pcie.width_lanes": 16}},
		{name: "narrow link", snap: eight(3, link(5, 5, 8, 16)),
			want: report.Fail, findings: []string{"GPU3 PCIE_WIDTH_DEGRADED reseat"}, metrics: map[string]float64{"gpu3.pcie.width_lanes": 8}},
		{name: "all idle at Gen1 together", snap: allAt(1), want: report.Pass, metrics: map[string]float64{"gpu0.pcie.link_gen": 1}},
		{name: "one slow while siblings run Gen5", snap: eight(2, link(3, 5, 16, 16)),
			want: report.Warn, findings: []string{"GPU2 PCIE_GEN_DEGRADED monitor"}},
		{name: "one idle GPU dropped its gen", snap: eight(2, link(1, 5, 16, 16), idle), want: report.Pass},
		{name: "a Gen4 GPU among Gen5 ones is at its own max", snap: eight(2, link(4, 4, 16, 16)), want: report.Pass},
		{name: "sysfs sees a narrow link the driver does not", snap: sysfsNarrow(),
			want: report.Fail, findings: []string{"GPU6 PCIE_WIDTH_DEGRADED reseat"}},
		{name: "sysfs fills in what the driver lacks", snap: sysfsOnly(),
			want: report.Fail, findings: []string{"GPU1 PCIE_WIDTH_DEGRADED reseat", "GPU1 PCIE_GEN_DEGRADED monitor"},
			metrics: map[string]float64{"gpu1.pcie.width_lanes": 4, "gpu1.pcie.link_gen": 1, "gpu0.pcie.link_gen": 5}},
		{name: "no link data", snap: node(gpu(0, link(0, 0, 0, 0))), want: report.Skip, reason: "PCIe",
			absent: []string{"gpu0.pcie.width_lanes"}},
		{name: "replay counter is a metric", snap: eight(1, func(g *snapshot.GPU) { g.PCIe.ReplayCounter = u64(67) }),
			want: report.Pass, metrics: map[string]float64{"gpu1.pcie.replay_count": 67}},
	})
}

func TestSpeedGen(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{"2.5 GT/s PCIe": 1, "5.0 GT/s PCIe": 2, "8.0 GT/s PCIe": 3, "16.0 GT/s PCIe": 4,
		"32.0 GT/s PCIe": 5, "64.0 GT/s PCIe": 6, "Unknown": 0, "": 0} {
		if got := speedGen(in); got != want {
			t.Errorf("speedGen(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestPCIeFixtures(t *testing.T) {
	t.Parallel()
	runTable(t, PCIe{}, []tcase{
		{name: "h100x8 Gen5 x16", snap: fixture(t, "h100x8_v12.xml"), want: report.Pass,
			metrics: map[string]float64{"gpu7.pcie.link_gen": 5, "gpu7.pcie.width_lanes": 16, "gpu0.pcie.replay_count": 67}},
		// The captured A10G ran at x8 of x16 (and idle at Gen1): the width is the fault.
		{name: "a10g at x8", snap: fixture(t, "a10g_v11.xml"),
			want: report.Fail, findings: []string{"GPU0 PCIE_WIDTH_DEGRADED reseat"}},
	})
}
