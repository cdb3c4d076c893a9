//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// The binary and the PKI every test shares, made once in TestMain.
var (
	binPath string
	caDir   string
)

const (
	trustDomain = "e2e.fleetcheck.test"
	// maxNodes is how many node certificates TestMain issues (gpu-001..).
	maxNodes = 8
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "fleetcheck-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer os.RemoveAll(dir)
	binPath = filepath.Join(dir, "fleetcheck")
	build := exec.Command("go", "build", "-o", binPath, "./cmd/fleetcheck")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		return 2
	}
	caDir = filepath.Join(dir, "ca")
	steps := [][]string{
		{"certs", "init", "--dir", caDir, "--trust-domain", trustDomain},
		{"certs", "issue", "coordinator", "coord", "--dir", caDir, "--ip", "127.0.0.1"},
		{"certs", "issue", "admin", "oncall", "--dir", caDir},
	}
	for i := 1; i <= maxNodes; i++ {
		steps = append(steps, []string{"certs", "issue", "node", nodeName(i), "--dir", caDir})
	}
	for _, s := range steps {
		if out, err := exec.Command(binPath, s...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "fleetcheck %s: %v\n%s", strings.Join(s, " "), err, out)
			return 2
		}
	}
	return m.Run()
}

func nodeName(i int) string { return fmt.Sprintf("gpu-%03d", i) }

// freePort asks the OS for a free loopback port. The coordinator keeps it
// across restarts, so the agents find it again where they left it.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ---------------------------------------------------------------- processes

// proc is one fleetcheck process; its stderr (the JSON log) is appended
// to a file that outlives restarts.
type proc struct {
	name    string
	args    []string
	logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// exits records how each run ended ("signal: killed", "exit status 0").
	exits []string
}

func (p *proc) start(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		t.Fatalf("%s already running", p.name)
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binPath, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		msg := "exit status 0"
		if err != nil {
			msg = err.Error()
		}
		p.exits = append(p.exits, msg)
		p.mu.Unlock()
		close(done)
	}()
}

// stop sends sig and waits for the process to end.
func (p *proc) stop(t testing.TB, sig syscall.Signal) {
	t.Helper()
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Errorf("%s did not stop within 20s of %s; killed", p.name, sig)
	}
}

