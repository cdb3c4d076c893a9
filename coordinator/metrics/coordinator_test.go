package metrics

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/internal/promserve"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

func TestCoordinatorExposition(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	cm, err := NewCoordinator(reg)
	if err != nil {
		t.Fatal(err)
	}
	// Before the server exists: no Stats series, no failure.
	if fams := scrape(t, promserve.Handler(reg)); fams["fleetcheck_nodes"] != nil {
		t.Fatal("node counts before Watch")
	}
	srv, err := coordinator.New(coordinator.Config{
		Listen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", DataDir: t.TempDir(), Insecure: true, HeartbeatInterval: time.Second,
	}, coordinator.Options{Logger: zerolog.Nop(), Metrics: cm})
	if err != nil {
		t.Fatal(err)
	}
	cm.Watch(srv.Stats)
	srv.HTTPMux().Handle("/metrics", promserve.Handler(reg))
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
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := pb.NewAgentServiceClient(cc).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *pb.AgentMessage) {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() *pb.CoordinatorMessage {
		t.Helper()
		for {
			m, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if m.GetHeartbeat() == nil {
				return m
			}
		}
	}
	send(&pb.AgentMessage{Msg: &pb.AgentMessage_Hello{Hello: &pb.Hello{Node: "gpu-001", ProtocolVersion: coordinator.ProtocolVersion}}})
	if recv().GetWelcome() == nil {
		t.Fatal("no welcome")
	}
	now := time.Now().UnixMilli()
	res := &pb.Result{Id: "r-1", Node: "gpu-001", Status: "fail", Full: true, FinishedUnixMs: now,
		Checks: []*pb.CheckResult{{Name: "gpu.ecc", Status: "fail"}}}
	for i := 0; i < 2; i++ { // the second is a duplicate
		send(&pb.AgentMessage{Msg: &pb.AgentMessage_Result{Result: res}})
		if recv().GetAck() == nil {
			t.Fatal("no ack")
		}
	}
	forged := &pb.Result{Id: "r-2", Node: "gpu-001", Status: "pass", FinishedUnixMs: now, WorkId: "w-never-sent"}
	send(&pb.AgentMessage{Msg: &pb.AgentMessage_Result{Result: forged}})
	if a := recv().GetAck(); a.GetRefused() == "" {
		t.Fatalf("forged work accepted: %v", a)
	}

	// Scraped over the coordinator's own HTTP listener.
	var fams map[string]*dto.MetricFamily
	testwait.For(t, 5*time.Second, "one failed node on /metrics", func() (bool, string) {
		resp, err := http.Get("http://" + srv.HTTPAddr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		fams = scrape(t, promserve.Handler(reg))
		v, _ := value(t, fams, "fleetcheck_nodes", map[string]string{"state": "failed"})
		return v == 1, fmt.Sprintf("fleetcheck_nodes{state=failed} %v", v)
	})
	mustValue(t, fams, "fleetcheck_nodes", map[string]string{"state": "failed"}, 1)
	mustValue(t, fams, "fleetcheck_nodes", map[string]string{"state": "healthy"}, 0)
	mustValue(t, fams, "fleetcheck_nodes", map[string]string{"state": "unreachable"}, 0)
	mustValue(t, fams, "fleetcheck_agents_connected", nil, 1)
	mustValue(t, fams, "fleetcheck_results_ingested_total", nil, 1)
	mustValue(t, fams, "fleetcheck_results_duplicate_total", nil, 1)
	mustValue(t, fams, "fleetcheck_results_refused_total", nil, 1)
	mustValue(t, fams, "fleetcheck_runcheck_in_progress", nil, 0)
	mustValue(t, fams, "fleetcheck_runcheck_nodes", map[string]string{"progress": "pending"}, 0)
	if _, ok := fams["fleetcheck_runcheck_progress_ratio"]; ok {
		t.Error("progress ratio with no RunCheck in progress")
	}
	// Every batch committed is observed (the duplicate is answered from
	// the store too).
	if n, _ := value(t, fams, "fleetcheck_store_commit_duration_seconds", nil); n < 1 {
		t.Errorf("commit latency observed %v times", n)
	}
	if n, _ := value(t, fams, "fleetcheck_store_commit_batch_results", nil); n < 1 {
		t.Errorf("batch sizes observed %v times", n)
	}
	// One series per node: its state's.
	mustValue(t, fams, "fleetcheck_node_state", map[string]string{"node": "gpu-001", "state": "failed"}, 1)
	if n := len(fams["fleetcheck_node_state"].GetMetric()); n != 1 {
		t.Errorf("%d node state series for one node", n)
	}
	if bi := fams["fleetcheck_build_info"].GetMetric(); len(bi) != 1 || labelOf(bi[0], "version") != "dev" ||
		labelOf(bi[0], "revision") == "" || labelOf(bi[0], "goversion") == "" {
		t.Errorf("fleetcheck_build_info: %v", bi)
	}
	// The node passes again: its series moves to healthy, the failed one
	// is gone.
	healthy := &pb.Result{Id: "r-3", Node: "gpu-001", Status: "pass", Full: true, FinishedUnixMs: now + 1000,
		Checks: []*pb.CheckResult{{Name: "gpu.ecc", Status: "pass"}}}
	send(&pb.AgentMessage{Msg: &pb.AgentMessage_Result{Result: healthy}})
	if recv().GetAck() == nil {
		t.Fatal("no ack")
	}
	testwait.For(t, 5*time.Second, "gpu-001 healthy on /metrics", func() (bool, string) {
		fams = scrape(t, promserve.Handler(reg))
		v, _ := value(t, fams, "fleetcheck_node_state", map[string]string{"node": "gpu-001", "state": "healthy"})
		return v == 1, fmt.Sprintf("fleetcheck_node_state %v", fams["fleetcheck_node_state"].GetMetric())
	})
	if n := len(fams["fleetcheck_node_state"].GetMetric()); n != 1 {
		t.Errorf("stale state series: %v", fams["fleetcheck_node_state"].GetMetric())
	}
	mustValue(t, fams, "fleetcheck_nodes", map[string]string{"state": "failed"}, 0)
	mustType(t, fams, "fleetcheck_results_ingested_total", dto.MetricType_COUNTER)
	mustType(t, fams, "fleetcheck_store_commit_duration_seconds", dto.MetricType_HISTOGRAM)
	lint(t, reg)
}

func TestCoordinatorGossipMembers(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	cm, err := NewCoordinator(reg)
	if err != nil {
		t.Fatal(err)
	}
	stats := coordinator.Stats{}
	cm.Watch(func() coordinator.Stats { return stats })
	if fams := scrape(t, promserve.Handler(reg)); fams["fleetcheck_gossip_members"] != nil {
		t.Error("gossip members exported with gossip off")
	}
	stats.GossipMembers = map[string]int{"alive": 9, "dead": 1}
	fams := scrape(t, promserve.Handler(reg))
	mustValue(t, fams, "fleetcheck_gossip_members", map[string]string{"state": "alive"}, 9)
	mustValue(t, fams, "fleetcheck_gossip_members", map[string]string{"state": "dead"}, 1)
	mustValue(t, fams, "fleetcheck_gossip_members", map[string]string{"state": "left"}, 0)
}
