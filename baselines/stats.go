package baselines

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// MaxValues bounds the sample values a baseline keeps. Count, Median, MAD,
// Min and Max always describe every sample.
const MaxValues = 64

// maxCount keeps a hand-written count sane.
const maxCount = 1 << 30

// madToSigma turns a MAD into a standard deviation for normal data.
const madToSigma = 1.4826

// Stats summarises the samples a baseline came from. The spread is the
// median absolute deviation (MAD): one bad run among five moves it little,
// where a standard deviation would be dragged along. Min and Max are kept
// for people reading a baseline.
type Stats struct {
	Count  int     `json:"count"`
	Median float64 `json:"median"`
	MAD    float64 `json:"mad"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	// Values are samples in ascending order. Beyond MaxValues samples,
	// evenly spaced order statistics (min and max included) stand for them.
	Values []float64 `json:"values"`
}

// NewStats summarises samples. They must be finite and not negative.
func NewStats(samples []float64) (Stats, error) {
	if len(samples) == 0 {
		return Stats{}, fmt.Errorf("%w: no samples", ErrInvalid)
	}
	if len(samples) > maxCount {
		return Stats{}, fmt.Errorf("%w: more than %d samples", ErrInvalid, maxCount)
	}
	for i, v := range samples {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return Stats{}, fmt.Errorf("%w: sample %d is %v: want a finite number, not negative", ErrInvalid, i+1, v)
		}
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	med := median(sorted)
	dev := make([]float64, len(sorted))
	for i, v := range sorted {
		dev[i] = math.Abs(v - med)
	}
	slices.Sort(dev)
	return Stats{
		Count:  len(sorted),
		Median: med,
		MAD:    median(dev),
		Min:    sorted[0],
		Max:    sorted[len(sorted)-1],
		Values: thin(sorted, MaxValues),
	}, nil
}

// median of sorted, non-empty values.
func median(s []float64) float64 {
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	// Halves first: the plain sum of two huge values overflows.
	return s[n/2-1]/2 + s[n/2]/2
}

// thin keeps at most k of sorted values, evenly spaced by rank.
func thin(sorted []float64, k int) []float64 {
	n := len(sorted)
	if n <= k {
		return slices.Clone(sorted)
	}
	out := make([]float64, k)
	for i := range out {
		out[i] = sorted[int(math.Round(float64(i)*float64(n-1)/float64(k-1)))]
	}
	return out
}

// RelNoise is the samples' robust standard deviation as a fraction of the
// median (1.4826 × MAD / median); 0 when it cannot be told (one sample,
// identical samples, no median).
func (s Stats) RelNoise() float64 {
	if s.Count < 2 || !(s.Median > 0) || !finite(s.MAD) {
		return 0
	}
	r := madToSigma * s.MAD / s.Median
	if !finite(r) {
		return 0
	}
	return r
}

// validate checks that the summary hangs together.
func (s Stats) validate() error {
	if s.Count < 1 {
		return errors.New("no samples (count must be at least 1)")
	}
	if s.Count > maxCount {
		return fmt.Errorf("count %d is more than %d", s.Count, maxCount)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"median", s.Median}, {"mad", s.MAD}, {"min", s.Min}, {"max", s.Max}} {
		if !finite(f.v) || f.v < 0 {
			return fmt.Errorf("samples %s is %v: want a finite number, not negative", f.name, f.v)
		}
	}
	if s.Min > s.Median || s.Median > s.Max {
		return fmt.Errorf("samples out of order: min %v, median %v, max %v", s.Min, s.Median, s.Max)
	}
	if len(s.Values) > MaxValues || len(s.Values) > s.Count {
		return fmt.Errorf("%d values for %d samples (at most %d kept)", len(s.Values), s.Count, MaxValues)
	}
	for i, v := range s.Values {
		if !finite(v) || v < s.Min || v > s.Max {
			return fmt.Errorf("value %d (%v) is outside min %v and max %v", i+1, v, s.Min, s.Max)
		}
		if i > 0 && v < s.Values[i-1] {
			return fmt.Errorf("values are not in ascending order at value %d", i+1)
		}
	}
	return nil
}

// same reports whether two summaries are equal, values included.
func (s Stats) same(o Stats) bool {
	return s.Count == o.Count && s.Median == o.Median && s.MAD == o.MAD &&
		s.Min == o.Min && s.Max == o.Max && slices.Equal(s.Values, o.Values)
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
