package baselines

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Verdict is a comparison's outcome.
type Verdict string

// Verdicts. Inconclusive is never a pass: a campaign treats it as "not
// shown healthy".
const (
	Pass         Verdict = "pass"
	Fail         Verdict = "fail"
	Inconclusive Verdict = "inconclusive"
)

// Defaults for Compare.
const (
	// DefaultThreshold is the deviation above which a measurement fails:
	// the operators' "more than 30 % below baseline".
	DefaultThreshold = 0.30
	// DefaultNoiseSigmas is how many robust standard deviations of the
	// baseline's samples around the threshold count as "too close to call".
	DefaultNoiseSigmas = 2.0
	// DefaultMinNoise is the smallest such window, as a fraction: a
	// baseline from one run (or identical runs) tells nothing about noise,
	// and bus bandwidth varies by a couple of percent run to run.
	DefaultMinNoise = 0.02
)

// thresholdEpsilon absorbs float rounding, so that a deviation of exactly
// the threshold passes: (400-280)/400 and 1-280/400 differ in the last
// bit, and an operator who reads "30 % below, limit 30 %" expects a pass.
const thresholdEpsilon = 1e-9

// Threshold bounds: lower-better metrics can deviate by more than 100 %.
const maxThreshold = 100

// CompareOptions tune Compare; zero values take the defaults.
type CompareOptions struct {
	// Threshold, when > 0, overrides the baseline's own threshold and the
	// default: the caller's configuration is the latest word.
	Threshold float64
	// NoiseSigmas sets the near-threshold window in robust standard
	// deviations of the baseline's samples (0: DefaultNoiseSigmas).
	NoiseSigmas float64
	// MinNoise is the smallest near-threshold window as a fraction
	// (0: DefaultMinNoise; negative: no floor).
	MinNoise float64
}

// Comparison is the verdict on one measurement against one baseline.
// Every number in it is finite, so it can go into a report as it is.
type Comparison struct {
	Verdict Verdict `json:"verdict"`
	Metric  string  `json:"metric,omitempty"`
	Scope   Scope   `json:"scope,omitempty"`
	Version int     `json:"version,omitempty"`
	// Measured and Baseline are the two values; 0 when not a number.
	Measured float64 `json:"measured"`
	Baseline float64 `json:"baseline"`
	// Deviation is the shortfall in the bad direction as a fraction of the
	// baseline: 0.25 is 25 % worse, negative is better. It means something
	// only when Verdict is Pass or Fail (0 otherwise).
	Deviation float64 `json:"deviation"`
	// Threshold is the limit applied: Deviation above it fails, exactly at
	// it passes.
	Threshold float64 `json:"threshold"`
	// Noise is the half-width of the near-threshold window, as a fraction.
	Noise float64 `json:"noise"`
	// NearThreshold is set when |Deviation − Threshold| ≤ Noise: the
	// verdict could flip on a repeat, so the caller should measure again
	// before acting on it.
	NearThreshold bool `json:"near_threshold"`
	// Warnings say what makes the verdict weaker than it looks: a
	// baseline from another stack.
	Warnings []string `json:"warnings,omitempty"`
	// Reason says why, in one line an operator can read.
	Reason string `json:"reason"`
}

