package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// actionsYAML is the actions part of the test agents' config, as an
// operator writes it.
const actionsYAML = `
actions:
  driver-upgrade:
    command: [driver-upgrade, "{version}"]
    params:
      version: '5[0-9]{2}\.[0-9]+(\.[0-9]+)?'
    timeout: 10s
    disruptive: true
  ib-port-down:
    command: [ib-port-down, "{hca}"]
    params: {hca: 'mlx5_[0-9]+', port: '[0-9]'}
    timeout: 5s
    revert: ib-port-up
  ib-port-up:
    command: [ib-port-up, "{hca}"]
    params: {hca: 'mlx5_[0-9]+', port: '[0-9]'}
    timeout: 5s
`

func actionTestConfig(t *testing.T, node string) *Config {
	t.Helper()
	c, err := ParseConfig([]byte("node: " + node + "\ncoordinator: 127.0.0.1:1\ninsecure: true\n" + actionsYAML))
	if err != nil {
		t.Fatal(err)
	}
	base := testConfig(t)
	base.Node = node
	base.Activity = ActivityIdle
	base.Actions = c.Actions
	return base
}

// recHost is an empty host that records the actions it is asked to run.
type recHost struct {
	fakeHost
	mu   sync.Mutex
	runs [][]string
	fail error
}

func (h *recHost) RunAction(_ context.Context, name string, args []string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.runs = append(h.runs, append([]string{name}, args...))
	return "ok\n", h.fail
}

func (h *recHost) calls() [][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.runs)
}

func TestActionConfigValidation(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, yaml, says string }{
		{"placeholder inside an argument", `{a: {command: [prog, "--v={version}"], params: {version: '.*'}}}`, "whole argument"},
		{"placeholder as program", `{a: {command: ["{version}"], params: {version: '.*'}}}`, "must be a literal"},
		{"undeclared placeholder", `{a: {command: [prog, "{version}"]}}`, "no such parameter"},
		{"bad pattern", `{a: {command: [prog], params: {v: '(['}}}`, "pattern"},
		{"unknown revert", `{a: {command: [prog], revert: b}}`, `no action "b"`},
		{"revert of a revert", `{a: {command: [prog], revert: b}, b: {command: [prog], revert: c}, c: {command: [prog]}}`, "must be final"},
		{"empty command", `{a: {command: []}}`, "command is empty"},
		{"bad name", `{"A B": {command: [prog]}}`, "name"},
		{"timer without revert", `{a: {command: [prog], revert_after_default: 1m}}`, "need revert"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseConfig([]byte("node: n1\ncoordinator: 127.0.0.1:1\ninsecure: true\nactions: " + tt.yaml + "\n"))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("got %v, want ErrInvalid saying %q", err, tt.says)
			}
		})
	}
	for _, mn := range []struct{ yaml, says string }{
		{`{launcher_command: [mpirun, -H, "{hosts}"]}`, "allowed_peers"},
		{`{launcher_command: [mpirun, "{version}"], allowed_peers: 'gpu-.*'}`, "no such parameter"},
		{`{launcher_command: [mpirun, "-H={hosts}"], allowed_peers: 'gpu-.*'}`, "whole argument"},
	} {
		_, err := ParseConfig([]byte("node: n1\ncoordinator: 127.0.0.1:1\ninsecure: true\nmulti_node: " + mn.yaml + "\n"))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), mn.says) {
			t.Errorf("multi_node %s: got %v, want ErrInvalid saying %q", mn.yaml, err, mn.says)
		}
	}
}

