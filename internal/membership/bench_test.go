package membership

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// Gossip convergence: how long after an agent dies (Shutdown without Leave)
// until the coordinator gets NodeLeft with StateDead for it, and until every
// live member has. All members run in this one process on real loopback
// UDP/TCP sockets (127.0.0.1, bound and advertised) with memberlist's LAN
// timing, the package defaults: probe every 1 s with a 500 ms timeout,
// gossip every 200 ms, suspicion 4 × log10(n) × 1 s (10.8 s at 500
// members) shortened from six times that as peers confirm. Slow by nature,
// so benchmarks rather than tests, and not part of `make test` or `make
// bench` (docs/scale.md has the figures):
//
//	go test -run '^$' -bench 'GossipConvergence500$' -benchtime 1x -timeout 30m -v ./internal/membership/
//
// Environment (all optional):
//
//	GOSSIP_BATCH  members joined per batch (default 10)
//	GOSSIP_KILLS  agents killed, one at a time (default 10)
//	GOSSIP_HOLD   steady state watched after forming, before the kills (default 1m)
//	GOSSIP_GOSSIP_INTERVAL  Config.GossipInterval of every member (default
//	              the package's 200 ms); an experiment, not the figure
//
// One process holding n members is not n machines: every member's probes,
// gossip and push/pulls share this process's CPUs and one garbage collector,
// and a member whose ack is not read within the 500 ms probe timeout is
// suspected however healthy its "machine" is. Once that happens to a few
// members, the suspicions, refutations and deaths they gossip cost more CPU
// than two vCPUs have at 300 members and more, and the pool does not
// recover. The benchmark therefore reports, per phase and per kill, the CPU
// this process and other processes used, how late goroutines and timers
// ran, the kernel's UDP drops and memberlist's own suspicions, refutations
// and false deaths, so that a figure taken on a starved machine shows that
// it was; with -v it prints progress every 10 s.
//
// Forming: the coordinator starts alone; agents are created and joined in
// batches of GOSSIP_BATCH, each to one of a few seeds (the coordinator and
// the first agents). The next batch starts only when every member sees every
// member joined so far alive and the machine's UDP rate is back to what
// probing needs. Every member gossips each member it learns 12 times (at 500
// members), about 6,000 packets per join; joining all at once, or a batch
// on top of the previous one's gossip, delays acks past the probe timeout on
// two vCPUs and sets off a suspicion storm.

func BenchmarkGossipConvergence100(b *testing.B) { benchConvergence(b, 100) }
func BenchmarkGossipConvergence200(b *testing.B) { benchConvergence(b, 200) }
func BenchmarkGossipConvergence300(b *testing.B) { benchConvergence(b, 300) }
func BenchmarkGossipConvergence400(b *testing.B) { benchConvergence(b, 400) }
func BenchmarkGossipConvergence500(b *testing.B) { benchConvergence(b, 500) }

// The collector's settings when GOGC and GOMEMLIMIT are not set; see
// benchConvergence.
const (
	benchGOGC     = 400
	benchMemLimit = 4 << 30
)

// benchSeeds is how many members (the coordinator first) new members join.
const benchSeeds = 4

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		b.Fatalf("%s=%q: want a duration", name, v)
	}
	return d
}

// deathWatch counts the agents that learnt that the victim died.
type deathWatch struct {
	mu      sync.Mutex
	victim  string
	seen    int
	changed chan struct{}
}

func (w *deathWatch) left(m Member) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if m.Name == w.victim && m.State == StateDead {
		w.seen++
		select {
		case w.changed <- struct{}{}:
		default:
		}
	}
}

func (w *deathWatch) arm(victim string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.victim, w.seen = victim, 0
}

func (w *deathWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

// aliveCount is how many members one member holds alive, kept from its
// events: the harness asks for it of every member several times a second,
// and Pool.NumAlive would walk every member's table under its lock.
type aliveCount struct {
	mu    sync.Mutex
	alive map[string]bool
	n     atomic.Int64
}

func (a *aliveCount) joined(m Member) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.alive[m.Name] {
		a.alive[m.Name] = true
		a.n.Add(1)
	}
}

