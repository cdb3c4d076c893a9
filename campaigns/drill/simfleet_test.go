package drill

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/selector"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	"github.com/fleetcheck/fleetcheck/node/inspect"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// agentDrill is what a simulated agent keeps of a fault it injected: the
// agent-side safety timer the coordinator asks for with revert_after and
// revert_on_disconnect (see docs/drill.md, "What the agent must do").
type agentDrill struct {
	id, fault       string
	params          map[string]string
	due             time.Time
	onDisconnect    time.Duration
	revertedAt      time.Time
	revertedByAgent bool
	revertedByCoord bool
}

// simAgent is one node: a sim.Node read by the real probes and checks,
// the agent's check state between runs, and its drill timers.
type simAgent struct {
	name      string
	node      *sim.Node
	labels    map[string]string
	state     string // the coordinator's node state
	connected bool
	lostSince time.Time // when it lost the coordinator (zero: connected)
	prev      *checks.State
	drills    map[string]*agentDrill
	actions   map[string]int
	// The agent's own quick pass (simDrillFleet.schedule): its phase, the
	// latest result and when the next one is due.
	phase    time.Duration
	last     *report.Report
	nextPass time.Time
}

// simDrillFleet is a kit.Fleet over simulated nodes for drills.
type simDrillFleet struct {
	clock *simfleet.Clock
	cfg   *config.Config
	drain *drain.None

	mu     sync.Mutex
	agents map[string]*simAgent
	order  []string
	// autoDrain models the coordinator's drain policy: a failing finding
	// that asks for a drain, reset, reboot, reseat or replace takes the
	// node out of service.
	autoDrain bool
	// passDuration is the simulated time a passive pass takes; the
	// all_reduce run takes a minute.
	passDuration time.Duration
	// agentRevertLog lists reverts the agents made on their own timer.
	agentRevertLog []string
	// schedule, when set, is the agents' quick-check interval: each agent
	// runs its passive checks on its own schedule (a random phase per
	// node) and a request for passive checks is answered with its latest
	// scheduled result, as the coordinator's stored results would; a
	// disruptive check still runs on demand.
	schedule time.Duration
	// policyOut models the coordinator's drain policy: nodes it took out
	// of service, with its reason (kit.Node.OutOfService).
	policyOut map[string]string
}

// enableSchedule turns on the agents' quick-pass schedule with phases
// drawn from rnd.
func (f *simDrillFleet) enableSchedule(interval time.Duration, phase func(int) time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.schedule = interval
	now := f.clock.Now()
	for i, name := range f.order {
		a := f.agents[name]
		a.phase = phase(i)
		a.nextPass = now.Add(a.phase)
	}
}

// runPasses runs every scheduled pass due by now, at its due time order.
func (f *simDrillFleet) runPasses(ctx context.Context) {
	if f.schedule == 0 {
		return
	}
	passive := passiveChecks()
	now := f.clock.Now()
	for _, name := range f.order {
		f.mu.Lock()
		a := f.agents[name]
		due := !a.nextPass.After(now)
		f.mu.Unlock()
		if !due {
			continue
		}
		res := inspect.Run(ctx, a.node, inspect.Options{Checks: passive, Config: f.cfg, Prev: a.prev})
		rep := res.Report
		f.mu.Lock()
		a.prev, a.last = res.State, &rep
		for !a.nextPass.After(now) {
			a.nextPass = a.nextPass.Add(f.schedule)
		}
		f.mu.Unlock()
	}
}

// nextPassAt is the earliest scheduled pass (zero without a schedule).
func (f *simDrillFleet) nextPassAt() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	var next time.Time
	if f.schedule == 0 {
		return next
	}
	for _, a := range f.agents {
		if next.IsZero() || a.nextPass.Before(next) {
			next = a.nextPass
		}
	}
	return next
}

func passiveChecks() []checks.Check {
	var out []checks.Check
	for _, c := range registry.All() {
		if !c.Disruptive() {
			out = append(out, c)
		}
	}
	return out
}

