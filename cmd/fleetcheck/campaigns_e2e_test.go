package main

// End-to-end tests of the operator's campaign verbs: `fleetcheck rollout`,
// `burnin` and `drill` run as the operator runs them (the root cobra
// command, flags and all), against a real coordinator whose campaigns run
// over real agents on simulated nodes, everything on 127.0.0.1. Each test
// asserts on what the CLI prints and on what the fleet did: the simulated
// nodes' drivers and ports, the drain adapter's record, the coordinator's
// store.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
)

// e2eAgentYAML configures the agents (startAgent adds the node, the
// coordinator and enabled_checks): the actions a rollout, a burn-in and a
// drill send, each running the simulator's built-in action of its
// command's program name.
const e2eAgentYAML = `
insecure: true
metrics_listen: "off"
activity: idle
interval: 1h
actions:
  driver-upgrade:
    command: [driver-upgrade, "{version}"]
    params: {version: '5[0-9]{2}\.[0-9]+(\.[0-9]+)?'}
    timeout: 30s
    disruptive: true
  driver-rollback:
    command: [driver-rollback, "{version}"]
    params: {version: '5[0-9]{2}\.[0-9]+(\.[0-9]+)?'}
    timeout: 30s
    disruptive: true
  ib-port-down:
    command: [ib-port-down, "{hca}"]
    params: {hca: 'mlx5_[0-9]+', port: '[0-9]'}
    revert: ib-port-down-revert
  ib-port-down-revert:
    command: [ib-port-up, "{hca}"]
    params: {hca: 'mlx5_[0-9]+', port: '[0-9]'}
  gpu-burn:
    command: [gpu-burn, "{duration}"]
    params: {duration: '[0-9]+[sm]'}
    timeout: 2m
    disruptive: true
`

// e2eEnabledChecks is every passive check and nccl.allreduce. Every
// passive check must be enabled: only a pass that ran them all is "full",
// and a node without a full result stays initializing, never healthy (a
// drill refuses such a target).
func e2eEnabledChecks() []string {
	var out []string
	for _, c := range registry.All() {
		if !c.Disruptive() || c.Name() == "nccl.allreduce" {
			out = append(out, c.Name())
		}
	}
	return out
}

// e2eClock is the campaigns' clock. Its Now runs scale times faster than
// the wall clock from the moment it is made (scale 1: the wall clock), and
// After waits the matching wall time, at most maxWait: the engines' idle
// polls (5 s, 15 s) become short without changing what they decide, since
// every decision is taken against Now.
//
// A scale above 1 is only for engines that never compare the clock with
// the times agents write into their reports (the rollout's per-node waits
// are all its own clock's); the drill reads report collection times, so it
// runs at scale 1.
type e2eClock struct {
	base    time.Time
	scale   float64
	maxWait time.Duration

	mu sync.Mutex
	// polls counts each engine's loop waits ("burnin", "rollout"): a wait
	// follows a pass over every campaign, so a test that needs "the engine
	// looked again" waits on this count instead of sleeping.
	polls map[string]int
}

func newE2EClock(scale float64) *e2eClock {
	return &e2eClock{base: time.Now(), scale: scale, maxWait: 100 * time.Millisecond, polls: map[string]int{}}
}

// e2eEngineLoop names the engine whose Run loop called After ("burnin"
// for campaigns/burnin.(*Engine).Run), or "" for any other caller.
func e2eEngineLoop() string {
	var pcs [8]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs[:])])
	for {
		fr, more := frames.Next()
		if pkg, ok := strings.CutSuffix(fr.Function, ".(*Engine).Run"); ok {
			if i := strings.LastIndex(pkg, "/campaigns/"); i >= 0 {
				return pkg[i+len("/campaigns/"):]
			}
		}
		if !more {
			return ""
		}
	}
}

// waitPolls waits until engine's loop has made n more passes from now.
// The pass running now may have read the state before the caller's last
// change, so one more is waited for.
func (c *e2eClock) waitPolls(t *testing.T, engine string, n int) {
	t.Helper()
	c.mu.Lock()
	want := c.polls[engine] + n + 1
	c.mu.Unlock()
	t.Logf("%s engine: %d passes so far, waiting for %d", engine, want-n-1, want)
	testwait.For(t, 30*time.Second, fmt.Sprintf("%d passes of the %s engine", n, engine), func() (bool, string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.polls[engine] >= want, fmt.Sprintf("%d of %d", c.polls[engine], want)
	})
}

func (c *e2eClock) Now() time.Time {
	now := time.Now()
	if c.scale == 1 {
		return now
	}
	return c.base.Add(time.Duration(float64(now.Sub(c.base)) * c.scale))
}

func (c *e2eClock) After(d time.Duration) <-chan time.Time {
	if e := e2eEngineLoop(); e != "" {
		c.mu.Lock()
		c.polls[e]++
		c.mu.Unlock()
	}
	wall := min(time.Duration(float64(d)/c.scale), c.maxWait)
	ch := make(chan time.Time, 1)
	time.AfterFunc(wall, func() { ch <- c.Now() })
	return ch
}

