package gpu

import (
	"os"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/probe/nvlink"
)

// links builds n active links at speed GB/s with zeroed counters.
func links(n int, speed float64) []snapshot.NVLink {
	out := make([]snapshot.NVLink, n)
	for i := range out {
		out[i] = snapshot.NVLink{Link: i, Active: speed > 0, SpeedGBps: speed,
			Errors: map[string]uint64{"replay": 0, "recovery": 0, "crc": 0}}
	}
	return out
}

// nvlinkNode is h100Node with two GPUs of 18 active links each.
func nvlinkNode(mut func(gs []snapshot.NVLinkGPU)) *snapshot.Snapshot {
	s := h100Node()
	s.SetSource(snapshot.SrcNVLink, snapshot.SourceState{State: snapshot.StateOK})
	gs := []snapshot.NVLinkGPU{
		{Index: 0, Name: "NVIDIA H100 80GB HBM3", Links: links(18, 26.562)},
		{Index: 1, Name: "NVIDIA H100 80GB HBM3", Links: links(18, 26.562)},
	}
	if mut != nil {
		mut(gs)
	}
	s.NVLink = &snapshot.NVLinkState{GPUs: gs}
	return s
}

func TestNVLink(t *testing.T) {
	t.Parallel()
	expectNV := &config.Config{Expect: config.Expect{NVSwitch: ptr(true)}}
	prevZero := &checks.State{NVLinkErrors: map[string]map[string]uint64{}}
	for g := 0; g < 2; g++ {
		for l := 0; l < 18; l++ {
			prevZero.NVLinkErrors[checks.NVLinkKey(g, l)] = map[string]uint64{"replay": 0, "recovery": 0, "crc": 0, "fec_errors_0": 0}
		}
	}
	tests := []struct {
		name    string
		mut     func(gs []snapshot.NVLinkGPU)
		cfg     *config.Config
		prev    *checks.State
		status  report.Status
		reason  string
		want    []string
		metrics map[string]float64
	}{
		{
			name:    "healthy",
			status:  report.Pass,
			metrics: map[string]float64{"gpu0.nvlink.active_link_count": 18, "gpu1.nvlink.speed_gbps": 18 * 26.562, "nvlink.active_link_count": 36},
		},
		{
			name:    "one link inactive",
			mut:     func(gs []snapshot.NVLinkGPU) { gs[1].Links[7] = snapshot.NVLink{Link: 7} },
			status:  report.Fail,
			want:    []string{"NVLINK_DOWN GPU1 fail reset_gpu"},
			metrics: map[string]float64{"gpu1.nvlink.inactive_link_count": 1, "nvlink.inactive_link_count": 1},
		},
		{
			name: "one GPU lost all its links",
			mut: func(gs []snapshot.NVLinkGPU) {
				for i := range gs[0].Links {
					gs[0].Links[i] = snapshot.NVLink{Link: i}
				}
			},
			status: report.Fail,
			want:   []string{"NVLINK_DOWN GPU0 fail reset_gpu"},
		},
		{
			name:   "GPU lists fewer links than its siblings",
			mut:    func(gs []snapshot.NVLinkGPU) { gs[1].Links = nil },
			status: report.Fail,
			want:   []string{"NVLINK_DOWN GPU1 fail reset_gpu"},
		},
		{
			name: "no active link anywhere: PCIe-only",
			mut: func(gs []snapshot.NVLinkGPU) {
				gs[0].Links, gs[1].Links = links(12, 0), nil
			},
			status: report.Skip,
			reason: "no active NVLink",
		},
		{
			name: "no active link on an NVSwitch node",
			mut: func(gs []snapshot.NVLinkGPU) {
				gs[0].Links, gs[1].Links = links(18, 0), links(18, 0)
			},
			cfg:    expectNV,
			status: report.Fail,
			want:   []string{"NVLINK_DOWN GPU0 fail reset_gpu", "NVLINK_DOWN GPU1 fail reset_gpu"},
		},
		{
			name:   "half-speed link",
			mut:    func(gs []snapshot.NVLinkGPU) { gs[0].Links[9].SpeedGBps = 13.281 },
			status: report.Warn,
			want:   []string{"NVLINK_SPEED_LOW GPU0 warn reset_gpu"},
		},
		{
			name:    "counters without a previous run are metrics only",
			mut:     func(gs []snapshot.NVLinkGPU) { gs[0].Links[3].Errors["replay"] = 500 },
			status:  report.Pass,
			metrics: map[string]float64{"gpu0.nvlink.replay_count": 500},
		},
		{
			name:    "counters rising",
			mut:     func(gs []snapshot.NVLinkGPU) { gs[0].Links[3].Errors["crc"] = 7 },
			prev:    prevZero,
			status:  report.Fail,
			want:    []string{"NVLINK_ERRORS_RISING GPU0 fail reset_gpu"},
			metrics: map[string]float64{"gpu0.nvlink.crc_rise_count": 7, "gpu1.nvlink.crc_rise_count": 0},
		},
		{
			name:   "rise within the limit",
			mut:    func(gs []snapshot.NVLinkGPU) { gs[0].Links[3].Errors["crc"] = 7 },
			cfg:    &config.Config{Limits: config.Limits{NVLinkErrorRise: 10}},
			prev:   prevZero,
			status: report.Pass,
		},
		{
			name: "counter cleared since the previous run",
			mut:  func(gs []snapshot.NVLinkGPU) {},
			prev: &checks.State{NVLinkErrors: map[string]map[string]uint64{
				checks.NVLinkKey(0, 3): {"replay": 90},
			}},
			status: report.Pass,
		},
		{
			name:    "pre-FEC counters are not judged",
			mut:     func(gs []snapshot.NVLinkGPU) { gs[0].Links[3].Errors["fec_errors_0"] = 123456 },
			prev:    prevZero,
			status:  report.Pass,
			metrics: map[string]float64{"gpu0.nvlink.fec_errors_0_rise_count": 123456},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := run(NVLink{}, nvlinkNode(tc.mut), tc.cfg, tc.prev)
			wantResult(t, r, tc.status, tc.want...)
			if tc.reason != "" && r.Reason != tc.reason {
				t.Errorf("reason %q, want %q", r.Reason, tc.reason)
			}
			for k, v := range tc.metrics {
				if got, ok := r.Metrics[k]; !ok || got != v {
					t.Errorf("metric %s = %v (present %v), want %v", k, got, ok, v)
				}
			}
			for _, f := range r.Findings {
				if f.PCIBusID == "" {
					t.Errorf("finding without bus id: %+v", f)
				}
			}
		})
	}
}

