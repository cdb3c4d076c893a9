// Package ratelimit bounds how often one key (an identity, a peer, a
// reason) gets something costly done for it: an audit row, a log line.
// What is let through is the caller's to do; what is not is counted by
// reason, so a metric still says how much was suppressed.
package ratelimit

import (
	"sync"
	"time"
)

// Keyed is a token bucket per key: Burst at once, then one every Every.
// It remembers at most MaxKeys keys; when full it forgets those whose
// bucket has refilled (they would start full anyway), or else the one
// with the most tokens left.
type Keyed struct {
	burst   float64
	every   time.Duration
	maxKeys int
	now     func() time.Time

	mu         sync.Mutex
	buckets    map[string]*bucket
	suppressed map[string]uint64 // by reason
}

type bucket struct {
	tokens float64
	at     time.Time
	held   uint64 // suppressed since the last one let through
}

// Options configure New; zero fields take the defaults.
type Options struct {
	Burst   int              // default 10
	Every   time.Duration    // default 30s
	MaxKeys int              // default 4096
	Now     func() time.Time // default time.Now
}

// New builds a Keyed limiter.
func New(o Options) *Keyed {
	if o.Burst <= 0 {
		o.Burst = 10
	}
	if o.Every <= 0 {
		o.Every = 30 * time.Second
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = 4096
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Keyed{burst: float64(o.Burst), every: o.Every, maxKeys: o.MaxKeys, now: o.Now,
		buckets: map[string]*bucket{}, suppressed: map[string]uint64{}}
}

// Allow takes a token from key's bucket. When it is empty it counts one
// suppressed under reason and says no; when it lets one through it also
// says how many of key's were suppressed since the last one let through.
func (k *Keyed) Allow(key, reason string) (ok bool, held uint64) {
	now := k.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	b := k.buckets[key]
	if b == nil {
		if len(k.buckets) >= k.maxKeys {
			k.evict(now)
		}
		b = &bucket{tokens: k.burst, at: now}
		k.buckets[key] = b
	}
	k.refill(b, now)
	if b.tokens < 1 {
		b.held++
		k.suppressed[reason]++
		return false, 0
	}
	b.tokens--
	held, b.held = b.held, 0
	return true, held
}

func (k *Keyed) refill(b *bucket, now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens += float64(d) / float64(k.every)
		if b.tokens > k.burst {
			b.tokens = k.burst
		}
		b.at = now
	}
}

func (k *Keyed) evict(now time.Time) {
	for key, b := range k.buckets {
		k.refill(b, now)
		if b.tokens >= k.burst {
			delete(k.buckets, key)
		}
	}
	if len(k.buckets) < k.maxKeys {
		return
	}
	// None idle: forget the one with the most tokens left, so the busiest
	// keys (a client hammering) are the last to get a fresh burst.
	var most string
	best := -1.0
	for key, b := range k.buckets {
		if b.tokens > best {
			most, best = key, b.tokens
		}
	}
	delete(k.buckets, most)
}

// Suppressed is how many Allow calls said no, by reason, since the start.
func (k *Keyed) Suppressed() map[string]uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]uint64, len(k.suppressed))
	for r, n := range k.suppressed {
		out[r] = n
	}
	return out
}
