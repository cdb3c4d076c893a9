// Package inspect is the node pipeline: read a host once into a snapshot,
// run the selected checks over it, and build the report. `run`, `analyze`,
// the agent and the simulator all go through it.
package inspect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/probe/dcgm"
	"github.com/fleetcheck/fleetcheck/node/probe/ibsysfs"
	"github.com/fleetcheck/fleetcheck/node/probe/kmsg"
	"github.com/fleetcheck/fleetcheck/node/probe/nccl"
	"github.com/fleetcheck/fleetcheck/node/probe/nvlink"
	"github.com/fleetcheck/fleetcheck/node/probe/nvsmi"
	"github.com/fleetcheck/fleetcheck/node/probe/pcisysfs"
	"github.com/fleetcheck/fleetcheck/node/probe/procfs"
)

// Want says which disruptive sources to read; passive ones are always read
// (each once per pass, whichever checks use them).
type Want struct {
	AllReduce bool
	DCGM      bool
}

// NVMLReader is implemented by hosts that can read GPUs through NVML (the
// live host). NVML is preferred over exec when the library loads.
type NVMLReader interface {
	GPUStateNVML() (*snapshot.GPUState, error)
}

// Read reads every source of h once and returns the snapshot. It never
// fails: each source's outcome is recorded in the snapshot's Sources.
func Read(ctx context.Context, h host.Host, want Want) *snapshot.Snapshot {
	s := &snapshot.Snapshot{Hostname: h.Name(), CollectedAt: h.Now()}
	fsys := h.FS()

	// File sources first: uptime is needed to place plain dmesg stamps.
	readUptime(s, fsys)
	readModules(s, fsys)
	readDriverVersion(s, fsys)
	readIB(s, fsys)
	readPCI(s, fsys)

	// Command sources run concurrently: a hung nvidia-smi must not delay dmesg.
	srcs := []snapshot.Source{snapshot.SrcNVLink, snapshot.SrcKernelLog, snapshot.SrcVersions}
	nvmlState, nvmlErr := readNVML(h)
	if nvmlState == nil {
		srcs = append(srcs, snapshot.SrcNvidiaSMI)
	}
	if want.AllReduce {
		srcs = append(srcs, snapshot.SrcAllReduce)
	}
	if want.DCGM {
		srcs = append(srcs, snapshot.SrcDCGMDiag)
	}
	caps := make([]host.Capture, len(srcs))
	var kernel *streamedLog
	var wg sync.WaitGroup
	for i, src := range srcs {
		if sh, ok := h.(host.Streamer); ok && src == snapshot.SrcKernelLog {
			// A bundle's kernel log may be hundreds of megabytes: parse it
			// as it is read instead of holding it.
			kernel = &streamedLog{}
			wg.Go(func() { caps[i] = kernel.read(ctx, sh, s.CollectedAt, s.Uptime) })
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			caps[i] = h.Capture(ctx, src)
		}()
	}
	wg.Wait()

	if nvmlState != nil {
		s.GPU = nvmlState
		s.SetSource(snapshot.SrcNvidiaSMI, snapshot.SourceState{State: snapshot.StateOK, Via: "nvml"})
	}
	for i, src := range srcs {
		c := caps[i]
		if src == snapshot.SrcNvidiaSMI && c.State == snapshot.StateAbsent && nvmlErr != nil && !errors.Is(nvmlErr, errNoNVML) {
			c.Err = nvmlErr.Error() + "; " + c.Err
		}
		if src == snapshot.SrcKernelLog && kernel != nil {
			kernel.record(s, c)
			continue
		}
		parse(s, src, c)
	}
	fillVersions(s)
	return s
}

var errNoNVML = errors.New("host has no NVML")

func readNVML(h host.Host) (*snapshot.GPUState, error) {
	r, ok := h.(NVMLReader)
	if !ok {
		return nil, errNoNVML
	}
	st, err := r.GPUStateNVML()
	if err != nil {
		return nil, err
	}
	return st, nil
}

