package sim

import (
	"fmt"
	"strconv"
	"strings"
)

// pciFunc is one PCI function on the simulated bus.
type pciFunc struct {
	bdf                  string
	vendor, device       uint16
	subVendor, subDevice uint16
	class                uint32
	driver               string
	gen, width           int
	gpu                  int // index into spec.GPUs; -1 for others
	devDir               string
}

// hcaInfo holds a port's traffic rates and its fixed lifetime error counts:
// healthy long-running ports are rarely at zero (shared/fixtures/FORMATS.md).
type hcaInfo struct {
	wordsPerSec float64 // port_rcv_data rate, in 4-byte words
	xmitRatio   float64
	waitPerSec  float64
	rcvErrors   uint64
	overrun     uint64
	relay       uint64
	retrans     uint64
	dctPerSec   float64
	readPerSec  float64
	writePerSec float64
	guid        uint64
}

func deriveHCAs(s *Spec) []hcaInfo {
	out := make([]hcaInfo, len(s.HCAs))
	for i, h := range s.HCAs {
		u := func(what string) float64 { return unit(hash64(s.Seed, s.Name, "hca", what, h.Name)) }
		k := func(what string, n uint64) uint64 { return hash64(s.Seed, s.Name, "hca", what, h.Name) % n }
		// ~1 GB/s average over the uptime at 400G, scaled by the link rate.
		scale := float64(h.RateGbps) / 400
		out[i] = hcaInfo{
			wordsPerSec: 2.2e8 * scale * (0.8 + 0.4*u("rate")),
			xmitRatio:   0.999 + 0.002*u("xmit"),
			waitPerSec:  2400 * (0.5 + u("wait")),
			rcvErrors:   k("rcverr", 21),
			overrun:     k("overrun", 21),
			relay:       k("relay", 2),
			retrans:     k("retrans", 6),
			dctPerSec:   0.4 * (0.5 + u("dct")),
			readPerSec:  9 * (0.5 + u("read")),
			writePerSec: 3600 * (0.5 + u("write")),
			guid:        0x946dae0300000000 | hash64(s.Seed, s.Name, "guid", h.Name)&0xffffffff,
		}
	}
	return out
}

// pciFuncs lists the node's PCI functions: GPUs, NVSwitches, HCAs, plus a
// host bridge and an NVMe drive that a prober must skip.
func pciFuncs(s *Spec) []pciFunc {
	var out []pciFunc
	for i, g := range s.GPUs {
		out = append(out, pciFunc{bdf: g.BusID, vendor: 0x10de, device: g.Model.DeviceID, subVendor: 0x10de,
			subDevice: g.Model.SubsystemID, class: 0x030200, driver: "nvidia", gen: g.Model.PCIeGen, width: g.Model.PCIeWidth, gpu: i})
	}
	for _, sw := range s.NVSwitches {
		out = append(out, pciFunc{bdf: strings.ToLower(sw.BusID), vendor: 0x10de, device: sw.DeviceID, subVendor: 0x10de,
			subDevice: 0x1796, class: 0x068000, driver: "nvidia-nvswitch", gen: 4, width: 2, gpu: -1})
	}
	for _, h := range s.HCAs {
		class := uint32(0x020700)
		if h.LinkLayer == "Ethernet" {
			class = 0x020000
		}
		out = append(out, pciFunc{bdf: h.BusID, vendor: 0x15b3, device: h.DeviceID, subVendor: 0x15b3,
			subDevice: 0x0041, class: class, driver: "mlx5_core", gen: h.PCIeGen, width: h.PCIeWidth, gpu: -1})
	}
	out = append(out,
		pciFunc{bdf: "0000:00:00.0", vendor: 0x8086, device: 0x09a2, subVendor: 0x8086, subDevice: 0x0000,
			class: 0x060000, gen: 0, gpu: -1},
		pciFunc{bdf: "0000:c1:00.0", vendor: 0x144d, device: 0xa80a, subVendor: 0x144d, subDevice: 0xa801,
			class: 0x010802, driver: "nvme", gen: 4, width: 4, gpu: -1},
	)
	for i := range out {
		dom, bus, _, _ := splitBDF(out[i].bdf)
		b, _ := strconv.ParseUint(bus, 16, 8)
		root := fmt.Sprintf("%s:%02x", dom, max(int(b)-2, 0))
		out[i].devDir = "sys/devices/pci" + root + "/" + root + ":01.0/" + out[i].bdf
	}
	return out
}

