package sweep

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3" // the "sqlite3" driver for tests

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

func wantVerdicts(t *testing.T, rep *Report, want map[string]Kind) {
	t.Helper()
	got := verdictMap(rep)
	if len(got) != len(want) {
		t.Fatalf("verdicts %v, want %v\n%s", got, want, describe(rep))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("verdicts %v, want %v\n%s", got, want, describe(rep))
		}
	}
}

// On both databases' SQLStore, and MemStore.
func TestSweepFindsGPUNetworkAndLink(t *testing.T) {
	t.Parallel()
	t.Run("memory", func(t *testing.T) { findsGPUNetworkAndLink(t, nil) })
	dbtest.Each(t, func(t *testing.T, open func(testing.TB) *sqldb.DB) {
		findsGPUNetworkAndLink(t, sqliteStore(t, open(t)))
	})
}

func findsGPUNetworkAndLink(t *testing.T, store Store) {
	h := newHarness(t, simfleet.Config{Nodes: 128, Seed: 1}, store,
		simfleet.GPUSlow{Node: "gpu-0005", Factor: 0.5},
		simfleet.NetworkSlow{Node: "gpu-0040", Factor: 0.55},
		simfleet.PathSlow{LeafA: "leaf-01", LeafB: "leaf-03", Factor: 0.6},
	)
	rep := h.sweep(t, Spec{})
	wantVerdicts(t, rep, map[string]Kind{"gpu-0005": GPUSide, "gpu-0040": NetworkSide, "leaf-01|leaf-03": Link})
	if rep.RoundCount != 3 || len(rep.Passed) != 126 || rep.Tested != 128 {
		t.Fatalf("rounds %d, passed %d, tested %d", rep.RoundCount, len(rep.Passed), rep.Tested)
	}
	for _, v := range rep.Verdicts {
		if len(v.Evidence) < 2 || v.Deviation <= v.Threshold || v.Reason == "" {
			t.Errorf("%s: thin verdict %+v", v.Subject, v)
		}
	}
	// Round 1 (60 s), its repeat for the slow node (60 s), pairs (90 s),
	// localisation (90 s), on the virtual clock.
	if rep.DurationS != 300 {
		t.Errorf("simulated duration %vs, want 300", rep.DurationS)
	}
	if rep.AllReduceRuns != len(h.calls.list()) {
		t.Errorf("report counts %d runs, the fleet saw %d", rep.AllReduceRuns, len(h.calls.list()))
	}
	link := verdictOf(rep, "leaf-01|leaf-03")
	var probe bool
	for _, e := range link.Evidence {
		probe = probe || e.Purpose == PurposeProbe
	}
	if !probe {
		t.Errorf("link verdict without a probe: %+v", link.Evidence)
	}
}

// pairsOf returns the round-2 pairs a sweep made.
func pairsOf(t *testing.T, s Store, id string) [][]string {
	t.Helper()
	tests, err := s.Tests(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, x := range tests {
		if x.Purpose == PurposePair && x.Wave == 0 {
			out = append(out, x.Nodes)
		}
	}
	return out
}

func TestSweepTwoBadNodesInOnePair(t *testing.T) {
	t.Parallel()
	cfg := simfleet.Config{Nodes: 64, Seed: 2}
	// Network faults leave round 1 as it was, so the same sweep id pairs
	// the same nodes: learn a pair from a healthy run, break both.
	healthy := newHarness(t, cfg, nil)
	healthy.sweep(t, Spec{})
	p := pairsOf(t, healthy.store, "sweep-1")[0]
	h := newHarness(t, cfg, nil,
		simfleet.NetworkSlow{Node: p[0], Factor: 0.6},
		simfleet.NetworkSlow{Node: p[1], Factor: 0.5},
	)
	rep := h.sweep(t, Spec{})
	if got := pairsOf(t, h.store, "sweep-1")[0]; !slices.Equal(got, p) {
		t.Fatalf("pairing changed: %v, then %v", p, got)
	}
	wantVerdicts(t, rep, map[string]Kind{p[0]: NetworkSide, p[1]: NetworkSide})
}

func TestSweepTwoGPUSideAndPairedNetworkNodes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simfleet.Config{Nodes: 32, NodesPerLeaf: 8, Seed: 3}, nil,
		simfleet.GPUSlow{Node: "gpu-0001", Factor: 0.6},
		simfleet.GPUSlow{Node: "gpu-0002", Factor: 0.4},
		simfleet.NetworkSlow{Node: "gpu-0020", Factor: 0.6},
	)
	rep := h.sweep(t, Spec{})
	wantVerdicts(t, rep, map[string]Kind{"gpu-0001": GPUSide, "gpu-0002": GPUSide, "gpu-0020": NetworkSide})
	// GPU-side nodes are not paired: they would slow every pair.
	for _, r := range h.calls.list() {
		if strings.HasPrefix(r, "pair:") && (strings.Contains(r, "gpu-0001") || strings.Contains(r, "gpu-0002")) {
			t.Fatalf("gpu-side node paired: %s", r)
		}
	}
}