func (a *aliveCount) left(m Member) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.alive[m.Name] {
		delete(a.alive, m.Name)
		a.n.Add(-1)
	}
}

// gossipCounters counts memberlist's log lines that show the failure
// detector at work. Every member logs through one of these (at info level).
type gossipCounters struct {
	suspect       atomic.Int64 // "Suspect X has failed": a probe and its indirect probes went unanswered
	falseSuspect  atomic.Int64 // ... about a member that was not killed
	markedDead    atomic.Int64 // "Marking X as failed": a suspicion timed out
	falseDead     atomic.Int64 // ... about a member that was not killed
	refute        atomic.Int64 // a live member refuting a suspect or dead message about itself
	tcpFallback   atomic.Int64 // "UDP probes failed" but TCP reached the member
	handoffDrop   atomic.Int64 // "handler queue full": gossip dropped in the process
	pushPullBusy  atomic.Int64 // "Too many pending push/pull requests"
	pushPullError atomic.Int64 // "Push/Pull with X failed"

	mu     sync.Mutex
	killed map[string]bool
}

type counterSnapshot struct {
	suspect, falseSuspect, markedDead, falseDead, refute, tcpFallback, handoffDrop, pushPullBusy, pushPullError int64
}

func (c *gossipCounters) snapshot() counterSnapshot {
	return counterSnapshot{
		c.suspect.Load(), c.falseSuspect.Load(), c.markedDead.Load(), c.falseDead.Load(), c.refute.Load(),
		c.tcpFallback.Load(), c.handoffDrop.Load(), c.pushPullBusy.Load(), c.pushPullError.Load(),
	}
}

func (c *gossipCounters) sub(a, b counterSnapshot) counterSnapshot {
	return counterSnapshot{
		a.suspect - b.suspect, a.falseSuspect - b.falseSuspect, a.markedDead - b.markedDead,
		a.falseDead - b.falseDead, a.refute - b.refute, a.tcpFallback - b.tcpFallback,
		a.handoffDrop - b.handoffDrop, a.pushPullBusy - b.pushPullBusy, a.pushPullError - b.pushPullError,
	}
}

func (s counterSnapshot) String() string {
	return fmt.Sprintf("suspicions %d (%d of live members), deaths %d (%d of live members), refutations %d, "+
		"tcp-fallback %d, handoff-drops %d, push/pull busy %d failed %d",
		s.suspect, s.falseSuspect, s.markedDead, s.falseDead, s.refute, s.tcpFallback,
		s.handoffDrop, s.pushPullBusy, s.pushPullError)
}

func (c *gossipCounters) kill(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.killed[name] = true
}

func (c *gossipCounters) isKilled(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.killed[name]
}

// nameAfter returns the word after prefix in line.
func nameAfter(line []byte, prefix string) string {
	_, rest, ok := bytes.Cut(line, []byte(prefix))
	if !ok {
		return ""
	}
	if i := bytes.IndexByte(rest, ' '); i >= 0 {
		rest = rest[:i]
	}
	return string(rest)
}

// Write implements io.Writer for zerolog: one JSON line per call.
func (c *gossipCounters) Write(p []byte) (int, error) {
	switch {
	case bytes.Contains(p, []byte("has failed, no acks received")):
		c.suspect.Add(1)
		if !c.isKilled(nameAfter(p, "Suspect ")) {
			c.falseSuspect.Add(1)
		}
	case bytes.Contains(p, []byte("as failed, suspect timeout reached")):
		c.markedDead.Add(1)
		if !c.isKilled(nameAfter(p, "Marking ")) {
			c.falseDead.Add(1)
		}
	case bytes.Contains(p, []byte("Refuting a")):
		c.refute.Add(1)
	case bytes.Contains(p, []byte("over TCP but UDP probes failed")):
		c.tcpFallback.Add(1)
	case bytes.Contains(p, []byte("handler queue full")):
		c.handoffDrop.Add(1)
	case bytes.Contains(p, []byte("Too many pending push/pull")):
		c.pushPullBusy.Add(1)
	case bytes.Contains(p, []byte("Push/Pull with")):
		c.pushPullError.Add(1)
	}
	return len(p), nil
}

