package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestDemoCatchesEveryInjectedFault runs the whole scenario: a real
// coordinator, real agents over loopback gRPC, simulated nodes. Every
// injected fault must be caught by the check meant to catch it, and every
// other node must end healthy.
func TestDemoCatchesEveryInjectedFault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := Run(ctx, Options{Nodes: 8, Seed: 7, Logger: zerolog.Nop(), DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Scenario.Faults) != len(faultPlan) {
		t.Fatalf("%d faults injected, want %d", len(res.Scenario.Faults), len(faultPlan))
	}
	if res.Caught != len(res.Scenario.Faults) {
		t.Errorf("caught %d of %d faults: %+v", res.Caught, len(res.Scenario.Faults), res.Nodes)
	}
	faulted := map[string]bool{}
	for _, f := range res.Scenario.Faults {
		faulted[f.Node] = true
	}
	if len(res.Nodes) != 8 {
		t.Fatalf("%d nodes in result", len(res.Nodes))
	}
	for _, n := range res.Nodes {
		switch {
		case faulted[n.Name] && n.State != "failed" && n.State != "degraded":
			t.Errorf("%s was faulted but is %s", n.Name, n.State)
		case !faulted[n.Name] && (n.State != "healthy" || len(n.FailingChecks) > 0):
			t.Errorf("%s is %s with %v, want healthy", n.Name, n.State, n.FailingChecks)
		}
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "injected faults caught") || !strings.Contains(buf.String(), "gossip partition of") {
		t.Errorf("table:\n%s", buf.String())
	}
	// The partition step: gossip alone saw it, and it was only a hint.
	g := res.Gossip
	if g == nil {
		t.Fatal("no gossip partition step with 8 nodes")
	}
	if faulted[g.Node] || !g.StreamUp || !strings.HasPrefix(g.Reason, "gossip:") {
		t.Errorf("gossip step = %+v, want a healthy node cut with its stream up and a gossip reason", g)
	}
}
