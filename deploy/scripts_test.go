// Package deploy holds what is installed beside the binary: the agent's
// action wrappers (actions/), the Slurm prolog and epilog (slurm/) and the
// Prometheus rules (prometheus/). This file tests the shell scripts
// against a fake root: fake tools on PATH that log their arguments.
package deploy

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/probe/kmsg"
)

// safeTools are the only real programs the scripts may reach: text tools
// with no effect on the machine. Everything else must be faked, so a
// script calling a tool the test forgot (shutdown, modprobe) fails with
// "not found" instead of acting on the host.
var safeTools = []string{"awk", "sed", "grep", "tr", "cat", "mktemp", "tail", "mv", "rm", "head", "sort", "mkdir"}

// fakeRoot is a temp dir with bin/ (fakes) and safe/ (links to the real
// safe tools); calls.log gets one line per fake call: "NAME ARG...".
type fakeRoot struct {
	t    *testing.T
	dir  string
	env  []string
	fake map[string]bool
}

func newFakeRoot(t *testing.T) *fakeRoot {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"bin", "safe"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tool := range safeTools {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatalf("%s is needed to run the scripts: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(dir, "safe", tool)); err != nil {
			t.Fatal(err)
		}
	}
	return &fakeRoot{t: t, dir: dir, fake: map[string]bool{}}
}

// tool installs a fake: it logs its arguments, prints stdout and exits
// with code. A script body may replace the default behaviour.
func (r *fakeRoot) tool(name, stdout string, code int) {
	r.t.Helper()
	body := "#!/bin/sh\nprintf '%s' \"" + name + "\" >>\"$FAKE_LOG\"\nfor a in \"$@\"; do printf ' %s' \"$a\" >>\"$FAKE_LOG\"; done\necho >>\"$FAKE_LOG\"\n"
	if stdout != "" {
		out := filepath.Join(r.dir, name+".out")
		if err := os.WriteFile(out, []byte(stdout), 0o644); err != nil {
			r.t.Fatal(err)
		}
		body += "cat '" + out + "'\n"
	}
	body += "exit " + strconv.Itoa(code) + "\n"
	if err := writeExecutable(filepath.Join(r.dir, "bin", name), body); err != nil {
		r.t.Fatal(err)
	}
}

// writeExecutable writes a fake tool under syscall.ForkLock: a parallel
// test's fork in the window the file is open for writing would inherit
// the descriptor, and executing the fake then fails with "Text file
// busy" (ETXTBSY), as seen in CI.
func writeExecutable(path, body string) error {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	return os.WriteFile(path, []byte(body), 0o755)
}

// script installs a fake with its own sh body after the logging lines.
func (r *fakeRoot) script(name, body string) {
	r.t.Helper()
	head := "#!/bin/sh\nprintf '%s' \"" + name + "\" >>\"$FAKE_LOG\"\nfor a in \"$@\"; do printf ' %s' \"$a\" >>\"$FAKE_LOG\"; done\necho >>\"$FAKE_LOG\"\n"
	if err := writeExecutable(filepath.Join(r.dir, "bin", name), head+body); err != nil {
		r.t.Fatal(err)
	}
}

// posixShell is dash where installed (the strictest common POSIX sh, so
// a bash-only construct fails here), else /bin/sh.
func posixShell() string {
	if p, err := exec.LookPath("dash"); err == nil {
		return p
	}
	return "/bin/sh"
}

// run runs a script under a POSIX sh with only the fakes and safe tools on
// PATH; it returns the combined output and exit code.
func (r *fakeRoot) run(script string, args ...string) (string, int) {
	r.t.Helper()
	cmd := exec.Command(posixShell(), append([]string{script}, args...)...)
	cmd.Env = append([]string{
		"PATH=" + filepath.Join(r.dir, "bin") + ":" + filepath.Join(r.dir, "safe"),
		"FAKE_LOG=" + r.log(), "TMPDIR=" + r.dir, "HOME=" + r.dir,
	}, r.env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &ee):
		return out.String(), ee.ExitCode()
	default:
		r.t.Fatalf("%s: %v", script, err)
		return "", -1
	}
}

func (r *fakeRoot) log() string { return filepath.Join(r.dir, "calls.log") }

