package drill

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// quickInterval is the agent's default quick-check interval.
const quickInterval = 60 * time.Second

// detectionRun is one drill's outcome in the detection figures.
type detectionRun struct {
	ttd, lag, ttr time.Duration
	detected      bool
	recovered     bool
}

// runDetection drills one fault kind n times on a simulated fleet
// whose agents run their quick pass every quickInterval at a random phase;
// the coordinator answers passive requests from the latest scheduled pass,
// so a fault is detected at the target's next scheduled pass. Injections
// fall at random moments (a random wait before each drill).
func runDetection(tb testing.TB, nodes int, fault, extra string, n int, seed uint64) []detectionRun {
	tb.Helper()
	var names []string
	for i := 1; i <= nodes; i++ {
		names = append(names, fmt.Sprintf("gpu-%03d", i))
	}
	h := newHarness(tb, nodes, names...)
	rnd := rand.New(rand.NewPCG(seed, 0xd1))
	h.fleet.enableSchedule(quickInterval, func(int) time.Duration { return time.Duration(rnd.Int64N(int64(quickInterval))) })
	ctx := context.Background()
	h.fleet.runPasses(ctx)
	var out []detectionRun
	for i := range n {
		// Let every agent's schedule move on a random amount first.
		h.fleet.clock.Advance(time.Duration(rnd.Int64N(int64(quickInterval))) + quickInterval)
		h.fleet.runPasses(ctx)
		target := names[i%len(names)]
		id := h.start(fmt.Sprintf("{fault: %s, targets: name=%s%s}", fault, target, extra))
		h.run(h.eng, nil)
		tg := h.drill(id).Targets[0]
		r := detectionRun{}
		r.ttd, r.detected = tg.TTD()
		r.ttr, r.recovered = tg.TTR()
		for _, d := range tg.Detections {
			if d.Check == tg.DetectedBy {
				r.lag = d.Observed.Sub(d.At)
			}
		}
		out = append(out, r)
	}
	return out
}

type detectionFigures struct {
	n, detected, within             int
	mean, p50, max, lagMax, ttrMean time.Duration
	detectedShare, withinShare      float64
	recovered                       int
	ttds                            []time.Duration
}

func summarize(runs []detectionRun) detectionFigures {
	f := detectionFigures{n: len(runs)}
	var sumTTR time.Duration
	for _, r := range runs {
		if r.detected {
			f.detected++
			f.ttds = append(f.ttds, r.ttd)
			f.mean += r.ttd
			f.max = max(f.max, r.ttd)
			f.lagMax = max(f.lagMax, r.lag)
			if r.ttd <= quickInterval {
				f.within++
			}
		}
		if r.recovered {
			f.recovered++
			sumTTR += r.ttr
		}
	}
	if f.detected > 0 {
		f.mean /= time.Duration(f.detected)
		slices.Sort(f.ttds)
		f.p50 = f.ttds[len(f.ttds)/2]
	}
	if f.recovered > 0 {
		f.ttrMean = sumTTR / time.Duration(f.recovered)
	}
	f.detectedShare = float64(f.detected) / float64(max(1, f.n))
	f.withinShare = float64(f.within) / float64(max(1, f.detected))
	return f
}

// TestDetectionWithinOneQuickInterval: with the agents on their own
// schedule, a drill's fault is detected at the target's next quick pass.
func TestDetectionWithinOneQuickInterval(t *testing.T) {
	t.Parallel()
	runs := runDetection(t, 4, FaultXid, ", poll_interval: 30s", 4, 1)
	f := summarize(runs)
	if f.detected != 4 || f.within != 4 {
		t.Fatalf("detected %d of 4, %d within one interval: %v", f.detected, f.within, f.ttds)
	}
	if f.lagMax > 30*time.Second {
		t.Errorf("observed up to %s after detection, more than a poll interval", f.lagMax)
	}
}

// BenchmarkDrillDetection reports time to detect and to recover per fault
// kind against the agent's 60 s quick-check interval (see runDetection).
func BenchmarkDrillDetection(b *testing.B) {
	for _, c := range []struct{ fault, extra string }{
		{FaultXid, ", poll_interval: 30s"},
		{FaultIBPortDown, ", poll_interval: 30s"},
		{FaultGPUReset, ", poll_interval: 30s"},
		// all_reduce takes the node for a minute: it runs on demand, every
		// two minutes, not on the agent's schedule.
		{FaultGPUSlowdown, ", watch: [nccl.allreduce], poll_interval: 2m"},
		// Nothing detects it: every run is a detection gap at the deadline.
		{FaultKillWorkload, ", deadline: 3m, poll_interval: 30s"},
	} {
		b.Run(c.fault, func(b *testing.B) {
			var f detectionFigures
			for b.Loop() {
				f = summarize(runDetection(b, 16, c.fault, c.extra, 24, 42))
			}
			b.ReportMetric(f.detectedShare*100, "detected-%")
			b.ReportMetric(f.withinShare*100, "within-1-interval-%")
			b.ReportMetric(f.mean.Seconds(), "ttd-mean-s")
			b.ReportMetric(f.p50.Seconds(), "ttd-p50-s")
			b.ReportMetric(f.max.Seconds(), "ttd-max-s")
			b.ReportMetric(f.lagMax.Seconds(), "observe-lag-max-s")
			b.ReportMetric(f.ttrMean.Seconds(), "ttr-mean-s")
		})
	}
}
