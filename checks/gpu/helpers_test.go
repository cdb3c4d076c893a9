package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/probe/nvsmi"
)

// Every check is a checks.Check.
var (
	_ checks.Check = Inventory{}
	_ checks.Check = Config{}
	_ checks.Check = ECC{}
	_ checks.Check = Thermal{}
	_ checks.Check = PCIe{}
	_ checks.Check = Processes{}
)

func u64(v uint64) *uint64   { return &v }
func f64(v float64) *float64 { return &v }
func bp(v bool) *bool        { return &v }

// gpu builds a healthy idle H100 at bus 0000:<0x19+i>:00.0, then applies mods.
func gpu(i int, mods ...func(*snapshot.GPU)) snapshot.GPU {
	g := snapshot.GPU{
		Index:           i,
		Name:            "NVIDIA H100 80GB HBM3",
		UUID:            fmt.Sprintf("GPU-%08d", i),
		PCIBusID:        fmt.Sprintf("0000:%02x:00.0", 0x19+i),
		MemoryTotalMiB:  u64(81559),
		MemoryUsedMiB:   u64(0),
		PersistenceMode: bp(true),
		ECCEnabled:      bp(true),
		ECCPending:      bp(true),
		MIGEnabled:      bp(false),
		ComputeMode:     "Default",
		ECC: snapshot.ECC{
			Volatile:  snapshot.ECCCounts{Correctable: u64(0), Uncorrectable: u64(0)},
			Aggregate: snapshot.ECCCounts{Correctable: u64(0), Uncorrectable: u64(0)},
		},
		RemappedRows:  &snapshot.RemappedRows{},
		ResetRequired: bp(false),
		TemperatureC:  f64(35),
		MemoryTempC:   f64(40),
		PowerDrawW:    f64(70),
		ClockEvents:   map[string]bool{"gpu_idle": false, "hw_slowdown": false, "hw_power_brake_slowdown": false},
		PCIe:          snapshot.PCIeLink{GenCurrent: 5, GenMax: 5, WidthCurrent: 16, WidthMax: 16},
	}
	for _, m := range mods {
		m(&g)
	}
	return g
}

// node builds a snapshot whose nvidia-smi source is ok and holds gs.
func node(gs ...snapshot.GPU) *snapshot.Snapshot {
	s := &snapshot.Snapshot{GPU: &snapshot.GPUState{DriverVersion: "535.161.08", AttachedGPUs: len(gs), GPUs: gs}}
	s.SetSource(snapshot.SrcNvidiaSMI, snapshot.SourceState{State: snapshot.StateOK})
	return s
}

// eight is a healthy 8-GPU node with mods applied to GPU i only.
func eight(i int, mods ...func(*snapshot.GPU)) *snapshot.Snapshot {
	gs := make([]snapshot.GPU, 8)
	for j := range gs {
		if j == i {
			gs[j] = gpu(j, mods...)
		} else {
			gs[j] = gpu(j)
		}
	}
	return node(gs...)
}

// busFor lists PCI functions for GPUs at the given indexes of gpu().
func busFor(idx ...int) []snapshot.PCIDevice {
	var out []snapshot.PCIDevice
	for _, i := range idx {
		out = append(out, snapshot.PCIDevice{Address: fmt.Sprintf("0000:%02x:00.0", 0x19+i),
			Vendor: snapshot.VendorNVIDIA, Device: 0x2330, Class: 0x030200, Driver: "nvidia",
			CurrentLinkWidth: 16, MaxLinkWidth: 16, CurrentLinkSpeed: "32.0 GT/s PCIe", MaxLinkSpeed: "32.0 GT/s PCIe"})
	}
	return out
}

func withCfg(f func(*config.Config)) *config.Config {
	c := config.Defaults()
	f(c)
	return c
}

type tcase struct {
	name string
	snap *snapshot.Snapshot
	cfg  *config.Config // nil: defaults
	// labels are the node's declared labels (an agent's).
	labels map[string]string
	want   report.Status
	// findings are "component code action", in report order.
	findings []string
	metrics  map[string]float64 // a subset that must be present with these values
	absent   []string           // metrics that must not be present
	reason   string             // a substring of the reason, for skip and error
}

// runTable runs each case through checks.Run, so source gating, status
// defaulting and finding order are those of a real report.
func runTable(t *testing.T, c checks.Check, cases []tcase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cr := checks.Run([]checks.Check{c}, checks.Input{Snap: tc.snap, Config: tc.cfg, Now: time.Now(), Labels: tc.labels})[0]
			verify(t, cr, tc)
		})
	}
}

func verify(t *testing.T, cr report.CheckResult, tc tcase) {
	t.Helper()
	got := make([]string, len(cr.Findings))
	for i, f := range cr.Findings {
		got[i] = f.Component + " " + f.Code + " " + string(f.Action)
		if f.Message == "" || f.Code != strings.ToUpper(f.Code) {
			t.Errorf("finding %+v: empty message or code not upper-snake", f)
		}
		if strings.HasPrefix(f.Component, "GPU") && f.PCIBusID == "" {
			t.Errorf("finding %+v on a GPU has no PCI bus id", f)
		}
	}
	if cr.Status != tc.want {
		t.Errorf("status %s (reason %q), want %s; findings %q", cr.Status, cr.Reason, tc.want, got)
	}
	if len(got) != 0 || len(tc.findings) != 0 {
		if !reflect.DeepEqual(got, tc.findings) {
			t.Errorf("findings\n got %q\nwant %q", got, tc.findings)
			for _, f := range cr.Findings {
				t.Logf("  %s %s: %s", f.Component, f.Code, f.Message)
			}
		}
	}
	for k, v := range tc.metrics {
		if gv, ok := cr.Metrics[k]; !ok || gv != v {
			t.Errorf("metric %s = %v (present %v), want %v", k, gv, ok, v)
		}
	}
	for _, k := range tc.absent {
		if _, ok := cr.Metrics[k]; ok {
			t.Errorf("metric %s present, want absent", k)
		}
	}
	if tc.reason != "" && !strings.Contains(cr.Reason, tc.reason) {
		t.Errorf("reason %q does not contain %q", cr.Reason, tc.reason)
	}
	if (cr.Status == report.Skip || cr.Status == report.Error) && cr.Reason == "" {
		t.Errorf("%s without a reason", cr.Status)
	}
}

// fixture parses one of node/probe/nvsmi's captured nvidia-smi files into a snapshot.
func fixture(t *testing.T, name string) *snapshot.Snapshot {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "node", "probe", "nvsmi", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	st, err := nvsmi.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	s := &snapshot.Snapshot{GPU: st}
	s.SetSource(snapshot.SrcNvidiaSMI, snapshot.SourceState{State: snapshot.StateOK, Via: "bundle"})
	return s
}
