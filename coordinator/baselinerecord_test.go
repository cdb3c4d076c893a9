package coordinator

import (
	"github.com/fleetcheck/fleetcheck/internal/wire"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/coordinator/campaignpb"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// ncclResult is a result holding nccl.allreduce, with busbw when > 0, and
// the node's inventory when driver is set.
func ncclResult(node string, busbw float64, driver string) *pb.Result {
	id, seq := nextID(node)
	now := time.Now().UnixMilli() + int64(seq)
	metrics := map[string]float64{"nccl.allreduce.algbw_gbps": 300}
	if busbw > 0 {
		metrics[baselines.MetricAllReduceBusBW] = busbw
	}
	c := &pb.CheckResult{Name: "nccl.allreduce", Status: "pass", Metrics: wire.MetricsToProto(metrics)}
	r := &pb.Result{Id: id, Node: node, StartedUnixMs: now - 100, FinishedUnixMs: now, Status: "pass", Checks: []*pb.CheckResult{c}}
	if driver != "" {
		r.Inventory = &pb.Inventory{DriverVersion: driver, RdmaStack: "MLNX_OFED 23.10-1.1.9.0"}
	}
	return r
}

func TestBaselineRecordFromStoredResults(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	c := pb.NewCampaignServiceClient(dial(t, s))
	ctx := tctx(t)
	send := func(a *fakeAgent, r *pb.Result) string {
		a.sendResult(r)
		if ack := a.ack(5 * time.Second); ack.GetRefused() != "" {
			t.Fatalf("refused: %s", ack.GetRefused())
		}
		return r.GetId()
	}
	good := mustConnect(t, s, "gpu-001")
	first := send(good, ncclResult("gpu-001", 470, "550.54.15"))
	send(good, ncclResult("gpu-001", 474, ""))
	noMetric := mustConnect(t, s, "gpu-002")
	send(noMetric, ncclResult("gpu-002", 0, ""))
	mustConnect(t, s, "gpu-003") // never ran nccl.allreduce
	upgraded := mustConnect(t, s, "gpu-004")
	send(upgraded, ncclResult("gpu-004", 400, "535.161.08"))
	send(upgraded, ncclResult("gpu-004", 480, "550.90.07"))

	// --from RESULT_ID with no --scope: the result's node, its stack.
	doc, err := c.BaselineRecord(ctx, &pb.BaselineRecordRequest{Key: &pb.BaselineKey{Metric: baselines.MetricAllReduceBusBW}, FromRun: first})
	if err != nil {
		t.Fatalf("record from result: %v", err)
	}
	rep := campaignpb.BaselineRecordFrom(doc)
	if len(rep.Recorded) != 1 || len(rep.Skipped) != 0 {
		t.Fatalf("from result: %+v", rep)
	}
	b := rep.Recorded[0]
	if b.Scope != "node:gpu-001" || b.Value != 470 || b.Stack.Driver != "550.54.15" || b.Stack.RDMAStack != "MLNX_OFED 23.10-1.1.9.0" || b.FromRun != first {
		t.Errorf("from result: %+v (stack %s)", b, b.Stack)
	}

	// --from SELECTOR: one per node that has the metric, under the stack
	// its inventory reported; the rest said.
	doc, err = c.BaselineRecord(ctx, &pb.BaselineRecordRequest{Key: &pb.BaselineKey{Metric: baselines.MetricAllReduceBusBW, Nccl: "2.21.5"}, Selector: "sku=h100"})
	if err != nil {
		t.Fatalf("record from selector: %v", err)
	}
	rep = campaignpb.BaselineRecordFrom(doc)
	got := map[string]baselines.Baseline{}
	for _, b := range rep.Recorded {
		got[string(b.Scope)] = b
	}
	if len(got) != 2 {
		t.Fatalf("recorded %+v", rep.Recorded)
	}
	if b := got["node:gpu-001"]; b.Stack.Driver != "550.54.15" || b.Stack.NCCL != "2.21.5" || b.Samples.Count != 2 || b.Value != 472 {
		t.Errorf("gpu-001: %+v, stack %s", b, b.Stack)
	}
	// Only the sample taken under the node's newest stack.
	if b := got["node:gpu-004"]; b.Stack.Driver != "550.90.07" || b.Samples.Count != 1 || b.Value != 480 {
		t.Errorf("gpu-004 after its upgrade: %+v, stack %s", b, b.Stack)
	}
	want := []baselines.Skipped{
		{Node: "gpu-002", Reason: "its 1 newest nccl.allreduce results hold no nccl.allreduce.busbw_gbps"},
		{Node: "gpu-003", Reason: "no stored nccl.allreduce result"},
	}
	if len(rep.Skipped) != 2 || rep.Skipped[0] != want[0] || rep.Skipped[1] != want[1] {
		t.Errorf("skipped %+v, want %+v", rep.Skipped, want)
	}

	// A selector with nothing to record says why, node by node.
	_, err = c.BaselineRecord(ctx, &pb.BaselineRecordRequest{Key: &pb.BaselineKey{Metric: baselines.MetricAllReduceBusBW}, Selector: "name in (gpu-002,gpu-003)"})
	if err == nil || !strings.Contains(err.Error(), "gpu-003: no stored nccl.allreduce result") {
		t.Errorf("nothing to record: %v", err)
	}
}
