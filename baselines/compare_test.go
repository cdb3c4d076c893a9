package baselines

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

// one is a baseline from a single sample.
func one(metric string, dir Direction, v float64) *Baseline {
	return &Baseline{
		Key:       Key{Metric: metric, Scope: SKUScope("h100-sxm-80g-x8-nvlink")},
		Direction: dir,
		Value:     v,
		Samples:   Stats{Count: 1, Median: v, Min: v, Max: v, Values: []float64{v}},
		Version:   1,
		TakenAt:   time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC),
	}
}

func TestCompareDeviation(t *testing.T) {
	t.Parallel()
	bw, lat := MetricAllReduceBusBW, "nccl.allreduce.latency_us"
	tests := []struct {
		name     string
		b        *Baseline
		measured float64
		verdict  Verdict
		dev      float64
	}{
		{"higher: equal", one(bw, HigherBetter, 400), 400, Pass, 0},
		{"higher: 25% better", one(bw, HigherBetter, 400), 500, Pass, -0.25},
		{"higher: 10% worse", one(bw, HigherBetter, 400), 360, Pass, 0.10},
		{"higher: exactly 30%", one(bw, HigherBetter, 400), 280, Pass, 0.30},
		{"higher: exactly 30%, rounding above", one(bw, HigherBetter, 1), 0.7, Pass, 0.30},
		{"higher: 29.99%", one(bw, HigherBetter, 400), 280.04, Pass, 0.2999},
		{"higher: 30.01%", one(bw, HigherBetter, 400), 279.96, Fail, 0.3001},
		{"higher: 35% worse", one(bw, HigherBetter, 480), 312, Fail, 0.35},
		{"higher: measured zero", one(bw, HigherBetter, 480), 0, Fail, 1},
		{"lower: equal", one(lat, LowerBetter, 100), 100, Pass, 0},
		{"lower: 30% faster", one(lat, LowerBetter, 100), 70, Pass, -0.30},
		{"lower: exactly 30%", one(lat, LowerBetter, 100), 130, Pass, 0.30},
		{"lower: exactly 30%, rounding above", one(lat, LowerBetter, 1), 1.3, Pass, 0.30},
		{"lower: 29.99%", one(lat, LowerBetter, 100), 129.99, Pass, 0.2999},
		{"lower: 30.01%", one(lat, LowerBetter, 100), 130.01, Fail, 0.3001},
		{"lower: twice as slow", one(lat, LowerBetter, 100), 200, Fail, 1},
		{"lower: measured zero", one(lat, LowerBetter, 100), 0, Pass, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := Compare(tc.b, tc.measured, Stack{}, CompareOptions{})
			if c.Verdict != tc.verdict {
				t.Errorf("verdict %s, want %s (%s)", c.Verdict, tc.verdict, c.Reason)
			}
			if math.Abs(c.Deviation-tc.dev) > 1e-9 {
				t.Errorf("deviation %v, want %v", c.Deviation, tc.dev)
			}
			if c.Threshold != DefaultThreshold {
				t.Errorf("threshold %v, want the default", c.Threshold)
			}
			if c.Measured != tc.measured || c.Baseline != tc.b.Value {
				t.Errorf("measured/baseline %v/%v, want %v/%v", c.Measured, c.Baseline, tc.measured, tc.b.Value)
			}
			mustJSON(t, c)
		})
	}
}

func TestCompareReasonSaysDirection(t *testing.T) {
	t.Parallel()
	c := Compare(one(MetricAllReduceBusBW, HigherBetter, 480), 312, Stack{}, CompareOptions{})
	for _, want := range []string{"312", "35% below", "480", "sku:h100-sxm-80g-x8-nvlink v1", "limit 30%"} {
		if !strings.Contains(c.Reason, want) {
			t.Errorf("reason %q lacks %q", c.Reason, want)
		}
	}
	c = Compare(one("nccl.allreduce.latency_us", LowerBetter, 100), 70, Stack{}, CompareOptions{})
	if !strings.Contains(c.Reason, "30% below") {
		t.Errorf("lower-better improvement reads %q", c.Reason)
	}
	c = Compare(one("nccl.allreduce.latency_us", LowerBetter, 100), 130.01, Stack{}, CompareOptions{})
	if !strings.Contains(c.Reason, "30.01% above") {
		t.Errorf("lower-better shortfall reads %q", c.Reason)
	}
}

