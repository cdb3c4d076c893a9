package demo

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// SweepResult is the sweep scenario's outcome.
type SweepResult struct {
	Nodes  int           `json:"nodes"`
	Leaves []string      `json:"leaves"`
	Truth  []string      `json:"injected"`
	Report *sweep.Report `json:"report"`
}

// runSweep: 64 nodes on four leaves, a GPU-side slow node, a network-side
// slow node and a slow leaf-to-leaf path, ±3 % noise, compared with the
// shipped reference baselines.
func runSweep(ctx context.Context, opts CampaignOptions) (*SweepResult, error) {
	w := opts.Progress
	heading(w, "sweep: find slow nodes and links")
	f, err := simfleet.New(simfleet.Config{Nodes: 64, NodesPerLeaf: 16, NoisePct: 3, Seed: opts.Seed})
	if err != nil {
		return nil, err
	}
	names := f.Names()
	gpuNode, netNode := names[4], names[39]
	faults := []simfleet.Fault{
		simfleet.GPUSlow{Node: gpuNode, Factor: 0.5},
		simfleet.NetworkSlow{Node: netNode, Factor: 0.55},
		simfleet.PathSlow{LeafA: "leaf-01", LeafB: "leaf-03", Factor: 0.6},
	}
	truth := []string{
		gpuNode + ": GPU side at 50 %",
		netNode + ": network side at 55 %",
		"leaf-01 <-> leaf-03: path at 60 %",
	}
	for _, ft := range faults {
		if err := f.Inject(ft); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(w, "%d simulated 8x H100 nodes on %d leaf switches, ±3 %% noise. Injected:\n", len(names), len(f.Leaves()))
	for _, t := range truth {
		fmt.Fprintf(w, "  - %s\n", t)
	}
	ref, err := baselines.Reference()
	if err != nil {
		return nil, err
	}
	eng, err := sweep.New(ctx, kit.Deps{Fleet: f, Clock: f.Clock()}, sweep.Options{
		Store: sweep.NewMemStore(), Baselines: sweep.FinderSource{Finder: baselines.Static(ref)},
		NewID: func(time.Time) string { return "sweep-demo" },
	})
	if err != nil {
		return nil, err
	}
	rep, err := eng.Sweep(ctx, sweep.Spec{Note: "fleetcheck demo"})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "Sweep %s: %s in %d rounds (%d repeat waves), %d all_reduce runs (%d single, %d 2-node), %s simulated; %d of %d nodes passed.\n",
		rep.ID, rep.State, rep.RoundCount, rep.RepeatWaves, rep.AllReduceRuns, rep.SingleRuns, rep.PairRuns,
		simDur(time.Duration(rep.DurationS*float64(time.Second))), len(rep.Passed), rep.Tested)
	writeSweepTable(w, rep)
	return &SweepResult{Nodes: len(names), Leaves: f.Leaves(), Truth: truth, Report: rep}, nil
}

func writeSweepTable(w io.Writer, rep *sweep.Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VERDICT\tSUBJECT\tDEVIATION\tRUNS\tREASON")
	for _, v := range rep.Verdicts {
		fmt.Fprintf(tw, "%s\t%s\t%.1f %%\t%d\t%s\n", v.Verdict, v.Subject, 100*v.Deviation, len(v.Evidence), v.Reason)
	}
	_ = tw.Flush() // text for a person, like the Fprintf above
}
