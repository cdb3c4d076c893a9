package drill

import (
	"context"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
)

// sleeper is a clock that can block its caller for simulated time (the
// simulator's virtual clock); waiting on After would not advance it.
type sleeper interface {
	Sleep(ctx context.Context, d time.Duration) error
}

// participant is a virtual clock that must know which goroutines take part
// in the simulation, so time moves only when all of them wait on it.
type participant interface {
	Join()
	Leave()
}

// sleepOn waits d on the clock, or until ctx ends.
func sleepOn(ctx context.Context, c kit.Clock, d time.Duration) error {
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

// goJoined starts fn in a goroutine that takes part in the clock's
// simulation when the clock asks for that.
func goJoined(c kit.Clock, fn func()) {
	p, ok := c.(participant)
	if ok {
		p.Join()
	}
	go func() {
		if ok {
			defer p.Leave()
		}
		fn()
	}()
}
