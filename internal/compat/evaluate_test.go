package compat

import (
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// testMatrix has one rule of every kind.
const testMatrix = `
gpus:
  - model: H100 80GB HBM3
    drivers: ["535.129.03", ">=550.90.07, <551"]
    cuda: ["12.2", "12.4"]
    vbios: ["96.00.99.*"]
    reason: qualified set
  - model: H100
    drivers: ["535.*"]
  - model: re:^NVIDIA A100-SXM4-\d+GB$
    drivers: ["535.*"]
fabric_manager:
  - driver: "550.*"
    version: ">=550.90.07, <551"
  - driver: "*"
    gpu_model: HBM3
    version: same
hcas:
  - model: MT4129
    name: ConnectX-7
    min_firmware: 28.39.1002
  - model: MT4123
    firmware: ["20.39.*"]
rdma_stacks: ["MLNX_OFED >=23.10", "DOCA >=2.9"]
kernels: [">=6.5.0-1007, <6.6"]
known_bad:
  - when: {driver: 550.54.14, vbios: 96.00.74.*}
    reason: Xid 79 on boot
  - when: {rdma_stack: "DOCA <2.10", hca_model: MT4129}
    reason: 2-node busbw 450 -> 89 GB/s
  - when: {hca_model: MT4129, hca_firmware: 28.39.2048}
    reason: link flaps
`

func mustParse(t testing.TB, doc string) *Matrix {
	t.Helper()
	m, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func boolp(b bool) *bool { return &b }

// pinnedNode is the real pinned tuple on an 8x H100 SXM, 8x CX-7 node.
func pinnedNode() Node {
	n := Node{
		Driver: "535.129.03", CUDA: "12.2", FabricManager: "535.129.03",
		RDMAStack: "MLNX_OFED 23.10-1.1.9.0", Kernel: "6.5.0-1007-nvidia", NVSwitch: boolp(true),
	}
	for i := 0; i < 8; i++ {
		n.GPUs = append(n.GPUs, GPU{Index: i, Name: "NVIDIA H100 80GB HBM3", VBIOS: "96.00.99.00.01"})
		n.HCAs = append(n.HCAs, HCA{Name: fmt.Sprintf("mlx5_%d", i), Model: "MT4129", FW: "28.39.1002"})
	}
	return n
}

type want struct {
	kind      Kind
	component string
	have      string // substring
}

func kinds(v Verdict) []want {
	var out []want
	for _, x := range v.Violations {
		out = append(out, want{x.Kind, x.Component, x.Have})
	}
	return out
}

func TestEvaluate(t *testing.T) {
	t.Parallel()
	m := mustParse(t, testMatrix)
	tests := []struct {
		name    string
		edit    func(*Node)
		want    []want
		unknown []string // substrings, in order
	}{
		{name: "pinned tuple passes", edit: func(*Node) {}},
		{name: "driver not allowed", edit: func(n *Node) { n.Driver, n.FabricManager = "545.23.08", "545.23.08" },
			want: []want{{KindDriver, "node", "545.23.08"}}},
		{name: "driver in range", edit: func(n *Node) { n.Driver, n.FabricManager, n.CUDA = "550.127.05", "550.127.05", "12.4" }},
		{name: "cuda not allowed", edit: func(n *Node) { n.CUDA = "12.8" },
			want: []want{{KindCUDA, "node", "12.8"}}},
		{name: "vbios on one GPU", edit: func(n *Node) { n.GPUs[3].VBIOS = "96.00.74.00.02" },
			want: []want{{KindVBIOS, "GPU3", "96.00.74.00.02"}}},
		{name: "fabric manager not same", edit: func(n *Node) { n.FabricManager = "535.104.05" },
			want: []want{{KindFabricManager, "node", "535.104.05"}}},
		{name: "fabric manager same is string equality", edit: func(n *Node) { n.FabricManager = "535.129.3" },
			want: []want{{KindFabricManager, "node", "535.129.3"}}},
		{name: "fabric manager by range, first rule wins", edit: func(n *Node) {
			n.Driver, n.CUDA, n.FabricManager = "550.90.07", "12.4", "550.127.05"
		}},
		{name: "fabric manager range violated", edit: func(n *Node) {
			n.Driver, n.CUDA, n.FabricManager = "550.90.07", "12.4", "550.54.14"
		}, want: []want{{KindFabricManager, "node", "550.54.14"}}},
		{name: "no NVSwitch: no fabric manager rule", edit: func(n *Node) { n.NVSwitch, n.FabricManager = boolp(false), "" }},
		{name: "fabric manager scoped to a model", edit: func(n *Node) {
			for i := range n.GPUs {
				n.GPUs[i].Name = "NVIDIA H100 PCIe"
			}
			n.FabricManager, n.CUDA = "", ""
		}},
		{name: "HCA firmware too old", edit: func(n *Node) { n.HCAs[5].FW = "28.38.1002" },
			want: []want{{KindHCAFirmware, "mlx5_5", "28.38.1002"}}},
		{name: "HCA firmware list", edit: func(n *Node) { n.HCAs = append(n.HCAs, HCA{Name: "mlx5_8", Model: "MT4123", FW: "20.38.1002"}) },
			want: []want{{KindHCAFirmware, "mlx5_8", "20.38.1002"}}},
		{name: "unknown HCA model not judged", edit: func(n *Node) { n.HCAs = append(n.HCAs, HCA{Name: "mlx5_bond_0", Model: "MT41692", FW: ""}) }},
		{name: "RDMA stack not allowed", edit: func(n *Node) { n.RDMAStack = "MLNX_OFED 5.8-3.0.7.0" },
			want: []want{{KindRDMAStack, "node", "MLNX_OFED 5.8"}}},
		{name: "RDMA stack without HCAs not judged", edit: func(n *Node) { n.HCAs, n.RDMAStack = nil, "" }},
		{name: "kernel not allowed", edit: func(n *Node) { n.Kernel = "5.15.0-91-generic" },
			want: []want{{KindKernel, "node", "5.15.0-91-generic"}}},
		{name: "known bad driver+vbios names the GPUs", edit: func(n *Node) {
			n.Driver, n.FabricManager = "550.54.14", "550.54.14"
			n.GPUs[0].VBIOS, n.GPUs[1].VBIOS = "96.00.74.00.01", "96.00.74.00.01"
		}, want: []want{
			{KindDriver, "node", "550.54.14"},
			{KindVBIOS, "GPU0", "96.00.74.00.01"},
			{KindVBIOS, "GPU1", "96.00.74.00.01"},
			{KindFabricManager, "node", "550.54.14"},
			{KindKnownBad, "GPU0", "driver=550.54.14, vbios=96.00.74.00.01"},
			{KindKnownBad, "GPU1", "driver=550.54.14, vbios=96.00.74.00.01"},
		}},
		{name: "known bad stack names the node", edit: func(n *Node) { n.RDMAStack = "DOCA 2.9.1" },
			want: []want{{KindKnownBad, "node", "rdma_stack=DOCA 2.9.1, hca_model=MT4129"}}},
		{name: "known bad stack needs the HCA model", edit: func(n *Node) {
			n.RDMAStack = "DOCA 2.9.1"
			for i := range n.HCAs {
				n.HCAs[i].Model = "MT4123"
				n.HCAs[i].FW = "20.39.1002"
			}
		}},
		{name: "known bad firmware names the HCA", edit: func(n *Node) { n.HCAs[2].FW = "28.39.2048" },
			want: []want{{KindKnownBad, "mlx5_2", "hca_firmware=28.39.2048"}}},

		// Unknown values are reported, never violations.
		{name: "driver unknown", edit: func(n *Node) { n.Driver = "" },
			unknown: []string{"driver: version unknown", "fabric_manager: driver version unknown"}},
		{name: "driver unknown with the bad VBIOS", edit: func(n *Node) { n.Driver, n.GPUs[4].VBIOS = "", "96.00.74.00.01" },
			want:    []want{{KindVBIOS, "GPU4", "96.00.74.00.01"}},
			unknown: []string{"driver: version unknown", "fabric_manager: driver version unknown", "known_bad[0]: cannot rule out driver 550.54.14 + vbios 96.00.74.*"}},
		{name: "fabric manager unknown", edit: func(n *Node) { n.FabricManager = "" },
			unknown: []string{"fabric_manager: version unknown"}},
		{name: "NVSwitch unknown still judges", edit: func(n *Node) { n.NVSwitch = nil }},
		{name: "kernel unknown", edit: func(n *Node) { n.Kernel = "" }, unknown: []string{"kernel: version unknown"}},
		{name: "cuda unknown", edit: func(n *Node) { n.CUDA = "" }, unknown: []string{"cuda: version unknown"}},
		{name: "GPU model unknown", edit: func(n *Node) { n.GPUs[2].Name = "" }, unknown: []string{"GPU2: model unknown"}},
		{name: "GPU model not in matrix", edit: func(n *Node) {
			for i := range n.GPUs {
				n.GPUs[i].Name = "NVIDIA B200"
			}
		}, unknown: []string{`gpus: no rule matches model "NVIDIA B200"`}},
		{name: "no GPUs", edit: func(n *Node) { n.GPUs = nil }, unknown: []string{"gpus: no GPUs reported", "fabric_manager[1]: GPU model unknown"}},
		{name: "VBIOS unknown", edit: func(n *Node) { n.GPUs[7].VBIOS = "" }, unknown: []string{"GPU7: VBIOS unknown"}},
		{name: "HCA firmware unknown", edit: func(n *Node) { n.HCAs[1].FW = "" },
			unknown: []string{"mlx5_1: firmware unknown", "known_bad[2]"}},
		{name: "RDMA stack unknown", edit: func(n *Node) { n.RDMAStack = "" },
			unknown: []string{"rdma_stack: unknown", "known_bad[1]"}},
		{name: "known bad ruled out despite an unknown", edit: func(n *Node) {
			n.Driver, n.FabricManager, n.CUDA = "550.90.07", "550.90.07", "12.4"
			n.GPUs[0].VBIOS = "" // driver is not 550.54.14: known_bad[0] cannot hold
		}, unknown: []string{"GPU0: VBIOS unknown"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := pinnedNode()
			tc.edit(&n)
			v := m.Evaluate(n)
			got := kinds(v)
			if len(got) != len(tc.want) {
				t.Fatalf("violations = %+v\nwant %+v\nunknown %q", v.Violations, tc.want, v.Unknown)
			}
			for i := range got {
				if got[i].kind != tc.want[i].kind || got[i].component != tc.want[i].component || !strings.Contains(got[i].have, tc.want[i].have) {
					t.Errorf("violation %d = %+v, want %+v", i, v.Violations[i], tc.want[i])
				}
				if v.Violations[i].Rule == "" || v.Violations[i].Reason == "" || v.Violations[i].Want == "" || v.Violations[i].Field == "" {
					t.Errorf("violation %d lacks rule, reason, want or field: %+v", i, v.Violations[i])
				}
			}
			if len(v.Unknown) != len(tc.unknown) {
				t.Fatalf("unknown = %q, want %q", v.Unknown, tc.unknown)
			}
			for i := range tc.unknown {
				if !strings.Contains(v.Unknown[i], tc.unknown[i]) {
					t.Errorf("unknown[%d] = %q, want it to contain %q", i, v.Unknown[i], tc.unknown[i])
				}
			}
			if v.Checked == 0 {
				t.Errorf("nothing checked")
			}
			if ok := len(tc.want) == 0 && len(tc.unknown) == 0; v.OK() != ok {
				t.Errorf("OK() = %v, want %v", v.OK(), ok)
			}
		})
	}
}

func TestViolationText(t *testing.T) {
	t.Parallel()
	m := mustParse(t, testMatrix)
	n := pinnedNode()
	n.Driver, n.FabricManager = "545.23.08", "545.23.08"
	v := m.Evaluate(n)
	if len(v.Violations) != 1 {
		t.Fatalf("%+v", v.Violations)
	}
	got := v.Violations[0]
	wantV := Violation{
		Kind: KindDriver, Rule: "gpus[0] at line 3", Component: "node", Field: "driver",
		Have: "545.23.08", Want: "535.129.03 | >=550.90.07, <551",
		Reason: "driver 545.23.08 is not allowed for NVIDIA H100 80GB HBM3 (allowed: 535.129.03 | >=550.90.07, <551): qualified set",
	}
	if got != wantV {
		t.Errorf("got  %+v\nwant %+v", got, wantV)
	}
	if s := got.String(); !strings.HasPrefix(s, "node: driver 545.23.08") {
		t.Errorf("String() = %q", s)
	}
}

func TestFirstGPURuleWins(t *testing.T) {
	t.Parallel()
	m := mustParse(t, testMatrix)
	n := pinnedNode()
	for i := range n.GPUs {
		n.GPUs[i].Name = "NVIDIA H100 PCIe" // the general "H100" rule: any 535
	}
	n.Driver, n.FabricManager, n.CUDA = "535.54.03", "", ""
	if v := m.Evaluate(n); !v.OK() {
		t.Errorf("H100 PCIe on 535.54.03: %+v", v)
	}
	n = pinnedNode()
	n.Driver, n.FabricManager = "535.54.03", "535.54.03" // not in the SXM rule
	if v := m.Evaluate(n); len(v.Violations) != 1 || v.Violations[0].Kind != KindDriver {
		t.Errorf("H100 SXM on 535.54.03: %+v", v)
	}
}

func TestMixedGPUModels(t *testing.T) {
	t.Parallel()
	m := mustParse(t, testMatrix)
	n := pinnedNode()
	n.GPUs[7].Name = "NVIDIA A100-SXM4-80GB"
	n.Driver, n.FabricManager, n.CUDA = "550.90.07", "550.90.07", "12.4"
	v := m.Evaluate(n)
	// The H100 rule allows 550.90.07; the A100 rule (535.* only) does not.
	if len(v.Violations) != 1 || v.Violations[0].Kind != KindDriver || !strings.Contains(v.Violations[0].Reason, "A100") {
		t.Errorf("%+v", v.Violations)
	}
}

func TestOKNeedsSomethingChecked(t *testing.T) {
	t.Parallel()
	m := mustParse(t, "hcas:\n  - model: MT4129\n    min_firmware: 28.39.1002\n")
	v := m.Evaluate(Node{Kernel: "6.5.0"})
	if v.OK() || v.Checked != 0 || len(v.Unknown) != 0 {
		t.Errorf("nothing applies, yet %+v OK=%v", v, v.OK())
	}
	var nilM *Matrix
	if v := nilM.Evaluate(pinnedNode()); v.OK() {
		t.Errorf("nil matrix: OK")
	}
}

func TestAllows(t *testing.T) {
	t.Parallel()
	m := mustParse(t, testMatrix)
	tests := []struct {
		name    string
		target  Target
		ok      bool
		kinds   []Kind
		unknown []string
	}{
		{name: "no change", target: Target{}, ok: true},
		{name: "driver alone: FM must move too, CUDA unknown",
			target: Target{Driver: "550.90.07"}, kinds: []Kind{KindFabricManager}, unknown: []string{"cuda: version unknown"}},
		{name: "driver with FM same and CUDA", target: Target{Driver: "550.90.07", FabricManager: "same", CUDA: "12.4"}, ok: true},
		{name: "driver with explicit FM", target: Target{Driver: "550.90.07", FabricManager: "550.90.07", CUDA: "12.4"}, ok: true},
		{name: "driver not allowed", target: Target{Driver: "560.35.03", FabricManager: "same", CUDA: "12.6"},
			kinds: []Kind{KindDriver, KindCUDA}},
		{name: "known bad driver on this VBIOS", target: Target{Driver: "550.54.14", FabricManager: "same", CUDA: "12.4", VBIOS: "96.00.74.00.01"},
			kinds: []Kind{KindDriver, KindVBIOS, KindFabricManager, KindKnownBad}},
		{name: "HCA firmware by model", target: Target{HCAFirmware: map[string]string{"mt4129": "28.38.1000"}},
			kinds: []Kind{KindHCAFirmware}},
		{name: "HCA firmware for all", target: Target{HCAFirmware: map[string]string{"*": "28.41.1000"}}, ok: true},
		{name: "RDMA stack change hits known bad", target: Target{RDMAStack: "DOCA 2.9.1"}, kinds: []Kind{KindKnownBad}},
		{name: "newer DOCA allowed", target: Target{RDMAStack: "DOCA 2.10.0"}, ok: true},
		{name: "kernel", target: Target{Kernel: "6.8.0-1010-nvidia"}, kinds: []Kind{KindKernel}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := pinnedNode()
			before := fmt.Sprintf("%+v", n)
			ok, v := m.Allows(n, tc.target)
			if after := fmt.Sprintf("%+v", n); after != before {
				t.Errorf("Allows changed the node")
			}
			if ok != tc.ok {
				t.Errorf("ok = %v, want %v (%+v)", ok, tc.ok, v)
			}
			var got []Kind
			for _, x := range v.Violations {
				if len(got) == 0 || got[len(got)-1] != x.Kind {
					got = append(got, x.Kind)
				}
			}
			if !reflect.DeepEqual(got, tc.kinds) {
				t.Errorf("kinds = %v, want %v (%+v)", got, tc.kinds, v.Violations)
			}
			if !reflect.DeepEqual(v.Unknown, tc.unknown) {
				t.Errorf("unknown = %q, want %q", v.Unknown, tc.unknown)
			}
		})
	}
}

func TestFMFollowsTargetDriver(t *testing.T) {
	t.Parallel()
	m := mustParse(t, testMatrix)
	_, v := m.Allows(pinnedNode(), Target{Driver: "550.90.07", CUDA: "12.4"})
	if len(v.Violations) != 1 {
		t.Fatalf("%+v", v)
	}
	x := v.Violations[0]
	// The node's Fabric Manager is judged against the target driver (the
	// first fabric_manager rule, 550.* → a 550 FM): it must move too.
	if x.Kind != KindFabricManager || x.Have != "535.129.03" || !strings.Contains(x.Want, "550") {
		t.Errorf("%+v", x)
	}
}

func TestNodeFromSnapshot(t *testing.T) {
	t.Parallel()
	s := &snapshot.Snapshot{
		Versions: snapshot.Versions{Driver: "535.104.05", CUDA: "12.1", Kernel: "6.5.0-1007-nvidia",
			FabricManager: "535.129.03", RDMAStack: "MLNX_OFED 23.10-1.1.9.0"},
		GPU: &snapshot.GPUState{DriverVersion: "535.129.03", CUDAVersion: "12.2", GPUs: []snapshot.GPU{
			{Index: 0, Name: "NVIDIA H100 80GB HBM3", VBIOS: "96.00.99.00.01", Fabric: &snapshot.Fabric{State: "Completed"}},
			{Index: 1, Name: "NVIDIA H100 80GB HBM3", VBIOS: "96.00.99.00.01"},
		}},
		HCAs: []snapshot.HCA{{Name: "mlx5_0", Model: "MT4129", FWVersion: "28.39.1002"}},
	}
	n := NodeFromSnapshot(s)
	want := Node{
		Driver: "535.129.03", CUDA: "12.2", FabricManager: "535.129.03", RDMAStack: "MLNX_OFED 23.10-1.1.9.0",
		Kernel: "6.5.0-1007-nvidia", NVSwitch: boolp(true),
		GPUs: []GPU{{0, "NVIDIA H100 80GB HBM3", "96.00.99.00.01"}, {1, "NVIDIA H100 80GB HBM3", "96.00.99.00.01"}},
		HCAs: []HCA{{"mlx5_0", "MT4129", "28.39.1002"}},
	}
	if !reflect.DeepEqual(n, want) {
		t.Errorf("got  %+v\nwant %+v", n, want)
	}
	// Without GPU state the recorded versions stand; "Not Supported" is no fabric evidence.
	s.GPU = &snapshot.GPUState{GPUs: []snapshot.GPU{{Index: 0, Fabric: &snapshot.Fabric{State: "Not Supported"}}}}
	n = NodeFromSnapshot(s)
	if n.Driver != "535.104.05" || n.CUDA != "12.1" || n.NVSwitch != nil {
		t.Errorf("%+v", n)
	}
	if n := NodeFromSnapshot(nil); !reflect.DeepEqual(n, Node{}) {
		t.Errorf("nil snapshot: %+v", n)
	}
}

func TestJudges(t *testing.T) {
	t.Parallel()
	m := mustParse(t, "hcas:\n  - model: MT4129\n    min_firmware: 28.39.1002\nkernels: '*'\n")
	for k, want := range map[Kind]bool{KindHCAFirmware: true, KindKernel: true, KindDriver: false, KindKnownBad: false, KindVBIOS: false} {
		if got := m.Judges(k); got != want {
			t.Errorf("Judges(%s) = %v, want %v", k, got, want)
		}
	}
	full := mustParse(t, testMatrix)
	for _, k := range []Kind{KindDriver, KindCUDA, KindVBIOS, KindFabricManager, KindHCAFirmware, KindRDMAStack, KindKernel, KindKnownBad} {
		if !full.Judges(k) {
			t.Errorf("Judges(%s) = false", k)
		}
	}
}

// The shipped example accepts the real pinned tuple it was built from.
func TestExampleMatrix(t *testing.T) {
	t.Parallel()
	m, err := Load(filepath.Join("..", "..", "examples", "matrix.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	n := pinnedNode()
	n.RDMAStack = "MLNX_OFED_LINUX-23.10-1.1.9.0" // as ofed_info -s prints it
	if v := m.Evaluate(n); !v.OK() {
		t.Fatalf("pinned tuple: %+v", v)
	}
	// The documented failure: upgrading the driver without Fabric Manager.
	ok, v := m.Allows(n, Target{Driver: "550.90.07", CUDA: "12.4"})
	if ok || len(v.Violations) != 1 || v.Violations[0].Kind != KindFabricManager {
		t.Errorf("driver without FM: ok=%v %+v", ok, v)
	}
	if ok, v := m.Allows(n, Target{Driver: "570.133.20", CUDA: "12.8", FabricManager: "same"}); !ok {
		t.Errorf("R570 with FM: %+v", v)
	}
	if ok, v := m.Allows(n, Target{RDMAStack: "DOCA 2.10.0"}); ok || len(v.Violations) != 2 {
		t.Errorf("DOCA: ok=%v %+v", ok, v)
	}
	// The tuple of the demo bundles (examples/bundles/h100-*) passes too: a
	// BlueField-3 (MT41692) that no rule names is not judged.
	demo := pinnedNode()
	demo.Driver, demo.FabricManager, demo.Kernel = "535.161.08", "535.161.08", "5.15.0-105-generic"
	for i := range demo.GPUs {
		demo.GPUs[i].VBIOS = "96.00.74.00.0D"
	}
	for i := range demo.HCAs {
		demo.HCAs[i].FW = "28.41.1000"
	}
	demo.HCAs = append(demo.HCAs, HCA{Name: "mlx5_bond_0", Model: "MT41692", FW: "32.38.3056"})
	if v := m.Evaluate(demo); !v.OK() {
		t.Errorf("demo bundle tuple: %+v", v)
	}
	// ... and that old VBIOS is the one the known-bad driver must not meet.
	if ok, v := m.Allows(demo, Target{Driver: "550.54.14", CUDA: "12.4", FabricManager: "same"}); ok || v.Violations[len(v.Violations)-1].Kind != KindKnownBad {
		t.Errorf("550.54.14 on 96.00.74: ok=%v %+v", ok, v)
	}
}
