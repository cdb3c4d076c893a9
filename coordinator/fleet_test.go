package coordinator

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// fleetAgentYAML configures the real agents of these tests: the actions a
// rollout and a drill use, and 2-node runs among gpu-NNN nodes.
const fleetAgentYAML = `
insecure: true
activity: idle
interval: 1h
enabled_checks: [gpu.inventory, gpu.ecc, gpu.xid, ib.ports, nccl.allreduce]
actions:
  driver-upgrade:
    command: [driver-upgrade, "{version}"]
    params: {version: '5[0-9]{2}\.[0-9]+(\.[0-9]+)?'}
    timeout: 30s
    disruptive: true
  ib-port-down:
    command: [ib-port-down, "{hca}"]
    params: {hca: 'mlx5_[0-9]+'}
    revert: ib-port-up
  ib-port-up:
    command: [ib-port-up, "{hca}"]
    params: {hca: 'mlx5_[0-9]+'}
multi_node:
  launcher_command: [mpirun, -H, "{hosts}", -np, "{np}", all_reduce_perf, -b, 8G, -e, 8G, -g, "8"]
  allowed_peers: 'gpu-[0-9]{3}'
`

// simAgent is a real agent on a simulated node, connected to s.
type simAgent struct {
	node *sim.Node
	stop func()
}

func startSimAgent(t *testing.T, s *Server, fabric *sim.Fabric, name string, mod func(*agent.Config)) *simAgent {
	t.Helper()
	spec := sim.DefaultSpec(name)
	spec.Fabric = fabric
	return startSimAgentSpec(t, s, spec, name, mod)
}

func startSimAgentSpec(t *testing.T, s *Server, spec sim.Spec, name string, mod func(*agent.Config)) *simAgent {
	t.Helper()
	n, err := sim.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	return startAgentOn(t, s, n, name, mod)
}

