package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// BurninResult is the burn-in scenario's outcome.
type BurninResult struct {
	SlowNode   string         `json:"slow_node"`
	Accepted   []string       `json:"accepted"`
	Rejected   []string       `json:"rejected"`
	SimulatedS float64        `json:"simulated_s"`
	HTML       string         `json:"html,omitempty"`
	Report     *burnin.Report `json:"report"`
}

// runBurnin: 16 nodes at the standard level, one 20 % slower than its
// peers: above the SKU floor and within the baseline's tolerance, but an
// outlier among identical nodes, so it is rejected.
func runBurnin(ctx context.Context, opts CampaignOptions) (*BurninResult, error) {
	w := opts.Progress
	heading(w, "burn-in: 16 new nodes at the standard level")
	sf, err := simfleet.New(simfleet.Config{Nodes: 16, NodesPerLeaf: 8, Seed: opts.Seed, Render: true})
	if err != nil {
		return nil, err
	}
	slow := sf.Names()[6]
	if err := sf.Inject(simfleet.GPUSlow{Node: slow, Factor: 0.8}); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "%s runs 20 %% slower than its peers (GPU side).\n", slow)
	db, err := openCampaignDB(opts.Dir, "burnin")
	if err != nil {
		return nil, err
	}
	defer func() { _ = db.Close() }() // the demo's own store; the run's error is what counts
	store, err := baselines.NewSQLStore(db)
	if err != nil {
		return nil, err
	}
	// The SKU baseline an operator would have recorded or imported.
	st, err := baselines.NewStats([]float64{480})
	if err != nil {
		return nil, err
	}
	if _, err := store.Set(ctx, baselines.Baseline{Key: baselines.Key{Metric: burnin.MetricBusBW,
		Scope: baselines.SKUScope("h100-sxm-80g-x8-nvlink"), Stack: baselines.Stack{Driver: "535.161.08"}},
		Direction: baselines.HigherBetter, Samples: st}); err != nil {
		return nil, err
	}
	fleet := &burninFleet{Fleet: sf, clock: sf.Clock()}
	eng, err := burnin.New(ctx, kit.Deps{DB: db, Fleet: fleet, Clock: fleet.clock, Logger: zerolog.Nop()}, burnin.Options{Baselines: store})
	if err != nil {
		return nil, err
	}
	spec, err := burnin.ParseSpec([]byte("name: demo-acceptance\nselector: sku=h100\nlevel: standard\nconcurrency: 16\n"))
	if err != nil {
		return nil, err
	}
	start := fleet.clock.Now()
	id, err := eng.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- eng.Run(rctx) }()
	waitErr := waitBurnin(ctx, eng)
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return nil, err
	}
	if waitErr != nil {
		return nil, waitErr
	}
	rep, err := eng.Report(ctx, id)
	if err != nil {
		return nil, err
	}
	end := rep.Campaign.FinishedAt
	if end.IsZero() {
		end = fleet.clock.Now()
	}
	res := &BurninResult{SlowNode: slow, SimulatedS: end.Sub(start).Seconds(), Report: rep}
	for _, n := range rep.Nodes {
		switch n.Verdict {
		case burnin.Accepted:
			res.Accepted = append(res.Accepted, n.Node)
		case burnin.Rejected:
			res.Rejected = append(res.Rejected, n.Node)
		}
	}
	fmt.Fprintf(w, "Campaign %s: %s after %s simulated, %d runs; %d accepted, %d rejected.\n",
		rep.Campaign.ID, rep.Campaign.State, simDur(end.Sub(start)), rep.Campaign.RunsDone, len(res.Accepted), len(res.Rejected))
	writeBurninTable(w, rep)
	if opts.HTML != "" {
		if err := writeBurninHTML(opts.HTML, rep); err != nil {
			return nil, err
		}
		res.HTML = opts.HTML
		fmt.Fprintf(w, "HTML acceptance report written to %s.\n", opts.HTML)
	} else {
		fmt.Fprintln(w, "(--html FILE writes the HTML acceptance report, every node with its evidence.)")
	}
	return res, nil
}

func writeBurninHTML(path string, rep *burnin.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := burnin.WriteHTML(f, rep); err != nil {
		_ = f.Close() // the write error is the one to report
		return err
	}
	return f.Close()
}

// waitBurnin polls (in wall time) until every campaign is done.
func waitBurnin(ctx context.Context, eng *burnin.Engine) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		finished, err := eng.Done(ctx)
		if err != nil {
			return err
		}
		if finished {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("burn-in not done after 30 s of wall time")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// writeBurninTable prints each node's verdict with the all_reduce number
// and why a rejected node was rejected.
func writeBurninTable(w io.Writer, rep *burnin.Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tVERDICT\tBUSBW GB/s\tVS PEERS\tVS BASELINE\tREASON")
	for _, n := range rep.Nodes {
		bw, peers, base := "-", "-", "-"
		for _, num := range n.Evidence.Numbers {
			if num.Metric == burnin.MetricBusBW && num.Pair == "" {
				bw = fmt.Sprintf("%.1f", num.Value)
				peers = fmt.Sprintf("%+.1f %%", -100*num.MedianShortfall)
				base = fmt.Sprintf("%+.1f %% (%s)", -100*num.Deviation, num.BaselineVerdict)
			}
		}
		var why []string
		for _, r := range n.Evidence.Reasons {
			why = append(why, r.Code+": "+r.Message)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Node, n.Verdict, bw, peers, base, strings.Join(why, "; "))
	}
	_ = tw.Flush() // text for a person, like the Fprintf above
}

// burninFleet adds what burn-in needs beyond simfleet's all_reduce model:
// the time passive checks and dcgm.diag take, and the pcie-bandwidth
// action.
type burninFleet struct {
	*simfleet.Fleet
	clock *simfleet.Clock
}

func (f *burninFleet) RunChecks(ctx context.Context, node string, checks []string, opts kit.RunOptions) (*report.Report, error) {
	if slices.Contains(checks, simfleet.CheckAllReduce) {
		return f.Fleet.RunChecks(ctx, node, checks, opts)
	}
	wait := 20 * time.Second
	if slices.Contains(checks, "dcgm.diag") {
		wait = 2 * time.Minute
	}
	if err := f.clock.Sleep(ctx, wait); err != nil {
		return nil, err
	}
	// The real checks read the simulated node (simfleet.Config.Render): a
	// burn-in accepts only on evidence, and a report of passes over
	// nothing measured is none.
	return f.Fleet.RunChecks(ctx, node, checks, opts)
}

func (f *burninFleet) RunAction(ctx context.Context, node, action string, _ map[string]string, _ kit.RunOptions) (kit.ActionResult, error) {
	if action != burnin.ActionPCIeBandwidth {
		return kit.ActionResult{}, fmt.Errorf("node %s: action %q is not in the agent's config: %w", node, action, kit.ErrRefused)
	}
	if err := f.clock.Sleep(ctx, time.Minute); err != nil {
		return kit.ActionResult{}, err
	}
	return kit.ActionResult{OK: true, Output: "metric pcie.h2d_bandwidth_gbps 55.2\nmetric pcie.d2h_bandwidth_gbps 54.9\n"}, nil
}