// ibCounters and ibHWCounters are the files a ConnectX-7 port has (the
// real tree in shared/fixtures).
func ibCounters() []string {
	return []string{"VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
		"local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets", "port_rcv_constraint_errors",
		"port_rcv_data", "port_rcv_errors", "port_rcv_packets", "port_rcv_remote_physical_errors",
		"port_rcv_switch_relay_errors", "port_xmit_constraint_errors", "port_xmit_data", "port_xmit_discards",
		"port_xmit_packets", "port_xmit_wait", "symbol_error", "unicast_rcv_packets", "unicast_xmit_packets"}
}

func ibHWCounters() []string {
	return []string{"duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err", "out_of_buffer",
		"out_of_sequence", "packet_seq_err", "req_cqe_error", "req_cqe_flush_error", "req_remote_access_errors",
		"req_remote_invalid_request", "resp_cqe_error", "resp_cqe_flush_error", "resp_local_length_error",
		"resp_remote_access_errors", "rnr_nak_retry_err", "roce_adp_retrans", "roce_adp_retrans_to",
		"roce_slow_restart", "roce_slow_restart_cnps", "roce_slow_restart_trans", "rx_atomic_requests",
		"rx_dct_connect", "rx_icrc_encapsulated", "rx_read_requests", "rx_write_requests"}
}

func line(b []byte, s string) []byte { return append(append(b, s...), '\n') }

func uintLine(b []byte, v uint64) []byte { return append(strconv.AppendUint(b, v, 10), '\n') }

func hexLine(b []byte, v uint64, digits int) []byte {
	b = append(b, "0x"...)
	s := strconv.FormatUint(v, 16)
	for i := len(s); i < digits; i++ {
		b = append(b, '0')
	}
	return append(append(b, s...), '\n')
}

// treeShape is what the file tree's layout depends on: which functions sit
// at which bus addresses and what the HCAs are called. Contents are read
// through the view's node, so nodes of one shape share one tree.
func treeShape(s *Spec, funcs []pciFunc) string {
	var b strings.Builder
	for _, f := range funcs {
		b.WriteString(f.bdf + "=" + f.driver + ";")
	}
	b.WriteByte('|')
	for _, h := range s.HCAs {
		b.WriteString(h.Name + "@" + h.BusID + ";")
	}
	if len(s.GPUs) > 0 {
		b.WriteString("|nvidia")
	}
	return b.String()
}

// specLine renders one value of the node's spec.
func specLine(get func(s *Spec, owner int) string) renderFunc {
	return func(v *fsView, owner int, b []byte) []byte { return line(b, get(&v.n.spec, owner)) }
}

