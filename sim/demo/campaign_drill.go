package demo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/selector"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	"github.com/fleetcheck/fleetcheck/node/inspect"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// drillOptIn is the label a node carries when its owner allows drills.
const drillOptIn = "fleetcheck.io/drill"

// xidDrillSpec injects Xid 79 on GPU 3 of the one opted-in node.
const xidDrillSpec = `
name: xid79-drill
fault: xid-inject
params: {xid: "79", gpu: "3"}
expect: {check: gpu.xid, code: XID_79}
targets: name=gpu-002
deadline: 10m
poll_interval: 30s
`

// wideDrillSpec asks for three nodes where the blast radius allows two.
const wideDrillSpec = `
name: too-wide
fault: xid-inject
targets: name in (gpu-002,gpu-003,gpu-004)
blast_radius: {max_nodes: 2}
`

// DrillResult is the drill scenario's outcome.
type DrillResult struct {
	Drill      *drill.Drill `json:"drill"`
	TTDS       float64      `json:"ttd_s"`
	TTRS       float64      `json:"ttr_s"`
	DetectedBy string       `json:"detected_by"`
	// Refused is why the too-wide drill was refused.
	Refused         string `json:"refused"`
	BlastRadiusHeld bool   `json:"blast_radius_refused"`
}

func runDrill(ctx context.Context, opts CampaignOptions) (*DrillResult, error) {
	w := opts.Progress
	heading(w, "drill: inject Xid 79 on an opted-in node, measure detection and recovery")
	f, err := newDrillFleet(8, "gpu-002", "gpu-003", "gpu-004")
	if err != nil {
		return nil, err
	}
	db, err := openCampaignDB(opts.Dir, "drill")
	if err != nil {
		return nil, err
	}
	defer func() { _ = db.Close() }() // the demo's own store; the run's error is what counts
	eng, err := drill.New(ctx, kit.Deps{DB: db, Fleet: f, Clock: f.clock, Logger: zerolog.Nop()}, drill.Options{})
	if err != nil {
		return nil, err
	}
	spec, err := drill.ParseSpec([]byte(xidDrillSpec))
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "8 simulated nodes; gpu-002, gpu-003 and gpu-004 carry %s=allowed.\n", drillOptIn)
	id, err := eng.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	if err := driveDrill(ctx, eng, f.clock); err != nil {
		return nil, err
	}
	d, err := eng.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	res := &DrillResult{Drill: d}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tFAULT\tDETECTED BY\tTIME TO DETECT\tTIME TO RECOVER\tREVERTED BY\tPOLLS")
	for _, t := range d.Targets {
		ttd, _ := t.TTD()
		ttr, _ := t.TTR()
		if res.DetectedBy == "" {
			res.DetectedBy, res.TTDS, res.TTRS = t.DetectedBy, ttd.Seconds(), ttr.Seconds()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", t.Node, d.Fault, t.DetectedBy, simDur(ttd), simDur(ttr), t.RevertedBy, t.Polls)
	}
	_ = tw.Flush() // text for a person, like the Fprintf above
	fmt.Fprintf(w, "Drill %s: %s.\n", d.ID, d.State)

	wide, err := drill.ParseSpec([]byte(wideDrillSpec))
	if err != nil {
		return nil, err
	}
	_, err = eng.Start(ctx, wide)
	switch {
	case err == nil:
		return nil, errors.New("a drill over its blast radius was started")
	case errors.Is(err, drill.ErrBlastRadius):
		res.Refused, res.BlastRadiusHeld = err.Error(), true
		fmt.Fprintf(w, "A drill on 3 nodes with blast_radius max_nodes 2: refused: %v\n", err)
	default:
		return nil, err
	}
	return res, nil
}

// driveDrill steps the engine and moves the virtual clock to the next due
// time until no drill runs, so a drill of simulated minutes takes
// milliseconds.
func driveDrill(ctx context.Context, eng *drill.Engine, clock *simfleet.Clock) error {
	for range 10000 {
		more, err := eng.Step(ctx)
		if err != nil {
			return err
		}
		if !more {
			return nil
		}
		next, err := eng.NextDue(ctx)
		if err != nil {
			return err
		}
		if now := clock.Now(); next.After(now) {
			clock.Advance(next.Sub(now))
		}
	}
	return errors.New("drill did not finish")
}

