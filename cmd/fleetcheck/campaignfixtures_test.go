package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// The campaign answers the CLI golden tests render: every field the
// engines fill, set, so a field lost on the way shows in the JSON.

var (
	fxT0 = time.Date(2026, 3, 2, 2, 0, 0, 123456789, time.UTC)
	fxT1 = fxT0.Add(17*time.Minute + 3*time.Second)
	fxT2 = fxT0.Add(2*time.Hour + 5*time.Millisecond)
)

// fxTimes are the fixture times a table prints in the local zone.
var fxTimes = []time.Time{fxT0, fxT1, fxT2}

func fxSpec[T any](t *testing.T, name string, parse func([]byte) (T, error)) T {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(examples, name))
	if err != nil {
		t.Fatal(err)
	}
	v, err := parse(b)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

func fxBaseline() baselines.Baseline {
	return baselines.Baseline{
		Key: baselines.Key{Metric: baselines.MetricAllReduceBusBW, Scope: "node:gpu-001",
			Stack: baselines.Stack{Driver: "535.161.08", NCCL: "2.21.5", RDMAStack: "MLNX_OFED 23.10-1.1.9.0"}},
		Direction: "higher", Samples: baselines.Stats{Count: 3, Median: 470, MAD: 2.5, Min: 466, Max: 474, Values: []float64{466, 470, 474}},
		Value: 470, Version: 3, TakenAt: fxT0, Who: "admin/ops", FromRun: "res-0042", Note: "after the r12 recable", Threshold: 0.25,
	}
}

func fxBaselineRecord() baselines.RecordReport {
	b2 := fxBaseline()
	b2.Scope, b2.Version, b2.FromRun, b2.Note, b2.Threshold = "node:gpu-002", 1, "", "", 0
	return baselines.RecordReport{Recorded: []baselines.Baseline{fxBaseline(), b2},
		Skipped: []baselines.Skipped{{Node: "gpu-003", Reason: "no nccl.allreduce result in the last 24h"}}}
}

func fxBaselineImport() baselines.ImportResult {
	b := fxBaseline()
	return baselines.ImportResult{Added: 1, Unchanged: 1, Entries: []baselines.ImportedEntry{
		{Key: b.Key, Version: 3, Added: true}, {Key: baselines.Key{Metric: b.Metric, Scope: "sku:h100"}, Version: 2}}}
}

func fxSweepProgress() sweep.Progress {
	return sweep.Progress{ID: "sweep-20260302-020000", State: "running", Phase: "round2", Round: 2, Wave: 3,
		WaveDone: 4, WaveTotal: 8, Singles: 16, SinglesAll: 16, Pairs: 5, PairsAll: 12, Nodes: 16,
		Waiting: "gpu-009: waiting for its agent to connect (40s of 2m)", Incomplete: "gpu-015 left the fleet"}
}

func fxSweepList() []sweep.Summary {
	return []sweep.Summary{
		{ID: "sweep-20260302-020000", State: "done", Phase: "done", Selector: "sku=h100", Nodes: 16, Created: fxT0, Ended: fxT2,
			Counts: map[sweep.Kind]int{sweep.GPUSide: 1, sweep.Link: 1}, Error: "", Incomplete: "gpu-015 left the fleet"},
		{ID: "sweep-20260301-020000", State: "failed", Phase: "round1", Selector: "", Nodes: 4, Created: fxT1,
			Error: "coordinator stopped"},
	}
}

func fxRolloutStatus(t *testing.T) rollout.Status {
	soak, dl := fxT1, fxT2
	return rollout.Status{
		ID: "r535-20260302-020000", Name: "r535", Driver: "535.161.08", Selector: "sku=h100", Phase: rollout.PhaseHalted,
		Paused: true, PauseReason: "night shift", Wave: 1, SoakUntil: &soak, HaltReason: "wave 1: 2 failed, budget 1",
		Evidence: []string{"gpu-004: validation failed"}, Blocked: "max_unavailable reached", Incomplete: "gpu-008 left",
		Counts: map[rollout.State]int{rollout.Done: 2, rollout.Failed: 2, rollout.Pending: 1}, Unavailable: 2, MaxUnavailable: "2 of fleet",
		Waves: []rollout.WaveStatus{
			{Index: 0, Name: "canary", State: "done", Size: 1, Budget: 0, Done: 1},
			{Index: 1, Name: "wave 1", State: "failed", Size: 4, Budget: 1, Done: 1, Failed: 2, Skipped: 0, Active: 0, Pending: 1},
		},
		Nodes: []rollout.NodeStatus{
			{Node: "gpu-001", Wave: 0, State: rollout.Done, Op: "upgrade", Since: fxT0, FromDriver: "535.104.05", DrainedByUs: true, Upgrades: 1,
				Baseline: 470.5, BaselineFrom: "node:gpu-001"},
			{Node: "gpu-004", Wave: 1, State: rollout.Failed, Op: "upgrade", Since: fxT1, Deadline: &dl, FromDriver: "535.104.05",
				Reason: "validation failed", Evidence: []string{"XID_79 on GPU3"}, Hold: "operator", LastError: "action timed out",
				Waiting: "", DrainedByUs: true, Upgrades: 1},
			{Node: "gpu-005", Wave: 1, State: rollout.Pending, Waiting: "waiting for its agent to connect (1m of 2m)"},
		},
		Excluded: []rollout.Exclusion{{Node: "gpu-009", Kind: "incompatible", Reason: "kernel 5.4 below 5.15", Rules: []string{"kernel>=5.15"}}},
		Created:  fxT0, Updated: fxT1, Finished: &dl,
		Spec: fxSpec(t, "rollout.yaml", rollout.ParseSpec),
	}
}