// sysSample is what /proc says about this process, the machine and UDP.
type sysSample struct {
	at                time.Time
	self              time.Duration // this process: user + system
	busy, total       time.Duration // the machine, all CPUs (steal excluded)
	udpIn, udpOut     int64
	udpInErr, udpRcvb int64 // InErrors, RcvbufErrors: datagrams the kernel dropped
}

func readSys() sysSample {
	s := sysSample{at: time.Now()}
	const hz = 100 // USER_HZ
	if b, err := os.ReadFile("/proc/self/stat"); err == nil {
		if i := bytes.LastIndexByte(b, ')'); i >= 0 {
			f := strings.Fields(string(b[i+1:]))
			if len(f) > 12 {
				ut, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				s.self = time.Duration(ut+st) * time.Second / hz
			}
		}
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		for i, v := range strings.Fields(line)[1:] {
			n, _ := strconv.ParseInt(v, 10, 64)
			d := time.Duration(n) * time.Second / hz
			switch i {
			case 3, 4: // idle, iowait
				s.total += d
			case 7: // steal
			case 8, 9: // guest, already in user
			default:
				s.busy += d
				s.total += d
			}
		}
	}
	if b, err := os.ReadFile("/proc/net/snmp"); err == nil {
		var names []string
		for line := range strings.Lines(string(b)) {
			rest, ok := strings.CutPrefix(line, "Udp: ")
			if !ok {
				continue
			}
			f := strings.Fields(rest)
			if names == nil {
				names = f
				continue
			}
			for i, name := range names {
				if i >= len(f) {
					break
				}
				v, _ := strconv.ParseInt(f[i], 10, 64)
				switch name {
				case "InDatagrams":
					s.udpIn = v
				case "OutDatagrams":
					s.udpOut = v
				case "InErrors":
					s.udpInErr = v
				case "RcvbufErrors":
					s.udpRcvb = v
				}
			}
		}
	}
	return s
}

// load describes the interval between two samples.
func load(a, b sysSample) string {
	// The wall time as /proc/stat counts it: samples taken by a starved
	// goroutine may lag their time stamps.
	wall := (b.total - a.total) / time.Duration(runtime.NumCPU())
	if wall <= 0 {
		return ""
	}
	cores := func(d time.Duration) float64 { return float64(d) / float64(wall) }
	ncpu := float64(runtime.NumCPU())
	self := cores(b.self - a.self)
	other := max(cores(b.busy-a.busy)-self, 0)
	return fmt.Sprintf("CPU: this process %.2f cores, other processes %.2f, of %.1f; UDP %.0f in/s %.0f out/s, kernel drops %d (rcvbuf %d)",
		self, other, ncpu, float64(b.udpIn-a.udpIn)/wall.Seconds(), float64(b.udpOut-a.udpOut)/wall.Seconds(),
		b.udpInErr-a.udpInErr, b.udpRcvb-a.udpRcvb)
}

// schedLag measures how late a goroutine that sleeps 50 ms wakes up: the
// delay every ack, probe and timer in the process suffers too.
type schedLag struct {
	mu   sync.Mutex
	lags []time.Duration
	stop chan struct{}
	done chan struct{}
}

func startSchedLag() *schedLag {
	l := &schedLag{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		const tick = 50 * time.Millisecond
		for {
			start := time.Now()
			select {
			case <-l.stop:
				return
			case <-time.After(tick):
			}
			lag := time.Since(start) - tick
			l.mu.Lock()
			l.lags = append(l.lags, lag)
			l.mu.Unlock()
		}
	}()
	return l
}

// since returns the p99 and maximum lag measured since mark, and the mark
// to pass next time.
func (l *schedLag) since(mark int) (p99, worst time.Duration, next int) {
	l.mu.Lock()
	lags := slices.Clone(l.lags[min(mark, len(l.lags)):])
	next = len(l.lags)
	l.mu.Unlock()
	if len(lags) == 0 {
		return 0, 0, next
	}
	slices.Sort(lags)
	return lags[len(lags)*99/100], lags[len(lags)-1], next
}

