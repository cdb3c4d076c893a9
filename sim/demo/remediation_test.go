package demo

import (
	"testing"

	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
)

// The CI size of the remediation scenario; make bench runs the full
// 1,024 nodes for 30 days.
const ciRemNodes, ciRemDays = 256, 10

func TestRemediationScenarioMeetsTargets(t *testing.T) {
	t.Parallel()
	r := runScenario(t, "remediation", CampaignOptions{RemediationNodes: ciRemNodes, RemediationDays: ciRemDays}).Remediation
	if r.Wrong != 0 || r.DrainedByApp != 0 || r.HealthyRMAs != 0 || r.ActedOnHeld != 0 || r.BreakerExceeded {
		t.Fatalf("targets missed: wrong %d, drained for an application fault %d, healthy RMAs %d, suppressed acted on %d, breaker exceeded %v",
			r.Wrong, r.DrainedByApp, r.HealthyRMAs, r.ActedOnHeld, r.BreakerExceeded)
	}
	if r.BreakerMax == 0 || r.BreakerMax > r.BreakerLimit || r.BreakerHeld == 0 {
		t.Errorf("the burst should press the breaker to its limit and make drains wait: max %d limit %d held %d", r.BreakerMax, r.BreakerLimit, r.BreakerHeld)
	}
	if r.Unrestored != 0 {
		t.Errorf("%d hardware faults not restored", r.Unrestored)
	}
	if r.JobEvents != r.Crashes || r.Jobs == 0 {
		t.Errorf("%d jobs crashed %d times: %d job events", r.Jobs, r.Crashes, r.JobEvents)
	}
	got := map[string]RemediationKind{}
	for _, k := range r.Kinds {
		got[k.Kind] = k
	}
	for _, kind := range []string{kindECC, kindBus, kindFailing, kindXid13HW, kindFlap, kindCable, kindBurst} {
		k := got[kind]
		if k.Faults == 0 || k.Restored != k.Faults || k.MTTRS <= 0 {
			t.Errorf("%s: %+v", kind, k)
		}
		// Parts that only a replace fixes go to RMA once each; nothing else does.
		if replace := kind == kindFailing || kind == kindCable; (replace && k.RMAs != k.Faults) || (!replace && k.RMAs != 0) {
			t.Errorf("%s: %d RMAs for %d faults", kind, k.RMAs, k.Faults)
		}
	}
	// A reset takes minutes; a replace waits for the technician's day.
	if got[kindECC].MTTRS > 3600 || got[kindFailing].MTTRS < 24*3600 {
		t.Errorf("MTTR: ecc %vs, failing %vs", got[kindECC].MTTRS, got[kindFailing].MTTRS)
	}
	if k := got[kindSuppress]; k.Faults == 0 || k.Restored != 0 {
		t.Errorf("suppressed: %+v", k)
	}
}

// The scorer is not blind: with correlation off (no job is ever big
// enough), a job crashing three times within the hour reads as Xid 13
// repeating on each GPU, and the scenario counts the drains of healthy
// nodes that follow.
func TestRemediationScenarioCatchesABadRule(t *testing.T) {
	t.Parallel()
	r := runScenario(t, "remediation", CampaignOptions{RemediationNodes: ciRemNodes, RemediationDays: ciRemDays,
		remediationConfig: func(c *remediation.Config) { c.Rules.Correlate.MinNodes = 100_000 }}).Remediation
	if r.DrainedByApp == 0 || r.Wrong == 0 {
		t.Fatalf("correlation off: wrong %d, drained for an application fault %d", r.Wrong, r.DrainedByApp)
	}
}

func BenchmarkRemediationScenarioFullSize(b *testing.B) {
	for range b.N {
		var c Campaigns
		if err := RunCampaign(b.Context(), "remediation", CampaignOptions{Seed: 1, Dir: b.TempDir()}, &c); err != nil {
			b.Fatal(err)
		}
		r := c.Remediation
		b.ReportMetric(float64(r.Wrong+r.DrainedByApp+r.HealthyRMAs), "wrong")
		b.ReportMetric(r.WallS, "wall_s")
	}
}
