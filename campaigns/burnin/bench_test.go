package burnin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// simBurnin wraps the simulated fleet with what burn-in needs beyond its
// all_reduce model: passive checks and dcgm.diag that pass (on the node's
// inventory) after a simulated duration, and the pcie-bandwidth action.
type simBurnin struct {
	*simfleet.Fleet
	clock *simfleet.Clock
}

func (s *simBurnin) RunChecks(ctx context.Context, node string, checks []string, opts kit.RunOptions) (*report.Report, error) {
	if slices.Contains(checks, "nccl.allreduce") {
		return s.Fleet.RunChecks(ctx, node, checks, opts)
	}
	wait := 20 * time.Second
	if slices.Contains(checks, "dcgm.diag") {
		wait = 2 * time.Minute
	}
	if err := s.clock.Sleep(ctx, wait); err != nil {
		return nil, err
	}
	rep := &report.Report{Node: node}
	// The node's inventory, as its agent reports it: a report that shows no
	// GPU measured nothing and is inconclusive.
	if n, ok, err := kit.LookupNode(ctx, s.Fleet, node); err == nil && ok {
		rep.Inventory = n.Inventory
	}
	for _, c := range checks {
		rep.Checks = append(rep.Checks, report.CheckResult{Name: c, Status: report.Pass, Findings: []report.Finding{},
			Metrics: map[string]float64{"gpu0." + c + "_c": 1}})
	}
	rep.Summarize()
	return rep, nil
}

func (s *simBurnin) RunAction(ctx context.Context, node, action string, _ map[string]string, _ kit.RunOptions) (kit.ActionResult, error) {
	if action != ActionPCIeBandwidth {
		return kit.ActionResult{}, fmt.Errorf("%s: %w", action, kit.ErrRefused)
	}
	if err := s.clock.Sleep(ctx, time.Minute); err != nil {
		return kit.ActionResult{}, err
	}
	return kit.ActionResult{OK: true, Output: "metric pcie.h2d_bandwidth_gbps 55.2\nmetric pcie.d2h_bandwidth_gbps 54.9\n"}, nil
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkBurnin256Standard runs a burn-in of 256 simulated nodes at the
// standard level (4 of them slow) through Run, on the simulator's virtual
// clock, and reports the CPU time per node of the whole process: the
// engine, SQLite and the (cheap) simulator together, an upper bound on the
// coordinator's overhead.
func BenchmarkBurnin256Standard(b *testing.B) {
	const nodes = 256
	for b.Loop() {
		sf, err := simfleet.New(simfleet.Config{Nodes: nodes, Seed: 7})
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []string{"gpu-0010", "gpu-0077", "gpu-0150", "gpu-0201"} {
			if err := sf.Inject(simfleet.GPUSlow{Node: n, Factor: 0.8}); err != nil {
				b.Fatal(err)
			}
		}
		fleet := &simBurnin{Fleet: sf, clock: sf.Clock()}
		db := dbtest.SQLite(b)
		store, err := baselines.NewStore(db.SQL())
		if err != nil {
			b.Fatal(err)
		}
		st, _ := baselines.NewStats([]float64{480})
		if _, err := store.Set(context.Background(), baselines.Baseline{Key: baselines.Key{Metric: MetricBusBW,
			Scope: baselines.SKUScope("h100-sxm-80g-x8-nvlink"), Stack: baselines.Stack{Driver: "535.161.08"}},
			Direction: baselines.HigherBetter, Samples: st}); err != nil {
			b.Fatal(err)
		}
		eng, err := New(context.Background(), kit.Deps{DB: db, Fleet: fleet, Clock: fleet.clock, Logger: zerolog.New(io.Discard)}, Options{Baselines: store})
		if err != nil {
			b.Fatal(err)
		}
		spec, err := ParseSpec([]byte("selector: sku=h100\nlevel: standard\nconcurrency: 256\n"))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		simStart := fleet.clock.Now()
		cpu0, wall0 := cpuTime(), time.Now()
		id, err := eng.Start(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- eng.Run(ctx) }()
		for {
			finished, err := eng.Done(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			if finished {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			b.Fatal(err)
		}
		wall, cpu := time.Since(wall0), cpuTime()-cpu0
		r, err := eng.Report(context.Background(), id)
		if err != nil {
			b.Fatal(err)
		}
		if r.Campaign.Rejected != 4 || r.Campaign.Accepted != nodes-4 {
			b.Fatalf("verdicts: %d accepted, %d rejected", r.Campaign.Accepted, r.Campaign.Rejected)
		}
		b.ReportMetric(float64(cpu.Microseconds())/1000/nodes, "cpu-ms/node")
		b.ReportMetric(float64(wall.Milliseconds()), "wall-ms")
		b.ReportMetric(float64(r.Campaign.RunsTotal)/nodes, "runs/node")
		b.ReportMetric(r.Campaign.FinishedAt.Sub(simStart).Minutes(), "sim-minutes")
		db.Close()
	}
}
