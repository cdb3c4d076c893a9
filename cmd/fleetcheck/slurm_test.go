package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/internal/drain/slurm/slurmtest"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// asMainEnv makes the test binary run main() instead of the tests: slurmd
// runs it as its HealthCheckProgram (TestHealthCheckProgramUnderSlurmd).
const asMainEnv = "FLEETCHECK_TEST_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainEnv) == "1" {
		main()
	}
	os.Exit(m.Run())
}

func TestSlurmFlagErrors(t *testing.T) {
	bundle := filepath.Join(examples, "bundles/h100-healthy")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--slurm", "--deadline", "1s"}, "--deadline must be between 5s and 30m0s, not 1s"},
		{[]string{"--slurm", "--deadline", "2h"}, "--deadline must be between 5s and 30m0s, not 2h0m0s"},
		{[]string{"--slurm-node", "gpu-001"}, "--slurm-node needs --slurm"},
		{[]string{"--slurm", "--slurm-node", "gpu-[001-004]"}, `invalid node name: "gpu-[001-004]"`},
		{[]string{"--slurm", "--slurm-node", "-gpu"}, "invalid node name"},
	}
	// run takes the same flags (nodeFlags); it refuses them before it
	// looks at the host.
	for _, tc := range cases[:3] {
		if out, code := execute(t, append([]string{"run"}, tc.args...)...); code != exitCommand || !strings.Contains(out, tc.want) {
			t.Errorf("run %v: exit %d, want 2 with %q; output:\n%s", tc.args, code, tc.want, out)
		}
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, code := execute(t, append(append([]string{"analyze"}, tc.args...), bundle)...)
			if code != exitCommand || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want 2 with %q; output:\n%s", code, tc.want, out)
			}
			if strings.Contains(out, "node h100-healthy") {
				t.Fatalf("the checks ran before the flags were refused:\n%s", out)
			}
		})
	}
}