func TestSweepNodeDiesMidSweep(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simfleet.Config{Nodes: 32, NodesPerLeaf: 8, Seed: 4}, nil,
		simfleet.Dies{Node: "gpu-0010", AfterRuns: 1}, // in its pair, round 2
		simfleet.Dies{Node: "gpu-0020", AfterRuns: 0}, // in round 1
	)
	rep := h.sweep(t, Spec{})
	wantVerdicts(t, rep, map[string]Kind{"gpu-0010": Unreachable, "gpu-0020": Unreachable})
	if len(rep.Passed) != 30 {
		t.Fatalf("passed %d, want 30\n%s", len(rep.Passed), describe(rep))
	}
	// gpu-0010's partner was tested again, with a reference.
	var partner string
	for _, p := range pairsOf(t, h.store, rep.ID) {
		if slices.Contains(p, "gpu-0010") {
			partner = p[0]
			if partner == "gpu-0010" {
				partner = p[1]
			}
		}
	}
	tests, _ := h.store.Tests(context.Background(), rep.ID)
	retested := false
	for _, x := range tests {
		if x.Purpose == PurposeLeftover && x.Nodes[0] == partner && x.Outcome == OutFine {
			retested = true
		}
	}
	if !retested {
		t.Fatalf("partner %s of the dead node not re-tested\n%s", partner, describe(rep))
	}
}

func TestSweepBusyNodesSkipped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simfleet.Config{Nodes: 16, NodesPerLeaf: 4, Seed: 5}, nil, simfleet.Busy{Node: "gpu-0003"})
	// gpu-0007 becomes busy once round 1 is over: its pair is refused.
	var once sync.Once
	singles := 0
	var mu sync.Mutex
	h.calls.after = func(run string) {
		if !strings.HasPrefix(run, "single:") {
			return
		}
		mu.Lock()
		singles++
		n := singles
		mu.Unlock()
		if n == 15 {
			once.Do(func() {
				if err := h.fleet.Inject(simfleet.Busy{Node: "gpu-0007"}); err != nil {
					t.Error(err)
				}
			})
		}
	}
	rep := h.sweep(t, Spec{})
	wantVerdicts(t, rep, map[string]Kind{})
	var skipped []string
	for _, s := range rep.Skipped {
		skipped = append(skipped, s.Node)
	}
	if !slices.Equal(skipped, []string{"gpu-0003", "gpu-0007"}) {
		t.Fatalf("skipped %v\n%s", rep.Skipped, describe(rep))
	}
	for _, r := range h.calls.list() {
		if strings.Contains(r, "gpu-0003") {
			t.Fatalf("busy node run: %s", r)
		}
	}
	if len(rep.Passed) != 14 {
		t.Fatalf("passed %d\n%s", len(rep.Passed), describe(rep))
	}
}

func TestSweepNearThresholdRepeats(t *testing.T) {
	t.Parallel()
	// The 2-node model at the reference's 469.21 GB/s, so a GPU-side
	// factor gives the same deviation in pairs as alone.
	h := newHarness(t, simfleet.Config{Nodes: 16, NodesPerLeaf: 4, NoisePct: -1, InterGBps: 469.21, Seed: 6}, nil,
		simfleet.GPUSlow{Node: "gpu-0002", Factor: 0.69},  // 31 % below 480: near, then called
		simfleet.GPUSlow{Node: "gpu-0003", Factor: 0.715}, // 28.5 % below: near, then passed
	)
	rep := h.sweep(t, Spec{})
	wantVerdicts(t, rep, map[string]Kind{"gpu-0002": GPUSide})
	count := map[string]int{}
	for _, r := range h.calls.list() {
		count[r]++
	}
	if count["single:gpu-0002"] != 3 || count["single:gpu-0003"] != 3 || count["single:gpu-0004"] != 1 {
		t.Fatalf("single runs %v", count)
	}
	if !slices.Contains(rep.Passed, "gpu-0003") {
		t.Fatal("gpu-0003 not passed")
	}
	if rep.Rounds[0].Waves != 3 {
		t.Fatalf("round 1 ran %d waves, want 3", rep.Rounds[0].Waves)
	}
}

