package simfleet

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 2, 2, 0, 0, 0, time.UTC)

func TestSleepAdvancesAlone(t *testing.T) {
	t.Parallel()
	c := NewClock(t0)
	if err := c.Sleep(context.Background(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if got := c.Now(); !got.Equal(t0.Add(time.Hour)) {
		t.Fatalf("now = %v, want %v", got, t0.Add(time.Hour))
	}
}

// Goroutines joined before they start sleep from the same instant, however
// late the scheduler runs them.
func TestJoinedSleepersStartTogether(t *testing.T) {
	t.Parallel()
	c := NewClock(t0)
	c.Join() // the starter holds the clock while it starts workers
	var wg sync.WaitGroup
	ends := make([]time.Time, 50)
	for i := range ends {
		c.Join()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Leave()
			if i%2 == 0 {
				time.Sleep(time.Millisecond) // a slow starter
			}
			if err := c.Sleep(context.Background(), time.Duration(1+i%3)*time.Minute); err != nil {
				t.Error(err)
			}
			ends[i] = c.Now()
			// a second step starts when the first ends
			if err := c.Sleep(context.Background(), time.Minute); err != nil {
				t.Error(err)
			}
		}()
	}
	c.Leave()
	wg.Wait()
	for i, e := range ends {
		want := t0.Add(time.Duration(1+i%3) * time.Minute)
		if !e.Equal(want) {
			t.Errorf("worker %d woke at %v, want %v", i, e.Sub(t0), want.Sub(t0))
		}
	}
	if got := c.Now().Sub(t0); got != 4*time.Minute {
		t.Errorf("end = %v, want 4m", got)
	}
}

func TestCancelledSleepReleases(t *testing.T) {
	t.Parallel()
	c := NewClock(t0)
	ctx, cancel := context.WithCancel(context.Background())
	c.Join() // hold: the sleep below must not be advanced to
	done := make(chan error)
	go func() { done <- c.Sleep(ctx, time.Hour) }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	c.Leave()
	if c.Pending() != 0 {
		t.Fatalf("%d timers left", c.Pending())
	}
	if !c.Now().Equal(t0) {
		t.Fatalf("time moved to %v", c.Now())
	}
	// the clock still works
	if err := c.Sleep(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestAfterFiresWhenTimePasses(t *testing.T) {
	t.Parallel()
	c := NewClock(t0)
	ch := c.After(90 * time.Second)
	select {
	case <-ch:
		t.Fatal("fired early")
	default:
	}
	// A sleep beyond it carries time past it.
	if err := c.Sleep(context.Background(), 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-ch:
		if !at.Equal(t0.Add(90 * time.Second)) {
			t.Fatalf("fired at %v", at)
		}
	default:
		t.Fatal("not fired")
	}
	ch2 := c.After(time.Second)
	c.Advance(time.Second)
	<-ch2
}
