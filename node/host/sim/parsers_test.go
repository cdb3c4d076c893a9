package sim_test

// These tests read the simulator's output with the real parsers, the way
// inspect.Read does on a live host or a bundle: each fault must show up in
// the parsed snapshot exactly as the real failure would.

import (
	"context"
	"errors"
	"io/fs"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	"github.com/fleetcheck/fleetcheck/node/probe/dcgm"
	"github.com/fleetcheck/fleetcheck/node/probe/ibsysfs"
	"github.com/fleetcheck/fleetcheck/node/probe/kmsg"
	"github.com/fleetcheck/fleetcheck/node/probe/nccl"
	"github.com/fleetcheck/fleetcheck/node/probe/nvlink"
	"github.com/fleetcheck/fleetcheck/node/probe/nvsmi"
	"github.com/fleetcheck/fleetcheck/node/probe/pcisysfs"
	"github.com/fleetcheck/fleetcheck/node/probe/procfs"
)

var testNow = time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)

// fixedClock is a clock tests move by hand.
type fixedClock struct{ t time.Time }

func (c *fixedClock) Now() time.Time { return c.t }

func newNode(t *testing.T, mutate func(*sim.Spec)) (*sim.Node, *fixedClock) {
	t.Helper()
	clk := &fixedClock{t: testNow}
	s := sim.DefaultSpec("gpu-017")
	s.Clock = clk
	s.DCGMDiag = true
	s.DCGMLevel = 2
	if mutate != nil {
		mutate(&s)
	}
	n, err := sim.New(s)
	if err != nil {
		t.Fatal(err)
	}
	return n, clk
}

func capture(t *testing.T, h host.Host, src snapshot.Source) host.Capture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.Capture(ctx, src)
}

func mustOK(t *testing.T, c host.Capture, src snapshot.Source) []byte {
	t.Helper()
	if c.State != snapshot.StateOK {
		t.Fatalf("%s: state %s (%s)", src, c.State, c.Err)
	}
	return c.Data
}

// parsed is what a probe pass reads from a node.
type parsed struct {
	gpu     *snapshot.GPUState
	gpuErr  error
	smi     host.Capture
	nvl     *snapshot.NVLinkState
	kern    *snapshot.KernelLog
	pci     []snapshot.PCIDevice
	hcas    []snapshot.HCA
	ar      *snapshot.AllReduceRun
	arCap   host.Capture
	dcgm    *snapshot.DCGMDiag
	mods    []string
	uptime  time.Duration
	drv     string
	version snapshot.Versions
}

func readAll(t *testing.T, n *sim.Node) parsed {
	t.Helper()
	var p parsed
	fsys := n.FS()
	var err error
	up, err := fs.ReadFile(fsys, "proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	if p.uptime, err = procfs.ParseUptime(up); err != nil {
		t.Fatal(err)
	}
	mods, _ := fs.ReadFile(fsys, "proc/modules")
	if p.mods, err = procfs.ParseModules(mods); err != nil {
		t.Fatal(err)
	}
	dv, _ := fs.ReadFile(fsys, "proc/driver/nvidia/version")
	if p.drv, err = procfs.ParseDriverVersion(dv); err != nil {
		t.Fatal(err)
	}
	if p.pci, err = pcisysfs.Read(fsys); err != nil {
		t.Fatalf("pcisysfs: %v", err)
	}
	if p.hcas, err = ibsysfs.Read(fsys); err != nil {
		t.Fatalf("ibsysfs: %v", err)
	}
	p.smi = capture(t, n, snapshot.SrcNvidiaSMI)
	if p.smi.State == snapshot.StateOK {
		p.gpu, p.gpuErr = nvsmi.Parse(p.smi.Data)
		if p.gpuErr != nil {
			t.Fatalf("nvsmi: %v", p.gpuErr)
		}
		nv := mustOK(t, capture(t, n, snapshot.SrcNVLink), snapshot.SrcNVLink)
		if p.nvl, err = nvlink.Parse(nv); err != nil {
			t.Fatalf("nvlink: %v", err)
		}
	}
	kl := mustOK(t, capture(t, n, snapshot.SrcKernelLog), snapshot.SrcKernelLog)
	if p.kern, err = kmsg.Parse(kl, n.Now(), p.uptime); err != nil {
		t.Fatalf("kmsg: %v", err)
	}
	p.arCap = capture(t, n, snapshot.SrcAllReduce)
	if p.arCap.State == snapshot.StateOK {
		if p.ar, err = nccl.Parse(p.arCap.Data); err != nil {
			t.Fatalf("nccl: %v", err)
		}
	}
	if c := capture(t, n, snapshot.SrcDCGMDiag); c.State == snapshot.StateOK {
		if p.dcgm, err = dcgm.Parse(c.Data); err != nil {
			t.Fatalf("dcgm: %v", err)
		}
	}
	vj := mustOK(t, capture(t, n, snapshot.SrcVersions), snapshot.SrcVersions)
	if p.version, err = procfs.ParseVersions(vj); err != nil {
		t.Fatalf("versions: %v", err)
	}
	return p
}