// buildTree lays out /sys and /proc for nodes of one shape. No render
// function captures a node: each reads v.n, so the tree can be shared.
func buildTree(s *Spec, funcs []pciFunc) *fsTree {
	root := newDir("", -1)

	// Attribute files shared by every PCI function directory.
	pciAttrs := []*fsNode{}
	attr := func(name string, r func(p *pciFunc, v *fsView, b []byte) []byte) {
		pciAttrs = append(pciAttrs, &fsNode{name: name, kind: kindFile, owner: -1,
			render: func(v *fsView, owner int, b []byte) []byte { return r(&v.n.pci[owner], v, b) }})
	}
	attr("vendor", func(p *pciFunc, _ *fsView, b []byte) []byte { return hexLine(b, uint64(p.vendor), 4) })
	attr("device", func(p *pciFunc, _ *fsView, b []byte) []byte { return hexLine(b, uint64(p.device), 4) })
	attr("subsystem_vendor", func(p *pciFunc, _ *fsView, b []byte) []byte { return hexLine(b, uint64(p.subVendor), 4) })
	attr("subsystem_device", func(p *pciFunc, _ *fsView, b []byte) []byte { return hexLine(b, uint64(p.subDevice), 4) })
	attr("class", func(p *pciFunc, _ *fsView, b []byte) []byte { return hexLine(b, uint64(p.class), 6) })
	attr("enable", func(_ *pciFunc, _ *fsView, b []byte) []byte { return line(b, "1") })
	attr("numa_node", func(p *pciFunc, _ *fsView, b []byte) []byte {
		_, bus, _, _ := splitBDF(p.bdf)
		if bus >= "80" {
			return line(b, "1")
		}
		return line(b, "0")
	})
	linkAttr := func(name string, r func(p *pciFunc, v *fsView, b []byte) []byte) {
		attr(name, func(p *pciFunc, v *fsView, b []byte) []byte {
			if p.gen == 0 { // no PCIe capability: the kernel prints this
				return line(b, "Unknown")
			}
			return r(p, v, b)
		})
	}
	linkAttr("max_link_speed", func(p *pciFunc, _ *fsView, b []byte) []byte { return line(b, pcieSpeed(p.gen)) })
	linkAttr("current_link_speed", func(p *pciFunc, _ *fsView, b []byte) []byte { return line(b, pcieSpeed(p.gen)) })
	linkAttr("max_link_width", func(p *pciFunc, _ *fsView, b []byte) []byte { return uintLine(b, uint64(p.width)) })
	linkAttr("current_link_width", func(p *pciFunc, v *fsView, b []byte) []byte {
		if p.gpu >= 0 {
			return uintLine(b, uint64(v.n.gpuWidth(p.gpu, v.f.v)))
		}
		return uintLine(b, uint64(p.width))
	})
	attr("uevent", func(p *pciFunc, _ *fsView, b []byte) []byte {
		if p.driver != "" {
			b = append(b, "DRIVER="+p.driver+"\n"...)
		}
		return fmt.Appendf(b, "PCI_CLASS=%X\nPCI_ID=%04X:%04X\nPCI_SUBSYS_ID=%04X:%04X\nPCI_SLOT_NAME=%s\nMODALIAS=pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X\n",
			p.class, p.vendor, p.device, p.subVendor, p.subDevice, p.bdf,
			p.vendor, p.device, p.subVendor, p.subDevice, p.class>>16, (p.class>>8)&0xff, p.class&0xff)
	})

	drivers := root.mkdirAll("sys/bus/pci/drivers")
	devices := root.mkdirAll("sys/bus/pci/devices")
	devDirs := make(map[string]*fsNode, len(funcs))
	devPaths := make(map[string]string, len(funcs))
	for i := range funcs {
		p := &funcs[i]
		parent := root.mkdirAll(p.devDir[:strings.LastIndexByte(p.devDir, '/')])
		d := parent.add(newDir(p.bdf, i))
		d.children = append(d.children, pciAttrs...)
		if p.driver != "" {
			d.link("driver", "../../../../bus/pci/drivers/"+p.driver)
			drivers.dir(p.driver).link(p.bdf, "../../../../"+strings.TrimPrefix(p.devDir, "sys/"))
		}
		devices.link(p.bdf, "../../../"+strings.TrimPrefix(p.devDir, "sys/"))
		devDirs[p.bdf] = d
		devPaths[p.bdf] = p.devDir
	}

	// InfiniBand: one shared port subtree; the device directory says which HCA.
	port := newDir("1", -1)
	port.file("state", func(v *fsView, h int, b []byte) []byte {
		if v.f.v.hcas[h].down {
			return line(b, "1: DOWN")
		}
		return line(b, "4: ACTIVE")
	})
	port.file("phys_state", func(v *fsView, h int, b []byte) []byte {
		if v.f.v.hcas[h].down {
			return line(b, "3: Disabled")
		}
		return line(b, "5: LinkUp")
	})
	port.file("rate", func(v *fsView, h int, b []byte) []byte {
		hf := v.f.v.hcas[h]
		switch {
		case hf.down:
			return line(b, ibRateText(10))
		case hf.rate > 0:
			return line(b, ibRateText(hf.rate))
		}
		return line(b, ibRateText(v.n.spec.HCAs[h].RateGbps))
	})
	port.file("link_layer", specLine(func(s *Spec, h int) string { return s.HCAs[h].LinkLayer }))
	ctr := port.dir("counters")
	for _, name := range ibCounters() {
		ctr.file(name, func(v *fsView, h int, b []byte) []byte { return uintLine(b, v.counter(h, name)) })
	}
	hw := port.dir("hw_counters")
	for _, name := range ibHWCounters() {
		hw.file(name, func(v *fsView, h int, b []byte) []byte { return uintLine(b, v.hwCounter(h, name)) })
	}
	guid := func(v *fsView, h int, b []byte) []byte { return line(b, guidText(v.n.hcas[h].guid)) }
	hcaFiles := []*fsNode{
		{name: "hca_type", kind: kindFile, owner: -1, render: specLine(func(s *Spec, h int) string { return s.HCAs[h].Model })},
		{name: "fw_ver", kind: kindFile, owner: -1, render: specLine(func(s *Spec, h int) string { return s.HCAs[h].FWVersion })},
		{name: "board_id", kind: kindFile, owner: -1, render: specLine(func(s *Spec, h int) string { return s.HCAs[h].BoardID })},
		{name: "node_type", kind: kindFile, owner: -1, render: func(_ *fsView, _ int, b []byte) []byte { return line(b, "1: CA") }},
		{name: "node_guid", kind: kindFile, owner: -1, render: guid},
		{name: "sys_image_guid", kind: kindFile, owner: -1, render: guid},
	}
	ports := newDir("ports", -1)
	ports.children = []*fsNode{port}
	// A host without RDMA adapters has no /sys/class/infiniband at all.
	var class *fsNode
	if len(s.HCAs) > 0 {
		class = root.mkdirAll("sys/class/infiniband")
	}
	for h, hc := range s.HCAs {
		pd := devDirs[hc.BusID]
		ibd := pd.dir("infiniband").add(newDir(hc.Name, h))
		ibd.children = append(ibd.children, hcaFiles...)
		ibd.children = append(ibd.children, ports)
		ibd.link("device", "../../../"+hc.BusID)
		class.link(hc.Name, "../../"+strings.TrimPrefix(devPaths[hc.BusID], "sys/")+"/infiniband/"+hc.Name)
	}

	// /proc
	proc := root.dir("proc")
	procFile := func(d *fsNode, name string, r renderFunc) {
		d.add(&fsNode{name: name, kind: kindFile, owner: -1, render: r, proc: true})
	}
	procFile(proc, "uptime", func(v *fsView, _ int, b []byte) []byte {
		up := v.f.uptime().Seconds()
		b = strconv.AppendFloat(b, up, 'f', 2, 64)
		b = append(b, ' ')
		return line(strconv.AppendFloat(b, up*float64(v.n.spec.CPUs)*0.97, 'f', 2, 64), "")
	})
	procFile(proc, "modules", func(v *fsView, _ int, b []byte) []byte { return v.n.appendModules(b, v.f.v) })
	procFile(root.mkdirAll("proc/sys/kernel"), "osrelease", specLine(func(s *Spec, _ int) string { return s.Kernel }))
	if len(s.GPUs) > 0 {
		procFile(root.mkdirAll("proc/driver/nvidia"), "version", func(v *fsView, _ int, b []byte) []byte {
			b = fmt.Appendf(b, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  %s\n", v.f.driver, v.n.spec.DriverBuildDate)
			return append(b, "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04) \n"...)
		})
	}
	t := &fsTree{root: root}
	t.finish()
	return t
}

func guidText(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, (g>>32)&0xffff, (g>>16)&0xffff, g&0xffff)
}

