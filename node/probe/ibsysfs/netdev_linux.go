//go:build linux

package ibsysfs

import (
	"fmt"
	"net"
	"sync"

	"github.com/Mellanox/rdmamap"
)

// LiveNetDevMapper maps RDMA devices to network interfaces on the running
// host with github.com/Mellanox/rdmamap. rdmamap reads fixed paths under the
// real /sys, which is why it sits behind NetDevMapper and is never used for
// bundles or fixtures. The mapping is built once, on first use, and kept:
// build a new mapper for each probe pass. Safe for concurrent use.
type LiveNetDevMapper struct {
	once  sync.Once
	byDev map[string]string
	err   error
}

// NewLiveNetDevMapper returns a mapper for the running host.
func NewLiveNetDevMapper() *LiveNetDevMapper { return &LiveNetDevMapper{} }

// NetDevice returns the interface of rdmaDev, or ErrNoNetDevice.
func (m *LiveNetDevMapper) NetDevice(rdmaDev string) (string, error) {
	m.once.Do(m.build)
	if m.err != nil {
		return "", m.err
	}
	nd, ok := m.byDev[rdmaDev]
	if !ok {
		return "", fmt.Errorf("%s: %w", rdmaDev, ErrNoNetDevice)
	}
	return nd, nil
}

// build asks rdmamap about every interface: it only maps netdev → RDMA
// device. Interfaces come in index order, so a physical or bond interface
// wins over VLANs created on top of it later (they share the GID table).
func (m *LiveNetDevMapper) build() {
	ifaces, err := net.Interfaces()
	if err != nil {
		m.err = fmt.Errorf("list network interfaces: %w", err)
		return
	}
	m.byDev = make(map[string]string)
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		// rdmamap slices the address as IPoIB (20 bytes) or reads Ethernet
		// GIDs; other link types are not RDMA interfaces.
		if n := len(ifc.HardwareAddr); n != 6 && n != 20 {
			continue
		}
		dev, err := rdmaDeviceFor(ifc.Name)
		if err != nil || dev == "" {
			continue
		}
		if _, seen := m.byDev[dev]; !seen {
			m.byDev[dev] = ifc.Name
		}
	}
}

// rdmaDeviceFor wraps rdmamap, whose IPoIB path slices sysfs values without
// length checks: a malformed node_guid must cost one mapping, not the agent.
func rdmaDeviceFor(netdev string) (dev string, err error) {
	defer func() {
		if p := recover(); p != nil {
			dev, err = "", fmt.Errorf("rdmamap %s: panic: %v", netdev, p)
		}
	}()
	return rdmamap.GetRdmaDeviceForNetdevice(netdev)
}
