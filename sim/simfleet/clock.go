package simfleet

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
)

// Clock is a discrete-event virtual clock. Simulated time moves only when
// every goroutine taking part in the simulation is blocked on the clock; it
// then jumps straight to the earliest pending sleep, so an hour-long sweep
// takes as long as the code that drives it.
//
// Goroutines take part by calling Join (and Leave when they stop) or,
// implicitly, by sleeping: Sleep counts its caller as blocked while it waits
// and as running once it wakes. A caller that starts several goroutines Joins
// each of them before starting it, so the clock cannot move on while some of
// them have not begun to sleep yet: concurrently started work then begins at
// the same simulated instant, and simulated durations do not depend on
// goroutine scheduling. sweep.Engine does this when its clock has Join and
// Leave.
//
// After is a plain timer for kit.Clock: it fires when simulated time
// passes it, but waiting on it does not count as blocked, so time is never
// advanced to reach it. Code that waits inside the simulation uses Sleep.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers timerHeap
	// active counts goroutines taking part that are not blocked in Sleep.
	// It goes below zero when a goroutine that never joined sleeps: nobody
	// holds the clock then.
	active int
}

var _ kit.Clock = (*Clock)(nil)

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start}
}

type timer struct {
	at      time.Time
	seq     uint64 // FIFO among timers due at the same instant
	ch      chan time.Time
	sleeper bool // a Sleep: its goroutine runs again once it fires
	fired   bool
	index   int
}

type timerHeap []*timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *timerHeap) Push(x any) {
	t := x.(*timer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	t.index = -1
	return t
}

// Now is the simulated time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives the simulated time once d has
// passed. The clock does not advance to reach it by itself (see Clock).
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.addLocked(d, false)
	if d <= 0 {
		c.fireLocked(t)
	}
	return t.ch
}

// Join counts one more goroutine as taking part and running.
func (c *Clock) Join() {
	c.mu.Lock()
	c.active++
	c.mu.Unlock()
}

// Leave counts one goroutine fewer; when no participant is left running,
// simulated time moves to the next sleep that is due.
func (c *Clock) Leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active--
	c.advanceLocked()
}

// Sleep blocks until d has passed on the clock or ctx ends. While it
// waits its caller counts as blocked.
func (c *Clock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	c.mu.Lock()
	t := c.addLocked(d, true)
	c.active--
	c.advanceLocked()
	c.mu.Unlock()
	select {
	case <-t.ch:
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		defer c.mu.Unlock()
		if !t.fired {
			// Whoever fires a sleep counts its goroutine as running again;
			// a cancelled sleep does that itself.
			heap.Remove(&c.timers, t.index)
			t.fired = true
			c.active++
		}
		return ctx.Err()
	}
}

// Advance moves simulated time forward by d, firing every timer due on the
// way in order. Tests drive plain After timers with it.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	end := c.now.Add(d)
	for len(c.timers) > 0 && !c.timers[0].at.After(end) {
		t := heap.Pop(&c.timers).(*timer)
		if t.at.After(c.now) {
			c.now = t.at
		}
		c.fireLocked(t)
	}
	if end.After(c.now) {
		c.now = end
	}
}

// Pending counts timers that have not fired.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

func (c *Clock) addLocked(d time.Duration, sleeper bool) *timer {
	c.seq++
	t := &timer{at: c.now.Add(max(d, 0)), seq: c.seq, ch: make(chan time.Time, 1), sleeper: sleeper}
	if d > 0 {
		heap.Push(&c.timers, t)
	}
	return t
}

func (c *Clock) fireLocked(t *timer) {
	t.fired = true
	if t.sleeper {
		c.active++
	}
	t.ch <- c.now // buffered, never blocks
}

// advanceLocked jumps to the earliest sleep once no participant runs, and
// fires everything due at that instant: the sleepers woken together run
// concurrently, as the simulated tests they stand for did.
func (c *Clock) advanceLocked() {
	if c.active > 0 {
		return
	}
	// Plain timers are fired on the way but never waited for: only a sleep
	// decides where time goes next.
	next := -1
	for i, t := range c.timers {
		if t.sleeper && (next < 0 || c.timers.Less(i, next)) {
			next = i
		}
	}
	if next < 0 {
		return
	}
	at := c.timers[next].at
	for len(c.timers) > 0 && !c.timers[0].at.After(at) {
		t := heap.Pop(&c.timers).(*timer)
		if t.at.After(c.now) {
			c.now = t.at
		}
		c.fireLocked(t)
	}
}
