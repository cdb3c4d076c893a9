package burnin

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

const standardSpec = `
name: rack-r1-acceptance
selector: batch=new
level: standard
who: test
`

// On both databases: every campaign engine uses the same store.
func TestHealthyCampaignAcceptsAndReturnsNodes(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, open func(testing.TB) *sqldb.DB) { healthyCampaign(t, newHarnessOn(t, 8, open(t))) })
}

func healthyCampaign(t *testing.T, h *harness) {
	h.setSKUBaselines()
	id := h.start(standardSpec)
	h.finish(h.eng)
	r := h.report(id)
	if r.Campaign.State != StateDone || r.Campaign.Accepted != 8 || r.Campaign.Rejected != 0 {
		t.Fatalf("campaign: %+v", r.Campaign)
	}
	for _, n := range r.Nodes {
		if n.Verdict != Accepted {
			t.Errorf("%s: %s %+v", n.Node, n.Verdict, n.Evidence.Reasons)
		}
		// Every step ran once: passive twice (before and after), dcgm r2,
		// the sweep, the PCIe action.
		if got := h.fleet.count(n.Node, "dcgm.diag:2"); got != 1 {
			t.Errorf("%s: dcgm.diag level 2 ran %d times", n.Node, got)
		}
		if got := h.fleet.count(n.Node, "passive"); got != 2 {
			t.Errorf("%s: passive checks ran %d times, want 2", n.Node, got)
		}
		st, _ := h.drain.Status(context.Background(), n.Node)
		if st.Drained {
			t.Errorf("%s: accepted node still drained", n.Node)
		}
		if len(n.Evidence.Numbers) == 0 || n.Evidence.Numbers[0].Baseline != 480 {
			t.Errorf("%s: numbers %+v", n.Node, n.Evidence.Numbers)
		}
	}
	if len(r.Metrics) == 0 {
		t.Fatal("no metric summary")
	}
}

func TestOutlierAmongPeersRejectedAboveFloor(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 10)
	h.setSKUBaselines()
	// 12.5 % below its peers: far above the baseline floor (336 = 480 -
	// 30 %), but an outlier among identical nodes.
	h.fleet.node("gpu-004").busbw = 420
	// 5 % below: within the 10 % rule, accepted.
	h.fleet.node("gpu-007").busbw = 456
	id := h.start(standardSpec)
	h.finish(h.eng)
	r := h.report(id)
	bad := nodeOf(t, r, "gpu-004")
	if bad.Verdict != Rejected || !hasReason(bad, ReasonPeerOutlier) || hasReason(bad, ReasonBelowBaseline) {
		t.Fatalf("gpu-004: %s %+v", bad.Verdict, bad.Evidence.Reasons)
	}
	num := bad.Evidence.Numbers[0]
	if !num.Outlier || num.BaselineVerdict != "pass" || num.CampaignMedian < 470 || num.Peers != 10 {
		t.Errorf("gpu-004 number: %+v", num)
	}
	if ok := nodeOf(t, r, "gpu-007"); ok.Verdict != Accepted {
		t.Errorf("gpu-007 within 10 %% of the median: %s %+v", ok.Verdict, ok.Evidence.Reasons)
	}
	// Rejected nodes stay out of service; the campaign drained them.
	if st, _ := h.drain.Status(context.Background(), "gpu-004"); !st.Drained || !drain.Owns(st, tag(id)) {
		t.Errorf("gpu-004 drain: %+v", st)
	}
}

func TestOutlierRuleBoundaries(t *testing.T) {
	t.Parallel()
	o := OutlierRule{MinShortfall: 0.10, MADs: 3, MinPeers: 4}
	cases := []struct {
		name         string
		v, med, madv float64
		dir          string
		want         bool
	}{
		{"11% below, far out", 427.2, 480, 2, "higher", true},
		{"exactly 10% below is not more than 10%", 432, 480, 2, "higher", false},
		{"12% below but within 3 MADs of a loose fleet", 422.4, 480, 20, "higher", false},
		{"above the median never", 540, 480, 2, "higher", false},
		{"lower-better: 20% slower latency", 12, 10, 0.1, "lower", true},
		{"zero MAD: any shortfall past 10%", 400, 480, 0, "higher", true},
	}
	for _, c := range cases {
		if got := o.outlier(c.v, c.med, c.madv, c.dir); got != c.want {
			t.Errorf("%s: got %v", c.name, got)
		}
	}
	if m := median([]float64{3, 1, 2, 10}); m != 2.5 {
		t.Errorf("median %v", m)
	}
	if d := mad([]float64{1, 2, 3, 4, 100}, 3); d != 1 {
		t.Errorf("mad %v", d)
	}
}

