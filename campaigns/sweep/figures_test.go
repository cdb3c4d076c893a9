//go:build unix

package sweep

// The 1,024-node figures: this engine against the naive scheme on the same
// fleet and seed. Kept out of `make test`; run them with
//
//	FLEETCHECK_SWEEP_FIGURES=1 go test -run TestSweepFigures -v ./campaigns/sweep/
//	go test -run '^$' -bench BenchmarkSweep1024 -benchtime 1x ./campaigns/sweep/
//
// (FLEETCHECK_SWEEP_SEEDS=N runs N seeds in the first.)
//
// CPU: Go has no per-goroutine CPU clock, so the simulator's share is
// measured apart. The process's CPU time (getrusage) around the sweep is
// the total; every call the scheme made to the fleet is recorded and then
// replayed, one after another, on a fresh identical fleet, and that
// replay's CPU time is the simulator's cost. Coordinator CPU is the total
// minus the replay: the engine, its SQLite writes, goroutines, the
// virtual clock's bookkeeping under concurrency and the Go runtime. The
// total alone is an upper bound.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// figureFleet is the benchmark fleet: 1,024 nodes, 32 leaves of 32, 1 %
// bad nodes (35-60 % slower, GPU-side and network-side), one bad
// leaf-to-leaf path, ±3 % noise.
func figureFleet(tb testing.TB, seed uint64) (*simfleet.Fleet, simfleet.Truth) {
	tb.Helper()
	f, err := simfleet.New(simfleet.Config{Nodes: 1024, NodesPerLeaf: 32, NoisePct: 3, Seed: seed})
	if err != nil {
		tb.Fatal(err)
	}
	truth, err := f.InjectScenario(simfleet.Scenario{BadNodeShare: 0.01, SlowerMin: 0.35, SlowerMax: 0.60, BadPaths: 1, Seed: seed})
	if err != nil {
		tb.Fatal(err)
	}
	return f, truth
}

// recorder notes every fleet call so the simulator's cost can be replayed.
type recorder struct {
	kit.Fleet
	mu    sync.Mutex
	calls [][]string // nil for Nodes(""), one node for RunChecks, more for RunMulti
}

func (r *recorder) note(c []string) {
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
}

func (r *recorder) Nodes(ctx context.Context, sel string) ([]kit.Node, error) {
	r.note([]string{"?" + sel})
	return r.Fleet.Nodes(ctx, sel)
}

func (r *recorder) RunChecks(ctx context.Context, node string, checks []string, opts kit.RunOptions) (*report.Report, error) {
	r.note([]string{node})
	return r.Fleet.RunChecks(ctx, node, checks, opts)
}

func (r *recorder) RunMulti(ctx context.Context, nodes []string, check string, opts kit.RunOptions) (*report.Report, error) {
	r.note(slices.Clone(nodes))
	return r.Fleet.RunMulti(ctx, nodes, check, opts)
}

// replayCPU is the CPU time a fresh copy of the fleet takes to answer the
// recorded calls one after another.
func replayCPU(tb testing.TB, seed uint64, calls [][]string) time.Duration {
	tb.Helper()
	f, _ := figureFleet(tb, seed)
	ctx := context.Background()
	t0 := cpuTime()
	for _, c := range calls {
		switch {
		case strings.HasPrefix(c[0], "?"):
			_, _ = f.Nodes(ctx, c[0][1:])
		case len(c) == 1:
			_, _ = f.RunChecks(ctx, c[0], []string{checkAllReduce}, kit.RunOptions{})
		default:
			_, _ = f.RunMulti(ctx, c, checkAllReduce, kit.RunOptions{})
		}
	}
	return cpuTime() - t0
}

type figures struct {
	scheme                 string
	faults, found          int
	positives, truePos     int
	kindRight, kindTotal   int
	recall, precision      float64
	rounds, repeatWaves    int
	runs                   int
	simulated              time.Duration
	cpuTotal, cpuSim, wall time.Duration
	missed, falsePos       []string
	other                  map[Kind]int
}