// TestCompareInconclusive: nothing that cannot be judged passes.
func TestCompareInconclusive(t *testing.T) {
	t.Parallel()
	good := func() *Baseline { return one(MetricAllReduceBusBW, HigherBetter, 480) }
	with := func(f func(b *Baseline)) *Baseline { b := good(); f(b); return b }
	nan, inf := math.NaN(), math.Inf(1)
	tests := []struct {
		name     string
		b        *Baseline
		measured float64
		opts     CompareOptions
		reason   string
	}{
		{"no baseline", nil, 400, CompareOptions{}, "no baseline"},
		{"zero baseline", with(func(b *Baseline) { b.Value = 0 }), 400, CompareOptions{}, "not a positive number"},
		{"NaN baseline", with(func(b *Baseline) { b.Value = nan }), 400, CompareOptions{}, "not a positive number"},
		{"infinite baseline", with(func(b *Baseline) { b.Value = inf }), 400, CompareOptions{}, "not a positive number"},
		{"negative baseline", with(func(b *Baseline) { b.Value = -480 }), 400, CompareOptions{}, "not a positive number"},
		{"empty samples", with(func(b *Baseline) { b.Samples = Stats{} }), 400, CompareOptions{}, "no samples"},
		{"no direction", with(func(b *Baseline) { b.Direction = "" }), 400, CompareOptions{}, "no direction"},
		{"NaN measured", good(), nan, CompareOptions{}, "not a number"},
		{"+Inf measured", good(), inf, CompareOptions{}, "not a number"},
		{"-Inf measured", good(), math.Inf(-1), CompareOptions{}, "not a number"},
		{"negative measured", good(), -1, CompareOptions{}, "negative"},
		{"NaN threshold option", good(), 400, CompareOptions{Threshold: nan}, "threshold"},
		{"negative threshold option", good(), 400, CompareOptions{Threshold: -0.3}, "threshold"},
		{"negative baseline threshold", with(func(b *Baseline) { b.Threshold = -1 }), 400, CompareOptions{}, "threshold"},
		{"deviation out of range", with(func(b *Baseline) {
			b.Value, b.Samples.Median, b.Samples.Min, b.Samples.Max = 1e-300, 1e-300, 1e-300, 1e-300
		}), 1e300, CompareOptions{}, "out of all proportion"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := Compare(tc.b, tc.measured, Stack{}, tc.opts)
			if c.Verdict != Inconclusive {
				t.Fatalf("verdict %s, want inconclusive (%s)", c.Verdict, c.Reason)
			}
			if !strings.Contains(c.Reason, tc.reason) {
				t.Errorf("reason %q lacks %q", c.Reason, tc.reason)
			}
			if c.Deviation != 0 || c.NearThreshold {
				t.Errorf("inconclusive with deviation %v, near %v", c.Deviation, c.NearThreshold)
			}
			mustJSON(t, c)
		})
	}
}

func TestCompareThresholdPrecedence(t *testing.T) {
	t.Parallel()
	b := one(MetricAllReduceBusBW, HigherBetter, 400)
	if c := Compare(b, 300, Stack{}, CompareOptions{}); c.Verdict != Pass || c.Threshold != 0.30 {
		t.Errorf("default: %s at %v", c.Verdict, c.Threshold)
	}
	b.Threshold = 0.20
	if c := Compare(b, 300, Stack{}, CompareOptions{}); c.Verdict != Fail || c.Threshold != 0.20 {
		t.Errorf("baseline's own 20%%: %s at %v", c.Verdict, c.Threshold)
	}
	if c := Compare(b, 300, Stack{}, CompareOptions{Threshold: 0.50}); c.Verdict != Pass || c.Threshold != 0.50 {
		t.Errorf("option 50%% over baseline's 20%%: %s at %v", c.Verdict, c.Threshold)
	}
}

