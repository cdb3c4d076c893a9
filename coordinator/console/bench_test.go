package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// The figures of docs/console.md:
//
//	go test -run '^$' -bench . -benchtime 20x ./coordinator/console/
//
// BenchmarkFleetPage10k is the fleet page of 10,000 nodes: the read of the
// nodes (the real SQLite store, each node with its newest check statuses),
// the aggregation and the rendering, every request a fresh read. Its
// bytes/page is the page weight. BenchmarkLivePoll10k is what one open
// console costs the coordinator: one poll of the live part; with the
// default refresh of 2 s, CPU per console per second is half of it.

func benchConsole(b *testing.B, src Source, clk *clock) *Server {
	b.Helper()
	s, err := New(Config{}, Options{Source: src, Insecure: true, Now: clk.now, Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// storeSource reads a real store, as the coordinator's source does.
type storeSource struct{ st *store.Store }

func (s storeSource) Nodes(ctx context.Context) ([]store.Node, error) { return s.st.Nodes(ctx) }
func (s storeSource) Node(ctx context.Context, n string) (store.Node, error) {
	return s.st.Node(ctx, n)
}
func (s storeSource) Results(ctx context.Context, q store.ResultQuery) ([]store.StoredCheck, error) {
	return s.st.Results(ctx, q)
}
func (s storeSource) Events(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	return s.st.Events(ctx, q)
}
func (storeSource) Baselines() baselines.Finder { return nil }
func (storeSource) Campaigns() Campaigns        { return nil }
func (storeSource) Remediations() Remediations  { return nil }

var (
	seedOnce sync.Once
	seeded   *store.Store
	seedErr  error
)

// seedStore is a store of n nodes, labelled as fakeFleet's, each with one
// full result of the ten passive checks; one node in forty fails gpu.ecc.
func seedStore(b *testing.B, n int) *store.Store {
	b.Helper()
	seedOnce.Do(func() {
		ctx := context.Background()
		dir, err := tempDir()
		if err != nil {
			seedErr = err
			return
		}
		st, err := store.Open(ctx, store.Options{Dir: dir, Logger: zerolog.Nop(), MaxBatch: 512})
		if err != nil {
			seedErr = err
			return
		}
		at := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			name := fmt.Sprintf("gpu-%05d", i+1)
			rack := i / 8
			if _, _, err := st.NodeJoined(ctx, store.Join{Node: name, At: at, InitialState: "initializing",
				Labels: map[string]string{"sku": "h100-sxm-80g-x8", "rack": fmt.Sprintf("r%04d", rack+1), "leaf": fmt.Sprintf("leaf%02d", rack/32+1)}}); err != nil {
				seedErr = err
				return
			}
			r := store.Result{ID: "r-" + name, Node: name, Started: at, Finished: at, Status: report.Pass, Full: true}
			for _, c := range []string{"gpu.inventory", "gpu.ecc", "gpu.xid", "gpu.thermal", "gpu.pcie", "gpu.nvlink", "gpu.config", "ib.ports", "ib.counters", "fw.matrix"} {
				cr := report.CheckResult{Name: c, Status: report.Pass}
				if c == "gpu.ecc" && i%40 == 0 {
					cr.Status, cr.Reason = report.Fail, "GPU3 ECC_UNCORRECTABLE"
					r.Status = report.Fail
				}
				r.Checks = append(r.Checks, cr)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := st.Ingest(ctx, r); err != nil {
					errs <- err
				}
			}()
			if i%256 == 255 {
				wg.Wait()
			}
		}
		wg.Wait()
		close(errs)
		seedErr = <-errs
		seeded = st
	})
	if seedErr != nil {
		b.Fatal(seedErr)
	}
	return seeded
}

func BenchmarkFleetPage10k(b *testing.B) {
	st := seedStore(b, 10_000)
	clk := newClock()
	s := benchConsole(b, storeSource{st}, clk)
	var size int
	b.ReportAllocs()
	for b.Loop() {
		clk.add(time.Minute) // no shared read: every page reads the store
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/fleet", nil))
		if w.Code != http.StatusOK {
			b.Fatalf("%d: %.300s", w.Code, w.Body.String())
		}
		size = w.Body.Len()
	}
	b.ReportMetric(float64(size), "bytes/page")
}

func BenchmarkLivePoll10k(b *testing.B) {
	st := seedStore(b, 10_000)
	clk := newClock()
	s := benchConsole(b, storeSource{st}, clk)
	var size int
	for b.Loop() {
		// Each poll reads the store anew: the worst case, one console
		// alone (consoles polling together share a read within a second).
		clk.add(time.Minute)
		req := httptest.NewRequest(http.MethodGet, "/fleet", nil)
		req.Header.Set(liveHeader, "1")
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, req)
		size = w.Body.Len()
	}
	b.ReportMetric(float64(size), "bytes/poll")
}

func BenchmarkNodePage(b *testing.B) {
	st := seedStore(b, 10_000)
	s := benchConsole(b, storeSource{st}, newClock())
	for b.Loop() {
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/nodes/gpu-00041", nil))
		if w.Code != http.StatusOK {
			b.Fatalf("%d: %.300s", w.Code, w.Body.String())
		}
	}
}

// seededDir is the shared store's directory, removed after the run.
var seededDir string

func tempDir() (string, error) {
	d, err := os.MkdirTemp("", "fleetcheck-console-bench-")
	seededDir = d
	return d, err
}

func TestMain(m *testing.M) {
	code := m.Run()
	if seeded != nil {
		_ = seeded.Close() // a benchmark's store: nothing to keep
	}
	if seededDir != "" {
		_ = os.RemoveAll(seededDir)
	}
	os.Exit(code)
}

// BenchmarkLivePollShared10k is one more console's poll while another's
// read of the nodes is still fresh (within a second): aggregation and
// rendering only, the marginal cost of each further console.
func BenchmarkLivePollShared10k(b *testing.B) {
	st := seedStore(b, 10_000)
	s := benchConsole(b, storeSource{st}, newClock())
	for b.Loop() {
		req := httptest.NewRequest(http.MethodGet, "/fleet", nil)
		req.Header.Set(liveHeader, "1")
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, req)
	}
}