func (f figures) coordCPU() time.Duration { return max(f.cpuTotal-f.cpuSim, 0) }

func (f figures) cpuShare() float64 {
	if f.simulated <= 0 {
		return 0
	}
	return float64(f.coordCPU()) / float64(f.simulated)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// score compares called subjects with the truth: nodes by name, paths
// as "leaf|leaf".
func score(fig *figures, truth simfleet.Truth, called map[string]Kind) {
	want := map[string]Kind{}
	for _, n := range truth.GPUSide {
		want[n] = GPUSide
	}
	for _, n := range truth.NetworkSide {
		want[n] = NetworkSide
	}
	for _, p := range truth.Paths {
		want[linkKey(p[0], p[1])] = Link
	}
	fig.faults = len(want)
	for s, k := range called {
		fig.positives++
		w, ok := want[s]
		if !ok {
			fig.falsePos = append(fig.falsePos, s+"="+string(k))
			continue
		}
		fig.truePos++
		if k != "" {
			fig.kindTotal++
			if k == w {
				fig.kindRight++
			}
		}
	}
	for s := range want {
		if _, ok := called[s]; ok {
			fig.found++
		} else {
			fig.missed = append(fig.missed, s)
		}
	}
	slices.Sort(fig.missed)
	slices.Sort(fig.falsePos)
	fig.recall = float64(fig.found) / float64(max(fig.faults, 1))
	fig.precision = 1
	if fig.positives > 0 {
		fig.precision = float64(fig.truePos) / float64(fig.positives)
	}
}

// runEngine sweeps the figure fleet with this engine on a SQLite store.
func runEngine(tb testing.TB, seed uint64, dir string) figures {
	tb.Helper()
	f, truth := figureFleet(tb, seed)
	db := openDB(tb, filepath.Join(dir, fmt.Sprintf("sweep-%d.db", seed)))
	store, err := OpenSQLStore(context.Background(), db, f.Clock().Now())
	if err != nil {
		tb.Fatal(err)
	}
	rec := &recorder{Fleet: f}
	e, err := New(context.Background(), kit.Deps{Fleet: rec, Clock: f.Clock()},
		Options{Store: store, Baselines: referenceSource(tb), NewID: func(time.Time) string { return "sweep-figures" }})
	if err != nil {
		tb.Fatal(err)
	}
	start := f.Clock().Now()
	cpu0, wall0 := cpuTime(), time.Now()
	rep, err := e.Sweep(context.Background(), Spec{Seed: seed})
	if err != nil {
		tb.Fatal(err)
	}
	fig := figures{scheme: "fleetcheck sweep", other: map[Kind]int{}}
	fig.wall, fig.cpuTotal = time.Since(wall0), cpuTime()-cpu0
	fig.simulated = f.Clock().Now().Sub(start)
	fig.cpuSim = replayCPU(tb, seed, rec.calls)
	fig.rounds, fig.repeatWaves, fig.runs = rep.RoundCount, rep.RepeatWaves, rep.AllReduceRuns
	called := map[string]Kind{}
	for _, v := range rep.Verdicts {
		switch v.Verdict {
		case GPUSide, NetworkSide, Link:
			called[v.Subject] = v.Verdict
		default:
			fig.other[v.Verdict]++
		}
	}
	score(&fig, truth, called)
	return fig
}

// runNaive is the simplest scheme, as cluster-health-scanner runs it:
// random disjoint pairs run 2-node all_reduce; both nodes of a slow pair
// are suspects; each suspect then runs once with one node from a pair that
// passed, picked at random; slow again is the culprit. No single-node
// round, no leaves, no repeats, one kind of verdict.
func runNaive(tb testing.TB, seed uint64) figures {
	tb.Helper()
	sim, truth := figureFleet(tb, seed)
	f := &recorder{Fleet: sim}
	ctx := context.Background()
	src := referenceSource(tb)
	spec := Spec{}.WithDefaults()
	start := sim.Clock().Now()
	cpu0, wall0 := cpuTime(), time.Now()

	nodes, err := f.Nodes(ctx, "")
	if err != nil {
		tb.Fatal(err)
	}
	info := map[string]NodeInfo{}
	var names []string
	for _, n := range nodes {
		info[n.Name] = nodeInfo(n)
		names = append(names, n.Name)
	}
	rng := rand.New(rand.NewPCG(seed, 0xbad))
	rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	var pairs [][2]string
	for i := 0; i+1 < len(names); i += 2 {
		pairs = append(pairs, [2]string{names[i], names[i+1]})
	}
	runs := 0
	measure := func(ps [][2]string) []bool {
		runs += len(ps)
		out := make([]bool, len(ps))
		runConcurrently(sim.Clock(), len(ps), func(i int) {
			p := ps[i]
			rep, err := f.RunMulti(ctx, p[:], checkAllReduce, kit.RunOptions{})
			if err != nil {
				out[i] = true // a failed run marks both as suspects
				return
			}
			v, why := busBW(rep)
			if why != "" {
				out[i] = true
				return
			}
			res, err := src.Pair(ctx, info[p[0]], info[p[1]])
			if err != nil {
				out[i] = true
				return
			}
			j := judge(res, v, info[p[0]].Stack, spec)
			out[i] = j.ref != nil && j.deviation > spec.Threshold
		})
		return out
	}
	first := measure(pairs)
	var suspects, good []string
	for i, p := range pairs {
		if first[i] {
			suspects = append(suspects, p[0], p[1])
		} else {
			good = append(good, p[0], p[1])
		}
	}
	if len(names)%2 == 1 {
		suspects = append(suspects, names[len(names)-1])
	}
	rng.Shuffle(len(good), func(i, j int) { good[i], good[j] = good[j], good[i] })
	var second [][2]string
	for i, s := range suspects {
		second = append(second, [2]string{s, good[i%len(good)]})
	}
	again := measure(second)
	called := map[string]Kind{}
	for i, p := range second {
		if again[i] {
			called[p[0]] = "" // the naive scheme names a node, not a kind
		}
	}
	fig := figures{scheme: "naive (random pairs, 1 known-good)", rounds: 2, runs: runs, other: map[Kind]int{}}
	fig.wall, fig.cpuTotal = time.Since(wall0), cpuTime()-cpu0
	fig.simulated = sim.Clock().Now().Sub(start)
	fig.cpuSim = replayCPU(tb, seed, f.calls)
	score(&fig, truth, called)
	return fig
}

// runConcurrently runs n tasks at once on the virtual clock: all start at
// the same simulated instant.
func runConcurrently(c *simfleet.Clock, n int, fn func(i int)) {
	var wg sync.WaitGroup
	c.Join()
	for i := range n {
		c.Join()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Leave()
			fn(i)
		}()
	}
	c.Leave()
	wg.Wait()
}

