package baselines

import (
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// RecordReport is what recording baselines from stored results did: the
// versions it wrote, and the selected nodes it left out, each with why.
type RecordReport struct {
	Recorded []Baseline `json:"recorded"`
	Skipped  []Skipped  `json:"skipped"`
}

// Skipped is a node a record left out.
type Skipped struct {
	Node   string `json:"node"`
	Reason string `json:"reason"`
}

// StackFromInventory is the stack a node's inventory reports: its driver
// and RDMA stack. The report's inventory carries no NCCL version.
func StackFromInventory(inv report.Inventory) Stack {
	return Stack{Driver: inv.DriverVersion, RDMAStack: inv.RDMAStack}.Normalize()
}

// Or fills the fields s leaves unknown from o: an operator's --driver
// wins over what the node reports, and what the node reports fills the
// rest.
func (s Stack) Or(o Stack) Stack {
	if s.Driver == "" {
		s.Driver = o.Driver
	}
	if s.NCCL == "" {
		s.NCCL = o.NCCL
	}
	if s.RDMAStack == "" {
		s.RDMAStack = o.RDMAStack
	}
	return s
}
