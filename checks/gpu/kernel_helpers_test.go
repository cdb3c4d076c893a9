package gpu

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// now is the run time every test judges against.
var now = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

// busIDs are eight H100 GPUs' addresses in nvidia-smi order.
var busIDs = []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
	"0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"}

// h100Node is a healthy 8-GPU snapshot with the kernel log, nvidia-smi and
// NVLink sources ok and no events.
func h100Node() *snapshot.Snapshot {
	s := &snapshot.Snapshot{Hostname: "gpu-017", CollectedAt: now, Uptime: 30 * 24 * time.Hour}
	s.GPU = &snapshot.GPUState{DriverVersion: "535.161.08", CUDAVersion: "12.2", AttachedGPUs: 8}
	for i, b := range busIDs {
		s.GPU.GPUs = append(s.GPU.GPUs, snapshot.GPU{Index: i, Name: "NVIDIA H100 80GB HBM3", Architecture: "Hopper",
			PCIBusID: b, Fabric: &snapshot.Fabric{State: "Completed", Status: "Success"}})
	}
	s.Kernel = &snapshot.KernelLog{Lines: 1000}
	s.SetSource(snapshot.SrcKernelLog, snapshot.SourceState{State: snapshot.StateOK})
	s.SetSource(snapshot.SrcNvidiaSMI, snapshot.SourceState{State: snapshot.StateOK})
	return s
}

// xidEvent builds an Xid line's event on the GPU at bus (short form as the
// driver prints it), ago before now; ago < 0 leaves the time unknown.
func xidEvent(code int, bus string, ago time.Duration, msg string) snapshot.KernelEvent {
	e := snapshot.KernelEvent{Kind: snapshot.EventXid, Code: code, PCIBusID: bus, Message: msg}
	stamp := ""
	if ago >= 0 {
		e.Time = now.Add(-ago)
		stamp = "[" + e.Time.Format(time.ANSIC) + "] "
	}
	e.Raw = fmt.Sprintf("%sNVRM: Xid (PCI:%s): %d, %s", stamp, strings.TrimSuffix(bus, ".0"), code, msg)
	return e
}

func resetEvent(bus string, ago time.Duration) snapshot.KernelEvent {
	e := snapshot.KernelEvent{Kind: snapshot.EventGPUReset, PCIBusID: bus, Time: now.Add(-ago)}
	e.Raw = fmt.Sprintf("[%s] NVRM: GPU at PCI:%s: GPU-x", e.Time.Format(time.ANSIC), bus)
	return e
}

func run(c checks.Check, snap *snapshot.Snapshot, cfg *config.Config, prev *checks.State) report.CheckResult {
	out := checks.Run([]checks.Check{c}, checks.Input{Snap: snap, Config: cfg, Prev: prev, Now: now})
	return out[0]
}

// codes lists findings as "CODE component severity action", in report order.
func codes(r report.CheckResult) []string {
	var out []string
	for _, f := range r.Findings {
		out = append(out, fmt.Sprintf("%s %s %s %s", f.Code, f.Component, f.Severity, f.Action))
	}
	return out
}

func wantResult(t *testing.T, r report.CheckResult, status report.Status, want ...string) {
	t.Helper()
	if r.Status != status {
		t.Errorf("status = %s, want %s (reason %q, findings %v)", r.Status, status, r.Reason, codes(r))
	}
	got := codes(r)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("findings:\n got %q\nwant %q", got, want)
	}
	for _, f := range r.Findings {
		if f.Message == "" || f.Component == "" {
			t.Errorf("finding without message or component: %+v", f)
		}
	}
}

func ptr[T any](v T) *T { return &v }