func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// logLines decodes the JSON log lines whose msg is msg.
func (p *proc) logLines(msg string) []map[string]any {
	f, err := os.Open(p.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	needle := []byte(`"message":"` + msg + `"`)
	for sc.Scan() {
		if !bytes.Contains(sc.Bytes(), needle) {
			continue
		}
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// tail is the last n lines of the log above debug level.
func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if !strings.Contains(l, `"level":"debug"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---------------------------------------------------------------- the fleet

// fleet is a coordinator process and its agent processes on simulated
// nodes, all on 127.0.0.1 with mutual TLS.
type fleet struct {
	t      *testing.T
	dir    string
	addr   string // the coordinator's gRPC address, the same across restarts
	health string // its /healthz URL
	coord  *proc
	agents []*agentProc
	// kills is what the test did to the processes, for its log.
	kills []string
	// target, when set, picks the coordinator each CLI call goes to (a
	// fleet of several coordinators: the leader, or a live one).
	target func() string
	// cliTimeout bounds one CLI call (default 3 minutes).
	cliTimeout time.Duration
}

// cliAddr is the coordinator the next CLI call goes to.
func (f *fleet) cliAddr() string {
	if f.target != nil {
		return f.target()
	}
	return f.addr
}

type agentProc struct {
	*proc
	node     string
	stateDir string
}

// fleetOpts shape a fleet.
type fleetOpts struct {
	nodes int
	// labels returns node i's labels (1-based); default sku=h100.
	labels func(i int) map[string]string
	// actionDelay is how long a simulated driver change takes; longTools
	// how long all_reduce_perf and dcgmi diag take.
	actionDelay, longTools time.Duration
	// coordinatorYAML is added to the coordinator's config.
	coordinatorYAML string
	// agentCoordinators replaces the agents' "coordinator: ADDR" line
	// (several coordinators: "coordinators: [A, B, C]").
	agentCoordinators string
	// agentReconnect replaces the agents' reconnect line.
	agentReconnect string
}

func newFleet(t *testing.T, o fleetOpts) *fleet {
	t.Helper()
	if o.nodes > maxNodes {
		t.Fatalf("at most %d nodes", maxNodes)
	}
	dir := t.TempDir()
	f := &fleet{t: t, dir: dir, addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	hport := freePort(t)
	f.health = fmt.Sprintf("http://127.0.0.1:%d/healthz", hport)
	coordCfg := filepath.Join(dir, "coordinator.yaml")
	write(t, coordCfg, fmt.Sprintf(`listen: %s
http_listen: 127.0.0.1:%d
data_dir: %s
heartbeat_interval: 1s
breaker: {max_share: 1, max_count: 1000}
tls:
  cert_file: %s
  key_file: %s
  ca_file: %s
  trust_domain: %s
%s`, f.addr, hport, filepath.Join(dir, "data"), filepath.Join(caDir, "coordinator-coord.crt"),
		filepath.Join(caDir, "coordinator-coord.key"), filepath.Join(caDir, "ca.crt"), trustDomain, o.coordinatorYAML))
	f.coord = &proc{name: "coordinator", args: []string{"coordinator", "--config", coordCfg, "--log-format", "json"},
		logPath: filepath.Join(dir, "coordinator.log")}
	t.Cleanup(func() {
		for _, a := range f.agents {
			a.stop(t, syscall.SIGTERM)
		}
		f.coord.stop(t, syscall.SIGTERM)
		t.Logf("kills and restarts: %s", strings.Join(f.kills, "; "))
		if t.Failed() {
			t.Logf("coordinator log (last lines):\n%s", f.coord.tail(40))
			for _, a := range f.agents {
				t.Logf("%s log (last lines):\n%s", a.node, a.tail(15))
			}
		}
	})
	f.startCoordinator()
	for i := 1; i <= o.nodes; i++ {
		labels := map[string]string{"sku": "h100"}
		if o.labels != nil {
			labels = o.labels(i)
		}
		f.agents = append(f.agents, f.newAgent(i, labels, o))
	}
	for _, a := range f.agents {
		a.start(t)
	}
	f.waitConnected(60*time.Second, "every agent connected with a full result")
	return f
}

// agentYAML is every agent's config after its identity: a simulated node
// and the actions the campaigns send, each a simulator built-in.
const agentYAML = `
metrics_listen: "off"
activity: idle
interval: 5s
` + agentReconnectLine + `
actions:
  driver-upgrade:
    command: [driver-upgrade, "{version}"]
    params: {version: '5[0-9]{2}\.[0-9]+(\.[0-9]+)?'}
    timeout: 1m
    disruptive: true
  driver-rollback:
    command: [driver-rollback, "{version}"]
    params: {version: '5[0-9]{2}\.[0-9]+(\.[0-9]+)?'}
    timeout: 1m
    disruptive: true
  ib-port-down:
    command: [ib-port-down, "{hca}"]
    params: {hca: 'mlx5_[0-9]+', port: '[0-9]'}
    revert: ib-port-down-revert
  ib-port-down-revert:
    command: [ib-port-up, "{hca}"]
    params: {hca: 'mlx5_[0-9]+', port: '[0-9]'}
  sim-fault:
    command: [sim-fault, "{kind}", "{target}"]
    params: {kind: '[a-z_]+', target: '[A-Za-z0-9_]+'}
    revert: sim-clear
  sim-clear:
    command: [sim-clear, "{kind}", "{target}"]
    params: {kind: '[a-z_]+', target: '[A-Za-z0-9_]+'}
  gpu-burn:
    command: [gpu-burn, "{duration}"]
    params: {duration: '([0-9]+(h|m|s|ms))+'}
    timeout: 5m
    disruptive: true
  pcie-bandwidth:
    command: [pcie-bandwidth]
    timeout: 1m
    disruptive: true
multi_node:
  launcher_command: [mpirun, -H, "{hosts}", -np, "{np}", all_reduce_perf, -b, 8G, -e, 8G, -g, "8"]
  allowed_peers: 'gpu-[0-9]{3}'
`

// agentReconnectLine is agentYAML's reconnect line (fleetOpts.agentReconnect
// replaces it).
const agentReconnectLine = "reconnect: {initial: 100ms, max: 1s}"

func (f *fleet) newAgent(i int, labels map[string]string, o fleetOpts) *agentProc {
	t := f.t
	node := nodeName(i)
	dir := filepath.Join(f.dir, node)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	lb, _ := json.Marshal(labels)
	// Every check: burn-in runs dcgm.diag and nccl.allreduce.
	out, err := exec.Command(binPath, "checks").Output()
	if err != nil {
		t.Fatalf("fleetcheck checks: %v", err)
	}
	var checks []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if fs := strings.Fields(l); len(fs) > 0 {
			checks = append(checks, fs[0])
		}
	}
	coordLine := "coordinator: " + f.addr
	if o.agentCoordinators != "" {
		coordLine = o.agentCoordinators
	}
	tail := agentYAML
	if o.agentReconnect != "" {
		tail = strings.Replace(tail, agentReconnectLine, o.agentReconnect, 1)
	}
	cfg := filepath.Join(dir, "agent.yaml")
	write(t, cfg, fmt.Sprintf(`node: %s
labels: %s
%s
tls:
  ca_file: %s
  cert_file: %s
  key_file: %s
  trust_domain: %s
state_dir: %s
enabled_checks: [%s]
host: {mode: sim, seed: %d, action_delay: %s, long_tool_time: %s}
%s`, node, lb, coordLine, filepath.Join(caDir, "ca.crt"), filepath.Join(caDir, "node-"+node+".crt"),
		filepath.Join(caDir, "node-"+node+".key"), trustDomain, filepath.Join(dir, "state"), strings.Join(checks, ", "),
		i, o.actionDelay, o.longTools, tail))
	return &agentProc{
		proc: &proc{name: node, args: []string{"agent", "--config", cfg, "--log-format", "json", "--log-level", "debug"},
			logPath: filepath.Join(dir, "agent.log")},
		node: node, stateDir: filepath.Join(dir, "state"),
	}
}

func write(t testing.TB, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (f *fleet) startCoordinator() {
	f.t.Helper()
	f.coord.start(f.t)
	testwait.ForEvery(f.t, 30*time.Second, 100*time.Millisecond, "the coordinator's /healthz", func() (bool, string) {
		if !f.coord.running() {
			f.t.Fatalf("coordinator exited:\n%s", f.coord.tail(20))
		}
		resp, err := http.Get(f.health)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// killCoordinator SIGKILLs the coordinator and starts it again on the same
// data dir and port.
func (f *fleet) killCoordinator(why string) {
	f.t.Helper()
	f.kills = append(f.kills, "SIGKILL coordinator "+why)
	f.coord.stop(f.t, syscall.SIGKILL)
	f.startCoordinator()
}

// restartAgent stops an agent with sig (SIGKILL: a crash; SIGTERM: a
// clean stop) and starts it again on the same state dir.
func (f *fleet) restartAgent(node string, sig syscall.Signal, why string) {
	f.t.Helper()
	a := f.agent(node)
	f.kills = append(f.kills, fmt.Sprintf("%s %s %s", sig, node, why))
	a.stop(f.t, sig)
	a.start(f.t)
}

func (f *fleet) agent(node string) *agentProc {
	for _, a := range f.agents {
		if a.node == node {
			return a
		}
	}
	f.t.Fatalf("no agent %s", node)
	return nil
}

func (f *fleet) nodeNames() []string {
	var out []string
	for _, a := range f.agents {
		out = append(out, a.node)
	}
	return out
}

// ---------------------------------------------------------------- the CLI

// cli runs `fleetcheck ARGS` as the operator oncall; it returns stdout,
// stderr and the exit status.
func (f *fleet) cli(args ...string) (string, string, int) {
	f.t.Helper()
	args = append(args, "--coordinator", f.cliAddr(), "--cert", filepath.Join(caDir, "admin-oncall.crt"),
		"--key", filepath.Join(caDir, "admin-oncall.key"), "--ca", filepath.Join(caDir, "ca.crt"), "--trust-domain", trustDomain)
	within := f.cliTimeout
	if within == 0 {
		within = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, binPath, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case ctx.Err() != nil:
		code = -1 // ran past cliTimeout: a failed call, polled again
	case err != nil:
		f.t.Fatalf("fleetcheck %s: %v", strings.Join(args, " "), err)
	}
	return stdout.String(), stderr.String(), code
}

// ok runs a verb that must succeed and returns what it printed.
func (f *fleet) ok(args ...string) string {
	f.t.Helper()
	out, errOut, code := f.cli(args...)
	if code != 0 {
		f.t.Fatalf("fleetcheck %s: exit %d:\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// jsonOf runs a verb with -o json and decodes its output into v.
func jsonOf[T any](f *fleet, args ...string) T {
	f.t.Helper()
	var v T
	out := f.ok(append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		f.t.Fatalf("fleetcheck %s -o json: %v:\n%s", strings.Join(args, " "), err, out)
	}
	return v
}

// tryJSON is jsonOf that reports failure instead of failing the test (a
// poll across a coordinator restart).
func tryJSON[T any](f *fleet, v *T, args ...string) bool {
	f.t.Helper()
	out, _, code := f.cli(append(args, "-o", "json")...)
	if code != 0 {
		return false
	}
	return json.Unmarshal([]byte(out), v) == nil
}

type nodeRow struct {
	Name          string            `json:"name"`
	State         string            `json:"state"`
	StateReason   string            `json:"state_reason"`
	Connected     bool              `json:"connected"`
	Labels        map[string]string `json:"labels"`
	DriverVersion string            `json:"driver_version"`
	FailingChecks []string          `json:"failing_checks"`
}

func (f *fleet) nodes() []nodeRow {
	f.t.Helper()
	var v struct {
		Nodes []nodeRow `json:"nodes"`
	}
	if !tryJSON(f, &v, "nodes") {
		return nil
	}
	return v.Nodes
}

// waitConnected waits until every agent is connected and its node past
// initializing (a full result is in).
func (f *fleet) waitConnected(within time.Duration, what string) {
	f.t.Helper()
	testwait.ForEvery(f.t, within, 100*time.Millisecond, what, func() (bool, string) {
		ns := f.nodes()
		if len(ns) != len(f.agents) {
			return false, fmt.Sprintf("%d of %d nodes listed", len(ns), len(f.agents))
		}
		for _, n := range ns {
			if !n.Connected || n.State == "" || n.State == "initializing" || n.DriverVersion == "" {
				return false, fmt.Sprintf("%+v", n)
			}
		}
		return true, ""
	})
}

// ---------------------------------------------------------------- invariants

// simState reads a node's simulated state (the agent writes it after
// every action).
func (a *agentProc) simState(t testing.TB) simState {
	t.Helper()
	var st simState
	b, err := os.ReadFile(filepath.Join(a.stateDir, "sim-node.json"))
	if err != nil {
		t.Fatalf("%s: %v", a.node, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("%s: sim-node.json: %v", a.node, err)
	}
	return st
}

type simState struct {
	Driver  string         `json:"driver"`
	Faults  []simFault     `json:"faults"`
	Actions map[string]int `json:"actions"`
}

type simFault struct {
	Kind string `json:"kind"`
	HCA  string `json:"hca"`
	GPU  int    `json:"gpu"`
}

// requestedRuns counts the requested runs the agent started that include
// check, over every run of it.
func (a *agentProc) requestedRuns(check string) int {
	n := 0
	for _, l := range a.logLines("running requested checks") {
		cs, _ := l["checks"].([]any)
		for _, c := range cs {
			if c == check {
				n++
				break
			}
		}
	}
	return n
}

// ackedIDs are the result ids the agent logged as acknowledged by the
// coordinator, over every run of it.
func (a *agentProc) ackedIDs() []string {
	var out []string
	for _, l := range a.logLines("result acknowledged") {
		if id, ok := l["result_id"].(string); ok {
			out = append(out, id)
		}
	}
	return out
}

// checkAckedStoredOnce asserts that every result an agent saw
// acknowledged is stored by the coordinator, each check of it once.
func (f *fleet) checkAckedStoredOnce() {
	f.t.Helper()
	for _, a := range f.agents {
		acked := a.ackedIDs()
		if len(acked) == 0 {
			f.t.Errorf("%s: no result acknowledged at all", a.node)
			continue
		}
		var v struct {
			Results []struct {
				ResultID string `json:"result_id"`
				Check    struct {
					Name string `json:"name"`
				} `json:"check"`
			} `json:"results"`
		}
		if !tryJSON(f, &v, "results", "--node", a.node, "--limit", "10000") {
			f.t.Errorf("%s: results could not be listed", a.node)
			continue
		}
		rows := map[string]map[string]int{}
		for _, r := range v.Results {
			if rows[r.ResultID] == nil {
				rows[r.ResultID] = map[string]int{}
			}
			rows[r.ResultID][r.Check.Name]++
		}
		var missing, twice []string
		for _, id := range acked {
			if rows[id] == nil {
				missing = append(missing, id)
			}
		}
		for id, checks := range rows {
			for c, n := range checks {
				if n > 1 {
					twice = append(twice, fmt.Sprintf("%s/%s x%d", id, c, n))
				}
			}
		}
		if len(missing) > 0 {
			f.t.Errorf("%s: %d of %d acknowledged results not stored: %v", a.node, len(missing), len(acked), first(missing, 5))
		}
		if len(twice) > 0 {
			f.t.Errorf("%s: results stored more than once: %v", a.node, first(twice, 5))
		}
	}
}

// checkUpgradedAtMostOnce asserts that no simulated node ran the upgrade
// action more than once (and, for rollouts, the rollback at most once).
func (f *fleet) checkUpgradedAtMostOnce(want map[string]int) {
	f.t.Helper()
	for _, a := range f.agents {
		st := a.simState(f.t)
		if n := st.Actions["driver-upgrade"]; n > 1 || want != nil && n != want[a.node] {
			f.t.Errorf("%s: driver-upgrade ran %d times (want %d)", a.node, n, want[a.node])
		}
		if n := st.Actions["driver-rollback"]; n > 1 {
			f.t.Errorf("%s: driver-rollback ran %d times", a.node, n)
		}
	}
}

func first(s []string, n int) []string {
	slices.Sort(s)
	if len(s) > n {
		return s[:n]
	}
	return s
}

// specFile writes a campaign spec and returns its path.
func (f *fleet) specFile(name, body string) string {
	p := filepath.Join(f.dir, name)
	write(f.t, p, body)
	return p
}

// startedID reads the id from "KIND ID started".
func startedID(t testing.TB, kind, out string) string {
	t.Helper()
	fs := strings.Fields(out)
	if len(fs) != 3 || fs[0] != kind || fs[2] != "started" {
		t.Fatalf("%s start printed %q, want %q", kind, out, kind+" ID started")
	}
	return fs[1]
}

// bgCLI is a CLI call left running while the test kills processes.
type bgCLI struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	code           int
}

// background starts `fleetcheck ARGS` and returns at once.
func (f *fleet) background(args ...string) *bgCLI {
	f.t.Helper()
	args = append(args, "--coordinator", f.cliAddr(), "--cert", filepath.Join(caDir, "admin-oncall.crt"),
		"--key", filepath.Join(caDir, "admin-oncall.key"), "--ca", filepath.Join(caDir, "ca.crt"), "--trust-domain", trustDomain)
	b := &bgCLI{cmd: exec.Command(binPath, args...), done: make(chan struct{})}
	b.cmd.Stdout, b.cmd.Stderr = &b.stdout, &b.stderr
	if err := b.cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	go func() {
		err := b.cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			b.code = ee.ExitCode()
		} else if err != nil {
			b.code = -1
		}
		close(b.done)
	}()
	f.t.Cleanup(func() { _ = b.cmd.Process.Kill(); <-b.done })
	return b
}

// wait returns what the call printed and its exit status.
func (b *bgCLI) wait(t testing.TB, within time.Duration) (string, string, int) {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(within):
		t.Fatalf("fleetcheck %s still running after %s", strings.Join(b.cmd.Args[1:], " "), within)
	}
	return b.stdout.String(), b.stderr.String(), b.code
}

// restartAgentWith stops an agent cleanly, replaces its config's host
// line and starts it again: another simulated node on the same state dir
// (its sim state file removed, so the new faults apply).
func (f *fleet) restartAgentWith(a *agentProc, hostLine string) {
	f.t.Helper()
	a.stop(f.t, syscall.SIGTERM)
	cfg := a.args[2]
	b, err := os.ReadFile(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "host:") {
			l = hostLine
		}
		lines = append(lines, l)
	}
	write(f.t, cfg, strings.Join(lines, "\n"))
	if err := os.Remove(filepath.Join(a.stateDir, "sim-node.json")); err != nil {
		f.t.Fatal(err)
	}
	f.kills = append(f.kills, "SIGTERM "+a.node+" to change its simulated node to "+hostLine)
	a.start(f.t)
	f.waitConnected(time.Minute, a.node+" back with its new host")
}