func TestSweepTransient(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simfleet.Config{Nodes: 64, Seed: 7}, nil,
		simfleet.Transient{Node: "gpu-0003", Factor: 0.5, GPUSide: true},
		simfleet.Transient{Node: "gpu-0050", Factor: 0.5},
	)
	rep := h.sweep(t, Spec{})
	var pair string
	for _, p := range pairsOf(t, h.store, rep.ID) {
		if slices.Contains(p, "gpu-0050") {
			pair = linkKey(p[0], p[1])
		}
	}
	wantVerdicts(t, rep, map[string]Kind{"gpu-0003": Transient, pair: Transient})
	if v := verdictOf(rep, pair); v.SubjectKind != SubjectPair {
		t.Fatalf("%+v", v)
	}
}

func TestSweepNoBaselineIsInconclusive(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simfleet.Config{Nodes: 8, Seed: 8}, nil)
	h.engine.cfg.Baselines = FinderSource{Finder: baselines.Static{}}
	rep := h.sweep(t, Spec{})
	if len(rep.Passed) != 0 || rep.Counts[Inconclusive] != 8 {
		t.Fatalf("passed %v counts %v", rep.Passed, rep.Counts)
	}
}

func TestSweepDrain(t *testing.T) {
	t.Parallel()
	faults := []simfleet.Fault{
		simfleet.GPUSlow{Node: "gpu-0002", Factor: 0.5},
		simfleet.NetworkSlow{Node: "gpu-0009", Factor: 0.5},
	}
	h := newHarness(t, simfleet.Config{Nodes: 16, NodesPerLeaf: 4, Seed: 9}, nil, faults...)
	var mu sync.Mutex
	var drained []string
	h.engine.cfg.Drainer = DrainFunc(func(_ context.Context, node, reason string) error {
		mu.Lock()
		defer mu.Unlock()
		drained = append(drained, node)
		if !strings.Contains(reason, "sweep-1") {
			t.Errorf("reason %q", reason)
		}
		return nil
	})
	rep := h.sweep(t, Spec{Drain: true})
	slices.Sort(drained)
	if !slices.Equal(drained, []string{"gpu-0002", "gpu-0009"}) {
		t.Fatalf("drained %v\n%s", drained, describe(rep))
	}
	for _, v := range rep.Verdicts {
		if v.Drain == nil || *v.Drain != DrainDone {
			t.Fatalf("%s drain %v", v.Subject, v.Drain)
		}
	}
	recs, err := h.engine.BreakerRecords(context.Background(), time.Time{})
	if err != nil || len(recs) != 2 || recs[0].Campaign != "sweep-1" {
		t.Fatalf("breaker records %+v %v", recs, err)
	}
	// Without an adapter the request is recorded as skipped.
	h2 := newHarness(t, simfleet.Config{Nodes: 16, NodesPerLeaf: 4, Seed: 9}, nil, faults...)
	rep = h2.sweep(t, Spec{Drain: true})
	if len(rep.Drains) != 2 || rep.Drains[0].State != DrainSkipped {
		t.Fatalf("drains %+v", rep.Drains)
	}
	// The circuit breaker stops the second drain.
	h3 := newHarness(t, simfleet.Config{Nodes: 16, NodesPerLeaf: 4, Seed: 9}, nil, faults...)
	br, err := kit.NewBreaker(kit.BreakerConfig{MaxCount: 1}, h3.fleet.Clock())
	if err != nil {
		t.Fatal(err)
	}
	h3.engine.cfg.Breaker = br
	h3.engine.cfg.Drainer = DrainFunc(func(context.Context, string, string) error { return nil })
	rep = h3.sweep(t, Spec{Drain: true})
	if len(rep.Drains) != 2 || rep.Drains[0].State != DrainDone || rep.Drains[1].State != DrainRefused ||
		!strings.Contains(rep.Drains[1].Error, "breaker") {
		t.Fatalf("drains %+v", rep.Drains)
	}
}

