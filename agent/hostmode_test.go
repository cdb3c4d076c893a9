//go:build !node

package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

const hostBase = "node: gpu-001\ncoordinator: 127.0.0.1:1\ninsecure: true\n"

// simActionsYAML sets and clears simulated faults through the agent's
// actions, as a staging fleet's drills do.
const simActionsYAML = `
actions:
  sim-fault:
    command: [sim-fault, "{kind}", "{target}"]
    params: {kind: '[a-z_]+', target: '[A-Za-z0-9_]+'}
    timeout: 5s
  sim-clear:
    command: [sim-clear, "{kind}", "{target}"]
    params: {kind: '[a-z_]+', target: '[A-Za-z0-9_]+'}
    timeout: 5s
  driver-upgrade:
    command: [driver-upgrade, "{version}"]
    params: {version: '5[0-9]{2}\.[0-9]+(\.[0-9]+)?'}
    timeout: 10s
    disruptive: true
`

func TestHostModeConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, yaml, says string }{
		{"live by default", "", ""},
		{"live explicit", "host: {mode: live}\n", ""},
		{"sim", "host: {mode: sim, sku: a100, seed: 7, action_delay: 2s, faults: [ib_port_down mlx5_4, ecc_uncorrectable GPU3 2]}\n" + simActionsYAML, ""},
		{"bundle", "host: {mode: bundle, path: ../examples/bundles/h100-healthy}\n", ""},
		{"unknown mode", "host: {mode: vm}\n", `host.mode "vm": live, sim or bundle`},
		{"sim key on live", "host: {sku: h100}\n", "apply to mode sim or bundle, not live"},
		{"path on sim", "host: {mode: sim, path: x}\n", "host.path applies to mode bundle"},
		{"bad sku", "host: {mode: sim, sku: b200}\n", `host.sku "b200": h100 or a100`},
		{"bad fault", "host: {mode: sim, faults: [gpu_on_fire GPU0]}\n", `host.faults[0]: sim: bad fault: unknown fault kind "gpu_on_fire"`},
		{"long delay", "host: {mode: sim, action_delay: 1h}\n", "host.action_delay 1h0m0s: between 0 and 10m0s"},
		{"long tool time", "host: {mode: sim, long_tool_time: 11m}\n", "host.long_tool_time 11m0s: between 0 and 10m0s"},
		{"tool time on live", "host: {long_tool_time: 1s}\n", "not live"},
		{"sim with host_root", "host_root: /host\nhost: {mode: sim}\n", `host_root "/host" reads the real machine; host mode sim reads none`},
		{"sim with tool paths", "host: {mode: sim}\nchecks: {tools: {nvidia_smi: /opt/bin/nvidia-smi}}\n", "checks.tools: tool paths"},
		{"sim with tool timeouts", "host: {mode: sim}\nchecks: {tools: {timeout: 10s}}\n", ""},
		{"sim with a program action", "host: {mode: sim}\nactions: {up: {command: [/usr/local/sbin/fleetcheck-driver, up]}}\n",
			`actions.up: command[0] "/usr/local/sbin/fleetcheck-driver" is a program, but host mode sim runs the simulator's built-in actions only`},
		{"bundle without path", "host: {mode: bundle}\n", "host.path: the bundle to replay is required"},
		{"bundle with sim keys", "host: {mode: bundle, path: b, seed: 3}\n", "apply to mode sim, not bundle"},
		{"bundle with actions", "host: {mode: bundle, path: b}\nactions: {up: {command: [x]}}\n", "a replayed bundle cannot run actions"},
		{"bundle with multi_node", "host: {mode: bundle, path: b}\nmulti_node: {launcher_command: [mpirun, '{hosts}'], allowed_peers: 'gpu-.*'}\n",
			"a replayed bundle cannot run multi-node tests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseConfig([]byte(hostBase + tc.yaml))
			switch {
			case tc.says == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says)):
				t.Fatalf("error %v, want it to say %q", err, tc.says)
			}
		})
	}
}

