package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/internal/compat"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

const (
	fleetDriver = "535.161.08"
	// badDriver with the fleet's VBIOS knocks a GPU off the bus on boot
	// (Xid 79); the matrix does not know it yet, so only a canary can.
	badDriver  = "550.54.14"
	goodDriver = "550.90.07"
	fleetVBIOS = "96.00.99.00.01"
	// oldKernel is below the matrix's kernel floor: the plan excludes the
	// node that runs it.
	oldKernel = "5.4.0-150-generic"
)

// rolloutMatrix is the compatibility matrix the plan checks every node
// against before anything is touched.
const rolloutMatrix = `
gpus:
  - model: H100 80GB HBM3
    drivers: ["535.*", ">=550.54, <551"]
    vbios: ["96.00.*"]
kernels: [">=5.15, <7"]
`

// RolloutResult is the rollout scenario's outcome: the bad driver's
// rollout halted by its canary, and the good driver's completed.
type RolloutResult struct {
	Bad  *rollout.Status `json:"bad_driver"`
	Good *rollout.Status `json:"good_driver"`
	// SimulatedS is each rollout's simulated duration, start to settle.
	BadSimulatedS  float64 `json:"bad_simulated_s"`
	GoodSimulatedS float64 `json:"good_simulated_s"`
}

func runRollout(ctx context.Context, opts CampaignOptions) (*RolloutResult, error) {
	w := opts.Progress
	matrix, err := compat.Parse([]byte(rolloutMatrix))
	if err != nil {
		return nil, err
	}
	res := &RolloutResult{}

	heading(w, "rollout (a): driver "+badDriver+", whose combination with VBIOS "+fleetVBIOS+" gives Xid 79 on boot")
	bad, badDur, err := runOneRollout(ctx, opts, "rollout-bad", badDriver, matrix)
	if err != nil {
		return nil, err
	}
	res.Bad, res.BadSimulatedS = bad, badDur.Seconds()
	writeRolloutStatus(w, bad, badDur)

	heading(w, "rollout (b): driver "+goodDriver)
	good, goodDur, err := runOneRollout(ctx, opts, "rollout-good", goodDriver, matrix)
	if err != nil {
		return nil, err
	}
	res.Good, res.GoodSimulatedS = good, goodDur.Seconds()
	writeRolloutStatus(w, good, goodDur)
	return res, nil
}

// runOneRollout runs a rollout to driver on a fresh 12-node fleet until
// it completes, halts or otherwise stops moving.
func runOneRollout(ctx context.Context, opts CampaignOptions, name, driver string, matrix *compat.Matrix) (*rollout.Status, time.Duration, error) {
	f, err := newUpgradeFleet(12, opts.Seed)
	if err != nil {
		return nil, 0, err
	}
	db, err := openCampaignDB(opts.Dir, name)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = db.Close() }() // the demo's own store; the run's error is what counts
	eng, err := rollout.New(ctx, kit.Deps{DB: db, Fleet: f, Clock: f.clock, Logger: zerolog.Nop()}, rollout.Options{Poll: 10 * time.Second})
	if err != nil {
		return nil, 0, err
	}
	one := 1
	spec := &rollout.Spec{
		Name: "r" + driver, Selector: "sku=h100", Target: rollout.Target{Driver: driver},
		Action: "driver-upgrade", RollbackAction: "driver-rollback",
		Canary: &one, Waves: []rollout.Amount{rollout.Percent(50)}, MaxUnavailable: rollout.Count(3),
		Approval: rollout.ApprovalAuto, Soak: rollout.Duration(10 * time.Minute),
		Validation: rollout.Validation{Checks: []string{"gpu.inventory", "gpu.xid", "gpu.ecc", "ib.ports", rollout.DefaultNCCLCheck}},
	}
	plan, err := rollout.Plan(ctx, spec, f, matrix)
	if err != nil {
		return nil, 0, err
	}
	writePlan(opts.Progress, plan)

	start := f.clock.Now()
	id, err := eng.Start(ctx, spec, matrix)
	if err != nil {
		return nil, 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- eng.Run(rctx) }()
	st, waitErr := waitRollout(ctx, eng, id)
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return nil, 0, err
	}
	if waitErr != nil {
		return nil, 0, waitErr
	}
	// A halted rollout has no finish time, and the virtual clock runs on
	// while the engine idles: the phase change is when it stopped.
	end := st.Updated
	if st.Finished != nil {
		end = *st.Finished
	}
	return st, end.Sub(start), nil
}

