package coordinator

import (
	"context"
	"fmt"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// oneCheck is the benchmark's unit: one check on one node, one result.
func oneCheck(node string, i int) *pb.Result {
	now := time.Now().UnixMilli()
	return &pb.Result{
		Id: fmt.Sprintf("%s-%d", node, i), Node: node, StartedUnixMs: now - 3, FinishedUnixMs: now, Status: "pass",
		Checks: []*pb.CheckResult{{Name: "gpu.ecc", Status: "pass", DurationMs: 2.5,
			Metrics: wire.MetricsToProto(map[string]float64{"gpu0.ecc.dram_uncorrectable": 0, "gpu0.ecc.sram_correctable": 3})}},
	}
}

// BenchmarkIngest measures check results stored per second, end to end:
// agents on loopback gRPC send results (a window of unacked ones each),
// the coordinator batches them into the store and acks each once durable.
// The "store" case drives the store's batched ingest directly.
func BenchmarkIngest(b *testing.B) {
	b.Run("grpc", func(b *testing.B) {
		s := testServer(b, b.TempDir(), func(c *Config) { c.HeartbeatInterval = time.Minute })
		const agents, window = 256, 64
		as := make([]*fakeAgent, agents)
		for i := range as {
			as[i] = mustConnect(b, s, fmt.Sprintf("bench-%03d", i))
		}
		b.ResetTimer()
		var wg sync.WaitGroup
		for i, a := range as {
			per := b.N / agents
			if i < b.N%agents {
				per++
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				slots := make(chan struct{}, window)
				done := make(chan struct{})
				go func() {
					defer close(done)
					for n := 0; n < per; {
						m := <-a.in
						if m.GetAck() != nil {
							<-slots
							n++
						}
					}
				}()
				for j := 0; j < per; j++ {
					slots <- struct{}{}
					a.sendResult(oneCheck(a.node, j))
				}
				<-done
			}()
		}
		wg.Wait()
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "results/s")
		st := s.Stats().Store
		if st.Batches > 0 {
			b.ReportMetric(float64(st.Results)/float64(st.Batches), "results/commit")
		}
	})
	// One check a result, and a full pass of 13 checks a result as a
	// real agent sends (the fleet benchmark's unit: check results/s).
	for _, checks := range []int{1, 13} {
		name := "store"
		if checks > 1 {
			name = fmt.Sprintf("store-%dchecks", checks)
		}
		b.Run(name, func(b *testing.B) { benchStore(b, store.Options{Dir: b.TempDir(), Logger: zerolog.Nop()}, checks) })
		// The same on PostgreSQL (a local server, fsync off like the
		// SQLite case's synchronous=NORMAL: both measure the store, not
		// the disk).
		// store-postgres-1writer is the same with one writer, as SQLite
		// has: what the store's several writers give on PostgreSQL.
		for _, writers := range []int{store.DefaultWriters, 1} {
			pgName := strings.Replace(name, "store", "store-postgres", 1)
			if writers == 1 {
				pgName = strings.Replace(name, "store", "store-postgres-1writer", 1)
			}
			b.Run(pgName, func(b *testing.B) {
				if !pgtest.Available() {
					pgtest.Shared(b) // skips loudly
				}
				srv, err := pgtest.Start(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				defer srv.Close()
				db, err := srv.CreateDB(context.Background(), "bench")
				if err != nil {
					b.Fatal(err)
				}
				benchStore(b, store.Options{URL: srv.URLFor(db), Logger: zerolog.Nop(), Writers: writers}, checks)
			})
		}
	}
}

// manyChecks is a result of n checks, each with two metrics.
func manyChecks(node string, i, n int) *pb.Result {
	r := oneCheck(node, i)
	for c := 1; c < n; c++ {
		r.Checks = append(r.Checks, &pb.CheckResult{Name: fmt.Sprintf("check.%02d", c), Status: "pass", DurationMs: 1.5,
			Metrics: wire.MetricsToProto(map[string]float64{"a": float64(c), "b": 0.5})})
	}
	return r
}

// benchStore drives the store's batched ingest directly.
func benchStore(b *testing.B, opts store.Options, checks int) {
	db, err := store.Open(context.Background(), opts)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	b.ResetTimer()
	// A 1,000-node fleet, two results in flight per node, so the writer
	// always has the next batch queued while it commits one.
	var wg sync.WaitGroup
	const nodes, workers = 1000, 2000
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < b.N; i += workers {
				r := resultFromProto(manyChecks(fmt.Sprintf("node-%04d", w%nodes), i, checks))
				if _, err := db.Ingest(context.Background(), r); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "results/s")
	b.ReportMetric(float64(b.N*checks)/b.Elapsed().Seconds(), "check-results/s")
	st := db.Stats()
	if st.Batches > 0 {
		b.ReportMetric(float64(st.Results)/float64(st.Batches), "results/commit")
	}
}
