package gpu

import (
	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// CodePeerMemNotLoaded is gpu.peermem's finding code; like every code it is
// stable: dashboards and drain reasons key on it.
const CodePeerMemNotLoaded = "PEERMEM_NOT_LOADED"

// PeerMem is gpu.peermem: GPUDirect RDMA needs the nvidia_peermem kernel
// module (nv_peer_mem from older MLNX_OFED) so that HCAs can read and write
// GPU memory; without it NCCL stages every transfer through host memory and
// multi-node training slows down.
//
//   - peermem.required: false → skip ("disabled in config"). Set it so on
//     nodes that use DMA-BUF instead (open kernel module, recent kernels).
//   - peermem.required: true → judged whatever the HCAs.
//   - unset → judged when the node has an InfiniBand link-layer port; skip
//     "no InfiniBand HCAs" otherwise. An adapter tree that failed to read
//     makes the check an error: it cannot tell whether the module matters.
//
// The module list decides by its source state: absent → skip, failed →
// error. A module that is not loaded fails PEERMEM_NOT_LOADED with action
// none: nothing is broken in hardware and draining would not help; the fix
// is configuration (modprobe nvidia_peermem, and load it at boot), which the
// message says.
//
// Metric: gpu.peermem.loaded_flag (1 or 0).
type PeerMem struct{}

var _ checks.Check = PeerMem{}

// Name is the check's fixed name.
func (PeerMem) Name() string { return "gpu.peermem" }

// Needs is nil: which sources matter depends on the config and the HCAs,
// so Run gates them itself.
func (PeerMem) Needs() []snapshot.Source { return nil }

// Disruptive is false: the check only reads the snapshot.
func (PeerMem) Disruptive() bool { return false }

// Run judges whether GPUDirect RDMA's module is loaded where it must be.
func (PeerMem) Run(in checks.Input) checks.Result {
	req := conf(in).PeerMem.Required
	if req != nil && !*req {
		return checks.Skipf("disabled in config")
	}
	if req == nil {
		if r, blocked := checks.SourceGate(in.Snap, snapshot.SrcInfiniBand); blocked {
			if r.Status == report.Skip {
				return checks.Skipf("no InfiniBand HCAs")
			}
			return r
		}
		if !hasInfiniBandPort(in.Snap.HCAs) {
			return checks.Skipf("no InfiniBand HCAs")
		}
	}
	if r, blocked := checks.SourceGate(in.Snap, snapshot.SrcModules); blocked {
		return r
	}
	found := ""
	for _, name := range []string{"nvidia_peermem", "nv_peer_mem"} {
		loaded, known := in.Snap.HasModule(name)
		if !known {
			return checks.Errorf("%s is ok but the module list is missing", snapshot.SrcModules)
		}
		if loaded {
			found = name
			break
		}
	}
	res := checks.Result{Status: report.Pass}
	if found == "" {
		res.Metric("gpu.peermem.loaded_flag", 0)
		res.Add(report.Finding{
			Severity:  report.SevFail,
			Component: checks.NodeComponent,
			Code:      CodePeerMemNotLoaded,
			Action:    report.ActionNone,
			Message:   "nvidia_peermem is not loaded: GPUDirect RDMA is off and NCCL copies through host memory (load it: modprobe nvidia_peermem)",
		})
		return res
	}
	res.Metric("gpu.peermem.loaded_flag", 1)
	return res
}

// hasInfiniBandPort reports whether any adapter has an InfiniBand link-layer port.
func hasInfiniBandPort(hcas []snapshot.HCA) bool {
	for _, h := range hcas {
		for _, p := range h.Ports {
			if p.LinkLayer == "InfiniBand" {
				return true
			}
		}
	}
	return false
}