func TestActionParams(t *testing.T) {
	t.Parallel()
	cfg := actionTestConfig(t, "gpu-001")
	up := cfg.Actions["driver-upgrade"]
	tests := []struct {
		name   string
		params map[string]string
		says   string // "" accepts
	}{
		{"valid", map[string]string{"version": "550.54.15"}, ""},
		{"two-part version", map[string]string{"version": "550.54"}, ""},
		{"unknown parameter", map[string]string{"version": "550.54.15", "force": "yes"}, `"force" is not one this action takes`},
		{"missing parameter", map[string]string{}, "version is required"},
		{"pattern mismatch", map[string]string{"version": "470.82.01"}, "does not match"},
		{"partial match is no match", map[string]string{"version": "x550.54.15"}, "does not match"},
		{"command substitution", map[string]string{"version": "$(reboot)"}, "characters no parameter may hold"},
		{"backticks", map[string]string{"version": "`id`"}, "characters no parameter may hold"},
		{"separator", map[string]string{"version": "550.54.15;rm -rf /"}, "characters no parameter may hold"},
		{"pipe", map[string]string{"version": "550.54.15|sh"}, "characters no parameter may hold"},
		{"newline", map[string]string{"version": "550.54.15\nreboot"}, "characters no parameter may hold"},
		{"space", map[string]string{"version": "550.54 .15"}, "characters no parameter may hold"},
		{"option injection", map[string]string{"version": "--force"}, "characters no parameter may hold"},
		{"glob", map[string]string{"version": "5*"}, "characters no parameter may hold"},
		{"overlong", map[string]string{"version": "550." + strings.Repeat("1", 300)}, "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := up.checkParams(tt.params)
			switch {
			case tt.says == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.says != "" && (err == nil || !strings.Contains(err.Error(), tt.says)):
				t.Fatalf("got %v, want a refusal saying %q", err, tt.says)
			}
		})
	}
	// Substitution is exact: the value, whole, as one argument.
	got := up.argv(map[string]string{"version": "550.54.15"})
	if want := []string{"driver-upgrade", "550.54.15"}; !slices.Equal(got, want) {
		t.Errorf("argv %q, want %q", got, want)
	}
	// A revert takes only the parameters it declares.
	if got := cfg.Actions["ib-port-up"].only(map[string]string{"hca": "mlx5_0", "port": "1", "drill": "x"}); len(got) != 2 {
		t.Errorf("revert params %v", got)
	}
}

func runAction(id, action string, params map[string]string, revertAfter, onDisc time.Duration) *fleetcheckv1.CoordinatorMessage {
	return &fleetcheckv1.CoordinatorMessage{Msg: &fleetcheckv1.CoordinatorMessage_RunAction{RunAction: &fleetcheckv1.RunAction{
		ActionId: id, Action: action, Params: params,
		RevertAfterMs: revertAfter.Milliseconds(), RevertOnDisconnectMs: onDisc.Milliseconds(),
	}}}
}

func waitAction(t *testing.T, c *fakeCoord, id string) *fleetcheckv1.ActionStatus {
	t.Helper()
	var got *fleetcheckv1.ActionStatus
	testwait.Until(t, 10*time.Second, "final status of "+id, func() bool {
		for _, st := range []fleetcheckv1.ActionStatus_State{fleetcheckv1.ActionStatus_STATE_REFUSED,
			fleetcheckv1.ActionStatus_STATE_DONE, fleetcheckv1.ActionStatus_STATE_FAILED} {
			if got = c.actionState(id, st); got != nil {
				return true
			}
		}
		return false
	})

	return got
}

