// Package registry is the one explicit list of checks, in report order.
package registry

import (
	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/compatcheck"
	"github.com/fleetcheck/fleetcheck/checks/gpuchecks"
	"github.com/fleetcheck/fleetcheck/checks/ibchecks"
	"github.com/fleetcheck/fleetcheck/checks/kernelchecks"
	"github.com/fleetcheck/fleetcheck/checks/perfchecks"
)

// All returns every check fleetcheck knows, in the order reports list them.
func All() []checks.Check {
	return []checks.Check{
		gpuchecks.Inventory{},
		gpuchecks.Config{},
		gpuchecks.ECC{},
		kernelchecks.Xid{},
		gpuchecks.Thermal{},
		gpuchecks.PCIe{},
		kernelchecks.NVLink{},
		kernelchecks.Fabric{},
		gpuchecks.Processes{},
		ibchecks.PeerMem{},
		ibchecks.Ports{},
		ibchecks.Counters{},
		perfchecks.AllReduce{},
		perfchecks.DCGMDiag{},
		compatcheck.Matrix{},
	}
}

// Names returns the names of all checks.
func Names() []string {
	all := All()
	out := make([]string, len(all))
	for i, c := range all {
		out[i] = c.Name()
	}
	return out
}

// CauseOrder lists the checks' names causes first, for reading one node's
// findings (report.FindingsByCause): the driver's own account of a fault
// (an Xid such as 79, fallen off the bus) before the missing GPU it leaves
// in the inventory; the GPU checks before the link checks; a port's state
// before the counters its going down raised; measurements last.
func CauseOrder() []string {
	return []string{
		"gpu.xid", "gpu.inventory", "gpu.fabric", "gpu.ecc", "gpu.thermal", "gpu.pcie", "gpu.nvlink",
		"gpu.config", "gpu.processes", "gpu.peermem", "ib.ports", "ib.counters",
		"fw.matrix", "dcgm.diag", "nccl.allreduce",
	}
}
