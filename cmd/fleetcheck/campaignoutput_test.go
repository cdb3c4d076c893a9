//go:build !node

package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/coordinator/campaignpb"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// fakeCampaigns answers every status, list, plan and control RPC with the
// fixtures, so the golden files pin what the CLI prints for each. legacy:
// it answers as a coordinator from before the typed answers did, with the
// engine's JSON document in fields 1 and 2.
type fakeCampaigns struct {
	pb.UnimplementedCampaignServiceServer
	t      *testing.T
	legacy bool
}

// answer is typed, or for a legacy fake the same message holding only the
// JSON document of v.
func answer[M interface {
	proto.Message
	*P
}, P any](f *fakeCampaigns, typed M, err error, v any) (M, error) {
	if err != nil {
		f.t.Error(err)
		return nil, err
	}
	if !f.legacy {
		return typed, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		f.t.Error(err)
	}
	// Fields 1 and 2 of every typed answer are Document's.
	var out M = new(P)
	if err := proto.Unmarshal(must(proto.Marshal(&pb.Document{ContentType: "application/json", Body: b})), out); err != nil {
		f.t.Error(err)
	}
	return out, nil
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func (f *fakeCampaigns) BaselineRecord(context.Context, *pb.BaselineRecordRequest) (*pb.BaselineRecordReply, error) {
	return answer(f, campaignpb.BaselineRecordPB(fxBaselineRecord()), nil, fxBaselineRecord())
}
func (f *fakeCampaigns) BaselineShow(context.Context, *pb.BaselineQuery) (*pb.BaselineListReply, error) {
	l := fxBaselineRecord().Recorded
	return answer(f, campaignpb.BaselineListPB(l), nil, l)
}
func (f *fakeCampaigns) BaselineHistory(context.Context, *pb.BaselineKeyRequest) (*pb.BaselineListReply, error) {
	l := fxBaselineRecord().Recorded[:1]
	return answer(f, campaignpb.BaselineListPB(l), nil, l)
}
func (f *fakeCampaigns) BaselineSet(context.Context, *pb.BaselineSetRequest) (*pb.BaselineSetReply, error) {
	return answer(f, &pb.BaselineSetReply{Baseline: campaignpb.BaselinePB(fxBaseline())}, nil, fxBaseline())
}
func (f *fakeCampaigns) BaselineImport(context.Context, *pb.BaselineImportRequest) (*pb.BaselineImportReply, error) {
	return answer(f, campaignpb.BaselineImportPB(fxBaselineImport()), nil, fxBaselineImport())
}
func (f *fakeCampaigns) SweepStatus(context.Context, *pb.CampaignRef) (*pb.SweepStatusReply, error) {
	return answer(f, campaignpb.SweepStatusPB(fxSweepProgress()), nil, fxSweepProgress())
}
func (f *fakeCampaigns) SweepList(context.Context, *pb.CampaignListRequest) (*pb.SweepListReply, error) {
	return answer(f, campaignpb.SweepListPB(fxSweepList()), nil, fxSweepList())
}
func (f *fakeCampaigns) RolloutPlan(context.Context, *pb.SpecRequest) (*pb.RolloutPlanReply, error) {
	p := fxRolloutPlan(f.t)
	r, err := campaignpb.RolloutPlanPB(&p)
	return answer(f, r, err, p)
}
func (f *fakeCampaigns) RolloutStatus(context.Context, *pb.CampaignRef) (*pb.RolloutStatusReply, error) {
	s := fxRolloutStatus(f.t)
	r, err := campaignpb.RolloutStatusPB(&s)
	return answer(f, r, err, s)
}
func (f *fakeCampaigns) RolloutList(context.Context, *pb.CampaignListRequest) (*pb.RolloutListReply, error) {
	return answer(f, campaignpb.RolloutListPB(fxRolloutList()), nil, fxRolloutList())
}
func (f *fakeCampaigns) RolloutControl(ctx context.Context, _ *pb.RolloutControlRequest) (*pb.RolloutStatusReply, error) {
	return f.RolloutStatus(ctx, nil)
}
func (f *fakeCampaigns) BurninStatus(context.Context, *pb.CampaignRef) (*pb.BurninStatusReply, error) {
	return answer(f, campaignpb.BurninStatusPB(fxBurninStatus()), nil, fxBurninStatus())
}
func (f *fakeCampaigns) BurninList(context.Context, *pb.CampaignListRequest) (*pb.BurninListReply, error) {
	l := []burnin.CampaignStatus{fxBurninStatus()}
	return answer(f, campaignpb.BurninListPB(l), nil, l)
}
func (f *fakeCampaigns) BurninCancel(ctx context.Context, _ *pb.CampaignRef) (*pb.BurninStatusReply, error) {
	return f.BurninStatus(ctx, nil)
}
func (f *fakeCampaigns) DrillStatus(context.Context, *pb.CampaignRef) (*pb.DrillStatusReply, error) {
	d := fxDrill(f.t)
	r, err := campaignpb.DrillStatusPB(&d)
	return answer(f, r, err, d)
}
func (f *fakeCampaigns) DrillList(context.Context, *pb.CampaignListRequest) (*pb.DrillListReply, error) {
	l := []drill.Drill{fxDrill(f.t)}
	r, err := campaignpb.DrillListPB(l)
	return answer(f, r, err, l)
}
func (f *fakeCampaigns) DrillAbort(ctx context.Context, _ *pb.CampaignRef) (*pb.DrillStatusReply, error) {
	return f.DrillStatus(ctx, nil)
}

// fakeCoordinator serves srv on 127.0.0.1 and returns the flags that reach it.
func fakeCoordinator(t *testing.T, srv pb.CampaignServiceServer) []string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterCampaignServiceServer(g, srv)
	go func() { _ = g.Serve(lis) }() // ends with Stop below
	t.Cleanup(g.Stop)
	return []string{"--insecure", "--coordinator", lis.Addr().String()}
}