// latest answers a passive request from the agent's last scheduled pass.
func (f *simDrillFleet) latest(a *simAgent, names []string) (*report.Report, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.schedule == 0 || a.last == nil {
		return nil, false
	}
	for _, n := range names {
		if n == "nccl.allreduce" || n == "dcgm.diag" {
			return nil, false
		}
	}
	rep := *a.last
	rep.Checks = nil
	for _, c := range a.last.Checks {
		if slices.Contains(names, c.Name) {
			rep.Checks = append(rep.Checks, c)
		}
	}
	rep.Summarize()
	return &rep, true
}

var _ kit.Fleet = (*simDrillFleet)(nil)

func newSimDrillFleet(t testing.TB, n int, optedIn ...string) *simDrillFleet {
	t.Helper()
	clock := simfleet.NewClock(time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC))
	cfg := config.Defaults()
	cfg.NCCL.BaselineGBps = 480
	f := &simDrillFleet{clock: clock, cfg: cfg, drain: drain.NewNone(nil), agents: map[string]*simAgent{}, passDuration: 5 * time.Second}
	shared := sim.NewShared()
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("gpu-%03d", i)
		spec := sim.DefaultSpec(name)
		spec.Clock = clock
		spec.Shared = shared
		spec.Seed = uint64(i)
		node, err := sim.New(spec)
		if err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{"sku": "h100", "rack": "r" + strconv.Itoa((i-1)/4+1)}
		if slices.Contains(optedIn, name) {
			labels["fleetcheck.io/drill"] = "allowed"
		}
		f.agents[name] = &simAgent{name: name, node: node, labels: labels, state: "healthy", connected: true,
			drills: map[string]*agentDrill{}, actions: map[string]int{}}
		f.order = append(f.order, name)
	}
	return f
}

func (f *simDrillFleet) agent(name string) *simAgent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.agents[name]
}

// setState sets a node's state as the coordinator would show it.
func (f *simDrillFleet) setState(name, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.agents[name].state = state
}

// disconnect cuts the node's agent from the coordinator (both ways).
func (f *simDrillFleet) disconnect(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.agents[name]
	a.connected, a.lostSince = false, f.clock.Now()
}

func (f *simDrillFleet) reconnect(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.agents[name]
	a.connected, a.lostSince = true, time.Time{}
}

func (f *simDrillFleet) actionCount(node, action string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.agents[node].actions[action]
}

// tick runs the agents' own timers: a fault whose revert_after passed, or
// whose agent lost the coordinator for revert_on_disconnect, is reverted
// by the agent itself.
func (f *simDrillFleet) tick() {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	for _, name := range f.order {
		a := f.agents[name]
		for _, d := range a.drills {
			if !d.revertedAt.IsZero() {
				continue
			}
			lost := !a.lostSince.IsZero() && now.Sub(a.lostSince) >= d.onDisconnect
			if !now.Before(d.due) || lost {
				f.revertLocked(a, d.fault, d.params)
				d.revertedAt, d.revertedByAgent = now, true
				f.agentRevertLog = append(f.agentRevertLog, fmt.Sprintf("%s %s %s", name, d.id, d.fault))
			}
		}
	}
}

// faultFor maps a fault action to what the simulator can do.
func faultFor(action string, p map[string]string) (sim.Fault, sim.FaultKind, string, error) {
	gpu, _ := strconv.Atoi(p["gpu"])
	switch action {
	case FaultXid:
		code, err := strconv.Atoi(p["xid"])
		if err != nil {
			return nil, "", "", fmt.Errorf("xid %q: %w", p["xid"], err)
		}
		return sim.Xid{GPU: gpu, Code: code}, sim.KindXid, "GPU" + strconv.Itoa(gpu), nil
	case FaultIBPortDown:
		return sim.IBPortDown{HCA: p["hca"]}, sim.KindIBPortDown, p["hca"], nil
	case FaultGPUReset:
		// While nvidia-smi -r runs (and if it never finishes) the GPU is
		// gone from the driver.
		return sim.GPUMissing{GPU: gpu}, sim.KindGPUMissing, "GPU" + strconv.Itoa(gpu), nil
	case FaultKillWorkload:
		// kill -9 of the job leaves its memory held: a ghost.
		return sim.GhostProcess{GPU: gpu, MiB: 20480}, sim.KindGhostProcess, "GPU" + strconv.Itoa(gpu), nil
	case FaultGPUSlowdown:
		load, _ := strconv.Atoi(p["load"])
		return sim.SlowNode{Factor: 1 - float64(load)/100}, sim.KindSlowNode, "", nil
	}
	return nil, "", "", fmt.Errorf("action %q is not in the agent's config: %w", action, kit.ErrRefused)
}

