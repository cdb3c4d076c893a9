package console

import (
	"net"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/ratelimit"
)

// Bounds on guessing tokens: a host's wrong tokens are let through
// guessBurst at once, then one every guessEvery; past that the host is
// refused (429) for guessLockout, right or wrong, before any lookup.
const (
	guessBurst   = 10
	guessEvery   = 6 * time.Second
	guessLockout = time.Minute
	guessHosts   = 4096
)

type guard struct {
	now func() time.Time
	lim *ratelimit.Keyed

	mu    sync.Mutex
	until map[string]time.Time
}

func newGuard(now func() time.Time) *guard {
	return &guard{now: now, until: map[string]time.Time{},
		lim: ratelimit.New(ratelimit.Options{Burst: guessBurst, Every: guessEvery, MaxKeys: guessHosts, Now: now})}
}

func hostOf(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}

// locked reports whether the host may not try a token now.
func (g *guard) locked(remote string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.now().Before(g.until[hostOf(remote)])
}

// failed counts a wrong token from the host.
func (g *guard) failed(remote string) {
	h := hostOf(remote)
	if ok, _ := g.lim.Allow(h, "console_token"); ok {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if len(g.until) >= guessHosts {
		for k, t := range g.until {
			if !now.Before(t) {
				delete(g.until, k)
			}
		}
	}
	if len(g.until) < guessHosts {
		g.until[h] = now.Add(guessLockout)
	}
}
