package sim

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

func TestParseFault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		words string
		want  Fault
		err   string
	}{
		{"ib_port_down mlx5_4", IBPortDown{HCA: "mlx5_4"}, ""},
		{"ecc_uncorrectable GPU3 2", ECCUncorrectable{GPU: 3, Count: 2}, ""},
		{"ecc_uncorrectable 3", ECCUncorrectable{GPU: 3, Count: 1}, ""},
		{"xid GPU1 79", Xid{GPU: 1, Code: 79}, ""},
		{"slow_node node 0.7", SlowNode{Factor: 0.7}, ""},
		{"slow_node 0.5", SlowNode{Factor: 0.5}, ""},
		{"hung_nvidia_smi", HungNvidiaSMI{}, ""},
		{"nvlink_errors GPU2 4 7", NVLinkErrors{GPU: 2, Link: 4, PerPass: 7}, ""},
		{"dcgm_failure GPU0 GPU_Memory", DCGMFailure{GPU: 0, Test: "GPU Memory"}, ""},
		{"pcie_downtrained GPU5", PCIeDowntrained{GPU: 5, Width: 8}, ""},
		{"", nil, "empty fault"},
		{"gpu_on_fire GPU0", nil, `unknown fault kind "gpu_on_fire"`},
		{"xid GPU1", nil, "xid code"},
		{"xid GPUx 79", nil, "GPU (GPUi or an index)"},
		{"slow_node 1.5", nil, "factor"},
		{"ib_port_down mlx5_4 extra", nil, "at most 1 values"},
		{"ecc_uncorrectable GPU0 -1", nil, "value (0.."},
		{"ib_rate_drop mlx5_0", nil, "rate in Gb/s"},
	} {
		f, err := ParseFault(strings.Fields(tc.words))
		if tc.err != "" {
			if err == nil || !errors.Is(err, ErrBadFault) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.words, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(f, tc.want) {
			t.Errorf("%q: %#v, %v; want %#v", tc.words, f, err, tc.want)
		}
	}
}

// TestStateRoundTrip: a node's state, written as JSON and restored on a
// new node of the same spec, renders the same driver and faults; the
// action counts survive.
func TestStateRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	spec := DefaultSpec("gpu-001")
	spec.Clock = ClockFunc(func() time.Time { return at })
	n, err := New(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range [][]string{
		{ActionDriverUpgrade, "550.90.07"},
		{ActionFault, "ib_port_down", "mlx5_2"},
		{ActionFault, "ecc_uncorrectable", "GPU3", "2"},
		{ActionXidInject, "48", "1"},
		{ActionFault, "ghost_process", "GPU0", "1024"},
	} {
		if _, err := n.RunAction(ctx, a[0], a[1:]); err != nil {
			t.Fatalf("%v: %v", a, err)
		}
	}
	b, err := json.Marshal(n.State())
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	at = at.Add(time.Minute) // the restart: the new node is built later
	m, err := New(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Restore(st); err != nil {
		t.Fatal(err)
	}
	if m.Driver() != "550.90.07" || m.ActionCount(ActionDriverUpgrade) != 1 || m.ActionCount(ActionFault) != 3 {
		t.Errorf("restored driver %s, upgrades %d, faults set %d", m.Driver(), m.ActionCount(ActionDriverUpgrade), m.ActionCount(ActionFault))
	}
	if !reflect.DeepEqual(m.Faults(), n.Faults()) {
		t.Errorf("restored faults %v, want %v", m.Faults(), n.Faults())
	}
	if !m.Boot().Equal(n.Boot()) {
		t.Errorf("restored boot %v, want %v", m.Boot(), n.Boot())
	}
	at = at.Add(time.Minute)
	for _, src := range []snapshot.Source{snapshot.SrcNvidiaSMI, snapshot.SrcKernelLog, snapshot.SrcVersions} {
		a, b := n.Capture(ctx, src), m.Capture(ctx, src)
		if string(a.Data) != string(b.Data) {
			al, bl := strings.Split(string(a.Data), "\n"), strings.Split(string(b.Data), "\n")
			for i := range min(len(al), len(bl)) {
				if al[i] != bl[i] {
					t.Errorf("%s renders differently after the restore: line %d %q, was %q", src, i+1, bl[i], al[i])
					break
				}
			}
		}
	}
	// A state that does not fit the node is refused.
	st.Faults = append(st.Faults, FaultRecord{Kind: KindIBPortDown, HCA: "mlx5_99"})
	if err := m.Restore(st); err == nil || !errors.Is(err, ErrBadFault) {
		t.Errorf("restore of a fault on a missing HCA: %v", err)
	}
	if err := m.Restore(State{Driver: "latest"}); err == nil {
		t.Error("restore of a driver that is no version: no error")
	}
}

// TestSimFaultActions: sim-fault and sim-clear set and clear any fault kind;
// reboot drops the Xids and keeps hardware faults; pcie-bandwidth drops
// with a downtrained link.
func TestSimFaultActions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n, err := New(DefaultSpec("gpu-001"))
	if err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := n.RunAction(ctx, name, args)
		if err != nil {
			t.Fatalf("%s %v: %v", name, args, err)
		}
		return out
	}
	healthy := run(ActionPCIeBandwidth)
	if !strings.Contains(healthy, "metric pcie.h2d_bandwidth_gbps 55.2\n") {
		t.Errorf("healthy pcie-bandwidth:\n%s", healthy)
	}
	run(ActionFault, "pcie_downtrained", "GPU2", "8")
	if out := run(ActionPCIeBandwidth); !strings.Contains(out, "metric pcie.h2d_bandwidth_gbps 27.6\n") {
		t.Errorf("pcie-bandwidth with an x8 link:\n%s", out)
	}
	run(ActionFault, "xid", "GPU1", "79")
	run(ActionFault, "ib_port_down", "mlx5_0")
	if len(n.Faults()) != 3 {
		t.Fatalf("faults: %v", n.Faults())
	}
	run(ActionReboot)
	for _, f := range n.Faults() {
		if f.Kind() == KindXid {
			t.Errorf("Xid survived the reboot: %v", n.Faults())
		}
	}
	run(ActionClear, "ib_port_down", "mlx5_0")
	run(ActionClear, "pcie_downtrained", "2")
	if fs := n.Faults(); len(fs) != 0 {
		t.Errorf("faults after the clears: %v", fs)
	}
	if _, err := n.RunAction(ctx, ActionFault, []string{"ib_port_down", "mlx5_42"}); !errors.Is(err, ErrBadFault) {
		t.Errorf("fault on a missing HCA: %v", err)
	}
	if _, err := n.RunAction(ctx, ActionClear, []string{"nonsense"}); !errors.Is(err, ErrBadFault) {
		t.Errorf("clear of an unknown kind: %v", err)
	}
	if c := n.ActionCount(ActionFault); c != 3 {
		t.Errorf("sim-fault counted %d, want 3 (failed runs do not count)", c)
	}
}
