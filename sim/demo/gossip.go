package demo

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/internal/membership"
	"github.com/fleetcheck/fleetcheck/sim/faultnet"
)

// GossipStep is what the partition step measured.
type GossipStep struct {
	Node string `json:"node"`
	// Detected is how long after the cut the coordinator marked the node
	// unreachable from gossip; Cleared, how long after the heal it was
	// back in the state its results give.
	Detected string `json:"detected"`
	Cleared  string `json:"cleared"`
	Reason   string `json:"reason"`
	// StreamUp says the agent stream stayed connected throughout: gossip
	// alone saw the partition.
	StreamUp bool `json:"stream_up"`
}

// loopbackGossip binds and advertises 127.0.0.1 explicitly: memberlist
// left to itself advertises a non-loopback address.
func loopbackGossip() *membership.FileConfig {
	return &membership.FileConfig{Bind: "127.0.0.1:0", Advertise: "127.0.0.1", ClusterLabel: "fleetcheck-demo"}
}

// maxGossipAgents bounds how many of the demo's agents join the gossip
// pool. Every member probes another every probe interval and exchanges its
// whole state with one every push-pull interval, so the pool's work grows
// with its size; in production each member has a host of its own, in the
// demo all of them share this machine's cores. Beyond the bound agents
// run with gossip off, as an agent whose config has no gossip block does:
// their streams alone say they are alive.
const maxGossipAgents = 64

// demoGossipTimings detect a dead member within seconds, so the demo need
// not wait out production's 10 s suspicion timeout, yet leave a probe
// time to be answered on a loaded machine: they scale with the members
// sharing it (the coordinator and up to maxGossipAgents agents). A probe
// timeout a loaded machine cannot meet makes members suspect each other
// and dial streams they give up on before writing to them.
func demoGossipTimings(c *membership.Config, members int) {
	c.ProbeInterval = max(200*time.Millisecond, time.Duration(members)*10*time.Millisecond)
	c.ProbeTimeout = c.ProbeInterval / 2
	c.GossipInterval = max(50*time.Millisecond, c.ProbeInterval/4)
	c.SuspicionMult = 3
	c.PushPullInterval = max(2*time.Second, time.Duration(members)*50*time.Millisecond)
	c.RejoinInterval = 300 * time.Millisecond
}

// partitionStep cuts one healthy node's gossip, waits for the coordinator
// to mark it unreachable, heals, and waits for it to be healthy again.
func partitionStep(ctx context.Context, srv *coordinator.Server, faults *faultnet.Network, node string, say func(string, ...any)) (*GossipStep, error) {
	pool := srv.GossipPool()
	if pool == nil {
		return nil, fmt.Errorf("demo: gossip is off on the coordinator")
	}
	st := srv.Store()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	poll := func(what string, cond func() bool) error {
		for !cond() {
			select {
			case <-ctx.Done():
				return fmt.Errorf("demo: waiting for %s: %w", what, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
		return nil
	}
	var addr string
	if err := poll(node+" in the gossip pool", func() bool {
		m, ok := pool.Member(node)
		addr = m.Addr
		return ok && m.State == membership.StateAlive
	}); err != nil {
		return nil, err
	}
	step := &GossipStep{Node: node, StreamUp: true}
	say("partitioning %s's gossip (%s); its agent stream stays up", node, addr)
	cut := time.Now()
	faults.Partition(addr)
	if err := poll(node+" unreachable", func() bool {
		n, err := st.Node(ctx, node)
		if err == nil && !n.Connected {
			step.StreamUp = false
		}
		if err == nil && n.State == coordinator.StateUnreachable && strings.HasPrefix(n.StateReason, "gossip:") {
			step.Reason = n.StateReason
			return true
		}
		return false
	}); err != nil {
		return nil, err
	}
	step.Detected = time.Since(cut).Round(time.Millisecond).String()
	say("%s unreachable after %s: %s", node, step.Detected, step.Reason)
	healed := time.Now()
	faults.Heal()
	if err := poll(node+" healthy again", func() bool {
		n, err := st.Node(ctx, node)
		return err == nil && n.State == coordinator.StateHealthy
	}); err != nil {
		return nil, err
	}
	step.Cleared = time.Since(healed).Round(time.Millisecond).String()
	say("healed: %s rejoined and is healthy again after %s (gossip is a hint: nothing was drained)", node, step.Cleared)
	return step, nil
}
