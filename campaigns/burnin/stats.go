package burnin

import (
	"math"
	"slices"
)

// median of values (not sorted in place); NaN for none.
func median(values []float64) float64 {
	if len(values) == 0 {
		return math.NaN()
	}
	s := slices.Clone(values)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// mad is the median absolute deviation around m.
func mad(values []float64, m float64) float64 {
	if len(values) == 0 {
		return math.NaN()
	}
	d := make([]float64, len(values))
	for i, v := range values {
		d[i] = math.Abs(v - m)
	}
	return median(d)
}

// shortfall is how much worse v is than ref in the metric's bad
// direction, as a fraction of ref (0.25 = 25 % worse; negative = better).
func shortfall(v, ref float64, direction string) float64 {
	if ref == 0 {
		return 0
	}
	if direction == "lower" {
		return (v - ref) / ref
	}
	return (ref - v) / ref
}

// outlier applies the rule to one value against its peers' median and
// MAD. The distance must be in the bad direction for both conditions.
func (o OutlierRule) outlier(v, med, madv float64, direction string) bool {
	sf := shortfall(v, med, direction)
	if !(sf > o.MinShortfall+1e-12) {
		return false
	}
	return math.Abs(v-med) > o.MADs*madv
}

// worseThanFloor reports whether v is beyond an absolute floor.
func worseThanFloor(v, floor float64, direction string) bool {
	if floor <= 0 {
		return false
	}
	if direction == "lower" {
		return v > floor
	}
	return v < floor
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