// campaignVerbs are the verbs whose answers are campaign statuses, lists,
// plans and baselines: the output each prints is pinned.
var campaignVerbs = []struct {
	golden string
	args   []string
}{
	{"baseline-record", []string{"baseline", "record", "--from", "sku=h100"}},
	{"baseline-show", []string{"baseline", "show"}},
	{"baseline-history", []string{"baseline", "history", "--scope", "node:gpu-001"}},
	{"baseline-set", []string{"baseline", "set", "--scope", "node:gpu-001", "--value", "470"}},
	{"baseline-import", []string{"baseline", "import", "../../examples/sweep.yaml"}},
	{"sweep-status", []string{"sweep", "status", "sweep-20260302-020000"}},
	{"sweep-list", []string{"sweep", "list"}},
	{"rollout-plan", []string{"rollout", "plan", "-f", "../../examples/rollout.yaml"}},
	{"rollout-status", []string{"rollout", "status", "r535-20260302-020000"}},
	{"rollout-list", []string{"rollout", "list"}},
	{"rollout-pause", []string{"rollout", "pause", "r535-20260302-020000", "--reason", "night shift"}},
	{"rollout-rollback", []string{"rollout", "rollback", "r535-20260302-020000"}},
	{"burnin-status", []string{"burnin", "status", "r14-delivery-20260302-020000"}},
	{"burnin-list", []string{"burnin", "list"}},
	{"burnin-cancel", []string{"burnin", "cancel", "r14-delivery-20260302-020000", "--reason", "wrong rack"}},
	{"drill-status", []string{"drill", "status", "d-20260302T020000"}},
	{"drill-list", []string{"drill", "list"}},
	{"drill-abort", []string{"drill", "abort", "d-20260302T020000"}},
}

// stableTimes replaces the fixture times as a table prints them (the
// local zone) with a name, so the golden files hold in any zone.
func stableTimes(s string) string {
	for i, t := range fxTimes {
		s = strings.ReplaceAll(s, shortTime(t), "T"+string(rune('0'+i)))
	}
	return s
}

// The table and the JSON each campaign verb prints are what docs/ show:
// the golden files were written before the answers became typed messages
// and must not move, whether a current coordinator answers or an older
// one that sends the engines' JSON documents.
func TestCampaignOutputGolden(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(map[bool]string{false: "typed", true: "older-coordinator"}[legacy], func(t *testing.T) {
			campaignOutputGolden(t, &fakeCampaigns{t: t, legacy: legacy})
		})
	}
}

func campaignOutputGolden(t *testing.T, fake *fakeCampaigns) {
	conn := fakeCoordinator(t, fake)
	for _, v := range campaignVerbs {
		for _, o := range []string{"table", "json"} {
			out, code := execute(t, append(append(v.args, "-o", o), conn...)...)
			if code != exitOK {
				t.Fatalf("%s -o %s: exit %d: %s", strings.Join(v.args, " "), o, code, out)
			}
			golden(t, "cli/"+v.golden+"."+o, stableTimes(out))
		}
	}
}