// parse turns one capture into snapshot fields and records its state. A
// capture that does not parse is a failed source: its checks error.
func parse(s *snapshot.Snapshot, src snapshot.Source, c host.Capture) {
	st := snapshot.SourceState{State: c.State, ExitCode: c.ExitCode, Error: c.Err}
	if src == snapshot.SrcNvidiaSMI && c.State == snapshot.StateFailed {
		// nvidia-smi exits non-zero when it cannot talk to one GPU, but
		// says which, and may print the others: that is data, the lost
		// GPU a gpu.inventory failure, not an error on every GPU check.
		if g, err := nvsmi.Parse(c.Data); err == nil && len(g.Unreachable) > 0 {
			s.GPU = g
			st.State = snapshot.StateOK
			s.SetSource(src, st)
			return
		}
	}
	if c.State != snapshot.StateOK {
		s.SetSource(src, st)
		return
	}
	var err error
	switch src {
	case snapshot.SrcNvidiaSMI:
		s.GPU, err = nvsmi.Parse(c.Data)
	case snapshot.SrcNVLink:
		s.NVLink, err = nvlink.Parse(c.Data)
	case snapshot.SrcKernelLog:
		s.Kernel, err = kmsg.Parse(c.Data, s.CollectedAt, s.Uptime)
	case snapshot.SrcAllReduce:
		s.AllReduce, err = nccl.Parse(c.Data)
		if err == nil {
			s.AllReduce.ExitCode = c.ExitCode
		}
	case snapshot.SrcDCGMDiag:
		s.DCGM, err = dcgm.Parse(c.Data)
	case snapshot.SrcVersions:
		var v snapshot.Versions
		v, err = procfs.ParseVersions(c.Data)
		if err == nil {
			s.Versions = v
		}
	}
	if err != nil {
		st.State = snapshot.StateFailed
		st.Error = err.Error()
	}
	s.SetSource(src, st)
}

// streamedLog is a kernel log parsed from a stream (host.Streamer).
type streamedLog struct {
	log *snapshot.KernelLog
	err error
}

func (k *streamedLog) read(ctx context.Context, h host.Streamer, collectedAt time.Time, uptime time.Duration) host.Capture {
	rc, c := h.CaptureStream(ctx, snapshot.SrcKernelLog)
	if rc == nil {
		rc = io.NopCloser(strings.NewReader("")) // ok and empty: a log of no lines
	}
	defer func() { _ = rc.Close() }() // a reader: nothing to lose on close
	if c.State == snapshot.StateOK {
		k.log, k.err = kmsg.ParseReader(rc, collectedAt, uptime)
	}
	return c
}

// record is parse for a streamed log: a read that failed half way is a
// failed source, like a parse error.
func (k *streamedLog) record(s *snapshot.Snapshot, c host.Capture) {
	st := snapshot.SourceState{State: c.State, ExitCode: c.ExitCode, Error: c.Err}
	if c.State == snapshot.StateOK {
		if k.err != nil {
			st.State, st.Error = snapshot.StateFailed, k.err.Error()
		} else {
			s.Kernel = k.log
		}
	}
	s.SetSource(snapshot.SrcKernelLog, st)
}

func readUptime(s *snapshot.Snapshot, fsys fs.FS) {
	data, err := fs.ReadFile(fsys, "proc/uptime")
	if err != nil {
		s.SetSource(snapshot.SrcUptime, fileAbsentOrFailed("/proc/uptime", err))
		return
	}
	d, err := procfs.ParseUptime(data)
	if err != nil {
		s.SetSource(snapshot.SrcUptime, snapshot.SourceState{State: snapshot.StateFailed, Error: err.Error()})
		return
	}
	s.Uptime = d
	s.SetSource(snapshot.SrcUptime, snapshot.SourceState{State: snapshot.StateOK})
}

