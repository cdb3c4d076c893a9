package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// campaignCoordinator runs a coordinator over a simulated fleet and
// returns the flags that reach it.
func campaignCoordinator(t *testing.T) []string {
	t.Helper()
	f, err := simfleet.New(simfleet.Config{Nodes: 4, NodesPerLeaf: 2, Seed: 3, NoisePct: -1})
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

func TestCampaignVerbs(t *testing.T) {
	conn := campaignCoordinator(t)
	run := func(args ...string) string {
		t.Helper()
		out, code := execute(t, append(args, conn...)...)
		if code != exitOK {
			t.Fatalf("%s: exit %d: %s", strings.Join(args, " "), code, out)
		}
		return out
	}
	key := []string{"--metric", baselines.MetricAllReduceBusBW, "--scope", "node:gpu-001", "--driver", "535.161.08"}

	out := run(append([]string{"baseline", "set", "--value", "470"}, key...)...)
	if !strings.Contains(out, "node:gpu-001") || !strings.Contains(out, "470") {
		t.Fatalf("set:\n%s", out)
	}
	run(append([]string{"baseline", "record", "--sample", "455,460,465"}, key...)...)
	out = run(append([]string{"baseline", "history", "-o", "json"}, key...)...)
	var hist []baselines.Baseline
	if err := json.Unmarshal([]byte(out), &hist); err != nil || len(hist) != 2 || hist[1].Value != 460 {
		t.Fatalf("history %v:\n%s", err, out)
	}
	file := filepath.Join(t.TempDir(), "baselines.yaml")
	run("baseline", "export", "--scope", "node:gpu-001", "--all-versions", "-f", file)
	if out = run("baseline", "import", file); !strings.Contains(out, "added 0, unchanged 2") {
		t.Fatalf("import:\n%s", out)
	}

	out = run("sweep", "start", "--selector", "sku=h100", "--note", "smoke")
	if !strings.HasPrefix(out, "sweep ") || !strings.Contains(out, "started") {
		t.Fatalf("sweep start:\n%s", out)
	}
	id := strings.Fields(out)[1]
	if out = run("sweep", "list"); !strings.Contains(out, id) {
		t.Fatalf("sweep list:\n%s", out)
	}
	testwait.ForEvery(t, 20*time.Second, 20*time.Millisecond, "the sweep to finish", func() (bool, string) {
		out = run("sweep", "report", id)
		return !strings.Contains(out, ": running,"), out
	})
	if !strings.Contains(out, "sweep "+id+": done") {
		t.Fatalf("sweep report:\n%s", out)
	}

	spec := filepath.Join(t.TempDir(), "rollout.yaml")
	matrix := filepath.Join(t.TempDir(), "matrix.yaml")
	if err := os.WriteFile(spec, []byte("name: r550\nselector: sku=h100\ntarget: {driver: 550.90.07}\naction: driver-upgrade\nwaves: [50%]\nmax_unavailable: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(matrix, []byte("gpus:\n  - model: H100 80GB HBM3\n    drivers: [\"535.*\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out = run("rollout", "plan", "-f", spec, "--matrix", matrix); !strings.Contains(out, "EXCLUDED") || !strings.Contains(out, "incompatible") {
		t.Fatalf("rollout plan:\n%s", out)
	}
	if out = run("rollout", "list"); !strings.Contains(out, "ID") {
		t.Fatalf("rollout list:\n%s", out)
	}

	// Errors are one line that names the coordinator and the code.
	out, code := execute(t, append([]string{"burnin", "report", "nope", "-o", "html"}, conn...)...)
	if code != exitCommand || !strings.Contains(out, "not found") {
		t.Fatalf("burnin report of nothing: %d %s", code, out)
	}
	out, code = execute(t, append([]string{"drill", "status", "nope"}, conn...)...)
	if code != exitCommand || !strings.Contains(out, "not found") {
		t.Fatalf("drill status of nothing: %d %s", code, out)
	}
	if out = run("drill", "list", "-o", "json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("drill list:\n%s", out)
	}
	if out = run("burnin", "list"); !strings.Contains(out, "ACCEPTED") {
		t.Fatalf("burnin list:\n%s", out)
	}
}
