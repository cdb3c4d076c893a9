//go:build unix

package runcmd

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// TestGuardRefusesWhileStuck models a process in D state: the first run
// returns, but its process has not exited, so the key stays held until it
// does.
func TestGuardRefusesWhileStuck(t *testing.T) {
	t.Parallel()
	exited := make(chan struct{})
	calls := 0
	g := &Guard{start: func(context.Context, Spec) (Result, <-chan struct{}) {
		calls++
		if calls == 1 {
			return Result{ExitCode: -1, TimedOut: true, Err: ErrStuck}, exited
		}
		done := make(chan struct{})
		close(done)
		return Result{}, done
	}}
	first := g.Run(context.Background(), "nvidia-smi", Spec{Path: "nvidia-smi"})
	if !first.TimedOut {
		t.Fatalf("first = %+v", first)
	}
	second := g.Run(context.Background(), "nvidia-smi", Spec{Path: "nvidia-smi"})
	if !second.TimedOut || !errors.Is(second.Err, ErrStuck) || calls != 1 {
		t.Fatalf("second = %+v (calls %d)", second, calls)
	}
	if !strings.Contains(second.Err.Error(), "still running since ") || !strings.HasSuffix(second.Err.Error(), "(stuck)") {
		t.Errorf("Err = %q", second.Err)
	}
	if _, busy := g.Busy()["nvidia-smi"]; !busy {
		t.Error("key not reported busy")
	}
	// Another probe is not held up by the stuck one.
	if r := g.Run(context.Background(), "dmesg", Spec{}); r.Err != nil || calls != 2 {
		t.Fatalf("other key = %+v", r)
	}
	// The kernel finally lets the process go: the key frees up.
	close(exited)
	testwait.Value(t, 2*time.Second, "the key freed after the process exited", g.Busy, func(b map[string]time.Time) bool { return len(b) == 0 })
	if r := g.Run(context.Background(), "nvidia-smi", Spec{}); r.Err != nil || calls != 3 {
		t.Fatalf("after exit = %+v", r)
	}
}

// TestGuardRealProcess: while a real run is in progress (its group ignores
// SIGTERM and waits out the grace), a second run for the key is refused.
func TestGuardRealProcess(t *testing.T) {
	t.Parallel()
	var g Guard
	s := sh(`trap "" TERM; sleep 30`)
	s.Timeout = 100 * time.Millisecond
	s.KillGrace = 400 * time.Millisecond

	var wg sync.WaitGroup
	wg.Add(1)
	var first Result
	go func() {
		defer wg.Done()
		first = g.Run(context.Background(), "probe", s)
	}()
	testwait.Until(t, 2*time.Second, "the first run registered", func() bool { return len(g.Busy()) > 0 })
	start := time.Now()
	second := g.Run(context.Background(), "probe", sh("true"))
	if !second.TimedOut || !errors.Is(second.Err, ErrStuck) || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("second = %+v after %v", second, time.Since(start))
	}
	wg.Wait()
	if !first.TimedOut || !errors.Is(first.Err, ErrTimeout) {
		t.Fatalf("first = %+v", first)
	}
	if r := g.Run(context.Background(), "probe", sh("true")); r.Err != nil || r.ExitCode != 0 {
		t.Fatalf("third = %+v", r)
	}
}
