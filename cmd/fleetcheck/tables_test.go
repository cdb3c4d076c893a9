package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
)

// golden compares got with testdata/NAME.golden; UPDATE_GOLDEN=1 writes it.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with UPDATE_GOLDEN=1 to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (refresh with UPDATE_GOLDEN=1 after checking the diff)\n--- got\n%s--- want\n%s", path, got, want)
	}
}

// table renders through the tabwriter the CLI uses; term is not a
// terminal, so progress is "done/total".
func table(t *testing.T, render func(w, term *bytes.Buffer) error) string {
	t.Helper()
	var out, term bytes.Buffer
	tw := tabwriter.NewWriter(&out, 0, 4, 2, ' ', 0)
	var cells bytes.Buffer
	if err := render(&cells, &term); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(cells.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := tw.Flush(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// `sweep report` is a table: verdicts with their kind and drain, then the
// skipped nodes with why; no JSON inside.
func TestSweepReportTable(t *testing.T) {
	t.Parallel()
	done := sweep.DrainDone
	r := sweep.Report{
		ID: "sweep-20260302-020000", State: sweep.StateDone, Tested: 16, AllReduceRuns: 41, DurationS: 300.4,
		Passed: make([]string, 12),
		Verdicts: []sweep.Verdict{
			{Subject: "gpu-007", SubjectKind: "node", Verdict: sweep.GPUSide, Deviation: 0.412, Drain: &done,
				Reason: "slow alone twice: 282 and 279 GB/s against 480 (node baseline)"},
			{Subject: "gpu-011", SubjectKind: "node", Verdict: sweep.NetworkSide, Deviation: 0.35,
				Reason: "fine alone, slow with gpu-003 and with reference gpu-012"},
			{Subject: "leaf-01|leaf-02", SubjectKind: "link", Verdict: sweep.Link, Deviation: 0.31,
				Reason: "only pairs across leaf-01|leaf-02 slow"},
			{Subject: "gpu-014", SubjectKind: "node", Verdict: sweep.Inconclusive, Reason: "no baseline for its stack"},
		},
		Skipped: []sweep.Skip{{Node: "gpu-015", Reason: "busy: the agent says a job runs"}},
	}
	got := table(t, func(w, _ *bytes.Buffer) error { return sweepReportTable(w, r) })
	if strings.Contains(got, "{") {
		t.Errorf("JSON in the table:\n%s", got)
	}
	golden(t, "sweep-report", got)
}

// A sweep that measured nothing says so under its first line: done is not
// a healthy fleet here.
func TestSweepReportTableIncomplete(t *testing.T) {
	t.Parallel()
	why := "agent not connected: waited 2m0s after its turn came for test 5; not run"
	r := sweep.Report{
		ID: "sweep-20260302-020000", State: sweep.StateDone, Tested: 2, DurationS: 361, Passed: []string{},
		Incomplete: "could not test: no all_reduce measured on any of the 2 selected nodes: 2 unreachable (agents not connected; waited up to 2m0s)",
		Verdicts: []sweep.Verdict{
			{Subject: "gpu-001", SubjectKind: "node", Verdict: sweep.Unreachable, Reason: why},
			{Subject: "gpu-002", SubjectKind: "node", Verdict: sweep.Unreachable, Reason: why},
		},
	}
	got := table(t, func(w, _ *bytes.Buffer) error { return sweepReportTable(w, r) })
	golden(t, "sweep-report-incomplete", got)
}

// `rollout plan` lists a node whose agent is away in its wave and says it
// will be waited for; exclusions follow.
func TestRolloutPlanTable(t *testing.T) {
	t.Parallel()
	note := rollout.DisconnectedNote(2 * time.Minute)
	p := rollout.PlanResult{
		Selected: 4, FleetSize: 6, MaxUnavailable: 2,
		Waves: []rollout.PlannedWave{
			{Index: 0, Name: "canary", Nodes: []rollout.PlannedNode{{Name: "gpu-002", Driver: "535.161.08"}}},
			{Index: 1, Name: "wave 1", Budget: 1, Nodes: []rollout.PlannedNode{
				{Name: "gpu-001", Driver: "535.161.08", Disconnected: true, Note: note},
				{Name: "gpu-003", Driver: "535.161.08"},
			}},
		},
		Excluded: []rollout.Exclusion{{Node: "gpu-004", Kind: rollout.ExcludedUpToDate, Reason: "already runs driver 550.90.07"}},
	}
	got := table(t, func(w, _ *bytes.Buffer) error { return rolloutPlanTable(w, p) })
	golden(t, "rollout-plan", got)
}

// After a rollback the waves keep their sizes, and the verb says what it
// rolled back.
func TestRolloutRollbackTable(t *testing.T) {
	t.Parallel()
	s := rollout.Status{
		ID: "r550-20260302-020000", Name: "r550", Driver: "550.90.07", Phase: rollout.PhaseRollingBack, Wave: 1,
		MaxUnavailable: "2 of fleet",
		Counts:         map[rollout.State]int{rollout.Pending: 2, rollout.RolledBack: 1},
		Waves: []rollout.WaveStatus{
			{Index: 0, Name: "canary", State: "passed", Size: 1, Done: 1},
			{Index: 1, Name: "wave 1", State: "passed", Size: 2, Pending: 2},
		},
		Nodes: []rollout.NodeStatus{
			{Node: "gpu-001", Wave: 0, State: rollout.RolledBack, Op: "rollback", FromDriver: "535.161.08"},
			{Node: "gpu-002", Wave: 1, State: rollout.Pending, Op: "rollback", FromDriver: "535.161.08", Reason: "rollback to driver 535.161.08 queued"},
			{Node: "gpu-003", Wave: 1, State: rollout.Pending, Op: "rollback", FromDriver: "535.161.08", Reason: "rollback to driver 535.161.08 queued"},
		},
	}
	got := table(t, func(w, term *bytes.Buffer) error {
		rollbackLine(w, s)
		return rolloutStatusTable(w, term, s)
	})
	golden(t, "rollout-rollback", got)

	var none bytes.Buffer
	rollbackLine(&none, rollout.Status{ID: "r550-x", Nodes: []rollout.NodeStatus{{Node: "gpu-001", Op: "upgrade"}}})
	if want := "rollout r550-x: no upgraded node to roll back\n"; none.String() != want {
		t.Errorf("got %q, want %q", none.String(), want)
	}
}

// `burnin status` lists every node with its step, state and the reason
// it waits or was rejected; `burnin report` shows the rejection reason.
func TestBurninTables(t *testing.T) {
	t.Parallel()
	st := burnin.CampaignStatus{
		ID: "r14-delivery-20260302-020000", Name: "r14-delivery", State: burnin.StateRunning, Phase: "testing",
		Level: burnin.Standard, Nodes: 3, Accepted: 1, Rejected: 1, RunsDone: 11, RunsTotal: 15,
		NodeStates: []burnin.NodeProgress{
			{Node: "gpu-001", State: burnin.NodeDone, StepsDone: 5, Steps: 5, Verdict: burnin.Accepted},
			{Node: "gpu-002", State: burnin.NodeDone, StepsDone: 5, Steps: 5, Verdict: burnin.Rejected,
				Reason: "check_failed: ib.ports mlx5_4/1 is DOWN"},
			{Node: "gpu-003", State: burnin.NodeTesting, Step: "dcgm-r2, repeat 1", StepsDone: 1, Steps: 5},
			{Node: "gpu-004", State: burnin.NodePending, Steps: 5, Waiting: "waiting for its agent to connect (1m of 2m)"},
		},
	}
	got := table(t, func(w, term *bytes.Buffer) error {
		if err := burninStatusTable(term)(w, []burnin.CampaignStatus{st}); err != nil {
			return err
		}
		return burninNodesTable(w, st)
	})
	golden(t, "burnin-status", got)

	rep := burnin.Report{Campaign: st, Nodes: []burnin.NodeReport{
		{Node: "gpu-001", SKU: "h100-sxm-80g-x8-nvlink-ib400x8", State: burnin.NodeDone, Verdict: burnin.Accepted},
		{Node: "gpu-002", SKU: "h100-sxm-80g-x8-nvlink-ib400x8", State: burnin.NodeDone, Verdict: burnin.Rejected,
			Reason: "check_failed: ib.ports mlx5_4/1 is DOWN", Note: "rejected"},
	}}
	got = table(t, func(w, term *bytes.Buffer) error { return burninReportTable(w, term, rep) })
	golden(t, "burnin-report", got)
}

// `fleetcheck results gpu-003` takes the node as its argument, as the
// README shows; --node still works.
func TestResultsNodeArgument(t *testing.T) {
	conn := campaignCoordinator(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"results", "gpu-003"}, exitOK, "FINISHED"},
		{[]string{"results", "--node", "gpu-003"}, exitOK, "FINISHED"},
		{[]string{"results", "gpu-003", "--node", "gpu-003"}, exitOK, "FINISHED"},
		{[]string{"results", "gpu-003", "--node", "gpu-004"}, exitCommand, `node "gpu-003" and --node "gpu-004": give one`},
		{[]string{"results"}, exitCommand, "which node? fleetcheck results NODE"},
		{[]string{"results", "gpu-003", "gpu-004"}, exitCommand, "accepts at most 1 arg"},
	} {
		out, code := execute(t, append(tc.args, conn...)...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, want %d with %q:\n%s", strings.Join(tc.args, " "), code, tc.code, tc.want, out)
		}
	}
}
