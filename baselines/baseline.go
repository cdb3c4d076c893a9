package baselines

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Baseline is one version of a stored reference for one key.
type Baseline struct {
	Key
	Direction Direction `json:"direction"`
	Samples   Stats     `json:"samples"`
	// Value is what measurements are compared with: the samples' median.
	Value float64 `json:"value"`
	// Version counts from 1 per key; 0 for a baseline not stored.
	Version int       `json:"version"`
	TakenAt time.Time `json:"taken_at"`
	Who     string    `json:"who,omitempty"`
	FromRun string    `json:"from_run,omitempty"`
	Note    string    `json:"note,omitempty"`
	// Threshold overrides DefaultThreshold for this baseline; 0 = default.
	Threshold float64 `json:"threshold,omitempty"`
}

// Earliest and latest TakenAt accepted (Unix seconds): outside, a date is
// a typo, and years past 9999 do not survive RFC 3339.
const (
	minTakenAtUnix = 0            // 1970-01-01T00:00:00Z
	maxTakenAtUnix = 253402300799 // 9999-12-31T23:59:59Z
)

// normalize validates b and fills what can be derived: the spelling of
// its key, Value from the median when 0, TakenAt in UTC. It does not set
// TakenAt when zero: the store does, from its clock. Errors wrap
// ErrInvalid and name the key.
func (b Baseline) normalize() (Baseline, error) {
	k, err := b.Key.Normalize()
	if err != nil {
		return Baseline{}, err
	}
	b.Key = k
	out, err := b.normalizeFields()
	if err != nil {
		return Baseline{}, fmt.Errorf("%w: %s: %w", ErrInvalid, k, err)
	}
	return out, nil
}

// normalizeFields is normalize for all but the key, with plain errors.
func (b Baseline) normalizeFields() (Baseline, error) {
	if !b.Direction.valid() {
		return Baseline{}, fmt.Errorf("direction %q: want %q or %q", b.Direction, HigherBetter, LowerBetter)
	}
	if err := b.Samples.validate(); err != nil {
		return Baseline{}, err
	}
	b.Samples.Values = slices.Clone(b.Samples.Values)
	if b.Value == 0 {
		b.Value = b.Samples.Median
	}
	if !finite(b.Value) || b.Value <= 0 {
		return Baseline{}, fmt.Errorf("value %v is not a positive number", b.Value)
	}
	if !sameFloat(b.Value, b.Samples.Median) {
		return Baseline{}, fmt.Errorf("value %v is not the samples' median %v", b.Value, b.Samples.Median)
	}
	if !finite(b.Threshold) || b.Threshold < 0 || b.Threshold > maxThreshold {
		return Baseline{}, fmt.Errorf("threshold %v: want 0 (the default, %v) or a fraction up to %d", b.Threshold, DefaultThreshold, maxThreshold)
	}
	if !b.TakenAt.IsZero() {
		b.TakenAt = b.TakenAt.UTC()
		if u := b.TakenAt.Unix(); u < minTakenAtUnix || u > maxTakenAtUnix {
			return Baseline{}, fmt.Errorf("taken_at %s is outside the years 1970 to 9999", b.TakenAt.Format(time.RFC3339))
		}
	}
	for _, f := range []struct {
		name      string
		v         string
		max       int
		multiline bool
	}{{"who", b.Who, maxWhoLen, false}, {"from_run", b.FromRun, maxWhoLen, false}, {"note", b.Note, maxNoteLen, true}} {
		if len(f.v) > f.max {
			return Baseline{}, fmt.Errorf("%s longer than %d bytes", f.name, f.max)
		}
		if err := plainText(f.v, f.multiline); err != nil {
			return Baseline{}, fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return b, nil
}

// sameFloat compares within rounding, so a median written to YAML and
// read back still matches.
func sameFloat(a, b float64) bool {
	if a == b {
		return true
	}
	return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b))
}

// sameValue reports whether two versions say the same thing: value,
// direction, threshold and samples. Who, when and why do not count, so
// importing a file twice stores nothing new.
func (b Baseline) sameValue(o Baseline) bool {
	return b.Value == o.Value && b.Direction == o.Direction && b.Threshold == o.Threshold && b.Samples.same(o.Samples)
}

// String is the key, version and value, for logs: "nccl.allreduce.busbw_gbps
// at sku:h100-sxm-80g-x8-nvlink (unknown stack) v1: 480 higher is better,
// 1 samples".
func (b Baseline) String() string {
	return fmt.Sprintf("%s v%d: %s %s is better, %d samples", b.Key, b.Version, num(b.Value), b.Direction, b.Samples.Count)
}
