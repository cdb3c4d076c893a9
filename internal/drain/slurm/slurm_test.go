package slurm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/runcmd"
)

// fakeSlurm is a cluster of fake Slurm tools in a temporary directory:
// shell scripts (testdata/fakebin) that keep node state in files and record
// every call.
type fakeSlurm struct {
	t    *testing.T
	dir  string // state: nodes/<name>, jobs, calls
	bin  string
	opts Options
}

func newFake(t *testing.T, nodes map[string]string) *fakeSlurm {
	t.Helper()
	root := t.TempDir()
	f := &fakeSlurm{t: t, dir: filepath.Join(root, "state"), bin: filepath.Join(root, "bin")}
	for _, d := range []string{f.bin, filepath.Join(f.dir, "nodes")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tool := range []string{"scontrol", "sinfo", "squeue"} {
		data, err := os.ReadFile(filepath.Join("testdata", "fakebin", tool))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(f.bin, tool), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for n, st := range nodes {
		f.set(n, st)
	}
	f.opts = Options{
		Scontrol: filepath.Join(f.bin, "scontrol"),
		Sinfo:    filepath.Join(f.bin, "sinfo"),
		Squeue:   filepath.Join(f.bin, "squeue"),
		Env:      []string{"FAKE_SLURM=" + f.dir},
		Timeout:  5 * time.Second,
	}
	return f
}

// set writes a node's "state|reason".
func (f *fakeSlurm) set(node, stateReason string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, "nodes", node), []byte(stateReason+"\n"), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeSlurm) get(node string) string {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join(f.dir, "nodes", node))
	if err != nil {
		f.t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

func (f *fakeSlurm) jobs(lines ...string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, "jobs"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeSlurm) touch(name string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, name), nil, 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// calls returns the recorded scontrol calls (sinfo and squeue only read).
func (f *fakeSlurm) scontrolCalls() []string {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join(f.dir, "calls"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if strings.HasPrefix(l, "scontrol ") {
			out = append(out, l)
		}
	}
	return out
}

func TestDrainAndResume(t *testing.T) {
	t.Parallel()
	f := newFake(t, map[string]string{"gpu-001": "idle|none", "gpu-002": "mixed|none"})
	f.jobs("gpu-002 4711", "gpu-002 4712")
	a := New(f.opts)
	ctx := context.Background()

	if err := a.Drain(ctx, "gpu-001", "rollout r-1: driver 550.90.07"); err != nil {
		t.Fatal(err)
	}
	if got, want := f.get("gpu-001"), "drained|fleetcheck: rollout r-1: driver 550.90.07"; got != want {
		t.Fatalf("state %q, want %q", got, want)
	}
	st, err := a.Status(ctx, "gpu-001")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Drained || !st.ByFleetcheck || st.RunningJobs != 0 || st.Reason != "fleetcheck: rollout r-1: driver 550.90.07" {
		t.Fatalf("status %+v", st)
	}
	// Draining again is a no-op: no second scontrol call.
	if err := a.Drain(ctx, "gpu-001", "other"); err != nil {
		t.Fatal(err)
	}

	// A busy node drains into "draining" and reports its jobs.
	if err := a.Drain(ctx, "gpu-002", "fleetcheck: sweep"); err != nil {
		t.Fatal(err)
	}
	st, err = a.Status(ctx, "gpu-002")
	if err != nil {
		t.Fatal(err)
	}
	if !st.Drained || !st.ByFleetcheck || st.RunningJobs != 2 {
		t.Fatalf("busy node status %+v", st)
	}

	if err := a.Undrain(ctx, "gpu-001"); err != nil {
		t.Fatal(err)
	}
	if got := f.get("gpu-001"); got != "idle|none" {
		t.Fatalf("after resume: %q", got)
	}
	// Undraining a node in service is a no-op.
	if err := a.Undrain(ctx, "gpu-001"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"scontrol update nodename=gpu-001 state=drain reason=fleetcheck: rollout r-1: driver 550.90.07",
		"scontrol update nodename=gpu-002 state=drain reason=fleetcheck: sweep",
		"scontrol update nodename=gpu-001 state=resume",
	}
	if got := f.scontrolCalls(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("scontrol calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestForeignDrainNeverTouched(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"admin drain":    "drained|bad DIMM, ticket 4411",
		"draining":       "draining|maintenance window",
		"down":           "down*|Not responding",
		"compound":       "idle+drain|reseat HCA",
		"fleetcheck-ish": "drained|fleetcheck was here",
	}
	for name, state := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t, map[string]string{"gpu-007": state})
			a := New(f.opts)
			ctx := context.Background()
			if err := a.Undrain(ctx, "gpu-007"); !errors.Is(err, drain.ErrNotOurs) {
				t.Fatalf("undrain: %v, want ErrNotOurs", err)
			}
			if err := a.Drain(ctx, "gpu-007", "rollout"); !errors.Is(err, drain.ErrNotOurs) {
				t.Fatalf("drain: %v, want ErrNotOurs", err)
			}
			st, err := a.Status(ctx, "gpu-007")
			if err != nil {
				t.Fatal(err)
			}
			if !st.Drained || st.ByFleetcheck {
				t.Fatalf("status %+v", st)
			}
			if got := f.get("gpu-007"); got != state {
				t.Fatalf("state changed to %q", got)
			}
			if c := f.scontrolCalls(); len(c) != 0 {
				t.Fatalf("scontrol was called: %q", c)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("hostlist refused", func(t *testing.T) {
		t.Parallel()
		f := newFake(t, map[string]string{"gpu-001": "idle|none"})
		a := New(f.opts)
		for _, n := range []string{"gpu-[001-004]", "gpu-001,gpu-002", "-n", "a b", ""} {
			if err := a.Drain(ctx, n, "x"); !errors.Is(err, drain.ErrInvalidNode) {
				t.Errorf("drain %q: %v", n, err)
			}
		}
		if c := f.scontrolCalls(); len(c) != 0 {
			t.Fatalf("scontrol was called: %q", c)
		}
	})
	t.Run("unknown node", func(t *testing.T) {
		t.Parallel()
		f := newFake(t, map[string]string{"gpu-001": "idle|none"})
		if _, err := New(f.opts).Status(ctx, "gpu-404"); !errors.Is(err, drain.ErrUnknownNode) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("scontrol fails", func(t *testing.T) {
		t.Parallel()
		f := newFake(t, map[string]string{"gpu-001": "idle|none"})
		f.touch("scontrol_fail")
		err := New(f.opts).Drain(ctx, "gpu-001", "x")
		if err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("sinfo hangs", func(t *testing.T) {
		t.Parallel()
		f := newFake(t, map[string]string{"gpu-001": "idle|none"})
		f.touch("sinfo_hang")
		opts := f.opts
		opts.Timeout = 200 * time.Millisecond
		start := time.Now()
		_, err := New(opts).Status(ctx, "gpu-001")
		if !errors.Is(err, runcmd.ErrTimeout) {
			t.Fatalf("got %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("took %v", d)
		}
	})
	t.Run("missing tool", func(t *testing.T) {
		t.Parallel()
		f := newFake(t, map[string]string{"gpu-001": "idle|none"})
		opts := f.opts
		opts.Sinfo = filepath.Join(f.bin, "no-sinfo")
		if _, err := New(opts).Status(ctx, "gpu-001"); !errors.Is(err, runcmd.ErrNotFound) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestUnavailable(t *testing.T) {
	t.Parallel()
	f := newFake(t, map[string]string{
		"gpu-001": "idle|none",
		"gpu-002": "drained|fleetcheck: rollout r-1",
		"gpu-003": "down*|Not responding",
		"gpu-004": "mixed|none",
		"gpu-005": "draining|PSU swap",
	})
	got, err := New(f.opts).Unavailable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || !got["gpu-002"].ByFleetcheck || got["gpu-003"].ByFleetcheck || got["gpu-005"].Reason != "PSU swap" {
		t.Fatalf("got %+v", got)
	}
}

// TestToolsOnPath runs the default tool names, found through PATH.
func TestToolsOnPath(t *testing.T) {
	f := newFake(t, map[string]string{"gpu-001": "idle|none"})
	t.Setenv("PATH", f.bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	a := New(Options{Env: f.opts.Env})
	if err := a.Drain(context.Background(), "gpu-001", "path test"); err != nil {
		t.Fatal(err)
	}
	if got := f.get("gpu-001"); got != "drained|fleetcheck: path test" {
		t.Fatalf("state %q", got)
	}
}

func TestParseState(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"idle": false, "mixed": false, "allocated+": false, "idle~": false, "completing": false,
		"drained": true, "drained*": true, "draining": true, "down": true, "down*": true,
		"mixed+drain": true, "idle+drain~": true, "fail": true, "failing": true, "planned": false,
	} {
		if got := outOfService(s); got != want {
			t.Errorf("%q: got %v", s, got)
		}
	}
	if _, err := parseSinfo("gpu-001 idle\n"); !errors.Is(err, errSinfo) {
		t.Fatalf("bad line: %v", err)
	}
	got, err := parseSinfo("gpu-001|drained|fleetcheck: a|b\n")
	if err != nil || got["gpu-001"].Reason != "fleetcheck: a|b" {
		t.Fatalf("reason with a bar: %+v %v", got, err)
	}
	if r := cleanReason("x\ny"); r != "fleetcheck: x y" {
		t.Fatalf("clean %q", r)
	}
}
