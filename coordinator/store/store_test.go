package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestMain(m *testing.M) { pgtest.Main(m) }

// backend is the database a conformance test runs on.
type backend string

// both runs a conformance test on SQLite and on PostgreSQL.
func both(t *testing.T, f func(t *testing.T, b backend)) {
	t.Parallel()
	for _, b := range []backend{"sqlite", "postgres"} {
		t.Run(string(b), func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

// loc is a new, empty place for a store: a data directory, or the URL of
// a fresh PostgreSQL database. open takes either.
func (b backend) loc(t testing.TB) string {
	if b == "postgres" {
		return pgtest.URL(t)
	}
	return t.TempDir()
}

func open(t testing.TB, dir string, mod func(*Options)) *Store {
	t.Helper()
	o := Options{Dir: dir, Logger: zerolog.Nop()}
	if strings.HasPrefix(dir, "postgres://") {
		o = Options{URL: dir, Logger: zerolog.Nop()}
	}
	if mod != nil {
		mod(&o)
	}
	s, err := Open(context.Background(), o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func eccResult(id, node string, at time.Time, st report.Status) Result {
	c := report.CheckResult{Name: "gpu.ecc", Status: st, DurationMS: 1.5, Findings: []report.Finding{},
		Metrics: map[string]float64{"gpu3.ecc.dram_uncorrectable": 0}}
	if st == report.Fail {
		c.Findings = []report.Finding{{Severity: report.SevFail, Component: "GPU3", Code: "ECC_UNCORRECTABLE",
			Message: "2 uncorrectable DRAM errors", Action: report.ActionReplace}}
		c.Metrics["gpu3.ecc.dram_uncorrectable"] = 2
	}
	return Result{ID: id, Node: node, Started: at.Add(-time.Second), Finished: at, Status: st, Full: true,
		Checks: []report.CheckResult{c, {Name: "ib.ports", Status: report.Pass, Findings: []report.Finding{}}}}
}

func TestIngestDedupeReturnsOriginalAck(t *testing.T) { both(t, testIngestDedupeReturnsOriginalAck) }

func testIngestDedupeReturnsOriginalAck(t *testing.T, be backend) {
	clk := newClock()
	s := open(t, be.loc(t), func(o *Options) { o.Now = clk.Now })
	defer s.Close()
	ctx := context.Background()

	first, err := s.Ingest(ctx, eccResult("r1", "gpu-001", clk.Now(), report.Fail))
	if err != nil {
		t.Fatal(err)
	}
	if first.Duplicate || first.ResultID != "r1" || !first.Stored.Equal(clk.Now()) {
		t.Fatalf("first ack = %+v", first)
	}
	clk.Add(time.Minute)
	again, err := s.Ingest(ctx, eccResult("r1", "gpu-001", clk.Now(), report.Fail))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Duplicate || !again.Stored.Equal(first.Stored) {
		t.Fatalf("duplicate ack = %+v, want the original stored time %v", again, first.Stored)
	}
	if _, err := s.Ingest(ctx, eccResult("r1", "gpu-002", clk.Now(), report.Pass)); !errors.Is(err, ErrIDConflict) {
		t.Fatalf("same id from another node: err = %v, want ErrIDConflict", err)
	}
	c, err := s.Count(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.Results != 1 || c.CheckResults != 2 {
		t.Fatalf("counts = %+v, want 1 result with 2 check rows", c)
	}
	got, err := s.Results(ctx, ResultQuery{Node: "gpu-001", Check: "gpu.ecc"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Check.Status != report.Fail || len(got[0].Check.Findings) != 1 ||
		got[0].Check.Findings[0].Code != "ECC_UNCORRECTABLE" || got[0].Check.Metrics["gpu3.ecc.dram_uncorrectable"] != 2 {
		t.Fatalf("results = %+v", got)
	}
	sum, err := s.Summaries(ctx, "gpu-001", "gpu.ecc")
	if err != nil {
		t.Fatal(err)
	}
	if len(sum) != 1 || sum[0].Fail != 1 || sum[0].Day != "2025-06-01" {
		t.Fatalf("summaries = %+v (a duplicate must not count twice)", sum)
	}
}

func TestIngestRejectsInvalid(t *testing.T) { both(t, testIngestRejectsInvalid) }

func testIngestRejectsInvalid(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	defer s.Close()
	for name, r := range map[string]Result{
		"no id":        {Node: "n", Status: report.Pass},
		"no node":      {ID: "x", Status: report.Pass},
		"bad status":   {ID: "x", Node: "n", Status: "green"},
		"skip overall": {ID: "x", Node: "n", Status: report.Skip},
		"dup check":    {ID: "x", Node: "n", Status: report.Pass, Checks: []report.CheckResult{{Name: "a", Status: report.Pass}, {Name: "a", Status: report.Pass}}},
		"check status": {ID: "x", Node: "n", Status: report.Pass, Checks: []report.CheckResult{{Name: "a", Status: "ok"}}},
	} {
		if _, err := s.Ingest(context.Background(), r); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

func TestBatchCommit(t *testing.T) { both(t, testBatchCommit) }

func testBatchCommit(t *testing.T, be backend) {
	// A long linger makes the grouping certain: 200 concurrent results
	// must share a handful of transactions.
	s := open(t, be.loc(t), func(o *Options) { o.MaxBatch = 64; o.BatchDelay = 50 * time.Millisecond })
	defer s.Close()
	ctx := context.Background()
	const n = 200
	acks := make([]Ack, n+1)
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for i := 0; i <= n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("r%03d", i%n) // r000 twice: once as i=0, once as i=n
			acks[i], errs[i] = s.Ingest(ctx, eccResult(id, "gpu-001", time.Now(), report.Pass))
		}()
	}
	wg.Wait()
	dups := 0
	for i := range acks {
		if errs[i] != nil {
			t.Fatalf("ingest %d: %v", i, errs[i])
		}
		if acks[i].Duplicate {
			dups++
		}
	}
	if dups != 1 {
		t.Errorf("%d duplicate acks, want 1", dups)
	}
	if !acks[0].Stored.Equal(acks[n].Stored) {
		t.Errorf("the two acks of r000 differ: %v and %v", acks[0].Stored, acks[n].Stored)
	}
	st := s.Stats()
	if st.Results != n+1 {
		t.Errorf("writer saw %d results, want %d", st.Results, n+1)
	}
	if st.Batches > 10 {
		t.Errorf("%d transactions for %d results: not batched", st.Batches, n+1)
	}
	c, _ := s.Count(ctx)
	if c.Results != n || c.CheckResults != 2*n {
		t.Errorf("counts = %+v", c)
	}
}

func TestNewestCheckWinsAndState(t *testing.T) { both(t, testNewestCheckWinsAndState) }

func testNewestCheckWinsAndState(t *testing.T, be backend) {
	clk := newClock()
	s := open(t, be.loc(t), func(o *Options) { o.Now = clk.Now })
	defer s.Close()
	ctx := context.Background()
	n, existed, err := s.NodeJoined(ctx, Join{Node: "gpu-001", Labels: map[string]string{"sku": "h100"},
		AgentVersion: "1.2.3", ProtocolVersion: "1.0", At: clk.Now(), InitialState: "initializing", InitialReason: "joined"})
	if err != nil {
		t.Fatal(err)
	}
	if existed || n.State != "initializing" || !n.Connected || n.Labels["sku"] != "h100" || n.HasFull {
		t.Fatalf("joined node = %+v existed=%v", n, existed)
	}
	now := clk.Now()
	if _, err := s.Ingest(ctx, eccResult("new", "gpu-001", now, report.Fail)); err != nil {
		t.Fatal(err)
	}
	// An older result delivered late from an agent's spool.
	if _, err := s.Ingest(ctx, eccResult("old", "gpu-001", now.Add(-time.Hour), report.Pass)); err != nil {
		t.Fatal(err)
	}
	n, err = s.Node(ctx, "gpu-001")
	if err != nil {
		t.Fatal(err)
	}
	if !n.HasFull || len(n.Checks) != 2 {
		t.Fatalf("node = %+v", n)
	}
	SortChecksWorstFirst(n.Checks)
	if c := n.Checks[0]; c.Name != "gpu.ecc" || c.Status != report.Fail || c.ResultID != "new" || c.Detail != "GPU3 ECC_UNCORRECTABLE" {
		t.Fatalf("newest gpu.ecc = %+v", c)
	}

	changed, err := s.SetNodeState(ctx, StateChange{Node: "gpu-001", State: "failed", Reason: "gpu.ecc fail: GPU3 ECC_UNCORRECTABLE", Actor: "coordinator", At: now})
	if err != nil || !changed {
		t.Fatalf("SetNodeState: changed=%v err=%v", changed, err)
	}
	changed, err = s.SetNodeState(ctx, StateChange{Node: "gpu-001", State: "failed", Reason: "same state", Actor: "coordinator", At: now})
	if err != nil || changed {
		t.Fatalf("same state again: changed=%v err=%v", changed, err)
	}
	off := false
	if _, err := s.SetNodeState(ctx, StateChange{Node: "gpu-001", State: "unreachable", Reason: "stream lost", Connected: &off, At: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetNodeState(ctx, StateChange{Node: "nope", State: "failed"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown node: %v", err)
	}
	ev, err := s.Events(ctx, EventQuery{Node: "gpu-001"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ev) != 2 || ev[0].Message != "initializing -> failed: gpu.ecc fail: GPU3 ECC_UNCORRECTABLE" ||
		ev[1].Message != "failed -> unreachable: stream lost" || ev[0].Kind != EventStateChange {
		t.Fatalf("events = %+v", ev)
	}
	n, _ = s.Node(ctx, "gpu-001")
	if n.Connected || n.State != "unreachable" || !n.LastSeen.Equal(now.Add(time.Minute)) {
		t.Fatalf("after loss: %+v", n)
	}
	if _, existed, err = s.NodeJoined(ctx, Join{Node: "gpu-001", At: now}); err != nil || !existed {
		t.Fatalf("rejoin: existed=%v err=%v", existed, err)
	}
	ids, err := s.KnownResultIDs(ctx, "gpu-001", now.Add(-2*time.Hour), 10)
	if err != nil || strings.Join(ids, ",") != "new,old" {
		t.Fatalf("known ids = %v, %v", ids, err)
	}
}

func TestInventoryHistory(t *testing.T) { both(t, testInventoryHistory) }

func testInventoryHistory(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	defer s.Close()
	ctx := context.Background()
	inv := report.Inventory{DriverVersion: "550.54.15", GPUs: []report.GPU{{Index: 0, Serial: "S0"}},
		HCAs: []report.HCA{{Name: "mlx5_0", FWVersion: "28.39.1002", Ports: []report.Port{{Port: 1, State: "ACTIVE", RateGbps: 400}}}}}
	t0 := time.Now()
	if _, _, err := s.NodeJoined(ctx, Join{Node: "n1", Inventory: &inv, At: t0, InitialState: "initializing"}); err != nil {
		t.Fatal(err)
	}
	// A port going down is not an inventory change; a driver upgrade is.
	down := inv
	down.HCAs = []report.HCA{{Name: "mlx5_0", FWVersion: "28.39.1002", Ports: []report.Port{{Port: 1, State: "DOWN"}}}}
	r := eccResult("a", "n1", t0.Add(time.Second), report.Pass)
	r.Inventory = &down
	if _, err := s.Ingest(ctx, r); err != nil {
		t.Fatal(err)
	}
	up := inv
	up.DriverVersion = "570.86.15"
	r = eccResult("b", "n1", t0.Add(2*time.Second), report.Pass)
	r.Inventory = &up
	if _, err := s.Ingest(ctx, r); err != nil {
		t.Fatal(err)
	}
	h, err := s.InventoryHistory(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 2 || h[0].Inventory.DriverVersion != "550.54.15" || h[1].Inventory.DriverVersion != "570.86.15" {
		t.Fatalf("history = %+v", h)
	}
	n, _ := s.Node(ctx, "n1")
	if n.Inventory.DriverVersion != "570.86.15" {
		t.Fatalf("current inventory = %+v", n.Inventory)
	}
}

func TestRetentionKeepsSummariesAndEvents(t *testing.T) {
	both(t, testRetentionKeepsSummariesAndEvents)
}

func testRetentionKeepsSummariesAndEvents(t *testing.T, be backend) {
	clk := newClock()
	s := open(t, be.loc(t), func(o *Options) { o.Now = clk.Now })
	defer s.Close()
	ctx := context.Background()
	old := clk.Now()
	for i := 0; i < 5; i++ {
		if _, err := s.Ingest(ctx, eccResult(fmt.Sprintf("old%d", i), "n1", old, report.Fail)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddEvent(ctx, Event{Time: old, Node: "n1", Kind: EventOperatorAction, Message: "old"}); err != nil {
		t.Fatal(err)
	}
	clk.Add(40 * 24 * time.Hour)
	now := clk.Now()
	for i := 0; i < 5; i++ {
		if _, err := s.Ingest(ctx, eccResult(fmt.Sprintf("new%d", i), "n1", now, report.Pass)); err != nil {
			t.Fatal(err)
		}
	}
	// Late delivery: stored now, finished long ago; retention goes by
	// when the coordinator stored it.
	if _, err := s.Ingest(ctx, eccResult("late", "n1", old, report.Pass)); err != nil {
		t.Fatal(err)
	}
	st, err := s.Prune(ctx, now.AddDate(0, 0, -30))
	if err != nil {
		t.Fatal(err)
	}
	if st.Results != 5 || st.CheckResults != 10 {
		t.Fatalf("pruned %+v, want 5 results and 10 check rows", st)
	}
	c, _ := s.Count(ctx)
	if c.Results != 6 || c.CheckResults != 12 || c.Events != 1 {
		t.Fatalf("after prune: %+v", c)
	}
	if st, err := s.Prune(ctx, now.AddDate(0, 0, -30)); err != nil || st.Results != 0 {
		t.Fatalf("second prune: %+v %v", st, err)
	}
	sums, _ := s.Summaries(ctx, "n1", "gpu.ecc")
	if len(sums) != 2 || sums[0].Fail != 5 || sums[0].Pass != 1 || sums[1].Pass != 5 {
		t.Fatalf("summaries after prune = %+v", sums)
	}
	if _, err := s.Result(ctx, "old0"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("old0 still there: %v", err)
	}
}

// Before schema 8 every stored check result was added to its day's
// summary at ingest; from 8 a summary holds only what retention folded in
// and a read adds the rows still kept. Migrating takes the kept rows out
// of the summaries, so nothing is counted twice.
func TestMigrationToV8CountsEachCheckResultOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	sdb := openDB(writerDSN(filepath.Join(dir, FileName), "rwc"))
	sdb.SetMaxOpenConns(1)
	db := sqldb.Wrap(sdb, sqldb.SQLite, nil)
	if err := migrate(ctx, db, 7, time.Now); err != nil {
		t.Fatal(err)
	}
	day := time.Date(2025, 5, 20, 10, 0, 0, 0, time.UTC).UnixMilli()
	for _, q := range []string{
		// 20 May: 3 fails were pruned long ago, 1 fail and 1 pass are kept;
		// 19 May: all pruned; the summaries, as ingest wrote them, count all.
		`INSERT INTO check_results (result_id, node, check_name, status, finished, stored, duration_ms) VALUES ('r1', 'n1', 'gpu.ecc', 'fail', ` + fmt.Sprint(day) + `, 1, 2)`,
		`INSERT INTO check_results (result_id, node, check_name, status, finished, stored, duration_ms) VALUES ('r2', 'n1', 'gpu.ecc', 'pass', ` + fmt.Sprint(day) + `, 1, 3)`,
		`INSERT INTO check_summaries (node, check_name, day, pass, fail, duration_ms_total) VALUES ('n1', 'gpu.ecc', '2025-05-20', 1, 4, 13)`,
		`INSERT INTO check_summaries (node, check_name, day, pass, fail, duration_ms_total) VALUES ('n1', 'gpu.ecc', '2025-05-19', 7, 0, 70)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()

	s := open(t, dir, nil)
	defer s.Close()
	sums, err := s.Summaries(ctx, "n1", "gpu.ecc")
	if err != nil {
		t.Fatal(err)
	}
	want := []Summary{
		{Node: "n1", Check: "gpu.ecc", Day: "2025-05-19", Pass: 7, DurationMSTotal: 70},
		{Node: "n1", Check: "gpu.ecc", Day: "2025-05-20", Pass: 1, Fail: 4, DurationMSTotal: 13},
	}
	if !slices.Equal(sums, want) {
		t.Fatalf("summaries after migrating = %+v, want %+v", sums, want)
	}
	// Retention folds the kept rows in: the same counts, now all folded.
	if _, err := s.Prune(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if sums, _ = s.Summaries(ctx, "n1", "gpu.ecc"); !slices.Equal(sums, want) {
		t.Fatalf("summaries after retention = %+v, want %+v", sums, want)
	}
	if c, _ := s.Count(ctx); c.CheckResults != 0 || c.Summaries != 2 {
		t.Fatalf("after retention: %+v", c)
	}
}

func TestMigrationFromV1(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	// Build a database the way version 1 left it.
	sdb := openDB(writerDSN(filepath.Join(dir, FileName), "rwc"))
	sdb.SetMaxOpenConns(1)
	db := sqldb.Wrap(sdb, sqldb.SQLite, nil)
	if err := migrate(ctx, db, 1, time.Now); err != nil {
		t.Fatal(err)
	}
	day := time.Date(2025, 5, 20, 10, 0, 0, 0, time.UTC).UnixMilli()
	for _, q := range []string{
		`INSERT INTO nodes (name, state, inventory, last_seen) VALUES ('n1', 'healthy', '{"driver_version":"550.54.15","gpus":[{"index":0,"serial":"S0"}],"hcas":[]}', ` + fmt.Sprint(day) + `)`,
		`INSERT INTO results (id, node, started, finished, status, full, stored) VALUES ('r1', 'n1', 0, ` + fmt.Sprint(day) + `, 'fail', 1, 1)`,
		`INSERT INTO check_results (result_id, node, check_name, status, finished, stored, duration_ms) VALUES ('r1', 'n1', 'gpu.ecc', 'fail', ` + fmt.Sprint(day) + `, 1, 2)`,
		`INSERT INTO check_results (result_id, node, check_name, status, finished, stored) VALUES ('r1', 'n1', 'ib.ports', 'pass', ` + fmt.Sprint(day) + `, 1)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if v, _ := schemaVersion(ctx, db); v != 1 {
		t.Fatalf("built version %d, want 1", v)
	}
	db.Close()

	s := open(t, dir, nil)
	defer s.Close()
	v, err := s.SchemaVersion(ctx)
	if err != nil || v != len(migrations()) {
		t.Fatalf("schema version %d (%v), want %d", v, err, len(migrations()))
	}
	sums, err := s.Summaries(ctx, "n1", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(sums) != 2 || sums[0].Check != "gpu.ecc" || sums[0].Fail != 1 || sums[0].Day != "2025-05-20" || sums[0].DurationMSTotal != 2 {
		t.Fatalf("backfilled summaries = %+v", sums)
	}
	h, err := s.InventoryHistory(ctx, "n1")
	if err != nil || len(h) != 1 || h[0].Inventory.DriverVersion != "550.54.15" {
		t.Fatalf("seeded history = %+v, %v", h, err)
	}
	// The seeded row's hash is real: the same inventory adds no row.
	r := eccResult("r2", "n1", time.Now(), report.Pass)
	r.Inventory = &h[0].Inventory
	if _, err := s.Ingest(ctx, r); err != nil {
		t.Fatal(err)
	}
	if h, _ = s.InventoryHistory(ctx, "n1"); len(h) != 1 {
		t.Fatalf("history grew on an unchanged inventory: %d rows", len(h))
	}
	if got, err := s.Results(ctx, ResultQuery{Node: "n1", Limit: 10}); err != nil || len(got) != 4 {
		t.Fatalf("results after upgrade: %d, %v", len(got), err)
	}
}

func TestSchemaTooNew(t *testing.T) { both(t, testSchemaTooNew) }

func testSchemaTooNew(t *testing.T, be backend) {
	dir := be.loc(t)
	s := open(t, dir, nil)
	if _, err := s.w.ExecContext(context.Background(), `INSERT INTO schema_version (version, name, applied_at) VALUES (99, 'future', 0)`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	o := Options{Dir: dir}
	if be == "postgres" {
		o = Options{URL: dir}
	}
	if _, err := Open(context.Background(), o); !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("Open = %v, want ErrSchemaTooNew", err)
	}
}

func TestBackupWhileIngesting(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir, nil)
	defer s.Close()
	ctx := context.Background()
	for i := 0; i < 50; i++ {
		if _, err := s.Ingest(ctx, eccResult(fmt.Sprintf("r%d", i), "n1", time.Now(), report.Pass)); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { // the store keeps taking results during the backup
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if _, err := s.Ingest(ctx, eccResult(fmt.Sprintf("more%d", i), "n1", time.Now(), report.Pass)); err != nil {
				done <- err
				return
			}
		}
	}()
	out := t.TempDir()
	dest := filepath.Join(out, FileName)
	if err := s.Backup(ctx, dest); err != nil {
		t.Fatal(err)
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := s.Backup(ctx, dest); err == nil {
		t.Fatal("backup over an existing file succeeded")
	}
	b := open(t, out, nil)
	defer b.Close()
	c, err := b.Count(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.Results < 50 || c.CheckResults != 2*c.Results {
		t.Fatalf("backup holds %+v: want at least 50 whole results", c)
	}
	// And from the data directory, as `fleetcheck coordinator backup` does.
	dest2 := filepath.Join(t.TempDir(), "copy.db")
	if err := BackupDir(ctx, dir, dest2); err != nil {
		t.Fatal(err)
	}
	if err := BackupDir(ctx, t.TempDir(), filepath.Join(t.TempDir(), "x.db")); !errors.Is(err, ErrNotInitialized) {
		t.Fatalf("backup of an empty dir: %v", err)
	}
}

func TestBackupOnPostgresNamesPgDump(t *testing.T) {
	t.Parallel()
	s := open(t, pgtest.URL(t), nil)
	defer s.Close()
	dest := filepath.Join(t.TempDir(), "x.db")
	if err := s.Backup(context.Background(), dest); !errors.Is(err, ErrBackupPostgres) || !strings.Contains(err.Error(), "pg_dump") {
		t.Fatalf("Backup on PostgreSQL: %v", err)
	}
	if _, err := os.Stat(dest); !os.IsNotExist(err) {
		t.Fatalf("a refused backup left %s", dest)
	}
}

// On PostgreSQL a check result's metrics past 2 KB are compressed with
// lz4 (schema 9; schema 6 had taken the slower pglz off), small ones are
// stored as sent, and all read back whole.
func TestPostgresCompressesLargeMetricsWithLZ4(t *testing.T) {
	t.Parallel()
	s := open(t, pgtest.URL(t), nil)
	defer s.Close()
	ctx := context.Background()
	metrics := func(n int) map[string]float64 {
		m := make(map[string]float64, n)
		for i := range n {
			m[fmt.Sprintf("mlx5_%d.port1.counter_%03d", i%8, i)] = float64(i) * 1.5
		}
		return m
	}
	r := eccResult("r1", "gpu-001", time.Now(), report.Pass)
	r.Checks[0].Metrics = metrics(180) // ~7 KB of JSON, as ib.counters sends
	r.Checks[1].Metrics = metrics(20)  // well under 2 KB
	if _, err := s.Ingest(ctx, r); err != nil {
		t.Fatal(err)
	}
	rows, err := s.w.QueryContext(ctx, `SELECT check_name, length(metrics), COALESCE(pg_column_compression(metrics), '')
		FROM check_results WHERE result_id = 'r1' ORDER BY check_name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]string{}
	for rows.Next() {
		var name, compression string
		var n int
		if err := rows.Scan(&name, &n, &compression); err != nil {
			t.Fatal(err)
		}
		got[name] = compression
		t.Logf("%s: %d bytes of metrics, compression %q", name, n, compression)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if got["gpu.ecc"] != "lz4" || got["ib.ports"] != "" {
		t.Fatalf("compression by check = %q, want gpu.ecc's ~7 KB in lz4 and ib.ports' few hundred bytes as sent", got)
	}
	back, err := s.LoadResult(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Checks) != 2 {
		t.Fatalf("read back %d check results, want 2", len(back.Checks))
	}
	for i, c := range back.Checks {
		if want := r.Checks[i].Metrics; !maps.Equal(c.Metrics, want) {
			t.Fatalf("%s read back %d metrics unlike the %d sent", c.Name, len(c.Metrics), len(want))
		}
	}
}

func TestClosedStore(t *testing.T) { both(t, testClosedStore) }

func testClosedStore(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ingest(context.Background(), eccResult("r", "n", time.Now(), report.Pass)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ingest after Close = %v", err)
	}
}

// TestCrashKeepsAcknowledged runs a child process that ingests results,
// prints each acknowledged id, and kills itself with SIGKILL: no Close, no
// checkpoint. Every id it printed must be in the database afterwards.
func TestCrashKeepsAcknowledged(t *testing.T) {
	if dir := os.Getenv("FLEETCHECK_STORE_CRASH_DIR"); dir != "" {
		crashChild(dir)
		return
	}
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashKeepsAcknowledged$")
	cmd.Env = append(os.Environ(), "FLEETCHECK_STORE_CRASH_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "acked "); ok {
			acked = append(acked, id)
		}
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child did not die by SIGKILL: %v", err)
	}
	if len(acked) < 100 {
		t.Fatalf("child acknowledged only %d results", len(acked))
	}
	if _, err := os.Stat(filepath.Join(dir, FileName+"-wal")); err != nil {
		t.Fatalf("no WAL left behind, the crash was not simulated: %v", err)
	}
	s := open(t, dir, nil)
	defer s.Close()
	for _, id := range acked {
		if _, err := s.Result(context.Background(), id); err != nil {
			t.Fatalf("acknowledged %s lost: %v", id, err)
		}
	}
}

func crashChild(dir string) {
	s, err := Open(context.Background(), Options{Dir: dir, Logger: zerolog.Nop()})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(3)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				id := fmt.Sprintf("w%d-%d", w, i)
				if _, err := s.Ingest(context.Background(), eccResult(id, "n1", time.Now(), report.Pass)); err != nil {
					fmt.Println("ingest:", err)
					os.Exit(3)
				}
				mu.Lock()
				fmt.Println("acked", id)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	os.Stdout.Sync()
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

func TestOneStorePerDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir, nil)
	if _, err := Open(context.Background(), Options{Dir: dir}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open of one directory: %v, want ErrLocked", err)
	}
	s.Close()
	s = open(t, dir, nil) // released by Close
	s.Close()
}

// The PostgreSQL store's reads plan every statement afresh (a generic
// plan cached while a table was small outlives its growth).
func TestPostgresReadsPlanEachStatement(t *testing.T) {
	t.Parallel()
	s := open(t, pgtest.URL(t), nil)
	defer s.Close()
	var mode string
	if err := s.r.QueryRowContext(context.Background(), `SELECT current_setting('plan_cache_mode')`).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if mode != "force_custom_plan" {
		t.Fatalf("reads' plan_cache_mode = %q, want force_custom_plan", mode)
	}
}
