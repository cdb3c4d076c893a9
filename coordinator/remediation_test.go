package coordinator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/coordinator/campaignpb"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// remedFleet is a simulated fleet whose agents have the ladder's actions
// (examples/agent.yaml's names): each succeeds and is recorded; the
// collect action answers as deploy/actions/fleetcheck-collect-bundle.
type remedFleet struct {
	kit.Fleet
	mu  sync.Mutex
	ran []string
}

func (f *remedFleet) RunAction(ctx context.Context, node, action string, params map[string]string, o kit.RunOptions) (kit.ActionResult, error) {
	switch action {
	case "gpu-reset", "ib-port-reset", "reboot", "collect-bundle":
	default:
		return f.Fleet.RunAction(ctx, node, action, params, o)
	}
	f.mu.Lock()
	f.ran = append(f.ran, fmt.Sprintf("%s %s %v", node, action, params))
	f.mu.Unlock()
	if action == "collect-bundle" {
		return kit.ActionResult{OK: true, Message: "done", Output: "bundle /var/lib/fleetcheck-agent/bundles/" + node + ".tar.gz\n"}, nil
	}
	return kit.ActionResult{OK: true, Message: "done"}, nil
}

func (f *remedFleet) actions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ran...)
}

// remedServer starts a coordinator whose campaigns and ladder run on a
// simulated fleet with the ladder's actions, on its virtual clock.
func remedServer(t *testing.T, rc remediation.Config) (*Server, *simfleet.Fleet, *remedFleet) {
	t.Helper()
	f, err := simfleet.New(simfleet.Config{Nodes: 4, NodesPerLeaf: 4, Seed: 7, NoisePct: -1})
	if err != nil {
		t.Fatal(err)
	}
	rf := &remedFleet{Fleet: f}
	cfg := Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(),
		HeartbeatInterval: time.Second, Insecure: true, Remediation: rc}
	s, err := New(cfg, Options{Logger: zerolog.Nop(), Version: "test", Fleet: rf, CampaignClock: f.Clock()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(t, s) })
	return s, f, rf
}

// TestRemediationEvidenceFromStores: in the live coordinator the ladder's
// verification compares the all_reduce with the node's baseline in the
// baselines store, and the RMA carries the node's burn-in history from
// the burn-in store.
func TestRemediationEvidenceFromStores(t *testing.T) {
	t.Parallel()
	s, f, rf := remedServer(t, remediation.Config{Mode: remediation.ModeAuto, VerifyChecks: []string{"gpu.ecc"}})
	ctx := tctx(t)
	node := f.Names()[1]
	c := pb.NewCampaignServiceClient(dial(t, s))

	// A finished burn-in of the node (rejected: simfleet leaves the
	// passive checks skipped, which burn-in calls inconclusive).
	st, err := c.BurninStart(ctx, &pb.SpecRequest{Spec: []byte("name: accept-" + node + "\nselector: name=" + node + "\nlevel: quick\nrepeats: 1\n")})
	if err != nil {
		t.Fatalf("burn-in start: %v", err)
	}
	bid := st.GetId()
	testwait.For(t, 20*time.Second, "the burn-in to finish", func() (bool, string) {
		r, err := c.BurninStatus(ctx, &pb.CampaignRef{Id: bid})
		if err != nil {
			t.Fatal(err)
		}
		cs := campaignpb.BurninStatusFrom(r)
		return cs.State != burnin.StateRunning, fmt.Sprintf("%s %s", cs.State, cs.Phase)
	})
	// The node's stored baseline: far above what the simulated node
	// measures, so the verification fails on it alone.
	if _, err := s.camp.bl.Record(ctx, baselines.Key{Metric: baselines.MetricAllReduceBusBW, Scope: baselines.NodeScope(node)},
		[]float64{5000}, "test", "", "recorded for the test"); err != nil {
		t.Fatal(err)
	}

	id, err := s.camp.remed().Trigger(ctx, remediation.Trigger{Node: node, Component: "GPU2", Step: remediation.StepResetGPU, Code: "XID_48", Source: "finding", Reason: "gpu.ecc: GPU2 XID_48"})
	if err != nil {
		t.Fatal(err)
	}
	var r remediation.Remediation
	testwait.For(t, 20*time.Second, "the ladder to reach replace", func() (bool, string) {
		if r, err = s.camp.remed().Get(ctx, id); err != nil {
			t.Fatal(err)
		}
		return r.State == remediation.StateRMA && r.RMA != nil || r.State.Final(), fmt.Sprintf("%s %s: %s", r.State, r.Step, r.Reason)
	})
	if r.State != remediation.StateRMA {
		t.Fatalf("remediation %s in %s, want rma: %s", id, r.State, r.Reason)
	}
	var hist []string
	for _, e := range r.Events {
		hist = append(hist, e.What)
	}
	h := strings.Join(hist, "\n")
	if !strings.Contains(h, "reset_gpu did not hold (verify: nccl.allreduce:") || !strings.Contains(h, "below the node's baseline 5000.0") ||
		!strings.Contains(h, "reboot did not hold") {
		t.Errorf("the verification did not judge against the stored baseline:\n%s", h)
	}
	ev := r.RMA.Evidence
	if len(ev.BurnIn) != 1 || ev.BurnIn[0].ID != bid || ev.BurnIn[0].Verdict != string(burnin.Rejected) ||
		!strings.Contains(ev.BurnIn[0].Detail, "accept-"+node+" (quick): inconclusive") {
		t.Errorf("RMA burn-in history %+v, want the rejected burn-in %s", ev.BurnIn, bid)
	}
	if ev.Bundle != node+":/var/lib/fleetcheck-agent/bundles/"+node+".tar.gz" {
		t.Errorf("bundle %q", ev.Bundle)
	}
	want := []string{node + " gpu-reset map[gpu:2]", node + " reboot map[]", node + " collect-bundle map[]"}
	if got := rf.actions(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("actions %q, want %q", got, want)
	}
}
