package remediation

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/selector"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

var t0 = time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time                       { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) After(time.Duration) <-chan time.Time { return make(chan time.Time) }
func (c *clock) Add(d time.Duration)                  { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// fault is a fault on one component of a fake node: fixedBy is the step
// that clears it ("" none: only a replace does).
type fault struct {
	code    string
	fixedBy string
}

type fakeNode struct {
	labels    map[string]string
	faults    map[string]fault // by component
	busbw     float64
	connected bool
}

// fakeFleet is a kit.Fleet whose agent actions clear the faults they fix.
type fakeFleet struct {
	mu      sync.Mutex
	nodes   map[string]*fakeNode
	actions []string // node action params, in order
	// hold makes a node's actions wait until its channel closes; each
	// says on entered that it started.
	hold    map[string]chan struct{}
	entered chan string
	// checkRuns are the check runs asked for: "node [checks]".
	checkRuns []string
}

func newFakeFleet(n int) *fakeFleet {
	f := &fakeFleet{nodes: map[string]*fakeNode{}}
	for i := range n {
		f.nodes[fmt.Sprintf("n%02d", i)] = &fakeNode{labels: map[string]string{"rack": "r" + strconv.Itoa(i/4)}, faults: map[string]fault{}, busbw: 480, connected: true}
	}
	return f
}

func (f *fakeFleet) Nodes(_ context.Context, sel string) ([]kit.Node, error) {
	s, err := selector.Parse(sel)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []kit.Node
	for name, n := range f.nodes {
		if s.Matches(name, n.labels) {
			inv := report.Inventory{}
			for i := range 8 {
				inv.GPUs = append(inv.GPUs, report.GPU{Index: i, Name: "NVIDIA H100 80GB HBM3", Serial: fmt.Sprintf("SN-%s-%d", name, i)})
			}
			out = append(out, kit.Node{Name: name, Labels: n.labels, Connected: n.connected, State: "healthy", Inventory: inv})
		}
	}
	return out, nil
}

func (f *fakeFleet) RunChecks(_ context.Context, node string, names []string, _ kit.RunOptions) (*report.Report, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checkRuns = append(f.checkRuns, fmt.Sprintf("%s %v", node, names))
	n := f.nodes[node]
	rep := &report.Report{}
	for _, name := range names {
		c := report.CheckResult{Name: name, Status: report.Pass, Findings: []report.Finding{}}
		switch name {
		case "gpu.xid":
			for comp, ft := range n.faults {
				c.Status = report.Fail
				c.Findings = append(c.Findings, report.Finding{Severity: report.SevFail, Component: comp, Code: ft.code, Action: report.ActionResetGPU})
			}
		case "nccl.allreduce":
			c.Metrics = map[string]float64{"nccl.allreduce.busbw_gbps": n.busbw}
		}
		rep.Checks = append(rep.Checks, c)
	}
	return rep, nil
}

func (f *fakeFleet) RunMulti(_ context.Context, nodes []string, check string, _ kit.RunOptions) (*report.Report, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checkRuns = append(f.checkRuns, fmt.Sprintf("%v %s", nodes, check))
	return nil, kit.ErrRefused
}

func (f *fakeFleet) RunAction(ctx context.Context, node, action string, params map[string]string, _ kit.RunOptions) (kit.ActionResult, error) {
	f.mu.Lock()
	f.actions = append(f.actions, fmt.Sprintf("%s %s %v", node, action, params))
	hold := f.hold[node]
	f.mu.Unlock()
	if hold != nil { // a slow agent: the action returns when the test says
		f.entered <- node
		select {
		case <-hold:
		case <-ctx.Done():
			return kit.ActionResult{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[node]
	step := map[string]string{"gpu-reset": StepResetGPU, "ib-port-reset": StepResetIBPort, "reboot": StepReboot}[action]
	if action == "collect-bundle" {
		// As the agent answers for deploy/actions/fleetcheck-collect-bundle.
		return kit.ActionResult{OK: true, Message: "done", Output: "wrote ... 42 files\nbundle /var/lib/fleetcheck-agent/bundles/" + node + ".tar.gz\n"}, nil
	}
	for comp, ft := range n.faults {
		if ft.fixedBy == step || (step == StepReboot && ft.fixedBy == StepResetGPU) {
			if step != StepResetGPU || params["gpu"] == comp[3:] {
				delete(n.faults, comp)
			}
		}
	}
	return kit.ActionResult{OK: true, Message: action + " done"}, nil
}

func (f *fakeFleet) set(node string, fn func(*fakeNode)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.nodes[node])
}

func (f *fakeFleet) ran() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.actions...)
}

// sent is every request that reached an agent: actions and check runs.
func (f *fakeFleet) sent() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(append([]string(nil), f.actions...), f.checkRuns...)
}

func openDB(t *testing.T) *sqldb.DB { return dbtest.SQLite(t) }

// drive steps the engine, moving the clock to each next due time, until
// nothing is due or limit passes.
func drive(t *testing.T, e *Engine, c *clock, limit time.Duration) {
	t.Helper()
	ctx := context.Background()
	end := c.Now().Add(limit)
	for range 1000 {
		if _, err := e.Step(ctx); err != nil {
			t.Fatal(err)
		}
		next, ok, err := e.NextDue(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !ok || next.After(end) {
			return
		}
		if d := next.Sub(c.Now()); d > 0 {
			c.Add(d)
		}
	}
	t.Fatal("engine did not settle")
}