// e2eLogs keeps the fleet's log lines, shown when a test fails.
type e2eLogs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *e2eLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *e2eLogs) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := strings.Split(strings.TrimRight(l.buf.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// e2eDrainEvent is one change the campaigns made through the drain adapter.
type e2eDrainEvent struct {
	node    string
	drained bool
	reason  string
}

// e2eFleet is a coordinator, its agents on simulated nodes, and the drain
// adapter campaigns use (drain.None: it records, so the test can read what
// was taken out of service and given back).
type e2eFleet struct {
	t     *testing.T
	clock *e2eClock
	srv   *coordinator.Server
	drain *drain.None
	nodes map[string]*sim.Node
	conn  []string // the CLI's flags to reach the coordinator
	logs  *e2eLogs

	mu     sync.Mutex
	drains []e2eDrainEvent
}

// e2eNode is one simulated node: its name, labels and faults present at
// boot.
type e2eNode struct {
	name   string
	labels map[string]string
	faults []sim.Fault
	// interval, when set, is the agent's own check interval (else 1h).
	interval time.Duration
}

func newE2EFleet(t *testing.T, clock *e2eClock, nodes ...e2eNode) *e2eFleet {
	t.Helper()
	return newE2EFleetWith(t, clock, nil, nodes...)
}

// newE2EFleetWith is newE2EFleet with the coordinator's config adjusted
// by mod (a drain policy).
func newE2EFleetWith(t *testing.T, clock *e2eClock, mod func(*coordinator.Config), nodes ...e2eNode) *e2eFleet {
	t.Helper()
	f := &e2eFleet{t: t, clock: clock, nodes: map[string]*sim.Node{}, logs: &e2eLogs{}}
	f.drain = drain.NewNone(func(node string, st drain.Status) {
		f.mu.Lock()
		f.drains = append(f.drains, e2eDrainEvent{node: node, drained: st.Drained, reason: st.Reason})
		f.mu.Unlock()
	})
	log := zerolog.New(f.logs).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	cfg := coordinator.Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(),
		HeartbeatInterval: time.Second, Insecure: true}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := coordinator.New(cfg, coordinator.Options{Logger: log.With().Str("component", "coordinator").Logger(),
		Version: "e2e", CampaignClock: clock, Drain: f.drain})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	f.conn = []string{"--insecure", "--coordinator", srv.GRPCAddr().String()}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last log lines:\n%s", f.logs.tail(60))
		}
	})
	// Registered before the agents' cleanups, so it runs after them.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			t.Errorf("stop coordinator: %v", err)
		}
	})
	fabric := sim.NewFabric()
	for _, n := range nodes {
		f.startAgent(n, fabric, log)
	}
	names := make([]string, 0, len(nodes))
	for _, n := range nodes {
		names = append(names, n.name)
	}
	f.waitFor(20*time.Second, "every agent connected after its first pass", func() bool {
		got, err := srv.Fleet().Nodes(context.Background(), "name in ("+strings.Join(names, ",")+")")
		if err != nil || len(got) != len(names) {
			return false
		}
		for _, n := range got {
			if !n.Connected || n.Inventory.DriverVersion == "" || n.State == coordinator.StateInitializing || n.State == "" {
				return false
			}
		}
		return true
	})
	return f
}

