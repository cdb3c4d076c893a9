//go:build !node

package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"

	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// fakeCampaigns answers every status, list, plan and control RPC with the
// fixtures, so the golden files pin what the CLI prints for each.
type fakeCampaigns struct {
	pb.UnimplementedCampaignServiceServer
	t *testing.T
}

func (f *fakeCampaigns) doc(v any) (*pb.Document, error) {
	b, err := json.Marshal(v)
	if err != nil {
		f.t.Error(err)
	}
	return &pb.Document{ContentType: "application/json", Body: b}, nil
}

func (f *fakeCampaigns) BaselineRecord(context.Context, *pb.BaselineRecordRequest) (*pb.Document, error) {
	return f.doc(fxBaselineRecord())
}
func (f *fakeCampaigns) BaselineShow(context.Context, *pb.BaselineQuery) (*pb.Document, error) {
	return f.doc(fxBaselineRecord().Recorded)
}
func (f *fakeCampaigns) BaselineHistory(context.Context, *pb.BaselineKeyRequest) (*pb.Document, error) {
	return f.doc(fxBaselineRecord().Recorded[:1])
}
func (f *fakeCampaigns) BaselineSet(context.Context, *pb.BaselineSetRequest) (*pb.Document, error) {
	return f.doc(fxBaseline())
}
func (f *fakeCampaigns) BaselineImport(context.Context, *pb.BaselineImportRequest) (*pb.Document, error) {
	return f.doc(fxBaselineImport())
}
func (f *fakeCampaigns) SweepStatus(context.Context, *pb.CampaignRef) (*pb.Document, error) {
	return f.doc(fxSweepProgress())
}
func (f *fakeCampaigns) SweepList(context.Context, *pb.CampaignListRequest) (*pb.Document, error) {
	return f.doc(fxSweepList())
}
func (f *fakeCampaigns) RolloutPlan(context.Context, *pb.SpecRequest) (*pb.Document, error) {
	return f.doc(fxRolloutPlan(f.t))
}
func (f *fakeCampaigns) RolloutStatus(context.Context, *pb.CampaignRef) (*pb.Document, error) {
	return f.doc(fxRolloutStatus(f.t))
}
func (f *fakeCampaigns) RolloutList(context.Context, *pb.CampaignListRequest) (*pb.Document, error) {
	return f.doc(fxRolloutList())
}
func (f *fakeCampaigns) RolloutControl(context.Context, *pb.RolloutControlRequest) (*pb.Document, error) {
	return f.doc(fxRolloutStatus(f.t))
}
func (f *fakeCampaigns) BurninStatus(context.Context, *pb.CampaignRef) (*pb.Document, error) {
	return f.doc(fxBurninStatus())
}
func (f *fakeCampaigns) BurninList(context.Context, *pb.CampaignListRequest) (*pb.Document, error) {
	return f.doc([]any{fxBurninStatus()})
}
func (f *fakeCampaigns) BurninCancel(context.Context, *pb.CampaignRef) (*pb.Document, error) {
	return f.doc(fxBurninStatus())
}
func (f *fakeCampaigns) DrillStatus(context.Context, *pb.CampaignRef) (*pb.Document, error) {
	return f.doc(fxDrill(f.t))
}
func (f *fakeCampaigns) DrillList(context.Context, *pb.CampaignListRequest) (*pb.Document, error) {
	return f.doc([]any{fxDrill(f.t)})
}
func (f *fakeCampaigns) DrillAbort(context.Context, *pb.CampaignRef) (*pb.Document, error) {
	return f.doc(fxDrill(f.t))
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
// and must not move.
func TestCampaignOutputGolden(t *testing.T) {
	conn := fakeCoordinator(t, &fakeCampaigns{t: t})
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
