package slurm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/drain/slurm/slurmtest"
	"github.com/fleetcheck/fleetcheck/internal/runcmd"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// TestRealSlurm drives the adapter against a real slurmctld and slurmd
// (slurmtest): what scontrol and sinfo really print, not what the fakes
// say they print. One cluster, one node, so the parts run in order.
func TestRealSlurm(t *testing.T) {
	c := slurmtest.Start(t, slurmtest.Config{})
	a := New(Options{Env: c.Env, Timeout: 20 * time.Second})
	ctx := context.Background()
	node := slurmtest.NodeName

	t.Run("drain with the fleetcheck prefix and resume", func(t *testing.T) {
		if err := a.Drain(ctx, node, "gpu.ecc: GPU 3 uncorrectable ECC errors"); err != nil {
			t.Fatal(err)
		}
		state, reason := c.Node()
		if state != "IDLE+DRAIN" || reason != "fleetcheck: gpu.ecc: GPU 3 uncorrectable ECC errors" {
			t.Fatalf("after Drain: State=%s Reason=%q", state, reason)
		}
		st, err := a.Status(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		want := drain.Status{Drained: true, ByFleetcheck: true, Reason: "fleetcheck: gpu.ecc: GPU 3 uncorrectable ECC errors", State: "drained"}
		if st != want {
			t.Fatalf("Status = %+v, want %+v", st, want)
		}
		// Draining again keeps the first reason.
		if err := a.Drain(ctx, node, "second reason"); err != nil {
			t.Fatal(err)
		}
		if _, reason := c.Node(); !strings.Contains(reason, "gpu.ecc") {
			t.Fatalf("second Drain replaced the reason: %q", reason)
		}
		if err := a.Undrain(ctx, node); err != nil {
			t.Fatal(err)
		}
		if state, reason := c.Node(); state != "IDLE" || reason != "" {
			t.Fatalf("after Undrain: State=%s Reason=%q", state, reason)
		}
		// Undrain of a node in service is a no-op.
		if err := a.Undrain(ctx, node); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("someone else's drain is never resumed or overwritten", func(t *testing.T) {
		c.MustRun("scontrol", "update", "nodename="+node, "state=drain", "reason=nhc: /scratch full")
		defer c.MustRun("scontrol", "update", "nodename="+node, "state=resume")
		if err := a.Undrain(ctx, node); !errors.Is(err, drain.ErrNotOurs) {
			t.Fatalf("Undrain of an NHC drain: %v, want ErrNotOurs", err)
		}
		if err := a.Drain(ctx, node, "gpu.ecc"); !errors.Is(err, drain.ErrNotOurs) {
			t.Fatalf("Drain of an NHC drain: %v, want ErrNotOurs", err)
		}
		if state, reason := c.Node(); state != "IDLE+DRAIN" || reason != "nhc: /scratch full" {
			t.Fatalf("someone else's drain changed: State=%s Reason=%q", state, reason)
		}
		un, err := a.Unavailable(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st := un[node]; !st.Drained || st.ByFleetcheck || st.Reason != "nhc: /scratch full" {
			t.Fatalf("Unavailable()[%s] = %+v", node, st)
		}
	})

	t.Run("unknown node", func(t *testing.T) {
		if _, err := a.Status(ctx, "fc-node9"); !errors.Is(err, drain.ErrUnknownNode) {
			t.Fatalf("Status of an unknown node: %v, want ErrUnknownNode", err)
		}
		if err := a.Drain(ctx, "fc-node[1-9]", "x"); !errors.Is(err, drain.ErrInvalidNode) {
			t.Fatalf("Drain of a hostlist: %v, want ErrInvalidNode", err)
		}
	})

	t.Run("job state: a running job shows allocated and draining", func(t *testing.T) {
		id := c.Submit("sleep 30")
		defer c.MustRun("scancel", id)
		st := testwait.Value(t, 20*time.Second, "job "+id+" running on "+node, func() drain.Status {
			st, err := a.Status(ctx, node)
			if err != nil {
				t.Logf("Status: %v", err)
			}
			return st
		}, func(st drain.Status) bool {
			// squeue can list the job as running a moment before
			// slurmctld's node record says ALLOCATED: wait for both.
			return st.RunningJobs == 1 && st.State == "allocated"
		})
		if st.Drained {
			t.Fatalf("Status with a job = %+v, want allocated, in service", st)
		}
		if err := a.Drain(ctx, node, "rollout r-1"); err != nil {
			t.Fatal(err)
		}
		if state, _ := c.Node(); state != "ALLOCATED+DRAIN" {
			t.Fatalf("drained with a job: State=%s", state)
		}
		st, err := a.Status(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != "draining" || !st.Drained || !st.ByFleetcheck || st.RunningJobs != 1 {
			t.Fatalf("Status draining = %+v", st)
		}
		if err := a.Undrain(ctx, node); err != nil {
			t.Fatal(err)
		}
		if state, _ := c.Node(); state != "ALLOCATED" {
			t.Fatalf("resumed with a job: State=%s", state)
		}
	})

	t.Run("scontrol hangs: each call times out and nothing is drained", func(t *testing.T) {
		bin := t.TempDir()
		hang := filepath.Join(bin, "scontrol")
		if err := os.WriteFile(hang, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		h := New(Options{Scontrol: hang, Env: c.Env, Timeout: time.Second})
		start := time.Now()
		err := h.Drain(ctx, node, "gpu.ecc")
		took := time.Since(start)
		if !errors.Is(err, runcmd.ErrTimeout) {
			t.Fatalf("Drain with a hanging scontrol: %v, want a timeout", err)
		}
		// One call's timeout, the kill grace and a reap: never the hang.
		if took > 15*time.Second {
			t.Fatalf("Drain with a hanging scontrol took %v", took)
		}
		if state, reason := c.Node(); strings.Contains(state, "DRAIN") {
			t.Fatalf("node drained although scontrol never answered: State=%s Reason=%q", state, reason)
		}
		un, err := a.Unavailable(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(un) != 0 {
			t.Fatalf("nodes out of service after a hung scontrol: %v", un)
		}
	})
}

// TestRealSlurmHealthCheck is HealthCheck, NHC's rules, against the real
// daemons: drain on failure, resume only its own drain, and leave
// someone else's alone whatever the run found.
func TestRealSlurmHealthCheck(t *testing.T) {
	c := slurmtest.Start(t, slurmtest.Config{})
	a := New(Options{Env: c.Env, Timeout: 20 * time.Second})
	ctx := context.Background()
	node := slurmtest.NodeName
	steps := []struct {
		name       string
		operator   string // scontrol state= an operator sets first
		failure    string
		want       Outcome
		state      string
		wantReason string
	}{
		{"healthy in service", "", "", InService, "IDLE", ""},
		{"failing drains", "", "gpu.ecc: GPU3 ECC_DBE", Drained, "IDLE+DRAIN", "fleetcheck: gpu.ecc: GPU3 ECC_DBE"},
		{"still failing keeps the first reason", "", "ib.link: mlx5_0/1 down", StillDrained, "IDLE+DRAIN", "fleetcheck: gpu.ecc: GPU3 ECC_DBE"},
		{"healthy resumes its own drain", "", "", Resumed, "IDLE", ""},
		{"operator's drain, healthy: kept", "drain", "", NotOurs, "IDLE+DRAIN", "operator: reseat GPU5"},
		{"operator's drain, failing: reason kept", "", "gpu.ecc: GPU3 ECC_DBE", NotOurs, "IDLE+DRAIN", "operator: reseat GPU5"},
	}
	for _, s := range steps {
		if s.operator != "" {
			c.MustRun("scontrol", "update", "nodename="+node, "state="+s.operator, "reason=operator: reseat GPU5")
		}
		got, _, err := a.HealthCheck(ctx, node, s.failure)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		state, reason := c.Node()
		if got != s.want || state != s.state || reason != s.wantReason {
			t.Fatalf("%s: %s, State=%s Reason=%q; want %s, State=%s Reason=%q", s.name, got, state, reason, s.want, s.state, s.wantReason)
		}
	}
	if _, _, err := a.HealthCheck(ctx, "fc-node[1-2]", "x"); !errors.Is(err, drain.ErrInvalidNode) {
		t.Fatalf("HealthCheck of a hostlist: %v, want ErrInvalidNode", err)
	}
}