// Compare judges measured against b. A measurement fails when its
// deviation exceeds the threshold (the option's, else the baseline's,
// else DefaultThreshold); exactly at the threshold it passes. Without a
// usable baseline (nil, no samples, a value that is not a positive
// number) or measurement (NaN, infinite, negative) the verdict is
// Inconclusive, never Pass. A baseline from another stack (a field known
// on both sides and different) is used, with a warning.
func Compare(b *Baseline, measured float64, stack Stack, opts CompareOptions) Comparison {
	c := Comparison{Verdict: Inconclusive}
	if finite(measured) {
		c.Measured = measured
	}
	if b == nil {
		c.Reason = "no baseline"
		return c
	}
	c.Metric, c.Scope, c.Version = b.Metric, b.Scope, b.Version
	if finite(b.Value) {
		c.Baseline = b.Value
	}
	what := b.Metric
	if what == "" {
		what = "measurement"
	}
	thr, err := pickThreshold(opts.Threshold, b.Threshold)
	c.Threshold = thr
	switch {
	case err != nil:
		c.Reason = err.Error()
		return c
	case !b.Direction.valid():
		c.Reason = fmt.Sprintf("baseline %s has no direction (higher or lower is better)", b.Scope)
		return c
	case b.Samples.Count < 1:
		c.Reason = fmt.Sprintf("baseline %s has no samples", b.Scope)
		return c
	case !finite(b.Value) || b.Value <= 0:
		c.Reason = fmt.Sprintf("baseline %s value %v is not a positive number", b.Scope, b.Value)
		return c
	case !finite(measured):
		c.Reason = fmt.Sprintf("%s is not a number (%v)", what, measured)
		return c
	case measured < 0:
		c.Reason = fmt.Sprintf("%s %v is negative", what, measured)
		return c
	}
	dev := (b.Value - measured) / b.Value
	if b.Direction == LowerBetter {
		dev = (measured - b.Value) / b.Value
	}
	if !finite(dev) {
		c.Reason = fmt.Sprintf("%s %v is out of all proportion to the baseline %v", what, measured, b.Value)
		return c
	}
	c.Deviation = dev
	c.Noise = noiseWindow(b.Samples, opts)
	c.NearThreshold = math.Abs(dev-thr) <= c.Noise
	if diff := b.Stack.Differences(stack); len(diff) > 0 {
		c.Warnings = append(c.Warnings, "baseline from another stack: "+strings.Join(diff, ", "))
	}
	c.Verdict = Pass
	if dev > thr+thresholdEpsilon {
		c.Verdict = Fail
	}
	c.Reason = fmt.Sprintf("%s %s is %s the baseline %s (%s); limit %s",
		what, num(measured), deviationText(dev, b.Direction), num(b.Value), provenance(b), pct(thr))
	if c.NearThreshold {
		c.Reason += fmt.Sprintf("; within the baseline's noise (±%s) of the limit: measure again", pct(c.Noise))
	}
	return c
}

// pickThreshold applies the precedence and rejects nonsense limits.
func pickThreshold(opt, own float64) (float64, error) {
	thr, from := DefaultThreshold, "default"
	switch {
	case opt != 0:
		thr, from = opt, "configured"
	case own != 0:
		thr, from = own, "baseline's"
	}
	if !finite(thr) || thr <= 0 || thr > maxThreshold {
		return 0, fmt.Errorf("%s threshold %v is not a fraction in (0, %d]", from, thr, maxThreshold)
	}
	return thr, nil
}

// noiseWindow is how close to the threshold a deviation is too close to
// call: NoiseSigmas robust standard deviations of the baseline's samples,
// at least MinNoise.
func noiseWindow(s Stats, o CompareOptions) float64 {
	sig := o.NoiseSigmas
	if !(sig > 0) || !finite(sig) {
		sig = DefaultNoiseSigmas
	}
	floor := o.MinNoise
	switch {
	case floor == 0 || math.IsNaN(floor):
		floor = DefaultMinNoise
	case floor < 0:
		floor = 0
	}
	w := sig * s.RelNoise()
	if !finite(w) {
		w = 0
	}
	return math.Max(w, math.Min(floor, maxThreshold))
}

func deviationText(dev float64, d Direction) string {
	worse, better := "below", "above"
	if d == LowerBetter {
		worse, better = "above", "below"
	}
	switch {
	case dev > 0:
		return pct(dev) + " " + worse
	case dev < 0:
		return pct(-dev) + " " + better
	default:
		return "equal to"
	}
}

// pct prints a fraction as a percentage with enough digits to tell 29.99 %
// from 30 %.
func pct(f float64) string {
	s := fmt.Sprintf("%.2f", f*100)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + "%"
}

// num prints a value for a reason: one decimal in the usual range of
// bandwidths and latencies, four significant digits outside it.
func num(v float64) string {
	if a := math.Abs(v); a >= 1 && a < 1e6 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return fmt.Sprintf("%.4g", v)
}

// provenance says where a baseline came from: "sku:X v2, 5 samples, taken
// 2026-01-02".
func provenance(b *Baseline) string {
	var parts []string
	where := string(b.Scope)
	if b.Version > 0 {
		where += fmt.Sprintf(" v%d", b.Version)
	}
	if where != "" {
		parts = append(parts, where)
	}
	if b.Samples.Count == 1 {
		parts = append(parts, "1 sample")
	} else {
		parts = append(parts, fmt.Sprintf("%d samples", b.Samples.Count))
	}
	if !b.TakenAt.IsZero() {
		parts = append(parts, "taken "+b.TakenAt.UTC().Format(time.DateOnly))
	}
	return strings.Join(parts, ", ")
}
