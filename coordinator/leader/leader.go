// Package leader is the leader lease of several coordinators over one
// PostgreSQL store: one row per lease with its holder, its expiry (the
// database's clock, so coordinators' clocks need not agree) and a fencing
// token that grows by one at every takeover.
//
// The leader runs campaigns and schedules; the others serve agents and
// operators. Every campaign write goes through Fence (sqldb's fence
// hook): inside the write transaction it reads the lease row FOR SHARE
// and compares the token with the one this coordinator holds. A takeover
// must update that row, so it waits for a write in flight to commit, and
// a write after the takeover sees the new token and is refused: an old
// leader that was paused (SIGSTOP, a long GC, a frozen VM) and wakes
// cannot write, whatever it still believes.
//
// With SQLite (the default) there is one coordinator and no lease.
package leader

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// ErrNotLeader is returned by Fence and Renew when this coordinator does
// not hold the lease (any more).
var ErrNotLeader = errors.New("not the leader")

// ErrNeedsPostgres: a lease over SQLite makes no sense (one coordinator).
var ErrNeedsPostgres = errors.New("the leader lease needs PostgreSQL")

// Defaults and bounds of the lease's time to live.
const (
	DefaultTTL = 6 * time.Second
	MinTTL     = 100 * time.Millisecond
	MaxTTL     = 10 * time.Minute
)

// Table is the lease table's name.
const Table = "fleetcheck_leader"

// Options configure a Lease. Zero values take the defaults.
type Options struct {
	// Name is the lease's row (default "coordinator").
	Name string
	// Holder names this coordinator in the row (default
	// HOSTNAME-PID-RANDOM: a restarted process is a new holder).
	Holder string
	// Addr is this coordinator's gRPC address, for the others to forward
	// campaign calls to while it leads.
	Addr string
	// TTL is how long the lease lasts unrenewed (default DefaultTTL); it
	// is renewed every TTL/3 and followers try to take it every TTL/6, so
	// a dead leader is replaced within about TTL·7/6.
	TTL time.Duration
	// Logger receives takeovers and losses.
	Logger zerolog.Logger
	// OnChange is called when this coordinator becomes leader (token > 0)
	// or stops being it (token 0): metrics, logs. It must not block.
	OnChange func(leading bool, token int64)
	// now is the local clock that bounds how long a renewal is believed
	// (tests freeze it to play a process paused after its check).
	now func() time.Time
}

// Lease is this coordinator's side of the lease.
type Lease struct {
	db *sqldb.DB
	o  Options

	mu       sync.Mutex
	token    int64     // 0: not held
	deadline time.Time // local: past it the lease is not believed held
}

// New builds a lease on db, which must be PostgreSQL.
func New(db *sqldb.DB, o Options) (*Lease, error) {
	if db.Dialect() != sqldb.Postgres {
		return nil, fmt.Errorf("%w (the store is %s)", ErrNeedsPostgres, db.Dialect())
	}
	if o.Name == "" {
		o.Name = "coordinator"
	}
	if o.Holder == "" {
		o.Holder = DefaultHolder()
	}
	if o.TTL == 0 {
		o.TTL = DefaultTTL
	}
	if o.TTL < MinTTL || o.TTL > MaxTTL {
		return nil, fmt.Errorf("leader lease ttl %s: must be within %s..%s", o.TTL, MinTTL, MaxTTL)
	}
	if o.now == nil {
		o.now = time.Now
	}
	return &Lease{db: db, o: o}, nil
}

// DefaultHolder is HOSTNAME-PID-RANDOM.
func DefaultHolder() string {
	h, err := os.Hostname()
	if err != nil {
		h = "coordinator"
	}
	b := make([]byte, 4)
	_, _ = crand.Read(b) // crypto/rand never fails on Linux
	return fmt.Sprintf("%s-%d-%s", h, os.Getpid(), hex.EncodeToString(b))
}

// Holder is this coordinator's name in the lease row.
func (l *Lease) Holder() string { return l.o.Holder }

// TTL is the lease's time to live.
func (l *Lease) TTL() time.Duration { return l.o.TTL }