func TestSweepBudgetRotates(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simfleet.Config{Nodes: 16, NodesPerLeaf: 4, Seed: 10}, nil)
	spec := Spec{Budget: Budget{MaxShare: 0.5, CoverWithinNights: 2}}
	first := h.sweep(t, spec)
	if first.Tested != 8 || first.Coverage.Deferred != 8 || len(first.Coverage.NeverCovered) != 8 || first.Coverage.Gap {
		t.Fatalf("first night %+v", first.Coverage)
	}
	second := h.sweep(t, spec)
	both := append(slices.Clone(first.Passed), second.Passed...)
	slices.Sort(both)
	if len(slices.Compact(both)) != 16 {
		t.Fatalf("two nights covered %v", both)
	}
	if len(second.Coverage.NeverCovered) != 0 || second.Coverage.NightsToCover != 2 {
		t.Fatalf("second night %+v", second.Coverage)
	}
	// A tighter target than the budget allows is reported as a gap.
	third := h.sweep(t, Spec{Budget: Budget{MaxNodes: 2, CoverWithinNights: 7}})
	if !third.Coverage.Gap || third.Coverage.NightsToCover != 8 {
		t.Fatalf("third night %+v", third.Coverage)
	}
}

func TestSweepConcurrencyLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simfleet.Config{Nodes: 16, NodesPerLeaf: 4, Seed: 11}, nil)
	rep := h.sweep(t, Spec{Concurrency: 4})
	// 16 single runs 4 at a time (4×60 s), 8 pairs 4 at a time (2×90 s).
	if rep.DurationS != 4*60+2*90 || len(rep.Passed) != 16 {
		t.Fatalf("duration %vs, passed %d", rep.DurationS, len(rep.Passed))
	}
}

// Render sends single-node runs through sim.Node and the real parser.
func TestSweepRenderedFleet(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simfleet.Config{Nodes: 8, NodesPerLeaf: 4, Render: true, Seed: 12}, nil,
		simfleet.GPUSlow{Node: "gpu-0004", Factor: 0.5})
	rep := h.sweep(t, Spec{})
	wantVerdicts(t, rep, map[string]Kind{"gpu-0004": GPUSide})
}

func openDB(t testing.TB, path string) *sqldb.DB { return dbtest.OpenSQLite(t, path) }

