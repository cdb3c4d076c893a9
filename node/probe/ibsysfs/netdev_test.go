package ibsysfs

import (
	"errors"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

type fakeMapper struct {
	m     map[string]string
	calls []string
}

func (f *fakeMapper) NetDevice(dev string) (string, error) {
	f.calls = append(f.calls, dev)
	if nd, ok := f.m[dev]; ok {
		return nd, nil
	}
	return "", ErrNoNetDevice
}

func TestFillNetDevices(t *testing.T) {
	t.Parallel()
	hcas := []snapshot.HCA{
		{Name: "mlx5_0", Ports: []snapshot.IBPort{{Port: 1, LinkLayer: "InfiniBand"}}},
		{Name: "mlx5_bond_0", Ports: []snapshot.IBPort{{Port: 1, LinkLayer: "Ethernet"}}},
		{Name: "mlx5_2", Ports: []snapshot.IBPort{{Port: 1, LinkLayer: "Ethernet"}}},                     // unmapped
		{Name: "mlx5_3", NetDevice: "keep0", Ports: []snapshot.IBPort{{Port: 1, LinkLayer: "Ethernet"}}}, // already known
	}
	f := &fakeMapper{m: map[string]string{"mlx5_bond_0": "bond0", "mlx5_0": "ib0", "mlx5_3": "other"}}
	FillNetDevices(hcas, f)
	got := []string{hcas[0].NetDevice, hcas[1].NetDevice, hcas[2].NetDevice, hcas[3].NetDevice}
	want := []string{"", "bond0", "", "keep0"}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s.NetDevice = %q, want %q", hcas[i].Name, got[i], want[i])
		}
		if len(hcas[i].Errors) != 0 {
			t.Errorf("%s: mapping must not add errors: %v", hcas[i].Name, hcas[i].Errors)
		}
	}
	if len(f.calls) != 2 {
		t.Errorf("mapper asked about %v; only RoCE devices without a name should be", f.calls)
	}
	FillNetDevices(hcas, nil) // no mapper: nothing happens
}

func TestFillNetDevicesFixture(t *testing.T) {
	t.Parallel()
	hcas, err := Read(fixtureFS)
	if err != nil {
		t.Fatal(err)
	}
	FillNetDevices(hcas, &fakeMapper{m: map[string]string{"mlx5_bond_0": "bond0"}})
	for _, h := range hcas {
		want := ""
		if h.Name == "mlx5_bond_0" {
			want = "bond0"
		}
		if h.NetDevice != want {
			t.Errorf("%s.NetDevice = %q, want %q", h.Name, h.NetDevice, want)
		}
	}
}

// The live mapper reads the real host; on a machine without this device it
// must answer with an error, not panic.
func TestLiveNetDevMapperUnknownDevice(t *testing.T) {
	t.Parallel()
	m := NewLiveNetDevMapper()
	nd, err := m.NetDevice("fleetcheck_no_such_rdma_dev")
	if err == nil || nd != "" {
		t.Fatalf("NetDevice = %q, %v; want an error", nd, err)
	}
	var _ NetDevMapper = m
	if !errors.Is(err, ErrNoNetDevice) {
		t.Logf("mapping unavailable here: %v", err)
	}
}
