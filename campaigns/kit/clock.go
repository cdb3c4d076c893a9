package kit

import (
	"context"
	"time"
)

// Clock is time as a campaign sees it: the wall clock in production, a
// virtual clock (sim/simfleet.Clock) in tests and the demo, so simulated
// hours take milliseconds.
type Clock interface {
	Now() time.Time
	// After fires once d has passed on this clock.
	After(d time.Duration) <-chan time.Time
}

// WallClock is the real clock.
type WallClock struct{}

// Now is time.Now.
func (WallClock) Now() time.Time { return time.Now() }

// After is time.After.
func (WallClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// OrWall is c, or the wall clock when c is nil.
func OrWall(c Clock) Clock {
	if c == nil {
		return WallClock{}
	}
	return c
}

// sleeper is a virtual clock that blocks its caller for simulated time:
// waiting on its After would not advance it.
type sleeper interface {
	Sleep(ctx context.Context, d time.Duration) error
}

// participant is a virtual clock that must know which goroutines take
// part in the simulation: time moves only when all of them wait on it.
type participant interface {
	Join()
	Leave()
}

// Virtual reports whether c is a virtual clock that moves only when every
// goroutine taking part waits on it (Join, Leave and Sleep matter then).
func Virtual(c Clock) bool {
	_, p := c.(participant)
	_, s := c.(sleeper)
	return p && s
}

// Sleep waits d on the clock, or until ctx ends. On a virtual clock the
// caller counts as blocked while it waits, so simulated time moves on.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	if s, ok := c.(sleeper); ok {
		return s.Sleep(ctx, d)
	}
	select {
	case <-c.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Join counts the calling goroutine as taking part in a virtual clock's
// simulation (no-op on other clocks); Leave undoes it.
func Join(c Clock) {
	if p, ok := c.(participant); ok {
		p.Join()
	}
}

// Leave undoes Join.
func Leave(c Clock) {
	if p, ok := c.(participant); ok {
		p.Leave()
	}
}

// Go starts fn in a goroutine that takes part in the clock's simulation
// from before it starts (so time cannot move on while it has not begun)
// until it returns.
func Go(c Clock, fn func()) {
	Join(c)
	go func() {
		defer Leave(c)
		fn()
	}()
}
