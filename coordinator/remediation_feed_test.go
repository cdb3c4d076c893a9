package coordinator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// sinkRec records what the feed hands on and what it recalls, and keeps
// its cursors.
type sinkRec struct {
	seen     []string // "node check,check"
	recalled []string
	horizon  time.Duration
	cursors  map[string]string
}

func (s *sinkRec) RecallHorizon() time.Duration { return s.horizon }

func (s *sinkRec) Recall(_ context.Context, results []remediation.Observed) (int, error) {
	for _, r := range results {
		var names []string
		for _, c := range r.Checks {
			names = append(names, c.Name)
		}
		s.recalled = append(s.recalled, r.Node+" "+strings.Join(names, ","))
	}
	return len(results), nil
}

func (s *sinkRec) Observe(_ context.Context, node string, checks []report.CheckResult, _ time.Time, _ string) error {
	var names []string
	for _, c := range checks {
		names = append(names, c.Name)
	}
	s.seen = append(s.seen, node+" "+strings.Join(names, ","))
	return nil
}

// feedFindings are the findings these tests' checks come with: an Xid,
// warnings of ib.ports and gpu.pcie; any other check none. A row with no
// findings, of a check whose metrics the rules do not read (gpu.health),
// is read as its number alone and handed on with nothing.
func feedFindings(check string) []report.Finding {
	switch check {
	case "gpu.xid":
		return []report.Finding{{Severity: report.SevFail, Component: "GPU0", Code: "XID_79", Message: "fell off the bus"}}
	case "ib.ports", "gpu.pcie":
		return []report.Finding{{Severity: report.SevWarn, Component: "node", Code: "TEST", Message: "a warning"}}
	}
	return nil
}

func (s *sinkRec) Cursor(_ context.Context, name string) (string, bool, error) {
	v, ok := s.cursors[name]
	return v, ok, nil
}

func (s *sinkRec) SetCursor(_ context.Context, name, value string) error {
	s.cursors[name] = value
	return nil
}

