package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// exampleFleet is a coordinator over a simulated fleet labelled as the
// examples select (sku=h100-sxm-8), reached by the CLI's flags.
func exampleFleet(t *testing.T) []string {
	t.Helper()
	f, err := simfleet.New(simfleet.Config{Nodes: 8, NodesPerLeaf: 4, SKU: "h100-sxm-8", Seed: 7, NoisePct: -1,
		Kernel: "6.5.0-1007-nvidia", VBIOS: "96.00.99.00.01"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := coordinator.Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), Insecure: true}
	s, err := coordinator.New(cfg, coordinator.Options{Logger: zerolog.Nop(), Fleet: f, CampaignClock: f.Clock()})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return []string{"--insecure", "--coordinator", s.GRPCAddr().String()}
}

// TestExampleSpecsRun: examples/rollout.yaml plans against a simulated
// fleet with examples/matrix.yaml, and examples/sweep.yaml starts a sweep
// that runs to its report, through the CLI an operator uses.
func TestExampleSpecsRun(t *testing.T) {
	conn := exampleFleet(t)
	run := func(args ...string) string {
		t.Helper()
		out, code := execute(t, append(args, conn...)...)
		if code != exitOK {
			t.Fatalf("%s: exit %d:\n%s", strings.Join(args, " "), code, out)
		}
		return out
	}
	ex := func(name string) string { return filepath.Join(examples, name) }

	out := run("rollout", "plan", "-f", ex("rollout.yaml"), "--matrix", ex("matrix.yaml"))
	if !strings.Contains(out, "8 selected of 8, 0 excluded") || !e2eHasLine(out, `^0\s+canary\s+0\s+gpu-0001$`) || !e2eHasLine(out, `^3\s+wave 3\s+0\s+gpu-0005,gpu-0006,gpu-0007,gpu-0008$`) {
		t.Errorf("rollout plan of examples/rollout.yaml:\n%s", out)
	}

	out = run("sweep", "start", "-f", ex("sweep.yaml"))
	id := e2eStartedID(t, "sweep", out)
	cli := &e2eFleet{t: t, conn: conn}
	rep := e2ePoll(cli, 30*time.Second, "the example sweep to finish",
		func() sweep.Report { return e2eJSON[sweep.Report](cli, "sweep", "report", id) },
		func(r sweep.Report) bool { return r.State != sweep.StateRunning })
	out = run("sweep", "report", id, "-o", "json")
	if rep.State != sweep.StateDone || rep.Spec.Selector != "sku=h100-sxm-8" || time.Duration(rep.Spec.TestTimeout) != 10*time.Minute ||
		time.Duration(rep.Spec.Budget.NodeTestTime) != 4*time.Minute || rep.Tested == 0 {
		t.Fatalf("sweep of examples/sweep.yaml: state %s, tested %d, spec %+v", rep.State, rep.Tested, rep.Spec)
	}
	// The stored spec shows durations as written.
	if !strings.Contains(out, `"test_timeout": "10m"`) || !strings.Contains(out, `"node_test_time": "4m"`) {
		t.Errorf("report JSON does not show the spec's durations as durations:\n%s", out[:min(len(out), 2000)])
	}
	if table := run("sweep", "report", id); strings.Contains(table, "{") || !strings.Contains(table, "sweep "+id+": done") {
		t.Errorf("sweep report table:\n%s", table)
	}
}
