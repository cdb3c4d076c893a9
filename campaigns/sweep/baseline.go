package sweep

import (
	"context"
	"fmt"
	"strings"

	"github.com/fleetcheck/fleetcheck/baselines"
)

// BaselineSource finds the baseline each run is judged against. The
// coordinator passes FinderSource over its baselines store; tests pass
// FinderSource over a baselines.Static, or their own.
type BaselineSource interface {
	// Single resolves the single-node all_reduce baseline: node scope,
	// else the SKU's.
	Single(ctx context.Context, n NodeInfo) (baselines.Resolution, error)
	// Pair resolves the 2-node baseline: the link's, else the SKU's.
	Pair(ctx context.Context, a, b NodeInfo) (baselines.Resolution, error)
}

// FinderSource resolves through the baselines package's rules (node scope
// falls back to the SKU and the base SKU; another stack only with a
// warning).
type FinderSource struct{ Finder baselines.Finder }

var _ BaselineSource = FinderSource{}

// Single implements BaselineSource.
func (f FinderSource) Single(ctx context.Context, n NodeInfo) (baselines.Resolution, error) {
	r, err := baselines.Resolve(ctx, f.Finder, baselines.MetricAllReduceBusBW, n.Name, n.SKU, n.Stack)
	if err != nil {
		return r, fmt.Errorf("single-node baseline for %s: %w", n.Name, err)
	}
	return r, nil
}

// Pair implements BaselineSource.
func (f FinderSource) Pair(ctx context.Context, a, b NodeInfo) (baselines.Resolution, error) {
	r, err := baselines.ResolveLink(ctx, f.Finder, baselines.MetricAllReduce2BusBW, a.Name, b.Name, a.SKU, a.Stack)
	if err != nil {
		return r, fmt.Errorf("2-node baseline for %s: %w", linkKey(a.Name, b.Name), err)
	}
	return r, nil
}

// Reference is what a test was judged against, as kept with the test.
type Reference struct {
	GBps    float64  `json:"gbps"`
	Scope   string   `json:"scope"`
	Version int      `json:"version,omitempty"`
	Samples int      `json:"samples,omitempty"`
	Noise   float64  `json:"noise"` // the near-threshold window, a fraction
	Warning []string `json:"warnings,omitempty"`
}

// judgement is one measurement read against its baseline.
type judgement struct {
	outcome   Outcome
	ref       *Reference
	deviation float64
	reason    string
}

// judge compares a measurement with the resolved baseline by the
// baselines package's rules, then sorts it: near the threshold (within the
// baseline's noise), slow, fine; no baseline and anything else
// inconclusive are never fine.
func judge(res baselines.Resolution, measured float64, stack baselines.Stack, spec Spec) judgement {
	c := baselines.CompareResolved(res, measured, stack, baselines.CompareOptions{
		Threshold:   spec.Threshold,
		NoiseSigmas: spec.Repeat.BandSigmas,
		MinNoise:    spec.Repeat.Band,
	})
	j := judgement{reason: c.Reason}
	if res.Baseline != nil {
		j.ref = &Reference{
			GBps: c.Baseline, Scope: string(c.Scope), Version: c.Version,
			Samples: res.Baseline.Samples.Count, Noise: c.Noise, Warning: c.Warnings,
		}
	}
	switch {
	case c.Verdict == baselines.Inconclusive && res.Baseline == nil:
		j.outcome = OutNoBaseline
	case c.Verdict == baselines.Inconclusive:
		j.outcome = OutError
	case c.NearThreshold:
		j.outcome, j.deviation = OutNear, c.Deviation
	case c.Verdict == baselines.Fail:
		j.outcome, j.deviation = OutSlow, c.Deviation
	default:
		j.outcome, j.deviation = OutFine, c.Deviation
	}
	return j
}

// linkKey names a pair of nodes (or leaves) in sorted order.
func linkKey(a, b string) string {
	if b < a {
		a, b = b, a
	}
	return a + "|" + b
}

// splitKey undoes linkKey.
func splitKey(k string) (string, string) {
	a, b, _ := strings.Cut(k, "|")
	return a, b
}