func sqliteStore(t *testing.T, db *sqldb.DB) *SQLStore { // on either database
	t.Helper()
	s, err := OpenSQLStore(context.Background(), db, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A coordinator restarted mid-sweep continues it; no finished test runs
// again and the verdicts are those of an uninterrupted sweep.
func TestSweepResumesAfterRestart(t *testing.T) {
	t.Parallel()
	cfg := simfleet.Config{Nodes: 64, Seed: 13}
	faults := []simfleet.Fault{
		simfleet.GPUSlow{Node: "gpu-0003", Factor: 0.5},
		simfleet.NetworkSlow{Node: "gpu-0040", Factor: 0.5},
		simfleet.PathSlow{LeafA: "leaf-01", LeafB: "leaf-02", Factor: 0.5},
	}
	spec := Spec{Concurrency: 6}
	want := newHarness(t, cfg, nil, faults...).sweep(t, spec)

	path := filepath.Join(t.TempDir(), "coordinator.db")
	h := newHarness(t, cfg, sqliteStore(t, openDB(t, path)), faults...)
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	pairs := 0
	h.calls.after = func(run string) {
		mu.Lock()
		defer mu.Unlock()
		if strings.HasPrefix(run, "pair:") {
			if pairs++; pairs == 11 {
				cancel() // the coordinator dies in the middle of round 2
			}
		}
	}
	if _, err := h.engine.Sweep(ctx, spec); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted sweep: %v", err)
	}
	before := len(h.calls.list())

	// A fresh engine, a fresh handle on the same database file.
	h.calls.after = nil
	h.store = sqliteStore(t, openDB(t, path))
	tests, err := h.store.Tests(context.Background(), "sweep-1")
	if err != nil {
		t.Fatal(err)
	}
	finished := map[string]bool{}
	unfinished := 0
	for _, x := range tests {
		if x.Purpose != PurposePair {
			continue
		}
		if x.State == TestDone {
			finished["pair:"+linkKey(x.Nodes[0], x.Nodes[1])] = true
		} else {
			unfinished++
		}
	}
	if len(finished) < 6 || unfinished == 0 {
		t.Fatalf("interrupted at %d finished, %d unfinished pairs: not mid-round", len(finished), unfinished)
	}
	st, err := h.newEngine(t).Status(context.Background(), "sweep-1")
	if err != nil || st.Phase != PhaseInter || st.State != StateRunning {
		t.Fatalf("status %+v %v", st, err)
	}
	reps, err := h.newEngine(t).Resume(context.Background())
	if err != nil || len(reps) != 1 {
		t.Fatalf("resume: %d reports, %v", len(reps), err)
	}
	rep := reps[0]
	// A finished sweep's status shows the last round it ran, not 0.
	if st, err := h.newEngine(t).Status(context.Background(), "sweep-1"); err != nil || st.State != StateDone ||
		len(rep.Rounds) == 0 || st.Round != rep.Rounds[len(rep.Rounds)-1].Round {
		t.Errorf("finished sweep's status: round %d (%+v, %v), want the last round run of %+v", st.Round, st, err, rep.Rounds)
	}
	for _, r := range h.calls.list()[before:] {
		if finished[r] {
			t.Errorf("finished pair %s ran again", r)
		}
		if strings.HasPrefix(r, "single:") {
			t.Errorf("round 1 ran again: %s", r)
		}
	}
	wantVerdicts(t, rep, verdictMap(want))
	// The stored report is the returned one.
	stored, err := h.newEngine(t).Report(context.Background(), "sweep-1")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(rep)
	b, _ := json.Marshal(stored)
	if string(a) != string(b) {
		t.Fatalf("stored report differs:\n%s\n%s", a, b)
	}
	list, err := h.newEngine(t).List(context.Background())
	if err != nil || len(list) != 1 || list[0].State != StateDone || list[0].Counts[Link] != 1 {
		t.Fatalf("list %+v %v", list, err)
	}
}

func TestMain(m *testing.M) { pgtest.Main(m) }

// On both databases: every campaign engine uses the same store.
func TestSQLStore(t *testing.T) {
	t.Parallel()
	dbtest.Each(t, func(t *testing.T, open func(testing.TB) *sqldb.DB) { sqlStore(t, open(t)) })
}

func sqlStore(t *testing.T, db *sqldb.DB) {
	ctx := context.Background()
	s := sqliteStore(t, db)
	if _, err := OpenSQLStore(ctx, db, time.Now()); err != nil { // idempotent
		t.Fatal(err)
	}
	rec := Record{ID: "a", State: StateRunning, Spec: Spec{Selector: "sku=h100"}, Nodes: []NodeInfo{{Name: "n1"}}}
	if err := s.CreateSweep(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSweep(ctx, rec); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := s.Sweep(ctx, "b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	tr := TestRecord{Seq: 1, Phase: PhaseIntra, Series: "single:n1", Nodes: []string{"n1"}, State: TestPlanned}
	if err := s.SavePlan(ctx, "a", PhaseIntra, 0, []TestRecord{tr}); err != nil {
		t.Fatal(err)
	}
	tr.State, tr.Outcome, tr.GBps = TestDone, OutFine, 478.5
	if err := s.SaveTest(ctx, "a", tr); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveTest(ctx, "a", TestRecord{Seq: 9}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown test: %v", err)
	}
	got, err := s.Tests(ctx, "a")
	if err != nil || len(got) != 1 || got[0].GBps != 478.5 || got[0].State != TestDone {
		t.Fatalf("tests %+v %v", got, err)
	}
	r, err := s.Sweep(ctx, "a")
	if err != nil || r.Phase != PhaseIntra || r.Spec.Selector != "sku=h100" {
		t.Fatalf("sweep %+v %v", r, err)
	}
	if err := s.SaveDrain(ctx, "a", DrainRecord{Node: "n1", State: DrainPlanned}); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveDrain(ctx, "a", DrainRecord{Node: "n1", State: DrainDone}); err != nil {
		t.Fatal(err)
	}
	if d, err := s.Drains(ctx, "a"); err != nil || len(d) != 1 || d[0].State != DrainDone {
		t.Fatalf("drains %+v %v", d, err)
	}
	end := r.Created.Add(3600e9)
	if err := s.Finish(ctx, "a", StateDone, "", &Report{ID: "a", Counts: map[Kind]int{Link: 1}}, []string{"n1"}, end); err != nil {
		t.Fatal(err)
	}
	r, err = s.Sweep(ctx, "a")
	if err != nil || r.State != StateDone || r.Phase != PhaseDone || r.Report == nil || r.Report.Counts[Link] != 1 || !r.Ended.Equal(end) {
		t.Fatalf("finished %+v %v", r, err)
	}
	cov, err := s.Coverage(ctx)
	if err != nil || !cov["n1"].Equal(end) {
		t.Fatalf("coverage %v %v", cov, err)
	}
	// An older sweep finishing later does not move coverage back.
	if err := s.CreateSweep(ctx, Record{ID: "b", State: StateRunning}); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "b", StateDone, "", nil, []string{"n1"}, end.Add(-1e9)); err != nil {
		t.Fatal(err)
	}
	if cov, _ := s.Coverage(ctx); !cov["n1"].Equal(end) {
		t.Fatalf("coverage went back: %v", cov)
	}
	if list, err := s.Sweeps(ctx); err != nil || len(list) != 2 || list[0].Report != nil {
		t.Fatalf("sweeps %+v %v", list, err)
	}
}

// Two leaves and a bad path between them: every pair is slow and no node
// passes round 2. Suspects of one leaf test each other, then serve as
// references and probe the path.
func TestSweepEveryPairSlow(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simfleet.Config{Nodes: 64, Seed: 13}, nil,
		simfleet.GPUSlow{Node: "gpu-0003", Factor: 0.5},
		simfleet.NetworkSlow{Node: "gpu-0040", Factor: 0.5},
		simfleet.PathSlow{LeafA: "leaf-01", LeafB: "leaf-02", Factor: 0.5},
	)
	rep := h.sweep(t, Spec{})
	wantVerdicts(t, rep, map[string]Kind{"gpu-0003": GPUSide, "gpu-0040": NetworkSide, "leaf-01|leaf-02": Link})
	if rep.RoundCount != 3 || rep.Rounds[2].Waves > 2 {
		t.Fatalf("rounds %+v", rep.Rounds)
	}
}

func TestSweepIgnoreLeaves(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simfleet.Config{Nodes: 64, NodesPerLeaf: 16, Seed: 14}, nil,
		simfleet.GPUSlow{Node: "gpu-0011", Factor: 0.6},
		simfleet.NetworkSlow{Node: "gpu-0033", Factor: 0.6},
	)
	rep := h.sweep(t, Spec{IgnoreLeaves: true})
	wantVerdicts(t, rep, map[string]Kind{"gpu-0011": GPUSide, "gpu-0033": NetworkSide})
	same := 0
	for _, p := range pairsOf(t, h.store, rep.ID) {
		if h.fleet.Leaf(p[0]) == h.fleet.Leaf(p[1]) {
			same++
		}
	}
	if same == 0 {
		t.Fatal("leaf-blind pairing made no same-leaf pair in 31 random pairs over 4 leaves")
	}
}