func TestFailingCheckRejectedWithFinding(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 6)
	h.setSKUBaselines()
	h.fleet.node("gpu-002").fail["gpu.ecc"] = report.Finding{Severity: report.SevFail, Component: "GPU3", PCIBusID: "0000:49:00.0",
		Code: "ECC_UNCORRECTABLE", Message: "2 uncorrectable DRAM errors", Action: report.ActionReplace}
	id := h.start(standardSpec)
	h.finish(h.eng)
	n := nodeOf(t, h.report(id), "gpu-002")
	if n.Verdict != Rejected || !hasReason(n, ReasonCheckFailed) {
		t.Fatalf("verdict %s %+v", n.Verdict, n.Evidence.Reasons)
	}
	var found bool
	for _, f := range n.Findings {
		if f.Finding.Code == "ECC_UNCORRECTABLE" && f.Check == "gpu.ecc" {
			found = true
		}
	}
	if !found {
		t.Errorf("finding not in the evidence: %+v", n.Findings)
	}
	for _, p := range n.Evidence.Parts {
		want := p.Component == "GPU3"
		if p.Implicated != want {
			t.Errorf("part %s implicated=%v", p.Component, p.Implicated)
		}
		if p.Component == "GPU3" && (p.Identity != "gpu-serial:SN-gpu-002-3" || p.IdentityKind != "serial") {
			t.Errorf("GPU3 identity %+v", p)
		}
		if p.Kind == "hca" && p.IdentityKind != "slot" {
			t.Errorf("hca identity %+v", p)
		}
	}
	// A finding during the campaign makes it fail in both passive runs.
	if !strings.Contains(n.Evidence.Reasons[0].Message, "ECC_UNCORRECTABLE") {
		t.Errorf("reason %q", n.Evidence.Reasons[0].Message)
	}
}

func TestRepeatOffenderCalledOut(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 6)
	h.setSKUBaselines()
	h.fleet.node("gpu-001").fail["dcgm.diag"] = report.Finding{Severity: report.SevFail, Component: "GPU5", Code: "DCGM_MEMORY", Message: "GPU Memory test failed"}
	first := h.start(`{selector: "name in (gpu-001,gpu-002,gpu-003)", level: standard, baseline: {missing: peers}}`)
	h.finish(h.eng)
	if n := nodeOf(t, h.report(first), "gpu-001"); n.Verdict != Rejected {
		t.Fatalf("first campaign: %s", n.Verdict)
	}
	// The GPU is "repaired" and turns up in another node, which is healthy.
	h.fleet.node("gpu-005").serials = map[int]string{2: "SN-gpu-001-5"}
	second := h.start(`{selector: "name in (gpu-004,gpu-005,gpu-006)", level: quick}`)
	h.finish(h.eng)
	r := h.report(second)
	n := nodeOf(t, r, "gpu-005")
	if n.Verdict != Accepted {
		t.Errorf("called out, not rejected by default: %s %+v", n.Verdict, n.Evidence.Reasons)
	}
	if len(n.Evidence.RepeatOffenders) != 1 {
		t.Fatalf("repeat offenders %+v", n.Evidence.RepeatOffenders)
	}
	o := n.Evidence.RepeatOffenders[0]
	if o.Campaign != first || o.Node != "gpu-001" || o.Component != "GPU5" || o.Part.Component != "GPU2" || !strings.Contains(o.Reason, "DCGM_MEMORY") {
		t.Errorf("offence %+v", o)
	}
	// Not implicated parts of the rejected node are not offenders.
	if len(nodeOf(t, r, "gpu-004").Evidence.RepeatOffenders) != 0 {
		t.Error("gpu-004 has offenders")
	}
	// Strict mode rejects.
	third := h.start(`{selector: "name in (gpu-005)", level: quick, reject_repeat_offenders: true}`)
	h.finish(h.eng)
	if n := nodeOf(t, h.report(third), "gpu-005"); n.Verdict != Rejected || !hasReason(n, ReasonRepeat) {
		t.Errorf("strict: %s %+v", n.Verdict, n.Evidence.Reasons)
	}
}

