package demo

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/membership"
)

// The demo's gossip pool costs this machine a bounded amount of work at any
// fleet size: at most maxGossipAgents agents and the coordinator gossip,
// and together they probe at most 200 times a second, each probe with a
// timeout a loaded machine can meet.
func TestDemoGossipIsBounded(t *testing.T) {
	t.Parallel()
	for _, nodes := range []int{1, 8, 16, 64, 65, 500, 1000} {
		members := min(nodes, maxGossipAgents) + 1
		c := membership.LoopbackConfig("gpu-001")
		demoGossipTimings(&c, members)
		if err := c.Validate(); err != nil {
			t.Errorf("%d nodes: %v", nodes, err)
		}
		if rate := float64(members) / c.ProbeInterval.Seconds(); rate > 200 {
			t.Errorf("%d nodes: %d members probe %.0f times a second", nodes, members, rate)
		}
		if c.ProbeTimeout < 100*time.Millisecond || c.ProbeTimeout >= c.ProbeInterval {
			t.Errorf("%d nodes: probe timeout %s of interval %s", nodes, c.ProbeTimeout, c.ProbeInterval)
		}
	}
}

// TestDemoAtScale runs the whole scenario with FLEETCHECK_DEMO_NODES nodes
// (500 or 1000: docs/scale.md), a check of the demo on a loaded machine
// that takes a minute or more, so it runs only when asked.
func TestDemoAtScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("FLEETCHECK_DEMO_NODES"))
	if n == 0 {
		t.Skip("set FLEETCHECK_DEMO_NODES=500 (or 1000) to run the demo at scale")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var logs syncBuffer
	start := time.Now()
	res, err := Run(ctx, Options{Nodes: n, Seed: 1, Logger: Logger(&logs, false), DataDir: t.TempDir()})
	if err != nil {
		t.Fatalf("%v\n%.4000s", err, logs.String())
	}
	if res.Caught != len(res.Scenario.Faults) || res.Gossip == nil || !res.Gossip.StreamUp {
		t.Errorf("caught %d of %d faults; gossip step %+v", res.Caught, len(res.Scenario.Faults), res.Gossip)
	}
	if logs.String() != "" {
		t.Errorf("errors logged:\n%.4000s", logs.String())
	}
	t.Logf("%d nodes in %s", n, time.Since(start).Round(time.Second))
}
