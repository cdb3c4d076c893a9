package baselines

import (
	"context"
	"fmt"
	"strings"
)

// Finder gives the candidates Resolve chooses from: the latest version of
// every stack's baseline for one metric at one scope. *Store and Static
// implement it.
type Finder interface {
	Candidates(ctx context.Context, metric string, scope Scope) ([]Baseline, error)
}

// Resolution is the baseline Resolve chose, and why.
type Resolution struct {
	// Baseline is nil when none was found.
	Baseline *Baseline `json:"baseline,omitempty"`
	// Scope is where it was found; Tried lists the scopes looked at, in order.
	Scope Scope   `json:"scope,omitempty"`
	Tried []Scope `json:"tried"`
	// Fallback is set when the baseline is not from the first scope tried
	// (a node without its own baseline judged against its SKU's).
	Fallback bool `json:"fallback"`
	// OtherStack is set when no baseline matched the stack and one from
	// another stack was taken; Compare says so in a warning.
	OtherStack bool   `json:"other_stack"`
	Reason     string `json:"reason"`
}

// Resolve finds the baseline for a measurement on one node: the node's
// own, else its SKU's, else its base SKU's (SKUBase: the SKU without its
// network part, where intra-node references live). A baseline under the
// same stack at any of these scopes wins over one from another stack at a
// narrower scope; a baseline from another stack is taken only when no
// scope has one under the same stack. Empty node or sku skips that scope.
// No baseline is not an error: Resolution.Baseline is nil and Compare
// makes that inconclusive.
func Resolve(ctx context.Context, f Finder, metric, node, sku string, stack Stack) (Resolution, error) {
	var scopes []Scope
	if node != "" {
		scopes = append(scopes, NodeScope(node))
	}
	return ResolveScopes(ctx, f, metric, stack, append(scopes, skuScopes(sku)...)...)
}

// ResolveLink is Resolve for a 2-node measurement: the pair's own
// baseline, else the SKU's (both nodes are expected to share one).
func ResolveLink(ctx context.Context, f Finder, metric, a, b, sku string, stack Stack) (Resolution, error) {
	return ResolveScopes(ctx, f, metric, stack, append([]Scope{LinkScope(a, b)}, skuScopes(sku)...)...)
}

func skuScopes(sku string) []Scope {
	if sku == "" {
		return nil
	}
	out := []Scope{SKUScope(sku)}
	if base := SKUBase(strings.ToLower(strings.TrimSpace(sku))); SKUScope(base) != out[0] {
		out = append(out, SKUScope(base))
	}
	return out
}

// ResolveScopes looks through scopes in order (narrowest first). Among
// one scope's candidates it prefers the stack with the most fields known
// and equal on both sides, then the most recently taken.
func ResolveScopes(ctx context.Context, f Finder, metric string, stack Stack, scopes ...Scope) (Resolution, error) {
	res := Resolution{}
	if err := ValidMetric(metric); err != nil {
		return res, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	stack = stack.Normalize()
	cands := make([][]Baseline, 0, len(scopes))
	for _, s := range scopes {
		sc, err := ParseScope(string(s))
		if err != nil {
			return res, fmt.Errorf("resolve %s: %w", metric, err)
		}
		res.Tried = append(res.Tried, sc)
		c, err := f.Candidates(ctx, metric, sc)
		if err != nil {
			return res, fmt.Errorf("resolve %s at %s: %w", metric, sc, err)
		}
		// A baseline stored before the metric was renamed still counts.
		for _, old := range OldMetricNames(metric) {
			if len(c) > 0 {
				break
			}
			if c, err = f.Candidates(ctx, old, sc); err != nil {
				return res, fmt.Errorf("resolve %s (was %s) at %s: %w", metric, old, sc, err)
			}
		}
		cands = append(cands, c)
	}
	if len(res.Tried) == 0 {
		res.Reason = fmt.Sprintf("no baseline for %s: no node or SKU to look under", metric)
		return res, nil
	}
	for _, otherStack := range []bool{false, true} {
		for i, c := range cands {
			b := pickStack(c, stack, otherStack)
			if b == nil {
				continue
			}
			res.Baseline, res.Scope, res.Fallback, res.OtherStack = b, res.Tried[i], i > 0, otherStack
			res.Reason = resolutionReason(res, b, stack)
			return res, nil
		}
	}
	res.Reason = fmt.Sprintf("no baseline for %s at %s", metric, joinScopes(res.Tried))
	return res, nil
}

// pickStack chooses among one scope's candidates: those that agree with
// the stack (otherStack false) or those that do not (true).
func pickStack(cands []Baseline, stack Stack, otherStack bool) *Baseline {
	var best *Baseline
	bestConflicts, bestMatches := 0, 0
	for i := range cands {
		b := &cands[i]
		conflicts := len(b.Stack.Differences(stack))
		if (conflicts > 0) != otherStack {
			continue
		}
		matches := b.Stack.matches(stack)
		better := best == nil ||
			conflicts < bestConflicts ||
			(conflicts == bestConflicts && matches > bestMatches) ||
			(conflicts == bestConflicts && matches == bestMatches && b.TakenAt.After(best.TakenAt))
		if better {
			best, bestConflicts, bestMatches = b, conflicts, matches
		}
	}
	if best == nil {
		return nil
	}
	out := *best
	return &out
}

func resolutionReason(r Resolution, b *Baseline, stack Stack) string {
	s := "baseline " + string(r.Scope)
	if b.Version > 0 {
		s += fmt.Sprintf(" v%d", b.Version)
	}
	if r.Fallback {
		s = fmt.Sprintf("no baseline at %s; %s", joinScopes(r.Tried[:indexOf(r.Tried, r.Scope)]), s)
	}
	if r.OtherStack {
		s += fmt.Sprintf(", taken under another stack (%s; measured under %s)", b.Stack, stack)
	}
	return s
}

func indexOf(ss []Scope, s Scope) int {
	for i, x := range ss {
		if x == s {
			return i
		}
	}
	return len(ss)
}

func joinScopes(ss []Scope) string {
	parts := make([]string, len(ss))
	for i, s := range ss {
		parts[i] = string(s)
	}
	return strings.Join(parts, ", ")
}

// CompareResolved compares against a resolution's baseline and carries
// its reason: which scope was used, or why there is none.
func CompareResolved(r Resolution, measured float64, stack Stack, opts CompareOptions) Comparison {
	c := Compare(r.Baseline, measured, stack, opts)
	if r.Baseline == nil {
		c.Reason = r.Reason
		return c
	}
	c.Scope = r.Scope
	if r.Fallback {
		// The stack, when it differs, is in the warnings already.
		c.Reason += "; no baseline at " + joinScopes(r.Tried[:indexOf(r.Tried, r.Scope)])
	}
	return c
}

// Static is a fixed set of baselines, for the simulator, tests and the
// shipped references when no store is at hand. Where one key has several
// versions, the highest counts.
type Static []Baseline

// Candidates implements Finder.
func (s Static) Candidates(_ context.Context, metric string, scope Scope) ([]Baseline, error) {
	latest := map[Stack]int{}
	var out []Baseline
	for _, b := range s {
		if b.Metric != metric || b.Scope != scope {
			continue
		}
		if i, ok := latest[b.Stack]; ok {
			if b.Version > out[i].Version {
				out[i] = b
			}
			continue
		}
		latest[b.Stack] = len(out)
		out = append(out, b)
	}
	return out, nil
}
