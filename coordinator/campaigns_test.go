package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/campaignpb"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// campaignServer starts a coordinator whose campaigns run on a simulated
// fleet and its virtual clock.
func campaignServer(t *testing.T, nodes int) (*Server, *simfleet.Fleet, pb.CampaignServiceClient) {
	t.Helper()
	f, err := simfleet.New(simfleet.Config{Nodes: nodes, NodesPerLeaf: 4, Seed: 7, NoisePct: -1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(),
		HeartbeatInterval: time.Second, Insecure: true}
	s, err := New(cfg, Options{Logger: zerolog.Nop(), Version: "test", Fleet: f, CampaignClock: f.Clock()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(t, s) })
	return s, f, pb.NewCampaignServiceClient(dial(t, s))
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

func auditEvents(t *testing.T, s *Server) []string {
	t.Helper()
	evs, err := s.Store().Events(context.Background(), store.EventQuery{Limit: 200})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		if e.Kind == store.EventAudit {
			out = append(out, e.Actor+" "+e.Message)
		}
	}
	return out
}

func TestCampaignBaselinesRoundTrip(t *testing.T) {
	t.Parallel()
	s, _, c := campaignServer(t, 4)
	ctx := tctx(t)
	key := &pb.BaselineKey{Metric: baselines.MetricAllReduceBusBW, Scope: "node:gpu-001", Driver: "535.161.08"}
	for _, v := range []float64{470, 455} {
		if _, err := c.BaselineSet(ctx, &pb.BaselineSetRequest{Key: key, Value: v, Note: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	doc, err := c.BaselineHistory(ctx, &pb.BaselineKeyRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	hist := campaignpb.BaselineListFrom(doc)
	if len(hist) != 2 || hist[0].Value != 470 || hist[1].Value != 455 || hist[1].Version != 2 {
		t.Fatalf("history %+v", hist)
	}
	doc, err = c.BaselineShow(ctx, &pb.BaselineQuery{Scope: "node:gpu-001"})
	if err != nil {
		t.Fatal(err)
	}
	if shown := campaignpb.BaselineListFrom(doc); len(shown) != 1 || shown[0].Value != 455 {
		t.Fatalf("show %+v", shown)
	}
	// The shipped reference baselines are imported at start.
	doc, err = c.BaselineShow(ctx, &pb.BaselineQuery{Kind: "sku"})
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.GetBaselines()) == 0 {
		t.Fatal("no reference baselines")
	}

	exp, err := c.BaselineExport(ctx, &pb.BaselineQuery{Scope: "node:gpu-001", AllVersions: true})
	if err != nil {
		t.Fatal(err)
	}
	// Importing what was exported stores nothing new; onto another
	// coordinator it stores every version.
	imp, err := c.BaselineImport(ctx, &pb.BaselineImportRequest{File: exp.GetBody()})
	if err != nil {
		t.Fatal(err)
	}
	if r := campaignpb.BaselineImportFrom(imp); r.Added != 0 || r.Unchanged != 2 {
		t.Fatalf("re-import %+v", r)
	}
	_, _, c2 := campaignServer(t, 2)
	imp, err = c2.BaselineImport(ctx, &pb.BaselineImportRequest{File: exp.GetBody()})
	if err != nil {
		t.Fatal(err)
	}
	if r := campaignpb.BaselineImportFrom(imp); r.Added != 2 {
		t.Fatalf("import elsewhere %+v", r)
	}

	_, err = c.BaselineHistory(ctx, &pb.BaselineKeyRequest{Key: &pb.BaselineKey{Metric: baselines.MetricAllReduceBusBW, Scope: "node:nope"}})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("missing key: %v", err)
	}
	_, err = c.BaselineSet(ctx, &pb.BaselineSetRequest{Key: &pb.BaselineKey{Metric: "x", Scope: "rack:1"}, Value: 1})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad scope: %v", err)
	}

	audit := strings.Join(auditEvents(t, s), "\n")
	for _, want := range []string{"baseline.set: " + baselines.MetricAllReduceBusBW, "baseline.import"} {
		if !strings.Contains(audit, want) {
			t.Errorf("audit lacks %q:\n%s", want, audit)
		}
	}
}

func TestCampaignSweepFindsSlowNode(t *testing.T) {
	t.Parallel()
	s, f, c := campaignServer(t, 8)
	ctx := tctx(t)
	slow := f.Names()[2]
	if err := f.Inject(simfleet.GPUSlow{Node: slow, Factor: 0.5}); err != nil {
		t.Fatal(err)
	}
	// The engine's validation reaches the operator as invalid argument.
	if _, err := c.SweepStart(ctx, &pb.SpecRequest{Spec: []byte("threshold: -1\n")}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad spec: %v", err)
	}
	if _, err := c.SweepStart(ctx, &pb.SpecRequest{Spec: []byte("selector: ''\nnote: test\n")}); err != nil {
		t.Fatalf("start: %v", err)
	}
	st, err := c.SweepList(ctx, &pb.CampaignListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	list := campaignpb.SweepListFrom(st)
	if len(list) != 1 {
		t.Fatalf("list %+v", list)
	}
	id := list[0].ID
	var rep sweep.Report
	testwait.For(t, 20*time.Second, "the sweep to finish", func() (bool, string) {
		doc, err := c.SweepReport(ctx, &pb.CampaignRef{Id: id})
		if err != nil {
			t.Fatal(err)
		}
		rep = decode[sweep.Report](t, doc.GetBody())
		return rep.State != sweep.StateRunning, fmt.Sprintf("%s %+v", rep.State, rep.Progress)
	})
	if rep.State != sweep.StateDone {
		t.Fatalf("sweep %s: %s", rep.State, rep.Error)
	}
	found := false
	for _, v := range rep.Verdicts {
		if v.Subject == slow && v.Verdict == sweep.GPUSide {
			found = true
		}
	}
	if !found {
		t.Fatalf("no gpu-side verdict on %s: %+v", slow, rep.Verdicts)
	}
	if _, err := c.SweepStatus(ctx, &pb.CampaignRef{Id: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SweepReport(ctx, &pb.CampaignRef{Id: "sweep-nope"}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown sweep: %v", err)
	}
	if audit := strings.Join(auditEvents(t, s), "\n"); !strings.Contains(audit, "sweep.started: "+id) {
		t.Errorf("audit lacks the sweep:\n%s", audit)
	}
}

const testRolloutSpec = `
name: r550
selector: sku=h100
target: {driver: 550.90.07}
action: driver-upgrade
rollback_action: driver-rollback
canary: 1
waves: [50%]
max_unavailable: 2
approval: manual
`

// The simulated nodes report no kernel, so a matrix with a kernel rule
// cannot judge them: every node is left out, with the rule named.
const testRolloutMatrix = `
gpus:
  - model: H100 80GB HBM3
    drivers: ["535.*", ">=550.90.07, <551"]
kernels: [">=5.15, <7"]
`

func TestCampaignRolloutPlanExclusions(t *testing.T) {
	t.Parallel()
	s, f, c := campaignServer(t, 4)
	ctx := tctx(t)
	plan, err := c.RolloutPlan(ctx, &pb.SpecRequest{Spec: []byte(testRolloutSpec), Matrix: []byte(testRolloutMatrix)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := campaignpb.RolloutPlanFrom(plan)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Excluded) != len(f.Names()) {
		t.Fatalf("excluded %+v", p.Excluded)
	}
	for _, ex := range p.Excluded {
		if ex.Kind != rollout.ExcludedUnknown || !strings.Contains(ex.Reason, "kernel") {
			t.Errorf("%s: %s %q", ex.Node, ex.Kind, ex.Reason)
		}
	}
	// Without a matrix (none sent, none configured) the engine refuses.
	if _, err := c.RolloutPlan(ctx, &pb.SpecRequest{Spec: []byte(testRolloutSpec)}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("no matrix: %v", err)
	}
	if _, err := c.RolloutPlan(ctx, &pb.SpecRequest{Spec: []byte("selector: [\n")}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad spec: %v", err)
	}
	if _, err := c.RolloutControl(ctx, &pb.RolloutControlRequest{Id: "nope", Action: "pause"}); status.Code(err) != codes.NotFound {
		t.Fatalf("pause unknown: %v", err)
	}
	if _, err := c.RolloutControl(ctx, &pb.RolloutControlRequest{Id: "nope", Action: "explode"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad action: %v", err)
	}
	l, err := c.RolloutList(ctx, &pb.CampaignListRequest{})
	if err != nil || len(l.GetRollouts()) != 0 {
		t.Fatalf("list %v %v", l, err)
	}
	if audit := auditEvents(t, s); len(audit) != 0 {
		t.Errorf("refused actions audited: %q", audit)
	}
}

func TestCampaignConfig(t *testing.T) {
	t.Parallel()
	cfg := Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), HeartbeatInterval: time.Second, Insecure: true}.WithDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.SweepSchedule = &SweepScheduleConfig{Cron: "0 2 * * *", Spec: sweep.Spec{Selector: "sku=h100", Drain: true}}
	cfg.Drain.Adapter = "slurm"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("schedule: %v", err)
	}
	bad := cfg
	bad.SweepSchedule = &SweepScheduleConfig{Cron: "every night", Spec: sweep.Spec{Threshold: 1.5}}
	bad.Drain.Adapter = "pbs"
	err := bad.Validate()
	for _, want := range []string{"sweep_schedule.cron", "sweep_schedule.spec", "drain.adapter"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad config: %v, want %q", err, want)
		}
	}
}

// A coordinator with a nightly schedule and a drain adapter from config
// starts and stops cleanly.
func TestCampaignScheduleStartsAndStops(t *testing.T) {
	t.Parallel()
	f, err := simfleet.New(simfleet.Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), HeartbeatInterval: time.Second, Insecure: true,
		Drain:         DrainConfig{Adapter: "none"},
		Breaker:       BreakerConfig{MaxCount: 2},
		SweepSchedule: &SweepScheduleConfig{Cron: "0 2 * * *", Spec: sweep.Spec{Selector: "sku=h100"}}}
	s, err := New(cfg, Options{Logger: zerolog.Nop(), Fleet: f, CampaignClock: f.Clock()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	lead := s.camp.lead.get()
	if lead == nil || lead.cron == nil || len(lead.cron.Entries()) != 1 {
		t.Fatal("no scheduled sweep")
	}
	// What the schedule runs each night: a whole sweep, audited as the
	// schedule's.
	s.camp.scheduledSweep(lead, sweep.Spec{Selector: "sku=h100"})
	l, err := s.camp.sweep().List(context.Background())
	if err != nil || len(l) != 1 || l[0].State != sweep.StateDone {
		t.Fatalf("scheduled sweep: %+v %v", l, err)
	}
	if audit := strings.Join(auditEvents(t, s), "\n"); !strings.Contains(audit, "schedule:sweep sweep.start: "+l[0].ID) {
		t.Errorf("audit:\n%s", audit)
	}
	stopServer(t, s)
}
