package sweep

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// referenceSource resolves against the shipped reference baselines
// (480 GB/s single-node, 469.21 GB/s 2-node for h100-sxm-80g-x8-nvlink-ib400x8).
func referenceSource(t testing.TB) BaselineSource {
	t.Helper()
	ref, err := baselines.Reference()
	if err != nil {
		t.Fatal(err)
	}
	return FinderSource{Finder: baselines.Static(ref)}
}

type harness struct {
	fleet  *simfleet.Fleet
	store  Store
	engine *Engine
	calls  *callLog
}

// callLog wraps a fleet and records every run it is asked for.
type callLog struct {
	kit.Fleet
	mu    sync.Mutex
	runs  []string // "single:N" or "pair:A|B"
	after func(run string)
}

func (c *callLog) record(k string) {
	c.mu.Lock()
	c.runs = append(c.runs, k)
	f := c.after
	c.mu.Unlock()
	if f != nil {
		f(k)
	}
}

func (c *callLog) RunChecks(ctx context.Context, node string, checks []string, opts kit.RunOptions) (*report.Report, error) {
	r, err := c.Fleet.RunChecks(ctx, node, checks, opts)
	c.record("single:" + node)
	return r, err
}

func (c *callLog) RunMulti(ctx context.Context, nodes []string, check string, opts kit.RunOptions) (*report.Report, error) {
	r, err := c.Fleet.RunMulti(ctx, nodes, check, opts)
	c.record("pair:" + linkKey(nodes[0], nodes[1]))
	return r, err
}

func (c *callLog) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.runs)
}

func newHarness(t testing.TB, cfg simfleet.Config, store Store, faults ...simfleet.Fault) *harness {
	t.Helper()
	f, err := simfleet.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, ft := range faults {
		if err := f.Inject(ft); err != nil {
			t.Fatal(err)
		}
	}
	if store == nil {
		store = NewMemStore()
	}
	h := &harness{fleet: f, store: store, calls: &callLog{Fleet: f}}
	h.engine = h.newEngine(t)
	return h
}

func (h *harness) newEngine(t testing.TB) *Engine {
	t.Helper()
	n := 0
	e, err := New(context.Background(), kit.Deps{Fleet: h.calls, Clock: h.fleet.Clock()}, Options{
		Store: h.store, Baselines: referenceSource(t),
		NewID: func(time.Time) string { n++; return fmt.Sprintf("sweep-%d", n) },
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (h *harness) sweep(t testing.TB, spec Spec) *Report {
	t.Helper()
	rep, err := h.engine.Sweep(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	// The report must be JSON (no NaN).
	if _, err := json.Marshal(rep); err != nil {
		t.Fatalf("report JSON: %v", err)
	}
	return rep
}

// verdictMap is subject → verdict kind.
func verdictMap(rep *Report) map[string]Kind {
	out := map[string]Kind{}
	for _, v := range rep.Verdicts {
		out[v.Subject] = v.Verdict
	}
	return out
}

func verdictOf(rep *Report, subject string) *Verdict {
	for i := range rep.Verdicts {
		if rep.Verdicts[i].Subject == subject {
			return &rep.Verdicts[i]
		}
	}
	return nil
}

func describe(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rounds=%d repeat_waves=%d runs=%d duration=%.0fs passed=%d\n", rep.RoundCount, rep.RepeatWaves, rep.AllReduceRuns, rep.DurationS, len(rep.Passed))
	vs := slices.Clone(rep.Verdicts)
	sort.Slice(vs, func(i, j int) bool { return vs[i].Subject < vs[j].Subject })
	for _, v := range vs {
		fmt.Fprintf(&b, "  %s %s dev=%.3f: %s\n", v.Subject, v.Verdict, v.Deviation, v.Reason)
		for _, e := range v.Evidence {
			fmt.Fprintf(&b, "     #%d r%d w%d %s %v %s %.1f dev=%.3f %s\n", e.Test, e.Round, e.Wave, e.Purpose, e.Nodes, e.Outcome, e.GBps, e.Deviation, e.Error)
		}
	}
	for _, s := range rep.Skipped {
		fmt.Fprintf(&b, "  skipped %s: %s\n", s.Node, s.Reason)
	}
	return b.String()
}
