package coordinator

import (
	"time"

	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/report"
	"github.com/fleetcheck/fleetcheck/store"
)

// Protobuf types stay at this edge: these functions convert to and from
// the domain's report and store types.

func fromUnixMS(v int64) time.Time {
	if v <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

func unixMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func resultFromProto(r *pb.Result) store.Result {
	out := store.Result{
		ID:       r.GetId(),
		Node:     r.GetNode(),
		WorkID:   r.GetWorkId(),
		Started:  fromUnixMS(r.GetStartedUnixMs()),
		Finished: fromUnixMS(r.GetFinishedUnixMs()),
		Status:   report.Status(r.GetStatus()),
		Full:     r.GetFull(),
		Checks:   make([]report.CheckResult, 0, len(r.GetChecks())),
	}
	for _, c := range r.GetChecks() {
		out.Checks = append(out.Checks, checkFromProto(c))
	}
	if r.GetInventory() != nil {
		inv := inventoryFromProto(r.GetInventory())
		out.Inventory = &inv
	}
	return out
}

func checkFromProto(c *pb.CheckResult) report.CheckResult {
	out := report.CheckResult{
		Name:       c.GetName(),
		Status:     report.Status(c.GetStatus()),
		DurationMS: c.GetDurationMs(),
		Reason:     c.GetReason(),
		Findings:   make([]report.Finding, 0, len(c.GetFindings())),
	}
	for _, f := range c.GetFindings() {
		out.Findings = append(out.Findings, report.Finding{
			Severity:  report.Severity(f.GetSeverity()),
			Component: f.GetComponent(),
			PCIBusID:  f.GetPciBusId(),
			Code:      f.GetCode(),
			Message:   f.GetMessage(),
			Action:    report.Action(f.GetAction()),
		})
	}
	if len(c.GetMetrics()) > 0 {
		out.Metrics = make(map[string]float64, len(c.GetMetrics()))
		for k, v := range c.GetMetrics() {
			out.Metrics[k] = v
		}
	}
	return out
}

func checkToProto(c report.CheckResult) *pb.CheckResult {
	out := &pb.CheckResult{
		Name:       c.Name,
		Status:     string(c.Status),
		DurationMs: c.DurationMS,
		Reason:     c.Reason,
		Metrics:    c.Metrics,
	}
	for _, f := range c.Findings {
		out.Findings = append(out.Findings, &pb.Finding{
			Severity:  string(f.Severity),
			Component: f.Component,
			PciBusId:  f.PCIBusID,
			Code:      f.Code,
			Message:   f.Message,
			Action:    string(f.Action),
		})
	}
	return out
}

func inventoryFromProto(in *pb.Inventory) report.Inventory {
	out := report.Inventory{
		DriverVersion:        in.GetDriverVersion(),
		CUDAVersion:          in.GetCudaVersion(),
		Kernel:               in.GetKernel(),
		FabricManagerVersion: in.GetFabricManagerVersion(),
		RDMAStack:            in.GetRdmaStack(),
		GPUs:                 make([]report.GPU, 0, len(in.GetGpus())),
		HCAs:                 make([]report.HCA, 0, len(in.GetHcas())),
	}
	for _, g := range in.GetGpus() {
		out.GPUs = append(out.GPUs, report.GPU{
			Index:          int(g.GetIndex()),
			Name:           g.GetName(),
			UUID:           g.GetUuid(),
			PCIBusID:       g.GetPciBusId(),
			Serial:         g.GetSerial(),
			VBIOSVersion:   g.GetVbiosVersion(),
			MemoryTotalMiB: g.GetMemoryTotalMib(),
		})
	}
	for _, h := range in.GetHcas() {
		hca := report.HCA{Name: h.GetName(), Model: h.GetModel(), FWVersion: h.GetFwVersion(),
			Ports: make([]report.Port, 0, len(h.GetPorts()))}
		for _, p := range h.GetPorts() {
			hca.Ports = append(hca.Ports, report.Port{
				Port:      int(p.GetPort()),
				State:     p.GetState(),
				PhysState: p.GetPhysState(),
				RateGbps:  p.GetRateGbps(),
				LinkLayer: p.GetLinkLayer(),
			})
		}
		out.HCAs = append(out.HCAs, hca)
	}
	return out
}

func nodeToProto(n store.Node, failing []string) *pb.NodeSummary {
	return &pb.NodeSummary{
		Name:           n.Name,
		State:          n.State,
		Labels:         n.Labels,
		Gpus:           int32(len(n.Inventory.GPUs)),
		DriverVersion:  n.Inventory.DriverVersion,
		LastSeenUnixMs: unixMS(n.LastSeen),
		FailingChecks:  failing,
		StateReason:    n.StateReason,
		Connected:      n.Connected,
	}
}

func eventToProto(e store.Event) *pb.Event {
	return &pb.Event{
		Id:      e.ID,
		UnixMs:  unixMS(e.Time),
		Node:    e.Node,
		Kind:    e.Kind,
		Actor:   e.Actor,
		Message: e.Message,
	}
}

func storedCheckToProto(sc store.StoredCheck) *pb.StoredCheckResult {
	return &pb.StoredCheckResult{
		ResultId:       sc.ResultID,
		Node:           sc.Node,
		FinishedUnixMs: unixMS(sc.Finished),
		Check:          checkToProto(sc.Check),
		WorkId:         sc.WorkID,
	}
}