// Migrate creates the lease table. Several coordinators starting at once
// take turns (an advisory lock): CREATE TABLE IF NOT EXISTS alone races.
func (l *Lease) Migrate(ctx context.Context) error {
	tx, err := l.db.SQL().BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("leader lease table: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(7243001)`); err != nil {
		return fmt.Errorf("leader lease table: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+Table+` (
		name TEXT PRIMARY KEY,
		holder TEXT NOT NULL,
		addr TEXT NOT NULL DEFAULT '',
		token BIGINT NOT NULL,
		acquired_at TIMESTAMPTZ NOT NULL,
		expires_at TIMESTAMPTZ NOT NULL)`); err != nil {
		return fmt.Errorf("leader lease table: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("leader lease table: %w", err)
	}
	return nil
}

// Token returns the fencing token this coordinator holds and whether it
// believes it holds it: the last renewal is younger than the TTL (less a
// tenth, for the round trip).
func (l *Lease) Token() (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.token == 0 || !l.o.now().Before(l.deadline) {
		return 0, false
	}
	return l.token, true
}

// Leading says whether this coordinator believes it leads.
func (l *Lease) Leading() bool {
	_, ok := l.Token()
	return ok
}

func (l *Lease) set(token int64, start time.Time) {
	l.mu.Lock()
	l.token = token
	l.deadline = start.Add(l.o.TTL - l.o.TTL/10)
	l.mu.Unlock()
}

func (l *Lease) drop() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.token
	l.token, l.deadline = 0, time.Time{}
	return t
}

func (l *Lease) ttlSeconds() float64 { return l.o.TTL.Seconds() }

// TryAcquire takes the lease when it is free or expired, with the next
// token, and reports whether this coordinator now holds it.
func (l *Lease) TryAcquire(ctx context.Context) (bool, error) {
	start := l.o.now()
	var token int64
	err := l.db.SQL().QueryRowContext(ctx, `
		INSERT INTO `+Table+` AS l (name, holder, addr, token, acquired_at, expires_at)
		VALUES ($1, $2, $3, 1, now(), now() + $4::float8 * interval '1 second')
		ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, addr = excluded.addr,
			token = l.token + 1, acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
		WHERE l.expires_at < now()
		RETURNING token`, l.o.Name, l.o.Holder, l.o.Addr, l.ttlSeconds()).Scan(&token)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil // held by another, unexpired
	case err != nil:
		return false, fmt.Errorf("take the leader lease: %w", err)
	}
	l.set(token, start)
	return true, nil
}

// Renew extends the lease this coordinator holds; ErrNotLeader when the
// row has another token (taken over) or this coordinator holds none.
func (l *Lease) Renew(ctx context.Context) error {
	l.mu.Lock()
	token := l.token
	l.mu.Unlock()
	if token == 0 {
		return ErrNotLeader
	}
	start := l.o.now()
	var got int64
	err := l.db.SQL().QueryRowContext(ctx, `
		UPDATE `+Table+` SET expires_at = now() + $3::float8 * interval '1 second'
		WHERE name = $1 AND token = $2 RETURNING token`, l.o.Name, token, l.ttlSeconds()).Scan(&got)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		l.drop()
		return fmt.Errorf("%w: token %d was taken over", ErrNotLeader, token)
	case err != nil:
		return fmt.Errorf("renew the leader lease: %w", err)
	}
	l.set(token, start)
	return nil
}

// Release gives the lease up at once (a clean stop), so that a follower
// takes over at its next try instead of after the TTL.
func (l *Lease) Release(ctx context.Context) error {
	token := l.drop()
	if token == 0 {
		return nil
	}
	_, err := l.db.SQL().ExecContext(ctx, `UPDATE `+Table+` SET expires_at = now() - interval '1 second'
		WHERE name = $1 AND token = $2`, l.o.Name, token)
	if err != nil {
		return fmt.Errorf("release the leader lease: %w", err)
	}
	return nil
}

// Fence is the sqldb fence of campaign writes: the write goes on only if
// this coordinator believes it leads and the row, read FOR SHARE in the
// write's own transaction, still carries its token. The share lock holds
// a takeover off until the write commits.
func (l *Lease) Fence(ctx context.Context, tx *sqldb.Tx) error {
	token, ok := l.Token()
	if !ok {
		return fmt.Errorf("%w: this coordinator holds no current lease", ErrNotLeader)
	}
	var cur int64
	var holder string
	err := tx.QueryRowContext(ctx, `SELECT token, holder FROM `+Table+` WHERE name = ? FOR SHARE`, l.o.Name).Scan(&cur, &holder)
	if err != nil {
		return fmt.Errorf("%w: read the lease: %w", ErrNotLeader, err)
	}
	if cur != token {
		return fmt.Errorf("%w: token %d is stale, %s leads with token %d", ErrNotLeader, token, holder, cur)
	}
	return nil
}

// Current is the lease row as the database has it.
type Current struct {
	Holder  string
	Addr    string
	Token   int64
	Expires time.Time
	// Valid says the lease has not expired (by the database's clock).
	Valid bool
}

// Current reads who holds the lease; a zero Current when nobody ever did.
func (l *Lease) Current(ctx context.Context) (Current, error) {
	var c Current
	err := l.db.SQL().QueryRowContext(ctx, `SELECT holder, addr, token, expires_at, expires_at > now()
		FROM `+Table+` WHERE name = $1`, l.o.Name).Scan(&c.Holder, &c.Addr, &c.Token, &c.Expires, &c.Valid)
	if errors.Is(err, sql.ErrNoRows) {
		return Current{}, nil
	}
	if err != nil {
		return Current{}, fmt.Errorf("read the leader lease: %w", err)
	}
	return c, nil
}

// Run competes for the lease until ctx is done. While this coordinator
// holds it, lead runs with a context that ends when the lease is lost (a
// renewal refused, or none succeeded for the TTL) or ctx is done; lead
// must return soon after. Losing the lease, Run waits for lead to return
// before it competes again, so two leads of one process never overlap.
// On a clean stop it releases the lease.
func (l *Lease) Run(ctx context.Context, lead func(ctx context.Context)) {
	poll := max(l.o.TTL/6, MinTTL/2)
	var lastErr string
	for {
		ok, err := l.TryAcquire(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil:
			if err.Error() != lastErr {
				l.o.Logger.Warn().Err(err).Msg("cannot reach the leader lease; retrying")
			}
			lastErr = err.Error()
		case ok:
			lastErr = ""
			l.hold(ctx, lead)
			if ctx.Err() != nil {
				return
			}
			continue
		}
		// Jitter keeps followers from knocking in step.
		t := time.NewTimer(poll/2 + rand.N(poll))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// hold leads until the lease is lost or ctx is done.
func (l *Lease) hold(ctx context.Context, lead func(ctx context.Context)) {
	token, _ := l.Token()
	l.o.Logger.Info().Int64("token", token).Str("holder", l.o.Holder).Msg("leader: took the lease; running campaigns")
	if l.o.OnChange != nil {
		l.o.OnChange(true, token)
	}
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lead(lctx)
	}()
	why := l.keep(ctx, done)
	cancel()
	<-done
	if ctx.Err() != nil {
		why = "stopping"
	}
	// Hand it on at once where the row is still ours (a no-op when it
	// was taken over); a database that does not answer lets it expire.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), l.o.TTL/3)
	if err := l.Release(rctx); err != nil {
		l.o.Logger.Warn().Err(err).Msg("leader: cannot release the lease; a follower takes it when it expires")
	}
	rcancel()
	l.drop()
	l.o.Logger.Warn().Int64("token", token).Str("reason", why).Msg("leader: lost the lease; campaigns stopped")
	if l.o.OnChange != nil {
		l.o.OnChange(false, 0)
	}
}

// keep renews every TTL/3 and returns why it stopped: the lease was
// taken over, or no renewal succeeded before it would expire; "" when ctx
// is done or lead returned.
func (l *Lease) keep(ctx context.Context, done <-chan struct{}) string {
	every := l.o.TTL / 3
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ""
		case <-done:
			return "campaigns ended"
		case <-t.C:
		}
		l.mu.Lock()
		left := l.deadline.Sub(l.o.now())
		l.mu.Unlock()
		if left <= 0 {
			return "no renewal within the ttl"
		}
		// Wake at the deadline at the latest: a leader that cannot renew
		// must stop before its lease can expire, not at its next tick.
		t.Reset(min(every, left))
		rctx, cancel := context.WithTimeout(ctx, left)
		err := l.Renew(rctx)
		cancel()
		switch {
		case errors.Is(err, ErrNotLeader):
			return err.Error()
		case err != nil && ctx.Err() == nil:
			l.o.Logger.Warn().Err(err).Dur("left_ms", left).Msg("leader: renewal failed; retrying until the lease would expire")
			if !l.Leading() {
				return "no renewal within the ttl: " + err.Error()
			}
		}
	}
}
