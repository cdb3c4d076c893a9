package campaignpb

import (
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// SweepStatusPB answers sweep status.
func SweepStatusPB(p sweep.Progress) *pb.SweepStatusReply {
	return &pb.SweepStatusReply{
		Id: p.ID, State: string(p.State), Phase: string(p.Phase), Round: int32(p.Round), Wave: int32(p.Wave),
		WaveDone: int32(p.WaveDone), WaveTotal: int32(p.WaveTotal), SinglesDone: int32(p.Singles), SinglesTotal: int32(p.SinglesAll),
		PairsDone: int32(p.Pairs), PairsTotal: int32(p.PairsAll), Nodes: int32(p.Nodes), Waiting: p.Waiting, Incomplete: p.Incomplete,
	}
}

// SweepStatusFrom is the inverse of SweepStatusPB.
func SweepStatusFrom(r *pb.SweepStatusReply) sweep.Progress {
	return sweep.Progress{
		ID: r.GetId(), State: sweep.State(r.GetState()), Phase: sweep.Phase(r.GetPhase()), Round: int(r.GetRound()), Wave: int(r.GetWave()),
		WaveDone: int(r.GetWaveDone()), WaveTotal: int(r.GetWaveTotal()), Singles: int(r.GetSinglesDone()), SinglesAll: int(r.GetSinglesTotal()),
		Pairs: int(r.GetPairsDone()), PairsAll: int(r.GetPairsTotal()), Nodes: int(r.GetNodes()), Waiting: r.GetWaiting(), Incomplete: r.GetIncomplete(),
	}
}

// SweepListPB answers sweep list.
func SweepListPB(l []sweep.Summary) *pb.SweepListReply {
	return &pb.SweepListReply{Sweeps: conv(l, func(s sweep.Summary) *pb.SweepSummary {
		return &pb.SweepSummary{Id: s.ID, State: string(s.State), Phase: string(s.Phase), Selector: s.Selector, Nodes: int32(s.Nodes),
			Created: ts(s.Created), Ended: ts(s.Ended), Counts: counts(s.Counts), Error: s.Error, Incomplete: s.Incomplete}
	})}
}

// SweepListFrom is the inverse of SweepListPB.
func SweepListFrom(r *pb.SweepListReply) []sweep.Summary {
	return conv(r.GetSweeps(), func(s *pb.SweepSummary) sweep.Summary {
		out := sweep.Summary{ID: s.GetId(), State: sweep.State(s.GetState()), Phase: sweep.Phase(s.GetPhase()), Selector: s.GetSelector(),
			Nodes: int(s.GetNodes()), Created: tm(s.GetCreated()), Ended: tm(s.GetEnded()), Error: s.GetError(), Incomplete: s.GetIncomplete()}
		if len(s.GetCounts()) > 0 { // omitted when empty
			out.Counts = countsFrom[sweep.Kind](s.GetCounts())
		}
		return out
	})
}