func fxRolloutList() []rollout.Summary {
	return []rollout.Summary{
		{ID: "r535-20260302-020000", Name: "r535", Driver: "535.161.08", Phase: rollout.PhaseRunning, Paused: true, Wave: 1, Waves: 3, Nodes: 5,
			Counts: map[rollout.State]int{rollout.Done: 2, rollout.Upgrading: 1}, Created: fxT0},
		{ID: "r550-20260301-020000", Driver: "550.54.15", Phase: rollout.PhaseCompleted, Wave: 2, Waves: 3, Nodes: 1,
			Counts: map[rollout.State]int{}, Created: fxT1},
	}
}

func fxRolloutPlan(t *testing.T) rollout.PlanResult {
	return rollout.PlanResult{
		Spec: fxSpec(t, "rollout.yaml", rollout.ParseSpec), Selected: 5, FleetSize: 8, MaxUnavailable: 2,
		Waves: []rollout.PlannedWave{
			{Index: 0, Name: "canary", Budget: 0, Nodes: []rollout.PlannedNode{{Name: "gpu-001", Driver: "535.104.05"}}},
			{Index: 1, Name: "wave 1", Budget: 1, Nodes: []rollout.PlannedNode{{Name: "gpu-002", Driver: "535.104.05"},
				{Name: "gpu-003", Driver: "535.104.05", Disconnected: true, Note: "waited for up to 2m when its turn comes"}}},
		},
		Excluded: []rollout.Exclusion{{Node: "gpu-009", Kind: "incompatible", Reason: "kernel 5.4 below 5.15", Rules: []string{"kernel>=5.15", "ofed"}}},
	}
}

func fxBurninStatus() burnin.CampaignStatus {
	return burnin.CampaignStatus{
		ID: "r14-delivery-20260302-020000", Name: "r14-delivery", State: burnin.StateRunning, Phase: burnin.PhaseNodes,
		Level: burnin.Standard, Suite: "standard", Selector: "rack=r14", Reason: "cancelled by admin/ops: wrong rack",
		CreatedAt: fxT0, UpdatedAt: fxT1, FinishedAt: fxT2, Nodes: 3,
		ByState:  map[burnin.NodeState]int{burnin.NodeDone: 2, burnin.NodeTesting: 1},
		Accepted: 1, Rejected: 1, RunsDone: 11, RunsTotal: 15,
		Waiting: map[string]string{"gpu-004": "waiting for its agent to connect (1m of 2m)"},
		NodeStates: []burnin.NodeProgress{
			{Node: "gpu-001", State: burnin.NodeDone, StepsDone: 5, Steps: 5, Verdict: burnin.Accepted},
			{Node: "gpu-002", State: burnin.NodeDone, StepsDone: 5, Steps: 5, Verdict: burnin.Rejected, Reason: "check_failed: ib.ports mlx5_4/1 is DOWN"},
			{Node: "gpu-003", State: burnin.NodeTesting, Step: "dcgm-r2, repeat 1", StepsDone: 2, Steps: 5, Waiting: "the agent is busy"},
		},
	}
}

func fxDrill(t *testing.T) drill.Drill {
	return drill.Drill{
		ID: "d-20260302T020000", Name: "ib-link-loss-r12", Fault: "ib-port-down", Spec: fxSpec(t, "drill.yaml", drill.ParseSpec),
		State: drill.StateAborted, Reason: "deadline passed", CreatedAt: fxT0, UpdatedAt: fxT1, FinishedAt: fxT2,
		Degraded: []string{"gpu-003"},
		Targets: []drill.Target{{
			Node: "gpu-017", State: drill.TargetDone,
			Precheck:      map[string]drill.CheckSnap{"ib.ports": {Status: report.Pass}, "gpu.xid": {Status: report.Warn, Codes: []string{"XID_31"}}},
			InjectedAt:    fxT0,
			CheckInterval: config.Duration(5 * time.Second),
			DetectedAt:    fxT1, DetectedBy: "ib.ports", ExpectedDetected: true, DetectedPoll: 2,
			Detections: []drill.Detection{{Check: "ib.ports", Status: report.Fail, Codes: []string{"IB_PORT_DOWN"}, At: fxT1, Observed: fxT1.Add(time.Second),
				Message: "mlx5_4/1 is DOWN", Findings: []report.Finding{{Severity: report.SevFail, Component: "mlx5_4/1", Code: "IB_PORT_DOWN",
					Message: "port is DOWN", Action: report.ActionDrain, PCIBusID: "0000:4b:00.0"}}}},
			OutOfServiceAt: fxT1, RevertStartedAt: fxT1, RevertedAt: fxT2, RevertedBy: "coordinator", RevertAttempts: 2, RecoveredAt: fxT2,
			Aborted: true, AbortReason: "deadline passed", Polls: 7, NextAt: fxT2, LastError: "agent away",
			Findings: []drill.Finding{{Code: "SLOW_DETECTION", Severity: "warn", Message: "detected after 3 polls", At: fxT1}},
		}, {
			Node: "gpu-018", State: drill.TargetPending, Findings: []drill.Finding{},
		}},
	}
}
