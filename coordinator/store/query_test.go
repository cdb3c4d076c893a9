package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
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
	r1.WorkID, r1.Trigger = "w-1", "request"
	r2 := Result{ID: "r2", Node: "n2", Started: at, Finished: at.Add(time.Second), Status: report.Pass, Full: true, Trigger: "schedule",
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
		// Sparse: whole rows are those with findings and those of
		// MetricsOf; the others their numbers alone ("-").
		{ChecksRead{MetricsOf: []string{"ib.counters"}, Sparse: true},
			"n1/gpu.ecc: - n2/ib.counters:ib.mlx5_0.port1.link_downed_rise_count=1,ib.mlx5_0.port1.symbol_error_count=7 -"},
		{ChecksRead{MetricsOf: []string{}, Sparse: true}, "n1/gpu.ecc: - - -"},
		{ChecksRead{Sparse: true}, "n1/gpu.ecc:gpu3.ecc.dram_uncorrectable=2 n1/ib.ports: " +
			"n2/ib.counters:ib.mlx5_0.port1.link_downed_rise_count=1,ib.mlx5_0.port1.symbol_error_count=7 n2/gpu.health:gpu0.temperature_c=31"},
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
			if c.Skipped {
				if c.ResultID != "" || c.Node != "" || c.Check.Name != "" || c.Check.Findings != nil || c.Check.Metrics != nil {
					t.Errorf("read %+v: a skipped row carries more than its number: %+v", tc.read, c)
				}
				b = append(b, "-")
				continue
			}
			b = append(b, fmt.Sprintf("%s/%s:%s", c.Node, c.Check.Name, metricList(c.Check.Metrics)))
		}
		if g := strings.Join(b, " "); g != tc.want {
			t.Errorf("read %+v:\n got %s\nwant %s", tc.read, g, tc.want)
		}
		if len(got) != 4 {
			t.Errorf("read %+v: %d rows, want all 4 numbers", tc.read, len(got))
		}
		if !tc.read.Sparse || tc.read.MetricsOf == nil {
			ecc := got[0]
			if ecc.WorkID != "w-1" || ecc.ResultID != "r1" || ecc.Check.Status != report.Fail || len(ecc.Check.Findings) != 1 ||
				ecc.Check.Findings[0].Code != "ECC_UNCORRECTABLE" || !ecc.Finished.Equal(at) {
				t.Errorf("read %+v: first check %+v", tc.read, ecc)
			}
			// Each row carries its own result's work id and trigger.
			if got[0].Trigger != "request" || got[2].WorkID != "" || got[2].Trigger != "schedule" || got[3].ResultID != "r2" {
				t.Errorf("read %+v: results' fields %+v / %+v", tc.read, got[0], got[2])
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

func TestChecksAfterPagesAcrossHoles(t *testing.T) { both(t, testChecksAfterPagesAcrossHoles) }

// ChecksAfter reads windows of numbers: rows missing from the numbering
// (pruned, never committed), also more of them than a page, neither end
// a page early nor repeat a row, and every row kept is read once, in order.
func testChecksAfterPagesAcrossHoles(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	defer s.Close()
	ctx := context.Background()
	at := time.Now().Truncate(time.Millisecond)
	for i := range 12 { // 24 rows
		if _, err := s.Ingest(ctx, eccResult(fmt.Sprintf("r%02d", i), "n1", at.Add(time.Duration(i)*time.Second), report.Pass)); err != nil {
			t.Fatal(err)
		}
	}
	all, err := s.ChecksAfter(ctx, 0, 0, 100, ChecksRead{})
	if err != nil || len(all) != 24 {
		t.Fatalf("all: %d, %v", len(all), err)
	}
	// Holes: the first three rows, seven in the middle (wider than the
	// pages below), one near the end.
	var gone []int64
	for _, i := range []int{0, 1, 2, 8, 9, 10, 11, 12, 13, 14, 21} {
		gone = append(gone, all[i].Seq)
	}
	for _, seq := range gone {
		if _, err := s.w.ExecContext(ctx, `DELETE FROM check_results WHERE id = ?`, seq); err != nil {
			t.Fatal(err)
		}
	}
	var want []int64
	for _, r := range all {
		if !slices.Contains(gone, r.Seq) {
			want = append(want, r.Seq)
		}
	}
	for _, page := range []int{1, 2, 5, 100} {
		var got []int64
		after := int64(0)
		for range 100 {
			rows, err := s.ChecksAfter(ctx, after, 0, page, ChecksRead{})
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) > page {
				t.Fatalf("page %d: %d rows", page, len(rows))
			}
			for _, r := range rows {
				got = append(got, r.Seq)
				after = r.Seq
			}
			if len(rows) < page { // what a reader takes for "caught up"
				break
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("page %d: read %v, want %v", page, got, want)
		}
	}
	// Bounded above, inside the middle hole: what is below it.
	got, err := s.ChecksAfter(ctx, 0, all[10].Seq, 100, ChecksRead{})
	if err != nil || len(got) != 5 || got[4].Seq != all[7].Seq {
		t.Errorf("up to a pruned row: %d rows, %v", len(got), err)
	}
}

func TestFeedMetricsKeptAtIngest(t *testing.T) { both(t, testFeedMetricsKeptAtIngest) }

// A store with Options.Feed keeps the feed's metrics apart at ingest; a
// feed read takes them from there, and reads rows stored without them
// (before schema 7, or by a store without Feed) from their full metrics.
func testFeedMetricsKeptAtIngest(t *testing.T, be backend) {
	loc := be.loc(t)
	ctx := context.Background()
	at := time.Now().Truncate(time.Millisecond)
	counters := func(id string) Result {
		return Result{ID: id, Node: "n2", Started: at, Finished: at.Add(time.Second), Status: report.Pass, Full: true,
			Checks: []report.CheckResult{
				{Name: "ib.counters", Status: report.Pass, Findings: []report.Finding{},
					Metrics: map[string]float64{"ib.mlx5_0.port1.link_downed_rise_count": 1, "ib.mlx5_0.port1.symbol_error_count": 7}},
				{Name: "gpu.health", Status: report.Pass, Findings: []report.Finding{}, Metrics: map[string]float64{"gpu0.temperature_c": 31}},
			}}
	}
	feed := &ChecksRead{MetricsOf: []string{"ib.counters"}, KeepMetric: func(_, name string) bool { return strings.HasSuffix(name, "_rise_count") }}

	s := open(t, loc, nil)
	if _, err := s.Ingest(ctx, counters("before")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ChecksAfter(ctx, 0, 0, 100, ChecksRead{Feed: true}); err == nil {
		t.Error("a feed read from a store without Options.Feed: no error")
	}
	s.Close()

	s = open(t, loc, func(o *Options) { o.Feed = feed })
	defer s.Close()
	if _, err := s.Ingest(ctx, counters("after")); err != nil {
		t.Fatal(err)
	}
	got, err := s.ChecksAfter(ctx, 0, 0, 100, ChecksRead{Feed: true, MetricsOf: []string{}}) // Feed's own apply
	if err != nil {
		t.Fatal(err)
	}
	var b []string
	for _, c := range got {
		b = append(b, fmt.Sprintf("%s/%s:%s", c.ResultID, c.Check.Name, metricList(c.Check.Metrics)))
	}
	want := "before/ib.counters:ib.mlx5_0.port1.link_downed_rise_count=1 before/gpu.health: " +
		"after/ib.counters:ib.mlx5_0.port1.link_downed_rise_count=1 after/gpu.health:"
	if g := strings.Join(b, " "); g != want {
		t.Errorf("feed read:\n got %s\nwant %s", g, want)
	}
	// What is kept is the few numbers, not the row's metrics again.
	rows, err := s.r.QueryContext(ctx, `SELECT result_id, check_name, feed_metrics FROM check_results ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var kept []string
	for rows.Next() {
		var id, check, m string
		if err := rows.Scan(&id, &check, &m); err != nil {
			t.Fatal(err)
		}
		kept = append(kept, id+"/"+check+"="+m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	wantKept := `before/ib.counters= before/gpu.health= after/ib.counters={"ib.mlx5_0.port1.link_downed_rise_count":1} after/gpu.health={}`
	if g := strings.Join(kept, " "); g != wantKept {
		t.Errorf("kept:\n got %s\nwant %s", g, wantKept)
	}
	// The full metrics are still there for every other reader.
	all, err := s.ChecksAfter(ctx, 0, 0, 100, ChecksRead{})
	if err != nil || len(all) != 4 || len(all[2].Check.Metrics) != 2 {
		t.Fatalf("full read: %+v, %v", all, err)
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

func TestRecentChecks(t *testing.T) { both(t, testRecentChecks) }

// RecentChecks reads every node's results of the named checks since a
// time, up to a stored number, in stored order.
func testRecentChecks(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	defer s.Close()
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond)
	for _, n := range []string{"n1", "n2", "n3"} {
		if _, _, err := s.NodeJoined(ctx, Join{Node: n, At: now.Add(-time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	add := func(id, node string, ago time.Duration, checks ...string) {
		t.Helper()
		r := Result{ID: id, Node: node, Started: now.Add(-ago - time.Second), Finished: now.Add(-ago), Status: report.Pass}
		for _, c := range checks {
			r.Checks = append(r.Checks, report.CheckResult{Name: c, Status: report.Pass, Metrics: map[string]float64{"a": 1, "b": 2}})
		}
		if _, err := s.Ingest(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	add("old", "n1", 2*time.Hour, "gpu.xid")
	add("a", "n2", 30*time.Minute, "gpu.xid", "ib.ports")
	add("b", "n1", 20*time.Minute, "gpu.ecc", "gpu.xid")
	add("c", "n3", 10*time.Minute, "ib.counters")
	upTo, err := s.LastCheckSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	add("later", "n2", 0, "gpu.xid")
	keepA := ChecksRead{MetricsOf: []string{"gpu.ecc"}, KeepMetric: func(_, name string) bool { return name == "a" }}
	for _, tc := range []struct {
		since  time.Duration
		upTo   int64
		checks []string
		want   string
	}{
		{time.Hour, upTo, []string{"gpu.xid", "gpu.ecc", "ib.counters"}, "a/gpu.xid: b/gpu.ecc:a=1 b/gpu.xid: c/ib.counters:"},
		{3 * time.Hour, upTo, []string{"gpu.xid"}, "old/gpu.xid: a/gpu.xid: b/gpu.xid:"},
		{time.Hour, 0, []string{"gpu.xid"}, "a/gpu.xid: b/gpu.xid: later/gpu.xid:"},
		{15 * time.Minute, upTo, []string{"gpu.xid", "ib.counters"}, "c/ib.counters:"},
		{time.Hour, upTo, nil, ""},
	} {
		got, err := s.RecentChecks(ctx, now.Add(-tc.since), tc.upTo, tc.checks, keepA)
		if err != nil {
			t.Fatal(err)
		}
		var b []string
		for i, c := range got {
			if i > 0 && c.Seq <= got[i-1].Seq {
				t.Fatalf("out of stored order: %d after %d", c.Seq, got[i-1].Seq)
			}
			b = append(b, fmt.Sprintf("%s/%s:%s", c.ResultID, c.Check.Name, metricList(c.Check.Metrics)))
		}
		if g := strings.Join(b, " "); g != tc.want {
			t.Errorf("since %s, up to %d, %v:\n got %s\nwant %s", tc.since, tc.upTo, tc.checks, g, tc.want)
		}
	}
}

// eventChecksDay stores hours hourly results of the three event checks
// on nodes nodes (ib.counters with 96 counters, gpu.ecc with 48), ending
// at now.
func eventChecksDay(b *testing.B, s *Store, nodes, hours int, now time.Time) {
	b.Helper()
	ctx := context.Background()
	ib, ecc := map[string]float64{}, map[string]float64{}
	for i := range 8 {
		for _, c := range []string{"link_downed_rise_count", "symbol_error_count", "port_rcv_errors", "port_xmit_wait_count",
			"link_downed_count", "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
			"excessive_buffer_overrun_errors", "port_rcv_data", "port_xmit_data", "symbol_error_rise_count"} {
			ib[fmt.Sprintf("ib.mlx5_%d.port1.%s", i, c)] = float64(i)
		}
		for _, c := range []string{"volatile_correctable_count", "volatile_uncorrectable_count", "aggregate_correctable_count",
			"aggregate_uncorrectable_count", "retired_pages_sbe", "retired_pages_dbe"} {
			ecc[fmt.Sprintf("gpu%d.ecc.%s", i, c)] = 1e6 + float64(i)
		}
	}
	for i := range nodes {
		if _, _, err := s.NodeJoined(ctx, Join{Node: fmt.Sprintf("gpu-%04d", i), At: now.Add(-48 * time.Hour)}); err != nil {
			b.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	work := make(chan int)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				at := now.Add(-time.Duration(i%hours) * time.Hour)
				r := Result{ID: fmt.Sprint("r", i), Node: fmt.Sprintf("gpu-%04d", i/hours), Started: at.Add(-time.Second), Finished: at, Status: report.Pass,
					Checks: []report.CheckResult{{Name: "gpu.xid", Status: report.Pass}, {Name: "gpu.ecc", Status: report.Pass, Metrics: ecc},
						{Name: "ib.counters", Status: report.Pass, Metrics: ib}}}
				if _, err := s.Ingest(ctx, r); err != nil {
					b.Error(err)
				}
			}
		}()
	}
	for i := range nodes * hours {
		work <- i
	}
	close(work)
	wg.Wait()
}

// eventRead reads back the counters the escalation rules use.
var eventRead = ChecksRead{MetricsOf: []string{"gpu.ecc", "ib.counters"},
	KeepMetric: func(_, name string) bool {
		return strings.HasSuffix(name, ".link_downed_rise_count") || strings.HasSuffix(name, ".volatile_correctable_count")
	}}

// What a new leader reads to rebuild the escalation rules' windows: a
// day of hourly results of the three event checks on 1,000 nodes
// (72,000 rows), reading back the rules' counters only. make bench.
func BenchmarkRecentChecks(b *testing.B) {
	for _, be := range []backend{"sqlite", "postgres"} {
		b.Run(string(be), func(b *testing.B) {
			s := open(b, be.loc(b), nil)
			defer s.Close()
			ctx := context.Background()
			now := time.Now().Truncate(time.Millisecond)
			const nodes, hours = 1000, 24
			eventChecksDay(b, s, nodes, hours, now)
			b.ResetTimer()
			for b.Loop() {
				got, err := s.RecentChecks(ctx, now.Add(-25*time.Hour), 0, []string{"gpu.xid", "gpu.ecc", "ib.counters"}, eventRead)
				if err != nil || len(got) != nodes*hours*3 {
					b.Fatalf("%d rows, %v", len(got), err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/recall")
		})
	}
}

// The remediation feed's read of 2,000 stored check results (a third
// each gpu.xid, gpu.ecc, ib.counters), every metric against the
// rules' counters only. make bench.
func BenchmarkChecksAfter(b *testing.B) {
	for _, be := range []backend{"sqlite", "postgres"} {
		b.Run(string(be), func(b *testing.B) {
			s := open(b, be.loc(b), nil)
			defer s.Close()
			ctx := context.Background()
			eventChecksDay(b, s, 100, 7, time.Now().Truncate(time.Millisecond))
			for _, tc := range []struct {
				name string
				read ChecksRead
			}{{"all-metrics", ChecksRead{}}, {"rule-counters", eventRead}} {
				b.Run(tc.name, func(b *testing.B) {
					for b.Loop() {
						got, err := s.ChecksAfter(ctx, 0, 0, 2000, tc.read)
						if err != nil || len(got) != 2000 {
							b.Fatalf("%d rows, %v", len(got), err)
						}
					}
				})
			}
		})
	}
}
