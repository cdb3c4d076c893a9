package gpu

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/probe/kmsg"
)

func sxidEvent(dev, bus string, code int, fatal bool, ago time.Duration) snapshot.KernelEvent {
	kind := "Non-fatal"
	if fatal {
		kind = "Fatal"
	}
	e := snapshot.KernelEvent{Kind: snapshot.EventSXid, Code: code, Device: dev, PCIBusID: bus, Fatal: fatal,
		Message: kind + ", Link 30 LTSSM Fault Up", Time: now.Add(-ago)}
	e.Raw = "[" + e.Time.Format(time.ANSIC) + "] " + dev + ": SXid (PCI:" + bus + "): " + e.Message
	return e
}

func TestFabric(t *testing.T) {
	t.Parallel()
	const sw = "0000:05:00.0"
	setFabric := func(state, status string) func(s *snapshot.Snapshot) {
		return func(s *snapshot.Snapshot) {
			for i := range s.GPU.GPUs {
				s.GPU.GPUs[i].Fabric = &snapshot.Fabric{State: state, Status: status}
			}
		}
	}
	noFabric := setFabricNil
	a100 := func(s *snapshot.Snapshot) {
		noFabric(s)
		for i := range s.GPU.GPUs {
			s.GPU.GPUs[i].Name, s.GPU.GPUs[i].Architecture = "NVIDIA A100-SXM4-80GB", "Ampere"
		}
	}
	tests := []struct {
		name    string
		mut     func(s *snapshot.Snapshot)
		cfg     *config.Config
		prev    *checks.State
		status  report.Status
		want    []string
		metrics map[string]float64
	}{
		{
			name:    "healthy fabric",
			mut:     func(s *snapshot.Snapshot) { s.Versions.FabricManager = "535.161.08" },
			status:  report.Pass,
			metrics: map[string]float64{"fabric.gpu_count": 8, "fabric.ready_gpu_count": 8},
		},
		{
			name:   "no fabric",
			mut:    noFabric,
			status: report.Skip,
		},
		{
			name:   "not supported counts as none",
			mut:    setFabric("Not Supported", ""),
			status: report.Skip,
		},
		{
			name:   "expect.nvswitch false",
			cfg:    &config.Config{Expect: config.Expect{NVSwitch: ptr(false)}},
			status: report.Skip,
		},
		{
			name:   "in progress",
			mut:    func(s *snapshot.Snapshot) { setFabric("In Progress", "")(s); s.GPU.GPUs = s.GPU.GPUs[:2] },
			status: report.Fail,
			want:   []string{"FABRIC_NOT_READY GPU0 fail reboot", "FABRIC_NOT_READY GPU1 fail reboot"},
		},
		{
			name: "in progress right after boot",
			mut: func(s *snapshot.Snapshot) {
				setFabric("Not Started", "")(s)
				s.GPU.GPUs = s.GPU.GPUs[:1]
				s.Uptime = 2 * time.Minute
			},
			status: report.Warn,
			want:   []string{"FABRIC_NOT_READY GPU0 warn monitor"},
		},
		{
			name: "fabric manager mismatch",
			mut: func(s *snapshot.Snapshot) {
				setFabric("In Progress", "")(s)
				s.GPU.GPUs = s.GPU.GPUs[:1]
				s.Versions.FabricManager = "535.129.03"
			},
			status: report.Fail,
			want:   []string{"FABRIC_NOT_READY GPU0 fail reboot", "FABRIC_MANAGER_MISMATCH node fail drain"},
		},
		{
			name:   "fabric manager package revision matches",
			mut:    func(s *snapshot.Snapshot) { s.Versions.FabricManager = "535.161.08-1" },
			status: report.Pass,
		},
		{
			name:   "completed with an error",
			mut:    func(s *snapshot.Snapshot) { s.GPU.GPUs[2].Fabric.Status = "Failure: NVLink training failed" },
			status: report.Fail,
			want:   []string{"FABRIC_FAILED GPU2 fail reboot"},
		},
		{
			name:   "unknown state",
			mut:    func(s *snapshot.Snapshot) { s.GPU.GPUs[2].Fabric.State = "Degraded" },
			status: report.Warn,
			want:   []string{"FABRIC_STATE_UNKNOWN GPU2 warn monitor"},
		},
		{
			name: "fatal and non-fatal SXids",
			mut: func(s *snapshot.Snapshot) {
				s.Kernel.Events = []snapshot.KernelEvent{
					sxidEvent("nvidia-nvswitch0", sw, 20034, true, time.Hour),
					sxidEvent("nvidia-nvswitch0", sw, 20034, true, 30*time.Minute),
					sxidEvent("nvidia-nvswitch2", "0000:85:00.0", 12028, false, time.Hour),
				}
			},
			status:  report.Fail,
			want:    []string{"SXID_FATAL node fail reboot", "SXID_NONFATAL node warn monitor"},
			metrics: map[string]float64{"sxid.event_count": 3, "sxid.fatal_event_count": 2},
		},
		{
			name: "SXids outside the lookback, before a driver load, or seen before",
			mut: func(s *snapshot.Snapshot) {
				s.Kernel.Events = []snapshot.KernelEvent{
					sxidEvent("nvidia-nvswitch0", sw, 20034, true, 48*time.Hour),
					sxidEvent("nvidia-nvswitch1", sw, 20034, true, 3*time.Hour),
					{Kind: snapshot.EventGPUReset, Time: now.Add(-2 * time.Hour), Raw: "NVRM: loading NVIDIA UNIX"},
					resetEvent("0000:18:00.0", time.Minute), // a GPU's reset does not cover a switch
					sxidEvent("nvidia-nvswitch3", sw, 12028, true, time.Hour),
				}
			},
			prev: &checks.State{KernelEvents: map[string]bool{
				sxidEvent("nvidia-nvswitch3", sw, 12028, true, time.Hour).Raw: true,
			}},
			status:  report.Pass,
			metrics: map[string]float64{"sxid.event_count": 1, "sxid.new_event_count": 0},
		},
		{
			name: "SXids on a node whose GPUs report no fabric",
			mut: func(s *snapshot.Snapshot) {
				a100(s)
				s.Kernel.Events = []snapshot.KernelEvent{sxidEvent("nvidia-nvswitch0", sw, 20034, true, time.Hour)}
			},
			status: report.Fail,
			want:   []string{"SXID_FATAL node fail reboot"},
		},
		{
			name: "SXids ignored when the kernel log failed",
			mut: func(s *snapshot.Snapshot) {
				noFabric(s)
				s.Kernel.Events = []snapshot.KernelEvent{sxidEvent("nvidia-nvswitch0", sw, 20034, true, time.Hour)}
				s.SetSource(snapshot.SrcKernelLog, snapshot.SourceState{State: snapshot.StateFailed})
			},
			status: report.Skip,
		},
		{
			name:   "expected NVSwitch but Hopper GPUs report none",
			mut:    noFabric,
			cfg:    &config.Config{Expect: config.Expect{NVSwitch: ptr(true)}},
			status: report.Fail,
			want:   []string{"FABRIC_MISSING node fail reboot"},
		},
		{
			name:   "expected NVSwitch, pre-Hopper, nothing known",
			mut:    a100,
			cfg:    &config.Config{Expect: config.Expect{NVSwitch: ptr(true)}},
			status: report.Skip,
		},
		{
			name:   "expected NVSwitch, pre-Hopper, Fabric Manager matches",
			mut:    func(s *snapshot.Snapshot) { a100(s); s.Versions.FabricManager = "535.161.08" },
			cfg:    &config.Config{Expect: config.Expect{NVSwitch: ptr(true)}},
			status: report.Pass,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := h100Node()
			if tc.mut != nil {
				tc.mut(s)
			}
			r := run(Fabric{}, s, tc.cfg, tc.prev)
			wantResult(t, r, tc.status, tc.want...)
			if r.Status == report.Skip && r.Reason == "" {
				t.Errorf("skip without a reason")
			}
			for k, v := range tc.metrics {
				if got, ok := r.Metrics[k]; !ok || got != v {
					t.Errorf("metric %s = %v (present %v), want %v", k, got, ok, v)
				}
			}
		})
	}
}