func TestRunActionOverStream(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	h := &recHost{}
	startAgent(t, actionTestConfig(t, "gpu-001"), h, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)
	var hello *fleetcheckv1.Hello
	c.get(func(c *fakeCoord) { hello = c.hellos[0] })
	if want := []string{"driver-upgrade", "ib-port-down", "ib-port-up"}; !slices.Equal(hello.GetEnabledActions(), want) {
		t.Errorf("hello declares actions %v, want %v", hello.GetEnabledActions(), want)
	}

	refusals := []struct {
		id, action string
		params     map[string]string
		after      time.Duration
		says       string
	}{
		{"a1", "reboot-now", nil, 0, `action "reboot-now" is not configured`},
		{"a2", "driver-upgrade", map[string]string{"version": "550.54.15; reboot"}, 0, "characters no parameter may hold"},
		{"a3", "driver-upgrade", map[string]string{"version": "999.1"}, 0, "does not match"},
		{"a4", "ib-port-down", map[string]string{"hca": "mlx5_0"}, 0, "must carry revert_after"},
		{"a5", "driver-upgrade", map[string]string{"version": "550.54.15"}, time.Minute, "no revert configured"},
		{"bad id!", "driver-upgrade", map[string]string{"version": "550.54.15"}, 0, "action_id"},
	}
	for _, r := range refusals {
		c.send(t, runAction(r.id, r.action, r.params, r.after, 0))
		st := waitAction(t, c, r.id)
		if st.GetState() != fleetcheckv1.ActionStatus_STATE_REFUSED || !strings.Contains(st.GetMessage(), r.says) {
			t.Errorf("%s: got %s %q, want REFUSED saying %q", r.id, st.GetState(), st.GetMessage(), r.says)
		}
	}
	if n := len(h.calls()); n != 0 {
		t.Fatalf("refused actions ran %d times", n)
	}

	c.send(t, runAction("a6", "driver-upgrade", map[string]string{"version": "550.54.15"}, 0, 0))
	if st := waitAction(t, c, "a6"); st.GetState() != fleetcheckv1.ActionStatus_STATE_DONE || st.GetOutput() != "ok\n" {
		t.Fatalf("a6: %s %q output %q", st.GetState(), st.GetMessage(), st.GetOutput())
	}
	if c.actionState("a6", fleetcheckv1.ActionStatus_STATE_ACCEPTED) == nil {
		t.Error("no ACCEPTED before DONE")
	}
	if got, want := h.calls(), [][]string{{"driver-upgrade", "550.54.15"}}; len(got) != 1 || !slices.Equal(got[0], want[0]) {
		t.Fatalf("ran %q, want %q", got, want)
	}
	// A repeat is answered, not run again.
	c.send(t, runAction("a6", "driver-upgrade", map[string]string{"version": "550.54.15"}, 0, 0))
	testwait.Until(t, 5*time.Second, "repeat answered", func() bool {
		n := 0
		c.get(func(c *fakeCoord) {
			for _, a := range c.actions {
				if a.GetActionId() == "a6" && a.GetState() == fleetcheckv1.ActionStatus_STATE_DONE {
					n++
				}
			}
		})
		return n == 2
	})

	if n := len(h.calls()); n != 1 {
		t.Errorf("repeat ran the action again (%d runs)", n)
	}
	// A failing action reports FAILED with why.
	h.mu.Lock()
	h.fail = errors.New("dkms build failed")
	h.mu.Unlock()
	c.send(t, runAction("a7", "driver-upgrade", map[string]string{"version": "550.54.15"}, 0, 0))
	if st := waitAction(t, c, "a7"); st.GetState() != fleetcheckv1.ActionStatus_STATE_FAILED || !strings.Contains(st.GetMessage(), "dkms build failed") {
		t.Errorf("a7: %s %q", st.GetState(), st.GetMessage())
	}
}

// simAgentHost is a simulated node the agent reads and acts on.
func simAgentHost(t *testing.T, name string) *sim.Node {
	t.Helper()
	n, err := sim.New(sim.DefaultSpec(name))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func portDown(n *sim.Node) bool {
	return slices.ContainsFunc(n.Faults(), func(f sim.Fault) bool { return f.Kind() == sim.KindIBPortDown })
}

func TestRevertTimerFiresWithStreamDown(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	stop := tn.serve(t, c)
	n := simAgentHost(t, "gpu-001")
	startAgent(t, actionTestConfig(t, "gpu-001"), n, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)

	c.send(t, runAction("d1", "ib-port-down", map[string]string{"hca": "mlx5_0", "port": "1"}, 1500*time.Millisecond, 0))
	if st := waitAction(t, c, "d1"); st.GetState() != fleetcheckv1.ActionStatus_STATE_DONE {
		t.Fatalf("inject: %s %q", st.GetState(), st.GetMessage())
	}
	if acc := c.actionState("d1", fleetcheckv1.ActionStatus_STATE_ACCEPTED); acc == nil || !strings.Contains(acc.GetMessage(), "ib-port-up armed") {
		t.Errorf("accepted without saying the timer is armed: %v", acc)
	}
	if !portDown(n) {
		t.Fatal("the fault is not in place")
	}
	stop() // the coordinator is gone for good
	testwait.Until(t, 10*time.Second, "agent notices", func() bool { return !c.connected() })
	testwait.Until(t, 10*time.Second, "the agent's own revert", func() bool { return !portDown(n) })
}

func TestRevertOnDisconnect(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	stop := tn.serve(t, c)
	n := simAgentHost(t, "gpu-001")
	startAgent(t, actionTestConfig(t, "gpu-001"), n, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)
	c.send(t, runAction("d1", "ib-port-down", map[string]string{"hca": "mlx5_0"}, time.Hour, 300*time.Millisecond))
	if st := waitAction(t, c, "d1"); st.GetState() != fleetcheckv1.ActionStatus_STATE_DONE {
		t.Fatalf("inject: %s %q", st.GetState(), st.GetMessage())
	}
	// Two more heartbeats from the agent: connected for at least one
	// heartbeat interval (500ms), past the 300ms revert_after.
	beats := func() (n int) { c.get(func(c *fakeCoord) { n = c.heartbeats }); return n }
	from := beats()
	testwait.Until(t, 10*time.Second, "two heartbeats after the inject", func() bool { return beats() >= from+2 })
	if !portDown(n) {
		t.Fatal("reverted while the coordinator was there")
	}
	start := time.Now()
	stop()
	testwait.Until(t, 10*time.Second, "revert after losing the coordinator", func() bool { return !portDown(n) })
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("reverted %s after the loss, want about 300ms", d)
	}
}