func table(a, b figures) string {
	var sb strings.Builder
	row := func(name, x, y string) { fmt.Fprintf(&sb, "%-34s %-30s %s\n", name, x, y) }
	pct := func(v float64) string { return fmt.Sprintf("%.1f %%", v*100) }
	list := func(s []string) string {
		if len(s) == 0 {
			return "none"
		}
		return strings.Join(s, ", ")
	}
	row("", a.scheme, b.scheme)
	row("faults (nodes + paths)", strconv.Itoa(a.faults), strconv.Itoa(b.faults))
	row("recall", fmt.Sprintf("%s (%d/%d)", pct(a.recall), a.found, a.faults), fmt.Sprintf("%s (%d/%d)", pct(b.recall), b.found, b.faults))
	row("precision", fmt.Sprintf("%s (%d/%d)", pct(a.precision), a.truePos, a.positives), fmt.Sprintf("%s (%d/%d)", pct(b.precision), b.truePos, b.positives))
	row("side named right", fmt.Sprintf("%d/%d", a.kindRight, a.kindTotal), "not named")
	row("missed", list(a.missed), list(b.missed))
	row("false positives", list(a.falsePos), list(b.falsePos))
	other := func(m map[Kind]int) string {
		var p []string
		for _, k := range []Kind{Transient, Inconclusive, Unreachable} {
			if m[k] > 0 {
				p = append(p, fmt.Sprintf("%s %d", k, m[k]))
			}
		}
		return list(p)
	}
	row("other verdicts", other(a.other), other(b.other))
	row("rounds (+ repeat waves)", fmt.Sprintf("%d (+%d)", a.rounds, a.repeatWaves), fmt.Sprintf("%d (+0)", b.rounds))
	row("all_reduce runs", strconv.Itoa(a.runs), strconv.Itoa(b.runs))
	row("simulated duration", a.simulated.String(), b.simulated.String())
	row("coordinator CPU (total - simulator)", fmt.Sprintf("%v (%.3f %% of simulated)", a.coordCPU().Round(time.Millisecond), a.cpuShare()*100),
		fmt.Sprintf("%v (%.3f %% of simulated)", b.coordCPU().Round(time.Millisecond), b.cpuShare()*100))
	row("process CPU / simulator (replayed)", fmt.Sprintf("%v / %v", a.cpuTotal.Round(time.Millisecond), a.cpuSim.Round(time.Millisecond)),
		fmt.Sprintf("%v / %v", b.cpuTotal.Round(time.Millisecond), b.cpuSim.Round(time.Millisecond)))
	row("wall time", a.wall.Round(time.Millisecond).String(), b.wall.Round(time.Millisecond).String())
	return sb.String()
}

