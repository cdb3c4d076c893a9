package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

func TestChecksAfterReadsWhatIsAsked(t *testing.T) { both(t, testChecksAfterReadsWhatIsAsked) }

// ChecksAfter returns every stored check in order, whatever part of
// their metrics the reader asks for, and exactly that part.
func testChecksAfterReadsWhatIsAsked(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	defer s.Close()
	ctx := context.Background()
	at := time.Now().Truncate(time.Millisecond)
	r1 := eccResult("r1", "n1", at, report.Fail)
	r1.WorkID = "w-1"
	r2 := Result{ID: "r2", Node: "n2", Started: at, Finished: at.Add(time.Second), Status: report.Pass, Full: true,
		Checks: []report.CheckResult{
			{Name: "ib.counters", Status: report.Pass, Findings: []report.Finding{},
				Metrics: map[string]float64{"ib.mlx5_0.port1.link_downed_rise_count": 1, "ib.mlx5_0.port1.symbol_error_count": 7}},
			{Name: "gpu.health", Status: report.Pass, Findings: []report.Finding{}, Metrics: map[string]float64{"gpu0.temperature_c": 31}},
		}}
	for _, r := range []Result{r1, r2} {
		if _, err := s.Ingest(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	wantOnly := func(name string) bool {
		return strings.HasSuffix(name, "_rise_count") || strings.HasSuffix(name, "dram_uncorrectable")
	}
	for _, tc := range []struct {
		read ChecksRead
		want string // each check: node/check:metrics
	}{
		{ChecksRead{}, "n1/gpu.ecc:gpu3.ecc.dram_uncorrectable=2 n1/ib.ports: " +
			"n2/ib.counters:ib.mlx5_0.port1.link_downed_rise_count=1,ib.mlx5_0.port1.symbol_error_count=7 n2/gpu.health:gpu0.temperature_c=31"},
		{ChecksRead{MetricsOf: []string{"gpu.ecc", "ib.counters"}}, "n1/gpu.ecc:gpu3.ecc.dram_uncorrectable=2 n1/ib.ports: " +
			"n2/ib.counters:ib.mlx5_0.port1.link_downed_rise_count=1,ib.mlx5_0.port1.symbol_error_count=7 n2/gpu.health:"},
		{ChecksRead{MetricsOf: []string{}}, "n1/gpu.ecc: n1/ib.ports: n2/ib.counters: n2/gpu.health:"},
		{ChecksRead{KeepMetric: func(_, name string) bool { return wantOnly(name) }},
			"n1/gpu.ecc:gpu3.ecc.dram_uncorrectable=2 n1/ib.ports: n2/ib.counters:ib.mlx5_0.port1.link_downed_rise_count=1 n2/gpu.health:"},
		{ChecksRead{MetricsOf: []string{"ib.counters"}, KeepMetric: func(_, name string) bool { return wantOnly(name) }},
			"n1/gpu.ecc: n1/ib.ports: n2/ib.counters:ib.mlx5_0.port1.link_downed_rise_count=1 n2/gpu.health:"},
	} {
		got, err := s.ChecksAfter(ctx, 0, 0, 100, tc.read)
		if err != nil {
			t.Fatal(err)
		}
		var b []string
		for i, c := range got {
			if i > 0 && c.Seq <= got[i-1].Seq {
				t.Fatalf("out of stored order: %d after %d", c.Seq, got[i-1].Seq)
			}
			b = append(b, fmt.Sprintf("%s/%s:%s", c.Node, c.Check.Name, metricList(c.Check.Metrics)))
		}
		if g := strings.Join(b, " "); g != tc.want {
			t.Errorf("read %+v:\n got %s\nwant %s", tc.read, g, tc.want)
		}
		if len(got) == 4 {
			ecc := got[0]
			if ecc.WorkID != "w-1" || ecc.ResultID != "r1" || ecc.Check.Status != report.Fail || len(ecc.Check.Findings) != 1 ||
				ecc.Check.Findings[0].Code != "ECC_UNCORRECTABLE" || !ecc.Finished.Equal(at) {
				t.Errorf("read %+v: first check %+v", tc.read, ecc)
			}
		}
	}
	// Bounds: above the first, up to the third, two at most.
	all, err := s.ChecksAfter(ctx, 0, 0, 100, ChecksRead{})
	if err != nil || len(all) != 4 {
		t.Fatalf("all: %d, %v", len(all), err)
	}
	got, err := s.ChecksAfter(ctx, all[0].Seq, all[2].Seq, 100, ChecksRead{MetricsOf: []string{}})
	if err != nil || len(got) != 2 || got[0].Seq != all[1].Seq || got[1].Seq != all[2].Seq {
		t.Fatalf("after the first, up to the third: %+v, %v", got, err)
	}
	if got, err := s.ChecksAfter(ctx, 0, 0, 1, ChecksRead{}); err != nil || len(got) != 1 || got[0].Seq != all[0].Seq {
		t.Fatalf("limit 1: %+v, %v", got, err)
	}
}

// metricList is m as name=value, sorted, comma-separated.
func metricList(m map[string]float64) string {
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s=%g", k, v))
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}