func TestRevertTimerSurvivesRestart(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	stop := tn.serve(t, c)
	n := simAgentHost(t, "gpu-001")
	cfg := actionTestConfig(t, "gpu-001")
	ta := startAgent(t, cfg, n, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)
	c.send(t, runAction("d1", "ib-port-down", map[string]string{"hca": "mlx5_0"}, 2*time.Second, 0))
	if st := waitAction(t, c, "d1"); st.GetState() != fleetcheckv1.ActionStatus_STATE_DONE {
		t.Fatalf("inject: %s %q", st.GetState(), st.GetMessage())
	}
	ta.stop()
	stop()
	if !portDown(n) {
		t.Fatal("the fault went with the agent")
	}
	data, err := os.ReadFile(filepath.Join(cfg.StateDir, revertsFileName))
	if err != nil || !strings.Contains(string(data), `"revert":"ib-port-up"`) {
		t.Fatalf("armed timer not on disk: %v %s", err, data)
	}
	// A new agent on the same state dir, no coordinator anywhere.
	startAgent(t, cfg, n, &testNet{})
	testwait.Until(t, 10*time.Second, "revert by the restarted agent", func() bool { return !portDown(n) })
	testwait.Until(t, 5*time.Second, "timer dropped from disk", func() bool {
		data, _ := os.ReadFile(filepath.Join(cfg.StateDir, revertsFileName))
		return strings.Contains(string(data), `"armed":[]`)
	})
}

func TestExplicitRevertDisarms(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	n := simAgentHost(t, "gpu-001")
	cfg := actionTestConfig(t, "gpu-001")
	ta := startAgent(t, cfg, n, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)
	p := map[string]string{"hca": "mlx5_3", "port": "1"}
	c.send(t, runAction("d1", "ib-port-down", p, time.Hour, 0))
	waitAction(t, c, "d1")
	if len(ta.reverts.pending()) != 1 {
		t.Fatalf("armed: %v", ta.reverts.pending())
	}
	c.send(t, runAction("r1", "ib-port-up", p, 0, 0))
	st := waitAction(t, c, "r1")
	if st.GetState() != fleetcheckv1.ActionStatus_STATE_DONE || !strings.Contains(st.GetMessage(), "disarmed 1") {
		t.Fatalf("revert: %s %q", st.GetState(), st.GetMessage())
	}
	if portDown(n) || len(ta.reverts.pending()) != 0 {
		t.Errorf("after the revert: port down %v, armed %v", portDown(n), ta.reverts.pending())
	}
}