func TestSweepFigures(t *testing.T) {
	if os.Getenv("FLEETCHECK_SWEEP_FIGURES") == "" {
		t.Skip("set FLEETCHECK_SWEEP_FIGURES=1 to run the 1,024-node figures")
	}
	seeds := 1
	if s, err := strconv.Atoi(os.Getenv("FLEETCHECK_SWEEP_SEEDS")); err == nil && s > 0 {
		seeds = s
	}
	dir := t.TempDir()
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		ours := runEngine(t, seed, dir)
		naive := runNaive(t, seed)
		t.Logf("seed %d: 1,024 nodes, 32 leaves, 1 %% bad nodes (35-60 %% slower), 1 bad path, ±3 %% noise\n%s", seed, table(ours, naive))
		if ours.recall < 1 || ours.precision < 0.99 || ours.rounds > 3 || ours.cpuShare() >= 0.01 {
			t.Errorf("seed %d misses a target: recall %.3f (100 %%), precision %.3f (≥ 99 %%), rounds %d (≤ 3), CPU %.4f of simulated (< 1 %%)",
				seed, ours.recall, ours.precision, ours.rounds, ours.cpuShare())
		}
	}
}

func BenchmarkSweep1024(b *testing.B) {
	dir := b.TempDir()
	var ours, naive figures
	for i := range b.N {
		ours = runEngine(b, uint64(i+1), dir)
		naive = runNaive(b, uint64(i+1))
	}
	b.ReportMetric(ours.recall*100, "recall_%")
	b.ReportMetric(ours.precision*100, "precision_%")
	b.ReportMetric(float64(ours.rounds), "rounds")
	b.ReportMetric(float64(ours.runs), "allreduce_runs")
	b.ReportMetric(ours.simulated.Seconds(), "sim_s")
	b.ReportMetric(ours.cpuShare()*100, "coord_cpu_%")
	b.ReportMetric(naive.recall*100, "naive_recall_%")
	b.ReportMetric(naive.precision*100, "naive_precision_%")
	b.ReportMetric(float64(naive.runs), "naive_runs")
	b.Logf("\n%s", table(ours, naive))
}