func (f *simDrillFleet) revertLocked(a *simAgent, fault string, p map[string]string) {
	if _, kind, target, err := faultFor(fault, p); err == nil {
		a.node.ClearFault(kind, target)
	}
}

func (f *simDrillFleet) Nodes(_ context.Context, sel string) ([]kit.Node, error) {
	s, err := selector.Parse(sel)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []kit.Node
	for _, name := range f.order {
		a := f.agents[name]
		if !s.Matches(name, a.labels) {
			continue
		}
		st := a.state
		if !a.connected {
			st = "unreachable"
		}
		cn := kit.Node{Name: name, Labels: a.labels, State: st, Activity: "idle", Connected: a.connected}
		if why, ok := f.policyOut[name]; ok {
			cn.OutOfService, cn.OutOfServiceReason = true, why
		}
		out = append(out, cn)
	}
	return out, nil
}

func (f *simDrillFleet) reach(node string) (*simAgent, error) {
	f.tick()
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.agents[node]
	if !ok || !a.connected {
		return nil, fmt.Errorf("node %s: %w", node, kit.ErrUnreachable)
	}
	return a, nil
}

func (f *simDrillFleet) RunChecks(ctx context.Context, node string, names []string, _ kit.RunOptions) (*report.Report, error) {
	a, err := f.reach(node)
	if err != nil {
		return nil, err
	}
	if rep, ok := f.latest(a, names); ok {
		return rep, nil
	}
	return f.fresh(ctx, a, node, names)
}