func (p parsed) gpuByBus(bus string) *snapshot.GPU {
	for i := range p.gpu.GPUs {
		if p.gpu.GPUs[i].PCIBusID == bus {
			return &p.gpu.GPUs[i]
		}
	}
	return nil
}

func (p parsed) hca(name string) *snapshot.HCA {
	for i := range p.hcas {
		if p.hcas[i].Name == name {
			return &p.hcas[i]
		}
	}
	return nil
}

func (p parsed) nvidiaGPUsOnBus() int {
	k := 0
	for _, d := range p.pci {
		if d.IsNVIDIAGPU() {
			k++
		}
	}
	return k
}

func largestBusBW(t *testing.T, ar *snapshot.AllReduceRun) float64 {
	t.Helper()
	r, ok := ar.Largest()
	if !ok {
		t.Fatal("no all_reduce rows")
	}
	return r.BusBW()
}

func u64(p *uint64) uint64 {
	if p == nil {
		return math.MaxUint64
	}
	return *p
}

func TestParsersReadHealthyNode(t *testing.T) {
	t.Parallel()
	n, _ := newNode(t, nil)
	p := readAll(t, n)
	spec := n.Spec()

	if p.gpu.DriverVersion != "535.161.08" || p.gpu.CUDAVersion != "12.2" || p.gpu.AttachedGPUs != 8 || len(p.gpu.GPUs) != 8 {
		t.Fatalf("nvsmi: driver %q cuda %q attached %d gpus %d", p.gpu.DriverVersion, p.gpu.CUDAVersion, p.gpu.AttachedGPUs, len(p.gpu.GPUs))
	}
	for i, g := range p.gpu.GPUs {
		want := spec.GPUs[i]
		if g.Name != "NVIDIA H100 80GB HBM3" || g.UUID != want.UUID || g.Serial != want.Serial || g.PCIBusID != want.BusID ||
			g.VBIOS != "96.00.74.00.0D" || u64(g.MemoryTotalMiB) != 81559 {
			t.Errorf("GPU%d identity: %+v", i, g)
		}
		if u64(g.ECC.Volatile.Uncorrectable) != 0 || u64(g.ECC.Aggregate.Uncorrectable) != 0 {
			t.Errorf("GPU%d ECC not zero: %+v", i, g.ECC)
		}
		if g.RemappedRows == nil || g.RemappedRows.Pending || g.RemappedRows.Failure {
			t.Errorf("GPU%d remapped rows: %+v", i, g.RemappedRows)
		}
		if g.PCIe.WidthCurrent != 16 || g.PCIe.WidthMax != 16 || g.PCIe.GenCurrent != 5 {
			t.Errorf("GPU%d pcie: %+v", i, g.PCIe)
		}
		if g.Fabric == nil || g.Fabric.State != "Completed" {
			t.Errorf("GPU%d fabric: %+v", i, g.Fabric)
		}
		if g.ClockEvents["hw_thermal_slowdown"] || !g.ClockEvents["hw_power_brake_slowdown"] {
			t.Errorf("GPU%d clock events: %v", i, g.ClockEvents)
		}
		if g.TemperatureC == nil || *g.TemperatureC > 40 || len(g.Processes) != 0 {
			t.Errorf("GPU%d temp %v processes %v", i, g.TemperatureC, g.Processes)
		}
	}
	if p.nvidiaGPUsOnBus() != 8 || len(p.pci) != 8+4+8 {
		t.Errorf("pcisysfs: %d NVIDIA GPUs, %d functions", p.nvidiaGPUsOnBus(), len(p.pci))
	}
	for _, d := range p.pci {
		if d.IsNVIDIAGPU() && (d.Driver != "nvidia" || d.CurrentLinkWidth != 16 || d.CurrentLinkSpeed != "32.0 GT/s PCIe") {
			t.Errorf("pci %+v", d)
		}
	}
	if len(p.hcas) != 8 {
		t.Fatalf("ibsysfs: %d HCAs", len(p.hcas))
	}
	for _, h := range p.hcas {
		if len(h.Errors) > 0 || h.Model != "MT4129" || h.FWVersion != "28.39.1002" || len(h.Ports) != 1 {
			t.Errorf("%s: %+v", h.Name, h)
			continue
		}
		pt := h.Ports[0]
		if pt.State != "ACTIVE" || pt.PhysState != "LinkUp" || pt.RateGbps != 400 || pt.LinkLayer != "InfiniBand" {
			t.Errorf("%s port: %+v", h.Name, pt)
		}
		if pt.Counters["symbol_error"] != 0 || pt.Counters["port_rcv_data"] == 0 || len(pt.Counters) != 21 || len(pt.HWCounters) != 26 {
			t.Errorf("%s counters: %d/%d %v", h.Name, len(pt.Counters), len(pt.HWCounters), pt.Counters)
		}
	}
	if len(p.nvl.GPUs) != 8 {
		t.Fatalf("nvlink: %d GPUs", len(p.nvl.GPUs))
	}
	for _, g := range p.nvl.GPUs {
		if len(g.Links) != 18 {
			t.Errorf("nvlink GPU%d: %d links", g.Index, len(g.Links))
		}
		for _, l := range g.Links {
			if !l.Active || l.SpeedGBps != 26.562 || l.Errors["replay"] != 0 {
				t.Errorf("nvlink GPU%d link %d: %+v", g.Index, l.Link, l)
			}
		}
	}
	for _, e := range p.kern.Events {
		if e.Kind == snapshot.EventXid || e.Kind == snapshot.EventFellOffBus {
			t.Errorf("healthy kernel log has %+v", e)
		}
	}
	if bw := largestBusBW(t, p.ar); math.Abs(bw-480)/480 > 0.05 {
		t.Errorf("largest busbw %.1f, want 480 ± 5%%", bw)
	}
	if len(p.ar.Rows) != 31 || p.ar.Devices != 8 || u64(p.ar.OutOfBounds) != 0 || p.ar.OutOfBoundsFailed || len(p.ar.Failures) > 0 {
		t.Errorf("all_reduce: rows %d devices %d oob %v failures %v", len(p.ar.Rows), p.ar.Devices, p.ar.OutOfBounds, p.ar.Failures)
	}
	for _, r := range p.ar.Rows {
		// algbw = busbw / (2(n-1)/n), within print rounding.
		if r.SizeBytes >= 1<<20 && math.Abs(r.OutOfPlace.AlgBW*1.75-r.OutOfPlace.BusBW) > 0.02 {
			t.Errorf("size %d: algbw %.2f busbw %.2f", r.SizeBytes, r.OutOfPlace.AlgBW, r.OutOfPlace.BusBW)
		}
	}
	if p.dcgm == nil {
		t.Fatal("dcgm diag absent")
	}
	for _, tr := range p.dcgm.Tests {
		if tr.Status != "Pass" {
			t.Errorf("dcgm %s/%s GPU%d: %s %v", tr.Category, tr.Name, tr.EntityID, tr.Status, tr.Warnings)
		}
	}
	if !slices.Contains(p.mods, "nvidia_peermem") || !slices.Contains(p.mods, "mlx5_core") {
		t.Errorf("modules %v", p.mods)
	}
	if want := n.Now().Sub(n.Boot()); p.uptime != want.Truncate(10*time.Millisecond) {
		t.Errorf("uptime %v, want %v", p.uptime, want)
	}
	if p.drv != "535.161.08" {
		t.Errorf("driver version %q", p.drv)
	}
	wantV := snapshot.Versions{Driver: "535.161.08", CUDA: "12.2", Kernel: "5.15.0-105-generic", FabricManager: "535.161.08",
		RDMAStack: "MLNX_OFED 23.10-1.1.9.0", NCCL: "2.21.5", DCGM: "3.3.5"}
	if p.version != wantV {
		t.Errorf("versions %+v", p.version)
	}
}