func simHostConfig(t *testing.T, dir, extra string) *Config {
	t.Helper()
	c, err := ParseConfig([]byte(hostBase + "state_dir: " + dir + "\n" + extra))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSimHostKeepsState: the simulated node outlives the agent process.
// Reopened on the same state dir it has the driver an upgrade installed
// and the faults in place; the configured boot faults apply only to a
// new node; the upgrade count says how often the driver was changed.
func TestSimHostKeepsState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	cfg := simHostConfig(t, dir, "host: {mode: sim, seed: 3, faults: [ib_port_down mlx5_4]}\n")
	h, err := OpenHost(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	runner := h.(*simHost)
	if fs := runner.Faults(); len(fs) != 1 || fs[0] != (sim.IBPortDown{HCA: "mlx5_4"}) {
		t.Fatalf("boot faults: %v", fs)
	}
	if _, err := runner.RunAction(ctx, sim.ActionDriverUpgrade, []string{"550.90.07"}); err != nil {
		t.Fatal(err)
	}
	if _, err := runner.RunAction(ctx, sim.ActionFault, []string{"xid", "GPU2", "48"}); err != nil {
		t.Fatal(err)
	}
	st, err := ReadSimState(filepath.Join(dir, SimStateFile))
	if err != nil || st.Driver != "550.90.07" || st.Actions[sim.ActionDriverUpgrade] != 1 || len(st.Faults) != 2 {
		t.Fatalf("state file after the actions: %+v, %v", st, err)
	}

	// "Restart": a new host on the same state dir.
	h2, err := OpenHost(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	again := h2.(*simHost)
	if again.Driver() != "550.90.07" || again.ActionCount(sim.ActionDriverUpgrade) != 1 || !again.Boot().Equal(runner.Boot()) {
		t.Errorf("after the restart: driver %s, upgrades %d, boot %v (was %v)", again.Driver(),
			again.ActionCount(sim.ActionDriverUpgrade), again.Boot(), runner.Boot())
	}
	if !slices.Equal(again.Faults(), runner.Faults()) {
		t.Errorf("faults after the restart %v, want %v", again.Faults(), runner.Faults())
	}
	// Cleared, the boot fault does not come back with the next start.
	if _, err := again.RunAction(ctx, sim.ActionClear, nil); err != nil {
		t.Fatal(err)
	}
	h3, err := OpenHost(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if fs := h3.(*simHost).Faults(); len(fs) != 0 {
		t.Errorf("faults after clear and restart: %v", fs)
	}

	// A state file that cannot be read stops the start: a node that
	// forgot its driver would mislead every campaign.
	if err := os.WriteFile(filepath.Join(dir, SimStateFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenHost(cfg, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "remove the file to start the node afresh") {
		t.Errorf("unreadable state: %v", err)
	}
}

// TestSimHostAgent: an agent in sim mode reports the simulated node, and
// a fault set and cleared through its configured actions shows in the
// next result and goes away after the clear.
func TestSimHostAgent(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	cfg := simHostConfig(t, t.TempDir(), "host: {mode: sim}\nactivity: idle\n"+simActionsYAML)
	cfg.Coordinator = "passthrough:///coordinator"
	cfg.Interval = config.Duration(time.Hour)
	h, err := OpenHost(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	startAgent(t, cfg, h, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)

	ibPorts := func(want string) func() bool {
		return func() bool {
			found := false
			c.get(func(c *fakeCoord) {
				for _, r := range c.results {
					for _, ch := range r.GetChecks() {
						if ch.GetName() == "ib.ports" && ch.GetStatus() == want {
							found = true
						}
					}
				}
			})
			return found
		}
	}
	testwait.Until(t, 15*time.Second, "a healthy result from the simulated node", ibPorts("pass"))

	c.send(t, runAction("f1", "sim-fault", map[string]string{"kind": "ib_port_down", "target": "mlx5_3"}, 0, 0))
	if st := waitAction(t, c, "f1"); st.GetState() != fleetcheckv1.ActionStatus_STATE_DONE {
		t.Fatalf("sim-fault: %s %q", st.GetState(), st.GetMessage())
	}
	testwait.Until(t, 15*time.Second, "ib.ports failing after the injected fault", ibPorts("fail"))

	c.set(func(c *fakeCoord) { clear(c.results) })
	c.send(t, runAction("c1", "sim-clear", map[string]string{"kind": "ib_port_down", "target": "mlx5_3"}, 0, 0))
	if st := waitAction(t, c, "c1"); st.GetState() != fleetcheckv1.ActionStatus_STATE_DONE {
		t.Fatalf("sim-clear: %s %q", st.GetState(), st.GetMessage())
	}
	testwait.Until(t, 15*time.Second, "ib.ports passing after the clear", ibPorts("pass"))
}

// TestBundleHostAgent: an agent replaying a bundle reports what the
// bundle holds (the example's IB port down) under its own node name.
func TestBundleHostAgent(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	cfg := simHostConfig(t, t.TempDir(), "host: {mode: bundle, path: ../examples/bundles/h100-ibdown-pcie}\n")
	cfg.Node = "staging-7"
	cfg.Coordinator = "passthrough:///coordinator"
	h, err := OpenHost(cfg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	startAgent(t, cfg, h, tn)
	testwait.Until(t, 15*time.Second, "a result with ib.ports failing", func() bool {
		found := false
		c.get(func(c *fakeCoord) {
			for _, r := range c.results {
				for _, ch := range r.GetChecks() {
					if ch.GetName() == "ib.ports" && ch.GetStatus() == "fail" && r.GetNode() == "staging-7" {
						found = true
					}
				}
			}
		})
		return found
	})

	if _, err := OpenHost(simHostConfig(t, t.TempDir(), "host: {mode: bundle, path: /nonexistent/bundle}\n"), zerolog.Nop()); err == nil ||
		!strings.Contains(err.Error(), "host mode bundle") {
		t.Errorf("missing bundle: %v", err)
	}
}

// TestSimHostLongTools: all_reduce_perf takes long_tool_time, and a
// deadline cuts it short with a timeout, as on a real node; passive
// sources answer at once.
func TestSimHostLongTools(t *testing.T) {
	t.Parallel()
	h, err := OpenHost(simHostConfig(t, t.TempDir(), "host: {mode: sim, long_tool_time: 300ms}\n"), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if c := h.Capture(context.Background(), snapshot.SrcAllReduce); c.State != snapshot.StateOK || time.Since(start) < 300*time.Millisecond {
		t.Errorf("all_reduce_perf: %s after %s", c.State, time.Since(start))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if c := h.Capture(ctx, snapshot.SrcAllReduce); c.State != snapshot.StateTimeout {
		t.Errorf("all_reduce_perf past its deadline: %s %q", c.State, c.Err)
	}
	start = time.Now()
	if c := h.Capture(context.Background(), snapshot.SrcNvidiaSMI); c.State != snapshot.StateOK || time.Since(start) > 200*time.Millisecond {
		t.Errorf("nvidia-smi: %s after %s", c.State, time.Since(start))
	}
}
