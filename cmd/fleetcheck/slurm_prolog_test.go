package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/drain/slurm/slurmtest"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// TestPrologQuickCheckUnderSlurmd: with FLEETCHECK_PROLOG_CHECKS set, the
// shipped prolog checks the node before each job under a real slurmd: a
// failing node is drained with fleetcheck's reason and the job does not
// run there; a healthy node runs the job.
func TestPrologQuickCheckUnderSlurmd(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := filepath.Abs(filepath.Join(examples, "node-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bundleFile, activity, logFile := filepath.Join(dir, "bundle"), filepath.Join(dir, "activity"), filepath.Join(dir, "log")
	write := func(p, body string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	setBundle := func(name string) {
		t.Helper()
		abs, err := filepath.Abs(filepath.Join(examples, "bundles", name))
		if err != nil {
			t.Fatal(err)
		}
		write(bundleFile, abs, 0o644)
	}
	setBundle("h100-xid79-ecc")

	src, err := os.ReadFile(filepath.Join("..", "..", "deploy", "slurm", "fleetcheck-prolog"))
	if err != nil {
		t.Fatal(err)
	}
	const envDefault = "${FLEETCHECK_ENV_FILE:-/etc/fleetcheck/healthcheck.env}"
	if !strings.Contains(string(src), envDefault) {
		t.Fatalf("fleetcheck-prolog no longer reads %s", envDefault)
	}
	envFile := filepath.Join(dir, "healthcheck.env")
	prolog := filepath.Join(dir, "fleetcheck-prolog")
	write(prolog, strings.Replace(string(src), envDefault, envFile, 1), 0o755)
	shim := filepath.Join(dir, "fleetcheck-node")
	write(envFile, fmt.Sprintf("FLEETCHECK_ACTIVITY_FILE=%s\nFLEETCHECK_PROLOG_CHECKS=gpu.inventory,gpu.ecc\nFLEETCHECK_PROLOG_DEADLINE=15s\nFLEETCHECK_NODE=%s\n", activity, shim), 0o644)

	c := slurmtest.Start(t, slurmtest.Config{Prolog: prolog})
	// The shim is fleetcheck-node run --slurm on the bundle named in
	// bundleFile: the real code, against this cluster's Slurm.
	write(shim, fmt.Sprintf(`#!/bin/sh
echo "$*" >>%[1]q
[ "$1 $2" = "run --slurm" ] || exit 99
shift
export %[2]s=1 SLURM_CONF=%[3]q
exec %[4]q analyze --config %[5]q "$@" "$(cat %[6]q)" 2>>%[1]q
`, logFile, asMainEnv, c.Conf, self, cfg, bundleFile), 0o755)
	logTail := func() string {
		data, _ := os.ReadFile(logFile)
		s := string(data)
		return s[max(0, len(s)-2000):]
	}
	readActivity := func() string {
		data, _ := os.ReadFile(activity)
		return strings.TrimSpace(string(data))
	}

	c.Submit("sleep 30")
	testwait.ForEvery(t, 60*time.Second, 200*time.Millisecond, "the failing node drained by the prolog's check", func() (bool, string) {
		state, reason := c.Node()
		return strings.Contains(state, "DRAIN") && strings.HasPrefix(reason, "fleetcheck: gpu.inventory: node GPU_COUNT_LOW"),
			fmt.Sprintf("State=%s Reason=%q activity=%q\n%s", state, reason, readActivity(), logTail())
	})
	if got := readActivity(); got != "drained" {
		t.Errorf("activity %q after a failed pre-job check, want drained", got)
	}
	if out := c.MustRun("squeue", "-h", "-w", slurmtest.NodeName, "-t", "RUNNING", "-o", "%A"); strings.TrimSpace(out) != "" {
		t.Errorf("a job runs on the node that failed its pre-job check: %s", out)
	}
	if log := logTail(); !strings.Contains(log, "run --slurm --checks gpu.inventory,gpu.ecc --deadline 15s") {
		t.Errorf("the prolog did not run the configured quick check:\n%s", log)
	}

	// Healthy: the node resumed, the next job runs.
	setBundle("h100-healthy")
	c.MustRun("scontrol", "update", "nodename="+slurmtest.NodeName, "state=resume")
	id := c.Submit("sleep 30")
	// squeue says RUNNING while the prolog still runs (slurmctld counts
	// the job started at allocation), so the wait is for both: the job
	// running and the prolog's activity file saying busy.
	testwait.ForEvery(t, 60*time.Second, 200*time.Millisecond, "the job runs on the healthy node, activity busy", func() (bool, string) {
		out, _ := c.Run("squeue", "-h", "-j", id, "-o", "%T")
		act := readActivity()
		return strings.TrimSpace(out) == "RUNNING" && act == "busy", fmt.Sprintf("job %s %q activity=%q\n%s", id, out, act, logTail())
	})
	if state, reason := c.Node(); strings.Contains(state, "DRAIN") {
		t.Errorf("healthy pre-job check left the node drained: State=%s Reason=%q", state, reason)
	}
}
