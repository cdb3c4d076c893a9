package gpu

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/probe/kmsg"
)

func TestXid(t *testing.T) {
	t.Parallel()
	const gpu0, gpu1, gpu3 = "0000:18:00.0", "0000:2a:00.0", "0000:5d:00.0"
	hour := time.Hour
	override := func(code int, action string) *config.Config {
		c := config.Defaults()
		c.Xid.Overrides = map[int]string{code: action}
		return c
	}
	tests := []struct {
		name    string
		events  []snapshot.KernelEvent
		cfg     *config.Config
		prev    *checks.State
		status  report.Status
		want    []string
		metrics map[string]float64
	}{
		{
			name:    "clean log",
			status:  report.Pass,
			metrics: map[string]float64{"xid.event_count": 0},
		},
		{
			name:    "application xid only warns",
			events:  []snapshot.KernelEvent{xidEvent(13, gpu0, hour, "Graphics SM Warp Exception"), xidEvent(31, gpu1, hour, "MMU Fault"), xidEvent(43, gpu1, hour, "Ch 10"), xidEvent(45, gpu1, hour, "Ch 10")},
			status:  report.Warn,
			want:    []string{"XID_13 GPU0 warn restart_app", "XID_31 GPU1 warn restart_app", "XID_43 GPU1 warn restart_app", "XID_45 GPU1 warn restart_app"},
			metrics: map[string]float64{"xid.event_count": 4, "xid.13.count": 1},
		},
		{
			name:   "xid 79 fails",
			events: []snapshot.KernelEvent{xidEvent(79, gpu3, hour, "GPU has fallen off the bus.")},
			status: report.Fail,
			want:   []string{"XID_79 GPU3 fail reboot"},
		},
		{
			name:    "outside the lookback",
			events:  []snapshot.KernelEvent{xidEvent(79, gpu3, 25*hour, "GPU has fallen off the bus.")},
			status:  report.Pass,
			metrics: map[string]float64{"xid.event_count": 0, "xid.outside_lookback_count": 1},
		},
		{
			name:   "configured lookback",
			events: []snapshot.KernelEvent{xidEvent(48, gpu3, 3*hour, "DBE")},
			cfg:    &config.Config{Xid: config.XidConfig{Lookback: config.Duration(2 * hour)}},
			status: report.Pass,
		},
		{
			name:    "before a reset of its GPU",
			events:  []snapshot.KernelEvent{xidEvent(48, gpu0, 3*hour, "DBE"), xidEvent(48, gpu1, 3*hour, "DBE"), resetEvent(gpu0, 2*hour)},
			status:  report.Fail,
			want:    []string{"XID_48 GPU1 fail reset_gpu"},
			metrics: map[string]float64{"xid.before_reset_count": 1, "xid.event_count": 1},
		},
		{
			name:   "driver load resets every GPU",
			events: []snapshot.KernelEvent{xidEvent(48, gpu0, 3*hour, "DBE"), xidEvent(119, gpu1, 3*hour, "GSP"), resetEvent("", 2*hour), xidEvent(13, gpu1, hour, "x")},
			status: report.Warn,
			want:   []string{"XID_13 GPU1 warn restart_app"},
		},
		{
			name: "xid 154 back to None clears the GPU",
			events: []snapshot.KernelEvent{
				xidEvent(48, gpu0, 3*hour, "DBE"),
				xidEvent(154, gpu0, 2*hour, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"),
				xidEvent(154, gpu0, hour, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"),
			},
			status: report.Pass,
		},
		{
			name:   "xid 154 names the action",
			events: []snapshot.KernelEvent{xidEvent(154, gpu0, hour, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")},
			status: report.Fail,
			want:   []string{"XID_154 GPU0 fail reboot"},
		},
		{
			name:   "unknown age counts",
			events: []snapshot.KernelEvent{xidEvent(48, gpu0, -1, "DBE")},
			status: report.Fail,
			want:   []string{"XID_48 GPU0 fail reset_gpu"},
		},
		{
			name: "seconds since boot aged by the snapshot's uptime",
			events: []snapshot.KernelEvent{
				{Kind: snapshot.EventXid, Code: 79, PCIBusID: gpu0, SinceBoot: ptr(time.Hour), Raw: "[3600.000000] NVRM: Xid (PCI:0000:18:00): 79, old"},
				{Kind: snapshot.EventXid, Code: 95, PCIBusID: gpu1, SinceBoot: ptr(30*24*time.Hour - time.Minute), Raw: "[2591940.000000] NVRM: Xid (PCI:0000:2a:00): 95, new"},
			},
			status: report.Fail,
			want:   []string{"XID_95 GPU1 fail reset_gpu"},
		},
		{
			name:   "new since the previous run",
			events: []snapshot.KernelEvent{xidEvent(48, gpu0, 2*hour, "DBE"), xidEvent(64, gpu1, hour, "remap failure")},
			prev: &checks.State{KernelEvents: map[string]bool{
				xidEvent(48, gpu0, 2*hour, "DBE").Raw: true,
			}},
			status:  report.Fail,
			want:    []string{"XID_64 GPU1 fail reset_gpu"},
			metrics: map[string]float64{"xid.event_count": 2, "xid.new_event_count": 1, "xid.48.count": 1},
		},
		{
			name:   "all seen before passes",
			events: []snapshot.KernelEvent{xidEvent(79, gpu0, hour, "x")},
			prev: &checks.State{KernelEvents: map[string]bool{
				xidEvent(79, gpu0, hour, "x").Raw: true,
			}},
			status:  report.Pass,
			metrics: map[string]float64{"xid.event_count": 1, "xid.new_event_count": 0},
		},
		{
			name:   "override raises a catalog ignore",
			events: []snapshot.KernelEvent{xidEvent(63, gpu0, hour, "Row Remapper: New row marked for remapping")},
			cfg:    override(63, "replace"),
			status: report.Fail,
			want:   []string{"XID_63 GPU0 fail replace"},
		},
		{
			name:   "override lowers a hardware xid",
			events: []snapshot.KernelEvent{xidEvent(79, gpu0, hour, "x")},
			cfg:    override(79, "monitor"),
			status: report.Warn,
			want:   []string{"XID_79 GPU0 warn monitor"},
		},
		{
			name:   "application xid never fails, even overridden",
			events: []snapshot.KernelEvent{xidEvent(13, gpu0, hour, "x")},
			cfg:    override(13, "drain"),
			status: report.Warn,
			want:   []string{"XID_13 GPU0 warn drain"},
		},
		{
			name:    "ignored xid",
			events:  []snapshot.KernelEvent{xidEvent(79, gpu0, hour, "x"), xidEvent(13, gpu0, hour, "y")},
			cfg:     &config.Config{Xid: config.XidConfig{Ignore: []int{79}}},
			status:  report.Warn,
			want:    []string{"XID_13 GPU0 warn restart_app"},
			metrics: map[string]float64{"xid.ignored_count": 1},
		},
		{
			name:    "repeats group into one finding",
			events:  []snapshot.KernelEvent{xidEvent(119, gpu0, 3*hour, "GSP a"), xidEvent(119, gpu0, 2*hour, "GSP b"), xidEvent(119, gpu0, hour, "GSP c"), xidEvent(119, gpu1, hour, "GSP")},
			status:  report.Fail,
			want:    []string{"XID_119 GPU0 fail reset_gpu", "XID_119 GPU1 fail reset_gpu"},
			metrics: map[string]float64{"xid.119.count": 4},
		},
		{
			name:   "unknown GPU and unknown code",
			events: []snapshot.KernelEvent{xidEvent(999, "0000:77:00.0", hour, "new driver"), xidEvent(48, "", hour, "no bus")},
			status: report.Fail,
			want:   []string{"XID_48 node fail reset_gpu", "XID_999 node warn monitor"},
		},
		{
			name: "fallen off the bus without xid 79",
			events: []snapshot.KernelEvent{
				{Kind: snapshot.EventFellOffBus, PCIBusID: gpu3, Time: now.Add(-hour), Raw: "a"},
				{Kind: snapshot.EventFellOffBus, PCIBusID: gpu1, Time: now.Add(-hour), Raw: "b"},
				xidEvent(79, gpu1, hour, "GPU has fallen off the bus."),
			},
			status:  report.Fail,
			want:    []string{"XID_79 GPU1 fail reboot", "GPU_FELL_OFF_BUS GPU3 fail reseat"},
			metrics: map[string]float64{"xid.fell_off_bus_count": 2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			snap := h100Node()
			snap.Kernel.Events = tc.events
			r := run(Xid{}, snap, tc.cfg, tc.prev)
			wantResult(t, r, tc.status, tc.want...)
			for k, v := range tc.metrics {
				if got, ok := r.Metrics[k]; !ok || got != v {
					t.Errorf("metric %s = %v (present %v), want %v", k, got, ok, v)
				}
			}
			for _, f := range r.Findings {
				if f.Component != checks.NodeComponent && f.PCIBusID == "" {
					t.Errorf("GPU finding without bus id: %+v", f)
				}
			}
		})
	}
}

func TestXidMessage(t *testing.T) {
	t.Parallel()
	snap := h100Node()
	e1 := xidEvent(119, "0000:18:00.0", 2*time.Hour, "Timeout after 6s of waiting for RPC response from GPU4 GSP!")
	e1.PID, e1.Process = 2024380, "nvidia-smi"
	e2 := e1
	e2.Time = now.Add(-time.Hour)
	e2.Raw += "x"
	snap.Kernel.Events = []snapshot.KernelEvent{e1, e2}
	r := run(Xid{}, snap, nil, nil)
	if len(r.Findings) != 1 {
		t.Fatalf("findings: %v", codes(r))
	}
	f := r.Findings[0]
	for _, want := range []string{"Xid 119", "GSP RPC Timeout", "2 times", "2026-11-28T10:00:00Z", "2026-11-28T11:00:00Z", "pid 2024380 nvidia-smi", "Timeout after 6s", "NVIDIA: RESET_GPU"} {
		if !strings.Contains(f.Message, want) {
			t.Errorf("message %q lacks %q", f.Message, want)
		}
	}
	if f.PCIBusID != "0000:18:00.0" {
		t.Errorf("bus id %q", f.PCIBusID)
	}
}

func TestXidSourceStates(t *testing.T) {
	t.Parallel()
	snap := h100Node()
	snap.Kernel = nil
	if r := run(Xid{}, snap, nil, nil); r.Status != report.Error {
		t.Errorf("ok source without log: %s", r.Status)
	}
	snap = &snapshot.Snapshot{}
	if r := run(Xid{}, snap, nil, nil); r.Status != report.Skip {
		t.Errorf("absent source: %s", r.Status)
	}
	snap.SetSource(snapshot.SrcKernelLog, snapshot.SourceState{State: snapshot.StateFailed, Error: "dmesg: permission denied"})
	if r := run(Xid{}, snap, nil, nil); r.Status != report.Error {
		t.Errorf("failed source: %s", r.Status)
	}
}

// TestXidOnParsedLog runs the check over the parser's output for a fixture.
func TestXidOnParsedLog(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../node/probe/kmsg/testdata/synthetic__dmesg-plain.log")
	if err != nil {
		t.Fatal(err)
	}
	snap := h100Node()
	snap.GPU.GPUs[0].PCIBusID = "0000:1b:00.0"
	snap.GPU.GPUs[1].PCIBusID = "0000:0f:00.0"
	snap.GPU.GPUs[2].PCIBusID = "0000:29:00.0"
	snap.GPU.GPUs[3].PCIBusID = "0000:18:00.0"
	snap.GPU.GPUs[4].PCIBusID = "0000:9b:00.0"
	snap.Uptime = 2397200 * time.Second
	snap.Kernel, err = kmsg.Parse(data, now, 0) // uptime left to the check
	if err != nil {
		t.Fatal(err)
	}
	r := run(Xid{}, snap, nil, nil)
	// Xid 13/94 on 1b:00 came before its re-initialisation and 48 is weeks
	// old; the last hour holds 64 and 94 on 0f:00, 79 on 29:00 (with its
	// fallen-off line folded in), the three-line fallen-off message for
	// 18:00, and 154 and an unknown code on 9b:00.
	wantResult(t, r, report.Fail,
		"XID_64 GPU1 fail reset_gpu",
		"XID_79 GPU2 fail reboot",
		"GPU_FELL_OFF_BUS GPU3 fail reseat",
		"XID_154 GPU4 fail reset_gpu",
		"XID_94 GPU1 warn restart_app",
		"XID_999 GPU4 warn monitor",
	)
	if r.Metrics["xid.before_reset_count"] != 3 || r.Metrics["xid.outside_lookback_count"] != 1 {
		t.Errorf("metrics: %v", r.Metrics)
	}
}

// TestFellOffBusAtDriverLoad: the driver probes the GPUs before it prints
// its load banner, so a GPU that is off the bus at boot shows up seconds
// BEFORE "NVRM: loading NVIDIA UNIX ...". That line belongs to the load and
// is current; an Xid long before the banner is from the previous load.
func TestFellOffBusAtDriverLoad(t *testing.T) {
	t.Parallel()
	banner := "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Mar  5 22:42:15 UTC 2024"
	cases := []struct {
		name        string
		log         string
		want        []string
		beforeReset float64
	}{
		{
			name: "plain dmesg stamps",
			log: "[    0.000000] Linux version 5.15.0-105-generic (buildd@lcy02-amd64-054)\n" +
				"[    3.410021] nvidia: loading out-of-tree module taints kernel.\n" +
				"[    4.012000] NVRM: GPU 0000:9a:00.0: GPU has fallen off the bus.\n" +
				"[    4.711000] " + banner + "\n",
			want: []string{"GPU_FELL_OFF_BUS GPU4 fail reseat"},
		},
		{
			name: "dmesg -T, Xid 79 with the driver's line",
			log: "[Sat Nov 28 11:00:03 2026] NVRM: Xid (PCI:0000:9a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n" +
				"[Sat Nov 28 11:00:03 2026] NVRM: GPU 0000:9a:00.0: GPU has fallen off the bus.\n" +
				"[Sat Nov 28 11:00:09 2026] " + banner + "\n",
			want: []string{"XID_79 GPU4 fail reboot"},
		},
		{
			name: "an Xid an hour before a reload stays before the reset",
			log: "[Sat Nov 28 10:00:03 2026] NVRM: Xid (PCI:0000:9a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n" +
				"[Sat Nov 28 10:00:03 2026] NVRM: GPU 0000:9a:00.0: GPU has fallen off the bus.\n" +
				"[Sat Nov 28 11:00:09 2026] " + banner + "\n",
			beforeReset: 2,
		},
		{
			name: "a boot banner after it always resets",
			log: "[Sat Nov 28 11:00:03 2026] NVRM: GPU 0000:9a:00.0: GPU has fallen off the bus.\n" +
				"[Sat Nov 28 11:00:04 2026] Linux version 5.15.0-105-generic (buildd@lcy02-amd64-054)\n",
			beforeReset: 1,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			snap := h100Node()
			snap.Uptime = time.Hour
			var err error
			snap.Kernel, err = kmsg.Parse([]byte(tc.log), now, snap.Uptime)
			if err != nil {
				t.Fatal(err)
			}
			r := run(Xid{}, snap, nil, nil)
			status := report.Pass
			if len(tc.want) > 0 {
				status = report.Fail
			}
			wantResult(t, r, status, tc.want...)
			if got := r.Metrics["xid.before_reset_count"]; got != tc.beforeReset {
				t.Errorf("xid.before_reset_count = %v, want %v", got, tc.beforeReset)
			}
		})
	}
}
