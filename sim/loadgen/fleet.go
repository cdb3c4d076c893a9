package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Config says what fleet to simulate.
type Config struct {
	// Addr is the coordinator's gRPC address; it must be 127.0.0.1:PORT.
	Addr string
	// Agents is how many simulated agents connect.
	Agents int
	// Prefix names the nodes PREFIX-00001...; default "lg".
	Prefix string
	// AgentsPerConn puts that many agents' streams on one connection
	// (default 1: each agent its own connection, as in a real fleet).
	AgentsPerConn int
	// ConnectConcurrency bounds the hellos in flight at once (default 256),
	// the way a fleet's reconnect jitter spreads them.
	ConnectConcurrency int
	// ConnectTimeout bounds the whole connect phase (default 2 minutes).
	ConnectTimeout time.Duration
	// Window is how many results one agent keeps unacked in sustained mode
	// (default 2: the next result is on its way while the last is stored).
	// The real agent allows 32, but sends that many only after an outage;
	// a thousand agents doing it at once would measure a flood, not a rate.
	Window int
	// Fixture is the report every agent replays.
	Fixture *Fixture
	Logger  zerolog.Logger
}

func (c *Config) defaults() error {
	if c.Prefix == "" {
		c.Prefix = "lg"
	}
	if c.AgentsPerConn <= 0 {
		c.AgentsPerConn = 1
	}
	if c.ConnectConcurrency <= 0 {
		c.ConnectConcurrency = 256
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 2 * time.Minute
	}
	if c.Window <= 0 {
		c.Window = 2
	}
	if c.Agents <= 0 {
		return errors.New("loadgen: agents must be positive")
	}
	if c.Fixture == nil {
		return errors.New("loadgen: no fixture")
	}
	return Loopback(c.Addr)
}

// ErrNotLoopback refuses any address but 127.0.0.1: the load generator
// opens thousands of connections and must never aim them elsewhere.
var ErrNotLoopback = errors.New("loadgen talks to 127.0.0.1 only")

// Loopback checks that addr is 127.0.0.1:PORT.
func Loopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if host != "127.0.0.1" {
		return fmt.Errorf("address %q: %w", addr, ErrNotLoopback)
	}
	return nil
}

// dialOptions: plaintext to the loopback coordinator (it must run with
// insecure: true), through a dialer that refuses anything else.
func dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			if err := Loopback(addr); err != nil {
				return nil, err
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}),
		// Smaller buffers than gRPC's 32 KiB: ten thousand connections here
		// should not cost gigabytes in this process.
		grpc.WithReadBufferSize(8 << 10),
		grpc.WithWriteBufferSize(8 << 10),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16 << 20)),
	}
}

// Fleet is a running set of simulated agents.
type Fleet struct {
	cfg    Config
	fx     *Fixture
	log    zerolog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	conns  []*grpc.ClientConn
	agents []*sim

	sent, ackedN, dups, refusedN, checkResults, lostN atomic.Int64

	mu       sync.Mutex
	lostErr  error
	work     map[string]*workAcks
	sustainN int64 // results acked while sustaining
}

// workAcks counts the acks of one work's results as the agents see them.
type workAcks struct {
	n    int
	last time.Time
}

// Start connects every agent and returns once each has its welcome. Agents
// that could not connect make it fail; Close releases what was opened
// either way.
func Start(ctx context.Context, cfg Config) (*Fleet, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	fctx, cancel := context.WithCancel(context.Background())
	f := &Fleet{cfg: cfg, fx: cfg.Fixture, log: cfg.Logger, ctx: fctx, cancel: cancel, work: map[string]*workAcks{}}
	for i := 0; i < cfg.Agents; i += cfg.AgentsPerConn {
		cc, err := grpc.NewClient(cfg.Addr, dialOptions()...)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("loadgen: %w", err)
		}
		f.conns = append(f.conns, cc)
	}
	f.agents = make([]*sim, cfg.Agents)
	cctx, ccancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer ccancel()
	sem := make(chan struct{}, cfg.ConnectConcurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for i := range cfg.Agents {
		select {
		case sem <- struct{}{}:
		case <-cctx.Done():
		}
		if cctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			name := fmt.Sprintf("%s-%05d", cfg.Prefix, i)
			s, err := f.connect(cctx, f.conns[i/cfg.AgentsPerConn], name, i)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			f.agents[i] = s
		}()
	}
	wg.Wait()
	if err := cctx.Err(); err != nil {
		errs = append(errs, fmt.Errorf("connect phase: %w", err))
	}
	if len(errs) > 0 {
		f.Close()
		return nil, fmt.Errorf("loadgen: %d of %d agents failed to connect; first: %w", len(errs), cfg.Agents, errs[0])
	}
	return f, nil
}