func TestDriverUpgradeOnSim(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	n := simAgentHost(t, "gpu-001")
	startAgent(t, actionTestConfig(t, "gpu-001"), n, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)
	c.send(t, runAction("u1", "driver-upgrade", map[string]string{"version": "550.54.15"}, 0, 0))
	if st := waitAction(t, c, "u1"); st.GetState() != fleetcheckv1.ActionStatus_STATE_DONE {
		t.Fatalf("upgrade: %s %q", st.GetState(), st.GetMessage())
	}
	if n.Driver() != "550.54.15" {
		t.Fatalf("sim driver %s", n.Driver())
	}
	// The pass that follows the action reports the new driver.
	testwait.Until(t, 10*time.Second, "a result with the new driver", func() bool {
		found := false
		c.get(func(c *fakeCoord) {
			for _, r := range c.results {
				if r.GetInventory().GetDriverVersion() == "550.54.15" {
					found = true
				}
			}
		})
		return found
	})
}

// recMulti is a simulated node that records the multi-node launches.
type recMulti struct {
	*sim.Node
	mu   sync.Mutex
	runs []host.MultiNodeRun
}

func (h *recMulti) RunMultiNode(ctx context.Context, run host.MultiNodeRun) host.Capture {
	h.mu.Lock()
	h.runs = append(h.runs, run)
	h.mu.Unlock()
	return h.Node.RunMultiNode(ctx, run)
}

func multiTestConfig(t *testing.T, node string) *Config {
	t.Helper()
	c, err := ParseConfig([]byte(`node: ` + node + `
coordinator: 127.0.0.1:1
insecure: true
multi_node:
  launcher_command: [mpirun, -H, "{hosts}", -np, "{np}", all_reduce_perf, -b, 8G, -e, 8G, -g, "8"]
  allowed_peers: 'gpu-[0-9]{3}'
`))
	if err != nil {
		t.Fatal(err)
	}
	base := testConfig(t)
	base.Node = node
	base.Activity = ActivityIdle
	base.Interval = config.Duration(time.Hour) // one pass at start: these tests watch requested runs
	base.EnabledChecks = []string{"gpu.inventory", "nccl.allreduce"}
	base.MultiNode = c.MultiNode
	return base
}

func multiRun(work, multi string, role fleetcheckv1.MultiRole, participants ...string) *fleetcheckv1.RunChecks {
	return &fleetcheckv1.RunChecks{WorkId: work, Checks: []string{"nccl.allreduce"}, TimeoutMs: 20000,
		Role: role, Participants: participants, MultiId: multi}
}

func resultOf(t *testing.T, c *fakeCoord, work string) *fleetcheckv1.Result {
	t.Helper()
	testwait.Until(t, 15*time.Second, "result of "+work, func() bool {
		return c.hasState(work, fleetcheckv1.WorkStatus_STATE_DONE) != nil
	})

	var r *fleetcheckv1.Result
	id := c.hasState(work, fleetcheckv1.WorkStatus_STATE_DONE).GetResultId()
	c.get(func(c *fakeCoord) { r = c.results[id] })
	if r == nil {
		t.Fatalf("%s: DONE without a stored result", work)
	}
	return r
}