func TestBaselinesRecordedFromCampaign(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 6)
	h.setSKUBaselines()
	h.fleet.node("gpu-006").fail["gpu.xid"] = report.Finding{Severity: report.SevFail, Component: "GPU0", Code: "XID_79", Message: "fell off the bus"}
	id := h.start(`
selector: batch=new
level: standard
repeats: 3
baseline: {update_sku: true}
`)
	h.finish(h.eng)
	r := h.report(id)
	ctx := context.Background()
	stack := baselines.Stack{Driver: "535.161.08", RDMAStack: "MLNX_OFED 23.10"}
	var accepted []float64
	for _, n := range r.Nodes {
		b, err := h.base.Get(ctx, baselines.Key{Metric: MetricBusBW, Scope: baselines.NodeScope(n.Node), Stack: stack})
		if n.Verdict == Rejected {
			if !errors.Is(err, baselines.ErrNotFound) {
				t.Errorf("%s rejected but has a node baseline (%v)", n.Node, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", n.Node, err)
		}
		num := n.Evidence.Numbers[0]
		if len(num.Samples) != 3 || b.Samples.Count != 3 || b.Value != median(num.Samples) || b.FromRun != id {
			t.Errorf("%s: baseline %+v from samples %v", n.Node, b, num.Samples)
		}
		accepted = append(accepted, num.Value)
	}
	if len(accepted) != 5 {
		t.Fatalf("accepted %d", len(accepted))
	}
	sku, err := h.base.Get(ctx, baselines.Key{Metric: MetricBusBW, Scope: baselines.SKUScope("h100-sxm-80g-x8-nvlink-ib400x8"), Stack: stack})
	if err != nil {
		t.Fatal(err)
	}
	if sku.Value != median(accepted) || sku.Samples.Count != 5 {
		t.Errorf("SKU baseline %v (n=%d), campaign median of accepted %v", sku.Value, sku.Samples.Count, median(accepted))
	}
}

func TestUnreachableAndMissingBaselineAreInconclusive(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4)
	// No SKU baselines at all.
	h.fleet.node("gpu-003").unreachable = true
	id := h.start(standardSpec)
	h.finish(h.eng)
	r := h.report(id)
	for _, n := range r.Nodes {
		if n.Verdict != Rejected || !hasReason(n, ReasonInconclusive) {
			t.Errorf("%s: %s %+v", n.Node, n.Verdict, n.Evidence.Reasons)
		}
	}
	// baseline.missing: peers lets the peers decide; the unreachable node
	// stays rejected.
	h2 := newHarness(t, 5)
	h2.fleet.node("gpu-003").unreachable = true
	id2 := h2.start(standardSpec + "baseline: {missing: peers}\n")
	h2.finish(h2.eng)
	r2 := h2.report(id2)
	for _, n := range r2.Nodes {
		want := Accepted
		if n.Node == "gpu-003" {
			want = Rejected
		}
		if n.Verdict != want {
			t.Errorf("peers: %s: %s %+v", n.Node, n.Verdict, n.Evidence.Reasons)
		}
	}
}