// calls is what the fakes were called with, one "NAME ARG..." per call.
func (r *fakeRoot) calls() []string {
	b, err := os.ReadFile(r.log())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func called(calls []string, prefix string) bool {
	for _, c := range calls {
		if c == prefix || strings.HasPrefix(c, prefix+" ") {
			return true
		}
	}
	return false
}

const madison = ` nvidia-driver-550-server | 550.90.07-0ubuntu0.22.04.1 | http://archive.ubuntu.com/ubuntu jammy-updates/restricted amd64 Packages
 nvidia-driver-550-server | 550.54.15-0ubuntu0.22.04.2 | http://archive.ubuntu.com/ubuntu jammy-updates/restricted amd64 Packages
`

func TestDriverWrapper(t *testing.T) {
	t.Parallel()
	const script = "actions/fleetcheck-driver"
	for _, tc := range []struct {
		name     string
		args     []string
		env      []string
		madison  string
		aptCode  int
		modprobe int
		code     int
		want     []string // calls that must happen, in any order
		never    []string // tools that must not be called
	}{
		{name: "upgrade reboots", args: []string{"upgrade", "550.90.07"}, madison: madison, code: 0,
			want: []string{
				"apt-cache madison nvidia-driver-550-server", "apt-cache madison nvidia-fabricmanager-550",
				// (the fake repository has the same build of both)
				"apt-get install -y -q --allow-downgrades --allow-change-held-packages nvidia-driver-550-server=550.90.07-0ubuntu0.22.04.1 nvidia-fabricmanager-550=550.90.07-0ubuntu0.22.04.1",
				"shutdown -r +1 fleetcheck: driver 550.90.07",
			}, never: []string{"modprobe"}},
		{name: "rollback reloads modules", args: []string{"rollback", "550.54.15"}, madison: madison,
			env: []string{"FLEETCHECK_DRIVER_REBOOT=0", "FLEETCHECK_DRIVER_PACKAGES=nvidia-driver-{branch}-server"}, code: 0,
			want: []string{
				"apt-get install -y -q --allow-downgrades --allow-change-held-packages nvidia-driver-550-server=550.54.15-0ubuntu0.22.04.2",
				"modprobe -r nvidia_drm nvidia_modeset nvidia_uvm nvidia_peermem nvidia", "modprobe nvidia",
			}, never: []string{"shutdown"}},
		{name: "modules in use", args: []string{"upgrade", "550.90.07"}, madison: madison, modprobe: 1,
			env: []string{"FLEETCHECK_DRIVER_REBOOT=0", "FLEETCHECK_DRIVER_PACKAGES=nvidia-driver-{branch}-server"}, code: 1,
			never: []string{"shutdown"}},
		{name: "version not packaged", args: []string{"upgrade", "550.100.01"}, madison: madison, code: 1,
			never: []string{"apt-get", "shutdown"}},
		{name: "install fails", args: []string{"upgrade", "550.90.07"}, madison: madison, aptCode: 100,
			env: []string{"FLEETCHECK_DRIVER_PACKAGES=nvidia-driver-{branch}-server"}, code: 1, never: []string{"shutdown"}},
		{name: "hostile version", args: []string{"upgrade", "550.90;reboot"}, code: 2, never: []string{"apt-cache", "apt-get", "shutdown"}},
		{name: "option as version", args: []string{"upgrade", "--purge"}, code: 2, never: []string{"apt-cache", "apt-get"}},
		{name: "unknown verb", args: []string{"remove", "550.90.07"}, code: 2, never: []string{"apt-cache", "apt-get"}},
		{name: "no version", args: []string{"upgrade"}, code: 2, never: []string{"apt-cache"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newFakeRoot(t)
			r.env = tc.env
			r.tool("apt-cache", tc.madison, 0)
			r.tool("apt-get", "", tc.aptCode)
			r.tool("systemctl", "", 0)
			r.tool("shutdown", "", 0)
			r.tool("modprobe", "", tc.modprobe)
			out, code := r.run(script, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d:\n%s", code, tc.code, out)
			}
			calls := r.calls()
			for _, w := range tc.want {
				if !contains(calls, w) {
					t.Errorf("no call %q; calls:\n%s", w, strings.Join(calls, "\n"))
				}
			}
			for _, n := range tc.never {
				if called(calls, n) {
					t.Errorf("%s was called; calls:\n%s", n, strings.Join(calls, "\n"))
				}
			}
		})
	}
}

func TestKmsgXidWrapper(t *testing.T) {
	t.Parallel()
	const script = "actions/fleetcheck-kmsg-xid"
	t.Run("inject", func(t *testing.T) {
		t.Parallel()
		r := newFakeRoot(t)
		kmsgFile := filepath.Join(r.dir, "kmsg")
		r.env = []string{"FLEETCHECK_KMSG=" + kmsgFile}
		r.tool("nvidia-smi", "00000000:9B:00.0\n", 0)
		if out, code := r.run(script, "3", "79"); code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		if c := r.calls(); !contains(c, "nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i 3") {
			t.Errorf("calls: %q", c)
		}
		b, err := os.ReadFile(kmsgFile)
		if err != nil {
			t.Fatal(err)
		}
		line, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "<3>")
		if !ok {
			t.Fatalf("no kernel log level: %q", b)
		}
		// The line must read as a driver's Xid to the agent's own parser,
		// as dmesg shows it.
		log, err := kmsg.Parse([]byte("[ 1234.567890] "+line+"\n"), time.Now(), 2000*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(log.Events) != 1 {
			t.Fatalf("%q parsed as %+v", line, log.Events)
		}
		e := log.Events[0]
		if e.Kind != snapshot.EventXid || e.Code != 79 || e.PCIBusID != "0000:9b:00.0" || e.Process != "fleetcheck-drill" {
			t.Errorf("%q parsed as %+v", line, e)
		}
	})
	for _, tc := range []struct {
		name  string
		args  []string
		smi   int
		code  int
		wrote bool
	}{
		{name: "clear", args: []string{"--clear"}, code: 0},
		{name: "unknown gpu", args: []string{"9", "79"}, smi: 6, code: 1},
		{name: "gpu not a number", args: []string{"0;x", "79"}, code: 2},
		{name: "xid not a number", args: []string{"0", "-79"}, code: 2},
		{name: "no args", code: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newFakeRoot(t)
			kmsgFile := filepath.Join(r.dir, "kmsg")
			r.env = []string{"FLEETCHECK_KMSG=" + kmsgFile}
			r.tool("nvidia-smi", "", tc.smi)
			out, code := r.run(script, tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d:\n%s", code, tc.code, out)
			}
			if _, err := os.Stat(kmsgFile); err == nil {
				t.Errorf("the kernel log was written")
			}
			if tc.code == 2 && len(r.calls()) > 0 {
				t.Errorf("bad usage still called %q", r.calls())
			}
		})
	}
}

