package kit

import (
	"context"
	"regexp"
	"testing"
	"time"
)

// countingClock is a stand-in virtual clock that counts its participants.
type countingClock struct {
	WallClock
	active, slept int
}

func (c *countingClock) Join()  { c.active++ }
func (c *countingClock) Leave() { c.active-- }
func (c *countingClock) Sleep(_ context.Context, d time.Duration) error {
	c.slept += int(d)
	return nil
}

func TestSleepUsesTheVirtualClock(t *testing.T) {
	c := &countingClock{}
	if !Virtual(c) || Virtual(WallClock{}) {
		t.Fatal("Virtual: the counting clock is virtual, the wall clock is not")
	}
	if err := Sleep(context.Background(), c, time.Hour); err != nil || c.slept != int(time.Hour) {
		t.Fatalf("Sleep on a virtual clock: err %v, slept %v", err, time.Duration(c.slept))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Sleep(ctx, WallClock{}, time.Hour); err != context.Canceled {
		t.Fatalf("Sleep on the wall clock with a cancelled context = %v", err)
	}
}

func TestGoJoinsBeforeStarting(t *testing.T) {
	c := &countingClock{}
	release := make(chan struct{})
	done := make(chan struct{})
	Go(c, func() { <-release; close(done) })
	if c.active != 1 {
		t.Fatalf("after Go the goroutine takes part: active %d, want 1", c.active)
	}
	close(release)
	<-done
}

func TestNewID(t *testing.T) {
	at := time.Date(2026, 3, 2, 2, 0, 0, 0, time.FixedZone("x", 3600))
	a, b := NewID("b", at), NewID("b", at)
	if !regexp.MustCompile(`^b-20260302T010000Z-[0-9a-f]{6}$`).MatchString(a) {
		t.Errorf("NewID = %q", a)
	}
	if a == b {
		t.Errorf("two ids in the same second are equal: %q", a)
	}
}
