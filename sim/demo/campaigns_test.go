package demo

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
)

func runScenario(t *testing.T, name string, opts CampaignOptions) *Campaigns {
	t.Helper()
	var c Campaigns
	var out strings.Builder
	opts.Seed, opts.Dir, opts.Progress = 1, t.TempDir(), &out
	if err := RunCampaign(context.Background(), name, opts, &c); err != nil {
		t.Fatal(err)
	}
	if testing.Verbose() {
		t.Log(out.String())
	}
	// -o json prints it: no NaN, nothing unmarshalable.
	if _, err := json.Marshal(&c); err != nil {
		t.Fatalf("json: %v", err)
	}
	return &c
}

func TestSweepScenarioFindsBadNodesAndLink(t *testing.T) {
	t.Parallel()
	rep := runScenario(t, "sweep", CampaignOptions{}).Sweep.Report
	got := map[string]sweep.Kind{}
	for _, v := range rep.Verdicts {
		got[v.Subject] = v.Verdict
		if v.Deviation <= v.Threshold {
			t.Errorf("%s: deviation %v not over threshold %v", v.Subject, v.Deviation, v.Threshold)
		}
	}
	want := map[string]sweep.Kind{"gpu-0005": sweep.GPUSide, "gpu-0040": sweep.NetworkSide, "leaf-01|leaf-03": sweep.Link}
	if len(got) != len(want) {
		t.Fatalf("verdicts %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("verdicts %v, want %v", got, want)
		}
	}
	if rep.RoundCount > 3 || rep.AllReduceRuns == 0 || rep.DurationS <= 0 {
		t.Errorf("rounds %d, runs %d, duration %v", rep.RoundCount, rep.AllReduceRuns, rep.DurationS)
	}
}

func TestRolloutScenarioCanaryHaltsAndGoodDriverCompletes(t *testing.T) {
	t.Parallel()
	r := runScenario(t, "rollout", CampaignOptions{}).Rollout
	bad, good := r.Bad, r.Good
	if bad.Phase != rollout.PhaseHalted || bad.Counts[rollout.Failed] != 1 || bad.Counts[rollout.Done] != 0 {
		t.Fatalf("bad driver: phase %s counts %v", bad.Phase, bad.Counts)
	}
	if !strings.Contains(bad.HaltReason, "canary") || len(bad.Evidence) == 0 || !strings.Contains(bad.Evidence[0], "XID_79") {
		t.Fatalf("bad driver: halt %q evidence %q", bad.HaltReason, bad.Evidence)
	}
	for _, n := range bad.Nodes {
		if n.Wave > 0 && n.State != rollout.Pending {
			t.Errorf("bad driver: %s of wave %d is %s: the halt came too late", n.Node, n.Wave, n.State)
		}
	}
	if good.Phase != rollout.PhaseCompleted || good.Counts[rollout.Done] != 11 || len(good.Waves) != 3 {
		t.Fatalf("good driver: phase %s counts %v waves %d", good.Phase, good.Counts, len(good.Waves))
	}
	for _, s := range []*rollout.Status{bad, good} {
		if len(s.Excluded) != 1 || s.Excluded[0].Node != "gpu-0012" || !strings.Contains(s.Excluded[0].Reason, "kernel") {
			t.Errorf("%s: excluded %+v", s.ID, s.Excluded)
		}
	}
	if r.GoodSimulatedS <= 0 || r.BadSimulatedS <= 0 {
		t.Errorf("simulated durations %v %v", r.BadSimulatedS, r.GoodSimulatedS)
	}
}

func TestBurninScenarioRejectsOnlyTheSlowNode(t *testing.T) {
	t.Parallel()
	html := filepath.Join(t.TempDir(), "burnin.html")
	b := runScenario(t, "burnin", CampaignOptions{HTML: html}).Burnin
	if !slices.Equal(b.Rejected, []string{b.SlowNode}) || len(b.Accepted) != 15 {
		t.Fatalf("rejected %v (slow %s), accepted %d", b.Rejected, b.SlowNode, len(b.Accepted))
	}
	for _, n := range b.Report.Nodes {
		if n.Node != b.SlowNode {
			continue
		}
		var outlier bool
		for _, r := range n.Evidence.Reasons {
			outlier = outlier || r.Code == burnin.ReasonPeerOutlier
			if r.Code == burnin.ReasonBelowFloor {
				t.Errorf("the slow node is above the floor, yet: %+v", r)
			}
		}
		if !outlier {
			t.Errorf("slow node rejected without peer-outlier evidence: %+v", n.Evidence.Reasons)
		}
	}
	page, err := os.ReadFile(html)
	if err != nil || !strings.Contains(string(page), b.SlowNode) {
		t.Fatalf("HTML report: %v", err)
	}
}

func TestDrillScenarioTimingsAndBlastRadius(t *testing.T) {
	t.Parallel()
	d := runScenario(t, "drill", CampaignOptions{}).Drill
	if d.DetectedBy != "gpu.xid" || !(d.TTDS > 0) || !(d.TTRS >= d.TTDS) {
		t.Fatalf("detected by %q, TTD %vs, TTR %vs", d.DetectedBy, d.TTDS, d.TTRS)
	}
	if len(d.Drill.Targets) != 1 || !d.Drill.Targets[0].ExpectedDetected {
		t.Fatalf("targets %+v", d.Drill.Targets)
	}
	if !d.BlastRadiusHeld || !strings.Contains(d.Refused, "blast radius") {
		t.Fatalf("blast radius: refused %v %q", d.BlastRadiusHeld, d.Refused)
	}
}

func TestUnknownCampaignScenario(t *testing.T) {
	t.Parallel()
	var c Campaigns
	if err := RunCampaign(context.Background(), "nope", CampaignOptions{}, &c); err == nil || !strings.Contains(err.Error(), "sweep") {
		t.Fatalf("err %v", err)
	}
}
