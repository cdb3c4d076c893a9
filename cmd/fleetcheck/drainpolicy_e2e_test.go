package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
)

// TestDrillOutOfServiceByDrainPolicy: with a drain policy in the
// coordinator's config, a drill expecting the node out of service (as
// examples/drill.yaml does) sees the coordinator take it out as the
// agent's results arrive — no scheduler plays the part — and, with the
// record-only adapter, bring it back once the fault is reverted.
func TestDrillOutOfServiceByDrainPolicy(t *testing.T) {
	nodes := e2eRack(2, "r12", nil)
	nodes[1].labels["fleetcheck.io/drill"] = "allowed"
	nodes[1].interval = time.Second
	f := newE2EFleetWith(t, newE2EClock(1), func(c *coordinator.Config) {
		c.Drain.Policy = coordinator.DrainPolicyConfig{Codes: []string{"IB_PORT_DOWN"}}
		c.Breaker = coordinator.BreakerConfig{MaxCount: 1}
	}, nodes...)

	spec := e2eWriteSpec(t, "drill.yaml", `
name: e2e-policy
fault: ib-port-down
params: {hca: mlx5_4, port: "1"}
expect: {check: ib.ports, code: IB_PORT_DOWN, out_of_service: true, out_of_service_within: 20s}
targets: name=gpu-002
deadline: 40s
poll_interval: 1s
watch: [gpu.inventory, gpu.ecc, gpu.xid, ib.ports]
revert_after: 1m
revert_on_disconnect: 30s
recover_grace: 20s
`)
	id := e2eStartedID(t, "drill", f.cli("drill", "start", "-f", spec))
	d := e2ePoll(f, 40*time.Second, "the drill to finish", func() e2eDrill { return e2eJSON[e2eDrill](f, "drill", "status", id) },
		func(d e2eDrill) bool { return d.State != "running" })
	tg := d.Targets[0]
	if d.State != "done" || tg.OutOfServiceAt.IsZero() || tg.OutOfServiceAt.Before(tg.DetectedAt) || len(tg.Findings) != 0 || tg.RecoveredAt.IsZero() {
		t.Fatalf("drill: %+v", d)
	}
	// Through the adapter, with the policy's reason; back once healthy.
	log := f.drainLog("gpu-002")
	if len(log) != 2 || !strings.HasPrefix(log[0], "drain fleetcheck: policy: ib.ports: mlx5_4/1 IB_PORT_DOWN") || log[1] != "undrain" {
		t.Errorf("drain log %q", log)
	}
	if !f.hasAudit("drain-policy", "drain: through none: ib.ports") {
		t.Errorf("no audit of the policy's drain: %q", f.auditEvents())
	}
	evs, err := f.srv.Store().Events(context.Background(), store.EventQuery{Node: "gpu-002", Kind: store.EventStateChange, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs, func(e store.Event) bool {
		return strings.Contains(e.Message, "-> drained: drain policy through none: ib.ports")
	}) {
		t.Errorf("no state change to drained with the policy's reason: %+v", evs)
	}
	f.waitFor(10*time.Second, "gpu-002 healthy again", func() bool {
		n, err := f.srv.Store().Node(context.Background(), "gpu-002")
		return err == nil && n.State == coordinator.StateHealthy
	})
	if out := f.cli("nodes"); !e2eHasLine(out, `^NODE\s+STATE.*OUT-OF-SERVICE`) || !e2eHasLine(out, `^gpu-002\s+healthy\s.*\s-$`) {
		t.Errorf("nodes:\n%s", out)
	}
}