func TestMultiNodeParticipantsValidated(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	h := &recMulti{Node: simAgentHost(t, "gpu-001")}
	startAgent(t, multiTestConfig(t, "gpu-001"), h, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)
	launcher := fleetcheckv1.MultiRole_MULTI_ROLE_LAUNCHER
	bad := []struct {
		rc   *fleetcheckv1.RunChecks
		says string
	}{
		{multiRun("m1", "x1", launcher, "gpu-001", "gpu-002;reboot"), "is not a host name"},
		{multiRun("m2", "x2", launcher, "gpu-001", "$(id)"), "is not a host name"},
		{multiRun("m3", "x3", launcher, "gpu-001", "evil-host"), "does not match multi_node.allowed_peers"},
		{multiRun("m4", "x4", launcher, "gpu-002", "gpu-001"), "the launcher comes first"},
		{multiRun("m5", "x5", launcher, "gpu-001", "gpu-001"), "named twice"},
		{multiRun("m6", "x6", launcher, "gpu-001"), "1 participants"},
		{multiRun("m7", "", launcher, "gpu-001", "gpu-002"), "multi_id"},
		{multiRun("m8", "x8", fleetcheckv1.MultiRole_MULTI_ROLE_PEER, "gpu-001", "gpu-002"), "a peer must be among the participants after the launcher"},
		{&fleetcheckv1.RunChecks{WorkId: "m9", Checks: []string{"gpu.inventory"}, Role: launcher, Participants: []string{"gpu-001", "gpu-002"}, MultiId: "x9"}, "only nccl.allreduce"},
		{&fleetcheckv1.RunChecks{WorkId: "m10", Checks: []string{"nccl.allreduce"}, Role: launcher, Participants: []string{"gpu-001", "gpu-002"}, MultiId: "x10",
			Params: map[string]string{"max_bytes": "1G"}}, "takes no parameters"},
	}
	for _, b := range bad {
		c.runChecks(t, b.rc)
		testwait.Until(t, 5*time.Second, "refusal of "+b.rc.GetWorkId(), func() bool {
			return c.hasState(b.rc.GetWorkId(), fleetcheckv1.WorkStatus_STATE_REFUSED) != nil
		})

		if st := c.hasState(b.rc.GetWorkId(), fleetcheckv1.WorkStatus_STATE_REFUSED); !strings.Contains(st.GetReason(), b.says) {
			t.Errorf("%s: refused %q, want it to say %q", b.rc.GetWorkId(), st.GetReason(), b.says)
		}
	}
	h.mu.Lock()
	n := len(h.runs)
	h.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d launches despite refusals", n)
	}

	// A valid launch: the names go into the command as whole arguments.
	c.runChecks(t, multiRun("m11", "x11", launcher, "gpu-001", "gpu-002"))
	r := resultOf(t, c, "m11")
	h.mu.Lock()
	run := h.runs[0]
	h.mu.Unlock()
	want := []string{"mpirun", "-H", "gpu-001,gpu-002", "-np", "2", "all_reduce_perf", "-b", "8G", "-e", "8G", "-g", "8"}
	if !slices.Equal(run.Argv, want) || run.Ranks != 2 {
		t.Errorf("launched %q (%d ranks), want %q", run.Argv, run.Ranks, want)
	}
	chk := r.GetChecks()[0]
	bw := wire.MetricsFromProto(chk.GetMetrics())["nccl.allreduce2.busbw_gbps"]
	if chk.GetName() != "nccl.allreduce" || chk.GetStatus() != "pass" || bw < 440 || bw > 490 ||
		wire.MetricsFromProto(chk.GetMetrics())["nccl.allreduce.busbw_gbps"] != bw || !strings.Contains(chk.GetReason(), "2-node run x11") {
		t.Errorf("2-node result: %s %s %q metrics %v", chk.GetName(), chk.GetStatus(), chk.GetReason(), wire.MetricsFromProto(chk.GetMetrics()))
	}
}

