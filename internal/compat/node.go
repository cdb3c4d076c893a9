package compat

import (
	"fmt"
	"strings"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Node is what the matrix judges: one node's hardware models and software
// versions. An empty string is "unknown", never "none".
type Node struct {
	GPUs          []GPU
	Driver        string // "535.129.03"
	CUDA          string // the driver's CUDA version as nvidia-smi reports it, "12.2"
	FabricManager string // "535.129.03"
	RDMAStack     string // "MLNX_OFED 23.10-1.1.9.0", "DOCA 2.10.0", "inbox"
	Kernel        string // "6.5.0-1007-nvidia"
	// NVSwitch says whether the node has an NVSwitch fabric and so needs
	// Fabric Manager; nil is unknown (fabric_manager rules then apply), false
	// turns them off.
	NVSwitch *bool
	HCAs     []HCA
}

// GPU is one GPU's identity.
type GPU struct {
	Index int    // nvidia-smi order; names the component GPU<Index>
	Name  string // product name, "NVIDIA H100 80GB HBM3"
	VBIOS string // "96.00.99.00.01"
}

// HCA is one RDMA adapter.
type HCA struct {
	Name  string // "mlx5_0"
	Model string // hca_type, "MT4129"
	FW    string // "28.39.1002"
}

// NodeFromSnapshot gathers what the matrix needs from a snapshot. Driver and
// CUDA come from the GPU state when there is one (the driver answering is
// the truth), else from the recorded versions.
func NodeFromSnapshot(s *snapshot.Snapshot) Node {
	var n Node
	if s == nil {
		return n
	}
	n.Driver = s.Versions.Driver
	n.CUDA = s.Versions.CUDA
	n.FabricManager = s.Versions.FabricManager
	n.RDMAStack = s.Versions.RDMAStack
	n.Kernel = s.Versions.Kernel
	if g := s.GPU; g != nil {
		if g.DriverVersion != "" {
			n.Driver = g.DriverVersion
		}
		if g.CUDAVersion != "" {
			n.CUDA = g.CUDAVersion
		}
		for _, gpu := range g.GPUs {
			n.GPUs = append(n.GPUs, GPU{Index: gpu.Index, Name: gpu.Name, VBIOS: gpu.VBIOS})
			// A GPU that reports a fabric state other than "Not Supported" sits
			// on an NVSwitch fabric. Absence proves nothing: older drivers do
			// not report the fabric at all.
			if f := gpu.Fabric; f != nil && f.State != "" && !strings.EqualFold(f.State, "Not Supported") {
				yes := true
				n.NVSwitch = &yes
			}
		}
	}
	for _, h := range s.HCAs {
		n.HCAs = append(n.HCAs, HCA{Name: h.Name, Model: h.Model, FW: h.FWVersion})
	}
	return n
}

// Kind is the type of rule a violation broke.
type Kind string

const (
	KindDriver        Kind = "driver"
	KindCUDA          Kind = "cuda"
	KindVBIOS         Kind = "vbios"
	KindFabricManager Kind = "fabric_manager"
	KindHCAFirmware   Kind = "hca_firmware"
	KindRDMAStack     Kind = "rdma_stack"
	KindKernel        Kind = "kernel"
	KindKnownBad      Kind = "known_bad"
)

// Violation is one rule the node breaks.
type Violation struct {
	Kind      Kind
	Rule      string // the rule broken: "gpus[0] at line 4"
	Component string // "node", "GPU3", "mlx5_0"
	Field     string // what was judged: "driver", "vbios", ...; "driver+vbios" for known_bad
	Have      string // the node's value(s)
	Want      string // what the rule allows ("535.* | >=550.90.07"), or the bad combination
	Reason    string // why: the rule's reason, or a sentence built from Have and Want
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %s", v.Component, v.Reason)
}

// Verdict is the matrix's answer for one node.
type Verdict struct {
	// Violations are rules the node definitely breaks.
	Violations []Violation
	// Unknown lists rules that applied but could not be judged because a
	// value was unknown ("kernel: version unknown"). A verdict with unknowns
	// is inconclusive, never a pass.
	Unknown []string
	// Checked counts the rule evaluations that reached a definite answer.
	Checked int
}

// OK reports whether the node is known to be allowed: no violation, nothing
// unknown, and at least one rule judged.
func (v Verdict) OK() bool {
	return len(v.Violations) == 0 && len(v.Unknown) == 0 && v.Checked > 0
}

// Target is a set of versions a rollout wants to move a node to. Empty
// fields keep the node's value.
type Target struct {
	Driver string
	// CUDA is the driver's CUDA version. nvidia-smi's CUDA version belongs to
	// the driver, so when Driver changes and CUDA is empty, CUDA becomes
	// unknown rather than keeping the old driver's value.
	CUDA string
	// FabricManager "same" means it moves with the driver. When Driver
	// changes and FabricManager is empty, the node's current Fabric Manager
	// is judged against the new driver: the verdict then says it must move too.
	FabricManager string
	VBIOS         string // applies to every GPU
	// HCAFirmware maps an HCA model (hca_type, "MT4129") to its new
	// firmware; the key "*" applies to every HCA.
	HCAFirmware map[string]string
	RDMAStack   string
	Kernel      string
}

// Apply returns n with the target's versions in place.
func (t Target) Apply(n Node) Node {
	out := n
	if t.Driver != "" && t.Driver != n.Driver {
		out.Driver = t.Driver
		out.CUDA = ""
	}
	if t.CUDA != "" {
		out.CUDA = t.CUDA
	}
	switch t.FabricManager {
	case "":
	case "same":
		out.FabricManager = out.Driver
	default:
		out.FabricManager = t.FabricManager
	}
	if t.VBIOS != "" || len(n.GPUs) > 0 {
		out.GPUs = make([]GPU, len(n.GPUs))
		copy(out.GPUs, n.GPUs)
		if t.VBIOS != "" {
			for i := range out.GPUs {
				out.GPUs[i].VBIOS = t.VBIOS
			}
		}
	}
	if len(n.HCAs) > 0 {
		out.HCAs = make([]HCA, len(n.HCAs))
		copy(out.HCAs, n.HCAs)
		for i := range out.HCAs {
			if fw, ok := firmwareFor(t.HCAFirmware, out.HCAs[i].Model); ok {
				out.HCAs[i].FW = fw
			}
		}
	}
	if t.RDMAStack != "" {
		out.RDMAStack = t.RDMAStack
	}
	if t.Kernel != "" {
		out.Kernel = t.Kernel
	}
	return out
}

// firmwareFor finds a model's target firmware: its own entry (hca_type
// names are compared case-insensitively), else the "*" entry.
func firmwareFor(fw map[string]string, model string) (string, bool) {
	for k, v := range fw {
		if k != "*" && strings.EqualFold(k, model) {
			return v, true
		}
	}
	v, ok := fw["*"]
	return v, ok
}

// Allows answers "would this target be allowed on this node?": the node
// with the target's versions in place, judged by the matrix. ok is true only
// when the verdict is OK: a violation or anything unknown makes it false, and
// the verdict says which.
func (m *Matrix) Allows(n Node, t Target) (ok bool, v Verdict) {
	v = m.Evaluate(t.Apply(n))
	return v.OK(), v
}

// Judges reports whether the matrix has rules of a kind, so a caller can
// tell "no rule" from "rule not judged" when its own data is missing.
func (m *Matrix) Judges(k Kind) bool {
	if m == nil {
		return false
	}
	switch k {
	case KindDriver:
		for _, r := range m.gpus {
			if len(r.drivers) > 0 {
				return true
			}
		}
	case KindCUDA:
		for _, r := range m.gpus {
			if len(r.cuda) > 0 {
				return true
			}
		}
	case KindVBIOS:
		for _, r := range m.gpus {
			if len(r.vbios) > 0 {
				return true
			}
		}
	case KindFabricManager:
		return len(m.fabric) > 0
	case KindHCAFirmware:
		return len(m.hcas) > 0
	case KindRDMAStack:
		return len(m.rdma) > 0
	case KindKernel:
		return len(m.kernels) > 0
	case KindKnownBad:
		return len(m.knownBad) > 0
	}
	return false
}
