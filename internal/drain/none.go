package drain

import (
	"context"
	"fmt"
	"maps"
	"sync"
)

// None is the adapter for fleets without a scheduler fleetcheck may touch:
// it takes nothing out of service and only records what a campaign decided,
// in memory, and tells a callback. The simulator and tests also use it as a
// scheduler model: Set marks nodes drained by someone else or busy.
type None struct {
	mu       sync.Mutex
	nodes    map[string]Status
	onChange func(node string, st Status)
}

// NewNone returns a recording adapter; onChange (may be nil) is called
// after every change fleetcheck makes, outside the adapter's lock.
func NewNone(onChange func(node string, st Status)) *None {
	return &None{nodes: make(map[string]Status), onChange: onChange}
}

var (
	_ Adapter = (*None)(nil)
	_ Lister  = (*None)(nil)
)

// Drain records the node as drained by fleetcheck.
func (n *None) Drain(_ context.Context, node, reason string) error {
	if err := CheckNode(node); err != nil {
		return err
	}
	n.mu.Lock()
	st := n.nodes[node]
	if st.Drained && !st.ByFleetcheck {
		n.mu.Unlock()
		return fmt.Errorf("drain %s: %w (reason %q)", node, ErrNotOurs, st.Reason)
	}
	if st.Drained {
		n.mu.Unlock()
		return nil
	}
	st.Drained, st.ByFleetcheck, st.Reason = true, true, Reason(reason)
	n.nodes[node] = st
	n.mu.Unlock()
	n.notify(node, st)
	return nil
}

// Undrain records the node back in service when fleetcheck drained it.
func (n *None) Undrain(_ context.Context, node string) error {
	if err := CheckNode(node); err != nil {
		return err
	}
	n.mu.Lock()
	st := n.nodes[node]
	if !st.Drained {
		n.mu.Unlock()
		return nil
	}
	if !st.ByFleetcheck {
		n.mu.Unlock()
		return fmt.Errorf("undrain %s: %w (reason %q)", node, ErrNotOurs, st.Reason)
	}
	st.Drained, st.ByFleetcheck, st.Reason = false, false, ""
	n.nodes[node] = st
	n.mu.Unlock()
	n.notify(node, st)
	return nil
}

// Status returns what was recorded; an unknown node is in service.
func (n *None) Status(_ context.Context, node string) (Status, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.nodes[node], nil
}

// Unavailable lists the drained nodes.
func (n *None) Unavailable(context.Context) (map[string]Status, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]Status)
	for k, st := range n.nodes {
		if st.Drained {
			out[k] = st
		}
	}
	return out, nil
}

// Set overwrites a node's state as the scheduler (or a person) would: a
// drain by someone else (ByFleetcheck false), or running jobs.
func (n *None) Set(node string, st Status) {
	n.mu.Lock()
	n.nodes[node] = st
	n.mu.Unlock()
}

// Snapshot returns a copy of every recorded state.
func (n *None) Snapshot() map[string]Status {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.nodes)
}

func (n *None) notify(node string, st Status) {
	if n.onChange != nil {
		n.onChange(node, st)
	}
}