func (l *schedLag) close() {
	close(l.stop)
	<-l.done
}

// rtSample is the Go runtime's view: how long runnable goroutines waited
// for a CPU, and how long the collector stopped the world.
type rtSample struct {
	latency, pauses *metrics.Float64Histogram
	goroutines      uint64
	heap            uint64
	gcs             uint64
}

func readRuntime() rtSample {
	ms := []metrics.Sample{
		{Name: "/sched/latencies:seconds"},
		{Name: "/sched/pauses/total/gc:seconds"},
		{Name: "/sched/goroutines:goroutines"},
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/gc/cycles/total:gc-cycles"},
	}
	metrics.Read(ms)
	var r rtSample
	if ms[0].Value.Kind() == metrics.KindFloat64Histogram {
		r.latency = ms[0].Value.Float64Histogram()
	}
	if ms[1].Value.Kind() == metrics.KindFloat64Histogram {
		r.pauses = ms[1].Value.Float64Histogram()
	}
	if ms[2].Value.Kind() == metrics.KindUint64 {
		r.goroutines = ms[2].Value.Uint64()
	}
	if ms[3].Value.Kind() == metrics.KindUint64 {
		r.heap = ms[3].Value.Uint64()
	}
	if ms[4].Value.Kind() == metrics.KindUint64 {
		r.gcs = ms[4].Value.Uint64()
	}
	return r
}

// histQuantile is the upper bound of the bucket holding quantile q of the
// counts b minus a (a may be nil).
func histQuantile(a, b *metrics.Float64Histogram, q float64) float64 {
	if b == nil {
		return 0
	}
	counts := slices.Clone(b.Counts)
	var total uint64
	for i := range counts {
		if a != nil && i < len(a.Counts) {
			counts[i] -= a.Counts[i]
		}
		total += counts[i]
	}
	if total == 0 {
		return 0
	}
	want := uint64(q*float64(total) + 0.5)
	var seen uint64
	i := 0
	for ; i < len(counts); i++ {
		seen += counts[i]
		if seen >= max(want, 1) {
			break
		}
	}
	// Bucket i spans Buckets[i] to Buckets[i+1]; the last bound is +Inf.
	for j := min(i+1, len(b.Buckets)-1); j >= 0; j-- {
		if !math.IsInf(b.Buckets[j], 0) {
			return b.Buckets[j]
		}
	}
	return 0
}

func secs(f float64) time.Duration {
	return time.Duration(f * float64(time.Second)).Round(time.Millisecond)
}

// runtimeDelta describes the interval between two runtime samples.
func runtimeDelta(a, b rtSample) string {
	return fmt.Sprintf("runnable->running p99 %s max <%s, GC pauses max <%s, %d GCs, heap %d MiB, %d goroutines",
		secs(histQuantile(a.latency, b.latency, 0.99)), secs(histQuantile(a.latency, b.latency, 1)),
		secs(histQuantile(a.pauses, b.pauses, 1)), b.gcs-a.gcs, b.heap>>20, b.goroutines)
}

// phase reports what happened between mark and now.
type phase struct {
	b        *testing.B
	counters *gossipCounters
	lag      *schedLag
	sys      sysSample
	rt       rtSample
	snap     counterSnapshot
	lagMark  int
}

func (p *phase) mark() {
	p.sys, p.rt, p.snap = readSys(), readRuntime(), p.counters.snapshot()
	_, _, p.lagMark = p.lag.since(0)
}

func (p *phase) report(name string) counterSnapshot {
	now, rt, snap := readSys(), readRuntime(), p.counters.snapshot()
	var p99, worst time.Duration
	p99, worst, p.lagMark = p.lag.since(p.lagMark)
	d := p.counters.sub(snap, p.snap)
	p.b.Logf("%s (%s): %s; 50 ms timer late p99 %s max %s; %s; gossip: %s", name, now.at.Sub(p.sys.at).Round(time.Second),
		load(p.sys, now), p99.Round(time.Millisecond), worst.Round(time.Millisecond), runtimeDelta(p.rt, rt), d)
	p.sys, p.rt, p.snap = now, rt, snap
	return d
}

