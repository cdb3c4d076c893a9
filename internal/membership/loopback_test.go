package membership

import (
	"fmt"
	"io"
	"log"
	"net"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/sim/faultnet"
	"github.com/hashicorp/memberlist"
)

// Real UDP and TCP sockets, all on 127.0.0.1 with kernel-chosen ports.

func assertLoopback(t *testing.T, who string, m Member) {
	t.Helper()
	host, port, err := net.SplitHostPort(m.Addr)
	if err != nil || host != "127.0.0.1" || port == "0" {
		t.Fatalf("%s: member %s advertises %q, want 127.0.0.1 and a real port", who, m.Name, m.Addr)
	}
}

func TestLoopbackJoinAndKill(t *testing.T) {
	t.Parallel()
	var pools []*Pool
	var recs []*recorder
	t.Cleanup(func() {
		for _, p := range pools {
			_ = p.Shutdown()
		}
	})
	for i := range 3 {
		rec := &recorder{}
		p, err := New(fastConfig(nodeName(i)), testLogger(), rec)
		if err != nil {
			t.Fatal(err)
		}
		assertLoopback(t, nodeName(i), p.LocalMember())
		pools, recs = append(pools, p), append(recs, rec)
	}
	for _, p := range pools[1:] {
		if _, err := p.Join([]string{pools[0].LocalMember().Addr}); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range pools {
		testwait.For(t, 10*time.Second, nodeName(i)+" holding n0, n1, n2 alive", func() (bool, string) {
			return stateIs(p, StateAlive, "n0", "n1", "n2"), fmt.Sprintf("%+v", p.Members())
		})
		for _, m := range p.Members() {
			assertLoopback(t, nodeName(i), m)
		}
	}

	killed := time.Now()
	if err := pools[2].Shutdown(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		rec := recs[i]
		testwait.Until(t, 10*time.Second, nodeName(i)+" told n2 died", func() bool {
			e, ok := rec.find("left", "n2")
			return ok && e.member.State == StateDead
		})
		e, _ := rec.find("left", "n2")
		t.Logf("%s: n2 dead after %s", nodeName(i), e.at.Sub(killed).Round(time.Millisecond))
	}
}

func TestLoopbackPartitionHeals(t *testing.T) {
	t.Parallel()
	faults := faultnet.New()
	var pools []*Pool
	t.Cleanup(func() {
		for _, p := range pools {
			_ = p.Shutdown()
		}
		faults.Close()
	})
	for i := range 3 {
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{"127.0.0.1"},
			Logger:    log.New(io.Discard, "", 0),
		})
		if err != nil {
			t.Fatal(err)
		}
		c := fastConfig(nodeName(i))
		c.Transport = faults.Wrap(nt)
		c.RejoinInterval = 200 * time.Millisecond
		if i > 0 {
			c.Join = []string{pools[0].LocalMember().Addr}
		}
		p, err := New(c, testLogger(), nil)
		if err != nil {
			t.Fatal(err)
		}
		// The advertised port is the one the wrapped transport bound.
		assertLoopback(t, nodeName(i), p.LocalMember())
		pools = append(pools, p)
	}
	all := []string{"n0", "n1", "n2"}
	for i, p := range pools {
		testwait.For(t, 10*time.Second, nodeName(i)+" holding every member alive", func() (bool, string) {
			return stateIs(p, StateAlive, all...), fmt.Sprintf("%+v", p.Members())
		})
	}

	faults.Partition(pools[2].LocalMember().Addr)
	testwait.For(t, 10*time.Second, "the partition detected on both sides", func() (bool, string) {
		return stateIs(pools[0], StateDead, "n2") && stateIs(pools[2], StateDead, "n0", "n1"),
			fmt.Sprintf("n0 %+v, n2 %+v", pools[0].Members(), pools[2].Members())
	})

	faults.Heal()
	for i, p := range pools {
		testwait.For(t, 10*time.Second, nodeName(i)+" holding every member alive after the heal", func() (bool, string) {
			return stateIs(p, StateAlive, all...), fmt.Sprintf("%+v", p.Members())
		})
	}
}