func TestGPUBurnWrapper(t *testing.T) {
	t.Parallel()
	const script = "actions/fleetcheck-gpu-burn"
	const ok = "100.0%  proc'd: 1234 (54321 Gflop/s)\nGPU 0: OK\nGPU 1: OK\n"
	for _, tc := range []struct {
		name     string
		duration string
		out      string
		burnCode int
		code     int
		seconds  string // "" when gpu_burn must not run
	}{
		{name: "burn-in's duration", duration: "2h0m0s", out: ok, seconds: "7200"},
		{name: "minutes", duration: "30m", out: ok, seconds: "1800"},
		{name: "mixed", duration: "1h30m15s", out: ok, seconds: "5415"},
		{name: "faulty gpu", duration: "30m", out: "GPU 0: OK\nGPU 1: FAULTY\n", code: 1, seconds: "1800"},
		{name: "gpu_burn fails", duration: "90s", out: "Couldn't init a GPU test: CUDA error\n", burnCode: 3, code: 1, seconds: "90"},
		{name: "no verdict", duration: "90s", out: "nothing\n", code: 1, seconds: "90"},
		{name: "zero", duration: "0s", code: 2},
		{name: "fraction", duration: "1.5h", code: 2},
		{name: "words", duration: "thirty minutes", code: 2},
		{name: "option", duration: "-d", code: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newFakeRoot(t)
			r.tool("gpu_burn", tc.out, tc.burnCode)
			out, code := r.run(script, tc.duration)
			if code != tc.code {
				t.Fatalf("exit %d, want %d:\n%s", code, tc.code, out)
			}
			calls := r.calls()
			switch {
			case tc.seconds == "" && len(calls) > 0:
				t.Errorf("gpu_burn ran: %q", calls)
			case tc.seconds != "" && !contains(calls, "gpu_burn "+tc.seconds):
				t.Errorf("calls %q, want gpu_burn %s", calls, tc.seconds)
			}
			if tc.code == 1 && !strings.Contains(out, strings.TrimSpace(strings.Split(tc.out, "\n")[0])) {
				t.Errorf("the tool's output is not passed on:\n%s", out)
			}
		})
	}
}

