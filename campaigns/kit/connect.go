package kit

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Connect grace: how long a campaign waits for a node's agent to come
// back when the node's turn comes and the agent is not connected. After a
// coordinator restart every agent reconnects with full-jitter backoff of
// up to the agent's reconnect.max (30s by default, agent.DefaultReconnectMax),
// so the default leaves room for four such waits.
const (
	DefaultConnectGrace = 2 * time.Minute
	MinConnectGrace     = 5 * time.Second
	MaxConnectGrace     = 24 * time.Hour
)

// CheckConnectGrace fills the default for zero and checks the range; the
// error names no field, the caller does.
func CheckConnectGrace(d *time.Duration) error {
	if *d == 0 {
		*d = DefaultConnectGrace
	}
	if *d < MinConnectGrace || *d > MaxConnectGrace {
		return fmt.Errorf("%v: want from %v to %v (agents reconnect with backoff of up to reconnect.max, 30s by default)",
			*d, MinConnectGrace, MaxConnectGrace)
	}
	return nil
}

// LookupNode asks the fleet about one node at this moment: campaigns
// decide a node's connectivity when its turn comes, never from a listing
// taken a poll interval earlier. ok is false when the fleet does not know
// the node.
func LookupNode(ctx context.Context, f Fleet, name string) (n Node, ok bool, err error) {
	nodes, err := f.Nodes(ctx, "name="+name)
	if err != nil {
		return Node{}, false, fmt.Errorf("look up %s: %w", name, err)
	}
	for _, n := range nodes {
		if n.Name == name {
			return n, true, nil
		}
	}
	return Node{}, false, nil
}

// ConnectWaits remembers since when each node's turn has been waiting for
// its agent. It lives in memory on purpose: a restarted coordinator gives
// every agent a fresh grace, since they all had to reconnect to it.
// Safe for concurrent use.
type ConnectWaits struct {
	mu    sync.Mutex
	since map[string]time.Time
}

// Wait records that key (a campaign and node) found its agent not
// connected at now and reports since when it has waited and whether the
// grace is over.
func (w *ConnectWaits) Wait(key string, now time.Time, grace time.Duration) (since time.Time, over bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.since == nil {
		w.since = map[string]time.Time{}
	}
	since, ok := w.since[key]
	if !ok {
		since = now
		w.since[key] = now
	}
	return since, now.Sub(since) >= grace
}

// Since reports since when key has waited (zero: it is not waiting).
func (w *ConnectWaits) Since(key string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.since[key]
}

// Done forgets key: its agent is back, or the wait ended.
func (w *ConnectWaits) Done(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.since, key)
}

// WaitingNote is the status line of a node waiting for its agent.
func WaitingNote(since time.Time, grace time.Duration) string {
	return fmt.Sprintf("waiting for the agent to reconnect (not connected since its turn at %s; waits up to %v)",
		since.UTC().Format(time.RFC3339), grace)
}

// GaveUpNote is the reason of a node whose agent did not come back.
func GaveUpNote(grace time.Duration) string {
	return fmt.Sprintf("agent not connected: waited %v after its turn came", grace)
}
