package campaignpb

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

func targetPB(t drill.Target) *pb.DrillTarget {
	var pre map[string]*pb.DrillCheckSnap
	if t.Precheck != nil {
		pre = make(map[string]*pb.DrillCheckSnap, len(t.Precheck))
		for k, c := range t.Precheck {
			pre[k] = &pb.DrillCheckSnap{Status: string(c.Status), Codes: c.Codes}
		}
	}
	var every *durationpb.Duration
	if t.CheckInterval != 0 {
		every = durationpb.New(time.Duration(t.CheckInterval))
	}
	return &pb.DrillTarget{
		Node: t.Node, State: string(t.State), Precheck: pre, InjectedAt: ts(t.InjectedAt), CheckInterval: every,
		DetectedAt: ts(t.DetectedAt), DetectedBy: t.DetectedBy, ExpectedDetected: t.ExpectedDetected, DetectedPoll: int32(t.DetectedPoll),
		Detections: conv(t.Detections, func(d drill.Detection) *pb.DrillDetection {
			return &pb.DrillDetection{Check: d.Check, Status: string(d.Status), Codes: d.Codes, At: ts(d.At), Observed: ts(d.Observed),
				Message: d.Message, Findings: conv(d.Findings, wire.FindingToProto)}
		}),
		OutOfServiceAt: ts(t.OutOfServiceAt), RevertStartedAt: ts(t.RevertStartedAt), RevertedAt: ts(t.RevertedAt),
		RevertedBy: t.RevertedBy, RevertAttempts: int32(t.RevertAttempts), RecoveredAt: ts(t.RecoveredAt), Aborted: t.Aborted,
		AbortReason: t.AbortReason, Polls: int32(t.Polls), NextAt: ts(t.NextAt), LastError: t.LastError,
		Findings: conv(t.Findings, func(f drill.Finding) *pb.DrillFinding {
			return &pb.DrillFinding{Code: f.Code, Severity: f.Severity, Message: f.Message, At: ts(f.At)}
		}),
	}
}

func targetFrom(t *pb.DrillTarget) drill.Target {
	var pre map[string]drill.CheckSnap
	if len(t.GetPrecheck()) > 0 { // omitted when empty
		pre = make(map[string]drill.CheckSnap, len(t.GetPrecheck()))
		for k, c := range t.GetPrecheck() {
			pre[k] = drill.CheckSnap{Status: report.Status(c.GetStatus()), Codes: c.GetCodes()}
		}
	}
	var every config.Duration
	if t.GetCheckInterval() != nil {
		every = config.Duration(t.GetCheckInterval().AsDuration())
	}
	return drill.Target{
		Node: t.GetNode(), State: drill.TargetState(t.GetState()), Precheck: pre, InjectedAt: tm(t.GetInjectedAt()), CheckInterval: every,
		DetectedAt: tm(t.GetDetectedAt()), DetectedBy: t.GetDetectedBy(), ExpectedDetected: t.GetExpectedDetected(),
		DetectedPoll: int(t.GetDetectedPoll()),
		Detections: conv(t.GetDetections(), func(d *pb.DrillDetection) drill.Detection {
			return drill.Detection{Check: d.GetCheck(), Status: report.Status(d.GetStatus()), Codes: d.GetCodes(), At: tm(d.GetAt()),
				Observed: tm(d.GetObserved()), Message: d.GetMessage(), Findings: conv(d.GetFindings(), wire.FindingFromProto)}
		}),
		OutOfServiceAt: tm(t.GetOutOfServiceAt()), RevertStartedAt: tm(t.GetRevertStartedAt()), RevertedAt: tm(t.GetRevertedAt()),
		RevertedBy: t.GetRevertedBy(), RevertAttempts: int(t.GetRevertAttempts()), RecoveredAt: tm(t.GetRecoveredAt()),
		Aborted: t.GetAborted(), AbortReason: t.GetAbortReason(), Polls: int(t.GetPolls()), NextAt: tm(t.GetNextAt()),
		LastError: t.GetLastError(),
		Findings: conv(t.GetFindings(), func(f *pb.DrillFinding) drill.Finding {
			return drill.Finding{Code: f.GetCode(), Severity: f.GetSeverity(), Message: f.GetMessage(), At: tm(f.GetAt())}
		}),
	}
}

// DrillStatusPB answers drill status and abort.
func DrillStatusPB(d *drill.Drill) (*pb.DrillStatusReply, error) {
	spec, err := specJSON("drill", d.Spec, d.Spec == nil)
	if err != nil {
		return nil, err
	}
	return &pb.DrillStatusReply{
		Id: d.ID, Name: d.Name, Fault: d.Fault, SpecJson: spec, State: string(d.State), Reason: d.Reason,
		CreatedAt: ts(d.CreatedAt), UpdatedAt: ts(d.UpdatedAt), FinishedAt: ts(d.FinishedAt), DegradedAtStart: d.Degraded,
		Targets: conv(d.Targets, targetPB),
	}, nil
}

// DrillStatusFrom is the inverse of DrillStatusPB.
func DrillStatusFrom(r *pb.DrillStatusReply) (drill.Drill, error) {
	spec, err := specFrom[drill.Spec]("drill", r.GetSpecJson())
	if err != nil {
		return drill.Drill{}, err
	}
	return drill.Drill{
		ID: r.GetId(), Name: r.GetName(), Fault: r.GetFault(), Spec: spec, State: drill.State(r.GetState()), Reason: r.GetReason(),
		CreatedAt: tm(r.GetCreatedAt()), UpdatedAt: tm(r.GetUpdatedAt()), FinishedAt: tm(r.GetFinishedAt()),
		Degraded: r.GetDegradedAtStart(), Targets: conv(r.GetTargets(), targetFrom),
	}, nil
}

// DrillListPB answers drill list.
func DrillListPB(l []drill.Drill) (*pb.DrillListReply, error) {
	out := &pb.DrillListReply{Drills: make([]*pb.DrillStatusReply, 0, len(l))}
	for i := range l {
		d, err := DrillStatusPB(&l[i])
		if err != nil {
			return nil, err
		}
		out.Drills = append(out.Drills, d)
	}
	return out, nil
}

// DrillListFrom is the inverse of DrillListPB.
func DrillListFrom(r *pb.DrillListReply) ([]drill.Drill, error) {
	out := make([]drill.Drill, 0, len(r.GetDrills()))
	for _, p := range r.GetDrills() {
		d, err := DrillStatusFrom(p)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}
