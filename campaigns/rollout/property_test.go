package rollout

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/drain"
)

// TestMaxUnavailableNeverExceeded is a property test over random specs,
// fleet sizes, nodes drained beforehand, busy nodes and random failures:
// at no point are more nodes out of service (drained by anyone, or with
// their agent away) than the spec allows, unless nodes drained by others
// alone exceed it, and then the rollout adds none.
func TestMaxUnavailableNeverExceeded(t *testing.T) {
	t.Parallel()
	seeds := 40
	if testing.Short() {
		seeds = 10
	}
	for seed := 1; seed <= seeds; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
			size := 4 + rng.IntN(30)
			h := newHarness(t, size)
			h.tick = time.Duration(10+rng.IntN(50)) * time.Second

			foreign := map[string]bool{}
			for _, name := range h.fleet.order {
				switch p := rng.Float64(); {
				case p < 0.10:
					h.drain.Set(name, drain.Status{Drained: true, Reason: "maintenance"})
					foreign[name] = true
				case p < 0.16:
					h.fleet.set(name, func(n *fnode) { n.badAfter = true })
				case p < 0.20:
					h.fleet.set(name, func(n *fnode) { n.lost = true })
				case p < 0.23:
					h.fleet.set(name, func(n *fnode) { n.failAction = true })
				case p < 0.26:
					h.fleet.set(name, func(n *fnode) { n.slowAfter = 0.5 })
				case p < 0.40:
					h.drain.jobsTill[name] = h.clock.Now().Add(time.Duration(rng.IntN(40)) * time.Minute)
				}
			}

			spec := baseSpec()
			canary := 1 + rng.IntN(3)
			spec.Canary = &canary
			spec.Waves = nil
			for range 1 + rng.IntN(3) {
				if rng.IntN(2) == 0 {
					spec.Waves = append(spec.Waves, Count(1+rng.IntN(8)))
				} else {
					spec.Waves = append(spec.Waves, Percent(float64(5+rng.IntN(60))))
				}
			}
			if rng.IntN(2) == 0 {
				spec.MaxUnavailable = Count(1 + rng.IntN(6))
			} else {
				spec.MaxUnavailable = Percent(float64(5 + rng.IntN(30)))
			}
			spec.FailureBudget.Canary = Count(rng.IntN(2))
			spec.FailureBudget.Wave = Count(rng.IntN(4))
			spec.Soak = Duration(time.Duration(rng.IntN(3)) * 5 * time.Minute)
			spec.Deadlines.Rebooting = Duration(10 * time.Minute)
			spec.Deadlines.Draining = Duration(30 * time.Minute)
			id := h.start(spec)
			limit := maxUnavailable(spec, size, size)
			bound := max(limit, len(foreign))

			check := func(when string) {
				out := map[string]bool{}
				for name, st := range h.drain.Snapshot() {
					if st.Drained {
						out[name] = true
					}
				}
				h.fleet.mu.Lock()
				for name, n := range h.fleet.nodes {
					if !h.fleet.connectedLocked(n) {
						out[name] = true
					}
				}
				h.fleet.mu.Unlock()
				if len(out) > bound {
					t.Fatalf("%s: %d nodes out of service, limit %d (%d drained by others); spec %+v", when, len(out), limit, len(foreign), spec)
				}
			}
			for i := 0; ; i++ {
				if i > 2000 {
					t.Fatalf("not settled: %+v", h.status(id).Counts)
				}
				if err := h.eng.Step(h.ctx); err != nil {
					t.Fatal(err)
				}
				check("after a step")
				h.eng.waitOps()
				check("after its operations")
				h.clock.advance(h.tick)
				s := h.status(id)
				if s.Paused {
					t.Fatalf("paused: %s", s.PauseReason)
				}
				if s.Phase == PhaseCompleted || s.Phase == PhaseHalted {
					break
				}
				if s.Unavailable == s.Counts[Failed] && strings.HasPrefix(s.Blocked, "max unavailable reached") {
					// Nothing in flight and no room: failed nodes (kept out of
					// service) and others' drains fill the limit. The rollout
					// waits for a human, which is what it should do.
					break
				}
			}
			for name, c := range h.fleet.upgradeCalls() {
				if c > 1 {
					t.Fatalf("%s upgraded %d times", name, c)
				}
				if foreign[name] {
					t.Fatalf("%s was drained by someone else and got upgraded", name)
				}
			}
			for name := range foreign {
				if h.drain.undrainCount(name) != 0 {
					t.Fatalf("%s: foreign drain undone", name)
				}
			}
		})
	}
}