func TestNVLinkMessages(t *testing.T) {
	t.Parallel()
	r := run(NVLink{}, nvlinkNode(func(gs []snapshot.NVLinkGPU) {
		gs[1].Links[7] = snapshot.NVLink{Link: 7}
		gs[1].Links[9].SpeedGBps = 13.281
		gs[1].Links[9].Errors["replay"] = 3
	}), nil, &checks.State{NVLinkErrors: map[string]map[string]uint64{checks.NVLinkKey(1, 9): {"replay": 1}}})
	all := ""
	for _, f := range r.Findings {
		all += f.Message + "\n"
	}
	for _, want := range []string{"17 of 18 NVLink links active; inactive: 7", "link 9 at 13.281 GB/s, below the 26.562 GB/s", "link 9 replay +2"} {
		if !strings.Contains(all, want) {
			t.Errorf("messages lack %q:\n%s", want, all)
		}
	}
}

func TestNVLinkNoGPUs(t *testing.T) {
	t.Parallel()
	s := nvlinkNode(nil)
	s.NVLink = &snapshot.NVLinkState{}
	if r := run(NVLink{}, s, nil, nil); r.Status != report.Skip {
		t.Errorf("no GPUs: %s", r.Status)
	}
	r := run(NVLink{}, s, &config.Config{Expect: config.Expect{NVSwitch: ptr(true)}}, nil)
	wantResult(t, r, report.Fail, "NVLINK_DOWN node fail reset_gpu")
	s.SetSource(snapshot.SrcNVLink, snapshot.SourceState{State: snapshot.StateTimeout})
	if r := run(NVLink{}, s, nil, nil); r.Status != report.Error {
		t.Errorf("timed-out source: %s", r.Status)
	}
}

// TestNVLinkOnParsedFixtures runs the check over the parser's output.
func TestNVLinkOnParsedFixtures(t *testing.T) {
	t.Parallel()
	for file, want := range map[string][]string{
		"gpud__nvidia-smi-nvlink-status__a100.txt": nil,
		"synthetic__h100-status-and-errors.txt":    {"NVLINK_DOWN GPU1 fail reset_gpu", "NVLINK_SPEED_LOW GPU1 warn reset_gpu"},
	} {
		data, err := os.ReadFile("../../node/probe/nvlink/testdata/" + file)
		if err != nil {
			t.Fatal(err)
		}
		s := h100Node()
		s.SetSource(snapshot.SrcNVLink, snapshot.SourceState{State: snapshot.StateOK})
		if s.NVLink, err = nvlink.Parse(data); err != nil {
			t.Fatal(err)
		}
		status := report.Pass
		if len(want) > 0 {
			status = report.Fail
		}
		wantResult(t, run(NVLink{}, s, nil, nil), status, want...)
	}
}