// PassAll has every agent send one full result, as its first scheduled
// pass would, and waits until all are answered.
func (f *Fleet) PassAll(ctx context.Context) error {
	want := f.sent.Load() + int64(len(f.agents))
	var wg sync.WaitGroup
	errs := make(chan error, len(f.agents))
	for _, s := range f.agents {
		wg.Go(func() {
			if _, err := s.sendResult(f.fx.all, "", false); err != nil {
				errs <- fmt.Errorf("%s: %w", s.name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("loadgen: first pass: %w", err)
	}
	return f.waitAcked(ctx, want)
}

// settled counts the results answered: acked, duplicates and refusals.
func (f *Fleet) settled() int64 { return f.ackedN.Load() + f.dups.Load() + f.refusedN.Load() }

// waitAcked waits until n results in all are answered.
func (f *Fleet) waitAcked(ctx context.Context, n int64) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for f.settled() < n {
		if err := f.Lost(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("loadgen: %d of %d results acked: %w", f.settled(), n, ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// acked settles one result.
func (f *Fleet) acked(p pending, a *pb.Ack, now time.Time) {
	switch {
	case a.GetRefused() != "":
		f.refusedN.Add(1)
		f.log.Error().Str("result_id", a.GetResultId()).Str("reason", a.GetRefused()).Msg("result refused")
		return
	case a.GetDuplicate():
		f.dups.Add(1)
	default:
		f.ackedN.Add(1)
		f.checkResults.Add(int64(p.checks))
	}
	if p.workID == "" && !p.sustain {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if p.sustain {
		f.sustainN++
		return
	}
	w := f.work[p.workID]
	if w == nil {
		w = &workAcks{}
		f.work[p.workID] = w
	}
	w.n++
	if now.After(w.last) {
		w.last = now
	}
}

// lost records an agent whose stream the coordinator ended.
func (f *Fleet) lost(name string, err error) {
	f.lostN.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lostErr == nil {
		f.lostErr = fmt.Errorf("agent %s lost its stream: %w", name, err)
	}
}

// Lost is the first stream the coordinator ended, nil while none was.
func (f *Fleet) Lost() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lostErr != nil {
		return fmt.Errorf("%d streams lost; first: %w", f.lostN.Load(), f.lostErr)
	}
	return nil
}

// WorkAcked says how many results of a work the agents saw acked, and when
// the last ack came.
func (f *Fleet) WorkAcked(workID string) (int, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w := f.work[workID]; w != nil {
		return w.n, w.last
	}
	return 0, time.Time{}
}

// Counters is what the fleet sent and had acked so far.
type Counters struct {
	Sent, Acked, Duplicates, Refused, CheckResults, Lost int64
}

// Counters returns the fleet's counters.
func (f *Fleet) Counters() Counters {
	return Counters{Sent: f.sent.Load(), Acked: f.ackedN.Load(), Duplicates: f.dups.Load(),
		Refused: f.refusedN.Load(), CheckResults: f.checkResults.Load(), Lost: f.lostN.Load()}
}

// SustainStats is one sustained-ingest run.
type SustainStats struct {
	Elapsed      time.Duration
	Results      int64 // acked within the run
	CheckResults int64 // those results' checks: one check on one node is one
	Drain        time.Duration
}

// Sustain has every agent send full results as fast as its window of
// unacked ones allows for d, then waits for the last acks. The counts are
// of results acked within d.
func (f *Fleet) Sustain(ctx context.Context, d time.Duration) (SustainStats, error) {
	f.mu.Lock()
	f.sustainN = 0
	f.mu.Unlock()
	before := f.checkResults.Load()
	sctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for _, s := range f.agents {
		wg.Go(func() { s.sustain(sctx) })
	}
	<-sctx.Done()
	elapsed := time.Since(start)
	f.mu.Lock()
	n := f.sustainN
	f.mu.Unlock()
	checks := f.checkResults.Load() - before
	wg.Wait()
	st := SustainStats{Elapsed: elapsed, Results: n, CheckResults: checks}
	// Let what is still in flight land before the next phase.
	drainStart := time.Now()
	dctx, dcancel := context.WithTimeout(ctx, time.Minute)
	defer dcancel()
	err := f.waitAcked(dctx, f.sent.Load())
	st.Drain = time.Since(drainStart)
	return st, err
}

// Close ends every stream and connection and waits for the agents'
// goroutines.
func (f *Fleet) Close() {
	f.cancel()
	for _, cc := range f.conns {
		_ = cc.Close() // shutting down: nothing to do with a failed close
	}
	f.wg.Wait()
}
