package coordinator

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// scheduler is a drain adapter that behaves like a real scheduler's: its
// drains stay until someone resumes the node (unlike drain.None, which the
// policy treats as a record only).
type scheduler struct{ *drain.None }

// policyServer starts a coordinator with a drain policy and the given
// adapter; mod adjusts the config further.
func policyServer(t *testing.T, adapter drain.Adapter, mod func(*Config)) *Server {
	t.Helper()
	cfg := Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), HeartbeatInterval: time.Second, Insecure: true}
	cfg.Drain.Policy = DrainPolicyConfig{Actions: []string{"replace", "reseat"}}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg, Options{Logger: zerolog.Nop(), Version: "test", Drain: adapter})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(t, s) })
	return s
}

// fleetNode is the node as campaigns (the drill engine) see it.
func fleetNode(t *testing.T, s *Server, name string) (out bool, reason string) {
	t.Helper()
	ns, err := s.Fleet().Nodes(context.Background(), "name="+name)
	if err != nil || len(ns) != 1 {
		t.Fatalf("nodes: %v %v", ns, err)
	}
	return ns[0].OutOfService, ns[0].OutOfServiceReason
}

func TestDrainPolicyTakesNodeOutAndBack(t *testing.T) {
	t.Parallel()
	rec := drain.NewNone(nil)
	s := policyServer(t, rec, nil)
	a := mustConnect(t, s, "gpu-001")

	a.sendResult(result("gpu-001", false))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "healthy", stateIs(t, s, "gpu-001", StateHealthy))
	if out, _ := fleetNode(t, s, "gpu-001"); out {
		t.Fatal("a healthy node is out of service")
	}

	// ECC_UNCORRECTABLE with action replace: the policy drains.
	a.sendResult(result("gpu-001", true))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "drained", stateIs(t, s, "gpu-001", StateDrained))
	n := nodeOf(t, s, "gpu-001")
	want := "drain policy through none: gpu.ecc: GPU3 ECC_UNCORRECTABLE (fail, action replace)"
	if n.StateReason != want {
		t.Errorf("reason %q, want %q", n.StateReason, want)
	}
	if st, _ := rec.Status(context.Background(), "gpu-001"); !st.Drained || !st.ByFleetcheck || !strings.Contains(st.Reason, "ECC_UNCORRECTABLE") {
		t.Errorf("adapter status %+v", st)
	}
	if out, why := fleetNode(t, s, "gpu-001"); !out || why != want {
		t.Errorf("fleet view: out of service %v, reason %q", out, why)
	}
	if !hasEvent(eventsOf(t, s, "gpu-001"), "audit: drain: through none: gpu.ecc") {
		t.Errorf("no audit event: %q", eventsOf(t, s, "gpu-001"))
	}
	if got := s.camp.breaker.State(1).Drained; got != 1 {
		t.Errorf("breaker counts %d drains", got)
	}

	// The record-only adapter brings the node back once its results are
	// clean again.
	a.sendResult(result("gpu-001", false))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "healthy again", stateIs(t, s, "gpu-001", StateHealthy))
	if st, _ := rec.Status(context.Background(), "gpu-001"); st.Drained {
		t.Errorf("adapter still records a drain: %+v", st)
	}
}

func TestDrainPolicySchedulerResume(t *testing.T) {
	t.Parallel()
	sched := scheduler{drain.NewNone(nil)}
	s := policyServer(t, sched, func(c *Config) { c.Drain.Adapter = "slurm" })
	a := mustConnect(t, s, "gpu-002")
	a.sendResult(result("gpu-002", true))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "drained", stateIs(t, s, "gpu-002", StateDrained))
	if r := nodeOf(t, s, "gpu-002").StateReason; !strings.HasPrefix(r, "drain policy through slurm: ") {
		t.Errorf("reason %q", r)
	}
	// A clean result does not resume a scheduler's drain: people do.
	a.sendResult(result("gpu-002", false))
	a.ack(5 * time.Second)
	sched.Set("gpu-002", drain.Status{}) // scontrol update state=resume
	a.sendResult(result("gpu-002", false))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "back in service", stateIs(t, s, "gpu-002", StateHealthy))
	if !hasEvent(eventsOf(t, s, "gpu-002"), "returned to service through slurm") {
		t.Errorf("events %q", eventsOf(t, s, "gpu-002"))
	}
}

