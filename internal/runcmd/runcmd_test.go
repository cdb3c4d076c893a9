//go:build unix

package runcmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/needs"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

func sh(script string) Spec { return Spec{Path: "sh", Args: []string{"-c", script}} }

// gone reports whether pid has exited: no such process, or a zombie that
// nobody reaps (a container's PID 1 may not).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return os.IsNotExist(err)
	}
	// The state follows the parenthesised command name.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] == 'Z' || stat[i+2] == 'X'
	}
	return false
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	t.Cleanup(func() { // a survivor must not outlive a failed test
		if t.Failed() && !gone(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	testwait.Until(t, 3*time.Second, fmt.Sprintf("process %d to be gone", pid), func() bool { return gone(pid) })
}

// runForPID runs a script that prints a child's pid first and outlives
// its timeout. On a loaded machine the shell may be killed before it
// prints, so the timeout doubles until the pid shows (bounded).
func runForPID(t *testing.T, s Spec) (Result, int) {
	t.Helper()
	for try := 0; ; try++ {
		r := Run(context.Background(), s)
		if len(bytes.TrimSpace(r.Stdout)) > 0 || try == 3 {
			return r, firstPID(t, r.Stdout)
		}
		s.Timeout *= 2
	}
}

func firstPID(t *testing.T, out []byte) int {
	t.Helper()
	f := strings.Fields(string(out))
	if len(f) == 0 {
		t.Fatalf("no pid in output %q", out)
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid <= 0 {
		t.Fatalf("bad pid in output %q", out)
	}
	return pid
}

func TestExitAndOutput(t *testing.T) {
	t.Parallel()
	cases := []struct {
		script       string
		code         int
		stdout, errs string
	}{
		{"echo out; echo err >&2", 0, "out\n", "err\n"},
		{"exit 3", 3, "", ""},
		{"printf partial; exit 226", 226, "partial", ""},
	}
	for _, c := range cases {
		t.Run(c.script, func(t *testing.T) {
			t.Parallel()
			r := Run(context.Background(), sh(c.script))
			if r.Err != nil || r.ExitCode != c.code || r.TimedOut || r.NotFound || r.Truncated {
				t.Fatalf("Run = %+v", r)
			}
			if string(r.Stdout) != c.stdout || string(r.Stderr) != c.errs {
				t.Errorf("stdout %q stderr %q", r.Stdout, r.Stderr)
			}
			if r.Duration <= 0 {
				t.Errorf("duration %v", r.Duration)
			}
		})
	}
}

func TestKilledBySignalIsAnError(t *testing.T) {
	t.Parallel()
	r := Run(context.Background(), sh("kill -9 $$"))
	if r.Err == nil || r.ExitCode != -1 || r.TimedOut {
		t.Fatalf("Run = %+v", r)
	}
}

func TestNotFound(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"fleetcheck-no-such-tool", "/nonexistent/dir/fleetcheck-no-such-tool"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			r := Run(context.Background(), Spec{Path: path, Timeout: time.Second})
			if !r.NotFound || r.Err == nil || r.ExitCode != -1 {
				t.Fatalf("Run = %+v", r)
			}
			if r.Err.Error() != "fleetcheck-no-such-tool not found" {
				t.Errorf("Err = %q", r.Err)
			}
			if !errors.Is(r.Err, ErrNotFound) {
				t.Errorf("Err %v is not ErrNotFound", r.Err)
			}
		})
	}
	if r := Run(context.Background(), Spec{}); r.Err == nil || r.NotFound {
		t.Errorf("empty path: %+v", r)
	}
}

func TestNotExecutable(t *testing.T) {
	t.Parallel()
	f := t.TempDir() + "/tool"
	if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := Run(context.Background(), Spec{Path: f})
	if r.Err == nil || r.NotFound {
		t.Fatalf("Run = %+v", r)
	}
}