// waitRollout polls (in wall time) until the rollout settles: completed,
// halted, paused for a person, or any final phase.
func waitRollout(ctx context.Context, eng *rollout.Engine, id string) (*rollout.Status, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := eng.Status(id)
		if err != nil {
			return nil, err
		}
		switch st.Phase {
		case rollout.PhaseCompleted, rollout.PhaseHalted, rollout.PhaseAborted, rollout.PhaseRolledBack, rollout.PhaseAwaitingApproval:
			return st, nil
		}
		if st.Paused {
			return st, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("rollout %s still %s after 30 s of wall time: %v", id, st.Phase, st.Counts)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func writePlan(w io.Writer, p *rollout.PlanResult) {
	fmt.Fprintf(w, "Plan: %d of %d nodes selected, max %d unavailable.\n", p.Selected, p.FleetSize, p.MaxUnavailable)
	for _, wv := range p.Waves {
		var names []string
		for _, n := range wv.Nodes {
			names = append(names, n.Name)
		}
		fmt.Fprintf(w, "  %-8s budget %d: %s\n", wv.Name, wv.Budget, strings.Join(names, " "))
		for _, n := range wv.Nodes {
			if n.Disconnected {
				fmt.Fprintf(w, "  %s: %s\n", n.Name, n.Note)
			}
		}
	}
	for _, x := range p.Excluded {
		fmt.Fprintf(w, "  excluded %s (%s): %s\n", x.Node, x.Kind, x.Reason)
	}
}

func writeRolloutStatus(w io.Writer, s *rollout.Status, d time.Duration) {
	fmt.Fprintf(w, "Rollout %s: %s after %s simulated.\n", s.ID, s.Phase, simDur(d))
	if s.HaltReason != "" {
		fmt.Fprintf(w, "Halt: %s\n", s.HaltReason)
		for _, e := range s.Evidence {
			fmt.Fprintf(w, "  evidence: %s\n", e)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WAVE\tSTATE\tSIZE\tDONE\tFAILED\tPENDING")
	for _, wv := range s.Waves {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\n", wv.Name, wv.State, wv.Size, wv.Done, wv.Failed, wv.Pending)
	}
	_ = tw.Flush() // text for a person, like the Fprintf above
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tWAVE\tSTATE\tDRIVER BEFORE\tREASON")
	for _, n := range s.Nodes {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", n.Node, n.Wave, n.State, n.FromDriver, n.Reason)
	}
	_ = tw.Flush() // text for a person, like the Fprintf above
}

// upgradeFleet adds what a rollout needs to simfleet, which configures no
// agent actions: a driver per node that the upgrade action changes after
// a simulated install and reboot, inventories with VBIOS and kernel for
// the matrix, and the bad driver's Xid 79 on boot. all_reduce still runs
// on simfleet's model and virtual clock.
type upgradeFleet struct {
	sim   *simfleet.Fleet
	clock *simfleet.Clock

	mu    sync.Mutex
	nodes map[string]*upgradeNode
}

type upgradeNode struct {
	driver, kernel string
	backAt         time.Time // the agent is away rebooting until then
	upgrades       int
}

func newUpgradeFleet(n int, seed uint64) (*upgradeFleet, error) {
	sim, err := simfleet.New(simfleet.Config{Nodes: n, NodesPerLeaf: 8, Seed: seed})
	if err != nil {
		return nil, err
	}
	f := &upgradeFleet{sim: sim, clock: sim.Clock(), nodes: map[string]*upgradeNode{}}
	names := sim.Names()
	for i, name := range names {
		un := &upgradeNode{driver: fleetDriver, kernel: "6.5.0-1007-nvidia"}
		if i == len(names)-1 {
			un.kernel = oldKernel
		}
		f.nodes[name] = un
	}
	return f, nil
}

var _ kit.Fleet = (*upgradeFleet)(nil)

func (f *upgradeFleet) inventoryLocked(n *upgradeNode) report.Inventory {
	inv := report.Inventory{DriverVersion: n.driver, CUDAVersion: "12.2", Kernel: n.kernel, RDMAStack: "MLNX_OFED 23.10-1.1.9.0"}
	for i := range 8 {
		inv.GPUs = append(inv.GPUs, report.GPU{Index: i, Name: "NVIDIA H100 80GB HBM3", VBIOSVersion: fleetVBIOS, MemoryTotalMiB: 81559})
	}
	return inv
}

func (f *upgradeFleet) Nodes(ctx context.Context, sel string) ([]kit.Node, error) {
	ns, err := f.sim.Nodes(ctx, sel)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	for i := range ns {
		un := f.nodes[ns[i].Name]
		ns[i].Inventory = f.inventoryLocked(un)
		if now.Before(un.backAt) {
			ns[i].Connected, ns[i].State = false, "unreachable"
		}
	}
	return ns, nil
}

// RunChecks answers passive checks from the node's state (30 s of
// simulated time) and all_reduce from simfleet's model.
func (f *upgradeFleet) RunChecks(ctx context.Context, name string, checks []string, opts kit.RunOptions) (*report.Report, error) {
	f.mu.Lock()
	un, ok := f.nodes[name]
	if !ok || f.clock.Now().Before(un.backAt) {
		f.mu.Unlock()
		return nil, fmt.Errorf("node %s: %w", name, kit.ErrUnreachable)
	}
	inv := f.inventoryLocked(un)
	xid79 := un.driver == badDriver
	f.mu.Unlock()

	rep := &report.Report{Node: name, Inventory: inv}
	if err := f.clock.Sleep(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	for _, c := range checks {
		if c == simfleet.CheckAllReduce {
			r, err := f.sim.RunChecks(ctx, name, []string{c}, opts)
			if err != nil {
				return nil, err
			}
			rep.Checks = append(rep.Checks, r.Checks...)
			continue
		}
		cr := report.CheckResult{Name: c, Status: report.Pass}
		if c == "gpu.xid" && xid79 {
			cr.Status = report.Fail
			cr.Findings = []report.Finding{{Severity: report.SevFail, Component: "GPU3", Code: "XID_79",
				Message: "GPU has fallen off the bus (Xid 79) on boot with driver " + badDriver, Action: report.ActionReplace}}
		}
		rep.Checks = append(rep.Checks, cr)
	}
	rep.Summarize()
	return rep, nil
}

func (f *upgradeFleet) RunMulti(ctx context.Context, nodes []string, check string, opts kit.RunOptions) (*report.Report, error) {
	return f.sim.RunMulti(ctx, nodes, check, opts)
}

// RunAction installs the version (6 min simulated), then the agent is
// away for a 4 min reboot.
func (f *upgradeFleet) RunAction(ctx context.Context, name, action string, params map[string]string, _ kit.RunOptions) (kit.ActionResult, error) {
	if !slices.Contains([]string{"driver-upgrade", "driver-rollback"}, action) {
		return kit.ActionResult{}, fmt.Errorf("node %s: action %q is not in the agent's config: %w", name, action, kit.ErrRefused)
	}
	f.mu.Lock()
	un, ok := f.nodes[name]
	if !ok || f.clock.Now().Before(un.backAt) {
		f.mu.Unlock()
		return kit.ActionResult{}, fmt.Errorf("node %s: %w", name, kit.ErrUnreachable)
	}
	un.upgrades++
	f.mu.Unlock()
	if err := f.clock.Sleep(ctx, 6*time.Minute); err != nil {
		return kit.ActionResult{}, err
	}
	f.mu.Lock()
	un.driver = params["version"]
	un.backAt = f.clock.Now().Add(4 * time.Minute)
	f.mu.Unlock()
	return kit.ActionResult{OK: true, Message: "installed " + params["version"] + ", rebooting"}, nil
}
