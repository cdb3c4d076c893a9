package rollout

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
	"github.com/fleetcheck/fleetcheck/internal/compat"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

const (
	oldDriver = "535.161.08"
	newDriver = "550.90.07"
)

// testMatrix allows R535 and R550 on H100 and knows one bad combination.
const testMatrix = `
gpus:
  - model: H100 80GB HBM3
    drivers: ["535.*", ">=550.90.07, <551"]
    vbios: ["96.00.*"]
kernels: [">=5.15, <7"]
known_bad:
  - when: {driver: 550.90.07, vbios: 96.00.74.*}
    reason: Xid 79 on boot
`

func mustMatrix(t testing.TB) *compat.Matrix {
	t.Helper()
	m, err := compat.Parse([]byte(testMatrix))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// manualClock is moved by the test.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Date(2026, 3, 2, 2, 0, 0, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	ch <- c.Now().Add(d)
	return ch
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fnode is one simulated node of fakeFleet.
type fnode struct {
	name   string
	labels map[string]string
	driver string
	vbios  string
	gpu    string
	kernel string
	busbw  float64
	// rebootUntil: the agent is away until then after an action.
	rebootUntil time.Time
	lost        bool // the agent never comes back after the upgrade
	disconnect  bool // not connected at all

	// faults tied to the new driver
	badAfter      bool    // gpu.xid fails on the target driver
	slowAfter     float64 // busbw factor on the target driver (0: none)
	nanAfter      bool    // the NCCL metric is missing on the target driver
	timeoutAfter  bool    // the inspection times out on the target driver
	failAction    bool    // the action reports failure
	preFail       bool    // gpu.ecc fails whatever the driver
	blankAfter    bool    // on the target driver the agent sees no GPU (every check passes: nothing measured)
	actionNoReply bool    // the action's answer is lost (the upgrade happens)

	upgrades, rollbacks int
}

// fakeFleet is a kit.Fleet with a small upgrade model: the upgrade
// action sets the driver and takes the agent away for a reboot.
type fakeFleet struct {
	mu     sync.Mutex
	clock  kit.Clock
	nodes  map[string]*fnode
	order  []string
	reboot time.Duration
	calls  []string
	// listings counts Nodes calls.
	listings int
}

func newFakeFleet(clock kit.Clock, n int) *fakeFleet {
	f := &fakeFleet{clock: clock, nodes: map[string]*fnode{}, reboot: 3 * time.Minute}
	for i := range n {
		name := fmt.Sprintf("gpu-%03d", i+1)
		f.nodes[name] = &fnode{name: name, labels: map[string]string{"sku": "h100", "rack": fmt.Sprintf("r%d", i/4)},
			driver: oldDriver, vbios: "96.00.99.00.01", gpu: "NVIDIA H100 80GB HBM3", kernel: "6.5.0-1007-nvidia", busbw: 480}
		f.order = append(f.order, name)
	}
	return f
}

func (f *fakeFleet) node(name string) *fnode {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodes[name]
}

// set changes a node under the lock.
func (f *fakeFleet) set(name string, fn func(n *fnode)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.nodes[name])
}

func (f *fakeFleet) connectedLocked(n *fnode) bool {
	if n.disconnect || n.lost && n.driver == newDriver {
		return false
	}
	return !f.clock.Now().Before(n.rebootUntil)
}

func (f *fakeFleet) inventory(n *fnode) report.Inventory {
	inv := report.Inventory{DriverVersion: n.driver, CUDAVersion: "12.2", Kernel: n.kernel, RDMAStack: "MLNX_OFED 23.10-1.1.9.0"}
	for i := range 8 {
		inv.GPUs = append(inv.GPUs, report.GPU{Index: i, Name: n.gpu, VBIOSVersion: n.vbios})
	}
	return inv
}

func (f *fakeFleet) Nodes(ctx context.Context, sel string) ([]kit.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listings++
	var out []kit.Node
	for _, name := range f.order {
		n := f.nodes[name]
		if one, ok := strings.CutPrefix(sel, "name="); ok {
			if name != one {
				continue
			}
		} else if sel != "" && sel != "sku=h100" {
			return nil, fmt.Errorf("fake fleet: selector %q not supported", sel)
		}
		cn := kit.Node{Name: name, Labels: n.labels, State: "healthy", Activity: "idle",
			Connected: f.connectedLocked(n), Inventory: f.inventory(n)}
		if !cn.Connected {
			cn.State = "unreachable"
		}
		out = append(out, cn)
	}
	return out, nil
}