func (f *e2eFleet) startAgent(n e2eNode, fabric *sim.Fabric, log zerolog.Logger) {
	t := f.t
	t.Helper()
	spec := sim.DefaultSpec(n.name)
	spec.Fabric = fabric
	spec.Labels = n.labels
	sn, err := sim.New(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range n.faults {
		if err := sn.AddFault(x); err != nil {
			t.Fatalf("%s: %v", n.name, err)
		}
	}
	cfg, err := agent.ParseConfig([]byte("node: " + n.name + "\ncoordinator: " + f.srv.GRPCAddr().String() + "\n" +
		"enabled_checks: [" + strings.Join(e2eEnabledChecks(), ", ") + "]\n" + e2eAgentYAML))
	if err != nil {
		t.Fatal(err)
	}
	cfg.StateDir = t.TempDir()
	cfg.Labels = n.labels
	if n.interval > 0 {
		cfg.Interval = config.Duration(n.interval)
	}
	cfg.Reconnect.Initial = config.Duration(50 * time.Millisecond)
	cfg.Reconnect.Max = config.Duration(200 * time.Millisecond)
	a, err := agent.New(cfg, sn, log.With().Str("component", "agent").Str("node", n.name).Logger(), agent.WithVersion("e2e"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := a.Run(ctx); err != nil {
			t.Errorf("agent %s: %v", n.name, err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	f.nodes[n.name] = sn
}

// cli runs `fleetcheck ARGS --insecure --coordinator ADDR` and fails the
// test unless it exits 0.
func (f *e2eFleet) cli(args ...string) string {
	f.t.Helper()
	out, code := execute(f.t, append(args, f.conn...)...)
	if code != exitOK {
		f.t.Fatalf("fleetcheck %s: exit %d:\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// e2eJSON runs a verb with -o json and decodes what it printed.
func e2eJSON[T any](f *e2eFleet, args ...string) T {
	f.t.Helper()
	out := f.cli(append(args, "-o", "json")...)
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		f.t.Fatalf("fleetcheck %s -o json: %v:\n%s", strings.Join(args, " "), err, out)
	}
	return v
}

// e2ePoll calls get until done says yes; it fails the test with the last
// value after within.
func e2ePoll[T any](f *e2eFleet, within time.Duration, what string, get func() T, done func(T) bool) T {
	f.t.Helper()
	var v T
	testwait.For(f.t, within, what, func() (bool, string) {
		v = get()
		b, _ := json.MarshalIndent(v, "", "  ")
		return done(v), "\n" + string(b)
	})
	return v
}

func (f *e2eFleet) waitFor(within time.Duration, what string, cond func() bool) {
	f.t.Helper()
	testwait.Until(f.t, within, what, cond)
}

// drainLog returns the changes campaigns made to one node ("drain REASON",
// "undrain"), in order.
func (f *e2eFleet) drainLog(node string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.drains {
		if e.node != node {
			continue
		}
		if e.drained {
			out = append(out, "drain "+e.reason)
		} else {
			out = append(out, "undrain")
		}
	}
	return out
}

func (f *e2eFleet) drainState(node string) drain.Status {
	st, _ := f.drain.Status(context.Background(), node)
	return st
}

// auditEvents returns the coordinator's audit events as "ACTOR MESSAGE".
func (f *e2eFleet) auditEvents() []string {
	f.t.Helper()
	evs, err := f.srv.Store().Events(context.Background(), store.EventQuery{Kind: store.EventAudit, Limit: 500})
	if err != nil {
		f.t.Fatal(err)
	}
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.Actor+" "+e.Message)
	}
	return out
}

func (f *e2eFleet) hasAudit(parts ...string) bool {
	return slices.ContainsFunc(f.auditEvents(), func(e string) bool {
		for _, p := range parts {
			if !strings.Contains(e, p) {
				return false
			}
		}
		return true
	})
}

// e2eWriteSpec writes a spec file for -f.
func e2eWriteSpec(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// e2eStartedID reads the id from "KIND ID started".
func e2eStartedID(t *testing.T, kind, out string) string {
	t.Helper()
	fs := strings.Fields(out)
	if len(fs) != 3 || fs[0] != kind || fs[2] != "started" {
		t.Fatalf("%s start printed %q, want %q", kind, out, kind+" ID started")
	}
	return fs[1]
}

func e2eRack(n int, rack string, extra map[string]string) []e2eNode {
	var out []e2eNode
	for i := 1; i <= n; i++ {
		labels := map[string]string{"sku": "h100", "rack": rack}
		for k, v := range extra {
			labels[k] = v
		}
		out = append(out, e2eNode{name: fmt.Sprintf("gpu-%03d", i), labels: labels})
	}
	return out
}

// ---------------------------------------------------------------- drill

// TestDrillVerbsEndToEnd: a drill started with `drill start` takes an IB
// port of the opted-in node down through its agent, ib.ports detects it,
// the node is taken out of service (the test plays the scheduler's drain
// policy), the port comes back and the node is healthy again; `drill
// status` and `drill report` show the detection and the times. A second
// drill, watching a check that cannot see the fault, is cut short with
// `drill abort`, and the fault is reverted all the same. A drill on a node
// that did not opt in is refused and recorded.
func TestDrillVerbsEndToEnd(t *testing.T) {
	nodes := e2eRack(3, "r12", nil)
	nodes[1].labels["fleetcheck.io/drill"] = "allowed"
	// A drill times detection by what the target's agent reports on its
	// own schedule: every second here.
	nodes[1].interval = time.Second
	f := newE2EFleet(t, newE2EClock(1), nodes...)
	target := f.nodes["gpu-002"]

	// Refused: gpu-001 did not opt in. Exit 2, one line naming why, and the
	// refusal is kept in the drill history.
	refused := e2eWriteSpec(t, "refused.yaml", "fault: ib-port-down\ntargets: name=gpu-001\npoll_interval: 1s\ndeadline: 10s\n")
	out, code := execute(t, append([]string{"drill", "start", "-f", refused}, f.conn...)...)
	if code != exitCommand || !strings.Contains(out, "opt-in label") || !strings.Contains(out, "gpu-001") {
		t.Fatalf("drill on a node without the opt-in label: exit %d:\n%s", code, out)
	}

	spec := e2eWriteSpec(t, "drill.yaml", `
name: e2e-ib-loss
fault: ib-port-down
params: {hca: mlx5_4, port: "1"}
expect:
  check: ib.ports
  code: IB_PORT_DOWN
  out_of_service: true
  out_of_service_within: 20s
targets: "rack=r12,name=gpu-002"
blast_radius: {max_nodes: 1}
deadline: 30s
poll_interval: 1s
watch: [gpu.inventory, gpu.ecc, gpu.xid, ib.ports]
revert_after: 1m
revert_on_disconnect: 30s
recover_grace: 20s
who: oncall@example.com
`)
	id := e2eStartedID(t, "drill", f.cli("drill", "start", "-f", spec))
	status := func() e2eDrill { return e2eJSON[e2eDrill](f, "drill", "status", id) }

	// Detected: the drill waits for the node to be taken out of service.
	d := e2ePoll(f, 15*time.Second, "the drill to detect the fault", status, func(d e2eDrill) bool {
		return d.State != "running" || len(d.Targets) == 1 && d.Targets[0].State == "awaiting_out_of_service"
	})
	if d.State != "running" {
		t.Fatalf("drill ended before the node was taken out of service: %+v", d)
	}
	if !slices.ContainsFunc(target.Faults(), func(x sim.Fault) bool { return x.Kind() == sim.KindIBPortDown }) {
		t.Fatalf("gpu-002 has no IB port down while the drill watches it: %v", target.Faults())
	}
	// The scheduler's policy drains the failed node (not fleetcheck).
	f.drain.Set("gpu-002", drain.Status{Drained: true, Reason: "slurm: IB_PORT_DOWN mlx5_4"})

	d = e2ePoll(f, 20*time.Second, "the drill to finish", status, func(d e2eDrill) bool { return d.State != "running" })
	tg := d.Targets[0]
	if d.State != "done" || tg.Node != "gpu-002" || tg.DetectedBy != "ib.ports" || !tg.ExpectedDetected ||
		tg.InjectedAt.IsZero() || tg.DetectedAt.Before(tg.InjectedAt) || tg.OutOfServiceAt.IsZero() ||
		tg.RevertedBy != "coordinator" || tg.RecoveredAt.Before(tg.RevertedAt) || tg.Aborted {
		t.Fatalf("finished drill: %+v", d)
	}
	if !slices.ContainsFunc(tg.Detections, func(x e2eDrillDetection) bool {
		return x.Check == "ib.ports" && slices.ContainsFunc(x.Codes, func(c string) bool { return strings.HasPrefix(c, "IB_PORT_DOWN") })
	}) {
		t.Errorf("no IB_PORT_DOWN detection by ib.ports: %+v", tg.Detections)
	}
	if len(tg.Findings) != 0 {
		t.Errorf("a drill that went as expected has findings: %+v", tg.Findings)
	}
	if fs := target.Faults(); len(fs) != 0 {
		t.Errorf("gpu-002 still has faults after the revert: %v", fs)
	}
	// The table says the same.
	out = f.cli("drill", "status", id)
	if !strings.Contains(out, id) || !strings.Contains(out, "e2e-ib-loss") || !e2eHasLine(out, `gpu-002\s+done\s+.*\s+ib\.ports`) {
		t.Errorf("drill status table:\n%s", out)
	}

	// The report over drills: one refused, one target measured.
	rep := e2eJSON[e2eDrillReport](f, "drill", "report", "--fault", "ib-port-down")
	if rep.Drills != 2 || rep.Refused != 1 || len(rep.Rows) != 1 {
		t.Fatalf("drill report: %+v", rep)
	}
	row := rep.Rows[0]
	if row.Drill != id || row.DetectedBy != "ib.ports" || !row.ExpectedDetected || row.TTD == nil || row.TTR == nil ||
		row.OutOfService == nil || *row.TTD <= 0 || *row.TTR < *row.TTD {
		t.Errorf("report row: %+v", row)
	}
	// Detection is timed by the agent's own results, read beside its
	// interval, and the finding that matched is listed.
	if iv, err := time.ParseDuration(row.CheckInterval); err != nil || iv < 500*time.Millisecond || iv > 2*time.Second ||
		!slices.ContainsFunc(row.Findings, func(c string) bool { return strings.HasPrefix(c, "ib.ports:IB_PORT_DOWN") }) {
		t.Errorf("report row interval %q findings %v", row.CheckInterval, row.Findings)
	}
	if len(rep.ByFault) != 1 || rep.ByFault[0].Targets != 1 || rep.ByFault[0].Detected != 1 || rep.ByFault[0].Recovered != 1 ||
		rep.ByFault[0].MTTD == nil {
		t.Errorf("report by fault: %+v", rep.ByFault)
	}
	if out := f.cli("drill", "report"); !strings.Contains(out, "ib-port-down") {
		t.Errorf("drill report table:\n%s", out)
	}

	// Abort. The scheduler gives the node back; the coordinator must see
	// it healthy again before a drill may target it.
	f.drain.Set("gpu-002", drain.Status{})
	f.waitFor(10*time.Second, "gpu-002 healthy again", func() bool {
		n, err := f.srv.Store().Node(context.Background(), "gpu-002")
		return err == nil && n.State == coordinator.StateHealthy
	})
	gap := e2eWriteSpec(t, "gap.yaml", `
name: e2e-gap
fault: ib-port-down
params: {hca: mlx5_2}
expect: {check: gpu.xid}
targets: name=gpu-002
deadline: 1m
poll_interval: 1s
watch: [gpu.xid]
recover_grace: 20s
`)
	id2 := e2eStartedID(t, "drill", f.cli("drill", "start", "-f", gap))
	e2ePoll(f, 15*time.Second, "the second drill watching", func() e2eDrill { return e2eJSON[e2eDrill](f, "drill", "status", id2) },
		func(d e2eDrill) bool {
			return len(d.Targets) == 1 && d.Targets[0].State == "watching" && d.Targets[0].Polls >= 2
		})
	if !slices.ContainsFunc(target.Faults(), func(x sim.Fault) bool { return x.Kind() == sim.KindIBPortDown }) {
		t.Fatalf("the second drill's fault is not in place: %v", target.Faults())
	}
	if out := f.cli("drill", "abort", id2, "--reason", "game day over"); strings.TrimSpace(out) != id2+": abort requested" {
		t.Errorf("drill abort printed %q", out)
	}
	d = e2ePoll(f, 20*time.Second, "the aborted drill to finish", func() e2eDrill { return e2eJSON[e2eDrill](f, "drill", "status", id2) },
		func(d e2eDrill) bool { return d.State != "running" })
	tg = d.Targets[0]
	if d.State != "aborted" || !strings.Contains(d.Reason, "operator: game day over") || !tg.Aborted ||
		tg.RevertedBy != "coordinator" || !tg.DetectedAt.IsZero() ||
		!slices.ContainsFunc(tg.Findings, func(x e2eDrillFinding) bool { return x.Code == "aborted" }) {
		t.Fatalf("aborted drill: %+v", d)
	}
	if fs := target.Faults(); len(fs) != 0 {
		t.Errorf("gpu-002 still has faults after the aborted drill: %v", fs)
	}
	if !f.hasAudit("drill.abort", id2, "game day over") {
		t.Errorf("no audit event for the abort: %v", f.auditEvents())
	}
	// Aborting a finished drill is an error, exit 2.
	if out, code := execute(t, append([]string{"drill", "abort", id2}, f.conn...)...); code != exitCommand {
		t.Errorf("abort of a finished drill: exit %d:\n%s", code, out)
	}
	list := e2eJSON[[]e2eDrill](f, "drill", "list")
	states := map[string]int{}
	for _, d := range list {
		states[d.State]++
	}
	if len(list) != 3 || states["refused"] != 1 || states["done"] != 1 || states["aborted"] != 1 {
		t.Errorf("drill list: %v", states)
	}
}

// The drill documents as the CLI prints them (-o json), with the fields
// these tests read.
type e2eDrill struct {
	ID      string           `json:"id"`
	Name    string           `json:"name"`
	State   string           `json:"state"`
	Reason  string           `json:"reason"`
	Targets []e2eDrillTarget `json:"targets"`
}

type e2eDrillTarget struct {
	Node             string              `json:"node"`
	State            string              `json:"state"`
	InjectedAt       time.Time           `json:"injected_at"`
	DetectedAt       time.Time           `json:"detected_at"`
	DetectedBy       string              `json:"detected_by"`
	ExpectedDetected bool                `json:"expected_detected"`
	Detections       []e2eDrillDetection `json:"detections"`
	OutOfServiceAt   time.Time           `json:"out_of_service_at"`
	RevertedAt       time.Time           `json:"reverted_at"`
	RevertedBy       string              `json:"reverted_by"`
	RecoveredAt      time.Time           `json:"recovered_at"`
	Aborted          bool                `json:"aborted"`
	AbortReason      string              `json:"abort_reason"`
	Polls            int                 `json:"polls"`
	Findings         []e2eDrillFinding   `json:"findings"`
}

type e2eDrillDetection struct {
	Check string   `json:"check"`
	Codes []string `json:"codes"`
}

type e2eDrillFinding struct {
	Code     string `json:"code"`
	Severity string `json:"severity"`
	Message  string `json:"message"`
}

type e2eDrillReport struct {
	Drills  int `json:"drills"`
	Refused int `json:"refused"`
	Rows    []struct {
		Drill            string   `json:"drill"`
		Node             string   `json:"node"`
		DetectedBy       string   `json:"detected_by"`
		ExpectedDetected bool     `json:"expected_detected"`
		TTD              *float64 `json:"ttd_seconds"`
		TTR              *float64 `json:"ttr_seconds"`
		OutOfService     *float64 `json:"out_of_service_seconds"`
		CheckInterval    string   `json:"check_interval"`
		Findings         []string `json:"findings"`
	} `json:"rows"`
	ByFault []struct {
		Fault     string   `json:"fault"`
		Targets   int      `json:"targets"`
		Detected  int      `json:"detected"`
		Recovered int      `json:"recovered"`
		MTTD      *float64 `json:"mttd_seconds"`
	} `json:"by_fault"`
}

// e2eHasLine reports whether some line of s matches the expression.
func e2eHasLine(s, expr string) bool {
	re := regexp.MustCompile(expr)
	for _, l := range strings.Split(s, "\n") {
		if re.MatchString(l) {
			return true
		}
	}
	return false
}

// ---------------------------------------------------------------- burn-in

// TestBurninVerbsEndToEnd: `burnin start` on a rack of three new nodes,
// one with an IB port down. Each is drained, runs the suite through its
// agent, and ends with a verdict: the two good ones accepted (back in
// service, node baselines recorded from the campaign), the broken one
// rejected with ib.ports as its evidence and left drained. `burnin
// report` shows it in JSON, as a table and as HTML. A second campaign is
// cancelled with `burnin cancel` while its nodes are under stress: it
// starts no further step and leaves them drained.
func TestBurninVerbsEndToEnd(t *testing.T) {
	nodes := e2eRack(3, "r14", map[string]string{"batch": "2026-05"})
	nodes[2].faults = []sim.Fault{sim.IBPortDown{HCA: "mlx5_4"}}
	f := newE2EFleet(t, newE2EClock(1), nodes...)

	spec := e2eWriteSpec(t, "burnin.yaml", `
name: r14-delivery
selector: "rack=r14,batch=2026-05"
level: quick
suite:
  name: e2e.quick
  steps:
    - {name: passive, kind: checks, checks: [gpu.inventory, gpu.ecc, gpu.xid, ib.ports], timeout: 1m}
    - {name: allreduce, kind: checks, checks: [nccl.allreduce], timeout: 1m}
metrics:
  - {name: nccl.allreduce.busbw_gbps, required: true}
outlier: {min_peers: 3}
baseline: {missing: peers}
who: alice@example.com
`)
	st := e2eJSON[e2eBurninStatus](f, "burnin", "start", "-f", spec)
	id := st.ID
	if id == "" || st.State != "running" || st.Nodes != 3 || st.RunsTotal != 6 {
		t.Fatalf("burnin start -o json: %+v", st)
	}
	st = e2ePoll(f, 30*time.Second, "the burn-in to finish", func() e2eBurninStatus { return e2eJSON[e2eBurninStatus](f, "burnin", "status", id) },
		func(s e2eBurninStatus) bool { return s.State != "running" })
	if st.State != "done" || st.Accepted != 2 || st.Rejected != 1 || st.RunsDone != 6 {
		t.Fatalf("finished burn-in: %+v", st)
	}
	if out := f.cli("burnin", "status", id); !e2eHasLine(out, id+`\s+r14-delivery\s+done\s+done\s+quick\s+3\s+2\s+1\s+6/6`) ||
		!e2eHasLine(out, `^gpu-003\s+\S+ steps\s+done\s+rejected\s+\S.*mlx5_4`) || !e2eHasLine(out, `^gpu-001\s+\S+ steps\s+done\s+accepted\s+-$`) {
		t.Errorf("burnin status table:\n%s", out)
	}

	rep := e2eJSON[e2eBurninReport](f, "burnin", "report", id)
	verdicts := map[string]e2eBurninNode{}
	for _, n := range rep.Nodes {
		verdicts[n.Node] = n
	}
	for _, name := range []string{"gpu-001", "gpu-002"} {
		n := verdicts[name]
		if n.Verdict != "accepted" || len(n.Evidence.Reasons) != 0 || len(n.Runs) != 2 {
			t.Errorf("%s: %+v", name, n)
		}
		if !slices.ContainsFunc(n.Evidence.Numbers, func(x e2eBurninNumber) bool { return x.Metric == "nccl.allreduce.busbw_gbps" && x.Value > 100 }) {
			t.Errorf("%s: no all_reduce bandwidth in its evidence: %+v", name, n.Evidence.Numbers)
		}
		// Back in service: drained by the campaign, then given back.
		want := []string{"drain fleetcheck: burnin " + id + ": acceptance testing", "undrain"}
		if got := f.drainLog(name); !slices.Equal(got, want) {
			t.Errorf("%s drains %q, want %q", name, got, want)
		}
	}
	bad := verdicts["gpu-003"]
	if bad.Verdict != "rejected" || !slices.ContainsFunc(bad.Evidence.Reasons, func(r e2eBurninReason) bool {
		return r.Code == "check_failed" && r.Check == "ib.ports" && strings.Contains(r.Component+r.Message, "mlx5_4")
	}) {
		t.Errorf("gpu-003 (IB port down): %+v", bad)
	}
	if ds := f.drainState("gpu-003"); !ds.Drained || !ds.ByFleetcheck || !strings.HasPrefix(ds.Reason, "fleetcheck: burnin "+id) {
		t.Errorf("rejected gpu-003 is not left drained by the campaign: %+v", ds)
	}
	out := f.cli("burnin", "report", id)
	if !e2eHasLine(out, `gpu-003\s+\S+\s+done\s+rejected\s+\S.*mlx5_4`) || !e2eHasLine(out, `gpu-001\s+\S+\s+done\s+accepted`) {
		t.Errorf("burnin report table:\n%s", out)
	}
	html := filepath.Join(t.TempDir(), "acceptance.html")
	f.cli("burnin", "report", id, "-o", "html", "--out", html)
	if b, err := os.ReadFile(html); err != nil || !bytes.Contains(b, []byte("<html")) || !bytes.Contains(b, []byte("gpu-003")) ||
		!bytes.Contains(b, []byte("IB_PORT_DOWN")) {
		t.Errorf("HTML report (%v): %d bytes", err, len(b))
	}
	// Accepted nodes got a node baseline from this campaign; the rejected
	// one did not.
	for name, want := range map[string]bool{"gpu-001": true, "gpu-002": true, "gpu-003": false} {
		bs := e2eJSON[[]e2eBaseline](f, "baseline", "show", "--scope", "node:"+name, "--metric", "nccl.allreduce.busbw_gbps")
		got := slices.ContainsFunc(bs, func(b e2eBaseline) bool { return b.FromRun == id && b.Value > 100 })
		if got != want {
			t.Errorf("%s: node baseline from %s: %v, want %v (%+v)", name, id, got, want, bs)
		}
	}

	// Cancel while the good nodes are under stress.
	stress := e2eWriteSpec(t, "stress.yaml", `
name: r14-restress
selector: "name in (gpu-001,gpu-002)"
level: standard
suite:
  name: e2e.stress
  steps:
    - {name: burn, kind: action, action: gpu-burn, params: {duration: 4s}, timeout: 1m}
    - {name: passive-after, kind: checks, checks: [gpu.xid, ib.ports], timeout: 1m}
`)
	id2 := e2eStartedID(t, "burnin", f.cli("burnin", "start", "-f", stress))
	e2ePoll(f, 10*time.Second, "both nodes under stress", func() e2eBurninReport { return e2eJSON[e2eBurninReport](f, "burnin", "report", id2) },
		func(r e2eBurninReport) bool {
			return len(r.Nodes) == 2 && !slices.ContainsFunc(r.Nodes, func(n e2eBurninNode) bool {
				return !slices.ContainsFunc(n.Runs, func(r e2eBurninRun) bool { return r.Step == "burn" && r.State == "running" })
			})
		})
	for _, name := range []string{"gpu-001", "gpu-002"} {
		if ds := f.drainState(name); !ds.Drained || !strings.HasPrefix(ds.Reason, "fleetcheck: burnin "+id2) {
			t.Fatalf("%s under stress is not drained by the campaign: %+v", name, ds)
		}
	}
	if out := f.cli("burnin", "cancel", id2, "--reason", "wrong batch"); strings.TrimSpace(out) != id2+": cancel requested" {
		t.Errorf("burnin cancel printed %q", out)
	}
	st = e2eJSON[e2eBurninStatus](f, "burnin", "status", id2)
	if st.State != "cancelled" || st.Reason != "wrong batch" {
		t.Fatalf("cancelled burn-in: %+v", st)
	}
	// The stress runs to its end and is recorded; no step starts after it,
	// and the nodes stay out of service (an unfinished burn-in never
	// returns them).
	e2ePoll(f, 15*time.Second, "the stress runs to end", func() e2eBurninReport { return e2eJSON[e2eBurninReport](f, "burnin", "report", id2) },
		func(r e2eBurninReport) bool {
			return !slices.ContainsFunc(r.Nodes, func(n e2eBurninNode) bool {
				return slices.ContainsFunc(n.Runs, func(r e2eBurninRun) bool { return r.Step == "burn" && r.State != "done" })
			})
		})
	f.clock.waitPolls(t, "burnin", 5)
	rep = e2eJSON[e2eBurninReport](f, "burnin", "report", id2)
	if rep.Campaign.State != "cancelled" {
		t.Errorf("campaign state after the stress ended: %+v", rep.Campaign)
	}
	for _, n := range rep.Nodes {
		if n.Verdict != "" || slices.ContainsFunc(n.Runs, func(r e2eBurninRun) bool { return r.Step == "passive-after" && r.State != "pending" }) {
			t.Errorf("%s went on after the cancel: verdict %q, runs %+v", n.Node, n.Verdict, n.Runs)
		}
		if ds := f.drainState(n.Node); !ds.Drained || !strings.HasPrefix(ds.Reason, "fleetcheck: burnin "+id2) {
			t.Errorf("%s returned to service by a cancelled burn-in: %+v", n.Node, ds)
		}
	}
	if !f.hasAudit("burnin.cancel", id2, "wrong batch") {
		t.Errorf("no audit event for the cancel: %v", f.auditEvents())
	}
	if out, code := execute(t, append([]string{"burnin", "cancel", id2}, f.conn...)...); code != exitCommand {
		t.Errorf("cancel of a cancelled burn-in: exit %d:\n%s", code, out)
	}
	if out := f.cli("burnin", "list"); !e2eHasLine(out, id+`\s+r14-delivery\s+done`) || !e2eHasLine(out, id2+`\s+r14-restress\s+cancelled`) {
		t.Errorf("burnin list:\n%s", out)
	}
}

type e2eBurninStatus struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	State     string `json:"state"`
	Phase     string `json:"phase"`
	Reason    string `json:"reason"`
	Nodes     int    `json:"nodes"`
	Accepted  int    `json:"accepted"`
	Rejected  int    `json:"rejected"`
	RunsDone  int    `json:"runs_done"`
	RunsTotal int    `json:"runs_total"`
}

type e2eBurninReport struct {
	Campaign e2eBurninStatus `json:"campaign"`
	Nodes    []e2eBurninNode `json:"nodes"`
}

type e2eBurninNode struct {
	Node     string `json:"node"`
	State    string `json:"state"`
	Verdict  string `json:"verdict"`
	Evidence struct {
		Reasons []e2eBurninReason `json:"reasons"`
		Numbers []e2eBurninNumber `json:"numbers"`
	} `json:"evidence"`
	Runs []e2eBurninRun `json:"runs"`
}

type e2eBurninReason struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Check     string `json:"check"`
	Component string `json:"component"`
}

type e2eBurninNumber struct {
	Metric string  `json:"metric"`
	Value  float64 `json:"value"`
}

type e2eBurninRun struct {
	Step  string `json:"step"`
	State string `json:"state"`
}

type e2eBaseline struct {
	Metric  string  `json:"metric"`
	Scope   string  `json:"scope"`
	Value   float64 `json:"value"`
	FromRun string  `json:"from_run"`
}

// ---------------------------------------------------------------- rollout

const (
	e2eFromDriver = "535.161.08" // the simulator's default driver
	e2eToDriver   = "550.90.07"
)

// e2eMatrix allows the simulated H100s both drivers.
const e2eMatrix = `
gpus:
  - model: H100 80GB HBM3
    drivers: ["535.*", ">=550.90.07, <551"]
`

// e2eRolloutSpec: a canary, then one wave of the rest, two nodes out of
// service at most, an operator's approval after the canary.
const e2eRolloutSpec = `
name: r550
selector: "sku=h100"
target: {driver: 550.90.07}
action: driver-upgrade
rollback_action: driver-rollback
canary: 1
waves: [100%]
max_unavailable: 2
approval: manual
validation:
  checks: [gpu.inventory, gpu.ecc, gpu.xid, ib.ports, nccl.allreduce]
  baseline: measured
`

// e2eRolloutClock runs the rollout's clock 30 times faster than the wall: its
// 15 s polls (the wait for a rebooted agent) take half a second.
func e2eRolloutClock() *e2eClock { return newE2EClock(30) }

func (f *e2eFleet) rolloutStatus(id string) e2eRollout {
	return e2eJSON[e2eRollout](f, "rollout", "status", id)
}

func (f *e2eFleet) waitPhase(id, phase string) e2eRollout {
	f.t.Helper()
	return e2ePoll(f, 30*time.Second, "rollout phase "+phase, func() e2eRollout { return f.rolloutStatus(id) },
		func(s e2eRollout) bool { return s.Phase == phase || s.Phase == "halted" && phase != "halted" })
}

func (f *e2eFleet) drivers() map[string]string {
	out := map[string]string{}
	for name, n := range f.nodes {
		out[name] = n.Driver()
	}
	return out
}

// TestRolloutVerbsEndToEnd: `rollout start` upgrades the canary through
// its agent (drain, pre-inspection, the driver-upgrade action, the reboot,
// the inspection, undrain) and waits for approval. Paused, an approval
// starts no node; `rollout resume` lets the wave run to completion, every
// node upgraded once and back in service. `rollout rollback` takes them
// all back to their previous driver.
func TestRolloutVerbsEndToEnd(t *testing.T) {
	f := newE2EFleet(t, e2eRolloutClock(), e2eRack(3, "r1", nil)...)
	spec := e2eWriteSpec(t, "rollout.yaml", e2eRolloutSpec)
	matrix := e2eWriteSpec(t, "matrix.yaml", e2eMatrix)

	out := f.cli("rollout", "plan", "-f", spec, "--matrix", matrix)
	if !strings.Contains(out, "3 selected of 3, 0 excluded, at most 2 unavailable at once") ||
		!e2eHasLine(out, `^0\s+canary\s+0\s+gpu-001$`) || !e2eHasLine(out, `^1\s+wave 1\s+0\s+gpu-002,gpu-003$`) {
		t.Fatalf("rollout plan:\n%s", out)
	}
	st := e2eJSON[e2eRollout](f, "rollout", "start", "-f", spec, "--matrix", matrix)
	id := st.ID
	if !strings.HasPrefix(id, "r550-") || st.Phase != "running" || len(st.Nodes) != 3 {
		t.Fatalf("rollout start -o json: %+v", st)
	}

	// The canary is upgraded; the rest wait for an approval.
	st = f.waitPhase(id, "awaiting-approval")
	if n := st.node("gpu-001"); n.State != "done" || n.FromDriver != e2eFromDriver || n.Upgrades != 1 || n.Baseline <= 0 {
		t.Fatalf("canary after the upgrade: %+v", st)
	}
	if got := f.drivers(); got["gpu-001"] != e2eToDriver || got["gpu-002"] != e2eFromDriver || got["gpu-003"] != e2eFromDriver {
		t.Fatalf("drivers after the canary: %v", got)
	}
	want := []string{"drain fleetcheck: rollout " + id + ": driver " + e2eToDriver, "undrain"}
	if got := f.drainLog("gpu-001"); !slices.Equal(got, want) {
		t.Errorf("canary drains %q, want %q", got, want)
	}

	// Paused, an approval starts nothing.
	if out := f.cli("rollout", "pause", id, "--reason", "change freeze"); !strings.Contains(out, "awaiting-approval (paused: change freeze)") {
		t.Errorf("rollout pause printed:\n%s", out)
	}
	f.cli("rollout", "approve", id)
	f.clock.waitPolls(t, "rollout", 2)
	st = f.rolloutStatus(id)
	if !st.Paused || st.PauseReason != "change freeze" || st.node("gpu-002").State != "pending" || st.node("gpu-003").State != "pending" {
		t.Fatalf("paused rollout moved after the approval: %+v", st)
	}
	if got := f.drainLog("gpu-002"); len(got) != 0 {
		t.Errorf("paused rollout drained gpu-002: %q", got)
	}
	if !f.hasAudit("rollout.pause", id, "change freeze") || !f.hasAudit("rollout.approve", id) {
		t.Errorf("audit: %v", f.auditEvents())
	}

	// Resumed, the wave runs to the end.
	if out := f.cli("rollout", "resume", id); strings.Contains(out, "paused") {
		t.Errorf("rollout resume printed:\n%s", out)
	}
	st = f.waitPhase(id, "completed")
	for _, name := range []string{"gpu-001", "gpu-002", "gpu-003"} {
		if n := st.node(name); n.State != "done" || n.Upgrades != 1 || n.DrainedByUs {
			t.Errorf("%s: %+v", name, n)
		}
		if got := f.drivers()[name]; got != e2eToDriver {
			t.Errorf("%s runs driver %s after the rollout", name, got)
		}
		want := []string{"drain fleetcheck: rollout " + id + ": driver " + e2eToDriver, "undrain"}
		if got := f.drainLog(name); !slices.Equal(got, want) {
			t.Errorf("%s drains %q, want %q", name, got, want)
		}
	}
	if st.Unavailable != 0 || st.Counts["done"] != 3 {
		t.Errorf("completed rollout: unavailable %d, counts %v", st.Unavailable, st.Counts)
	}
	if out := f.cli("rollout", "list"); !e2eHasLine(out, id+`\s+r550\s+`+e2eToDriver+`\s+completed\s+`) {
		t.Errorf("rollout list:\n%s", out)
	}
	// The coordinator knows the new driver from the agents' inventories.
	nodes, err := f.srv.Fleet().Nodes(context.Background(), "sku=h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Inventory.DriverVersion != e2eToDriver {
			t.Errorf("coordinator's inventory of %s: driver %s", n.Name, n.Inventory.DriverVersion)
		}
	}

	// Rollback: every node back on its previous driver.
	if out := f.cli("rollout", "rollback", id); !strings.Contains(out, "rolling back 3 nodes: gpu-001 to "+e2eFromDriver+", gpu-002 to ") {
		t.Errorf("rollout rollback printed:\n%s", out)
	}
	st = f.waitPhase(id, "rolled-back")
	for _, name := range []string{"gpu-001", "gpu-002", "gpu-003"} {
		if n := st.node(name); n.State != "rolled-back" {
			t.Errorf("%s after the rollback: %+v", name, n)
		}
		if got := f.drivers()[name]; got != e2eFromDriver {
			t.Errorf("%s runs driver %s after the rollback", name, got)
		}
		if ds := f.drainState(name); ds.Drained {
			t.Errorf("%s left drained after the rollback: %+v", name, ds)
		}
	}
	// Every node is settled: the progress says so.
	// The waves keep their nodes: the canary is still one.
	if out := f.cli("rollout", "status", id); !strings.Contains(out, ": rolled-back, wave 1, 3/3, unavailable 0/2 of fleet") ||
		!e2eHasLine(out, `^0\s+canary\s+\S+\s+1\s+`) || !e2eHasLine(out, `^1\s+wave 1\s+\S+\s+2\s+`) {
		t.Errorf("rolled-back rollout's status table:\n%s", out)
	}
	// A finished rollout takes no more orders.
	if out, code := execute(t, append([]string{"rollout", "pause", id}, f.conn...)...); code != exitCommand {
		t.Errorf("pause of a rolled-back rollout: exit %d:\n%s", code, out)
	}
}

// TestRolloutAbortEndToEnd: `rollout abort` after the canary skips the
// nodes not started, which are never drained nor upgraded.
func TestRolloutAbortEndToEnd(t *testing.T) {
	f := newE2EFleet(t, e2eRolloutClock(), e2eRack(3, "r1", nil)...)
	spec := e2eWriteSpec(t, "rollout.yaml", e2eRolloutSpec)
	matrix := e2eWriteSpec(t, "matrix.yaml", e2eMatrix)
	id := e2eStartedID(t, "rollout", f.cli("rollout", "start", "-f", spec, "--matrix", matrix))
	f.waitPhase(id, "awaiting-approval")
	f.cli("rollout", "abort", id, "--reason", "canary looks odd")
	st := f.waitPhase(id, "aborted")
	if n := st.node("gpu-001"); n.State != "done" {
		t.Errorf("canary after the abort: %+v", n)
	}
	for _, name := range []string{"gpu-002", "gpu-003"} {
		if n := st.node(name); n.State != "skipped" || n.Upgrades != 0 {
			t.Errorf("%s after the abort: %+v", name, n)
		}
		if got := f.drainLog(name); len(got) != 0 {
			t.Errorf("%s was drained by an aborted rollout: %q", name, got)
		}
	}
	if got := f.drivers(); got["gpu-001"] != e2eToDriver || got["gpu-002"] != e2eFromDriver || got["gpu-003"] != e2eFromDriver {
		t.Errorf("drivers after the abort: %v", got)
	}
	if !f.hasAudit("rollout.abort", id, "canary looks odd") {
		t.Errorf("audit: %v", f.auditEvents())
	}
	if out := f.cli("rollout", "status", id); !strings.Contains(out, "rollout "+id+" (r550) to driver "+e2eToDriver+": aborted") ||
		!e2eHasLine(out, `^gpu-002\s+1\s+skipped\s`) {
		t.Errorf("rollout status table:\n%s", out)
	}
	if out, code := execute(t, append([]string{"rollout", "resume", id}, f.conn...)...); code != exitCommand || !strings.Contains(out, "aborted") {
		t.Errorf("resume of an aborted rollout: exit %d:\n%s", code, out)
	}
}

type e2eRollout struct {
	ID          string           `json:"id"`
	Phase       string           `json:"phase"`
	Paused      bool             `json:"paused"`
	PauseReason string           `json:"pause_reason"`
	HaltReason  string           `json:"halt_reason"`
	Evidence    []string         `json:"evidence"`
	Unavailable int              `json:"unavailable"`
	Counts      map[string]int   `json:"counts"`
	Nodes       []e2eRolloutNode `json:"nodes"`
}

type e2eRolloutNode struct {
	Node        string   `json:"node"`
	Wave        int      `json:"wave"`
	State       string   `json:"state"`
	FromDriver  string   `json:"from_driver"`
	Reason      string   `json:"reason"`
	Evidence    []string `json:"evidence"`
	Hold        string   `json:"hold"`
	Baseline    float64  `json:"baseline"`
	DrainedByUs bool     `json:"drained_by_us"`
	Upgrades    int      `json:"upgrades"`
}

func (s e2eRollout) node(name string) e2eRolloutNode {
	for _, n := range s.Nodes {
		if n.Node == name {
			return n
		}
	}
	return e2eRolloutNode{}
}
