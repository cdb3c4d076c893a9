package campaignpb

import (
	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// BurninStatusPB answers burnin status and cancel.
func BurninStatusPB(s burnin.CampaignStatus) *pb.BurninStatusReply {
	return &pb.BurninStatusReply{
		Id: s.ID, Name: s.Name, State: string(s.State), Phase: string(s.Phase), Level: string(s.Level), Suite: s.Suite,
		Selector: s.Selector, Reason: s.Reason, CreatedAt: ts(s.CreatedAt), UpdatedAt: ts(s.UpdatedAt), FinishedAt: ts(s.FinishedAt),
		Nodes: int32(s.Nodes), ByState: counts(s.ByState), Accepted: int32(s.Accepted), Rejected: int32(s.Rejected),
		RunsDone: int32(s.RunsDone), RunsTotal: int32(s.RunsTotal), Waiting: s.Waiting,
		NodeStates: conv(s.NodeStates, func(n burnin.NodeProgress) *pb.BurninNode {
			return &pb.BurninNode{Node: n.Node, State: string(n.State), Step: n.Step, StepsDone: int32(n.StepsDone), Steps: int32(n.Steps),
				Waiting: n.Waiting, Verdict: string(n.Verdict), Reason: n.Reason}
		}),
	}
}

// BurninStatusFrom is the inverse of BurninStatusPB.
func BurninStatusFrom(r *pb.BurninStatusReply) burnin.CampaignStatus {
	s := burnin.CampaignStatus{
		ID: r.GetId(), Name: r.GetName(), State: burnin.State(r.GetState()), Phase: burnin.Phase(r.GetPhase()),
		Level: burnin.Level(r.GetLevel()), Suite: r.GetSuite(), Selector: r.GetSelector(), Reason: r.GetReason(),
		CreatedAt: tm(r.GetCreatedAt()), UpdatedAt: tm(r.GetUpdatedAt()), FinishedAt: tm(r.GetFinishedAt()),
		Nodes: int(r.GetNodes()), ByState: countsFrom[burnin.NodeState](r.GetByState()), Accepted: int(r.GetAccepted()),
		Rejected: int(r.GetRejected()), RunsDone: int(r.GetRunsDone()), RunsTotal: int(r.GetRunsTotal()),
		NodeStates: conv(r.GetNodeStates(), func(n *pb.BurninNode) burnin.NodeProgress {
			return burnin.NodeProgress{Node: n.GetNode(), State: burnin.NodeState(n.GetState()), Step: n.GetStep(),
				StepsDone: int(n.GetStepsDone()), Steps: int(n.GetSteps()), Waiting: n.GetWaiting(),
				Verdict: burnin.Verdict(n.GetVerdict()), Reason: n.GetReason()}
		}),
	}
	if len(r.GetWaiting()) > 0 { // omitted when empty
		s.Waiting = r.GetWaiting()
	}
	return s
}

// BurninListPB answers burnin list.
func BurninListPB(l []burnin.CampaignStatus) *pb.BurninListReply {
	return &pb.BurninListReply{Campaigns: conv(l, BurninStatusPB)}
}

// BurninListFrom is the inverse of BurninListPB.
func BurninListFrom(r *pb.BurninListReply) []burnin.CampaignStatus {
	return conv(r.GetCampaigns(), BurninStatusFrom)
}
