package coordinator

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/membership"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// Node states (docs/design.md, issue 3).
const (
	StateInitializing = "initializing" // joined, no full result yet: never shown healthy
	StateHealthy      = "healthy"
	StateDegraded     = "degraded" // a check warns or errors
	StateFailed       = "failed"   // a check fails
	StateUnreachable  = "unreachable"
	StateLeft         = "left"     // its agent stopped cleanly (said Goodbye) and has not come back
	StateDraining     = "draining" // reserved for campaigns
	StateDrained      = "drained"  // reserved for campaigns
)

// States lists every node state, in the order listings group them.
func States() []string {
	return []string{StateFailed, StateDegraded, StateUnreachable, StateLeft, StateInitializing, StateDraining, StateDrained, StateHealthy}
}

// campaignOwned states are set by campaigns; results and streams do not
// move a node out of them.
func campaignOwned(state string) bool { return state == StateDraining || state == StateDrained }

// deriveState computes a node's state from the newest status of each of its
// checks. A fail anywhere is failed; before the first full result a node is
// initializing (never healthy); after it, warn or error is degraded.
func deriveState(checks map[string]store.CheckState, hasFull bool) (string, string) {
	var fails, degr []store.CheckState
	skipped := 0
	for _, c := range checks {
		switch c.Status {
		case report.Fail:
			fails = append(fails, c)
		case report.Error, report.Warn:
			degr = append(degr, c)
		case report.Skip:
			skipped++
		}
	}
	switch {
	case len(fails) > 0:
		return StateFailed, describe(fails)
	case !hasFull:
		return StateInitializing, "waiting for the first full result"
	case len(degr) > 0:
		return StateDegraded, describe(degr)
	}
	if skipped > 0 {
		// Skipped checks measured nothing: say so rather than "all pass".
		return StateHealthy, fmt.Sprintf("pass (%d skipped)", skipped)
	}
	return StateHealthy, "all checks pass"
}

// describe says "gpu.ecc fail: GPU3 ECC_UNCORRECTABLE; ib.ports warn: ...",
// worst first, at most three checks.
func describe(cs []store.CheckState) string {
	store.SortChecksWorstFirst(cs)
	var parts []string
	for i, c := range cs {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(cs)-3))
			break
		}
		p := c.Name + " " + string(c.Status)
		if c.Detail != "" {
			p += ": " + c.Detail
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// failingChecks names the checks whose newest status is not pass or skip,
// worst first.
func failingChecks(cs []store.CheckState) []string {
	cs = append([]store.CheckState(nil), cs...)
	store.SortChecksWorstFirst(cs)
	var out []string
	for _, c := range cs {
		switch c.Status {
		case report.Fail, report.Error, report.Warn:
			out = append(out, c.Name)
		}
	}
	return out
}

// nodeEntry is the coordinator's live view of one node. Its mutex orders
// the node's state decisions and their writes to the store, so no global
// lock is held while one node's state is stored.
type nodeEntry struct {
	name string

	mu      sync.Mutex
	labels  map[string]string
	state   string
	reason  string
	checks  map[string]store.CheckState
	hasFull bool
	sess    *session // the current stream, nil when none
	// back is closed when a stream attaches: a call waiting out a lost
	// stream's grace resends at once instead of at the grace's end.
	back chan struct{}

	// What gossip last said of the node's member (gossip.go): a hint that
	// only liveState reads. The zero value, alive, says nothing.
	gossip      membership.State
	gossipSince time.Time
	gossipMeta  membership.Meta
	// gossipGen counts membership events about the member, so that a death
	// waiting for confirmation knows whether anything came after it.
	gossipGen uint64
}

func (e *nodeEntry) load(n store.Node) {
	e.labels = n.Labels
	e.state, e.reason = n.State, n.StateReason
	e.hasFull = n.HasFull
	e.checks = make(map[string]store.CheckState, len(n.Checks))
	for _, c := range n.Checks {
		e.checks[c.Name] = c
	}
}

// backSignal returns a channel closed when the node's next stream
// attaches. Held: e.mu.
func (e *nodeEntry) backSignal() <-chan struct{} {
	if e.back == nil {
		e.back = make(chan struct{})
	}
	return e.back
}

// attached wakes the calls waiting for a new stream. Held: e.mu.
func (e *nodeEntry) attached() {
	if e.back != nil {
		close(e.back)
		e.back = nil
	}
}

// merge applies a stored result's checks; an older result never overrides
// a newer status (a spool delivers late).
func (e *nodeEntry) merge(r *store.Result) {
	for _, c := range r.Checks {
		if prev, ok := e.checks[c.Name]; ok && !prev.Newer(r.ID, r.Finished) {
			continue
		}
		e.checks[c.Name] = store.CheckState{Name: c.Name, Status: c.Status, Detail: store.CheckDetail(c),
			ResultID: r.ID, Finished: r.Finished}
	}
	if r.Full {
		e.hasFull = true
	}
}

// registry holds every known node and its current stream.
type registry struct {
	mu    sync.RWMutex
	nodes map[string]*nodeEntry
}

func newRegistry() *registry { return &registry{nodes: make(map[string]*nodeEntry)} }

// entry returns the node's entry, creating it.
func (r *registry) entry(name string) *nodeEntry {
	r.mu.RLock()
	e := r.nodes[name]
	r.mu.RUnlock()
	if e != nil {
		return e
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e = r.nodes[name]; e == nil {
		e = &nodeEntry{name: name, checks: map[string]store.CheckState{}}
		r.nodes[name] = e
	}
	return e
}

func (r *registry) lookup(name string) *nodeEntry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.nodes[name]
}

// all returns a snapshot of the entries; callers lock each entry themselves.
func (r *registry) all() []*nodeEntry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*nodeEntry, 0, len(r.nodes))
	for _, e := range r.nodes {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// sessions returns the current streams.
func (r *registry) sessions() []*session {
	entries := r.all()
	out := make([]*session, 0, len(entries))
	for _, e := range entries {
		e.mu.Lock()
		if e.sess != nil {
			out = append(out, e.sess)
		}
		e.mu.Unlock()
	}
	return out
}