func setFabricNil(s *snapshot.Snapshot) {
	for i := range s.GPU.GPUs {
		s.GPU.GPUs[i].Fabric = nil
	}
}

func TestFabricMessages(t *testing.T) {
	t.Parallel()
	s := h100Node()
	s.GPU.GPUs = s.GPU.GPUs[:1]
	s.GPU.GPUs[0].Fabric.State = "In Progress"
	s.Versions.FabricManager = "535.129.03"
	r := run(Fabric{}, s, nil, nil)
	all := ""
	for _, f := range r.Findings {
		all += f.Message + "\n"
	}
	for _, want := range []string{"Fabric Manager 535.129.03 does not match driver 535.161.08", "must match exactly", `fabric state "In Progress"`} {
		if !strings.Contains(all, want) {
			t.Errorf("messages lack %q:\n%s", want, all)
		}
	}
	s.GPU = nil
	if r := run(Fabric{}, s, nil, nil); r.Status != report.Error {
		t.Errorf("no GPU data: %s", r.Status)
	}
}

func TestVersionCore(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"535.129.03": "535.129.03", "535.129.03-1": "535.129.03", "v550.54.15": "550.54.15", " 535. ": "535", "": "", "none": ""} {
		if got := versionCore(in); got != want {
			t.Errorf("versionCore(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestFabricWithoutNvidiaSMI: SXid lines are judged from the kernel log
// even when nvidia-smi.xml is absent or failed (a node whose NVSwitches
// fail often takes nvidia-smi with it). Lines are the real shapes from
// fixtures/xid/xid_kernel_log_line_samples.txt.
func TestFabricWithoutNvidiaSMI(t *testing.T) {
	t.Parallel()
	fatal := "[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up\n"
	nonFatal := "[131460.000000] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)\n"
	cases := []struct {
		name   string
		smi    snapshot.SourceState
		log    string
		status report.Status
		want   []string
	}{
		{"absent, fatal SXid", snapshot.SourceState{State: snapshot.StateAbsent, Error: "nvidia-smi not found"}, fatal,
			report.Fail, []string{"SXID_FATAL node fail reboot"}},
		{"failed, fatal SXid", snapshot.SourceState{State: snapshot.StateFailed, Error: "nvidia-smi exited 15"}, fatal,
			report.Fail, []string{"SXID_FATAL node fail reboot"}},
		{"failed, non-fatal SXid stays an error", snapshot.SourceState{State: snapshot.StateFailed, Error: "nvidia-smi exited 15"}, nonFatal,
			report.Error, []string{"SXID_NONFATAL node warn monitor"}},
		{"absent, no SXid", snapshot.SourceState{State: snapshot.StateAbsent, Error: "nvidia-smi not found"}, "",
			report.Skip, nil},
		{"failed, no SXid", snapshot.SourceState{State: snapshot.StateFailed, Error: "nvidia-smi exited 15"}, "",
			report.Error, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := h100Node()
			s.GPU = nil
			s.Uptime = 131500 * time.Second
			s.SetSource(snapshot.SrcNvidiaSMI, tc.smi)
			var err error
			s.Kernel, err = kmsg.Parse([]byte(tc.log), now, s.Uptime)
			if err != nil {
				t.Fatal(err)
			}
			r := run(Fabric{}, s, nil, nil)
			wantResult(t, r, tc.status, tc.want...)
			if r.Reason == "" {
				t.Errorf("no reason naming the missing nvidia-smi")
			}
		})
	}
}
