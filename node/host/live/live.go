// Package live is the real machine: files under a root (default "/") and
// the real tools (nvidia-smi, dmesg, all_reduce_perf, dcgmi), each run in its
// own process group with a deadline, never twice at once.
package live

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/runcmd"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/host/safefs"
)

// Host is the live machine.
type Host struct {
	name  string
	root  string
	fsys  fs.FS
	tools config.Tools
	// GPUCount is passed to all_reduce_perf's -g when the arguments do not say.
	gpuCount int
	guard    runcmd.Guard
	nvml     nvmlHandle
}

var _ host.Host = (*Host)(nil)

// New returns the live host reading files under root ("/" normally).
func New(root string, tools config.Tools) (*Host, error) {
	name, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("hostname: %w", err)
	}
	if root == "" {
		root = "/"
	}
	return &Host{name: name, root: root, fsys: safefs.NewDirFS(root, MaxFileBytes), tools: tools}, nil
}

// MaxFileBytes bounds one read of a /proc or /sys file. Their values are
// a few bytes to a few KiB; the bound keeps a binary attribute (a PCI
// BAR's resource file is as large as the BAR) out of memory. Files are
// opened only when they are regular files or directories (package safefs):
// a pipe or a device node under the root never hangs a probe or collect.
const MaxFileBytes = 4 << 20

// SetGPUCount tells the host how many GPUs all_reduce_perf should use.
func (h *Host) SetGPUCount(n int) { h.gpuCount = n }

// Name is the hostname.
func (h *Host) Name() string { return h.name }

// Now is the wall clock.
func (h *Host) Now() time.Time { return time.Now() }

// FS is the file tree under the root.
func (h *Host) FS() fs.FS { return h.fsys }

// Capture runs the tool behind src.
func (h *Host) Capture(ctx context.Context, src snapshot.Source) host.Capture {
	timeout := h.tools.Timeout.D(30 * time.Second)
	switch src {
	case snapshot.SrcNvidiaSMI:
		return h.run(ctx, src, spec(or(h.tools.NvidiaSMI, "nvidia-smi"), timeout, "-q", "-x"))
	case snapshot.SrcNVLink:
		st := h.run(ctx, src, spec(or(h.tools.NvidiaSMI, "nvidia-smi"), timeout, "nvlink", "--status"))
		if st.State != snapshot.StateOK {
			return st
		}
		// Error counters follow the status in the same source; a driver
		// without `-e` still gives a usable status.
		if e := h.run(ctx, src, spec(or(h.tools.NvidiaSMI, "nvidia-smi"), timeout, "nvlink", "-e")); e.State == snapshot.StateOK {
			st.Data = append(st.Data, e.Data...)
		}
		return st
	case snapshot.SrcKernelLog:
		return h.kernelLog(ctx, timeout)
	case snapshot.SrcAllReduce:
		return h.allReduce(ctx)
	case snapshot.SrcDCGMDiag:
		level := strconv.Itoa(max(h.tools.DCGMLevel, 1))
		if l, ok := host.ParamsFrom(ctx)["level"]; ok {
			level = l // validated by the agent: 1..4
		}
		c := h.run(ctx, src, spec(or(h.tools.DCGMI, "dcgmi"), h.tools.DCGMTimeout.D(15*time.Minute), "diag", "-r", level, "-j"))
		// 226: the diagnostic ran and found a failure; its JSON says which.
		if c.State == snapshot.StateFailed && c.ExitCode == 226 && len(c.Data) > 0 {
			c.State = snapshot.StateOK
			c.Err = ""
		}
		return c
	case snapshot.SrcVersions:
		return h.versions(ctx, timeout)
	}
	return host.Absent(fmt.Sprintf("%s is not a command source", src))
}

func (h *Host) run(ctx context.Context, src snapshot.Source, s runcmd.Spec) host.Capture {
	r := h.guard.Run(ctx, string(src)+" "+s.Path+" "+strings.Join(s.Args, " "), s)
	return toCapture(s, r)
}

