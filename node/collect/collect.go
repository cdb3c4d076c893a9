// Package collect captures a support bundle of a host: the raw outputs of
// its tools and the /proc and /sys files the probes read, with a manifest
// that records how each source went. A hung nvidia-smi is recorded as a
// timeout (evidence); a tool the host does not have is simply absent.
package collect

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
)

// Options choose the optional, disruptive sources.
type Options struct {
	AllReduce bool // run all_reduce_perf (takes the GPUs for a while)
	DCGM      bool // run dcgmi diag
	Version   string
}

// Summary says what was captured.
type Summary struct {
	Files   int
	Bytes   int64
	Sources map[snapshot.Source]snapshot.SourceState
}

// maxTreeFiles bounds how many files one sysfs tree contributes: a broken
// sysfs (loops through symlinks) must not make collect run forever.
const maxTreeFiles = 20000

// Collect writes a bundle of h into w and closes nothing: the caller closes w.
func Collect(ctx context.Context, h host.Host, w *bundle.Writer, opts Options) (Summary, error) {
	sum := Summary{Sources: map[snapshot.Source]snapshot.SourceState{}}
	add := func(name string, data []byte) error {
		sum.Files++
		sum.Bytes += int64(len(data))
		return w.AddFile(name, data)
	}
	srcs := []snapshot.Source{snapshot.SrcNvidiaSMI, snapshot.SrcNVLink, snapshot.SrcKernelLog, snapshot.SrcVersions}
	if opts.AllReduce {
		srcs = append(srcs, snapshot.SrcAllReduce)
	}
	if opts.DCGM {
		srcs = append(srcs, snapshot.SrcDCGMDiag)
	}
	for _, src := range srcs {
		c := h.Capture(ctx, src)
		st := snapshot.SourceState{State: c.State, ExitCode: c.ExitCode, Error: c.Err}
		if c.State == snapshot.StateAbsent {
			// What the host does not have is simply absent, but the reason
			// ("nvidia-smi not found") is worth keeping.
			sum.Sources[src] = st
			continue
		}
		sum.Sources[src] = st
		if len(c.Data) > 0 || c.State == snapshot.StateOK {
			if err := add(string(src), c.Data); err != nil {
				return sum, err
			}
		}
	}
	fsys := h.FS()
	for _, f := range []string{"proc/uptime", "proc/modules", "proc/driver/nvidia/version", "proc/sys/kernel/osrelease"} {
		data, err := fs.ReadFile(fsys, f)
		if err != nil {
			continue
		}
		if err := add("fs/"+f, data); err != nil {
			return sum, err
		}
	}
	if err := copyTree(fsys, "sys/class/infiniband", add); err != nil {
		return sum, err
	}
	if err := copyPCI(fsys, add); err != nil {
		return sum, err
	}
	at := h.Now()
	if at.IsZero() {
		at = time.Now()
	}
	m := bundle.Manifest{
		Hostname:          h.Name(),
		CollectedAt:       at.Format(time.RFC3339), // local offset: dmesg -T stamps are local time
		FleetcheckVersion: opts.Version,
		Sources:           sum.Sources,
	}
	if err := w.WriteManifest(m); err != nil {
		return sum, err
	}
	return sum, nil
}

// copyTree copies a sysfs class tree, following the symlinks sysfs is made
// of (fs.Stat, not the dir entry's type) but never more than three levels of
// device directories below the class, so loops cannot run away.
func copyTree(fsys fs.FS, root string, add func(string, []byte) error) error {
	if _, err := fs.Stat(fsys, root); err != nil {
		return nil
	}
	count := 0
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		entries, err := fs.ReadDir(fsys, dir)
		if err != nil {
			return nil
		}
		for _, e := range entries {
			p := path.Join(dir, e.Name())
			st, err := fs.Stat(fsys, p)
			if err != nil {
				continue
			}
			if st.IsDir() {
				// Only the parts probes read: device attributes and ports.
				if depth >= 4 || skipDir(root, p) {
					continue
				}
				if err := walk(p, depth+1); err != nil {
					return err
				}
				continue
			}
			if count >= maxTreeFiles {
				return nil
			}
			data, err := fs.ReadFile(fsys, p)
			if err != nil {
				// Unreadable counters exist (ConnectX-7 hw_counters): skip.
				continue
			}
			count++
			if err := add("fs/"+p, data); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(root, 0)
}

// skipDir keeps the IB tree to what the probes read.
func skipDir(root, p string) bool {
	rel := strings.TrimPrefix(p, root+"/")
	parts := strings.Split(rel, "/")
	if len(parts) == 2 { // <dev>/<sub>
		return parts[1] != "ports"
	}
	if len(parts) == 4 { // <dev>/ports/<n>/<sub>
		return parts[3] != "counters" && parts[3] != "hw_counters"
	}
	return false
}

// pciFiles are the attributes gpu.inventory and gpu.pcie read.
var pciFiles = []string{"vendor", "device", "class", "current_link_width", "max_link_width", "current_link_speed", "max_link_speed"}

// copyPCI copies the attributes of NVIDIA and Mellanox functions, and the
// bound driver's name as a plain file (the link itself would point out of
// the bundle).
func copyPCI(fsys fs.FS, add func(string, []byte) error) error {
	const dir = "sys/bus/pci/devices"
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil
	}
	for _, e := range entries {
		base := path.Join(dir, e.Name())
		vendor, err := fs.ReadFile(fsys, path.Join(base, "vendor"))
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(vendor))
		if v != "0x10de" && v != "0x15b3" {
			continue
		}
		for _, f := range pciFiles {
			data, err := fs.ReadFile(fsys, path.Join(base, f))
			if err != nil {
				continue
			}
			if err := add("fs/"+path.Join(base, f), data); err != nil {
				return err
			}
		}
		if name, err := driverName(fsys, path.Join(base, "driver")); err == nil && name != "" {
			if err := add("fs/"+path.Join(base, "driver"), []byte(name+"\n")); err != nil {
				return err
			}
		}
	}
	return nil
}

func driverName(fsys fs.FS, p string) (string, error) {
	if rl, ok := fsys.(fs.ReadLinkFS); ok {
		target, err := rl.ReadLink(p)
		if err == nil {
			return path.Base(target), nil
		}
	}
	data, err := fs.ReadFile(fsys, p)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

// DefaultPath is ./HOST-TIME.tar.gz.
func DefaultPath(hostname string, at time.Time) string {
	return fmt.Sprintf("%s-%s.tar.gz", hostname, at.UTC().Format("20060102T150405Z"))
}
