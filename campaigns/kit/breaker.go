package kit

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// ErrBreakerOpen is returned by Breaker.Allow when one more drain would
// take more of the fleet out than the breaker allows within its window.
var ErrBreakerOpen = errors.New("drain circuit breaker open")

// BreakerConfig bounds how much of the fleet campaigns may drain.
type BreakerConfig struct {
	// Window is the sliding window drains are counted over (default 1h).
	Window time.Duration
	// MaxShare is the largest share of the fleet (0..1] that campaigns may
	// drain within the window; 0 leaves the share unbounded.
	MaxShare float64
	// MaxCount is the largest number of nodes campaigns may drain within
	// the window; 0 leaves the count unbounded.
	MaxCount int
}

// DrainRecord is one drain a campaign made: the breaker's memory, and what
// a campaign persists to rebuild it after a restart.
type DrainRecord struct {
	Node     string    `json:"node"`
	Campaign string    `json:"campaign"`
	At       time.Time `json:"at"`
}

// BreakerState is the breaker as an operator sees it.
type BreakerState struct {
	Window    config.Duration `json:"window"`
	Drained   int             `json:"drained"` // distinct nodes drained within the window
	Limit     int             `json:"limit"`   // -1: unbounded
	FleetSize int             `json:"fleet_size"`
	Open      bool            `json:"open"` // no further drain is allowed now
}

// Breaker is the circuit breaker every campaign asks before draining a
// node: a sweep that starts failing every node, or a rollout whose
// validation is wrong, stops at the limit instead of draining the fleet.
//
// It counts distinct nodes drained by campaigns within a sliding window,
// whether or not they are back in service: the point is the rate of
// drains, since a bad rule drains node after node. The limit is the
// smaller of MaxCount and MaxShare of the fleet (at least one node, so a
// small fleet is never locked out by rounding).
//
// Several coordinators: Share puts the window in a ledger table of
// their PostgreSQL store, so that they count against one limit, not one
// each (breaker_shared.go).
//
// Durability: the breaker keeps its records in memory. Each campaign
// persists the drains it made (a rollout keeps them in its node rows) and
// hands them back with Restore when the coordinator starts, so the window
// survives a restart. Records older than the window are forgotten. A nil
// *Breaker allows everything.
type Breaker struct {
	cfg   BreakerConfig
	clock Clock

	mu   sync.Mutex
	recs map[string]DrainRecord // by node: the latest drain (with Share: a mirror of the ledger's)

	// shared, when set (Share), is the PostgreSQL database whose ledger
	// holds the window for every coordinator on it (breaker_shared.go).
	shared *sqldb.DB
	pushed map[string]time.Time // restored records already written to the ledger
}

// NewBreaker returns a breaker; clock may be nil for the wall clock.
func NewBreaker(cfg BreakerConfig, clock Clock) (*Breaker, error) {
	if cfg.Window == 0 {
		cfg.Window = time.Hour
	}
	if cfg.Window < 0 {
		return nil, fmt.Errorf("breaker: negative window %v", cfg.Window)
	}
	if cfg.MaxShare < 0 || cfg.MaxShare > 1 || math.IsNaN(cfg.MaxShare) {
		return nil, fmt.Errorf("breaker: max share %v outside 0..1", cfg.MaxShare)
	}
	if cfg.MaxCount < 0 {
		return nil, fmt.Errorf("breaker: negative max count %d", cfg.MaxCount)
	}
	if clock == nil {
		clock = WallClock{}
	}
	return &Breaker{cfg: cfg, clock: clock, recs: make(map[string]DrainRecord)}, nil
}

// limit is the number of distinct nodes the window may hold; -1 is
// unbounded.
func (b *Breaker) limit(fleetSize int) int {
	lim := -1
	if b.cfg.MaxShare > 0 {
		lim = max(1, int(math.Floor(b.cfg.MaxShare*float64(fleetSize))))
	}
	if b.cfg.MaxCount > 0 && (lim < 0 || b.cfg.MaxCount < lim) {
		lim = b.cfg.MaxCount
	}
	return lim
}

// prune forgets records older than the window. Callers hold mu.
func (b *Breaker) prune(now time.Time) {
	cut := now.Add(-b.cfg.Window)
	for n, r := range b.recs {
		if !r.At.After(cut) {
			delete(b.recs, n)
		}
	}
}

// Allow asks whether campaign may drain node in a fleet of fleetSize
// nodes. When it may, the drain is recorded at once (so two campaigns
// asking together cannot both take the last slot) and Allow returns nil;
// otherwise it returns an error wrapping ErrBreakerOpen. A node drained
// again within the window counts once. A campaign that then fails to drain
// the node gives the slot back with Release.
func (b *Breaker) Allow(campaign, node string, fleetSize int) error {
	if b == nil {
		return nil
	}
	if b.shared != nil {
		return b.allowShared(campaign, node, fleetSize)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	b.prune(now)
	if _, again := b.recs[node]; !again {
		if lim := b.limit(fleetSize); lim >= 0 && len(b.recs)+1 > lim {
			return fmt.Errorf("drain %s for %s: %w: %d of %d nodes drained by campaigns within %v (limit %d)",
				node, campaign, ErrBreakerOpen, len(b.recs), fleetSize, b.cfg.Window, lim)
		}
	}
	b.recs[node] = DrainRecord{Node: node, Campaign: campaign, At: now}
	return nil
}

// Release forgets the record Allow made for a drain that did not happen.
func (b *Breaker) Release(campaign, node string) {
	if b == nil {
		return
	}
	if b.shared != nil {
		b.releaseShared(campaign, node)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if r, ok := b.recs[node]; ok && r.Campaign == campaign {
		delete(b.recs, node)
	}
}

// Restore adds persisted drain records (after a restart). For a node with
// several records the latest counts; records outside the window are
// dropped.
func (b *Breaker) Restore(recs []DrainRecord) {
	if b == nil {
		return
	}
	if b.shared != nil {
		b.restoreShared(recs)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range recs {
		if old, ok := b.recs[r.Node]; !ok || r.At.After(old.At) {
			b.recs[r.Node] = r
		}
	}
	b.prune(b.clock.Now())
}

// Records returns the drains within the window, oldest first.
func (b *Breaker) Records() []DrainRecord {
	if b == nil {
		return nil
	}
	if b.shared != nil {
		if recs, err := b.sharedRecords(); err == nil {
			return recs
		} // else the mirror: what this coordinator last knew
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(b.clock.Now())
	out := make([]DrainRecord, 0, len(b.recs))
	for _, r := range b.recs {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].At.Equal(out[j].At) {
			return out[i].At.Before(out[j].At)
		}
		return out[i].Node < out[j].Node
	})
	return out
}

// State reports the window's count against the limit for a fleet size.
func (b *Breaker) State(fleetSize int) BreakerState {
	if b == nil {
		return BreakerState{Limit: -1, FleetSize: fleetSize}
	}
	drained := -1
	if b.shared != nil {
		if recs, err := b.sharedRecords(); err == nil {
			drained = len(recs)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(b.clock.Now())
	if drained < 0 {
		drained = len(b.recs)
	}
	lim := b.limit(fleetSize)
	return BreakerState{
		Window:    config.Duration(b.cfg.Window),
		Drained:   drained,
		Limit:     lim,
		FleetSize: fleetSize,
		Open:      lim >= 0 && drained >= lim,
	}
}
