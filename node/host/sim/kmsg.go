package sim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// logLine is one kernel message, stamped since boot.
type logLine struct {
	at   time.Duration
	text string
}

// bootLog is what a healthy node's kernel prints while it boots: the kernel
// banner, the HCAs and the NVIDIA driver coming up.
func bootLog(s *Spec) []logLine {
	var out []logLine
	at := func(sec float64, format string, args ...any) {
		out = append(out, logLine{at: time.Duration(sec * float64(time.Second)), text: fmt.Sprintf(format, args...)})
	}
	jitter := func(what string, i int) float64 {
		return float64(hash64(s.Seed, s.Name, "klog", what, itoa(i))%100000) / 1e6
	}
	gcc := "gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0, GNU ld (GNU Binutils for Ubuntu) 2.38"
	at(0, "Linux version %s (buildd@lcy02-amd64-054) (%s) #115-Ubuntu SMP Mon Apr 15 09:52:04 UTC 2024 (Ubuntu %s)", s.Kernel, gcc, s.Kernel)
	at(0, "Command line: BOOT_IMAGE=/boot/vmlinuz-%s root=UUID=%s ro console=tty0 console=ttyS0,115200n8 iommu=pt pci=realloc=off", s.Kernel, fakeUUID(hash64(s.Seed, s.Name, "rootfs")))
	at(1.182211+jitter("pci", 0), "PCI: Using configuration type 1 for base access")
	for i, h := range s.HCAs {
		t := 2.4 + 0.11*float64(i) + jitter("mlx", i)
		at(t, "mlx5_core %s: firmware version: %s", h.BusID, h.FWVersion)
		at(t+0.000412, "mlx5_core %s: %s Gb/s available PCIe bandwidth (%s x%d link)", h.BusID, pcieBandwidth(h.PCIeGen, h.PCIeWidth), pcieSpeed(h.PCIeGen), h.PCIeWidth)
	}
	if len(s.GPUs) > 0 {
		t := 3.41 + jitter("nv", 0)
		at(t, "nvidia: loading out-of-tree module taints kernel.")
		at(t+0.000021, "nvidia: module license 'NVIDIA' taints kernel.")
		at(t+0.000023, "Disabling lock debugging due to kernel taint")
		at(t+0.688, "nvidia-nvlink: Nvlink Core is being initialized, major device number 508")
		for i, g := range s.GPUs {
			at(t+0.69+0.0021*float64(i), "nvidia %s: enabling device (0000 -> 0002)", g.BusID)
		}
		at(t+1.3, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  %s  %s", s.Driver, s.DriverBuildDate)
		at(t+1.52, "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  %s  %s", s.Driver, s.DriverBuildDate)
		for i, g := range s.GPUs {
			_, bus, _, _ := splitBDF(g.BusID)
			at(t+1.6+0.0004*float64(i), "[drm] [nvidia-drm] [GPU ID 0x0000%s00] Loading driver", strings.ToLower(bus))
		}
		at(t+2.05, "nvidia-uvm: Loaded the UVM driver, major device number 506.")
	}
	for i, h := range s.HCAs {
		_, bus, _, _ := splitBDF(h.BusID)
		b, _ := strconv.ParseUint(bus, 16, 8)
		at(9.8+0.03*float64(i)+jitter("ren", i), "mlx5_core %s ibp%ds0: renamed from ib%d", h.BusID, b, i)
	}
	slices.SortStableFunc(out, func(a, b logLine) int { return int(a.at - b.at) })
	return out
}

// pcieBandwidth is what the kernel prints as a link's usable bandwidth:
// whole Mb/s per lane after line coding, times the width.
func pcieBandwidth(gen, width int) string {
	var mbps int
	switch gen {
	case 1:
		mbps = 2000
	case 2:
		mbps = 4000
	case 3:
		mbps = 7876
	case 4:
		mbps = 15753
	default:
		mbps = 31507
	}
	t := mbps * width
	return fmt.Sprintf("%d.%03d", t/1000, t%1000)
}

func fakeUUID(h uint64) string {
	h2 := mix64(h)
	return fmt.Sprintf("%08x-%04x-%04x-%04x-%012x", uint32(h>>32), uint16(h>>16), uint16(h), uint16(h2>>48), h2&0xffffffffffff)
}

// xidLines renders an Xid event the way NVRM prints it; 79 also gets the
// driver's own "fallen off the bus" line.
func (n *Node) xidLines(x Xid) []string {
	msg, pid, proc := xidDefaults(x.Code)
	if x.Message != "" {
		msg = x.Message
	}
	if x.PID != 0 {
		pid = x.PID
	}
	if x.Process != "" {
		proc = x.Process
	}
	if pid == 0 {
		pid = 100000 + int(hash64(n.spec.Seed, n.spec.Name, "xid-pid", itoa(x.GPU))%3000000)
		if proc == "" {
			proc = "python3"
		}
	}
	bdf := n.spec.GPUs[x.GPU].BusID
	pciID := bdf[:strings.LastIndexByte(bdf, ':')+3] // "0000:19:00"
	var who string
	if pid < 0 {
		who = "pid='<unknown>', name=<unknown>, "
	} else {
		who = "pid=" + strconv.Itoa(pid) + ", name=" + proc + ", "
	}
	lines := []string{"NVRM: Xid (PCI:" + pciID + "): " + strconv.Itoa(x.Code) + ", " + who + msg}
	if x.Code == 79 {
		lines = append(lines, "NVRM: GPU "+bdf+": GPU has fallen off the bus.")
	}
	return lines
}

// renderDmesg is the kernel ring buffer as `dmesg` prints it in the spec's
// stamp format, up to the frame's time.
func (n *Node) renderDmesg(f frame) []byte {
	up := f.uptime()
	lines := slices.Clone(f.base)
	for _, e := range n.xidEntries() {
		x := e.f.(Xid)
		when := x.At
		if when.IsZero() {
			when = e.added
		}
		at := when.Sub(f.boot)
		if at < 0 {
			continue // before this boot: gone with the ring buffer
		}
		for _, t := range n.xidLines(x) {
			lines = append(lines, logLine{at: at, text: t})
		}
	}
	slices.SortStableFunc(lines, func(a, b logLine) int { return int(a.at - b.at) })
	b := make([]byte, 0, 128*len(lines))
	for _, l := range lines {
		if l.at > up {
			break
		}
		b = n.appendStamp(b, f.boot, l.at)
		b = append(b, l.text...)
		b = append(b, '\n')
	}
	return b
}

func (n *Node) appendStamp(b []byte, boot time.Time, at time.Duration) []byte {
	switch n.spec.KernelLogFormat {
	case LogCtime:
		b = append(b, '[')
		b = boot.Add(at).AppendFormat(b, "Mon Jan _2 15:04:05 2006")
		return append(b, "] "...)
	case LogISO:
		t := boot.Add(at)
		b = t.AppendFormat(b, "2006-01-02T15:04:05")
		b = append(b, ',')
		b = appendPadded(b, uint64(t.Nanosecond()/1000), 6, '0')
		b = t.AppendFormat(b, "-07:00")
		return append(b, ' ')
	default:
		us := at.Microseconds()
		b = append(b, '[')
		b = appendPadded(b, uint64(us/1e6), 5, ' ')
		b = append(b, '.')
		b = appendPadded(b, uint64(us%1e6), 6, '0')
		return append(b, "] "...)
	}
}

// appendPadded appends v right-aligned in width with pad.
func appendPadded(b []byte, v uint64, width int, pad byte) []byte {
	var tmp [20]byte
	s := strconv.AppendUint(tmp[:0], v, 10)
	for i := len(s); i < width; i++ {
		b = append(b, pad)
	}
	return append(b, s...)
}