// A node another campaign holds (kit.Busy) is left out of the sweep with
// the holder named, and a running sweep holds its nodes for the others.
func TestSweepSkipsNodesOtherCampaignsHold(t *testing.T) {
	t.Parallel()
	h := newHarness(t, simfleet.Config{Nodes: 8, Seed: 2}, nil)
	busy := &kit.Busy{}
	busy.Register("burnin", func(context.Context) (map[string]string, error) {
		return map[string]string{"gpu-0003": "burnin b-1"}, nil
	})
	ctx := context.Background()
	e, err := New(ctx, kit.Deps{Fleet: h.calls, Clock: h.fleet.Clock(), Busy: busy}, Options{Store: h.store, Baselines: referenceSource(t)})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := e.Start(ctx, Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rec.Skipped, Skip{Node: "gpu-0003", Reason: "held by burnin b-1"}) {
		t.Errorf("skipped %+v, want gpu-0003 held by burnin b-1", rec.Skipped)
	}
	for _, n := range rec.Nodes {
		if n.Name == "gpu-0003" {
			t.Error("the held node was selected")
		}
	}
	if who, ok := busy.Holding(ctx, rec.Nodes[0].Name); !ok || who != "sweep "+rec.ID {
		t.Errorf("%s held by %q (%v), want the running sweep", rec.Nodes[0].Name, who, ok)
	}
}