func readModules(s *snapshot.Snapshot, fsys fs.FS) {
	data, err := fs.ReadFile(fsys, "proc/modules")
	if err != nil {
		s.SetSource(snapshot.SrcModules, fileAbsentOrFailed("/proc/modules", err))
		return
	}
	mods, err := procfs.ParseModules(data)
	if err != nil {
		s.SetSource(snapshot.SrcModules, snapshot.SourceState{State: snapshot.StateFailed, Error: err.Error()})
		return
	}
	if mods == nil {
		mods = []string{}
	}
	s.Modules = mods
	s.SetSource(snapshot.SrcModules, snapshot.SourceState{State: snapshot.StateOK})
}

func readDriverVersion(s *snapshot.Snapshot, fsys fs.FS) {
	data, err := fs.ReadFile(fsys, "proc/driver/nvidia/version")
	if err != nil {
		s.SetSource(snapshot.SrcDriver, fileAbsentOrFailed("/proc/driver/nvidia/version", err))
		return
	}
	v, err := procfs.ParseDriverVersion(data)
	if err != nil {
		s.SetSource(snapshot.SrcDriver, snapshot.SourceState{State: snapshot.StateFailed, Error: err.Error()})
		return
	}
	s.Versions.Driver = v
	s.SetSource(snapshot.SrcDriver, snapshot.SourceState{State: snapshot.StateOK})
}

func readIB(s *snapshot.Snapshot, fsys fs.FS) {
	hcas, err := ibsysfs.Read(fsys)
	switch {
	case errors.Is(err, ibsysfs.ErrNoInfiniBand):
		s.SetSource(snapshot.SrcInfiniBand, snapshot.SourceState{State: snapshot.StateAbsent, Error: "no /sys/class/infiniband"})
	case err != nil:
		s.SetSource(snapshot.SrcInfiniBand, snapshot.SourceState{State: snapshot.StateFailed, Error: err.Error()})
	default:
		s.HCAs = hcas
		s.SetSource(snapshot.SrcInfiniBand, snapshot.SourceState{State: snapshot.StateOK})
	}
}

func readPCI(s *snapshot.Snapshot, fsys fs.FS) {
	devs, err := pcisysfs.Read(fsys)
	switch {
	case errors.Is(err, pcisysfs.ErrNoPCI):
		s.SetSource(snapshot.SrcPCI, snapshot.SourceState{State: snapshot.StateAbsent, Error: "no /sys/bus/pci/devices"})
	case err != nil && devs == nil:
		s.SetSource(snapshot.SrcPCI, snapshot.SourceState{State: snapshot.StateFailed, Error: err.Error()})
	default:
		// Partial data (some attribute files unreadable) is still data: the
		// unreadable fields stay unknown and the error is kept as a note.
		s.PCI = devs
		st := snapshot.SourceState{State: snapshot.StateOK}
		if err != nil {
			st.Error = err.Error()
		}
		s.SetSource(snapshot.SrcPCI, st)
	}
}

func fileAbsentOrFailed(name string, err error) snapshot.SourceState {
	if errors.Is(err, fs.ErrNotExist) {
		return snapshot.SourceState{State: snapshot.StateAbsent, Error: "no " + name}
	}
	return snapshot.SourceState{State: snapshot.StateFailed, Error: fmt.Sprintf("read %s: %v", name, err)}
}

// fillVersions fills versions that other sources know better or only.
func fillVersions(s *snapshot.Snapshot) {
	if s.GPU != nil {
		if s.GPU.DriverVersion != "" {
			s.Versions.Driver = s.GPU.DriverVersion
		}
		if s.Versions.CUDA == "" {
			s.Versions.CUDA = s.GPU.CUDAVersion
		}
	}
	if s.AllReduce != nil && s.Versions.NCCL == "" {
		s.Versions.NCCL = s.AllReduce.NCCLVersion
	}
	if s.DCGM != nil && s.Versions.DCGM == "" {
		s.Versions.DCGM = s.DCGM.Version
	}
}

// now returns the snapshot's time, or the wall clock for a bundle that
// does not say when it was taken.
func now(s *snapshot.Snapshot) time.Time {
	if s.CollectedAt.IsZero() {
		return time.Now()
	}
	return s.CollectedAt
}
