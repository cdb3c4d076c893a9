package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestKeyed(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1000, 0)}
	k := New(Options{Burst: 3, Every: time.Minute, Now: c.now})

	let := 0
	for range 2000 {
		if ok, _ := k.Allow("node:gpu-001", "other_node"); ok {
			let++
		}
	}
	if let != 3 {
		t.Fatalf("2000 at once let %d through, want the burst of 3", let)
	}
	// Another key has its own bucket.
	if ok, _ := k.Allow("node:gpu-002", "other_node"); !ok {
		t.Fatal("a second key was held back by the first")
	}
	if got := k.Suppressed()["other_node"]; got != 1997 {
		t.Fatalf("suppressed = %d, want 1997", got)
	}
	// One refills per Every, and says what was held back meanwhile.
	c.t = c.t.Add(time.Minute)
	ok, held := k.Allow("node:gpu-001", "other_node")
	if !ok || held != 1997 {
		t.Fatalf("after a minute: ok=%v held=%d, want true and 1997", ok, held)
	}
	if ok, _ := k.Allow("node:gpu-001", "other_node"); ok {
		t.Fatal("two let through after one interval")
	}
}

func TestKeyedMemoryBound(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1000, 0)}
	k := New(Options{Burst: 1, Every: time.Minute, MaxKeys: 10, Now: c.now})
	for i := range 1000 {
		k.Allow(fmt.Sprint("peer-", i), "tls")
		if n := len(k.buckets); n > 10 {
			t.Fatalf("%d keys remembered, want at most 10", n)
		}
	}
	// A busy key (empty bucket) survives the eviction of others.
	c.t = c.t.Add(time.Hour)
	k.Allow("busy", "x")
	for i := range 30 {
		c.t = c.t.Add(time.Second) // the others are not idle either
		k.Allow(fmt.Sprint("new-", i), "x")
		k.Allow("busy", "x") // and it keeps hammering
	}
	if ok, _ := k.Allow("busy", "x"); ok {
		t.Fatal("a busy key was forgotten and got a fresh burst")
	}
}