// counter is a counters/ file of HCA h at the view's time: traffic grows
// with the time the port was up; lifetime error counts stay put.
func (v *fsView) counter(h int, name string) uint64 {
	info := &v.n.hcas[h]
	busy, downs := v.n.portTraffic(h, v.f)
	sec := busy.Seconds()
	rcv := info.wordsPerSec * sec
	xmit := rcv * info.xmitRatio
	// ~2900-byte average packets: 726 words per packet, as on the real port.
	switch name {
	case "port_rcv_data":
		return uint64(rcv)
	case "port_xmit_data":
		return uint64(xmit)
	case "port_rcv_packets", "unicast_rcv_packets":
		return uint64(rcv / 726)
	case "port_xmit_packets", "unicast_xmit_packets":
		return uint64(xmit / 726)
	case "port_xmit_wait":
		return uint64(info.waitPerSec * sec)
	case "port_rcv_errors":
		return info.rcvErrors
	case "excessive_buffer_overrun_errors":
		return info.overrun
	case "port_rcv_switch_relay_errors":
		return info.relay
	case "link_downed":
		return downs
	case "symbol_error":
		return v.symbol(h)
	}
	return 0
}

func (v *fsView) hwCounter(h int, name string) uint64 {
	info := &v.n.hcas[h]
	busy, _ := v.n.portTraffic(h, v.f)
	sec := busy.Seconds()
	switch name {
	case "lifespan":
		return 12
	case "roce_adp_retrans":
		return info.retrans
	case "rx_dct_connect":
		return uint64(info.dctPerSec * sec)
	case "rx_read_requests":
		return uint64(info.readPerSec * sec)
	case "rx_write_requests":
		return uint64(info.writePerSec * sec)
	}
	return 0
}

