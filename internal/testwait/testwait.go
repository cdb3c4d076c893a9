// Package testwait is the one way tests wait for something to happen: poll a
// condition until it holds, and on timeout fail with what was awaited and the
// last state the condition saw. Tests never sleep and then assert.
package testwait

import (
	"fmt"
	"testing"
	"time"
)

// RaceScale multiplies every timeout in a binary built with -race: the race
// detector slows code 2–10×, and CI runs it on two loaded cores. A wait that
// holds costs nothing extra; only a failing one takes longer to report.
const RaceScale = raceScale

// Polling starts fast and backs off to every 10 ms: the assertions after a
// wait see the state right when it first holds. A condition that is
// expensive (it runs a process) polls slower through ForEvery.
const (
	firstPoll = 1 * time.Millisecond
	maxPoll   = 10 * time.Millisecond
)

// For polls cond until it reports done, or fails t after timeout (×RaceScale
// under -race) with what and the last state cond described.
func For(t testing.TB, timeout time.Duration, what string, cond func() (done bool, state string)) {
	t.Helper()
	ForEvery(t, timeout, maxPoll, what, cond)
}

// ForEvery is For polling at most every interval, for a condition that costs
// a process or a round trip each time.
func ForEvery(t testing.TB, timeout, interval time.Duration, what string, cond func() (done bool, state string)) {
	t.Helper()
	state, ok := poll(timeout*RaceScale, min(firstPoll, interval), interval, cond)
	switch {
	case ok:
	case state == "":
		t.Fatalf("timed out after %s waiting for %s", timeout*RaceScale, what)
	default:
		t.Fatalf("timed out after %s waiting for %s; last seen: %s", timeout*RaceScale, what, state)
	}
}

// Until is For for a condition whose state is not worth describing.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	For(t, timeout, what, func() (bool, string) { return cond(), "" })
}

// Value is For for a condition that observes one value: on timeout the last
// value is printed with %v.
func Value[V any](t testing.TB, timeout time.Duration, what string, observe func() V, done func(V) bool) V {
	t.Helper()
	var last V
	For(t, timeout, what, func() (bool, string) {
		last = observe()
		return done(last), fmt.Sprintf("%v", last)
	})
	return last
}

// poll runs cond until it holds or the deadline passes; it reports the last
// state and whether cond held. cond always runs at least once, and once more
// at the deadline, so a slow scheduler never turns a success into a timeout.
func poll(timeout, first, most time.Duration, cond func() (bool, string)) (string, bool) {
	deadline := time.Now().Add(timeout)
	interval := first
	for {
		done, state := cond()
		if done {
			return state, true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return state, false
		}
		time.Sleep(min(interval, left))
		interval = min(2*interval, most)
	}
}

// Throughout checks that holds stays true until done reports true: it
// polls both, fails t at once when holds is false (with its state), and
// fails after timeout (×RaceScale under -race) when done never came. done
// should count what proves the quiet was tested (probe rounds delivered,
// a confirmation that ran), not only a time: a test that sees nothing
// happen must show the thing was looked at.
func Throughout(t testing.TB, timeout time.Duration, what string, holds func() (bool, string), done func() (bool, string)) {
	t.Helper()
	var broke string
	failed := false
	state, ok := poll(timeout*RaceScale, firstPoll, maxPoll, func() (bool, string) {
		if ok, st := holds(); !ok {
			failed, broke = true, st
			return true, ""
		}
		return done()
	})
	switch {
	case failed:
		t.Fatalf("%s: no longer so: %s", what, broke)
	case ok:
	case state == "":
		t.Fatalf("timed out after %s checking %s: the end never came", timeout*RaceScale, what)
	default:
		t.Fatalf("timed out after %s checking %s: the end never came; last seen: %s", timeout*RaceScale, what, state)
	}
}