// drillFleet is a kit.Fleet of single-node simulators read by the
// real probes and checks, with the fault actions an agent configures for
// drills. simfleet has no agent actions, hence this wrapper.
type drillFleet struct {
	clock *simfleet.Clock
	cfg   *config.Config

	mu     sync.Mutex
	order  []string
	agents map[string]*drillAgent
}

type drillAgent struct {
	node   *sim.Node
	labels map[string]string
	prev   *checks.State
}

var _ kit.Fleet = (*drillFleet)(nil)

func newDrillFleet(n int, optedIn ...string) (*drillFleet, error) {
	clock := simfleet.NewClock(time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC))
	f := &drillFleet{clock: clock, cfg: config.Defaults(), agents: map[string]*drillAgent{}}
	shared := sim.NewShared()
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("gpu-%03d", i)
		spec := sim.DefaultSpec(name)
		spec.Clock, spec.Shared, spec.Seed = clock, shared, uint64(i)
		node, err := sim.New(spec)
		if err != nil {
			return nil, err
		}
		labels := map[string]string{"sku": "h100", "rack": "r" + strconv.Itoa((i-1)/4+1)}
		if slices.Contains(optedIn, name) {
			labels[drillOptIn] = "allowed"
		}
		f.agents[name] = &drillAgent{node: node, labels: labels}
		f.order = append(f.order, name)
	}
	return f, nil
}

func (f *drillFleet) Nodes(_ context.Context, sel string) ([]kit.Node, error) {
	s, err := selector.Parse(sel)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []kit.Node
	for _, name := range f.order {
		a := f.agents[name]
		if s.Matches(name, a.labels) {
			out = append(out, kit.Node{Name: name, Labels: a.labels, State: "healthy", Activity: "idle", Connected: true})
		}
	}
	return out, nil
}

// RunChecks runs the named checks on the node's simulator; a pass takes
// 5 s of simulated time.
func (f *drillFleet) RunChecks(ctx context.Context, name string, names []string, _ kit.RunOptions) (*report.Report, error) {
	f.mu.Lock()
	a, ok := f.agents[name]
	var prev *checks.State
	if ok {
		prev = a.prev
	}
	f.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("node %s: %w", name, kit.ErrUnreachable)
	}
	list, err := checks.Select(registry.All(), names, true)
	if err != nil {
		return nil, err
	}
	// The agent reads the node as its pass ends, so a fault injected just
	// before shows up one pass later, as on a real node.
	if err := f.clock.Sleep(ctx, 5*time.Second); err != nil {
		return nil, err
	}
	res := inspect.Run(ctx, a.node, inspect.Options{Checks: list, Config: f.cfg, Prev: prev})
	f.mu.Lock()
	a.prev = res.State
	f.mu.Unlock()
	rep := res.Report
	return &rep, nil
}

func (f *drillFleet) RunMulti(context.Context, []string, string, kit.RunOptions) (*report.Report, error) {
	return nil, fmt.Errorf("multi-node runs: %w", kit.ErrRefused)
}

// RunAction injects or reverts an Xid, as an agent configured for drills
// would; like such an agent it refuses a fault without its safety timer.
func (f *drillFleet) RunAction(_ context.Context, name, action string, params map[string]string, _ kit.RunOptions) (kit.ActionResult, error) {
	f.mu.Lock()
	a, ok := f.agents[name]
	f.mu.Unlock()
	if !ok {
		return kit.ActionResult{}, fmt.Errorf("node %s: %w", name, kit.ErrUnreachable)
	}
	gpu, _ := strconv.Atoi(params["gpu"])
	switch action {
	case drill.FaultXid:
		if _, err := time.ParseDuration(params[drill.ParamRevertAfter]); err != nil {
			return kit.ActionResult{}, fmt.Errorf("%s without revert_after: %w", action, kit.ErrRefused)
		}
		code, err := strconv.Atoi(params["xid"])
		if err != nil {
			return kit.ActionResult{}, fmt.Errorf("xid %q: %w", params["xid"], kit.ErrRefused)
		}
		if err := a.node.AddFault(sim.Xid{GPU: gpu, Code: code}); err != nil {
			return kit.ActionResult{OK: false, Message: err.Error()}, nil
		}
		return kit.ActionResult{OK: true, Message: action + " injected"}, nil
	case drill.FaultXid + "-revert":
		a.node.ClearFault(sim.KindXid, "GPU"+strconv.Itoa(gpu))
		return kit.ActionResult{OK: true, Message: action + " done"}, nil
	}
	return kit.ActionResult{}, fmt.Errorf("node %s: action %q is not in the agent's config: %w", name, action, kit.ErrRefused)
}
