package kit

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"
)

// stepClock is a settable clock for the breaker's window.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	ch <- c.Now().Add(d)
	return ch
}

func (c *stepClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestBreakerShareAndWindow(t *testing.T) {
	t.Parallel()
	clk := &stepClock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	b, err := NewBreaker(BreakerConfig{Window: time.Hour, MaxShare: 0.10}, clk)
	if err != nil {
		t.Fatal(err)
	}
	const fleet = 50 // limit 5
	for i, n := range []string{"n1", "n2", "n3", "n4", "n5"} {
		if err := b.Allow("rollout r-1", n, fleet); err != nil {
			t.Fatalf("drain %d: %v", i, err)
		}
		clk.advance(10 * time.Minute)
	}
	if err := b.Allow("sweep s-1", "n6", fleet); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("sixth drain: %v", err)
	}
	// The same node again counts once.
	if err := b.Allow("sweep s-1", "n5", fleet); err != nil {
		t.Fatalf("re-drain: %v", err)
	}
	if st := b.State(fleet); !st.Open || st.Drained != 5 || st.Limit != 5 {
		t.Fatalf("state %+v", st)
	}
	// n1 was drained 50 minutes ago; 10 more minutes and it leaves the window.
	clk.advance(10 * time.Minute)
	if err := b.Allow("sweep s-1", "n6", fleet); err != nil {
		t.Fatalf("after the window slid: %v", err)
	}
	// Release gives back a slot only to the campaign that took it.
	b.Release("rollout r-1", "n6")
	if st := b.State(fleet); st.Drained != 5 {
		t.Fatalf("release by another campaign: %+v", st)
	}
	b.Release("sweep s-1", "n6")
	if st := b.State(fleet); st.Drained != 4 {
		t.Fatalf("release: %+v", st)
	}
}

func TestBreakerCountAndSmallFleet(t *testing.T) {
	t.Parallel()
	clk := &stepClock{now: time.Unix(0, 0)}
	b, _ := NewBreaker(BreakerConfig{MaxShare: 0.05, MaxCount: 3}, clk)
	// 5 % of 4 nodes rounds to 0: one node may still be drained.
	if err := b.Allow("c", "a", 4); err != nil {
		t.Fatal(err)
	}
	if err := b.Allow("c", "b", 4); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("got %v", err)
	}
	// In a large fleet the count bounds.
	for _, n := range []string{"b", "c"} {
		if err := b.Allow("c", n, 1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Allow("c", "d", 1000); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("got %v", err)
	}
	var nilB *Breaker
	if err := nilB.Allow("c", "x", 1); err != nil {
		t.Fatal("nil breaker refused")
	}
}

func TestBreakerRestore(t *testing.T) {
	t.Parallel()
	clk := &stepClock{now: time.Unix(100000, 0)}
	b, _ := NewBreaker(BreakerConfig{Window: time.Hour, MaxCount: 2}, clk)
	now := clk.Now()
	b.Restore([]DrainRecord{
		{Node: "a", Campaign: "r", At: now.Add(-2 * time.Hour)}, // outside the window
		{Node: "b", Campaign: "r", At: now.Add(-30 * time.Minute)},
		{Node: "b", Campaign: "r", At: now.Add(-50 * time.Minute)}, // older duplicate
		{Node: "c", Campaign: "s", At: now.Add(-5 * time.Minute)},
	})
	recs := b.Records()
	if len(recs) != 2 || recs[0].Node != "b" || !recs[0].At.Equal(now.Add(-30*time.Minute)) || recs[1].Node != "c" {
		t.Fatalf("records %+v", recs)
	}
	if err := b.Allow("r", "d", 100); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("got %v", err)
	}
	for _, cfg := range []BreakerConfig{{Window: -1}, {MaxShare: 1.5}, {MaxCount: -1}} {
		if _, err := NewBreaker(cfg, nil); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

// The breaker's window is shown as a duration, never nanoseconds.
func TestBreakerStateJSON(t *testing.T) {
	t.Parallel()
	b, err := NewBreaker(BreakerConfig{Window: 90 * time.Minute, MaxCount: 2}, &stepClock{now: time.Unix(1e9, 0)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(b.State(10))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"window":"1h30m","drained":0,"limit":2,"fleet_size":10,"open":false}`; string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}
