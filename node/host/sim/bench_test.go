package sim

import (
	"context"
	"io/fs"
	"path"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// passPaths lists what one probe pass reads from the tree: every IB port
// file, the PCI attributes of every function, and the /proc files; dirs
// are the directories a prober lists.
func passPaths(b *testing.B, fsys fs.FS) (files, dirs []string) {
	classes, err := fs.ReadDir(fsys, "sys/class/infiniband")
	if err != nil {
		b.Fatal(err)
	}
	dirs = append(dirs, "sys/class/infiniband", "sys/bus/pci/devices")
	for _, c := range classes {
		dev := path.Join("sys/class/infiniband", c.Name())
		for _, f := range []string{"hca_type", "fw_ver", "board_id"} {
			files = append(files, path.Join(dev, f))
		}
		port := path.Join(dev, "ports/1")
		for _, f := range []string{"state", "phys_state", "rate", "link_layer"} {
			files = append(files, path.Join(port, f))
		}
		for _, sub := range []string{"counters", "hw_counters"} {
			dirs = append(dirs, path.Join(port, sub))
			es, err := fs.ReadDir(fsys, path.Join(port, sub))
			if err != nil {
				b.Fatal(err)
			}
			for _, e := range es {
				files = append(files, path.Join(port, sub, e.Name()))
			}
		}
	}
	devs, err := fs.ReadDir(fsys, "sys/bus/pci/devices")
	if err != nil {
		b.Fatal(err)
	}
	for _, d := range devs {
		for _, f := range []string{"vendor", "device", "class", "current_link_width", "max_link_width", "current_link_speed", "max_link_speed"} {
			files = append(files, path.Join("sys/bus/pci/devices", d.Name(), f))
		}
	}
	return append(files, "proc/uptime", "proc/modules", "proc/driver/nvidia/version"), dirs
}

// readPass reads the listed files and directories the way the probes do
// (Open, Read into a small buffer).
func readPass(b *testing.B, fsys fs.FS, files, dirs []string, buf []byte) {
	for _, d := range dirs {
		if _, err := fs.ReadDir(fsys, d); err != nil {
			b.Fatal(err)
		}
	}
	for _, p := range files {
		f, err := fsys.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.Read(buf); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// BenchmarkPassiveNode is one passive probe pass over a node: the file tree
// plus nvidia-smi, nvlink, dmesg and versions. A 1,000-node simulated fleet
// pays this per node per pass.
func BenchmarkPassiveNode(b *testing.B) {
	n := testNode(b, nil)
	if err := n.AddFault(Xid{GPU: 2, Code: 79}); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	files, dirs := passPaths(b, n.FS())
	buf := make([]byte, 4096)
	b.ReportAllocs()
	for b.Loop() {
		readPass(b, n.FS(), files, dirs, buf)
		for _, src := range []snapshot.Source{snapshot.SrcNvidiaSMI, snapshot.SrcNVLink, snapshot.SrcKernelLog, snapshot.SrcVersions} {
			if c := n.Capture(ctx, src); c.State != snapshot.StateOK {
				b.Fatal(src, c.Err)
			}
		}
	}
}

func BenchmarkCapture(b *testing.B) {
	n := testNode(b, nil)
	ctx := context.Background()
	for _, src := range commandSources {
		b.Run(string(src), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				n.Capture(ctx, src)
			}
		})
	}
}

// BenchmarkFSPass is the file part of a pass: about 590 files and 18
// directory listings.
func BenchmarkFSPass(b *testing.B) {
	n := testNode(b, nil)
	files, dirs := passPaths(b, n.FS())
	buf := make([]byte, 4096)
	b.ReportAllocs()
	for b.Loop() {
		readPass(b, n.FS(), files, dirs, buf)
	}
	b.ReportMetric(float64(len(files)), "files/op")
}

func BenchmarkNew(b *testing.B) {
	s := DefaultSpec("gpu-017")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := New(s); err != nil {
			b.Fatal(err)
		}
	}
}