func TestMultiNodePeerReservation(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	startAgent(t, multiTestConfig(t, "gpu-001"), simAgentHost(t, "gpu-001"), tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)

	c.runChecks(t, multiRun("p1", "mp1", fleetcheckv1.MultiRole_MULTI_ROLE_PEER, "gpu-002", "gpu-001"))
	testwait.Until(t, 5*time.Second, "peer accepted", func() bool {
		return c.hasState("p1", fleetcheckv1.WorkStatus_STATE_ACCEPTED) != nil
	})

	// Reserved: no other disruptive check, no second run.
	c.runChecks(t, &fleetcheckv1.RunChecks{WorkId: "w1", Checks: []string{"nccl.allreduce"}, TimeoutMs: 5000})
	c.runChecks(t, multiRun("p2", "mp2", fleetcheckv1.MultiRole_MULTI_ROLE_PEER, "gpu-003", "gpu-001"))
	for _, id := range []string{"w1", "p2"} {
		testwait.Until(t, 5*time.Second, id+" refused", func() bool {
			st := c.hasState(id, fleetcheckv1.WorkStatus_STATE_REFUSED)
			return st != nil && strings.Contains(st.GetReason(), "reserved by multi-node run mp1")
		})
	}
	// The run ends: the peer reports the launcher's measurement as its side.
	c.send(t, &fleetcheckv1.CoordinatorMessage{Msg: &fleetcheckv1.CoordinatorMessage_EndMulti{EndMulti: &fleetcheckv1.EndMulti{
		MultiId: "mp1", Launcher: "gpu-002", LauncherResultId: "r-launch",
		Check: &fleetcheckv1.CheckResult{Name: "nccl.allreduce", Status: "pass", Metrics: wire.MetricsToProto(map[string]float64{"nccl.allreduce2.busbw_gbps": 461.5})},
	}}})
	r := resultOf(t, c, "p1")
	chk := r.GetChecks()[0]
	if chk.GetStatus() != "pass" || wire.MetricsFromProto(chk.GetMetrics())["nccl.allreduce2.busbw_gbps"] != 461.5 ||
		!strings.Contains(chk.GetReason(), "measured by launcher gpu-002 (result r-launch)") {
		t.Errorf("peer side: %s %q %v", chk.GetStatus(), chk.GetReason(), wire.MetricsFromProto(chk.GetMetrics()))
	}
	// Released: a disruptive check runs again.
	c.runChecks(t, &fleetcheckv1.RunChecks{WorkId: "w2", Checks: []string{"nccl.allreduce"}, TimeoutMs: 10000})
	if r := resultOf(t, c, "w2"); r.GetChecks()[0].GetStatus() != "pass" {
		t.Errorf("after release: %v", r.GetChecks()[0])
	}

	// A peer whose run is called off reports a skip; one never told, an error.
	c.runChecks(t, multiRun("p3", "mp3", fleetcheckv1.MultiRole_MULTI_ROLE_PEER, "gpu-002", "gpu-001"))
	testwait.Until(t, 5*time.Second, "peer accepted", func() bool { return c.hasState("p3", fleetcheckv1.WorkStatus_STATE_ACCEPTED) != nil })
	c.send(t, &fleetcheckv1.CoordinatorMessage{Msg: &fleetcheckv1.CoordinatorMessage_EndMulti{EndMulti: &fleetcheckv1.EndMulti{
		MultiId: "mp3", AbortReason: "peer gpu-004 refused"}}})
	if chk := resultOf(t, c, "p3").GetChecks()[0]; chk.GetStatus() != "skip" || !strings.Contains(chk.GetReason(), "called off: peer gpu-004 refused") {
		t.Errorf("called off: %s %q", chk.GetStatus(), chk.GetReason())
	}
	rc := multiRun("p4", "mp4", fleetcheckv1.MultiRole_MULTI_ROLE_PEER, "gpu-002", "gpu-001")
	rc.TimeoutMs = 300
	c.runChecks(t, rc)
	if chk := resultOf(t, c, "p4").GetChecks()[0]; chk.GetStatus() != "error" || !strings.Contains(chk.GetReason(), "no end of multi-node run mp4") {
		t.Errorf("never ended: %s %q", chk.GetStatus(), chk.GetReason())
	}
}

func TestRunChecksParams(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	startAgent(t, multiTestConfig(t, "gpu-001"), simAgentHost(t, "gpu-001"), tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)
	bad := []struct {
		id     string
		checks []string
		params map[string]string
		says   string
	}{
		{"b1", []string{"nccl.allreduce"}, map[string]string{"max_bytes": "8G; reboot"}, "does not match"},
		{"b2", []string{"nccl.allreduce"}, map[string]string{"launcher": "srun"}, `unknown parameter "launcher"`},
		{"b3", []string{"nccl.allreduce"}, map[string]string{"level": "2"}, "applies to dcgm.diag"},
		{"b4", []string{"nccl.allreduce"}, map[string]string{"step_factor": "1"}, "does not match"},
	}
	for _, b := range bad {
		c.runChecks(t, &fleetcheckv1.RunChecks{WorkId: b.id, Checks: b.checks, Params: b.params})
		testwait.Until(t, 5*time.Second, b.id+" refused", func() bool {
			return c.hasState(b.id, fleetcheckv1.WorkStatus_STATE_REFUSED) != nil
		})

		if st := c.hasState(b.id, fleetcheckv1.WorkStatus_STATE_REFUSED); !strings.Contains(st.GetReason(), b.says) {
			t.Errorf("%s: %q, want %q", b.id, st.GetReason(), b.says)
		}
	}
	// Accepted parameters reach the tool: the sweep stops at 1 GiB.
	c.runChecks(t, &fleetcheckv1.RunChecks{WorkId: "g1", Checks: []string{"nccl.allreduce"}, Params: map[string]string{"max_bytes": "1G"}, TimeoutMs: 10000})
	chk := resultOf(t, c, "g1").GetChecks()[0]
	if got := wire.MetricsFromProto(chk.GetMetrics())["nccl.allreduce.size_bytes"]; got != 1<<30 {
		t.Errorf("largest size %v, want 1 GiB (%s %q)", got, chk.GetStatus(), chk.GetReason())
	}
}

