// Package registry is the one explicit list of checks, in report order.
package registry

import (
	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/dcgm"
	"github.com/fleetcheck/fleetcheck/checks/fw"
	"github.com/fleetcheck/fleetcheck/checks/gpu"
	"github.com/fleetcheck/fleetcheck/checks/ib"
	"github.com/fleetcheck/fleetcheck/checks/nccl"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// All returns every check fleetcheck knows, in the order reports list them.
func All() []checks.Check {
	return []checks.Check{
		gpu.Inventory{},
		gpu.Config{},
		gpu.ECC{},
		gpu.Xid{},
		gpu.Thermal{},
		gpu.PCIe{},
		gpu.NVLink{},
		gpu.Fabric{},
		gpu.Processes{},
		gpu.PeerMem{},
		ib.Ports{},
		ib.Counters{},
		nccl.AllReduce{},
		dcgm.DCGMDiag{},
		fw.Matrix{},
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

// CauseOrder lists the checks' names causes first (report.CauseOrder).
func CauseOrder() []string { return report.CauseOrder() }