func TestRestartMidCampaignResumes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 6)
	h.setSKUBaselines()
	id := h.start(standardSpec + "repeats: 2\n")
	ctx := context.Background()
	for range 4 {
		if _, err := h.eng.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st, err := h.eng.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.RunsDone == 0 || st.RunsDone == st.RunsTotal {
		t.Fatalf("stopped at %d/%d runs", st.RunsDone, st.RunsTotal)
	}
	// A new engine over the same database, as after a coordinator restart.
	db := openDB(t, h.path)
	e2, err := New(context.Background(), kit.Deps{DB: db, Fleet: h.fleet, Drainer: h.drain, Clock: h.fleet.clock, Logger: h.eng.log}, Options{Baselines: h.base})
	if err != nil {
		t.Fatal(err)
	}
	h.finish(e2)
	r, err := e2.Report(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Campaign.Accepted != 6 {
		t.Fatalf("after restart: %+v", r.Campaign)
	}
	for _, n := range r.Nodes {
		for _, run := range n.Runs {
			if run.Attempts != 1 {
				t.Errorf("%s run %d (%s) attempted %d times", n.Node, run.Seq, run.Step, run.Attempts)
			}
		}
		if got := h.fleet.count(n.Node, "nccl.allreduce"); got != 2 {
			t.Errorf("%s: all_reduce ran %d times, want 2", n.Node, got)
		}
	}
}

func TestStopDuringRunRerunsIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	h.setSKUBaselines()
	id := h.start(standardSpec)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	h.fleet.block = func(c context.Context, node, what string) error {
		if node == "gpu-002" && what == "dcgm.diag:2" && h.fleet.count(node, what) == 1 {
			cancel() // the coordinator goes down while dcgm runs
			close(stopped)
			<-c.Done()
			return c.Err()
		}
		return nil
	}
	if err := h.eng.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	<-stopped
	runs, err := listRuns(context.Background(), h.db, id, false, `AND node = ? AND step = ?`, "gpu-002", "dcgm-r2")
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || runs[0].State != RunRunning {
		t.Fatalf("interrupted run: %+v", runs)
	}
	h.fleet.block = nil
	e2 := h.newEngine(nil)
	h.finish(e2)
	runs, _ = listRuns(context.Background(), h.db, id, false, `AND node = ? AND step = ?`, "gpu-002", "dcgm-r2")
	if runs[0].State != RunDone || runs[0].Attempts != 2 || runs[0].Status != report.Pass {
		t.Fatalf("re-run: %+v", runs[0])
	}
	if r := h.report(id); r.Campaign.Accepted != 3 {
		t.Fatalf("%+v", r.Campaign)
	}
}

// A coordinator stopped while an agent runs a burn-in action sends the run
// again on resume with the same action id: the agent answers the action it
// still runs. A fresh id was refused ("node reserved by action ...") and
// rejected a healthy node as inconclusive.
func TestStopDuringActionResendsItsID(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2)
	h.setSKUBaselines()
	id := h.start(standardSpec)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	h.fleet.block = func(c context.Context, node, what string) error {
		if node == "gpu-002" && what == "action:"+ActionPCIeBandwidth && h.fleet.count(node, what) == 1 {
			cancel()
			close(stopped)
			<-c.Done()
			return c.Err()
		}
		return nil
	}
	if err := h.eng.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	<-stopped
	h.fleet.block = nil
	h.finish(h.newEngine(nil))
	if r := h.report(id); r.Campaign.Accepted != 2 {
		t.Fatalf("%+v", r.Campaign)
	}
	h.fleet.mu.Lock()
	resent := h.fleet.actionIDs["gpu-002|"+ActionPCIeBandwidth]
	other := h.fleet.actionIDs["gpu-001|"+ActionPCIeBandwidth]
	h.fleet.mu.Unlock()
	if len(resent) != 2 || resent[0] == "" || resent[0] != resent[1] {
		t.Fatalf("gpu-002's interrupted action and its re-run had ids %q, want one id twice", resent)
	}
	if len(other) != 1 || other[0] == resent[0] {
		t.Errorf("gpu-001's action id %q, want its own (gpu-002's: %q)", other, resent[0])
	}
}

func TestDrainedBySomeoneElseIsNeverUndrained(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4)
	h.setSKUBaselines()
	h.drain.Set("gpu-001", drain.Status{Drained: true, Reason: "new hardware, ticket 4411"})
	id := h.start(standardSpec)
	h.finish(h.eng)
	r := h.report(id)
	if r.Campaign.Accepted != 4 {
		t.Fatalf("%+v", r.Campaign)
	}
	ctx := context.Background()
	st, _ := h.drain.Status(ctx, "gpu-001")
	if !st.Drained || st.Reason != "new hardware, ticket 4411" {
		t.Errorf("someone else's drain touched: %+v", st)
	}
	if n := nodeOf(t, r, "gpu-001"); n.DrainedByUs {
		t.Error("gpu-001 marked drained by the campaign")
	}
	for _, name := range []string{"gpu-002", "gpu-003", "gpu-004"} {
		if st, _ := h.drain.Status(ctx, name); st.Drained {
			t.Errorf("%s still drained", name)
		}
	}
}

