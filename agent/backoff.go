package agent

import (
	"math/rand/v2"
	"time"
)

// Backoff says how long to wait before connection attempt number attempt
// (0 for the first retry). It is an interface so tests can make it fast
// and watch it.
type Backoff interface {
	Next(attempt int) time.Duration
}

// ExpBackoff is exponential backoff with full jitter: a uniform wait in
// [0, min(Max, Initial·2^attempt)]. Full jitter spreads a fleet's reconnects
// after a coordinator restart instead of having 1,000 agents knock at once.
type ExpBackoff struct {
	Initial time.Duration
	Max     time.Duration
}

// Next returns the wait before the given attempt.
func (b ExpBackoff) Next(attempt int) time.Duration {
	ceil := b.Initial
	for i := 0; i < attempt && ceil < b.Max; i++ {
		ceil *= 2
	}
	if ceil > b.Max {
		ceil = b.Max
	}
	if ceil <= 0 {
		return 0
	}
	return rand.N(ceil + 1)
}

// Longest is the ceiling of the waits, the wait after a refusal that
// retrying soon cannot cure.
func (b ExpBackoff) Longest() time.Duration { return b.Max }
