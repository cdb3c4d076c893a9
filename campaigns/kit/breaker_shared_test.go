package kit

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// sharedPair is two breakers (two coordinators) on one PostgreSQL
// database, each with its own connection pool, on one clock.
func sharedPair(t *testing.T, cfg BreakerConfig) (a, b *Breaker, clk *stepClock, dbs []*sqldb.DB) {
	t.Helper()
	url := pgtest.URL(t)
	clk = &stepClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	ctx := context.Background()
	for range 2 {
		db, err := sqldb.Open(ctx, url, sqldb.Options{MaxOpen: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		br, err := NewBreaker(cfg, clk)
		if err != nil {
			t.Fatal(err)
		}
		if err := br.Share(ctx, db); err != nil {
			t.Fatal(err)
		}
		dbs = append(dbs, db)
		if a == nil {
			a = br
		} else {
			b = br
		}
	}
	return a, b, clk, dbs
}

// Two coordinators asking at once for 16 nodes get the limit between
// them, not the limit each.
func TestSharedBreakerOneLimitAcrossCoordinators(t *testing.T) {
	a, b, _, _ := sharedPair(t, BreakerConfig{Window: time.Hour, MaxCount: 3})
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		allowed []string
	)
	for i := range 16 {
		br := a
		if i%2 == 1 {
			br = b
		}
		node := fmt.Sprintf("gpu-%03d", i)
		wg.Go(func() {
			err := br.Allow("drain-policy", node, 100)
			switch {
			case err == nil:
				mu.Lock()
				allowed = append(allowed, node)
				mu.Unlock()
			case !errors.Is(err, ErrBreakerOpen):
				t.Errorf("%s: %v, want the breaker open", node, err)
			}
		})
	}
	wg.Wait()
	if len(allowed) != 3 {
		t.Fatalf("allowed %v, want 3 across both", allowed)
	}
	for name, br := range map[string]*Breaker{"a": a, "b": b} {
		if st := br.State(100); st.Drained != 3 || !st.Open || st.Limit != 3 {
			t.Errorf("%s's state %+v", name, st)
		}
		if recs := br.Records(); len(recs) != 3 {
			t.Errorf("%s's records %+v", name, recs)
		}
	}
	// A node already counted drains again on the other; a new one does not.
	if err := b.Allow("sweep-1", allowed[0], 100); err != nil {
		t.Errorf("a counted node again: %v", err)
	}
	if err := b.Allow("sweep-1", "gpu-999", 100); !errors.Is(err, ErrBreakerOpen) {
		t.Errorf("a fourth node: %v", err)
	}
}

// Release, Restore and the window work on the ledger: what one
// coordinator does the other counts.
func TestSharedBreakerReleaseRestoreWindow(t *testing.T) {
	a, b, clk, dbs := sharedPair(t, BreakerConfig{Window: time.Hour, MaxCount: 2})
	if err := a.Allow("rollout-1", "gpu-001", 10); err != nil {
		t.Fatal(err)
	}
	if err := a.Allow("rollout-1", "gpu-002", 10); err != nil {
		t.Fatal(err)
	}
	if err := b.Allow("burnin-1", "gpu-003", 10); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("third: %v", err)
	}
	a.Release("rollout-1", "gpu-002") // that drain did not happen
	if err := b.Allow("burnin-1", "gpu-003", 10); err != nil {
		t.Fatalf("after a release on the other: %v", err)
	}
	// Another coordinator's restart brings back a drain its campaign
	// stored: the others count it too; one outside the window is dropped.
	clk.advance(30 * time.Minute)
	a.Release("rollout-1", "gpu-001")
	b.Restore([]DrainRecord{
		{Node: "gpu-004", Campaign: "sweep-9", At: clk.Now().Add(-10 * time.Minute)},
		{Node: "gpu-005", Campaign: "sweep-9", At: clk.Now().Add(-2 * time.Hour)},
	})
	recs := a.Records()
	if len(recs) != 2 || recs[0].Node != "gpu-003" || recs[1].Node != "gpu-004" {
		t.Fatalf("a's records after b's restore: %+v", recs)
	}
	if err := a.Allow("drain-policy", "gpu-006", 10); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("with b's restored drain counted: %v", err)
	}
	// An hour after gpu-003's drain, its slot is free again.
	clk.advance(31 * time.Minute)
	if err := a.Allow("drain-policy", "gpu-006", 10); err != nil {
		t.Fatalf("after the window: %v", err)
	}
	// The ledger gone, the breaker fails closed.
	if err := dbs[1].Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Allow("drain-policy", "gpu-007", 10); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("without its database: %v, want refused", err)
	}
}

// Only PostgreSQL shares; a breaker not shared is untouched (SQLite's
// one coordinator).
func TestShareNeedsPostgres(t *testing.T) {
	db, err := sqldb.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "x.db"), sqldb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	br, err := NewBreaker(BreakerConfig{MaxCount: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Share(context.Background(), db); err == nil {
		t.Fatal("shared on SQLite")
	}
	if err := br.Allow("x", "gpu-001", 4); err != nil {
		t.Fatal(err)
	}
	if err := br.Allow("x", "gpu-002", 4); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("the in-memory breaker: %v", err)
	}
}

// BenchmarkSharedBreakerAllow is one drain decision on the ledger (a
// transaction under the advisory lock), against the in-memory breaker.
func BenchmarkSharedBreakerAllow(b *testing.B) {
	url := pgtest.URL(b)
	db, err := sqldb.Open(context.Background(), url, sqldb.Options{MaxOpen: 4})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	for _, shared := range []bool{false, true} {
		name := "memory"
		if shared {
			name = "postgres"
		}
		b.Run(name, func(b *testing.B) {
			br, err := NewBreaker(BreakerConfig{Window: time.Hour}, nil)
			if err != nil {
				b.Fatal(err)
			}
			if shared {
				if err := br.Share(context.Background(), db); err != nil {
					b.Fatal(err)
				}
			}
			i := 0
			for b.Loop() {
				if err := br.Allow("bench", fmt.Sprintf("gpu-%06d", i%1000), 1000); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