// startAgentOn starts an agent process for a simulated node (again, after
// a stop: the node outlives its agent).
func startAgentOn(t *testing.T, s *Server, n *sim.Node, name string, mod func(*agent.Config)) *simAgent {
	t.Helper()
	cfg, err := agent.ParseConfig([]byte("node: " + name + "\ncoordinator: " + s.GRPCAddr().String() + "\n" + fleetAgentYAML))
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = t.TempDir()
	cfg.MetricsListen = "off"
	cfg.Labels = map[string]string{"sku": "h100"}
	cfg.Reconnect.Initial = config.Duration(50 * time.Millisecond)
	cfg.Reconnect.Max = config.Duration(200 * time.Millisecond)
	if mod != nil {
		mod(cfg)
	}
	a, err := agent.New(cfg, n, zerolog.Nop(), agent.WithVersion("test"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := a.Run(ctx); err != nil {
			t.Errorf("agent %s: %v", name, err)
		}
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return &simAgent{node: n, stop: stop}
}

// waitConnected waits until every node is connected with an inventory.
func waitConnected(t *testing.T, f kit.Fleet, names ...string) {
	t.Helper()
	testwait.Until(t, 20*time.Second, "agents connected", func() bool {
		nodes, err := f.Nodes(context.Background(), "name in ("+strings.Join(names, ",")+")")
		if err != nil || len(nodes) != len(names) {
			return false
		}
		for _, n := range nodes {
			if !n.Connected || n.Inventory.DriverVersion == "" {
				return false
			}
		}
		return true
	})
}

func TestFleetOverRealAgents(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	f := s.Fleet()
	fabric := sim.NewFabric()
	a1 := startSimAgent(t, s, fabric, "gpu-001", nil)
	a2 := startSimAgent(t, s, fabric, "gpu-002", nil)
	startSimAgent(t, s, fabric, "gpu-003", func(c *agent.Config) { c.Activity = agent.ActivityBusy })
	waitConnected(t, f, "gpu-001", "gpu-002", "gpu-003")
	ctx := context.Background()
	opts := kit.RunOptions{Timeout: 20 * time.Second}

	t.Run("nodes", func(t *testing.T) {
		nodes, err := f.Nodes(ctx, "name in (gpu-001,gpu-003)")
		if err != nil || len(nodes) != 2 {
			t.Fatalf("nodes: %v %v", nodes, err)
		}
		if n := nodes[0]; n.Name != "gpu-001" || !n.Connected || n.Activity != "idle" || n.Labels["sku"] != "h100" ||
			n.Inventory.DriverVersion != "535.161.08" || len(n.Inventory.GPUs) != 8 {
			t.Errorf("gpu-001: %+v", n)
		}
		if nodes[1].Activity != "busy" {
			t.Errorf("gpu-003 activity %q, want busy", nodes[1].Activity)
		}
		if _, err := f.Nodes(ctx, "name in (("); err == nil {
			t.Error("a bad selector was accepted")
		}
	})

	t.Run("run checks", func(t *testing.T) {
		rep, err := f.RunChecks(ctx, "gpu-001", []string{"gpu.ecc", "ib.ports"}, opts)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Node != "gpu-001" || rep.Status != "pass" || len(rep.Checks) != 2 || rep.Check("ib.ports") == nil ||
			rep.Inventory.DriverVersion != "535.161.08" || rep.CollectedAt == "" {
			t.Errorf("report: %+v", rep)
		}
		// Parameters reach the tool.
		rep, err = f.RunChecks(ctx, "gpu-002", []string{"nccl.allreduce"}, kit.RunOptions{Timeout: 20 * time.Second, Params: map[string]string{"max_bytes": "1G"}})
		if err != nil {
			t.Fatal(err)
		}
		if c := rep.Check("nccl.allreduce"); c == nil || c.Metrics["nccl.allreduce.size_bytes"] != 1<<30 {
			t.Errorf("allreduce with max_bytes=1G: %+v", c)
		}
	})

	t.Run("refused", func(t *testing.T) {
		_, err := f.RunChecks(ctx, "gpu-001", []string{"dcgm.diag"}, opts)
		if !errors.Is(err, kit.ErrRefused) || !strings.Contains(err.Error(), "not enabled") {
			t.Errorf("disabled check: %v", err)
		}
		_, err = f.RunChecks(ctx, "gpu-003", []string{"nccl.allreduce"}, opts)
		if !errors.Is(err, kit.ErrRefused) || !strings.Contains(err.Error(), "node is busy") {
			t.Errorf("disruptive on a busy node: %v", err)
		}
		_, err = f.RunAction(ctx, "gpu-001", "rm-rf", nil, opts)
		if !errors.Is(err, kit.ErrRefused) || !strings.Contains(err.Error(), "not in the agent's config") {
			t.Errorf("unknown action: %v", err)
		}
		_, err = f.RunAction(ctx, "gpu-001", "driver-upgrade", map[string]string{"version": "550.54.15 && reboot"}, opts)
		if !errors.Is(err, kit.ErrRefused) || !strings.Contains(err.Error(), "characters no parameter may hold") {
			t.Errorf("hostile parameter: %v", err)
		}
	})

	t.Run("unreachable", func(t *testing.T) {
		if _, err := f.RunChecks(ctx, "gpu-404", []string{"gpu.ecc"}, opts); !errors.Is(err, kit.ErrUnreachable) {
			t.Errorf("unknown node: %v", err)
		}
	})

	t.Run("multi", func(t *testing.T) {
		rep, err := f.RunMulti(ctx, []string{"gpu-001", "gpu-002"}, "nccl.allreduce", opts)
		if err != nil {
			t.Fatal(err)
		}
		c := rep.Check("nccl.allreduce")
		if rep.Node != "gpu-001" || c == nil || c.Status != "pass" {
			t.Fatalf("2-node report: %+v", rep)
		}
		bw := c.Metrics["nccl.allreduce2.busbw_gbps"]
		if math.Abs(bw-469)/469 > 0.05 {
			t.Errorf("healthy pair busbw %.1f, want about 469", bw)
		}
		// The peer's side is stored as its result under the same work.
		testwait.Until(t, 10*time.Second, "the peer's side", func() bool {
			rows, err := s.Store().Results(ctx, store.ResultQuery{Node: "gpu-002", Check: "nccl.allreduce", Limit: 5})
			return err == nil && len(rows) > 0 && strings.Contains(rows[0].Check.Reason, "measured by launcher gpu-001") &&
				rows[0].Check.Metrics["nccl.allreduce2.busbw_gbps"] == bw
		})

		// A slow peer slows the pair.
		if err := a2.node.AddFault(sim.SlowNode{Factor: 0.5}); err != nil {
			t.Fatal(err)
		}
		rep, err = f.RunMulti(ctx, []string{"gpu-001", "gpu-002"}, "nccl.allreduce", opts)
		if err != nil {
			t.Fatal(err)
		}
		if bw := rep.Check("nccl.allreduce").Metrics["nccl.allreduce2.busbw_gbps"]; math.Abs(bw-234.5)/234.5 > 0.05 {
			t.Errorf("pair with a half-speed peer: %.1f GB/s, want about 234", bw)
		}
		a2.node.ClearFault(sim.KindSlowNode, "")
		// A busy peer refuses; the run is called off before any launch.
		_, err = f.RunMulti(ctx, []string{"gpu-001", "gpu-003"}, "nccl.allreduce", opts)
		if !errors.Is(err, kit.ErrRefused) || !strings.Contains(err.Error(), "gpu-003") {
			t.Errorf("busy peer: %v", err)
		}
		// gpu-001 is free again: a single-node run is accepted.
		if _, err := f.RunChecks(ctx, "gpu-001", []string{"nccl.allreduce"}, opts); err != nil {
			t.Errorf("after the runs: %v", err)
		}
	})

	t.Run("action", func(t *testing.T) {
		res, err := f.RunAction(ctx, "gpu-001", "driver-upgrade", map[string]string{"version": "550.54.15"}, opts)
		if err != nil || !res.OK || !strings.Contains(res.Output, "installed NVIDIA driver 550.54.15") {
			t.Fatalf("upgrade: %+v %v", res, err)
		}
		if a1.node.Driver() != "550.54.15" {
			t.Fatalf("sim driver %s", a1.node.Driver())
		}
		testwait.Until(t, 15*time.Second, "inventory with the new driver", func() bool {
			nodes, err := f.Nodes(ctx, "name=gpu-001")
			return err == nil && len(nodes) == 1 && nodes[0].Inventory.DriverVersion == "550.54.15"
		})

		if ev := eventsOf(t, s, "gpu-001"); !hasEvent(ev, "audit: action: driver-upgrade on gpu-001") || !hasEvent(ev, "version=550.54.15") {
			t.Errorf("no audit event for the action: %v", ev)
		}
		evs, _ := s.Store().Events(ctx, store.EventQuery{Node: "gpu-001", Kind: store.EventAudit})
		if len(evs) == 0 || evs[0].Actor != "campaign" {
			t.Errorf("audit events %+v, want actor campaign", evs)
		}
		// A drill fault with the engine's timer parameters.
		res, err = f.RunAction(ctx, "gpu-002", "ib-port-down", map[string]string{"hca": "mlx5_1", "drill_id": "d-7", "revert_after": "1h", "revert_on_disconnect": "2m"}, opts)
		if err != nil || !res.OK {
			t.Fatalf("inject: %+v %v", res, err)
		}
		res, err = f.RunAction(ctx, "gpu-002", "ib-port-up", map[string]string{"hca": "mlx5_1", "drill_id": "d-7"}, opts)
		if err != nil || !res.OK || !strings.Contains(res.Message, "disarmed 1") {
			t.Fatalf("revert: %+v %v", res, err)
		}
	})

	t.Run("lost", func(t *testing.T) {
		a2.stop()
		testwait.Until(t, 10*time.Second, "gpu-002 disconnected", func() bool {
			nodes, _ := f.Nodes(ctx, "name=gpu-002")
			return len(nodes) == 1 && !nodes[0].Connected
		})

		if _, err := f.RunChecks(ctx, "gpu-002", []string{"gpu.ecc"}, opts); !errors.Is(err, kit.ErrUnreachable) {
			t.Errorf("stopped agent: %v", err)
		}
		if _, err := f.RunMulti(ctx, []string{"gpu-001", "gpu-002"}, "nccl.allreduce", opts); !errors.Is(err, kit.ErrUnreachable) {
			t.Errorf("multi with a stopped peer: %v", err)
		}
	})
}

// An action sent again with the id of one the agent still runs (a
// campaign resumed after a coordinator restart) gets that action's answer:
// it neither runs twice nor is refused because the first holds the node.
func TestFleetActionResentWithItsID(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	f := s.Fleet()
	spec := sim.DefaultSpec("gpu-001")
	spec.ActionDelay = time.Second
	a := startSimAgentSpec(t, s, spec, "gpu-001", nil)
	waitConnected(t, f, "gpu-001")
	opts := kit.RunOptions{Timeout: 20 * time.Second, ID: "b-20260504T080000-abc123.run7"}
	params := map[string]string{"version": "550.54.15"}
	// The first caller gives up while the agent installs (as a stopped
	// coordinator does); the agent goes on.
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := f.RunAction(short, "gpu-001", "driver-upgrade", params, opts); err == nil {
		t.Fatal("the first call outlived its context")
	}
	res, err := f.RunAction(context.Background(), "gpu-001", "driver-upgrade", params, opts)
	if err != nil || !res.OK {
		t.Fatalf("resent action: %+v %v", res, err)
	}
	if n := a.node.ActionCount("driver-upgrade"); n != 1 || a.node.Driver() != "550.54.15" {
		t.Errorf("driver-upgrade ran %d times, driver %s; want once, 550.54.15", n, a.node.Driver())
	}
	if _, err := f.RunAction(context.Background(), "gpu-001", "driver-upgrade", params, kit.RunOptions{Timeout: time.Second, ID: "-x"}); err == nil {
		t.Error("a malformed id was sent")
	}
}

// An agent restarted while it runs an action lost it with its process: the
// action is sent again, same id, on the new stream, and the call ends with
// its answer rather than waiting out the action's whole timeout.
func TestFleetActionResentToRestartedAgent(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	f := s.Fleet()
	spec := sim.DefaultSpec("gpu-001")
	spec.ActionDelay = 2 * time.Second
	a := startSimAgentSpec(t, s, spec, "gpu-001", nil)
	waitConnected(t, f, "gpu-001")
	type answer struct {
		res kit.ActionResult
		err error
	}
	got := make(chan answer, 1)
	go func() {
		res, err := f.RunAction(context.Background(), "gpu-001", "driver-upgrade", map[string]string{"version": "550.54.15"},
			kit.RunOptions{Timeout: 40 * time.Second, ID: "b-20260504T080000-abc123.run9"})
		got <- answer{res, err}
	}()
	testwait.Until(t, 10*time.Second, "the action accepted", func() bool {
		ev := eventsOf(t, s, "gpu-001")
		return hasEvent(ev, "b-20260504T080000-abc123.run9")
	})
	a.stop() // SIGTERM: the install is cut short
	if a.node.Driver() == "550.54.15" {
		t.Skip("the install finished before the stop; nothing to resend")
	}
	startAgentOn(t, s, a.node, "gpu-001", nil)
	select {
	case ans := <-got:
		if ans.err != nil || !ans.res.OK {
			t.Fatalf("after the agent's restart: %+v %v", ans.res, ans.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no answer 30s after the agent came back: the action was not sent again")
	}
	if a.node.Driver() != "550.54.15" || a.node.ActionCount("driver-upgrade") != 1 {
		t.Errorf("driver %s, %d upgrades; want 550.54.15 once", a.node.Driver(), a.node.ActionCount("driver-upgrade"))
	}
}

func TestFleetTimeoutAndLostStream(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	f := s.Fleet()
	ctx := context.Background()

	// An agent that never answers: timed out.
	mustConnect(t, s, "gpu-silent")
	start := time.Now()
	_, err := f.RunChecks(ctx, "gpu-silent", []string{"gpu.ecc"}, kit.RunOptions{Timeout: 300 * time.Millisecond})
	if !errors.Is(err, kit.ErrTimeout) {
		t.Errorf("silent agent: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("timeout took %s", d)
	}
	// The caller's context bounds the call too.
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := f.RunChecks(cctx, "gpu-silent", []string{"gpu.ecc"}, kit.RunOptions{Timeout: time.Minute}); err == nil {
		t.Error("no error when the caller's context ended")
	}

	// An agent that accepts and dies: unreachable once it is not back
	// within three heartbeat intervals.
	// It dies once the coordinator has taken the acceptance (the work's
	// target marked accepted), so the call is past "accepted" when the
	// stream goes.
	accepted, die := make(chan string, 1), make(chan struct{})
	mustConnect(t, s, "gpu-dying", onRun(func(a *fakeAgent, rc *pb.RunChecks) {
		a.workStatus(rc.GetWorkId(), pb.WorkStatus_STATE_ACCEPTED, "", "")
		accepted <- rc.GetWorkId()
		<-die
		a.close()
	}))
	errc := make(chan error, 1)
	go func() {
		_, err := f.RunChecks(ctx, "gpu-dying", []string{"gpu.ecc"}, kit.RunOptions{Timeout: time.Minute})
		errc <- err
	}()
	var wid string
	select {
	case wid = <-accepted:
	case err := <-errc:
		t.Fatalf("dying agent: the call ended before the agent accepted: %v", err)
	}
	testwait.Until(t, 10*time.Second, "the coordinator takes gpu-dying's acceptance", func() bool { return workAccepted(s, wid, "gpu-dying") })
	close(die)
	err = <-errc
	if !errors.Is(err, kit.ErrUnreachable) || !strings.Contains(err.Error(), "stream lost") {
		t.Errorf("dying agent: %v", err)
	}

	// An agent of protocol 1.0 is never sent what it would misread.
	mustConnect(t, s, "gpu-old", withVersion("1.0"))
	_, err = f.RunAction(ctx, "gpu-old", "driver-upgrade", map[string]string{"version": "550.54.15"}, kit.RunOptions{Timeout: time.Second})
	if !errors.Is(err, kit.ErrRefused) || !strings.Contains(err.Error(), "protocol 1.0") {
		t.Errorf("old agent action: %v", err)
	}
	_, err = f.RunMulti(ctx, []string{"gpu-old", "gpu-silent"}, "nccl.allreduce", kit.RunOptions{Timeout: time.Second})
	if !errors.Is(err, kit.ErrRefused) {
		t.Errorf("old agent multi: %v", err)
	}
	// Bounds checked before anything is sent.
	if _, err := f.RunChecks(ctx, "gpu-silent", []string{"gpu.ecc"}, kit.RunOptions{Timeout: 2 * MaxRunTimeout}); err == nil {
		t.Error("an unbounded timeout was accepted")
	}
	if _, err := f.RunMulti(ctx, []string{"gpu-silent", "gpu-silent"}, "nccl.allreduce", kit.RunOptions{}); err == nil {
		t.Error("a node named twice was accepted")
	}
}

// TestFleetWorkSentAgainAfterAgentRestart: an agent that accepts a run
// and restarts (it forgets the work) comes back within the grace on a new
// stream; the work is sent to it again there and the call gets its
// report. It used to wait for the old stream's answer until its timeout.
func TestFleetWorkSentAgainAfterAgentRestart(t *testing.T) {
	t.Parallel()
	// The grace (three intervals) only bounds how long the reconnect may
	// take on a loaded machine: the work is sent again when the new
	// stream attaches, not when the grace ends.
	s := testServer(t, t.TempDir(), func(c *Config) { c.HeartbeatInterval = 3 * time.Second })
	f := s.Fleet()
	ctx := context.Background()
	restarted := make(chan *fakeAgent, 1)
	mustConnect(t, s, "gpu-forgets", onRun(func(a *fakeAgent, rc *pb.RunChecks) {
		a.workStatus(rc.GetWorkId(), pb.WorkStatus_STATE_ACCEPTED, "", "")
		a.close() // the process dies with the work
		restarted <- mustConnect(t, s, "gpu-forgets", onRun(func(b *fakeAgent, rc *pb.RunChecks) {
			b.workStatus(rc.GetWorkId(), pb.WorkStatus_STATE_ACCEPTED, "", "")
			r := result("gpu-forgets", false)
			r.WorkId = rc.GetWorkId()
			b.sendResult(r)
		}))
	}))
	start := time.Now()
	rep, err := f.RunChecks(ctx, "gpu-forgets", []string{"gpu.ecc"}, kit.RunOptions{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("run across the agent's restart: %v (after %s)", err, time.Since(start).Round(time.Millisecond))
	}
	if rep.Check("gpu.ecc") == nil {
		t.Errorf("report without gpu.ecc: %+v", rep)
	}
	<-restarted
}

// workAccepted says whether the coordinator has marked node's part of
// work id accepted.
func workAccepted(s *Server, id, node string) bool {
	w := s.works.get(id)
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	tg := w.targets[node]
	return tg != nil && tg.accepted
}