// nvbandwidthOut is the shape nvbandwidth prints for the two tests: a
// title, a row of GPU indexes, a row of figures, a SUM line.
const nvbandwidthOut = `nvbandwidth Version: v0.7
Built from Git version: v0.7

NOTE: This tool reports current measured bandwidth on your system.

Running host_to_device_memcpy_ce.
memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)
           0         1         2         3
 0     55.21     55.19     41.02     55.20

SUM host_to_device_memcpy_ce 206.62

Running device_to_host_memcpy_ce.
memcpy CE CPU(row) <- GPU(column) bandwidth (GB/s)
           0         1         2         3
 0     54.90     54.88     54.91       N/A

SUM device_to_host_memcpy_ce 164.69
`

func TestPCIeBandwidthWrapper(t *testing.T) {
	t.Parallel()
	const script = "actions/fleetcheck-pcie-bandwidth"
	t.Run("measures", func(t *testing.T) {
		t.Parallel()
		r := newFakeRoot(t)
		r.tool("nvbandwidth", nvbandwidthOut, 0)
		out, code := r.run(script)
		if code != 0 {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		if c := r.calls(); !contains(c, "nvbandwidth -t host_to_device_memcpy_ce -t device_to_host_memcpy_ce") {
			t.Errorf("calls %q", c)
		}
		// What burn-in reads from the action's output: the slowest GPU.
		m := burnin.ParseActionMetrics(out)
		if m[burnin.MetricPCIeH2D] != 41.02 || m[burnin.MetricPCIeD2H] != 54.88 || len(m) != 2 {
			t.Errorf("burn-in reads %v from:\n%s", m, out)
		}
	})
	for _, tc := range []struct {
		name, out string
		code      int
	}{
		{"nvbandwidth fails", "CUDA error: no CUDA-capable device is detected\n", 1},
		{"no figures", "nvbandwidth Version: v0.7\n", 0},
		{"one test only", strings.SplitN(nvbandwidthOut, "Running device_to_host", 2)[0], 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newFakeRoot(t)
			r.tool("nvbandwidth", tc.out, tc.code)
			out, code := r.run(script)
			if code != 1 {
				t.Fatalf("exit %d, want 1:\n%s", code, out)
			}
			if m := burnin.ParseActionMetrics(out); len(m) == 2 {
				t.Errorf("failed run still reports both figures: %v", m)
			}
		})
	}
}

// readActivity reads the file as the agent does: one word it accepts.
func readActivity(t *testing.T, path string) agent.Activity {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.ParseActivity(string(b))
	if err != nil {
		t.Fatalf("the agent refuses the activity file: %v", err)
	}
	return a
}

