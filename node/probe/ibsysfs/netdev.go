package ibsysfs

import (
	"errors"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// NetDevMapper finds the network interface of an RDMA device (for RoCE,
// the Ethernet interface its GIDs belong to). The live implementation reads
// the real /sys and netlink, so tests and bundles use other implementations.
type NetDevMapper interface {
	NetDevice(rdmaDev string) (string, error)
}

// ErrNoNetDevice says an RDMA device has no network interface.
var ErrNoNetDevice = errors.New("no network interface for RDMA device")

// FillNetDevices sets NetDevice on every HCA that has an Ethernet (RoCE)
// port and no NetDevice yet, as m reports it. The name is informational: a
// device m cannot map keeps an empty NetDevice and no error is recorded, so
// that a mapping problem never turns a healthy port into a finding. A nil m
// does nothing.
func FillNetDevices(hcas []snapshot.HCA, m NetDevMapper) {
	if m == nil {
		return
	}
	for i := range hcas {
		h := &hcas[i]
		if h.NetDevice != "" || !hasEthernetPort(*h) {
			continue
		}
		if nd, err := m.NetDevice(h.Name); err == nil {
			h.NetDevice = nd
		}
	}
}

func hasEthernetPort(h snapshot.HCA) bool {
	for _, p := range h.Ports {
		if p.LinkLayer == "Ethernet" {
			return true
		}
	}
	return false
}
