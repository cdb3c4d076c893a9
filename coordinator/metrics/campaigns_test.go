package metrics

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/internal/promserve"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// The simulated agents configure no action, so a rollout's canary cannot
// be upgraded: it fails, and the wave's gate halts the rollout.
const haltingRollout = `
name: r550
selector: sku=h100
target: {driver: 550.90.07}
action: driver-upgrade
canary: 1
waves: [100%]
max_unavailable: 1
`

const rolloutMatrix = `
gpus:
  - model: H100 80GB HBM3
    drivers: ["535.*", ">=550.90.07, <551"]
`

// TestCoordinatorCampaignProgress runs real campaigns on a simulated
// fleet and reads their progress from /metrics as they change.
func TestCoordinatorCampaignProgress(t *testing.T) {
	t.Parallel()
	f, err := simfleet.New(simfleet.Config{Nodes: 4, NodesPerLeaf: 4, Seed: 7, NoisePct: -1})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cm, err := NewCoordinator(reg)
	if err != nil {
		t.Fatal(err)
	}
	cm.campaignTTL = 0 // every scrape reads the engines: the test watches them change
	srv, err := coordinator.New(coordinator.Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(),
		Insecure: true, HeartbeatInterval: time.Second},
		coordinator.Options{Logger: zerolog.Nop(), Version: "1.4.0", Fleet: f, CampaignClock: f.Clock()})
	if err != nil {
		t.Fatal(err)
	}
	cm.Watch(srv.Stats)
	cm.WatchCampaigns(srv.CampaignStats)
	if fams := scrape(t, promserve.Handler(reg)); fams["fleetcheck_campaigns"] != nil {
		t.Error("campaign counts before the engines started")
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	cc, err := grpc.NewClient(srv.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	camp := pb.NewCampaignServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Started, nothing run: every kind's states at 0, no campaign series.
	fams := scrape(t, promserve.Handler(reg))
	for kind, state := range map[string]string{"sweep": "done", "rollout": "halted", "burnin": "cancelled", "drill": "aborted"} {
		mustValue(t, fams, "fleetcheck_campaigns", map[string]string{"kind": kind, "state": state}, 0)
	}
	mustValue(t, fams, "fleetcheck_campaign_read_errors_total", nil, 0)
	if fams["fleetcheck_campaign_nodes"] != nil || fams["fleetcheck_campaign_halted"] != nil {
		t.Errorf("campaign series with none running: %v %v", fams["fleetcheck_campaign_nodes"], fams["fleetcheck_campaign_halted"])
	}

	// A sweep runs to its end: counted done, its progress series gone.
	if _, err := camp.SweepStart(ctx, &pb.SpecRequest{Spec: []byte("selector: ''\nnote: metrics test\n")}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, "the sweep counted done", func() (bool, string) {
		fams = scrape(t, promserve.Handler(reg))
		done, _ := value(t, fams, "fleetcheck_campaigns", map[string]string{"kind": "sweep", "state": "done"})
		running, _ := value(t, fams, "fleetcheck_campaigns", map[string]string{"kind": "sweep", "state": "running"})
		return done == 1 && running == 0, fmt.Sprintf("done %v running %v", done, running)
	})
	if m := fams["fleetcheck_campaign_tests"]; m != nil {
		t.Errorf("progress of a finished sweep: %v", m.GetMetric())
	}

	// A rollout whose canary cannot be upgraded halts at its first wave.
	started, err := camp.RolloutStart(ctx, &pb.SpecRequest{Spec: []byte(haltingRollout), Matrix: []byte(rolloutMatrix)})
	if err != nil {
		t.Fatal(err)
	}
	id := started.GetId()
	testwait.For(t, 20*time.Second, "the rollout halted on /metrics", func() (bool, string) {
		fams = scrape(t, promserve.Handler(reg))
		h, _ := value(t, fams, "fleetcheck_campaign_halted", map[string]string{"kind": "rollout", "campaign": id})
		return h == 1, fmt.Sprintf("halted %v; nodes %v", h, fams["fleetcheck_campaign_nodes"].GetMetric())
	})
	mustValue(t, fams, "fleetcheck_campaigns", map[string]string{"kind": "rollout", "state": "halted"}, 1)
	mustValue(t, fams, "fleetcheck_campaigns", map[string]string{"kind": "rollout", "state": "running"}, 0)
	mustValue(t, fams, "fleetcheck_campaign_round", map[string]string{"kind": "rollout", "campaign": id}, 1)
	mustValue(t, fams, "fleetcheck_campaign_nodes", map[string]string{"kind": "rollout", "campaign": id, "progress": "failed"}, 1)
	mustValue(t, fams, "fleetcheck_campaign_nodes", map[string]string{"kind": "rollout", "campaign": id, "progress": "done"}, 0)
	var nodes float64
	for _, m := range fams["fleetcheck_campaign_nodes"].GetMetric() {
		nodes += m.GetGauge().GetValue()
	}
	if nodes != 4 {
		t.Errorf("rollout nodes sum to %v, want the fleet's 4", nodes)
	}

	// Aborted, it is finished: counted, its series gone.
	if _, err := camp.RolloutControl(ctx, &pb.RolloutControlRequest{Id: id, Action: "abort"}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 20*time.Second, "the rollout aborted on /metrics", func() (bool, string) {
		fams = scrape(t, promserve.Handler(reg))
		a, _ := value(t, fams, "fleetcheck_campaigns", map[string]string{"kind": "rollout", "state": "aborted"})
		return a == 1 && fams["fleetcheck_campaign_halted"] == nil, fmt.Sprintf("aborted %v, halted %v", a, fams["fleetcheck_campaign_halted"].GetMetric())
	})
	mustType(t, fams, "fleetcheck_campaigns", dto.MetricType_GAUGE)
	mustValue(t, fams, "fleetcheck_campaign_read_errors_total", nil, 0)
	lint(t, reg)
}

// TestCoordinatorCampaignSeries: what CampaignStats says is what the
// series say, and a failed read is counted, not a failed scrape.
func TestCoordinatorCampaignSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	cm, err := NewCoordinator(reg)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1_700_000_000, 0)
	cm.now = func() time.Time { return at }
	reads := 0
	var fail error
	cm.WatchCampaigns(func(context.Context) ([]coordinator.KindStats, error) {
		reads++
		return []coordinator.KindStats{{Kind: "sweep", States: map[string]int{"running": 1, "done": 3},
			Running: []coordinator.CampaignRun{{ID: "sweep-1", Round: 2, TestsDone: 5, Tests: 12}}}}, fail
	})
	fams := scrape(t, promserve.Handler(reg))
	mustValue(t, fams, "fleetcheck_campaigns", map[string]string{"kind": "sweep", "state": "done"}, 3)
	mustValue(t, fams, "fleetcheck_campaign_round", map[string]string{"kind": "sweep", "campaign": "sweep-1"}, 2)
	mustValue(t, fams, "fleetcheck_campaign_tests", map[string]string{"kind": "sweep", "campaign": "sweep-1", "progress": "done"}, 5)
	mustValue(t, fams, "fleetcheck_campaign_tests", map[string]string{"kind": "sweep", "campaign": "sweep-1", "progress": "pending"}, 7)
	mustValue(t, fams, "fleetcheck_campaign_halted", map[string]string{"kind": "sweep", "campaign": "sweep-1"}, 0)
	// A second scrape within the TTL reuses the read; after it, reads again.
	scrape(t, promserve.Handler(reg))
	if reads != 1 {
		t.Errorf("%d reads for two scrapes within the TTL", reads)
	}
	at = at.Add(cm.campaignTTL)
	fail = fmt.Errorf("database is locked")
	fams = scrape(t, promserve.Handler(reg))
	if reads != 2 {
		t.Errorf("%d reads after the TTL", reads)
	}
	mustValue(t, fams, "fleetcheck_campaign_read_errors_total", nil, 1)
}
