// Package registry is the one explicit list of checks, in report order.
package registry

import (
	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/compatcheck"
	"github.com/fleetcheck/fleetcheck/checks/gpuchecks"
	"github.com/fleetcheck/fleetcheck/checks/ibchecks"
	"github.com/fleetcheck/fleetcheck/checks/kernelchecks"
	"github.com/fleetcheck/fleetcheck/checks/perfchecks"
	"github.com/fleetcheck/fleetcheck/report"
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

// CauseOrder lists the checks' names causes first (report.CauseOrder).
func CauseOrder() []string { return report.CauseOrder() }
