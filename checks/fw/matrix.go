// Package fw is fw.matrix: the node's driver, VBIOS, HCA firmware,
// Fabric Manager, RDMA stack and kernel judged against the compatibility
// matrix in the config.
package fw

import (
	"fmt"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/compat"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Finding codes.
const (
	CodeDriverNotAllowed  = "DRIVER_NOT_ALLOWED"
	CodeCUDANotAllowed    = "CUDA_NOT_ALLOWED"
	CodeVBIOSNotAllowed   = "VBIOS_NOT_ALLOWED"
	CodeFabricManager     = "FABRIC_MANAGER_MISMATCH"
	CodeHCAFirmware       = "HCA_FW_NOT_ALLOWED"
	CodeHCAFirmwareTooOld = "HCA_FW_TOO_OLD"
	CodeRDMAStack         = "RDMA_STACK_NOT_ALLOWED"
	CodeKernel            = "KERNEL_NOT_ALLOWED"
	CodeKnownBad          = "KNOWN_BAD_COMBINATION"
	CodeViolation         = "FW_MATRIX_VIOLATION" // a rule kind this check does not know by name
	CodeUnknown           = "FW_MATRIX_UNKNOWN"
)

// Matrix is the fw.matrix check.
type Matrix struct{}

var _ checks.Check = Matrix{}

// Name is the check's fixed name.
func (Matrix) Name() string { return "fw.matrix" }

// Needs is nil: the check judges what the snapshot holds and reports what it
// could not tell, rather than skipping on one absent source.
func (Matrix) Needs() []snapshot.Source { return nil }

// Disruptive is false: the check only reads the snapshot.
func (Matrix) Disruptive() bool { return false }

// Run judges the snapshot against the configured matrix.
//
// Every violation fails with action drain: a node outside the matrix runs a
// combination nobody qualified (or one known to break), and the remedy, an
// update of driver, firmware or stack, needs the node out of service
// anyway. Rules that could not be judged make the check warn with
// FW_MATRIX_UNKNOWN: a partial answer is never a silent pass.
func (Matrix) Run(in checks.Input) checks.Result {
	if in.Config == nil || in.Config.Matrix == nil {
		if in.Config != nil && in.Config.MatrixFile != "" {
			return checks.Errorf("matrix_file %q was not loaded (load the config with config.Load)", in.Config.MatrixFile)
		}
		return checks.Skipf("no compatibility matrix configured")
	}
	m := in.Config.Matrix
	// GPU rules cannot be judged from a GPU source that failed: that is an
	// error, as for every GPU check, not an unknown.
	// An absent source is different: the GPU rules come out unknown.
	if failed(in.Snap, snapshot.SrcNvidiaSMI) {
		r, _ := checks.SourceGate(in.Snap, snapshot.SrcNvidiaSMI)
		return r
	}
	node := compat.NodeFromSnapshot(in.Snap)
	if ns := in.Config.Expect.NVSwitch; ns != nil {
		v := *ns
		node.NVSwitch = &v
	}
	v := m.Evaluate(node)
	// An adapter walk that failed leaves HCAs unknown, not absent.
	if failed(in.Snap, snapshot.SrcInfiniBand) && m.Judges(compat.KindHCAFirmware) {
		v.Unknown = append(v.Unknown, fmt.Sprintf("hcas: %s %s", snapshot.SrcInfiniBand, in.Snap.Source(snapshot.SrcInfiniBand).State))
	}

	var res checks.Result
	res.Status = report.Pass
	for _, viol := range v.Violations {
		res.Add(report.Finding{
			Severity:  report.SevFail,
			Component: viol.Component,
			PCIBusID:  busID(in.Snap, viol.Component),
			Code:      code(viol),
			// The reason already says what is allowed; add what the node
			// has and which rule to look at.
			Message: fmt.Sprintf("%s (have %s; rule %s)", viol.Reason, viol.Have, viol.Rule),
			Action:  report.ActionDrain,
		})
	}
	switch {
	case len(v.Unknown) > 0:
		res.Add(report.Finding{
			Severity:  report.SevWarn,
			Component: checks.NodeComponent,
			Code:      CodeUnknown,
			Message:   "could not judge: " + strings.Join(v.Unknown, "; "),
			Action:    report.ActionNone,
		})
		res.Reason = fmt.Sprintf("inconclusive: %d matrix rule(s) could not be judged", len(v.Unknown))
	case v.Checked == 0 && len(v.Violations) == 0:
		res.Add(report.Finding{
			Severity:  report.SevWarn,
			Component: checks.NodeComponent,
			Code:      CodeUnknown,
			Message:   "no matrix rule applies to this node",
			Action:    report.ActionNone,
		})
		res.Reason = "no matrix rule applies to this node"
	}
	res.Metric("fw.matrix.checked_count", float64(v.Checked))
	res.Metric("fw.matrix.violation_count", float64(len(v.Violations)))
	res.Metric("fw.matrix.unknown_count", float64(len(v.Unknown)))
	return res
}

func failed(s *snapshot.Snapshot, src snapshot.Source) bool {
	st := s.Source(src).State
	return st == snapshot.StateFailed || st == snapshot.StateTimeout
}

func code(v compat.Violation) string {
	switch v.Kind {
	case compat.KindDriver:
		return CodeDriverNotAllowed
	case compat.KindCUDA:
		return CodeCUDANotAllowed
	case compat.KindVBIOS:
		return CodeVBIOSNotAllowed
	case compat.KindFabricManager:
		return CodeFabricManager
	case compat.KindHCAFirmware:
		if strings.HasPrefix(v.Want, ">=") {
			return CodeHCAFirmwareTooOld
		}
		return CodeHCAFirmware
	case compat.KindRDMAStack:
		return CodeRDMAStack
	case compat.KindKernel:
		return CodeKernel
	case compat.KindKnownBad:
		return CodeKnownBad
	}
	return CodeViolation
}

// busID returns the PCI bus id of a GPU component, "" for others.
func busID(s *snapshot.Snapshot, component string) string {
	if s == nil || s.GPU == nil {
		return ""
	}
	for _, g := range s.GPU.GPUs {
		if checks.GPUComponent(g.Index) == component {
			return g.PCIBusID
		}
	}
	return ""
}