// TestMultiNodeBackToBack: the coordinator's next multi-node run may
// follow an EndMulti at once on the same stream (a sweep's pairs, one
// after the other); the peer must have released its reservation by then.
// The release used to wait for the peer's result to be spooled, and the
// next run was refused as "reserved by multi-node run" the one before.
func TestMultiNodeBackToBack(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	startAgent(t, multiTestConfig(t, "gpu-001"), simAgentHost(t, "gpu-001"), tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)
	end := func(multi string) *fleetcheckv1.CoordinatorMessage {
		return &fleetcheckv1.CoordinatorMessage{Msg: &fleetcheckv1.CoordinatorMessage_EndMulti{EndMulti: &fleetcheckv1.EndMulti{
			MultiId: multi, Launcher: "gpu-002", LauncherResultId: "r-" + multi,
			Check: &fleetcheckv1.CheckResult{Name: "nccl.allreduce", Status: "pass"},
		}}}
	}
	for i := 1; i <= 5; i++ {
		work, multi := fmt.Sprintf("p%d", i), fmt.Sprintf("mp%d", i)
		c.runChecks(t, multiRun(work, multi, fleetcheckv1.MultiRole_MULTI_ROLE_PEER, "gpu-002", "gpu-001"))
		testwait.Until(t, 5*time.Second, work+" accepted", func() bool {
			if st := c.hasState(work, fleetcheckv1.WorkStatus_STATE_REFUSED); st != nil {
				t.Fatalf("%s refused right after the previous run's end: %s", work, st.GetReason())
			}
			return c.hasState(work, fleetcheckv1.WorkStatus_STATE_ACCEPTED) != nil
		})
		c.send(t, end(multi)) // and the next run at once
	}
	if chk := resultOf(t, c, "p5").GetChecks()[0]; chk.GetStatus() != "pass" {
		t.Errorf("last peer side: %s %q", chk.GetStatus(), chk.GetReason())
	}
}

// TestPassAfterActionSaysSo: the quick pass right after an action says
// after_action, the schedule's own say schedule, a requested run request:
// a drill times detection by the schedule only (a real fault triggers no
// pass), and the kick leaves the schedule's beat alone.
func TestPassAfterActionSaysSo(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	cfg := actionTestConfig(t, "gpu-001")
	cfg.Interval = config.Duration(time.Hour) // only the start pass and the kicked one
	startAgent(t, cfg, &recHost{}, tn)
	testwait.Until(t, 10*time.Second, "the start pass stored", func() bool { return c.stored() == 1 })
	c.send(t, runAction("a1", "driver-upgrade", map[string]string{"version": "550.54.15"}, 0, 0))
	if st := waitAction(t, c, "a1"); st.GetState() != fleetcheckv1.ActionStatus_STATE_DONE {
		t.Fatalf("a1: %s %q", st.GetState(), st.GetMessage())
	}
	testwait.Until(t, 10*time.Second, "the pass after the action stored", func() bool { return c.stored() == 2 })
	var got []*fleetcheckv1.Result
	c.get(func(c *fakeCoord) {
		for _, r := range c.results {
			got = append(got, r)
		}
	})
	slices.SortFunc(got, func(a, b *fleetcheckv1.Result) int { return strings.Compare(a.GetId(), b.GetId()) })
	if got[0].GetTrigger() != wire.TriggerSchedule || got[1].GetTrigger() != wire.TriggerAfterAction {
		t.Errorf("triggers %q, %q: want schedule, after_action", got[0].GetTrigger(), got[1].GetTrigger())
	}
}
