package gpu

import (
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

func withSource(s *snapshot.Snapshot, st snapshot.SourceState) *snapshot.Snapshot {
	s.SetSource(snapshot.SrcNvidiaSMI, st)
	if st.State != snapshot.StateOK {
		s.GPU = nil
	}
	return s
}

func withPCI(s *snapshot.Snapshot, devs []snapshot.PCIDevice) *snapshot.Snapshot {
	s.PCI = devs
	s.SetSource(snapshot.SrcPCI, snapshot.SourceState{State: snapshot.StateOK})
	return s
}

func TestInventory(t *testing.T) {
	t.Parallel()
	expect8 := withCfg(func(c *config.Config) { c.Expect.GPUCount = 8 })
	expectH100 := withCfg(func(c *config.Config) { c.Expect.GPUModel = "h100" })
	timeout := snapshot.SourceState{State: snapshot.StateTimeout, Error: "timed out after 30s"}
	failed := snapshot.SourceState{State: snapshot.StateFailed, ExitCode: 9, Error: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"}
	absent := snapshot.SourceState{State: snapshot.StateAbsent, Error: "nvidia-smi not found"}
	vfio := busFor(0)
	vfio[0].Driver = "vfio-pci"
	audio := []snapshot.PCIDevice{{Address: "0000:19:00.1", Vendor: snapshot.VendorNVIDIA, Class: 0x040300}}
	noBus := func(g *snapshot.GPU) { g.PCIBusID = "" }

	runTable(t, Inventory{}, []tcase{
		{name: "healthy 8 GPUs matching the bus", snap: withPCI(eight(-1), busFor(0, 1, 2, 3, 4, 5, 6, 7)), cfg: expect8,
			want: report.Pass, metrics: map[string]float64{"gpu.count": 8}},
		{name: "nvidia-smi hangs with GPUs on the bus", snap: withPCI(withSource(eight(-1), timeout), busFor(0, 1)),
			want: report.Fail, findings: []string{"node DRIVER_NOT_RESPONDING reboot"}},
		{name: "nvidia-smi fails with GPUs on the bus", snap: withPCI(withSource(eight(-1), failed), busFor(0)),
			want: report.Fail, findings: []string{"node DRIVER_NOT_RESPONDING reboot"}},
		{name: "nvidia-smi fails, no GPU on the bus", snap: withPCI(withSource(eight(-1), failed), nil),
			want: report.Error, reason: "couldn't communicate"},
		{name: "nvidia-smi times out, bus unknown", snap: withSource(eight(-1), timeout),
			want: report.Error, reason: "timed out after 30s"},
		{name: "no nvidia-smi, no GPU: not a GPU node", snap: withPCI(withSource(eight(-1), absent), audio),
			want: report.Skip, reason: "nvidia-smi not found"},
		{name: "no nvidia-smi but GPUs on the bus", snap: withPCI(withSource(eight(-1), absent), busFor(0, 1, 2)),
			want: report.Fail, findings: []string{"node GPU_DRIVER_MISSING drain"}},
		{name: "no nvidia-smi, no GPU on the bus, 8 expected", snap: withPCI(withSource(eight(-1), absent), nil), cfg: expect8,
			want: report.Fail, findings: []string{"node GPU_COUNT_LOW drain"}},
		{name: "no nvidia-smi, no bus scan, 8 expected", snap: withSource(eight(-1), absent), cfg: expect8,
			want: report.Fail, findings: []string{"node GPU_COUNT_LOW drain"}, metrics: map[string]float64{"gpu.count": 0}},
		{name: "no nvidia-smi, no bus scan, nothing expected", snap: withSource(eight(-1), absent),
			want: report.Skip, reason: "nvidia-smi not found", metrics: map[string]float64{"gpu.count": 0}},
		{name: "no nvidia-smi, no bus scan, sku label names a GPU", snap: withSource(eight(-1), absent),
			labels: map[string]string{"sku": "h100-sxm-8", "rack": "r12"},
			want:   report.Fail, findings: []string{"node GPU_COUNT_LOW drain"}, metrics: map[string]float64{"gpu.count": 0}},
		{name: "no nvidia-smi, sku label names no GPU", snap: withPCI(withSource(eight(-1), absent), nil),
			labels: map[string]string{"sku": "cpu-epyc-9654", "rack": "r12"},
			want:   report.Skip, reason: "nvidia-smi not found"},
		{name: "nvidia-smi fails, no GPU on the bus, gpu.count label", snap: withPCI(withSource(eight(-1), failed), nil),
			labels: map[string]string{"nvidia.com/gpu.count": "8"},
			want:   report.Fail, findings: []string{"node DRIVER_NOT_RESPONDING reboot"}},
		{name: "no GPUs reported, baseline-sku says x8", snap: node(),
			labels: map[string]string{"baseline-sku": "h100-sxm-80g-x8-nvlink-ib400x8"},
			want:   report.Fail, findings: []string{"node GPU_COUNT_LOW reseat"}, metrics: map[string]float64{"gpu.count": 0}},
		{name: "no GPUs reported, sku=a100", snap: node(), labels: map[string]string{"sku": "a100"},
			want: report.Fail, findings: []string{"node GPU_COUNT_LOW reseat"}},
		{name: "seven GPUs, baseline-sku says x8", snap: node(gpu(0), gpu(1), gpu(2), gpu(3), gpu(4), gpu(5), gpu(6)),
			labels: map[string]string{"baseline-sku": "h100-sxm-80g-x8-nvlink"},
			want:   report.Fail, findings: []string{"node GPU_COUNT_LOW reseat"}},
		{name: "expect.gpu_count wins over labels", snap: node(gpu(0), gpu(1)), cfg: withCfg(func(c *config.Config) { c.Expect.GPUCount = 2 }),
			labels: map[string]string{"nvidia.com/gpu.count": "8"}, want: report.Pass},
		{name: "NVML: unreachable GPU without a bus id takes the free one on the bus", snap: withPCI(func() *snapshot.Snapshot {
			s := node(gpu(0), gpu(1), gpu(3))
			s.GPU.Unreachable = []snapshot.UnreachableGPU{{Index: 2, Error: "GPU2: DeviceGetHandleByIndex: ERROR_GPU_IS_LOST"}}
			return s
		}(), busFor(0, 1, 2, 3)),
			want: report.Fail, findings: []string{"GPU2 GPU_UNREACHABLE reboot"}},
		{name: "unreachable GPU among the others", snap: withPCI(func() *snapshot.Snapshot {
			s := node(gpu(0), gpu(1), gpu(3))
			s.GPU.Unreachable = []snapshot.UnreachableGPU{{PCIBusID: busFor(2)[0].Address, Index: -1, Error: "Unknown Error"}}
			return s
		}(), busFor(0, 1, 2, 3)),
			want: report.Fail, findings: []string{"node GPU_UNREACHABLE reboot"}, metrics: map[string]float64{"gpu.count": 3, "gpu.unreachable_count": 1}},
		{name: "fewer than expected", snap: node(gpu(0), gpu(1), gpu(2), gpu(3), gpu(4), gpu(5), gpu(6)), cfg: expect8,
			want: report.Fail, findings: []string{"node GPU_COUNT_LOW reseat"}, metrics: map[string]float64{"gpu.count": 7}},
		{name: "more than expected", snap: eight(-1), cfg: withCfg(func(c *config.Config) { c.Expect.GPUCount = 4 }),
			want: report.Warn, findings: []string{"node GPU_COUNT_HIGH none"}},
		{name: "a GPU fell off the bus", snap: withPCI(node(gpu(0), gpu(1), gpu(3)), busFor(0, 1, 2, 3)), cfg: expect8,
			want: report.Fail, findings: []string{"node GPU_COUNT_LOW reseat", "node GPU_MISSING_FROM_DRIVER reseat"}},
		{name: "fell off the bus, no count expected", snap: withPCI(node(gpu(0), gpu(1), gpu(3)), busFor(0, 1, 2, 3)),
			want: report.Fail, findings: []string{"node GPU_MISSING_FROM_DRIVER reseat"}},
		{name: "GPU passed to a VM is not missing", snap: withPCI(node(gpu(1)), append(vfio, busFor(1)...)),
			want: report.Pass},
		{name: "bus ids unknown: counts compared", snap: withPCI(node(gpu(0, noBus)), busFor(0, 1)),
			want: report.Fail, findings: []string{"node GPU_MISSING_FROM_DRIVER reseat"}},
		{name: "model matches case-insensitively", snap: eight(-1), cfg: expectH100, want: report.Pass},
		{name: "wrong model", snap: node(gpu(0, func(g *snapshot.GPU) { g.Name = "NVIDIA A100-SXM4-80GB" })), cfg: expectH100,
			want: report.Fail, findings: []string{"GPU0 GPU_MODEL_MISMATCH drain"}},
		{name: "mixed models", snap: node(gpu(0), gpu(1, func(g *snapshot.GPU) { g.Name = "NVIDIA H100 PCIe" })),
			want: report.Warn, findings: []string{"node GPU_MODEL_MIXED monitor"}},
		{name: "MIG: attached_gpus above the GPU list is fine",
			snap: func() *snapshot.Snapshot { s := node(gpu(0)); s.GPU.AttachedGPUs = 4; return s }(),
			want: report.Pass},
		{name: "query errors warn", snap: func() *snapshot.Snapshot {
			s := eight(-1)
			s.GPU.Errors = []string{"GPU5: GetPowerUsage: ERROR_GPU_IS_LOST"}
			return s
		}(), want: report.Warn, findings: []string{"node GPU_QUERY_ERRORS monitor"}},
		{name: "no GPUs reported, none on the bus, none expected", snap: node(), want: report.Skip, reason: "no GPUs"},
		{name: "no GPUs reported, 8 expected", snap: node(), cfg: expect8,
			want: report.Fail, findings: []string{"node GPU_COUNT_LOW reseat"}},
		{name: "source ok but no state", snap: func() *snapshot.Snapshot { s := node(); s.GPU = nil; return s }(),
			want: report.Error, reason: "no GPU state"},
	})
}

func TestInventoryFixtures(t *testing.T) {
	t.Parallel()
	h100 := fixture(t, "h100x8_v12.xml")
	var bus []snapshot.PCIDevice
	for _, g := range h100.GPU.GPUs {
		bus = append(bus, snapshot.PCIDevice{Address: g.PCIBusID, Vendor: snapshot.VendorNVIDIA, Class: 0x030200})
	}
	// One more GPU on the bus than nvidia-smi shows: fell off.
	bus = append(bus, snapshot.PCIDevice{Address: "0000:ec:00.0", Vendor: snapshot.VendorNVIDIA, Class: 0x030200})
	h100Lost := fixture(t, "h100x8_v12.xml")
	runTable(t, Inventory{}, []tcase{
		{name: "h100x8 as expected", snap: withPCI(h100, bus[:8]),
			cfg:  withCfg(func(c *config.Config) { c.Expect.GPUCount, c.Expect.GPUModel = 8, "H100" }),
			want: report.Pass, metrics: map[string]float64{"gpu.count": 8}},
		{name: "h100x8 with a ninth on the bus", snap: withPCI(h100Lost, bus),
			want: report.Fail, findings: []string{"node GPU_MISSING_FROM_DRIVER reseat"}},
		{name: "a100 MIG: one GPU, attached 4", snap: fixture(t, "a100_mig_v12.xml"),
			cfg:  withCfg(func(c *config.Config) { c.Expect.GPUCount = 1 }),
			want: report.Pass, metrics: map[string]float64{"gpu.count": 1}},
	})
}
