package agent

import (
	"context"
	"io/fs"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/inspect"
)

// stuckHost ignores its context: its reads end only when the test says so,
// like a tool in D state that survives kill.
type stuckHost struct {
	release chan struct{}
	calls   atomic.Int32
	stuck   snapshot.Source // the one source that hangs
}

func (s *stuckHost) Name() string   { return "stuck" }
func (s *stuckHost) Now() time.Time { return time.Now() }
func (s *stuckHost) FS() fs.FS      { return fstest.MapFS{} }
func (s *stuckHost) Capture(_ context.Context, src snapshot.Source) host.Capture {
	if src != s.stuck {
		return host.OK([]byte(src))
	}
	s.calls.Add(1)
	<-s.release
	return host.OK([]byte(src))
}

func TestGuardJoinsStuckReadAndLeavesAtDeadline(t *testing.T) {
	t.Parallel()
	sh := &stuckHost{release: make(chan struct{}), stuck: snapshot.SrcNvidiaSMI}
	g := guard(sh)
	var wg sync.WaitGroup
	caps := make([]host.Capture, 3)
	for i := range caps {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			caps[i] = g.Capture(ctx, snapshot.SrcNvidiaSMI)
		})
	}
	wg.Wait()
	for i, c := range caps {
		if c.State != snapshot.StateTimeout || !strings.Contains(c.Err, "still running") {
			t.Errorf("caller %d: %+v", i, c)
		}
	}
	if n := sh.calls.Load(); n != 1 {
		t.Fatalf("a stuck source was read %d times at once", n)
	}
	// Another source is not held up by the stuck one.
	if c := g.Capture(context.Background(), snapshot.SrcKernelLog); c.State != snapshot.StateOK {
		t.Errorf("other source: %+v", c)
	}
	close(sh.release)
	// Once the stuck read ends, the next pass reads afresh.
	testwait.Until(t, time.Second, "stuck read to end", func() bool {
		c := g.Capture(context.Background(), snapshot.SrcNvidiaSMI)
		return c.State == snapshot.StateOK
	})
}

type nvmlHost struct{ stuckHost }

func (*nvmlHost) GPUStateNVML() (*snapshot.GPUState, error) { return &snapshot.GPUState{}, nil }

func TestGuardKeepsNVML(t *testing.T) {
	t.Parallel()
	if _, ok := guard(&nvmlHost{}).(inspect.NVMLReader); !ok {
		t.Error("guard hides the host's NVML reader")
	}
	if _, ok := guard(&stuckHost{}).(inspect.NVMLReader); ok {
		t.Error("guard invents an NVML reader")
	}
}

func TestExpBackoff(t *testing.T) {
	t.Parallel()
	b := ExpBackoff{Initial: time.Second, Max: 30 * time.Second}
	for attempt, ceil := range []time.Duration{1, 2, 4, 8, 16, 30, 30, 30} {
		ceil *= time.Second
		for range 200 {
			if d := b.Next(attempt); d < 0 || d > ceil {
				t.Fatalf("attempt %d: %s outside [0, %s]", attempt, d, ceil)
			}
		}
	}
	if d := b.Next(1000); d > 30*time.Second {
		t.Fatalf("huge attempt: %s", d)
	}
	// Full jitter: the waits spread over the range.
	var lo, hi int
	for range 1000 {
		if b.Next(10) < 15*time.Second {
			lo++
		} else {
			hi++
		}
	}
	if lo < 300 || hi < 300 {
		t.Errorf("not spread: %d below half, %d above", lo, hi)
	}
}

func TestResultIDs(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	prev := ""
	base := time.Now()
	for i := range 1000 {
		id := NewResultID(base.Add(time.Duration(i) * time.Millisecond))
		if len(id) != 32 || seen[id] {
			t.Fatalf("bad or repeated id %q", id)
		}
		if id[:12] <= prev[:min(12, len(prev))] && i > 0 {
			t.Fatalf("ids not time-ordered: %s after %s", id, prev)
		}
		seen[id] = true
		prev = id
	}
}