// TestParsersSeeFaults injects each fault on a fresh node and checks that
// the real parsers see it where an operator would.
func TestParsersSeeFaults(t *testing.T) {
	t.Parallel()
	gpu3 := "0000:5d:00.0"
	cases := []struct {
		name   string
		faults []sim.Fault
		check  func(t *testing.T, p parsed)
	}{
		{"ecc uncorrectable", []sim.Fault{sim.ECCUncorrectable{GPU: 3, Count: 2}}, func(t *testing.T, p parsed) {
			g := p.gpuByBus(gpu3)
			if u64(g.ECC.Volatile.Uncorrectable) != 2 || u64(g.ECC.Aggregate.Uncorrectable) != 2 || g.ECC.Volatile.Detail["dram_uncorrectable"] != 2 {
				t.Errorf("GPU3 ECC %+v", g.ECC)
			}
			if other := p.gpuByBus("0000:19:00.0"); u64(other.ECC.Volatile.Uncorrectable) != 0 {
				t.Errorf("GPU0 ECC %+v", other.ECC)
			}
			if !dcgmFailed(p.dcgm, "GPU Memory", 3) {
				t.Errorf("dcgm GPU Memory did not fail on GPU3: %+v", p.dcgm.Tests)
			}
		}},
		{"row remap pending", []sim.Fault{sim.RowRemapPending{GPU: 3}}, func(t *testing.T, p parsed) {
			g := p.gpuByBus(gpu3)
			if g.RemappedRows == nil || !g.RemappedRows.Pending || g.RemappedRows.Failure {
				t.Errorf("GPU3 remapped rows %+v", g.RemappedRows)
			}
		}},
		{"row remap failure", []sim.Fault{sim.RowRemapFailure{GPU: 3}}, func(t *testing.T, p parsed) {
			g := p.gpuByBus(gpu3)
			if g.RemappedRows == nil || !g.RemappedRows.Failure {
				t.Errorf("GPU3 remapped rows %+v", g.RemappedRows)
			}
		}},
		{"xid 79", []sim.Fault{sim.Xid{GPU: 4, Code: 79}}, func(t *testing.T, p parsed) {
			var xid *snapshot.KernelEvent
			for i, e := range p.kern.Events {
				if e.Kind == snapshot.EventXid {
					xid = &p.kern.Events[i]
				}
			}
			if xid == nil || xid.Code != 79 || xid.PCIBusID != "0000:9b:00.0" {
				t.Fatalf("xid event %+v in %+v", xid, p.kern.Events)
			}
			if !xid.Time.Equal(testNow) {
				t.Errorf("xid time %v, want %v", xid.Time, testNow)
			}
		}},
		{"gpu missing", []sim.Fault{sim.GPUMissing{GPU: 3}}, func(t *testing.T, p parsed) {
			if len(p.gpu.GPUs) != 7 || p.gpu.AttachedGPUs != 7 || p.gpuByBus(gpu3) != nil {
				t.Errorf("nvsmi sees %d GPUs (attached %d)", len(p.gpu.GPUs), p.gpu.AttachedGPUs)
			}
			if p.nvidiaGPUsOnBus() != 8 {
				t.Errorf("pci bus has %d NVIDIA GPUs, want 8", p.nvidiaGPUsOnBus())
			}
			if len(p.nvl.GPUs) != 7 {
				t.Errorf("nvlink sees %d GPUs", len(p.nvl.GPUs))
			}
			if p.arCap.State != snapshot.StateFailed || p.arCap.ExitCode == 0 {
				t.Errorf("all_reduce with a GPU missing: %s exit %d", p.arCap.State, p.arCap.ExitCode)
			}
		}},
		{"thermal slowdown", []sim.Fault{sim.ThermalSlowdown{GPU: 3}}, func(t *testing.T, p parsed) {
			g := p.gpuByBus(gpu3)
			if g.TemperatureC == nil || *g.TemperatureC != 92 || !g.ClockEvents["hw_thermal_slowdown"] {
				t.Errorf("GPU3 temp %v events %v", g.TemperatureC, g.ClockEvents)
			}
		}},
		{"pcie downtrained", []sim.Fault{sim.PCIeDowntrained{GPU: 3}}, func(t *testing.T, p parsed) {
			g := p.gpuByBus(gpu3)
			if g.PCIe.WidthCurrent != 8 || g.PCIe.WidthMax != 16 {
				t.Errorf("GPU3 pcie %+v", g.PCIe)
			}
			for _, d := range p.pci {
				if d.Address == gpu3 && (d.CurrentLinkWidth != 8 || d.MaxLinkWidth != 16) {
					t.Errorf("sysfs %+v", d)
				}
			}
		}},
		{"ib port down", []sim.Fault{sim.IBPortDown{HCA: "mlx5_4"}}, func(t *testing.T, p parsed) {
			pt := p.hca("mlx5_4").Ports[0]
			if pt.State != "DOWN" || pt.PhysState != "Disabled" || pt.Counters["link_downed"] != 1 {
				t.Errorf("mlx5_4 port %+v", pt)
			}
			if p.hca("mlx5_3").Ports[0].State != "ACTIVE" {
				t.Error("mlx5_3 went down too")
			}
		}},
		{"ib rate drop", []sim.Fault{sim.IBRateDrop{HCA: "mlx5_2", Gbps: 200}}, func(t *testing.T, p parsed) {
			pt := p.hca("mlx5_2").Ports[0]
			if pt.RateGbps != 200 || pt.RateText != "200 Gb/sec (4X HDR)" || pt.State != "ACTIVE" {
				t.Errorf("mlx5_2 port %+v", pt)
			}
		}},
		{"nvlink degraded", []sim.Fault{sim.NVLinkDegraded{GPU: 5, Links: 4}}, func(t *testing.T, p parsed) {
			inactive := 0
			for _, l := range p.nvl.GPUs[5].Links {
				if !l.Active {
					inactive++
				}
			}
			if inactive != 4 {
				t.Errorf("GPU5 has %d inactive links", inactive)
			}
			if bw := largestBusBW(t, p.ar); bw > 480*14/18*1.05 || bw < 480*14/18*0.95 {
				t.Errorf("busbw %.1f with 4 of 18 links down", bw)
			}
		}},
		{"ghost process", []sim.Fault{sim.GhostProcess{GPU: 3, MiB: 30000}}, func(t *testing.T, p parsed) {
			g := p.gpuByBus(gpu3)
			if len(g.Processes) != 1 || u64(g.Processes[0].UsedMemoryMiB) != 30000 || u64(g.MemoryUsedMiB) != 30000 {
				t.Errorf("GPU3 processes %+v used %v", g.Processes, g.MemoryUsedMiB)
			}
		}},
		{"slow node", []sim.Fault{sim.SlowNode{Factor: 0.6}}, func(t *testing.T, p parsed) {
			if bw := largestBusBW(t, p.ar); math.Abs(bw-288)/288 > 0.05 {
				t.Errorf("busbw %.1f, want 288 ± 5%%", bw)
			}
		}},
		{"peermem missing", []sim.Fault{sim.PeerMemMissing{}}, func(t *testing.T, p parsed) {
			if slices.Contains(p.mods, "nvidia_peermem") {
				t.Errorf("modules %v", p.mods)
			}
		}},
		{"fabric not ready", []sim.Fault{sim.FabricNotReady{}}, func(t *testing.T, p parsed) {
			if f := p.gpuByBus(gpu3).Fabric; f == nil || f.State != "In Progress" {
				t.Errorf("fabric %+v", f)
			}
			if p.arCap.State != snapshot.StateFailed {
				t.Errorf("all_reduce state %s", p.arCap.State)
			}
		}},
		{"nccl wrong results", []sim.Fault{sim.NCCLWrongResults{Count: 8192}}, func(t *testing.T, p parsed) {
			if u64(p.ar.OutOfBounds) != 16384 || !p.ar.OutOfBoundsFailed {
				t.Errorf("out of bounds %v failed %v", p.ar.OutOfBounds, p.ar.OutOfBoundsFailed)
			}
			r, _ := p.ar.Largest()
			if u64(r.OutOfPlace.Wrong) != 8192 {
				t.Errorf("largest row wrong %v", r.OutOfPlace.Wrong)
			}
		}},
		{"dcgm failure", []sim.Fault{sim.DCGMFailure{GPU: 2, Test: "PCIe", Warning: "GPU 2: PCIe bandwidth below threshold"}}, func(t *testing.T, p parsed) {
			if !dcgmFailed(p.dcgm, "PCIe", 2) {
				t.Errorf("dcgm %+v", p.dcgm.Tests)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n, _ := newNode(t, nil)
			for _, f := range tc.faults {
				if err := n.AddFault(f); err != nil {
					t.Fatal(err)
				}
			}
			tc.check(t, readAll(t, n))
			// Clearing the faults brings the parsed view back to healthy.
			n.ClearAll()
			p := readAll(t, n)
			if len(p.gpu.GPUs) != 8 || p.ar == nil {
				t.Errorf("after ClearAll: %d GPUs, all_reduce %v", len(p.gpu.GPUs), p.arCap.State)
			}
		})
	}
}

func dcgmFailed(d *snapshot.DCGMDiag, test string, gpu int) bool {
	if d == nil {
		return false
	}
	for _, tr := range d.Tests {
		if tr.Name == test && tr.EntityID == gpu && tr.Status == "Fail" {
			return true
		}
	}
	return false
}

func TestSymbolErrorsRiseEveryPass(t *testing.T) {
	t.Parallel()
	n, clk := newNode(t, nil)
	if err := n.AddFault(sim.IBSymbolErrors{HCA: "mlx5_1", PerPass: 25}); err != nil {
		t.Fatal(err)
	}
	var prev, prevData uint64
	for pass := 1; pass <= 3; pass++ {
		clk.t = clk.t.Add(time.Minute)
		hcas, err := ibsysfs.Read(n.FS())
		if err != nil {
			t.Fatal(err)
		}
		var port snapshot.IBPort
		for _, h := range hcas {
			if h.Name == "mlx5_1" {
				port = h.Ports[0]
			}
		}
		sym, data := port.Counters["symbol_error"], port.Counters["port_rcv_data"]
		if sym != prev+25 {
			t.Errorf("pass %d: symbol_error %d, want %d", pass, sym, prev+25)
		}
		if data <= prevData {
			t.Errorf("pass %d: port_rcv_data did not advance: %d", pass, data)
		}
		prev, prevData = sym, data
	}
	n.ClearFault(sim.KindIBSymbolErrors, "mlx5_1")
	hcas, _ := ibsysfs.Read(n.FS())
	for _, h := range hcas {
		if h.Name == "mlx5_1" && h.Ports[0].Counters["symbol_error"] != prev {
			t.Errorf("after clear symbol_error %d, want it to stay at %d", h.Ports[0].Counters["symbol_error"], prev)
		}
	}
}

func TestNVLinkErrorsRiseEveryCapture(t *testing.T) {
	t.Parallel()
	n, _ := newNode(t, nil)
	if err := n.AddFault(sim.NVLinkErrors{GPU: 1, Link: 7, PerPass: 3}); err != nil {
		t.Fatal(err)
	}
	for pass := uint64(1); pass <= 2; pass++ {
		st, err := nvlink.Parse(mustOK(t, capture(t, n, snapshot.SrcNVLink), snapshot.SrcNVLink))
		if err != nil {
			t.Fatal(err)
		}
		if got := st.GPUs[1].Links[7].Errors["replay"]; got != 3*pass {
			t.Errorf("pass %d: replay %d", pass, got)
		}
	}
}

func TestHungNvidiaSMITimesOut(t *testing.T) {
	t.Parallel()
	n, _ := newNode(t, nil)
	if err := n.AddFault(sim.HungNvidiaSMI{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	c := n.Capture(ctx, snapshot.SrcNvidiaSMI)
	if c.State != snapshot.StateTimeout || c.Err != "timed out" {
		t.Errorf("capture %+v", c)
	}
	if time.Since(start) < 40*time.Millisecond {
		t.Error("returned before the deadline")
	}
	// dmesg still answers while nvidia-smi hangs.
	if c := capture(t, n, snapshot.SrcKernelLog); c.State != snapshot.StateOK {
		t.Errorf("dmesg %+v", c.State)
	}
}

func TestKernelLogFormatsParse(t *testing.T) {
	t.Parallel()
	for _, f := range []sim.KernelLogFormat{sim.LogSinceBoot, sim.LogCtime, sim.LogISO} {
		n, clk := newNode(t, func(s *sim.Spec) { s.KernelLogFormat = f })
		at := testNow.Add(-2 * time.Hour)
		if err := n.AddFault(sim.Xid{GPU: 0, Code: 48, At: at}); err != nil {
			t.Fatal(err)
		}
		clk.t = testNow
		up := n.Now().Sub(n.Boot())
		kl, err := kmsg.Parse(mustOK(t, capture(t, n, snapshot.SrcKernelLog), snapshot.SrcKernelLog), n.Now(), up)
		if err != nil {
			t.Fatal(err)
		}
		var found bool
		for _, e := range kl.Events {
			if e.Kind == snapshot.EventXid && e.Code == 48 && e.PCIBusID == "0000:19:00.0" {
				found = true
				if d := e.Time.Sub(at); d > time.Second || d < -time.Second {
					t.Errorf("format %d: xid at %v, want %v", f, e.Time, at)
				}
			}
		}
		if !found {
			t.Errorf("format %d: no Xid 48 in %+v", f, kl.Events)
		}
	}
}

func TestA100NodeParses(t *testing.T) {
	t.Parallel()
	s := sim.A100Spec("a100-001")
	s.Clock = &fixedClock{t: testNow}
	n, err := sim.New(s)
	if err != nil {
		t.Fatal(err)
	}
	p := readAll(t, n)
	if len(p.gpu.GPUs) != 8 || p.gpu.GPUs[0].Name != "NVIDIA A100-SXM4-80GB" || p.gpu.GPUs[0].PCIe.GenMax != 4 {
		t.Errorf("A100 GPUs %+v", p.gpu.GPUs[0])
	}
	if g := p.gpu.GPUs[0]; g.SlowdownTempC == nil || *g.SlowdownTempC != 89 {
		t.Errorf("A100 slowdown threshold %v", g.SlowdownTempC)
	}
	if pt := p.hcas[0].Ports[0]; pt.RateGbps != 200 || pt.RateText != "200 Gb/sec (4X HDR)" {
		t.Errorf("A100 port %+v", pt)
	}
	if bw := largestBusBW(t, p.ar); math.Abs(bw-230)/230 > 0.05 {
		t.Errorf("A100 busbw %.1f", bw)
	}
	if len(p.nvl.GPUs[0].Links) != 12 || p.nvl.GPUs[0].Links[0].SpeedGBps != 25 {
		t.Errorf("A100 nvlink %+v", p.nvl.GPUs[0])
	}
}

func TestNodeWithoutGPUs(t *testing.T) {
	t.Parallel()
	n, _ := newNode(t, func(s *sim.Spec) { s.GPUs, s.NVSwitches = nil, nil })
	for _, src := range []snapshot.Source{snapshot.SrcNvidiaSMI, snapshot.SrcNVLink, snapshot.SrcAllReduce, snapshot.SrcDCGMDiag} {
		if c := capture(t, n, src); c.State != snapshot.StateAbsent || !strings.Contains(c.Err, "not found") {
			t.Errorf("%s: %+v", src, c)
		}
	}
	if _, err := fs.ReadFile(n.FS(), "proc/driver/nvidia/version"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("driver version file: %v", err)
	}
	mods, _ := fs.ReadFile(n.FS(), "proc/modules")
	if strings.Contains(string(mods), "nvidia") {
		t.Errorf("modules on a GPU-less node:\n%s", mods)
	}
}

func TestNodeWithoutHCAs(t *testing.T) {
	t.Parallel()
	n, _ := newNode(t, func(s *sim.Spec) { s.HCAs = nil })
	if _, err := ibsysfs.Read(n.FS()); !errors.Is(err, ibsysfs.ErrNoInfiniBand) {
		t.Errorf("ibsysfs on a node without HCAs: %v", err)
	}
	mods, err := procfs.ParseModules(mustReadFS(t, n, "proc/modules"))
	if err != nil || slices.Contains(mods, "nvidia_peermem") || !slices.Contains(mods, "nvidia") {
		t.Errorf("modules %v %v", mods, err)
	}
}

func mustReadFS(t *testing.T, n *sim.Node, p string) []byte {
	t.Helper()
	b, err := fs.ReadFile(n.FS(), p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