func TestCompareNearThreshold(t *testing.T) {
	t.Parallel()
	stats := func(vals ...float64) *Baseline {
		st, err := NewStats(vals)
		if err != nil {
			t.Fatal(err)
		}
		b := one(MetricAllReduceBusBW, HigherBetter, st.Median)
		b.Samples = st
		return b
	}
	// Tight: MAD 2 on 480, robust sigma 0.62 %, 2 sigma 1.2 %: the 2 % floor rules.
	tight := stats(476, 478, 480, 482, 484)
	// Wide: MAD 20 on 480, robust sigma 6.2 %, window 12.4 %.
	wide := stats(440, 460, 480, 500, 520)
	at := func(dev float64) float64 { return 480 * (1 - dev) }
	tests := []struct {
		name    string
		b       *Baseline
		dev     float64
		opts    CompareOptions
		near    bool
		verdict Verdict
	}{
		{"tight, far below limit", tight, 0.20, CompareOptions{}, false, Pass},
		{"tight, 1.5 points under", tight, 0.285, CompareOptions{}, true, Pass},
		{"tight, 1.5 points over", tight, 0.315, CompareOptions{}, true, Fail},
		{"tight, 5 points over", tight, 0.35, CompareOptions{}, false, Fail},
		{"wide, 5 points over", wide, 0.35, CompareOptions{}, true, Fail},
		{"wide, 10 points under", wide, 0.20, CompareOptions{}, true, Pass},
		{"wide, 15 points under", wide, 0.15, CompareOptions{}, false, Pass},
		{"wide, 1 sigma window", wide, 0.20, CompareOptions{NoiseSigmas: 1}, false, Pass},
		{"single sample uses the floor", one(MetricAllReduceBusBW, HigherBetter, 480), 0.31, CompareOptions{}, true, Fail},
		{"single sample, no floor", one(MetricAllReduceBusBW, HigherBetter, 480), 0.31, CompareOptions{MinNoise: -1}, false, Fail},
		{"wider floor", tight, 0.25, CompareOptions{MinNoise: 0.06}, true, Pass},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := Compare(tc.b, at(tc.dev), Stack{}, tc.opts)
			if c.NearThreshold != tc.near || c.Verdict != tc.verdict {
				t.Errorf("near %v %s, want near %v %s (deviation %v, window %v)", c.NearThreshold, c.Verdict, tc.near, tc.verdict, c.Deviation, c.Noise)
			}
			if tc.near && !strings.Contains(c.Reason, "measure again") {
				t.Errorf("reason %q does not ask for a repeat", c.Reason)
			}
		})
	}
	if w := noiseWindow(wide.Samples, CompareOptions{}); math.Abs(w-2*1.4826*20.0/480) > 1e-12 {
		t.Errorf("wide window %v", w)
	}
}

func TestCompareOtherStackWarns(t *testing.T) {
	t.Parallel()
	b := one(MetricAllReduceBusBW, HigherBetter, 480)
	b.Stack = Stack{Driver: "535.129.03", NCCL: "2.18.1", RDMAStack: "MLNX_OFED 23.10-1.1.9.0"}
	tests := []struct {
		name  string
		stack Stack
		warn  []string
	}{
		{"same stack", b.Stack, nil},
		{"measured stack unknown", Stack{}, nil},
		{"only driver known, same", Stack{Driver: "535.129.03"}, nil},
		{"nccl build suffix ignored", Stack{NCCL: "2.18.1+cuda12.2"}.Normalize(), nil},
		{"driver differs", Stack{Driver: "550.54.15", NCCL: "2.18.1"}, []string{"driver 535.129.03 → 550.54.15"}},
		{"rdma stack differs", Stack{RDMAStack: "DOCA 2.10.0"}, []string{"rdma_stack MLNX_OFED 23.10-1.1.9.0 → DOCA 2.10.0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := Compare(b, 470, tc.stack, CompareOptions{})
			if c.Verdict != Pass {
				t.Fatalf("verdict %s: another stack is compared, with a warning", c.Verdict)
			}
			if len(tc.warn) == 0 {
				if len(c.Warnings) != 0 {
					t.Errorf("warnings %q, want none", c.Warnings)
				}
				return
			}
			if len(c.Warnings) != 1 {
				t.Fatalf("warnings %q, want one", c.Warnings)
			}
			for _, w := range tc.warn {
				if !strings.Contains(c.Warnings[0], w) {
					t.Errorf("warning %q lacks %q", c.Warnings[0], w)
				}
			}
		})
	}
}

// mustJSON: a comparison goes into reports, where NaN and Inf cannot.
func mustJSON(t *testing.T, c Comparison) {
	t.Helper()
	if _, err := json.Marshal(c); err != nil {
		t.Errorf("comparison does not marshal: %v", err)
	}
}
