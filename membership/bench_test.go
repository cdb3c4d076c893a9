package membership

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"
)

// Gossip convergence: how long after a member dies until the coordinator
// gets NodeLeft for it (and until every live member has), with all members
// on real loopback UDP/TCP sockets and memberlist's LAN timing (the
// package defaults: probe 1 s, suspicion 4 × log10(n) × probe). Slow by
// nature, so benchmarks rather than tests:
//
//	go test -run '^$' -bench GossipConvergence -timeout 20m ./membership/
//
// The pool is built once per benchmark run (a minute or more for 500); each
// iteration then kills killsPerOp agents one after another, and the reported
// figures are medians over all kills.

const killsPerOp = 3

func BenchmarkGossipConvergence100(b *testing.B) { benchConvergence(b, 100) }
func BenchmarkGossipConvergence500(b *testing.B) { benchConvergence(b, 500) }

// deathWatch records when each member learnt that a victim died.
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

func benchConvergence(b *testing.B, n int) {
	if n-1 <= b.N*killsPerOp {
		b.Fatalf("%d iterations need more than %d members", b.N, n)
	}
	logger := testLogger()
	watch := &deathWatch{changed: make(chan struct{}, 1)}
	coordSaw := make(chan string, 1)

	pools := make([]*Pool, 0, n)
	b.Cleanup(func() {
		var wg sync.WaitGroup
		for _, p := range pools {
			wg.Go(func() { _ = p.Shutdown() })
		}
		wg.Wait()
	})

	setup := time.Now()
	coordCfg := LoopbackConfig("coordinator")
	coordCfg.Meta.Role = RoleCoordinator
	coord, err := New(coordCfg, logger, EventFuncs{Left: func(m Member) {
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
	seed := []string{coord.LocalMember().Addr}
	for i := 1; i < n; i++ {
		p, err := New(LoopbackConfig(fmt.Sprintf("agent-%03d", i)), logger, EventFuncs{Left: watch.left})
		if err != nil {
			b.Fatal(err)
		}
		pools = append(pools, p)
	}
	// Agents start together in a real fleet too: join a few at a time.
	var joinWG sync.WaitGroup
	joinErr := make(chan error, n)
	sem := make(chan struct{}, 8)
	for _, p := range pools[1:] {
		joinWG.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			// A starved machine can time a join out; a fleet agent would
			// retry too (its rejoin loop).
			var err error
			for range 3 {
				if _, err = p.Join(seed); err == nil {
					return
				}
			}
			joinErr <- err
		})
	}
	joinWG.Wait()
	close(joinErr)
	if err := <-joinErr; err != nil {
		b.Fatal(err)
	}
	// A second push/pull with the coordinator hands every agent the full
	// member list, instead of waiting for gossip to tell the early joiners
	// about the late ones.
	for _, p := range pools[1:] {
		if _, err := p.Join(seed); err != nil {
			b.Fatal(err)
		}
	}
	lastReport := time.Now()
	eventually(b, 5*time.Minute, func() bool {
		behind := 0
		for _, p := range pools {
			if p.NumAlive() != n {
				behind++
			}
		}
		if testing.Verbose() && time.Since(lastReport) > 10*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(os.Stderr, "%s: %d of %d members do not see all %d alive yet\n",
				time.Since(setup).Round(time.Second), behind, n, n)
		}
		return behind == 0
	}, "pool of %d did not converge: coordinator holds %d alive", n, coord.NumAlive())
	b.Logf("%d members on 127.0.0.1 converged in %s", n, time.Since(setup).Round(time.Millisecond))

	var toCoord, toAll []time.Duration
	b.ResetTimer()
	for i := range b.N * killsPerOp {
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
		b.Logf("kill %d: coordinator told after %s, all %d live agents after %s",
			i+1, toCoord[i].Round(time.Millisecond), live, toAll[i].Round(time.Millisecond))
	}
	b.StopTimer()
	b.ReportMetric(median(toCoord).Seconds(), "s-to-coordinator")
	b.ReportMetric(median(toAll).Seconds(), "s-to-all")
	b.ReportMetric(slices.Max(toCoord).Seconds(), "max-s-to-coordinator")
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