func TestFirstFailure(t *testing.T) {
	fail := func(c, code string) report.Finding {
		return report.Finding{Severity: report.SevFail, Component: c, Code: code, Message: "m " + code}
	}
	warn := report.Finding{Severity: report.SevWarn, Component: "GPU1", Code: "TEMP_HIGH", Message: "hot"}
	cases := []struct {
		name   string
		checks []report.CheckResult
		want   string
	}{
		{"all pass", []report.CheckResult{{Name: "gpu.ecc", Status: report.Pass}, {Name: "gpu.temp", Status: report.Warn, Findings: []report.Finding{warn}}}, ""},
		{"first failed check, first fail finding", []report.CheckResult{
			{Name: "gpu.temp", Status: report.Warn, Findings: []report.Finding{warn}},
			{Name: "gpu.ecc", Status: report.Fail, Findings: []report.Finding{warn, fail("GPU3", "ECC_UNCORRECTABLE"), fail("GPU4", "X")}},
			{Name: "gpu.xid", Status: report.Fail, Findings: []report.Finding{fail("GPU3", "XID_79")}},
		}, "gpu.ecc: GPU3 ECC_UNCORRECTABLE: m ECC_UNCORRECTABLE"},
		{"a failure wins over an earlier error", []report.CheckResult{
			{Name: "gpu.clocks", Status: report.Error, Reason: "nvidia-smi timed out"},
			{Name: "ib.link", Status: report.Fail, Findings: []report.Finding{fail("mlx5_0/1", "LINK_DOWN")}},
		}, "ib.link: mlx5_0/1 LINK_DOWN: m LINK_DOWN"},
		{"only errors", []report.CheckResult{
			{Name: "gpu.clocks", Status: report.Error, Reason: "nvidia-smi timed out"},
			{Name: "gpu.ecc", Status: report.Error, Reason: "other"},
		}, "gpu.clocks: could not decide: nvidia-smi timed out"},
		{"failed without findings", []report.CheckResult{{Name: "nccl.allreduce", Status: report.Fail}}, "nccl.allreduce: failed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := firstFailure(&report.Report{Checks: tc.checks}); got != tc.want {
				t.Fatalf("firstFailure = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestAnalyzeSlurmRealCluster runs `analyze --slurm` against a real
// slurmctld: a failing bundle drains the node with its first finding, a
// healthy one resumes fleetcheck's drain and never an operator's.
func TestAnalyzeSlurmRealCluster(t *testing.T) {
	c := slurmtest.Start(t, slurmtest.Config{})
	t.Setenv("SLURM_CONF", c.Conf)
	cfg := filepath.Join(examples, "node-config.yaml")
	analyze := func(bundle string) (string, int) {
		return execute(t, "analyze", "--slurm", "--slurm-node", slurmtest.NodeName, "--config", cfg, filepath.Join(examples, "bundles", bundle))
	}

	out, code := analyze("h100-xid79-ecc")
	state, reason := c.Node()
	const wantReason = "fleetcheck: gpu.inventory: node GPU_COUNT_LOW: "
	if code != exitChecks || state != "IDLE+DRAIN" || !strings.HasPrefix(reason, wantReason) {
		t.Fatalf("failing bundle: exit %d, State=%s Reason=%q; want 1, IDLE+DRAIN, %q...\n%s", code, state, reason, wantReason, out)
	}
	if !strings.Contains(out, "slurm node fc-node1: drained") {
		t.Fatalf("no drain line:\n%s", out)
	}

	out, code = analyze("h100-healthy")
	if state, reason := c.Node(); code != exitOK || state != "IDLE" || reason != "" {
		t.Fatalf("healthy bundle after our drain: exit %d, State=%s Reason=%q\n%s", code, state, reason, out)
	}

	c.MustRun("scontrol", "update", "nodename="+slurmtest.NodeName, "state=drain", "reason=nhc: /scratch full")
	for _, b := range []string{"h100-healthy", "h100-xid79-ecc"} {
		out, _ = analyze(b)
		if state, reason := c.Node(); state != "IDLE+DRAIN" || reason != "nhc: /scratch full" {
			t.Fatalf("%s over NHC's drain: State=%s Reason=%q\n%s", b, state, reason, out)
		}
		if !strings.Contains(out, "not_ours") {
			t.Fatalf("%s over NHC's drain does not say so:\n%s", b, out)
		}
	}
}

// TestAnalyzeSlurmDeadline: slurmctld that never answers costs the
// deadline's Slurm share, never a hung health check.
func TestAnalyzeSlurmDeadline(t *testing.T) {
	bin := t.TempDir()
	for _, tool := range []string{"sinfo", "scontrol"} {
		if err := os.WriteFile(filepath.Join(bin, tool), []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	start := time.Now()
	out, code := execute(t, "analyze", "--slurm", "--slurm-node", "gpu-001", "--deadline", "6s", filepath.Join(examples, "bundles/h100-xid79-ecc"))
	took := time.Since(start)
	if code != exitCommand || !strings.Contains(out, "timed out") {
		t.Fatalf("hanging sinfo: exit %d, want 2 with a timeout\n%s", code, out)
	}
	// The 1 s Slurm call, its kill grace and a reap: far from sinfo's 600 s.
	if took > 6*time.Second+watchdogSlack {
		t.Fatalf("analyze --slurm with a hanging sinfo took %v", took)
	}
}

// TestHealthCheckProgramUnderSlurmd has the real slurmd run the shipped
// deploy/slurm/fleetcheck-healthcheck as its HealthCheckProgram, with
// slurmd's bare environment: the node drains while the bundle fails and
// comes back once it passes, and an operator's drain outlasts healthy runs.
// The wrapper's fleetcheck-node is this test binary judging a bundle the
// test picks (a shim turns `run --slurm ARGS` into `analyze --slurm ARGS
// BUNDLE`); the slurm.conf lines are deploy/slurm/slurm.conf.example's.
func TestHealthCheckProgramUnderSlurmd(t *testing.T) {
	exampleSlurmConf(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bundleFile, runs, logFile := filepath.Join(dir, "bundle"), filepath.Join(dir, "runs"), filepath.Join(dir, "log")
	cfg, err := filepath.Abs(filepath.Join(examples, "node-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	setBundle := func(name string) {
		t.Helper()
		abs, err := filepath.Abs(filepath.Join(examples, "bundles", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bundleFile, []byte(abs), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setBundle("h100-xid79-ecc")

	// The shipped wrapper, reading its settings from a test env file.
	wrapperSrc, err := os.ReadFile(filepath.Join("..", "..", "deploy", "slurm", "fleetcheck-healthcheck"))
	if err != nil {
		t.Fatal(err)
	}
	const envFile = "/etc/fleetcheck/healthcheck.env"
	if !strings.Contains(string(wrapperSrc), "env_file="+envFile) {
		t.Fatalf("fleetcheck-healthcheck no longer reads %s", envFile)
	}
	wrapper := filepath.Join(dir, "fleetcheck-healthcheck")
	write := func(p, body string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(wrapper, strings.Replace(string(wrapperSrc), "env_file="+envFile, "env_file="+filepath.Join(dir, "healthcheck.env"), 1))
	shim := filepath.Join(dir, "fleetcheck-node")
	write(filepath.Join(dir, "healthcheck.env"), fmt.Sprintf("FLEETCHECK_NODE=%s\nFLEETCHECK_ARGS=\"--config %s\"\n", shim, cfg))

	c := slurmtest.Start(t, slurmtest.Config{HealthCheckProgram: wrapper, HealthCheckInterval: 1})
	write(shim, fmt.Sprintf(`#!/bin/sh
if [ "$1 $2" != "run --slurm" ] || [ -z "$PATH" ]; then
	echo "shim: want run --slurm and a PATH, got '$*' PATH='$PATH'" >>%[1]q
	echo 99 >>%[2]q
	exit 99
fi
shift
export %[3]s=1 SLURM_CONF=%[4]q
%[5]q analyze "$@" "$(cat %[6]q)" >>%[1]q 2>&1
echo $? >>%[2]q
`, logFile, runs, asMainEnv, c.Conf, self, bundleFile))

	countRuns := func() int {
		data, _ := os.ReadFile(runs)
		return strings.Count(string(data), "\n")
	}
	logTail := func() string {
		data, _ := os.ReadFile(logFile)
		s := string(data)
		return s[max(0, len(s)-2000):]
	}
	waitNode := func(what string, ok func(state, reason string) bool) {
		t.Helper()
		testwait.ForEvery(t, 60*time.Second, 200*time.Millisecond, what, func() (bool, string) {
			state, reason := c.Node()
			return ok(state, reason), fmt.Sprintf("State=%s Reason=%q runs=%d\n%s", state, reason, countRuns(), logTail())
		})
	}

	waitNode("slurmd's health check drains the failing node", func(state, reason string) bool {
		return state == "IDLE+DRAIN" && strings.HasPrefix(reason, "fleetcheck: gpu.inventory: node GPU_COUNT_LOW")
	})
	setBundle("h100-healthy")
	waitNode("the healthy node resumed", func(state, reason string) bool { return state == "IDLE" && reason == "" })

	c.MustRun("scontrol", "update", "nodename="+slurmtest.NodeName, "state=drain", "reason=operator: reseat GPU5")
	seen := countRuns()
	testwait.ForEvery(t, 60*time.Second, 200*time.Millisecond, "two more health-check runs", func() (bool, string) {
		n := countRuns()
		return n >= seen+2, fmt.Sprintf("runs=%d", n)
	})
	if state, reason := c.Node(); state != "IDLE+DRAIN" || reason != "operator: reseat GPU5" {
		t.Fatalf("health checks touched the operator's drain: State=%s Reason=%q\n%s", state, reason, logTail())
	}
	if data, _ := os.ReadFile(runs); strings.Contains(string(data), "99") {
		t.Fatalf("the wrapper ran fleetcheck-node wrongly:\n%s", logTail())
	}
}

// exampleSlurmConf reads deploy/slurm/slurm.conf.example: the programs it
// names are the shipped scripts at the package's path, and fleetcheck's
// default deadline fits in its HealthCheckInterval.
func exampleSlurmConf(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "slurm", "slurm.conf.example"))
	if err != nil {
		t.Fatal(err)
	}
	conf := map[string]string{}
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok || strings.ContainsAny(v, " \t") {
			t.Fatalf("slurm.conf.example: %q is not Key=Value (Slurm takes no arguments after a program)", l)
		}
		conf[k] = v
	}
	for key, script := range map[string]string{"HealthCheckProgram": "fleetcheck-healthcheck", "Prolog": "fleetcheck-prolog", "Epilog": "fleetcheck-epilog"} {
		if want := "/usr/lib/fleetcheck/slurm/" + script; conf[key] != want {
			t.Errorf("slurm.conf.example %s=%q, want %s (where the package installs it)", key, conf[key], want)
		}
		if _, err := os.Stat(filepath.Join("..", "..", "deploy", "slurm", script)); err != nil {
			t.Errorf("slurm.conf.example names %s: %v", script, err)
		}
	}
	interval, err := time.ParseDuration(conf["HealthCheckInterval"] + "s")
	if err != nil || interval <= defaultSlurmDeadline+watchdogSlack {
		t.Errorf("slurm.conf.example HealthCheckInterval=%q: want seconds above fleetcheck's %s deadline", conf["HealthCheckInterval"], defaultSlurmDeadline)
	}
	return conf
}

func TestSlurmDefaultPath(t *testing.T) {
	t.Setenv("PATH", "")
	f := slurmFlags{enabled: true, node: "gpu-001", deadline: defaultSlurmDeadline}
	if err := f.validate(); err != nil {
		t.Fatal(err)
	}
	if got := os.Getenv("PATH"); got != defaultPath {
		t.Fatalf("PATH = %q under slurmd's empty environment, want %q", got, defaultPath)
	}
}

// packagedActivityFile is where the fleetcheck-node package's agent reads
// its activity: deploy/deb/agent.yaml's state_dir (no activity_file set).
func packagedActivityFile(t *testing.T) string {
	t.Helper()
	cfg, err := agent.LoadConfig(filepath.Join("..", "..", "deploy", "deb", "agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ActivityFile != "" {
		return cfg.ActivityFile
	}
	return filepath.Join(cfg.StateDir, "activity")
}

// TestPrologEpilogUnderSlurmd has the real slurmd run the shipped
// fleetcheck-prolog and fleetcheck-epilog around jobs: the activity file
// says busy while a job runs, idle after it, drained once the node is
// drained. Their default file is the packaged agent's: a prolog writing
// elsewhere fails, and Slurm then drains the node and requeues every job.
func TestPrologEpilogUnderSlurmd(t *testing.T) {
	want := packagedActivityFile(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	activity := filepath.Join(dir, "activity")
	script := func(name string) string {
		t.Helper()
		src, err := os.ReadFile(filepath.Join("..", "..", "deploy", "slurm", name))
		if err != nil {
			t.Fatal(err)
		}
		def := "${FLEETCHECK_ACTIVITY_FILE:-" + want + "}"
		if !strings.Contains(string(src), def) {
			t.Fatalf("%s does not default to the packaged agent's activity file %s", name, want)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(strings.Replace(string(src), def, activity, 1)), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	prolog, epilog := script("fleetcheck-prolog"), script("fleetcheck-epilog")
	c := slurmtest.Start(t, slurmtest.Config{Prolog: prolog, Epilog: epilog})
	// The epilog asks squeue and scontrol: point them at this cluster.
	src, _ := os.ReadFile(epilog)
	if err := os.WriteFile(epilog, []byte(strings.Replace(string(src), "set -u\n", "set -u\nexport SLURM_CONF="+c.Conf+"\n", 1)), 0o755); err != nil {
		t.Fatal(err)
	}
	waitActivity := func(what, word string) {
		t.Helper()
		testwait.ForEvery(t, 30*time.Second, 100*time.Millisecond, what, func() (bool, string) {
			data, err := os.ReadFile(activity)
			if err != nil {
				return false, err.Error()
			}
			return strings.TrimSpace(string(data)) == word, strings.TrimSpace(string(data))
		})
	}

	id := c.Submit("sleep 30")
	waitActivity("the prolog's busy", "busy")
	c.MustRun("scancel", id)
	waitActivity("the epilog's idle", "idle")

	id = c.Submit("sleep 30")
	waitActivity("the prolog's busy", "busy")
	c.MustRun("scontrol", "update", "nodename="+slurmtest.NodeName, "state=drain", "reason=fleetcheck: rollout r-1")
	c.MustRun("scancel", id)
	waitActivity("the epilog's drained", "drained")
}