func (f *fakeFleet) RunChecks(ctx context.Context, name string, checks []string, opts kit.RunOptions) (*report.Report, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[name]
	if n == nil || !f.connectedLocked(n) {
		return nil, fmt.Errorf("node %s: %w", name, kit.ErrUnreachable)
	}
	after := n.driver == newDriver
	if after && n.timeoutAfter && len(checks) > 1 {
		return nil, fmt.Errorf("node %s: inspection %w after %v", name, kit.ErrTimeout, opts.Timeout)
	}
	rep := &report.Report{Node: name, Inventory: f.inventory(n)}
	if after && n.blankAfter {
		rep.Inventory.GPUs = nil
	}
	for _, c := range checks {
		cr := report.CheckResult{Name: c, Status: report.Pass}
		switch {
		case c == "gpu.xid" && after && n.badAfter:
			cr.Status = report.Fail
			cr.Findings = []report.Finding{{Severity: report.SevFail, Component: "GPU3", Code: "XID_79", Message: "GPU has fallen off the bus", Action: report.ActionReplace}}
		case c == "gpu.ecc" && n.preFail:
			cr.Status = report.Fail
			cr.Findings = []report.Finding{{Severity: report.SevFail, Component: "GPU1", Code: "ECC_UNCORRECTABLE", Message: "2 uncorrectable", Action: report.ActionReplace}}
		case c == "gpu.fabric":
			cr.Status = report.Skip
			cr.Reason = "no NVSwitch fabric"
		case c == DefaultNCCLCheck:
			bw := n.busbw
			if after && n.slowAfter > 0 {
				bw *= n.slowAfter
			}
			if after && n.nanAfter {
				bw = math.NaN()
			}
			cr.Metrics = map[string]float64{DefaultMetric: bw}
		}
		rep.Checks = append(rep.Checks, cr)
	}
	rep.Summarize() // drops NaN, as agents do
	return rep, nil
}

func (f *fakeFleet) RunMulti(ctx context.Context, nodes []string, check string, opts kit.RunOptions) (*report.Report, error) {
	return nil, fmt.Errorf("fake fleet: no multi-node runs: %w", kit.ErrRefused)
}

func (f *fakeFleet) RunAction(ctx context.Context, name, action string, params map[string]string, opts kit.RunOptions) (kit.ActionResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name+" "+action+" "+params["version"])
	n := f.nodes[name]
	if n == nil || !f.connectedLocked(n) {
		return kit.ActionResult{}, fmt.Errorf("node %s: %w", name, kit.ErrUnreachable)
	}
	switch action {
	case "driver-upgrade":
		n.upgrades++
	case "driver-rollback":
		n.rollbacks++
	default:
		return kit.ActionResult{}, fmt.Errorf("action %q not in the agent's config: %w", action, kit.ErrRefused)
	}
	if n.failAction {
		return kit.ActionResult{OK: false, Message: "dkms build failed", Output: "Error! Bad return status for module build"}, nil
	}
	n.driver = params["version"]
	n.rebootUntil = f.clock.Now().Add(f.reboot)
	if n.actionNoReply {
		return kit.ActionResult{}, fmt.Errorf("node %s: stream closed: %w", name, kit.ErrUnreachable)
	}
	return kit.ActionResult{OK: true, Message: "installed " + params["version"] + ", rebooting"}, nil
}

// upgradeCalls counts upgrade actions per node.
func (f *fakeFleet) upgradeCalls() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for name, n := range f.nodes {
		if n.upgrades > 0 {
			out[name] = n.upgrades
		}
	}
	return out
}

// recordingDrain wraps drain.None: it counts Undrain calls per node and
// can report running jobs until a time.
type recordingDrain struct {
	*drain.None
	clock    kit.Clock
	mu       sync.Mutex
	undrains map[string]int
	jobsTill map[string]time.Time
}

func newRecordingDrain(clock kit.Clock) *recordingDrain {
	return &recordingDrain{None: drain.NewNone(nil), clock: clock, undrains: map[string]int{}, jobsTill: map[string]time.Time{}}
}

func (d *recordingDrain) Undrain(ctx context.Context, node string) error {
	d.mu.Lock()
	d.undrains[node]++
	d.mu.Unlock()
	return d.None.Undrain(ctx, node)
}

