package campaignpb

import (
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

func exclusionPB(e rollout.Exclusion) *pb.RolloutExclusion {
	return &pb.RolloutExclusion{Node: e.Node, Kind: e.Kind, Reason: e.Reason, Rules: e.Rules}
}

func exclusionFrom(e *pb.RolloutExclusion) rollout.Exclusion {
	return rollout.Exclusion{Node: e.GetNode(), Kind: e.GetKind(), Reason: e.GetReason(), Rules: e.GetRules()}
}

// RolloutStatusPB answers rollout status and the control verbs.
func RolloutStatusPB(s *rollout.Status) (*pb.RolloutStatusReply, error) {
	spec, err := specJSON("rollout", s.Spec, s.Spec == nil)
	if err != nil {
		return nil, err
	}
	return &pb.RolloutStatusReply{
		Id: s.ID, Name: s.Name, Driver: s.Driver, Selector: s.Selector, Phase: string(s.Phase), Paused: s.Paused,
		PauseReason: s.PauseReason, Wave: int32(s.Wave), SoakUntil: tsPtr(s.SoakUntil), HaltReason: s.HaltReason,
		Evidence: s.Evidence, Blocked: s.Blocked, Incomplete: s.Incomplete, Counts: counts(s.Counts),
		Unavailable: int32(s.Unavailable), MaxUnavailable: s.MaxUnavailable,
		Waves: conv(s.Waves, func(w rollout.WaveStatus) *pb.RolloutWave {
			return &pb.RolloutWave{Index: int32(w.Index), Name: w.Name, State: w.State, Size: int32(w.Size), Budget: int32(w.Budget),
				Done: int32(w.Done), Failed: int32(w.Failed), Skipped: int32(w.Skipped), Active: int32(w.Active), Pending: int32(w.Pending)}
		}),
		Nodes: conv(s.Nodes, func(n rollout.NodeStatus) *pb.RolloutNode {
			return &pb.RolloutNode{Node: n.Node, Wave: int32(n.Wave), State: string(n.State), Op: n.Op, Since: ts(n.Since),
				Deadline: tsPtr(n.Deadline), FromDriver: n.FromDriver, Reason: n.Reason, Evidence: n.Evidence, Hold: n.Hold,
				LastError: n.LastError, Waiting: n.Waiting, Baseline: n.Baseline, BaselineFrom: n.BaselineFrom,
				DrainedByUs: n.DrainedByUs, Upgrades: int32(n.Upgrades)}
		}),
		Excluded: conv(s.Excluded, exclusionPB),
		Created:  ts(s.Created), Updated: ts(s.Updated), Finished: tsPtr(s.Finished), SpecJson: spec,
	}, nil
}

// RolloutStatusFrom is the inverse of RolloutStatusPB.
func RolloutStatusFrom(r *pb.RolloutStatusReply) (rollout.Status, error) {
	spec, err := specFrom[rollout.Spec]("rollout", r.GetSpecJson())
	if err != nil {
		return rollout.Status{}, err
	}
	return rollout.Status{
		ID: r.GetId(), Name: r.GetName(), Driver: r.GetDriver(), Selector: r.GetSelector(), Phase: rollout.Phase(r.GetPhase()),
		Paused: r.GetPaused(), PauseReason: r.GetPauseReason(), Wave: int(r.GetWave()), SoakUntil: tmPtr(r.GetSoakUntil()),
		HaltReason: r.GetHaltReason(), Evidence: r.GetEvidence(), Blocked: r.GetBlocked(), Incomplete: r.GetIncomplete(),
		Counts: countsFrom[rollout.State](r.GetCounts()), Unavailable: int(r.GetUnavailable()), MaxUnavailable: r.GetMaxUnavailable(),
		Waves: conv(r.GetWaves(), func(w *pb.RolloutWave) rollout.WaveStatus {
			return rollout.WaveStatus{Index: int(w.GetIndex()), Name: w.GetName(), State: w.GetState(), Size: int(w.GetSize()),
				Budget: int(w.GetBudget()), Done: int(w.GetDone()), Failed: int(w.GetFailed()), Skipped: int(w.GetSkipped()),
				Active: int(w.GetActive()), Pending: int(w.GetPending())}
		}),
		Nodes: conv(r.GetNodes(), func(n *pb.RolloutNode) rollout.NodeStatus {
			return rollout.NodeStatus{Node: n.GetNode(), Wave: int(n.GetWave()), State: rollout.State(n.GetState()), Op: n.GetOp(),
				Since: tm(n.GetSince()), Deadline: tmPtr(n.GetDeadline()), FromDriver: n.GetFromDriver(), Reason: n.GetReason(),
				Evidence: n.GetEvidence(), Hold: n.GetHold(), LastError: n.GetLastError(), Waiting: n.GetWaiting(),
				Baseline: n.GetBaseline(), BaselineFrom: n.GetBaselineFrom(), DrainedByUs: n.GetDrainedByUs(), Upgrades: int(n.GetUpgrades())}
		}),
		Excluded: conv(r.GetExcluded(), exclusionFrom),
		Created:  tm(r.GetCreated()), Updated: tm(r.GetUpdated()), Finished: tmPtr(r.GetFinished()), Spec: spec,
	}, nil
}

// RolloutListPB answers rollout list.
func RolloutListPB(l []rollout.Summary) *pb.RolloutListReply {
	return &pb.RolloutListReply{Rollouts: conv(l, func(s rollout.Summary) *pb.RolloutSummary {
		return &pb.RolloutSummary{Id: s.ID, Name: s.Name, Driver: s.Driver, Phase: string(s.Phase), Paused: s.Paused,
			Wave: int32(s.Wave), Waves: int32(s.Waves), Nodes: int32(s.Nodes), Counts: counts(s.Counts), Created: ts(s.Created)}
	})}
}

// RolloutListFrom is the inverse of RolloutListPB.
func RolloutListFrom(r *pb.RolloutListReply) []rollout.Summary {
	return conv(r.GetRollouts(), func(s *pb.RolloutSummary) rollout.Summary {
		return rollout.Summary{ID: s.GetId(), Name: s.GetName(), Driver: s.GetDriver(), Phase: rollout.Phase(s.GetPhase()),
			Paused: s.GetPaused(), Wave: int(s.GetWave()), Waves: int(s.GetWaves()), Nodes: int(s.GetNodes()),
			Counts: countsFrom[rollout.State](s.GetCounts()), Created: tm(s.GetCreated())}
	})
}

// RolloutPlanPB answers rollout plan.
func RolloutPlanPB(p *rollout.PlanResult) (*pb.RolloutPlanReply, error) {
	spec, err := specJSON("rollout", p.Spec, p.Spec == nil)
	if err != nil {
		return nil, err
	}
	return &pb.RolloutPlanReply{
		SpecJson: spec, Selected: int32(p.Selected), FleetSize: int32(p.FleetSize), MaxUnavailable: int32(p.MaxUnavailable),
		Waves: conv(p.Waves, func(w rollout.PlannedWave) *pb.RolloutPlannedWave {
			return &pb.RolloutPlannedWave{Index: int32(w.Index), Name: w.Name, Budget: int32(w.Budget),
				Nodes: conv(w.Nodes, func(n rollout.PlannedNode) *pb.RolloutPlannedNode {
					return &pb.RolloutPlannedNode{Name: n.Name, Driver: n.Driver, DisconnectedAtPlan: n.Disconnected, Note: n.Note}
				})}
		}),
		Excluded: conv(p.Excluded, exclusionPB),
	}, nil
}

// RolloutPlanFrom is the inverse of RolloutPlanPB.
func RolloutPlanFrom(r *pb.RolloutPlanReply) (rollout.PlanResult, error) {
	spec, err := specFrom[rollout.Spec]("rollout", r.GetSpecJson())
	if err != nil {
		return rollout.PlanResult{}, err
	}
	return rollout.PlanResult{
		Spec: spec, Selected: int(r.GetSelected()), FleetSize: int(r.GetFleetSize()), MaxUnavailable: int(r.GetMaxUnavailable()),
		Waves: conv(r.GetWaves(), func(w *pb.RolloutPlannedWave) rollout.PlannedWave {
			return rollout.PlannedWave{Index: int(w.GetIndex()), Name: w.GetName(), Budget: int(w.GetBudget()),
				Nodes: conv(w.GetNodes(), func(n *pb.RolloutPlannedNode) rollout.PlannedNode {
					return rollout.PlannedNode{Name: n.GetName(), Driver: n.GetDriver(), Disconnected: n.GetDisconnectedAtPlan(), Note: n.GetNote()}
				})}
		}),
		Excluded: conv(r.GetExcluded(), exclusionFrom),
	}, nil
}