// The feed hands on each scheduled result once, leaves campaign runs
// out, reads a gap in the stored order again until the row shows (a
// batch another coordinator had not committed), and a new term goes on
// from the kept place, not from the start.
func TestRemedFeedReadsGapsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := store.Open(ctx, store.Options{Dir: t.TempDir(), Feed: &remedFeedRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	at := time.Now().Add(-time.Minute)
	ingest := func(id, node, work string, checks ...string) {
		t.Helper()
		r := store.Result{ID: id, Node: node, WorkID: work, Started: at, Finished: at.Add(time.Second), Status: report.Pass}
		for _, c := range checks {
			r.Checks = append(r.Checks, report.CheckResult{Name: c, Status: report.Pass, Findings: feedFindings(c)})
		}
		if _, err := st.Ingest(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// Before the feed's first term: not handed on (a new install starts
	// at the end of what is stored).
	ingest("old", "n0", "", "gpu.ecc")
	sink := &sinkRec{cursors: map[string]string{}}
	f := &remedFeed{st: st, eng: sink, log: zerolog.Nop()}
	if err := f.start(ctx); err != nil {
		t.Fatal(err)
	}
	ingest("r1", "n1", "", "gpu.ecc", "gpu.health", "gpu.xid")
	ingest("r2", "n2", "", "ib.ports")
	ingest("r2b", "n2", "", "gpu.health")           // nothing in it for the ladder
	ingest("r3", "n3", "sweep-1", "nccl.allreduce") // a campaign's run
	// r2's row is not visible yet: its number is a gap.
	db := st.OpenDB()
	defer func() { _ = db.Close() }()
	var r2 int64
	if err := db.QueryRowContext(ctx, `SELECT id FROM check_results WHERE result_id = 'r2'`).Scan(&r2); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`CREATE TABLE held AS SELECT * FROM check_results WHERE id = ?`, `DELETE FROM check_results WHERE id = ?`} {
		if _, err := db.ExecContext(ctx, q, r2); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.poll(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []string{"n1 gpu.ecc,gpu.xid"}; !slices.Equal(sink.seen, want) {
		t.Fatalf("first poll handed on %q, want %q", sink.seen, want)
	}
	if len(f.gaps) != 1 || f.gaps[0].from != r2 || f.gaps[0].to != r2 {
		t.Fatalf("gaps %+v, want [%d, %d]", f.gaps, r2, r2)
	}
	// The row commits: the next poll finds it in the gap, once.
	if _, err := db.ExecContext(ctx, `INSERT INTO check_results SELECT * FROM held`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := f.poll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"n1 gpu.ecc,gpu.xid", "n2 ib.ports"}; !slices.Equal(sink.seen, want) || len(f.gaps) != 0 {
		t.Fatalf("after the gap filled: %q, gaps %+v", sink.seen, f.gaps)
	}
	last, err := st.LastCheckSeq(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := sink.cursors[remedCursor]; got != fmt.Sprint(last) {
		t.Fatalf("kept place %q, want %d", got, last)
	}
	// The next term goes on from there.
	ingest("r4", "n4", "", "gpu.pcie")
	next := &remedFeed{st: st, eng: sink, log: zerolog.Nop()}
	if err := next.start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := next.poll(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []string{"n1 gpu.ecc,gpu.xid", "n2 ib.ports", "n4 gpu.pcie"}; !slices.Equal(sink.seen, want) {
		t.Fatalf("the next term handed on %q, want %q", sink.seen, want)
	}
}

// A new term recalls, for the rules' windows, the stored scheduled
// results of the event checks within the horizon up to the kept place:
// not older ones, not campaign runs or other checks, not what is past the
// kept place (the term observes that). A new install recalls nothing, and
// observes nothing stored before it; its successors recall those too (the
// windows are history, like triage's).
func TestRemedFeedRecallsOnResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := store.Open(ctx, store.Options{Dir: t.TempDir(), Feed: &remedFeedRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	now := time.Now()
	ingest := func(id, node, work string, ago time.Duration, checks ...string) {
		t.Helper()
		// The nodes joined first, as agents do: the recall reads node by node.
		if _, _, err := st.NodeJoined(ctx, store.Join{Node: node, At: now.Add(-3 * time.Hour)}); err != nil {
			t.Fatal(err)
		}
		r := store.Result{ID: id, Node: node, WorkID: work, Started: now.Add(-ago - time.Second), Finished: now.Add(-ago), Status: report.Pass}
		for _, c := range checks {
			r.Checks = append(r.Checks, report.CheckResult{Name: c, Status: report.Pass, Findings: feedFindings(c),
				Metrics: map[string]float64{"ib.mlx5_0.port1.link_downed_rise_count": 1, "gpu0.power_w": 70}})
		}
		if _, err := st.Ingest(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	ingest("before", "n9", "", time.Minute, "gpu.xid")
	sink := &sinkRec{cursors: map[string]string{}, horizon: time.Hour}
	f := &remedFeed{st: st, eng: sink, log: zerolog.Nop()}
	if err := f.start(ctx); err != nil {
		t.Fatal(err)
	}
	if len(sink.recalled) != 0 {
		t.Fatalf("a new install recalled %q", sink.recalled)
	}
	ingest("old", "n0", "", 2*time.Hour, "gpu.xid")
	ingest("r1", "n1", "", time.Minute, "gpu.xid", "ib.ports", "ib.counters")
	ingest("r2", "n2", "", time.Minute, "gpu.ecc")
	ingest("r3", "n3", "sweep-1", time.Minute, "gpu.xid")
	if err := f.poll(ctx); err != nil {
		t.Fatal(err)
	}
	ingest("r4", "n4", "", 0, "gpu.xid")
	next := &remedFeed{st: st, eng: sink, log: zerolog.Nop()}
	if err := next.start(ctx); err != nil {
		t.Fatal(err)
	}
	if want := []string{"n9 gpu.xid", "n1 gpu.xid,ib.counters", "n2 gpu.ecc"}; !slices.Equal(sink.recalled, want) {
		t.Fatalf("recalled %q, want %q", sink.recalled, want)
	}
	if err := next.poll(ctx); err != nil {
		t.Fatal(err)
	}
	if want := "n4 gpu.xid"; sink.seen[len(sink.seen)-1] != want || slices.Contains(sink.seen, "n9 gpu.xid") {
		t.Fatalf("observed %q, want %q last and nothing from before the install", sink.seen, want)
	}
}
