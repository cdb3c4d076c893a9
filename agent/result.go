package agent

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"time"

	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/report"
)

// Result is one inspection pass as the agent keeps it in its spool: the
// report plus what the coordinator needs to file it. It is the spool's JSON;
// the protobuf form exists only at the stream.
type Result struct {
	ID       string        `json:"id"`
	Node     string        `json:"node"`
	WorkID   string        `json:"work_id,omitempty"` // empty for the agent's own schedule
	Started  time.Time     `json:"started"`
	Finished time.Time     `json:"finished"`
	Full     bool          `json:"full"` // every passive check ran
	Report   report.Report `json:"report"`
}

// NewResultID returns a fresh id: 12 hex digits of milliseconds since the
// epoch, then 20 random hex digits. Ids sort by creation time (handy in the
// spool and the store) and never collide across restarts or nodes.
func NewResultID(now time.Time) string {
	var b [16]byte
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(now.UnixMilli()))
	copy(b[:6], ms[2:])
	// crypto/rand.Read never fails (Go 1.24+: it aborts the process instead).
	_, _ = rand.Read(b[6:])
	return hex.EncodeToString(b[:])
}

// toProto converts a result for the wire.
func (r *Result) toProto() *fleetcheckv1.Result {
	out := &fleetcheckv1.Result{
		Id:             r.ID,
		Node:           r.Node,
		WorkId:         r.WorkID,
		StartedUnixMs:  r.Started.UnixMilli(),
		FinishedUnixMs: r.Finished.UnixMilli(),
		Status:         string(r.Report.Status),
		Inventory:      inventoryToProto(&r.Report.Inventory),
		Full:           r.Full,
	}
	for _, c := range r.Report.Checks {
		pc := &fleetcheckv1.CheckResult{
			Name:       c.Name,
			Status:     string(c.Status),
			DurationMs: c.DurationMS,
			Reason:     c.Reason,
			Metrics:    c.Metrics,
		}
		for _, f := range c.Findings {
			pc.Findings = append(pc.Findings, &fleetcheckv1.Finding{
				Severity:  string(f.Severity),
				Component: f.Component,
				PciBusId:  f.PCIBusID,
				Code:      f.Code,
				Message:   f.Message,
				Action:    string(f.Action),
			})
		}
		out.Checks = append(out.Checks, pc)
	}
	return out
}

func inventoryToProto(inv *report.Inventory) *fleetcheckv1.Inventory {
	if inv == nil {
		return nil
	}
	out := &fleetcheckv1.Inventory{
		DriverVersion:        inv.DriverVersion,
		CudaVersion:          inv.CUDAVersion,
		Kernel:               inv.Kernel,
		FabricManagerVersion: inv.FabricManagerVersion,
		RdmaStack:            inv.RDMAStack,
	}
	for _, g := range inv.GPUs {
		out.Gpus = append(out.Gpus, &fleetcheckv1.GPU{
			Index:          int32(g.Index),
			Name:           g.Name,
			Uuid:           g.UUID,
			PciBusId:       g.PCIBusID,
			Serial:         g.Serial,
			VbiosVersion:   g.VBIOSVersion,
			MemoryTotalMib: g.MemoryTotalMiB,
		})
	}
	for _, h := range inv.HCAs {
		ph := &fleetcheckv1.HCA{Name: h.Name, Model: h.Model, FwVersion: h.FWVersion}
		for _, p := range h.Ports {
			ph.Ports = append(ph.Ports, &fleetcheckv1.Port{
				Port:      int32(p.Port),
				State:     p.State,
				PhysState: p.PhysState,
				RateGbps:  p.RateGbps,
				LinkLayer: p.LinkLayer,
			})
		}
		out.Hcas = append(out.Hcas, ph)
	}
	return out
}

func activityToProto(a Activity) fleetcheckv1.NodeActivity {
	switch a {
	case ActivityBusy:
		return fleetcheckv1.NodeActivity_NODE_ACTIVITY_BUSY
	case ActivityIdle:
		return fleetcheckv1.NodeActivity_NODE_ACTIVITY_IDLE
	case ActivityDrained:
		return fleetcheckv1.NodeActivity_NODE_ACTIVITY_DRAINED
	}
	return fleetcheckv1.NodeActivity_NODE_ACTIVITY_UNSPECIFIED
}