func raiseFileLimit(b *testing.B) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			b.Fatal(err)
		}
	}
	return lim.Cur
}

func openFiles() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

func benchConvergence(b *testing.B, n int) {
	batch := envInt(b, "GOSSIP_BATCH", 10)
	kills := envInt(b, "GOSSIP_KILLS", 10)
	hold := envDuration(b, "GOSSIP_HOLD", time.Minute)
	gossipInterval := envDuration(b, "GOSSIP_GOSSIP_INTERVAL", 0)
	memberConfig := func(name string) Config {
		c := LoopbackConfig(name)
		c.GossipInterval = gossipInterval
		return c
	}
	if n-1-benchSeeds < b.N*kills {
		b.Fatalf("%d kills need more than %d members", b.N*kills, n)
	}
	// One process, one heap for all members: memberlist allocates a 64 KiB
	// read buffer for every UDP packet received and an LZW table of about
	// that size for every packet sent, which for a whole pool is hundreds of
	// MB a second. At the default GOGC the collector took 44 % of the CPU
	// (300 members) and starved the acks; at 400 it takes 1-2 %. An agent
	// is one member per process and sends a few packets a second, so this is
	// the harness's cost, not the fleet's: collect less often, within a
	// memory limit (the machine is shared). GOGC and GOMEMLIMIT in the
	// environment still win.
	if os.Getenv("GOGC") == "" {
		defer debug.SetGCPercent(debug.SetGCPercent(benchGOGC))
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		defer debug.SetMemoryLimit(debug.SetMemoryLimit(benchMemLimit))
	}
	// Each member holds a UDP socket, a TCP listener and, while gossiping
	// state, TCP streams: a few thousand files at 500 members.
	fdLimit := raiseFileLimit(b)

	counters := &gossipCounters{killed: make(map[string]bool)}
	logger := zerolog.New(counters).Level(zerolog.InfoLevel)
	lag := startSchedLag()
	defer lag.close()
	ph := &phase{b: b, counters: counters, lag: lag}
	ph.mark()
	watch := &deathWatch{changed: make(chan struct{}, 1)}
	coordSaw := make(chan string, 16)

	pools := make([]*Pool, 0, n)
	var poolsMu sync.Mutex // the progress reporter reads pools
	b.Cleanup(func() {
		var wg sync.WaitGroup
		for _, p := range pools {
			wg.Go(func() { _ = p.Shutdown() })
		}
		wg.Wait()
	})

	setup := time.Now()
	coordCfg := memberConfig("coordinator")
	coordCfg.Meta.Role = RoleCoordinator
	counts := []*aliveCount{{alive: make(map[string]bool)}}
	coord, err := New(coordCfg, logger, EventFuncs{Joined: counts[0].joined, Left: func(m Member) {
		counts[0].left(m)
		if m.State == StateDead {
			select {
			case coordSaw <- m.Name:
			default:
			}
		}
	}})
	if err != nil {
		b.Fatal(err)
	}
	pools = append(pools, coord)
	seeds := []string{coord.LocalMember().Addr}

	// behind counts the members among the first k that do not see all k
	// alive.
	behind := func(k int) (late, fewest int) {
		poolsMu.Lock()
		cs := counts[:min(k, len(counts))]
		poolsMu.Unlock()
		fewest = k
		for _, c := range cs {
			if a := int(c.n.Load()); a != k {
				late++
				fewest = min(fewest, a)
			}
		}
		return late, fewest
	}

	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	// expect is how many members should be alive: those joined so far
	// while forming, then fewer by each kill.
	var expect, resyncs atomic.Int64
	expect.Store(1)
	go func() {
		defer close(progressDone)
		if !testing.Verbose() {
			return
		}
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		last, lastRT := readSys(), readRuntime()
		lagMark := 0
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
			}
			k := int(expect.Load())
			late, fewest := behind(k)
			now, rt := readSys(), readRuntime()
			var p99, worst time.Duration
			p99, worst, lagMark = lag.since(lagMark)
			fmt.Fprintf(os.Stderr, "%6s members %d/%d, %d do not see all %d alive (fewest %d), health score coordinator %d; %s; timer late p99 %s max %s; %s; %s\n",
				time.Since(setup).Round(time.Second), k, n, late, k, fewest, coord.ml.GetHealthScore(),
				load(last, now), p99.Round(time.Millisecond), worst.Round(time.Millisecond), runtimeDelta(lastRT, rt),
				counters.sub(counters.snapshot(), counterSnapshot{}))
			last, lastRT = now, rt
		}
	}()

	for start := 1; start < n; start += batch {
		end := min(start+batch, n)
		fresh := make([]*Pool, 0, end-start)
		for i := start; i < end; i++ {
			c := &aliveCount{alive: make(map[string]bool)}
			p, err := New(memberConfig(fmt.Sprintf("agent-%03d", i)), logger, EventFuncs{
				Joined: c.joined,
				Left: func(m Member) {
					c.left(m)
					watch.left(m)
				},
			})
			if err != nil {
				b.Fatal(err)
			}
			fresh = append(fresh, p)
			poolsMu.Lock()
			counts = append(counts, c)
			poolsMu.Unlock()
		}
		poolsMu.Lock()
		pools = append(pools, fresh...)
		poolsMu.Unlock()
		expect.Store(int64(end))
		var wg sync.WaitGroup
		errs := make(chan error, len(fresh))
		sem := make(chan struct{}, 4)
		for i, p := range fresh {
			seed := seeds[(start+i)%len(seeds)]
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				var err error
				for range 3 {
					if _, err = p.Join([]string{seed}); err == nil {
						return
					}
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
		// Wait until every member sees all joined so far alive. Gossip
		// reaches nearly everyone; a member that missed an alive message
		// would learn it at its next periodic push/pull (every 150 s at
		// 500 members), so one still behind after resyncAfter pushes and
		// pulls with a seed now, as its rejoin loop would if it had lost it.
		const resyncAfter = 10 * time.Second
		began := time.Now()
		deadline := began.Add(3 * time.Minute)
		lastResync := began
		for {
			late, fewest := behind(end)
			if late == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("after %s: %d of %d members do not see all %d alive (fewest %d); %s",
					time.Since(setup).Round(time.Second), late, end, end, fewest, counters.sub(counters.snapshot(), counterSnapshot{}))
			}
			if time.Since(lastResync) > resyncAfter && late <= max(end/20, 1) {
				lastResync = time.Now()
				for i, p := range pools[:end] {
					if i > 0 && int(counts[i].n.Load()) != end {
						resyncs.Add(1)
						_, _ = p.Join([]string{seeds[0]})
					}
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		// Then until the gossip of this batch has died down: members
		// re-broadcast each alive message they learn a dozen times, and the
		// next batch must not add its own on top.
		waitQuiet(end, time.Minute)
		for len(seeds) < benchSeeds && len(seeds) < end {
			seeds = append(seeds, pools[len(seeds)].LocalMember().Addr)
		}
	}
	formed := time.Since(setup)
	defer func() {
		close(stopProgress)
		<-progressDone
	}()
	b.Logf("%d members on 127.0.0.1 formed in %s (all see all alive), batches of %d, gossip interval %s, %d straggler resyncs, %d open files (limit %d), GOMAXPROCS %d GOGC %d GOMEMLIMIT %d MiB",
		n, formed.Round(time.Millisecond), batch, coord.cfg.GossipInterval, resyncs.Load(), openFiles(), fdLimit, runtime.GOMAXPROCS(0), gcPercent(),
		debug.SetMemoryLimit(-1)>>20)
	formStats := ph.report("forming")

	// Steady state: does the pool hold with nobody failing?
	if hold > 0 {
		time.Sleep(hold)
		late, fewest := behind(n)
		b.Logf("after holding %s: %d members do not see all %d alive (fewest %d)", hold, late, n, fewest)
	}
	holdStats := ph.report("steady state")

	var toCoord, toAll []time.Duration
	b.ResetTimer()
	for i := range b.N * kills {
		victim := pools[n-1-i]
		name := victim.LocalMember().Name
		watch.arm(name)
		for len(coordSaw) > 0 {
			<-coordSaw
		}
		// The agents that hold the victim alive now, and will report it.
		live := 0
		for _, p := range pools[1 : n-1-i] {
			if stateIs(p, StateAlive, name) {
				live++
			}
		}

		counters.kill(name)
		sys0, rt0, c0 := readSys(), readRuntime(), counters.snapshot()
		killed := time.Now()
		if err := victim.Shutdown(); err != nil {
			b.Fatal(err)
		}
		timeout := time.After(3 * time.Minute)
		for got := ""; got != name; {
			select {
			case got = <-coordSaw:
			case <-timeout:
				b.Fatalf("coordinator not told %s died", name)
			}
		}
		toCoord = append(toCoord, time.Since(killed))
		for watch.count() < live {
			select {
			case <-watch.changed:
			case <-timeout:
				b.Fatalf("only %d of %d agents told %s died", watch.count(), live, name)
			}
		}
		toAll = append(toAll, time.Since(killed))
		expect.Add(-1)
		sys1, rt1 := readSys(), readRuntime()
		c := counters.sub(counters.snapshot(), c0)
		b.Logf("kill %d: coordinator told after %s, all %d live agents after %s; %s; runnable->running p99 %s; %d suspicions of live members",
			i+1, toCoord[i].Round(time.Millisecond), live, toAll[i].Round(time.Millisecond),
			load(sys0, sys1), secs(histQuantile(rt0.latency, rt1.latency, 0.99)), c.falseSuspect)
		// Let the gossip about this death die down before the next one.
		waitQuiet(n-1-i, 30*time.Second)
	}
	b.StopTimer()
	killStats := ph.report("kills")
	late, fewest := behind(n - b.N*kills)
	b.Logf("after the kills: %d of %d live members do not see all %d alive (fewest %d)",
		late, n-b.N*kills, n-b.N*kills, fewest)

	b.Logf("detection, kill -> coordinator NodeLeft(dead), %d kills: median %s p90 %s max %s (min %s); -> all live agents: median %s max %s",
		len(toCoord), quantile(toCoord, 0.5).Round(time.Millisecond), quantile(toCoord, 0.9).Round(time.Millisecond),
		slices.Max(toCoord).Round(time.Millisecond), slices.Min(toCoord).Round(time.Millisecond),
		quantile(toAll, 0.5).Round(time.Millisecond), slices.Max(toAll).Round(time.Millisecond))
	b.ReportMetric(formed.Seconds(), "s-to-form")
	b.ReportMetric(quantile(toCoord, 0.5).Seconds(), "s-to-coordinator")
	b.ReportMetric(quantile(toCoord, 0.9).Seconds(), "p90-s-to-coordinator")
	b.ReportMetric(slices.Max(toCoord).Seconds(), "max-s-to-coordinator")
	b.ReportMetric(quantile(toAll, 0.5).Seconds(), "s-to-all")
	b.ReportMetric(float64(formStats.falseDead), "false-deaths-forming")
	b.ReportMetric(float64(holdStats.falseDead+killStats.falseDead), "false-deaths-after")
}

// waitQuiet waits, at most limit, until the machine sends no more UDP than
// members that only probe need: a ping and an ack per member per second,
// plus a margin. The count is the whole machine's (/proc/net/snmp).
func waitQuiet(members int, limit time.Duration) {
	for start := time.Now(); time.Since(start) < limit; {
		a := readSys()
		time.Sleep(time.Second)
		z := readSys()
		if float64(z.udpOut-a.udpOut)/z.at.Sub(a.at).Seconds() < 3*float64(members) {
			return
		}
	}
}

// gcPercent is the GOGC in force.
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return -1
	}
	return int(s[0].Value.Uint64())
}

// quantile is the nearest-rank q-quantile of d.
func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
