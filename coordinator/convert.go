package coordinator

import (
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Protobuf types stay at this edge: these functions convert to and from
// the store's types; the report parts go through package wire, which the
// agent uses too.

// resultFromProto is the store's view of an agent's Result. An absent
// inventory stays nil: the node's recorded inventory is then left alone.
func resultFromProto(r *pb.Result) store.Result {
	m, rep := wire.ResultFromProto(r)
	out := store.Result{
		ID:       m.ID,
		Node:     m.Node,
		WorkID:   m.WorkID,
		Started:  m.Started,
		Finished: m.Finished,
		Status:   rep.Status,
		Full:     m.Full,
		Trigger:  m.Trigger,
		Checks:   rep.Checks,
	}
	if r.GetInventory() != nil {
		out.Inventory = &rep.Inventory
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
		LastSeenUnixMs: wire.UnixMS(n.LastSeen),
		FailingChecks:  failing,
		StateReason:    n.StateReason,
		Connected:      n.Connected,
	}
}

func eventToProto(e store.Event) *pb.Event {
	return &pb.Event{
		Id:      e.ID,
		UnixMs:  wire.UnixMS(e.Time),
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
		FinishedUnixMs: wire.UnixMS(sc.Finished),
		Check:          wire.CheckToProto(sc.Check),
		WorkId:         sc.WorkID,
	}
}