func TestBreakerHoldsDrains(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4)
	h.setSKUBaselines()
	br, err := kit.NewBreaker(kit.BreakerConfig{Window: time.Hour, MaxCount: 2}, h.fleet.clock)
	if err != nil {
		t.Fatal(err)
	}
	e := h.newEngine(br)
	h.eng = e
	id := h.start(standardSpec)
	ctx := context.Background()
	for range 3 {
		if _, err := e.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st, err := e.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Waiting) != 2 {
		t.Fatalf("waiting %+v", st.Waiting)
	}
	for _, why := range st.Waiting {
		if !strings.Contains(why, "breaker") {
			t.Errorf("waiting because %q", why)
		}
	}
	if n := len(h.drain.Snapshot()); n != 2 {
		t.Fatalf("%d drained", n)
	}
	// A restarted engine gives the breaker its drains back: the window
	// stays full.
	br2, _ := kit.NewBreaker(kit.BreakerConfig{Window: time.Hour, MaxCount: 2}, h.fleet.clock)
	e2 := h.newEngine(br2)
	if s := br2.State(4); !s.Open || s.Drained != 2 {
		t.Fatalf("restored breaker %+v", s)
	}
	// Once the window has passed, the others are drained and tested.
	h.fleet.clock.Advance(61 * time.Minute)
	h.finish(e2)
	if r := h.report(id); r.Campaign.Accepted != 4 {
		t.Fatalf("%+v", r.Campaign)
	}
}

func TestExtendedPairsStressAndTemperatures(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 8)
	h.setSKUBaselines()
	// Fine alone, slow with every partner: its HCA or cable.
	h.fleet.node("gpu-005").net = 0.6
	h.fleet.node("gpu-002").tempC = 88
	id := h.start(`
selector: batch=new
level: extended
repeats: 1
stress_duration: 10m
`)
	h.finish(h.eng)
	r := h.report(id)
	bad := nodeOf(t, r, "gpu-005")
	if bad.Verdict != Rejected || !hasReason(bad, ReasonPairSlow) {
		t.Fatalf("gpu-005: %s %+v", bad.Verdict, bad.Evidence.Reasons)
	}
	// Fine alone, slow with every partner: the network side is to blame,
	// but no finding names a part (an HCA, a cable or a switch port), so
	// no part is implicated: repeat-offender tracking follows parts only
	// on evidence about them.
	for _, p := range bad.Evidence.Parts {
		if p.Implicated {
			t.Errorf("gpu-005 part %s %s implicated=%v", p.Kind, p.Component, p.Implicated)
		}
	}
	for _, n := range r.Nodes {
		if n.Node != "gpu-005" && n.Verdict != Accepted {
			t.Errorf("%s: %s %+v", n.Node, n.Verdict, n.Evidence.Reasons)
		}
		if got := h.fleet.count(n.Node, "dcgm.diag:3"); got != 1 {
			t.Errorf("%s: dcgm r3 ran %d times", n.Node, got)
		}
		// 10 minutes of stress sampled every minute.
		if len(n.Temperatures) < 9 {
			t.Errorf("%s: %d temperature samples", n.Node, len(n.Temperatures))
		}
	}
	hot := nodeOf(t, r, "gpu-002")
	if m := hot.Temperatures[0].MaxC; m != 95 {
		t.Errorf("gpu-002 peak %v", m)
	}
}

