package baselines

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

func openDB(t testing.TB) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fleetcheck.db")
	db, err := sql.Open("sqlite3", path+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// clock is a test clock that moves a second per reading.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

func newStore(t testing.TB) *Store {
	t.Helper()
	c := &clock{t: time.Date(2026, 3, 1, 2, 0, 0, 0, time.UTC)}
	s, err := NewStore(openDB(t), WithClock(c.now))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMain(m *testing.M) { pgtest.Main(m) }

// both runs a test on SQLite and on PostgreSQL.
func both(t *testing.T, f func(t *testing.T, be string)) {
	t.Parallel()
	for _, be := range []string{"sqlite", "postgres"} {
		t.Run(be, func(t *testing.T) {
			t.Parallel()
			f(t, be)
		})
	}
}

// newStoreOn is newStore on the named database.
func newStoreOn(t testing.TB, be string) *Store {
	t.Helper()
	if be != "postgres" {
		return newStore(t)
	}
	db, err := sqldb.Open(t.Context(), pgtest.URL(t), sqldb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	c := &clock{t: time.Date(2026, 3, 1, 2, 0, 0, 0, time.UTC)}
	s, err := NewSQLStore(db, WithClock(c.now))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func nodeKey(node string) Key {
	return Key{Metric: MetricAllReduceBusBW, Scope: NodeScope(node), Stack: Stack{Driver: "535.161.08", NCCL: "2.21.5"}}
}

func sampled(k Key, vals ...float64) Baseline {
	st, err := NewStats(vals)
	if err != nil {
		panic(err)
	}
	return Baseline{Key: k, Direction: HigherBetter, Samples: st, Who: "alice", FromRun: "run-1", Note: "acceptance"}
}

func TestNewStoreIdempotentAndVersioned(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	for range 2 {
		if _, err := NewStore(db); err != nil {
			t.Fatal(err)
		}
	}
	var n, v int
	if err := db.QueryRow(`SELECT COUNT(*), MAX(version) FROM baselines_schema_version`).Scan(&n, &v); err != nil {
		t.Fatal(err)
	}
	if n != 1 || v != SchemaVersion {
		t.Errorf("schema rows %d, version %d", n, v)
	}
	if _, err := db.Exec(`INSERT INTO baselines_schema_version (version, applied_at) VALUES (?, 'later')`, SchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStore(db); !errors.Is(err, ErrSchemaTooNew) {
		t.Errorf("newer schema: %v, want ErrSchemaTooNew", err)
	}
}

func TestHistoryKeepsEveryVersion(t *testing.T) { both(t, testHistoryKeepsEveryVersion) }

func testHistoryKeepsEveryVersion(t *testing.T, be string) {
	ctx := t.Context()
	s := newStoreOn(t, be)
	k := nodeKey("gpu-017")
	for i, v := range []float64{470, 480, 490} {
		got, err := s.Set(ctx, sampled(k, v-1, v, v+1))
		if err != nil {
			t.Fatal(err)
		}
		if got != i+1 {
			t.Errorf("version %d, want %d", got, i+1)
		}
	}
	b, err := s.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if b.Version != 3 || b.Value != 490 || b.Samples.Count != 3 || b.Samples.MAD != 1 {
		t.Errorf("latest %v, samples %+v", b, b.Samples)
	}
	h, err := s.History(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 3 {
		t.Fatalf("%d versions, want 3", len(h))
	}
	for i, want := range []float64{470, 480, 490} {
		if h[i].Version != i+1 || h[i].Value != want || h[i].Who != "alice" || h[i].FromRun != "run-1" || h[i].Note != "acceptance" {
			t.Errorf("version %d: %v (%q %q %q)", i+1, h[i], h[i].Who, h[i].FromRun, h[i].Note)
		}
		if h[i].TakenAt.IsZero() {
			t.Errorf("version %d has no time", i+1)
		}
	}
	if !h[0].TakenAt.Before(h[2].TakenAt) {
		t.Errorf("times %v, %v not increasing", h[0].TakenAt, h[2].TakenAt)
	}
	// Another stack is another key, with its own versions.
	other := k
	other.Stack.Driver = "550.54.15"
	if v, err := s.Set(ctx, sampled(other, 400)); err != nil || v != 1 {
		t.Errorf("other stack: version %d, %v", v, err)
	}
	if _, err := s.Get(ctx, nodeKey("gpu-018")); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing key: %v", err)
	}
	if _, err := s.History(ctx, nodeKey("gpu-018")); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing history: %v", err)
	}
}

func TestSetValidates(t *testing.T) { both(t, testSetValidates) }

func testSetValidates(t *testing.T, be string) {
	ctx := t.Context()
	s := newStoreOn(t, be)
	k := nodeKey("gpu-1")
	bad := map[string]Baseline{
		"no samples":     {Key: k, Direction: HigherBetter, Value: 480},
		"value ≠ median": func() Baseline { b := sampled(k, 470, 480, 490); b.Value = 470; return b }(),
		"no direction":   func() Baseline { b := sampled(k, 480); b.Direction = ""; return b }(),
		"bad scope":      sampled(Key{Metric: MetricAllReduceBusBW, Scope: "rack:r1"}, 480),
		"bad metric":     sampled(Key{Metric: "BusBW", Scope: NodeScope("a")}, 480),
		"zero median":    sampled(k, 0, 0, 0),
		"threshold":      func() Baseline { b := sampled(k, 480); b.Threshold = -0.1; return b }(),
		"control char":   func() Baseline { b := sampled(k, 480); b.Who = "a\x00b"; return b }(),
		"year 10000": func() Baseline {
			b := sampled(k, 480)
			b.TakenAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
			return b
		}(),
		"values outside": func() Baseline { b := sampled(k, 480); b.Samples.Values = []float64{1000}; return b }(),
	}
	for name, b := range bad {
		if _, err := s.Set(ctx, b); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if got, err := s.List(ctx, Filter{AllVersions: true}); err != nil || len(got) != 0 {
		t.Errorf("invalid sets stored %d rows (%v)", len(got), err)
	}
}

func TestRecordTakesTheMedianAndCarriesSettings(t *testing.T) {
	both(t, testRecordTakesTheMedianAndCarriesSettings)
}

func testRecordTakesTheMedianAndCarriesSettings(t *testing.T, be string) {
	ctx := t.Context()
	s := newStoreOn(t, be)
	k := nodeKey("gpu-017")
	b, err := s.Record(ctx, k, []float64{490, 470, 300, 481, 480}, "bob", "run-7", "nightly")
	if err != nil {
		t.Fatal(err)
	}
	if b.Value != 480 || b.Samples.MAD != 10 || b.Version != 1 || b.Direction != HigherBetter || b.Threshold != 0 {
		t.Errorf("recorded %v %+v threshold %v", b, b.Samples, b.Threshold)
	}
	set := sampled(k, 475)
	set.Threshold = 0.2
	if _, err := s.Set(ctx, set); err != nil {
		t.Fatal(err)
	}
	b, err = s.Record(ctx, k, []float64{478, 482}, "bob", "run-8", "")
	if err != nil {
		t.Fatal(err)
	}
	if b.Version != 3 || b.Value != 480 || b.Threshold != 0.2 {
		t.Errorf("second record %v threshold %v: the threshold carries over", b, b.Threshold)
	}
	got, err := s.Get(ctx, k)
	if err != nil || got.Version != 3 || got.FromRun != "run-8" {
		t.Errorf("stored %v %q, %v", got, got.FromRun, err)
	}
	lat := Key{Metric: "nccl.sendrecv.latency_us", Scope: NodeScope("gpu-017")}
	if b, err := s.Record(ctx, lat, []float64{9, 10, 11}, "bob", "", ""); err != nil || b.Direction != LowerBetter {
		t.Errorf("latency record: %v %v", b, err)
	}
	unitless := Key{Metric: "nccl.allreduce.wrong_count", Scope: NodeScope("gpu-017")}
	if _, err := s.Record(ctx, unitless, []float64{1}, "bob", "", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("unitless metric: %v, want ErrInvalid", err)
	}
	if _, err := s.Record(ctx, k, nil, "bob", "", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("no samples: %v, want ErrInvalid", err)
	}
}

func TestList(t *testing.T) { both(t, testList) }

func testList(t *testing.T, be string) {
	ctx := t.Context()
	s := newStoreOn(t, be)
	sku := Key{Metric: MetricAllReduceBusBW, Scope: SKUScope("h100-sxm-80g-x8-nvlink")}
	link := Key{Metric: MetricAllReduce2BusBW, Scope: LinkScope("gpu-2", "gpu-1")}
	for _, b := range []Baseline{sampled(nodeKey("gpu-1"), 470), sampled(nodeKey("gpu-1"), 475), sampled(nodeKey("gpu-2"), 480), sampled(sku, 480), sampled(link, 460)} {
		if _, err := s.Set(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	count := func(f Filter) int {
		t.Helper()
		bs, err := s.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		return len(bs)
	}
	for _, tc := range []struct {
		name string
		f    Filter
		want int
	}{
		{"all latest", Filter{}, 4},
		{"all versions", Filter{AllVersions: true}, 5},
		{"nodes", Filter{Kind: ScopeNode}, 2},
		{"links", Filter{Kind: ScopeLink}, 1},
		{"one link either order", Filter{Scope: "link:gpu-2|gpu-1"}, 1},
		{"2-node metric", Filter{Metric: MetricAllReduce2BusBW}, 1},
		{"stack", Filter{Stack: &Stack{Driver: "535.161.08", NCCL: "2.21.5"}}, 2},
		{"unknown stack", Filter{Stack: &Stack{}}, 2},
	} {
		if got := count(tc.f); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if _, err := s.List(ctx, Filter{Kind: "rack"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad kind: %v", err)
	}
	bs, _ := s.List(ctx, Filter{Kind: ScopeNode})
	if bs[0].Scope != NodeScope("gpu-1") || bs[0].Value != 475 {
		t.Errorf("first node row %v: want gpu-1's latest", bs[0])
	}
}

// TestConcurrentSets: writers on separate connections get distinct
// versions, none fails on SQLite's lock upgrade.
func TestConcurrentSets(t *testing.T) { both(t, testConcurrentSets) }

func testConcurrentSets(t *testing.T, be string) {
	ctx := t.Context()
	s := newStoreOn(t, be)
	k := nodeKey("gpu-1")
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Set(ctx, sampled(k, float64(400+i))); err != nil {
				errs <- err
			}
			if _, err := s.Record(ctx, k, []float64{float64(400 + i)}, "w", "", ""); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	h, err := s.History(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 2*n || h[len(h)-1].Version != 2*n {
		t.Errorf("%d versions, last %d", len(h), h[len(h)-1].Version)
	}
}

func TestExportImportRoundTrip(t *testing.T) { both(t, testExportImportRoundTrip) }

func testExportImportRoundTrip(t *testing.T, be string) {
	ctx := t.Context()
	src := newStoreOn(t, be)
	sku := Key{Metric: MetricAllReduceBusBW, Scope: SKUScope("h100-sxm-80g-x8-nvlink"), Stack: Stack{RDMAStack: "MLNX_OFED 23.10-1.1.9.0"}}
	many := make([]float64, 100)
	for i := range many {
		many[i] = 400 + float64(i)/10
	}
	withThreshold := sampled(Key{Metric: "nccl.sendrecv.latency_us", Scope: LinkScope("b", "a")}, 9.5, 10, 10.25)
	withThreshold.Direction, withThreshold.Threshold, withThreshold.Note = LowerBetter, 0.5, "two lines\nof note"
	for _, b := range []Baseline{sampled(nodeKey("gpu-1"), 470), sampled(nodeKey("gpu-1"), 471, 475.5, 480), sampled(sku, many...), withThreshold} {
		if _, err := src.Set(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if err := src.Export(ctx, &buf, Filter{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"format: 1", "scope: link:a|b", "values: [471, 475.5, 480]", "direction: lower", "threshold: 0.5"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("export lacks %q:\n%s", want, buf.String())
		}
	}
	dst := newStoreOn(t, be)
	res, err := dst.Import(ctx, bytes.NewReader(buf.Bytes()), "carol")
	if err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	if res.Added != 3 || res.Unchanged != 0 {
		t.Errorf("import %+v", res)
	}
	want, _ := src.List(ctx, Filter{})
	got, _ := dst.List(ctx, Filter{})
	if len(got) != len(want) {
		t.Fatalf("%d baselines imported, want %d", len(got), len(want))
	}
	for i := range want {
		w, g := want[i], got[i]
		if g.Key != w.Key || !g.sameValue(w) || !g.TakenAt.Equal(w.TakenAt) || g.Who != w.Who || g.FromRun != w.FromRun || g.Note != w.Note {
			t.Errorf("round trip:\n got %v %+v %v %q %q %q\nwant %v %+v %v %q %q %q", g, g.Samples, g.TakenAt, g.Who, g.FromRun, g.Note, w, w.Samples, w.TakenAt, w.Who, w.FromRun, w.Note)
		}
	}
	// The same file again stores nothing new.
	res, err = dst.Import(ctx, bytes.NewReader(buf.Bytes()), "carol")
	if err != nil || res.Added != 0 || res.Unchanged != 3 {
		t.Errorf("second import %+v, %v", res, err)
	}
	if h, _ := dst.History(ctx, nodeKey("gpu-1")); len(h) != 1 {
		t.Errorf("identical import added versions: %d", len(h))
	}
	// A whole history replays in order.
	buf.Reset()
	if err := src.Export(ctx, &buf, Filter{AllVersions: true, Kind: ScopeNode}); err != nil {
		t.Fatal(err)
	}
	hist := newStoreOn(t, be)
	if _, err := hist.Import(ctx, &buf, "carol"); err != nil {
		t.Fatal(err)
	}
	h, err := hist.History(ctx, nodeKey("gpu-1"))
	if err != nil || len(h) != 2 || h[0].Value != 470 || h[1].Value != 475.5 {
		t.Errorf("replayed history %v, %v", h, err)
	}
	// A history imported back where it came from adds nothing.
	buf.Reset()
	if err := src.Export(ctx, &buf, Filter{AllVersions: true}); err != nil {
		t.Fatal(err)
	}
	res, err = src.Import(ctx, &buf, "carol")
	if err != nil || res.Added != 0 || res.Unchanged != 4 {
		t.Errorf("history back into its store: %+v, %v", res, err)
	}
}

func TestImportFillsWhoAndTime(t *testing.T) { both(t, testImportFillsWhoAndTime) }

func testImportFillsWhoAndTime(t *testing.T, be string) {
	ctx := t.Context()
	s := newStoreOn(t, be)
	file := `baselines:
  - metric: nccl.allreduce.busbw_gbps
    scope: node:gpu-1
    value: 480
  - metric: nccl.allreduce.busbw_gbps
    scope: node:gpu-2
    value: 470
    who: alice
    taken_at: 2026-01-02
`
	if _, err := s.Import(ctx, strings.NewReader(file), "importer"); err != nil {
		t.Fatal(err)
	}
	b1, _ := s.Get(ctx, Key{Metric: MetricAllReduceBusBW, Scope: NodeScope("gpu-1")})
	b2, _ := s.Get(ctx, Key{Metric: MetricAllReduceBusBW, Scope: NodeScope("gpu-2")})
	if b1.Who != "importer" || b1.TakenAt.Year() != 2026 || b1.TakenAt.Month() != 3 {
		t.Errorf("gpu-1: who %q at %v", b1.Who, b1.TakenAt)
	}
	if b2.Who != "alice" || !b2.TakenAt.Equal(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("gpu-2: who %q at %v", b2.Who, b2.TakenAt)
	}
	if b1.Samples.Count != 1 || b1.Direction != HigherBetter {
		t.Errorf("one value is one sample, direction from the unit: %+v %s", b1.Samples, b1.Direction)
	}
}

func TestImportIsAllOrNothing(t *testing.T) { both(t, testImportIsAllOrNothing) }

func testImportIsAllOrNothing(t *testing.T, be string) {
	ctx := t.Context()
	s := newStoreOn(t, be)
	file := `baselines:
  - {metric: nccl.allreduce.busbw_gbps, scope: node:gpu-1, value: 480}
  - {metric: nccl.allreduce.busbw_gbps, scope: node:gpu-2, value: -1}
`
	if _, err := s.Import(ctx, strings.NewReader(file), "x"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("import: %v", err)
	}
	if bs, _ := s.List(ctx, Filter{}); len(bs) != 0 {
		t.Errorf("a rejected file stored %d baselines", len(bs))
	}
}

func TestImportReferenceLeavesStoredKeysAlone(t *testing.T) {
	both(t, testImportReferenceLeavesStoredKeysAlone)
}

func testImportReferenceLeavesStoredKeysAlone(t *testing.T, be string) {
	ctx := t.Context()
	s := newStoreOn(t, be)
	refs, err := Reference()
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.ImportReference(ctx, "coordinator")
	if err != nil || res.Added != len(refs) {
		t.Fatalf("first import %+v, %v", res, err)
	}
	k := Key{Metric: MetricAllReduceBusBW, Scope: SKUScope("h100-sxm-80g-x8-nvlink")}
	mine := sampled(k, 455, 460, 465)
	if _, err := s.Set(ctx, mine); err != nil {
		t.Fatal(err)
	}
	res, err = s.ImportReference(ctx, "coordinator")
	if err != nil || res.Added != 0 || res.Unchanged != len(refs) {
		t.Fatalf("second import %+v, %v", res, err)
	}
	if b, _ := s.Get(ctx, k); b.Value != 460 || b.Version != 2 {
		t.Errorf("operator's value replaced: %v", b)
	}
	ref, _ := s.History(ctx, k)
	if ref[0].Who != "fleetcheck reference" || ref[0].FromRun == "" {
		t.Errorf("reference provenance lost: %q %q", ref[0].Who, ref[0].FromRun)
	}
}

func TestStoreWithReader(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "f.db")
	w, err := sql.Open("sqlite3", path+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.SetMaxOpenConns(1) // the coordinator's writer has one connection
	s, err := NewStore(w)
	if err != nil {
		t.Fatal(err)
	}
	r, err := sql.Open("sqlite3", fmt.Sprintf("file:%s?mode=ro&_busy_timeout=5000", path))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s2, err := NewStore(w, WithReader(r))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Set(ctx, sampled(nodeKey("gpu-1"), 480)); err != nil {
		t.Fatal(err)
	}
	if b, err := s2.Get(ctx, nodeKey("gpu-1")); err != nil || b.Value != 480 {
		t.Errorf("read through reader: %v %v", b, err)
	}
	// Resolve on a one-connection pool: no query is left open while the next runs.
	if r, err := Resolve(ctx, s, MetricAllReduceBusBW, "gpu-1", "h100-sxm-80g-x8-nvlink-ib400x8", nodeKey("x").Stack); err != nil || r.Baseline == nil {
		t.Errorf("resolve on one connection: %+v %v", r, err)
	}
}