func toCapture(s runcmd.Spec, r runcmd.Result) host.Capture {
	name := s.Path
	switch {
	case r.NotFound:
		return host.Absent(name + " not found")
	case r.TimedOut:
		msg := fmt.Sprintf("%s timed out after %s", name, s.Timeout)
		if r.Err != nil {
			msg = fmt.Sprintf("%s: %v", name, r.Err)
		}
		return host.Capture{Data: r.Stdout, State: snapshot.StateTimeout, ExitCode: r.ExitCode, Err: msg}
	case r.Err != nil || r.ExitCode != 0:
		msg := fmt.Sprintf("%s exited %d", name, r.ExitCode)
		if r.Err != nil {
			msg = fmt.Sprintf("%s: %v", name, r.Err)
		}
		if tail := lastLine(r.Stderr); tail != "" {
			msg += ": " + tail
		}
		return host.Capture{Data: r.Stdout, State: snapshot.StateFailed, ExitCode: r.ExitCode, Err: msg}
	}
	return host.OK(r.Stdout)
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

func spec(path string, timeout time.Duration, args ...string) runcmd.Spec {
	return runcmd.Spec{Path: path, Args: args, Timeout: timeout, Env: []string{"LC_ALL=C"}}
}

func or(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// kernelLog prefers dmesg with ISO stamps (wall time without knowing the
// boot time), then plain dmesg, then /dev/kmsg (dmesg can be restricted to
// root by kernel.dmesg_restrict while /dev/kmsg follows the same rule; the
// fallback matters when the dmesg binary itself is missing).
func (h *Host) kernelLog(ctx context.Context, timeout time.Duration) host.Capture {
	bin := or(h.tools.Dmesg, "dmesg")
	c := h.run(ctx, snapshot.SrcKernelLog, spec(bin, timeout, "--time-format", "iso"))
	if c.State == snapshot.StateOK || c.State == snapshot.StateTimeout {
		return c
	}
	if c.State == snapshot.StateFailed {
		if p := h.run(ctx, snapshot.SrcKernelLog, spec(bin, timeout)); p.State == snapshot.StateOK {
			return p
		}
	}
	data, err := readKmsg(filepath.Join(h.root, "dev/kmsg"), 16<<20)
	if err != nil {
		if c.State == snapshot.StateAbsent {
			return host.Absent("dmesg not found and /dev/kmsg unreadable: " + err.Error())
		}
		return c
	}
	return host.OK(data)
}

// readKmsg drains /dev/kmsg without blocking: each read returns one record,
// EAGAIN means the end of the buffer.
func readKmsg(path string, max int) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = syscall.Close(fd) }() // read-only descriptor
	var out bytes.Buffer
	buf := make([]byte, 8192)
	for out.Len() < max {
		n, err := syscall.Read(fd, buf)
		if err != nil {
			if errors.Is(err, syscall.EAGAIN) {
				break
			}
			if errors.Is(err, syscall.EPIPE) { // record overwritten while reading: go on
				continue
			}
			return nil, err
		}
		if n <= 0 {
			break
		}
		out.Write(buf[:n])
		if buf[n-1] != '\n' {
			out.WriteByte('\n')
		}
	}
	return out.Bytes(), nil
}

func (h *Host) allReduce(ctx context.Context) host.Capture {
	bin := or(h.tools.AllReducePerf, "all_reduce_perf")
	args := h.tools.AllReduceArgs
	if len(args) == 0 {
		g := h.gpuCount
		if g <= 0 {
			g = 8
		}
		args = []string{"-b", "8", "-e", "8G", "-f", "2", "-g", strconv.Itoa(g)}
	}
	if p := host.ParamsFrom(ctx); len(p) > 0 {
		args = allReduceArgs(args, p)
	}
	path := bin
	if len(h.tools.Launcher) > 0 {
		path = h.tools.Launcher[0]
		args = append(append(append([]string{}, h.tools.Launcher[1:]...), bin), args...)
	}
	s := runcmd.Spec{Path: path, Args: args, Timeout: h.tools.NCCLTimeout.D(10 * time.Minute),
		Env: []string{"LC_ALL=C", "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET"}}
	c := toCapture(s, h.guard.Run(ctx, string(snapshot.SrcAllReduce), s))
	// A failed run still prints what failed (NCCL failure lines, #wrong):
	// that is the evidence, so hand it to the parser.
	if c.State == snapshot.StateFailed && len(c.Data) > 0 {
		c.State = snapshot.StateOK
		c.Err = ""
	}
	return c
}

// versions gathers what versions.json holds in a bundle.
func (h *Host) versions(ctx context.Context, timeout time.Duration) host.Capture {
	v := map[string]string{}
	if b, err := fs.ReadFile(h.fsys, "proc/sys/kernel/osrelease"); err == nil {
		v["kernel"] = strings.TrimSpace(string(b))
	}
	if c := h.run(ctx, snapshot.SrcVersions, spec("nv-fabricmanager", timeout, "--version")); c.State == snapshot.StateOK {
		if ver := afterColon(string(c.Data)); ver != "" {
			v["fabric_manager"] = ver
		}
	}
	if c := h.run(ctx, snapshot.SrcVersions, spec("ofed_info", timeout, "-s")); c.State == snapshot.StateOK {
		s := strings.TrimSuffix(strings.TrimSpace(string(c.Data)), ":")
		if rest, ok := strings.CutPrefix(s, "MLNX_OFED_LINUX-"); ok {
			v["rdma_stack"] = "MLNX_OFED " + rest
		} else if rest, ok := strings.CutPrefix(s, "OFED-internal-"); ok {
			v["rdma_stack"] = "DOCA " + rest
		} else if s != "" {
			v["rdma_stack"] = s
		}
	}
	data, err := json.Marshal(v)
	if err != nil {
		return host.Capture{State: snapshot.StateFailed, Err: err.Error()}
	}
	return host.OK(data)
}

// afterColon returns the text after the last colon of the first line
// ("Fabric Manager version is : 535.161.08" → "535.161.08").
func afterColon(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	if i := strings.LastIndexByte(line, ':'); i >= 0 {
		return strings.TrimSpace(line[i+1:])
	}
	return ""
}