func TestDecidePairsCulprit(t *testing.T) {
	t.Parallel()
	spec, err := ParseSpec([]byte("{selector: a=b, level: extended, baseline: {missing: peers}, metrics: [{name: nccl.allreduce2.busbw_gbps, required: true}]}"))
	if err != nil {
		t.Fatal(err)
	}
	pair := func(a, b string, v float64) Run {
		return Run{Node: a, Peers: []string{b}, Kind: StepPairs, Outcome: OutcomeOK, Status: report.Pass,
			Result: RunResult{Report: &report.Report{Checks: []report.CheckResult{{Name: "nccl.allreduce", Status: report.Pass}}},
				Metrics: map[string]float64{MetricPairBusBW: v}}}
	}
	none := func(metric, sku string, st baselines.Stack) baselines.Resolution {
		return baselines.Resolution{Reason: "none"}
	}
	var facts []nodeFacts
	for _, n := range []string{"a", "b", "c", "d"} {
		facts = append(facts, nodeFacts{Name: n, SKU: "s"})
	}
	// Two nodes only, one slow pair: nobody can tell which node.
	// Two nodes only, no baseline and too few peers: nothing to compare
	// with is inconclusive, never a pass.
	d := decide(spec, facts[:2], []Run{pair("a", "b", 200)}, none, nil)
	for _, n := range []string{"a", "b"} {
		if d[n].Verdict != Rejected || !hasCode(d[n].Evidence.Reasons, ReasonInconclusive) {
			t.Errorf("%s: %+v", n, d[n])
		}
	}
	// a-b slow, c-d fine, a-c slow, b-d fine: a is the culprit.
	pairs := []Run{pair("a", "b", 250), pair("c", "d", 450), pair("a", "c", 250), pair("b", "d", 448),
		pair("a", "d", 251), pair("b", "c", 452)}
	ref := func(metric, sku string, st baselines.Stack) baselines.Resolution {
		return baselines.Resolution{Scope: baselines.SKUScope("s"), Baseline: &baselines.Baseline{
			Key: baselines.Key{Metric: metric, Scope: baselines.SKUScope("s")}, Direction: baselines.HigherBetter,
			Samples: baselines.Stats{Count: 1, Median: 450, Min: 450, Max: 450, Values: []float64{450}}, Value: 450, Version: 1}}
	}
	d = decide(spec, facts, pairs, ref, nil)
	if d["a"].Verdict != Rejected || !hasCode(d["a"].Evidence.Reasons, ReasonPairSlow) {
		t.Errorf("a: %+v", d["a"].Evidence.Reasons)
	}
	for _, n := range []string{"b", "c", "d"} {
		if d[n].Verdict != Accepted {
			t.Errorf("%s: %+v", n, d[n].Evidence.Reasons)
		}
	}
}

func hasCode(rs []Reason, code string) bool {
	for _, r := range rs {
		if r.Code == code {
			return true
		}
	}
	return false
}

func TestPairRoundsGiveNewPartners(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 3, 4, 7, 10} {
		var nodes []string
		for i := range n {
			nodes = append(nodes, fmt.Sprintf("n%02d", i))
		}
		met := map[[2]string]bool{}
		for r := range 2 {
			seen := map[string]bool{}
			for _, p := range pairRound(nodes, r) {
				if seen[p[0]] || seen[p[1]] || p[0] == p[1] {
					t.Fatalf("n=%d round %d: %v twice", n, r, p)
				}
				seen[p[0]], seen[p[1]] = true, true
				if met[p] && n > 2 {
					t.Errorf("n=%d: pair %v repeated", n, p)
				}
				met[p] = true
			}
			if len(seen) < n-n%2 {
				t.Errorf("n=%d round %d: only %d nodes paired", n, r, len(seen))
			}
		}
	}
}

func TestStartRefusesBusyNodesAndEmptySelection(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	h.start(standardSpec)
	spec, _ := ParseSpec([]byte(standardSpec))
	if _, err := h.eng.Start(context.Background(), spec); !errors.Is(err, ErrBusy) {
		t.Errorf("second campaign over the same nodes: %v", err)
	}
	spec2, _ := ParseSpec([]byte("{selector: batch=none, level: quick}"))
	if _, err := h.eng.Start(context.Background(), spec2); !errors.Is(err, ErrNoNodes) {
		t.Errorf("empty selection: %v", err)
	}
}

func TestCancelKeepsNodesDrained(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2)
	id := h.start(standardSpec)
	ctx := context.Background()
	if _, err := h.eng.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.eng.Cancel(ctx, id, "operator abort"); err != nil {
		t.Fatal(err)
	}
	if err := h.eng.Cancel(ctx, id, "again"); !errors.Is(err, ErrFinished) {
		t.Errorf("cancel twice: %v", err)
	}
	if moved, _ := h.eng.Step(ctx); moved {
		t.Error("a cancelled campaign moved")
	}
	if len(h.drain.Snapshot()) != 2 {
		t.Error("nodes were returned to service")
	}
	st, _ := h.eng.Status(ctx, id)
	if st.State != StateCancelled {
		t.Errorf("%+v", st)
	}
}