func (d *recordingDrain) Status(ctx context.Context, node string) (drain.Status, error) {
	st, err := d.None.Status(ctx, node)
	d.mu.Lock()
	if t, ok := d.jobsTill[node]; ok && d.clock.Now().Before(t) {
		st.RunningJobs = 1
	}
	d.mu.Unlock()
	return st, err
}

func (d *recordingDrain) undrainCount(node string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.undrains[node]
}

// ourDrains lists nodes drained by fleetcheck.
func (d *recordingDrain) ourDrains() []string {
	var out []string
	for n, st := range d.Snapshot() {
		if st.Drained && st.ByFleetcheck {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func openDB(t testing.TB, dir string) *sqldb.DB {
	return dbtest.OpenSQLite(t, filepath.Join(dir, "rollout.db"))
}

// harness is an engine on a fake fleet, stepped by the test.
type harness struct {
	t       testing.TB
	ctx     context.Context
	clock   *manualClock
	fleet   *fakeFleet
	drain   *recordingDrain
	breaker *kit.Breaker
	db      *sqldb.DB
	eng     *Engine
	matrix  *compat.Matrix
	tick    time.Duration
}

func TestMain(m *testing.M) { pgtest.Main(m) }

func newHarness(t testing.TB, nodes int) *harness {
	t.Helper()
	return newHarnessOn(t, nodes, openDB(t, t.TempDir()))
}

// newHarnessOn is newHarness on db.
func newHarnessOn(t testing.TB, nodes int, db *sqldb.DB) *harness {
	t.Helper()
	clk := newManualClock()
	h := &harness{t: t, ctx: context.Background(), clock: clk, fleet: newFakeFleet(clk, nodes), drain: newRecordingDrain(clk),
		db: db, matrix: mustMatrix(t), tick: 20 * time.Second}
	h.eng = h.newEngine()
	return h
}

func (h *harness) newEngine() *Engine {
	h.t.Helper()
	e, err := New(context.Background(), kit.Deps{DB: h.db, Fleet: h.fleet, Drainer: h.drain, Breaker: h.breaker, Clock: h.clock, Logger: zerolog.Nop()},
		Options{Poll: 15 * time.Second})
	if err != nil {
		h.t.Fatal(err)
	}
	return e
}

func baseSpec() *Spec {
	one := 1
	return &Spec{
		Name: "r550", Selector: "sku=h100", Target: Target{Driver: newDriver},
		Action: "driver-upgrade", RollbackAction: "driver-rollback",
		Canary: &one, Waves: []Amount{Percent(50)}, MaxUnavailable: Count(4),
		Approval: ApprovalAuto, Soak: Duration(10 * time.Minute),
		Validation: Validation{Checks: []string{"gpu.inventory", "gpu.xid", "gpu.ecc", "gpu.fabric", "ib.ports", DefaultNCCLCheck}},
	}
}

func (h *harness) start(spec *Spec) string {
	h.t.Helper()
	id, err := h.eng.Start(h.ctx, spec, h.matrix)
	if err != nil {
		h.t.Fatal(err)
	}
	return id
}

// step runs one engine step, lets its operations finish, then moves the
// clock one tick.
func (h *harness) step() {
	h.t.Helper()
	if err := h.eng.Step(h.ctx); err != nil {
		h.t.Fatal(err)
	}
	h.eng.waitOps()
	h.clock.advance(h.tick)
}

func (h *harness) status(id string) *Status {
	h.t.Helper()
	s, err := h.eng.Status(id)
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

// runUntil steps until stop says so, at most max steps.
func (h *harness) runUntil(id string, max int, stop func(*Status) bool) *Status {
	h.t.Helper()
	for i := 0; i < max; i++ {
		h.step()
		if s := h.status(id); stop(s) {
			// one more step applies nothing new but flushes the results
			return s
		}
	}
	s := h.status(id)
	h.t.Fatalf("not done after %d steps: phase %s paused %v blocked %q counts %v", max, s.Phase, s.Paused, s.Blocked, s.Counts)
	return nil
}

func settled(s *Status) bool {
	return s.Phase.final() || s.Phase == PhaseHalted || s.Phase == PhaseAwaitingApproval || s.Paused
}

func nodeState(s *Status, name string) NodeStatus {
	for _, n := range s.Nodes {
		if n.Node == name {
			return n
		}
	}
	return NodeStatus{}
}
