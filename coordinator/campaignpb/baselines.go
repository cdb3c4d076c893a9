package campaignpb

import (
	"github.com/fleetcheck/fleetcheck/baselines"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// KeyPB is a baseline key on the wire.
func KeyPB(k baselines.Key) *pb.BaselineKey {
	return &pb.BaselineKey{Metric: k.Metric, Scope: string(k.Scope), Driver: k.Stack.Driver, Nccl: k.Stack.NCCL, Rdma: k.Stack.RDMAStack}
}

// KeyFrom is the key KeyPB sent, as it was (not normalized).
func KeyFrom(k *pb.BaselineKey) baselines.Key {
	return baselines.Key{Metric: k.GetMetric(), Scope: baselines.Scope(k.GetScope()),
		Stack: baselines.Stack{Driver: k.GetDriver(), NCCL: k.GetNccl(), RDMAStack: k.GetRdma()}}
}

// BaselinePB is one baseline version.
func BaselinePB(b baselines.Baseline) *pb.Baseline {
	s := b.Samples
	return &pb.Baseline{
		Key: KeyPB(b.Key), Direction: string(b.Direction),
		Samples: &pb.BaselineStats{Count: int32(s.Count), Median: s.Median, Mad: s.MAD, Min: s.Min, Max: s.Max, Values: s.Values},
		Value:   b.Value, Version: int32(b.Version), TakenAt: ts(b.TakenAt), Who: b.Who, FromRun: b.FromRun, Note: b.Note,
		Threshold: b.Threshold,
	}
}

// BaselineFrom is the inverse of BaselinePB.
func BaselineFrom(b *pb.Baseline) baselines.Baseline {
	s := b.GetSamples()
	return baselines.Baseline{
		Key: KeyFrom(b.GetKey()), Direction: baselines.Direction(b.GetDirection()),
		Samples: baselines.Stats{Count: int(s.GetCount()), Median: s.GetMedian(), MAD: s.GetMad(), Min: s.GetMin(), Max: s.GetMax(),
			Values: orEmpty(s.GetValues())},
		Value: b.GetValue(), Version: int(b.GetVersion()), TakenAt: tm(b.GetTakenAt()), Who: b.GetWho(), FromRun: b.GetFromRun(),
		Note: b.GetNote(), Threshold: b.GetThreshold(),
	}
}

// BaselineListPB answers show and history.
func BaselineListPB(bs []baselines.Baseline) *pb.BaselineListReply {
	return &pb.BaselineListReply{Baselines: conv(bs, BaselinePB)}
}

// BaselineListFrom is the inverse of BaselineListPB.
func BaselineListFrom(r *pb.BaselineListReply) []baselines.Baseline {
	return conv(r.GetBaselines(), BaselineFrom)
}

// BaselineRecordPB answers record.
func BaselineRecordPB(r baselines.RecordReport) *pb.BaselineRecordReply {
	return &pb.BaselineRecordReply{Recorded: conv(r.Recorded, BaselinePB),
		Skipped: conv(r.Skipped, func(s baselines.Skipped) *pb.BaselineSkipped {
			return &pb.BaselineSkipped{Node: s.Node, Reason: s.Reason}
		})}
}

// BaselineRecordFrom is the inverse of BaselineRecordPB.
func BaselineRecordFrom(r *pb.BaselineRecordReply) baselines.RecordReport {
	return baselines.RecordReport{Recorded: conv(r.GetRecorded(), BaselineFrom),
		Skipped: conv(r.GetSkipped(), func(s *pb.BaselineSkipped) baselines.Skipped {
			return baselines.Skipped{Node: s.GetNode(), Reason: s.GetReason()}
		})}
}

// BaselineImportPB answers import.
func BaselineImportPB(r baselines.ImportResult) *pb.BaselineImportReply {
	return &pb.BaselineImportReply{Added: int32(r.Added), Unchanged: int32(r.Unchanged),
		Entries: conv(r.Entries, func(e baselines.ImportedEntry) *pb.BaselineImportedEntry {
			return &pb.BaselineImportedEntry{Key: KeyPB(e.Key), Version: int32(e.Version), Added: e.Added}
		})}
}

// BaselineImportFrom is the inverse of BaselineImportPB.
func BaselineImportFrom(r *pb.BaselineImportReply) baselines.ImportResult {
	return baselines.ImportResult{Added: int(r.GetAdded()), Unchanged: int(r.GetUnchanged()),
		Entries: conv(r.GetEntries(), func(e *pb.BaselineImportedEntry) baselines.ImportedEntry {
			return baselines.ImportedEntry{Key: KeyFrom(e.GetKey()), Version: int(e.GetVersion()), Added: e.GetAdded()}
		})}
}