func TestActionRefusedIsInconclusive(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4)
	h.setSKUBaselines()
	id := h.start(`
selector: batch=new
level: quick
suite:
  name: custom
  steps:
    - {name: passive, kind: checks, checks: [gpu.ecc, gpu.xid]}
    - {name: nvbw, kind: action, action: not-configured}
`)
	h.finish(h.eng)
	for _, n := range h.report(id).Nodes {
		if n.Verdict != Rejected || !hasReason(n, ReasonInconclusive) || !strings.Contains(n.Evidence.Reasons[0].Message, "refused") {
			t.Errorf("%s: %+v", n.Node, n.Evidence.Reasons)
		}
	}
}

func TestParseActionMetrics(t *testing.T) {
	t.Parallel()
	m := ParseActionMetrics("noise\nmetric pcie.h2d_bandwidth_gbps 55.5\nmetric Bad.Name 3\nmetric x.y NaN\nmetric a.b_gbps 1e400\nmetric pcie.d2h_bandwidth_gbps 54\n")
	if len(m) != 2 || m["pcie.h2d_bandwidth_gbps"] != 55.5 || m["pcie.d2h_bandwidth_gbps"] != 54 {
		t.Errorf("%v", m)
	}
	if !finite(m["pcie.h2d_bandwidth_gbps"]) || math.IsNaN(m["x.y"]) {
		t.Error("non-finite kept")
	}
}

func TestDrainWaitsForJobsThenGivesUp(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 5)
	h.setSKUBaselines()
	// Jobs keep running on gpu-001 after the drain (Slurm lets them finish).
	h.drain.Set("gpu-001", drain.Status{RunningJobs: 2})
	id := h.start(standardSpec + "baseline: {missing: peers}\n")
	ctx := context.Background()
	if _, err := h.eng.Step(ctx); err != nil {
		t.Fatal(err)
	}
	st, _ := h.eng.Status(ctx, id)
	if !strings.Contains(st.Waiting["gpu-001"], "2 running jobs") {
		t.Fatalf("waiting %+v", st.Waiting)
	}
	// Four hours later the jobs are still there: the node is rejected as
	// not drained, untested; the others go on.
	h.fleet.clock.Advance(DefaultDrainTimeout + time.Minute)
	h.finish(h.eng)
	r := h.report(id)
	n := nodeOf(t, r, "gpu-001")
	if n.Verdict != Rejected || !hasReason(n, ReasonNotDrained) || len(n.Evidence.Reasons) != 1 {
		t.Fatalf("gpu-001: %s %+v", n.Verdict, n.Evidence.Reasons)
	}
	if h.fleet.count("gpu-001", "passive") != 0 {
		t.Error("an undrained node was tested")
	}
	if r.Campaign.Accepted != 4 {
		t.Errorf("%+v", r.Campaign)
	}
}

// A node another kind of campaign holds (kit.Busy) is not taken, and a
// running burn-in's nodes are what it holds for the others.
func TestNodeHeldByAnotherCampaignRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	busy := &kit.Busy{}
	busy.Register("drill", func(context.Context) (map[string]string, error) {
		return map[string]string{"gpu-002": "drill d-1"}, nil
	})
	ctx := context.Background()
	e, err := New(ctx, kit.Deps{DB: h.db, Fleet: h.fleet, Drainer: h.drain, Clock: h.fleet.clock, Busy: busy}, Options{Baselines: h.base})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := ParseSpec([]byte(standardSpec))
	if _, err := e.Start(ctx, spec); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "gpu-002 (drill d-1)") {
		t.Fatalf("burn-in over a node a drill holds: %v", err)
	}
	busy.Register("drill", func(context.Context) (map[string]string, error) { return nil, nil })
	id, err := e.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if who, ok := busy.Holding(ctx, "gpu-003"); !ok || who != "burnin "+id {
		t.Fatalf("gpu-003 held by %q (%v), want burnin %s", who, ok, id)
	}
}