// module is one /proc/modules line; users are the modules that use it.
type module struct {
	name  string
	size  int
	refs  int // references beyond the using modules (open devices)
	users []string
	taint string
}

// appendModules renders /proc/modules for the node's hardware.
func (n *Node) appendModules(b []byte, v *view) []byte {
	s := &n.spec
	gpu := len(s.GPUs) > 0
	ib := len(s.HCAs) > 0
	peermem := gpu && ib && s.PeerMem && !v.peermemMissing
	var mods []module
	add := func(m module) { mods = append(mods, m) }
	if peermem {
		add(module{name: "nvidia_peermem", size: 16384, taint: " (OE)"})
	}
	if gpu {
		add(module{name: "nvidia_uvm", size: 1531904, refs: 4, taint: " (OE)"})
		add(module{name: "nvidia_drm", size: 77824, taint: " (OE)"})
		add(module{name: "nvidia_modeset", size: 1306624, users: []string{"nvidia_drm"}, taint: " (OE)"})
		nv := module{name: "nvidia", size: 56778752, refs: 12 * len(s.GPUs), taint: " (OE)"}
		if peermem {
			nv.users = append(nv.users, "nvidia_peermem")
		}
		nv.users = append(nv.users, "nvidia_uvm", "nvidia_modeset")
		add(nv)
	}
	if ib {
		add(module{name: "ib_ipoib", size: 135168, taint: " (OE)"})
		add(module{name: "ib_umad", size: 24576, taint: " (OE)"})
		add(module{name: "rdma_ucm", size: 28672, taint: " (OE)"})
		add(module{name: "rdma_cm", size: 122880, users: []string{"rdma_ucm"}, taint: " (OE)"})
		add(module{name: "iw_cm", size: 49152, users: []string{"rdma_cm"}, taint: " (OE)"})
		add(module{name: "ib_cm", size: 131072, users: []string{"ib_ipoib", "rdma_cm"}, taint: " (OE)"})
		add(module{name: "mlx5_ib", size: 471040, taint: " (OE)"})
		uv := module{name: "ib_uverbs", size: 151552, users: []string{"rdma_ucm", "mlx5_ib"}, taint: " (OE)"}
		core := module{name: "ib_core", size: 438272, users: []string{"ib_ipoib", "ib_umad", "rdma_ucm", "rdma_cm", "iw_cm", "ib_cm", "mlx5_ib", "ib_uverbs"}, taint: " (OE)"}
		if peermem {
			uv.users = append([]string{"nvidia_peermem"}, uv.users...)
			core.users = append(core.users, "nvidia_peermem")
		}
		add(uv)
		add(core)
		add(module{name: "mlx5_core", size: 2043904, users: []string{"mlx5_ib"}, taint: " (OE)"})
		add(module{name: "mlxfw", size: 32768, users: []string{"mlx5_core"}, taint: " (OE)"})
		add(module{name: "psample", size: 20480, users: []string{"mlx5_core"}})
		add(module{name: "tls", size: 114688, users: []string{"mlx5_core"}})
	}
	add(module{name: "nvme", size: 49152, refs: 4})
	add(module{name: "nvme_core", size: 135168, refs: 4, users: []string{"nvme"}})
	for _, m := range mods {
		b = fmt.Appendf(b, "%s %d %d ", m.name, m.size, m.refs+len(m.users))
		if len(m.users) == 0 {
			b = append(b, '-')
		} else {
			for _, u := range m.users {
				b = append(append(b, u...), ',')
			}
		}
		b = append(b, " Live 0x0000000000000000"...)
		b = line(b, m.taint)
	}
	return b
}