func noTempFiles(t *testing.T, dir string) {
	t.Helper()
	left, _ := filepath.Glob(filepath.Join(dir, "*.tmp.*"))
	if len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestSlurmProlog(t *testing.T) {
	t.Parallel()
	r := newFakeRoot(t)
	state := filepath.Join(r.dir, "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(state, "activity")
	if err := os.WriteFile(file, []byte("idle\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	noEnv := "FLEETCHECK_ENV_FILE=" + filepath.Join(r.dir, "no.env")
	r.env = []string{"FLEETCHECK_ACTIVITY_FILE=" + file, "SLURM_JOB_ID=4242", "SLURMD_NODENAME=gpu-017", noEnv}
	r.tool("fleetcheck-node", "", 1)
	if out, code := r.run("slurm/fleetcheck-prolog"); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if a := readActivity(t, file); a != agent.ActivityBusy {
		t.Errorf("activity %q after the prolog, want busy", a)
	}
	noTempFiles(t, state)
	if calls := r.calls(); len(calls) != 0 {
		t.Errorf("the pre-job check ran although it is off by default: %v", calls)
	}

	// The pre-job quick check, from the env file: the node's verdict
	// decides whether the job starts.
	envFile := filepath.Join(r.dir, "healthcheck.env")
	if err := os.WriteFile(envFile, []byte("FLEETCHECK_PROLOG_CHECKS=gpu.inventory,gpu.xid\nFLEETCHECK_NODE=fleetcheck-node\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		exit     int
		want     int
		activity agent.Activity
		stderr   string
	}{
		{0, 0, agent.ActivityBusy, ""},
		{1, 1, agent.ActivityDrained, "failed its pre-job check (gpu.inventory,gpu.xid); job 4242 requeued"},
		{2, 0, agent.ActivityBusy, "could not run (exit 2); job 4242 starts"},
	} {
		if err := os.Remove(r.log()); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		r.tool("fleetcheck-node", "", c.exit)
		r.env = []string{"FLEETCHECK_ACTIVITY_FILE=" + file, "SLURM_JOB_ID=4242", "FLEETCHECK_ENV_FILE=" + envFile}
		out, code := r.run("slurm/fleetcheck-prolog")
		if code != c.want || !strings.Contains(out, c.stderr) {
			t.Errorf("check exit %d: prolog exit %d, want %d, output %q, want %q", c.exit, code, c.want, out, c.stderr)
		}
		if a := readActivity(t, file); a != c.activity {
			t.Errorf("check exit %d: activity %q, want %q", c.exit, a, c.activity)
		}
		if calls := r.calls(); len(calls) != 1 || calls[0] != "fleetcheck-node run --slurm --checks gpu.inventory,gpu.xid --deadline 20s" {
			t.Errorf("check exit %d: calls %v", c.exit, calls)
		}
		noTempFiles(t, state)
	}

	// Not written: the job must not start beside a disruptive check.
	r.env = []string{"FLEETCHECK_ACTIVITY_FILE=" + filepath.Join(r.dir, "missing", "activity"), noEnv}
	if out, code := r.run("slurm/fleetcheck-prolog"); code != 1 || !strings.Contains(out, "cannot write") {
		t.Errorf("unwritable activity file: exit %d, want 1:\n%s", code, out)
	}
}

func TestSlurmEpilog(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		squeue     string
		squeueCode int
		scontrol   string
		want       agent.Activity
	}{
		{name: "last job ends", squeue: "4242\n", scontrol: "NodeName=gpu-017 State=IDLE ThreadsPerCore=2\n", want: agent.ActivityIdle},
		{name: "nothing listed", scontrol: "NodeName=gpu-017 State=IDLE\n", want: agent.ActivityIdle},
		{name: "another job runs", squeue: "4242\n4243\n", scontrol: "NodeName=gpu-017 State=MIXED\n", want: agent.ActivityBusy},
		{name: "draining", squeue: "4242\n", scontrol: "NodeName=gpu-017 State=IDLE+DRAIN ThreadsPerCore=2\n", want: agent.ActivityDrained},
		{name: "drained", scontrol: "NodeName=gpu-017 State=DRAINED\n", want: agent.ActivityDrained},
		{name: "squeue fails", squeueCode: 1, scontrol: "NodeName=gpu-017 State=IDLE\n", want: agent.ActivityBusy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newFakeRoot(t)
			file := filepath.Join(r.dir, "activity")
			r.env = []string{"FLEETCHECK_ACTIVITY_FILE=" + file, "SLURM_JOB_ID=4242", "SLURMD_NODENAME=gpu-017"}
			r.tool("squeue", tc.squeue, tc.squeueCode)
			r.tool("scontrol", tc.scontrol, 0)
			if out, code := r.run("slurm/fleetcheck-epilog"); code != 0 {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			if a := readActivity(t, file); a != tc.want {
				t.Errorf("activity %q, want %q", a, tc.want)
			}
			if c := r.calls(); !contains(c, "squeue -h -w gpu-017 -t RUNNING,COMPLETING -o %A") {
				t.Errorf("calls %q", c)
			}
			noTempFiles(t, r.dir)
		})
	}
}

// smiLimits answers the power-limit query; -pl calls fail for the GPUs in
// FAIL_PL ("3").
const smiLimits = `case "$1" in
--query-gpu=*) printf '0, 700.00, 200.00\n1, 700.00, 200.00\n2, 700.00, 200.00\n3, 700.00, 200.00\n' ;;
-i) [ "$2" = "${FAIL_PL:-}" ] && exit 1 ;;
esac
exit 0
`

func TestGPUSlowdownWrapper(t *testing.T) {
	t.Parallel()
	const script = "actions/fleetcheck-gpu-slowdown"
	for _, tc := range []struct {
		name   string
		arg    string
		env    []string
		code   int
		watts  string // every GPU's -pl value; "" when none is set
		failPL bool
	}{
		{name: "half", arg: "50", code: 0, watts: "350"},
		{name: "floor at the minimum", arg: "10", code: 0, watts: "200"},
		{name: "clear", arg: "--clear", code: 0, watts: "700"},
		{name: "one gpu refuses", arg: "50", env: []string{"FAIL_PL=3"}, code: 1, watts: "350"},
		{name: "zero", arg: "0", code: 2},
		{name: "hundred", arg: "100", code: 2},
		{name: "not a number", arg: "50%", code: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newFakeRoot(t)
			r.env = tc.env
			r.script("nvidia-smi", smiLimits)
			out, code := r.run(script, tc.arg)
			if code != tc.code {
				t.Fatalf("exit %d, want %d:\n%s", code, tc.code, out)
			}
			calls := r.calls()
			if tc.watts == "" {
				if len(calls) > 0 {
					t.Errorf("bad usage still called %q", calls)
				}
				return
			}
			for gpu := range 4 {
				if want := "nvidia-smi -i " + strconv.Itoa(gpu) + " -pl " + tc.watts; !contains(calls, want) {
					t.Errorf("no %q in %q", want, calls)
				}
			}
		})
	}
}

func TestKillWorkloadWrapper(t *testing.T) {
	t.Parallel()
	const script = "actions/fleetcheck-kill-workload"
	t.Run("kills what holds a GPU", func(t *testing.T) {
		t.Parallel()
		// The workload is this test's own child: the only process the
		// script can reach.
		job := exec.Command("sleep", "60")
		if err := job.Start(); err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() { waited <- job.Wait() }()
		t.Cleanup(func() { _ = job.Process.Kill() })
		r := newFakeRoot(t)
		pid := strconv.Itoa(job.Process.Pid)
		r.tool("nvidia-smi", pid+", python3\n"+pid+", python3\n", 0)
		out, code := r.run(script)
		if code != 0 || !strings.Contains(out, "killed "+pid) {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		select {
		case err := <-waited:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != -1 {
				t.Errorf("the workload ended with %v, not killed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the workload still runs")
		}
		if c := r.calls(); !contains(c, "nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader") {
			t.Errorf("calls %q", c)
		}
	})
	for _, tc := range []struct {
		name, args, smi string
		smiCode, code   int
		want            string
	}{
		{name: "revert", args: "--revert", code: 0, want: "nothing to restart"},
		{name: "idle node", smi: "", code: 0, want: "no process holds a GPU"},
		{name: "init is never killed", smi: "1, init\n", code: 0, want: "no process holds a GPU"},
		{name: "gone already", smi: "999999999, python3\n", code: 1, want: "kill -9 999999999 failed"},
		{name: "nvidia-smi fails", smiCode: 9, code: 1, want: "cannot list"},
		{name: "bad usage", args: "--all", code: 2, want: "usage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newFakeRoot(t)
			r.tool("nvidia-smi", tc.smi, tc.smiCode)
			var args []string
			if tc.args != "" {
				args = []string{tc.args}
			}
			out, code := r.run(script, args...)
			if code != tc.code || !strings.Contains(out, tc.want) {
				t.Errorf("exit %d, want %d with %q:\n%s", code, tc.code, tc.want, out)
			}
		})
	}
}
