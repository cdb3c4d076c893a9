package leader

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// coordinators opens n pools on one fresh database, as n processes would,
// with the lease table made.
func coordinators(t *testing.T, n int) []*sqldb.DB {
	t.Helper()
	url := pgtest.URL(t)
	var dbs []*sqldb.DB
	for range n {
		db, err := sqldb.Open(context.Background(), url, sqldb.Options{MaxOpen: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		dbs = append(dbs, db)
	}
	return dbs
}

func newLease(t *testing.T, db *sqldb.DB, holder string, ttl time.Duration, now func() time.Time) *Lease {
	t.Helper()
	l, err := New(db, Options{Holder: holder, Addr: holder + ":7443", TTL: ttl, now: now})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return l
}

// frozen is the clock of a process paused after it checked its lease:
// it goes on believing the lease it held.
func frozen() func() time.Time {
	at := time.Now()
	return func() time.Time { return at }
}

func TestAcquireRenewTakeOver(t *testing.T) {
	t.Parallel()
	dbs := coordinators(t, 2)
	ctx := context.Background()
	a := newLease(t, dbs[0], "a", 400*time.Millisecond, nil)
	b := newLease(t, dbs[1], "b", 400*time.Millisecond, nil)
	if ok, err := a.TryAcquire(ctx); !ok || err != nil {
		t.Fatalf("a takes a free lease: %v %v", ok, err)
	}
	if tok, ok := a.Token(); !ok || tok != 1 {
		t.Fatalf("a's token %d %v, want 1", tok, ok)
	}
	if ok, err := b.TryAcquire(ctx); ok || err != nil {
		t.Fatalf("b took a held lease: %v %v", ok, err)
	}
	if err := a.Renew(ctx); err != nil {
		t.Fatalf("renew: %v", err)
	}
	cur, err := b.Current(ctx)
	if err != nil || cur.Holder != "a" || cur.Addr != "a:7443" || cur.Token != 1 || !cur.Valid {
		t.Fatalf("current: %+v %v", cur, err)
	}
	// a stops renewing: once it expires, b takes it with the next token.
	testwait.Until(t, 5*time.Second, "b takes the expired lease", func() bool {
		ok, err := b.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	})
	if tok, _ := b.Token(); tok != 2 {
		t.Fatalf("b's token %d, want 2", tok)
	}
	if err := a.Renew(ctx); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the old leader renewed: %v", err)
	}
	if a.Leading() {
		t.Fatal("a still believes it leads after a refused renewal")
	}
}

// fencedInsert writes one row through l's fence.
func fencedInsert(ctx context.Context, db *sqldb.DB, l *Lease, who string) error {
	db.SetFence(l.Fence)
	return db.Tx(ctx, func(tx *sqldb.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO campaign_writes (who) VALUES (?)`, who)
		return err
	})
}

func writes(t *testing.T, db *sqldb.DB) map[string]int {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT who, count(*) FROM campaign_writes GROUP BY who`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var who string
		var n int
		if err := rows.Scan(&who, &n); err != nil {
			t.Fatal(err)
		}
		out[who] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func makeWrites(t *testing.T, db *sqldb.DB) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), `CREATE TABLE campaign_writes (who TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// An old leader paused after its own check (its clock frozen: it still
// believes) wakes after another took over: its write stops at the fence,
// in the database, and nothing of it is written.
func TestPausedOldLeaderCannotWrite(t *testing.T) {
	t.Parallel()
	dbs := coordinators(t, 2)
	ctx := context.Background()
	makeWrites(t, dbs[0])
	a := newLease(t, dbs[0], "a", 300*time.Millisecond, frozen())
	b := newLease(t, dbs[1], "b", 300*time.Millisecond, nil)
	if ok, err := a.TryAcquire(ctx); !ok || err != nil {
		t.Fatalf("a: %v %v", ok, err)
	}
	if err := fencedInsert(ctx, dbs[0], a, "a"); err != nil {
		t.Fatalf("the leader's write: %v", err)
	}
	testwait.Until(t, 5*time.Second, "b takes over", func() bool { ok, _ := b.TryAcquire(ctx); return ok })
	if !a.Leading() {
		t.Fatal("test broken: a's frozen clock should keep it believing")
	}
	err := fencedInsert(ctx, dbs[0], a, "a")
	if !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the paused old leader wrote: %v", err)
	}
	t.Logf("refused: %v", err)
	if err := fencedInsert(ctx, dbs[1], b, "b"); err != nil {
		t.Fatalf("the new leader's write: %v", err)
	}
	if got := writes(t, dbs[0]); got["a"] != 1 || got["b"] != 1 {
		t.Fatalf("writes %v, want a:1 (before the takeover) b:1", got)
	}
}

// A write in flight when the lease expires holds the takeover off until
// it commits: the token it checked is current for its whole transaction.
func TestTakeoverWaitsForTheWriteInFlight(t *testing.T) {
	t.Parallel()
	dbs := coordinators(t, 3)
	ctx := context.Background()
	makeWrites(t, dbs[0])
	a := newLease(t, dbs[0], "a", 200*time.Millisecond, frozen())
	b := newLease(t, dbs[1], "b", 200*time.Millisecond, nil)
	if ok, err := a.TryAcquire(ctx); !ok || err != nil {
		t.Fatalf("a: %v %v", ok, err)
	}
	inTx, finish := make(chan struct{}), make(chan struct{})
	var finishOnce sync.Once
	end := func() { finishOnce.Do(func() { close(finish) }) }
	t.Cleanup(end) // a failed test must not leave the transaction open
	wrote := make(chan error, 1)
	dbs[0].SetFence(a.Fence)
	go func() {
		wrote <- dbs[0].Tx(ctx, func(tx *sqldb.Tx) error {
			close(inTx) // past the fence
			<-finish
			_, err := tx.ExecContext(ctx, `INSERT INTO campaign_writes (who) VALUES ('a')`)
			return err
		})
	}()
	<-inTx
	// Expired by the database's clock now or soon; b's takeover must wait.
	took := make(chan bool, 1)
	go func() {
		for {
			ok, err := b.TryAcquire(ctx)
			if err != nil || ok {
				took <- ok
				return
			}
			time.Sleep(20 * time.Millisecond) // polling the lease, as Run does
		}
	}()
	testwait.Until(t, 5*time.Second, "b's takeover waiting on a's share lock", func() bool {
		var n int
		if err := dbs[2].QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO `+Table+`%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	select {
	case <-took:
		t.Fatal("b took the lease while a's checked write was in flight")
	default:
	}
	end()
	if err := <-wrote; err != nil {
		t.Fatalf("a's write in flight: %v", err)
	}
	if ok := <-took; !ok {
		t.Fatal("b did not take over after a's commit")
	}
	if tok, _ := b.Token(); tok != 2 {
		t.Fatalf("b's token %d", tok)
	}
	if err := fencedInsert(ctx, dbs[0], a, "a"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a wrote after the takeover: %v", err)
	}
	if got := writes(t, dbs[0]); got["a"] != 1 {
		t.Fatalf("writes %v", got)
	}
}

// leads records who led when.
type leads struct {
	mu   sync.Mutex
	runs []span
}

type span struct {
	who        string
	start, end time.Time
}

func (r *leads) lead(who string) func(ctx context.Context) {
	return func(ctx context.Context) {
		r.mu.Lock()
		i := len(r.runs)
		r.runs = append(r.runs, span{who: who, start: time.Now()})
		r.mu.Unlock()
		<-ctx.Done()
		r.mu.Lock()
		r.runs[i].end = time.Now()
		r.mu.Unlock()
	}
}

func (r *leads) get() []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]span(nil), r.runs...)
}

func (r *leads) leader() string {
	for _, s := range r.get() {
		if s.end.IsZero() {
			return s.who
		}
	}
	return ""
}

// The leader dies without a word (its database connections gone, as
// under kill -9): another leads within about TTL·7/6, never while the old
// one still did.
func TestRunTakesOverFromADeadLeader(t *testing.T) {
	t.Parallel()
	dbs := coordinators(t, 3)
	const ttl = 900 * time.Millisecond
	var rec leads
	ctx, cancel := context.WithCancel(context.Background())
	var ls []*Lease
	var wg sync.WaitGroup
	for i, name := range []string{"a", "b", "c"} {
		l := newLease(t, dbs[i], name, ttl, nil)
		ls = append(ls, l)
		wg.Go(func() { l.Run(ctx, rec.lead(name)) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	var first string
	testwait.Until(t, 5*time.Second, "a leader", func() bool { first = rec.leader(); return first != "" })
	dead := map[string]int{"a": 0, "b": 1, "c": 2}[first]
	killed := time.Now()
	_ = dbs[dead].Close() // it can neither renew nor release
	var next string
	testwait.Until(t, 5*time.Second, "another leader", func() bool {
		next = rec.leader()
		return next != "" && next != first
	})
	runs := rec.get()
	var old, nw span
	for _, s := range runs {
		switch s.who {
		case first:
			old = s
		case next:
			nw = s
		}
	}
	took := nw.start.Sub(killed)
	t.Logf("takeover after %s (ttl %s)", took.Round(time.Millisecond), ttl)
	if took > ttl*7/6+500*time.Millisecond {
		t.Errorf("takeover took %s, want within about %s", took, ttl*7/6)
	}
	if old.end.IsZero() || !old.end.Before(nw.start) {
		t.Errorf("the dead leader's campaigns did not stop (ended %v) before the next began (%v)", old.end, nw.start)
	}
	if tok, _ := ls[dead].Token(); tok != 0 {
		t.Errorf("the dead leader still holds token %d", tok)
	}
}

// A clean stop releases the lease: a follower leads at its next try,
// long before the TTL.
func TestCleanStopHandsOver(t *testing.T) {
	t.Parallel()
	dbs := coordinators(t, 2)
	const ttl = 6 * time.Second
	var rec leads
	actx, astop := context.WithCancel(context.Background())
	bctx, bstop := context.WithCancel(context.Background())
	a := newLease(t, dbs[0], "a", ttl, nil)
	b := newLease(t, dbs[1], "b", ttl, nil)
	aDone := make(chan struct{})
	go func() { defer close(aDone); a.Run(actx, rec.lead("a")) }()
	testwait.Until(t, 5*time.Second, "a leads", func() bool { return rec.leader() == "a" })
	bDone := make(chan struct{})
	go func() { defer close(bDone); b.Run(bctx, rec.lead("b")) }()
	t.Cleanup(func() { bstop(); <-bDone })
	stopped := time.Now()
	astop()
	<-aDone
	testwait.Until(t, 5*time.Second, "b leads", func() bool { return rec.leader() == "b" })
	if took := time.Since(stopped); took > ttl/2 {
		t.Errorf("handover took %s: the lease was not released", took)
	}
}

func TestNeedsPostgresAndATTLInRange(t *testing.T) {
	t.Parallel()
	db, err := sqldb.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "x.db"), sqldb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := New(db, Options{}); !errors.Is(err, ErrNeedsPostgres) {
		t.Errorf("a lease on SQLite: %v", err)
	}
	pg := coordinators(t, 1)[0]
	for _, ttl := range []time.Duration{time.Millisecond, time.Hour} {
		if _, err := New(pg, Options{TTL: ttl, Logger: zerolog.Nop()}); err == nil {
			t.Errorf("ttl %s accepted", ttl)
		}
	}
}