func TestDrainPolicyBehindBreaker(t *testing.T) {
	t.Parallel()
	rec := drain.NewNone(nil)
	s := policyServer(t, rec, func(c *Config) { c.Breaker.MaxCount = 1 })
	a1 := mustConnect(t, s, "gpu-001")
	a2 := mustConnect(t, s, "gpu-002")
	a1.sendResult(result("gpu-001", true))
	a1.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "first drained", stateIs(t, s, "gpu-001", StateDrained))
	a2.sendResult(result("gpu-002", true))
	a2.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "refusal audited", func() bool {
		return hasEvent(eventsOf(t, s, "gpu-002"), "audit: drain refused: gpu.ecc")
	})

	if n := nodeOf(t, s, "gpu-002"); n.State != StateFailed {
		t.Errorf("second node %s (%s), want failed and in service", n.State, n.StateReason)
	}
	if st, _ := rec.Status(context.Background(), "gpu-002"); st.Drained {
		t.Error("the breaker let a second drain through")
	}
}

func TestDrainPolicyOffByDefault(t *testing.T) {
	t.Parallel()
	rec := drain.NewNone(nil)
	s := policyServer(t, rec, func(c *Config) { c.Drain.Policy = DrainPolicyConfig{} })
	a := mustConnect(t, s, "gpu-001")
	a.sendResult(result("gpu-001", true))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "failed", stateIs(t, s, "gpu-001", StateFailed))
	if len(rec.Snapshot()) != 0 {
		t.Errorf("no policy, yet drained: %v", rec.Snapshot())
	}
}

func TestDrainPolicyConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		yaml, err string
	}{
		{"drain: {policy: {actions: [drain, reset_gpu, reboot, replace, reseat], codes: [IB_PORT_DOWN, XID_79]}}", ""},
		{"drain: {policy: {actions: [restart_app]}}", `drain.policy.actions: "restart_app": must be one of drain, reset_gpu, reboot, replace, reseat`},
		{"drain: {policy: {codes: ['rm -rf']}}", `drain.policy.codes: "rm -rf"`},
		{"drain: {policy: {action: [drain]}}", "field action not found"},
	} {
		_, err := ParseConfig([]byte("data_dir: /tmp/x\ninsecure: true\n" + tc.yaml))
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.yaml, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: got %v, want %q", tc.yaml, err, tc.err)
		}
	}
}

// TestCoordinatorConfigDocLoads parses every yaml block of
// docs/coordinator-config.md as a coordinator config.
func TestCoordinatorConfigDocLoads(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/coordinator-config.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := 0
	for i, part := range strings.Split(string(doc), "```yaml\n")[1:] {
		body, _, ok := strings.Cut(part, "```")
		if !ok {
			t.Fatalf("block %d not closed", i+1)
		}
		blocks++
		if !strings.Contains(body, "data_dir:") {
			body = "data_dir: /var/lib/fleetcheck\n" + body
		}
		if !strings.Contains(body, "insecure:") && !strings.Contains(body, "tls:") {
			body += "insecure: true\n"
		}
		if _, err := ParseConfig([]byte(body)); err != nil {
			t.Errorf("block %d: %v\n%s", i+1, err, body)
		}
	}
	if blocks == 0 {
		t.Fatal("no yaml blocks")
	}
}

// A node someone else drained is tried once, then left alone (no audit
// or state flapping at every result) until they bring it back.
func TestDrainPolicyLeavesForeignDrains(t *testing.T) {
	t.Parallel()
	rec := drain.NewNone(nil)
	s := policyServer(t, rec, nil)
	a := mustConnect(t, s, "gpu-005")
	rec.Set("gpu-005", drain.Status{Drained: true, Reason: "bad DIMM, ticket 4411"})
	drains := func() int {
		n := 0
		for _, e := range eventsOf(t, s, "gpu-005") {
			if strings.HasPrefix(e, "audit: drain: through none") {
				n++
			}
		}
		return n
	}
	p := s.camp.policy
	foreign := func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.foreign["gpu-005"] }
	a.sendResult(result("gpu-005", true))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "the foreign drain noticed", foreign)
	testwait.Until(t, 5*time.Second, "back to failed", stateIs(t, s, "gpu-005", StateFailed))

	e := s.reg.lookup("gpu-005")
	ctx := tctx(t)
	p.takeOut(ctx, e, "gpu.ecc: again")
	p.takeOut(ctx, e, "gpu.ecc: and again")
	if n := drains(); n != 1 {
		t.Errorf("%d drain attempts on a node someone else drained, want 1: %q", n, eventsOf(t, s, "gpu-005"))
	}
	if st := rec.Snapshot()["gpu-005"]; st.Reason != "bad DIMM, ticket 4411" {
		t.Errorf("someone else's drain changed: %+v", st)
	}
	// They bring it back; the policy takes it out itself.
	rec.Set("gpu-005", drain.Status{})
	p.takeOut(ctx, e, "gpu.ecc: GPU3 ECC_UNCORRECTABLE")
	if n := nodeOf(t, s, "gpu-005"); n.State != StateDrained || drains() != 2 {
		t.Errorf("after the other drain ended: %s %q, %d drains", n.State, n.StateReason, drains())
	}
}
