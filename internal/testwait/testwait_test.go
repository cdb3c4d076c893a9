package testwait

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a testing.TB that records a Fatalf instead of ending the test.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
}

func TestForReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	r := &recorder{TB: t}
	For(r, 10*time.Second, "three polls", func() (bool, string) {
		n := calls.Add(1)
		return n == 3, fmt.Sprintf("%d polls", n)
	})
	if r.msg != "" || calls.Load() != 3 {
		t.Fatalf("msg %q after %d polls: want no failure after 3", r.msg, calls.Load())
	}
}

func TestForReportsTheLastState(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	r := &recorder{TB: t}
	For(r, 20*time.Millisecond, "a door that never opens", func() (bool, string) {
		return false, fmt.Sprintf("closed (%d)", calls.Add(1))
	})
	want := fmt.Sprintf("waiting for a door that never opens; last seen: closed (%d)", calls.Load())
	if !strings.Contains(r.msg, want) {
		t.Fatalf("failure %q: want it to contain %q", r.msg, want)
	}
}

func TestUntilWithoutState(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	Until(r, 10*time.Millisecond, "nothing", func() bool { return false })
	if !strings.HasPrefix(r.msg, "timed out after ") || strings.Contains(r.msg, "last seen") {
		t.Fatalf("failure %q", r.msg)
	}
}

func TestValueReturnsWhatWasSeen(t *testing.T) {
	t.Parallel()
	var n atomic.Int32
	r := &recorder{TB: t}
	got := Value(r, 10*time.Second, "n reaches 4", func() int32 { return n.Add(1) }, func(v int32) bool { return v >= 4 })
	if got != 4 || r.msg != "" {
		t.Fatalf("got %d, msg %q", got, r.msg)
	}
	Value(r, 10*time.Millisecond, "n negative", func() int32 { return 7 }, func(v int32) bool { return v < 0 })
	if !strings.HasSuffix(r.msg, "last seen: 7") {
		t.Fatalf("failure %q: want the last value", r.msg)
	}
}

// A condition that only becomes true as the deadline passes still counts:
// the last poll runs at the deadline, not before it.
func TestForPollsAtTheDeadline(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	start := time.Now()
	timeout := 50 * time.Millisecond
	For(r, timeout, "the deadline", func() (bool, string) {
		return time.Since(start) >= timeout*RaceScale, ""
	})
	if r.msg != "" {
		t.Fatalf("failed at the deadline: %q", r.msg)
	}
}

func TestThroughout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		breakAt   int32 // the poll at which holds turns false; 0: never
		doneAt    int32 // the poll at which done turns true; 0: never
		timeout   time.Duration
		wantMsg   string // "" for no failure
		wantPolls int32
	}{
		{"holds until done", 0, 5, 10 * time.Second, "", 5},
		{"breaks before done", 3, 5, 10 * time.Second, "a quiet link: no longer so: flapped at 3", 3},
		{"never done", 0, 0, 20 * time.Millisecond, "the end never came", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var polls atomic.Int32
			r := &recorder{TB: t}
			Throughout(r, tc.timeout, "a quiet link", func() (bool, string) {
				n := polls.Add(1)
				return tc.breakAt == 0 || n < tc.breakAt, fmt.Sprintf("flapped at %d", n)
			}, func() (bool, string) {
				return tc.doneAt != 0 && polls.Load() >= tc.doneAt, fmt.Sprintf("%d rounds", polls.Load())
			})
			if tc.wantMsg == "" && r.msg != "" || !strings.Contains(r.msg, tc.wantMsg) {
				t.Errorf("failure %q, want %q", r.msg, tc.wantMsg)
			}
			if tc.wantPolls > 0 && polls.Load() != tc.wantPolls {
				t.Errorf("%d polls, want %d", polls.Load(), tc.wantPolls)
			}
		})
	}
}