// fresh runs the checks now, as an agent does on a request.
func (f *simDrillFleet) fresh(ctx context.Context, a *simAgent, node string, names []string) (*report.Report, error) {
	list, err := checks.Select(registry.All(), names, true)
	if err != nil {
		return nil, err
	}
	d := f.passDuration
	if slices.Contains(names, "nccl.allreduce") {
		d = time.Minute
	}
	// The pass reads the node when it starts and reports when it ends.
	res := inspect.Run(ctx, a.node, inspect.Options{Checks: list, Config: f.cfg, Prev: a.prev})
	if err := f.clock.Sleep(ctx, d); err != nil {
		return nil, err
	}
	f.mu.Lock()
	a.prev = res.State
	f.mu.Unlock()
	rep := res.Report
	if f.autoDrain && rep.Status == report.Fail {
		for _, c := range rep.Checks {
			for _, fd := range c.Findings {
				switch fd.Action {
				case report.ActionDrain, report.ActionReboot, report.ActionReplace, report.ActionReseat, report.ActionResetGPU:
					if err := f.drain.Drain(ctx, node, "fleetcheck: policy: "+fd.Code); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	return &rep, nil
}

func (f *simDrillFleet) RunMulti(context.Context, []string, string, kit.RunOptions) (*report.Report, error) {
	return nil, fmt.Errorf("multi-node runs: %w", kit.ErrRefused)
}

func (f *simDrillFleet) RunAction(_ context.Context, node, action string, params map[string]string, _ kit.RunOptions) (kit.ActionResult, error) {
	a, err := f.reach(node)
	if err != nil {
		return kit.ActionResult{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	a.actions[action]++
	now := f.clock.Now()
	if fault, ok := revertOf(action); ok {
		if d := a.drills[params[ParamDrillID]]; d != nil && d.revertedAt.IsZero() {
			d.revertedAt, d.revertedByCoord = now, true
		}
		f.revertLocked(a, fault, params)
		return kit.ActionResult{OK: true, Message: action + " done"}, nil
	}
	ft, _, _, err := faultFor(action, params)
	if err != nil {
		return kit.ActionResult{}, err
	}
	// The agent refuses a fault without its safety timer.
	after, err := time.ParseDuration(params[ParamRevertAfter])
	if err != nil {
		return kit.ActionResult{}, fmt.Errorf("%s without revert_after: %w", action, kit.ErrRefused)
	}
	onDisc, err := time.ParseDuration(params[ParamRevertOnDisconnect])
	if err != nil {
		return kit.ActionResult{}, fmt.Errorf("%s without revert_on_disconnect: %w", action, kit.ErrRefused)
	}
	// The timer is recorded before the fault is made, as the agent must.
	a.drills[params[ParamDrillID]] = &agentDrill{id: params[ParamDrillID], fault: action, params: params, due: now.Add(after), onDisconnect: onDisc}
	if err := a.node.AddFault(ft); err != nil {
		return kit.ActionResult{OK: false, Message: err.Error()}, nil
	}
	return kit.ActionResult{OK: true, Message: action + " injected"}, nil
}

// revertOf maps a revert action to its fault.
func revertOf(action string) (string, bool) {
	for k, c := range Catalog() {
		if c.Revert == action {
			return k, true
		}
	}
	return "", false
}

// harness is an engine over a simulated fleet and a fresh database.
type harness struct {
	t     testing.TB
	path  string
	db    *sqldb.DB
	fleet *simDrillFleet
	eng   *Engine
}

func openDB(t testing.TB, path string) *sqldb.DB { return dbtest.OpenSQLite(t, path) }

func TestMain(m *testing.M) { pgtest.Main(m) }

func newHarness(t testing.TB, nodes int, optedIn ...string) *harness {
	t.Helper()
	return newHarnessOn(t, nil, nodes, optedIn...)
}

// newHarnessOn is newHarness on db (nil: a SQLite file of the test's).
func newHarnessOn(t testing.TB, db *sqldb.DB, nodes int, optedIn ...string) *harness {
	t.Helper()
	h := &harness{t: t, path: filepath.Join(t.TempDir(), "fc.db"), fleet: newSimDrillFleet(t, nodes, optedIn...), db: db}
	if h.db == nil {
		h.db = openDB(t, h.path)
	}
	h.eng = h.newEngine(nil)
	return h
}

func (h *harness) newEngine(br *kit.Breaker) *Engine {
	h.t.Helper()
	e, err := New(context.Background(), kit.Deps{DB: h.db, Fleet: h.fleet, Drainer: h.fleet.drain, Breaker: br, Clock: h.fleet.clock, Logger: zerolog.New(io.Discard)}, Options{})
	if err != nil {
		h.t.Fatal(err)
	}
	return e
}

func (h *harness) spec(yaml string) *Spec {
	h.t.Helper()
	s, err := ParseSpec([]byte(yaml))
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func (h *harness) start(yaml string) string {
	h.t.Helper()
	id, err := h.eng.Start(context.Background(), h.spec(yaml))
	if err != nil {
		h.t.Fatal(err)
	}
	return id
}

// run steps the engine, moving the virtual clock to the next due time,
// until no drill runs; each hook runs before a step and may return true
// to stop early.
func (h *harness) run(e *Engine, hook func() bool) {
	h.t.Helper()
	ctx := context.Background()
	for range 100000 {
		if hook != nil && hook() {
			return
		}
		more, err := e.Step(ctx)
		if err != nil {
			h.t.Fatal(err)
		}
		if !more {
			return
		}
		next, err := e.NextDue(ctx)
		if err != nil {
			h.t.Fatal(err)
		}
		if p := h.fleet.nextPassAt(); !p.IsZero() && p.Before(next) {
			next = p
		}
		if now := h.fleet.clock.Now(); next.After(now) {
			h.fleet.clock.Advance(next.Sub(now))
			h.fleet.tick()
		}
		h.fleet.runPasses(ctx)
	}
	h.t.Fatal("drill did not finish")
}

func (h *harness) drill(id string) *Drill {
	h.t.Helper()
	d, err := h.eng.Get(context.Background(), id)
	if err != nil {
		h.t.Fatal(err)
	}
	return d
}