// TestTimeoutKillsGroup: the shell leaves a background grandchild that
// holds stdout; the whole group dies at the deadline.
func TestTimeoutKillsGroup(t *testing.T) {
	t.Parallel()
	s := sh("sleep 30 & echo $!; sleep 30")
	s.Timeout = 200 * time.Millisecond
	r, pid := runForPID(t, s)
	if !r.TimedOut || !errors.Is(r.Err, ErrTimeout) || errors.Is(r.Err, ErrStuck) {
		t.Fatalf("Run = %+v", r)
	}
	if !strings.Contains(r.Err.Error(), "sh timed out after") {
		t.Errorf("Err = %q", r.Err)
	}
	if r.Duration > 4*time.Second {
		t.Errorf("took %v", r.Duration)
	}
	waitGone(t, pid)
}

// TestTermIgnoredGetsKill: a group that ignores SIGTERM gets SIGKILL after
// the grace.
func TestTermIgnoredGetsKill(t *testing.T) {
	t.Parallel()
	s := sh(`trap "" TERM; sleep 30 & echo $!; wait`)
	s.Timeout = 150 * time.Millisecond
	s.KillGrace = 150 * time.Millisecond
	r, pid := runForPID(t, s)
	if !r.TimedOut || r.ExitCode != -1 {
		t.Fatalf("Run = %+v", r)
	}
	// The escalation shows in the time: the deadline plus the grace.
	if r.Duration < 300*time.Millisecond || r.Duration > 4*time.Second {
		t.Errorf("took %v, want about timeout + grace", r.Duration)
	}
	waitGone(t, pid)
}

// TestEscapedGrandchildHoldingStdout: a grandchild that left the group
// keeps stdout open; Run still returns soon after the shell exits.
func TestEscapedGrandchildHoldingStdout(t *testing.T) {
	t.Parallel()
	needs.Tool(t, "setsid", "util-linux")
	s := sh("setsid sleep 30 & echo $!")
	s.Timeout = 5 * time.Second
	s.KillGrace = 100 * time.Millisecond
	r := Run(context.Background(), s)
	pid := firstPID(t, r.Stdout)
	defer syscall.Kill(pid, syscall.SIGKILL)
	if r.Duration > 2*time.Second || r.TimedOut {
		t.Fatalf("Run = %+v", r)
	}
	if r.Err == nil || !errors.Is(r.Err, exec.ErrWaitDelay) {
		t.Errorf("Err = %v, want the output-left-open error", r.Err)
	}
}

func TestContextCancel(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	r := Run(ctx, sh("sleep 30"))
	if r.TimedOut || !errors.Is(r.Err, context.Canceled) || r.Duration > 2*time.Second {
		t.Fatalf("Run = %+v", r)
	}
}

func TestTruncation(t *testing.T) {
	t.Parallel()
	s := sh("head -c 100000 /dev/zero; echo tail >&2")
	s.MaxOutput = 1000
	r := Run(context.Background(), s)
	if r.Err != nil || r.ExitCode != 0 || !r.Truncated || len(r.Stdout) != 1000 || string(r.Stderr) != "tail\n" {
		t.Fatalf("Run: err=%v code=%d truncated=%v stdout=%d stderr=%q", r.Err, r.ExitCode, r.Truncated, len(r.Stdout), r.Stderr)
	}
}

func TestEnvAndDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := sh(`printf '%s|%s|' "$FLEETCHECK_TEST_VAR" "$(pwd)"; test -n "$PATH" && printf inherited`)
	s.Env = []string{"FLEETCHECK_TEST_VAR=hello world"}
	s.Dir = dir
	r := Run(context.Background(), s)
	if r.Err != nil || string(r.Stdout) != "hello world|"+dir+"|inherited" {
		t.Fatalf("Run: %v %q", r.Err, r.Stdout)
	}
}

func TestBoundedBuffer(t *testing.T) {
	t.Parallel()
	b := &boundedBuffer{max: 5}
	for _, p := range []string{"ab", "cd", "ef", "g"} {
		if n, err := b.Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	got, trunc := b.snapshot()
	if string(got) != "abcde" || !trunc {
		t.Errorf("got %q truncated %v", got, trunc)
	}
}

func TestTimeoutMessageNamesTheLimit(t *testing.T) {
	t.Parallel()
	r := Run(context.Background(), Spec{Path: "sleep", Args: []string{"30"}, Timeout: 100 * time.Millisecond})
	if !r.TimedOut || r.Err == nil || r.Err.Error() != "sleep timed out after 100ms" {
		t.Fatalf("Run = %+v", r)
	}
}
