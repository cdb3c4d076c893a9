package membership

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

func TestJoinAndMetaPropagation(t *testing.T) {
	t.Parallel()
	const n = 5
	mc := newMockCluster(t, n, func(i int, c *Config, _ []*Pool) {
		c.Meta = Meta{Role: RoleAgent, AgentVersion: "v1.0.0", ProtocolVersion: "1",
			Labels: map[string]string{"idx": strconv.Itoa(i), "sku": "h100"}}
		if i == 0 {
			c.Meta.Role = RoleCoordinator
		}
	})
	mc.joinAll(t, upTo(n)[1:]...)

	for i, p := range mc.pools {
		members := p.Members()
		if len(members) != n {
			t.Fatalf("%s: %d members, want %d", nodeName(i), len(members), n)
		}
		for j, m := range members {
			if m.Name != nodeName(j) {
				t.Fatalf("%s: member %d = %+v", nodeName(i), j, m)
			}
			if !strings.HasPrefix(m.Addr, "127.0.0.1:") {
				t.Fatalf("%s: member %s advertises %s, want 127.0.0.1", nodeName(i), m.Name, m.Addr)
			}
			if m.Meta.Labels["idx"] != strconv.Itoa(j) || m.Meta.AgentVersion != "v1.0.0" {
				t.Fatalf("%s: member %s meta %+v", nodeName(i), m.Name, m.Meta)
			}
		}
		if got, _ := p.Member("n0"); got.Meta.Role != RoleCoordinator {
			t.Fatalf("%s: n0 role %q", nodeName(i), got.Meta.Role)
		}
	}
	for j := range n {
		if _, ok := mc.recs[0].find("joined", nodeName(j)); !ok {
			t.Fatalf("n0 got no NodeJoined for %s", nodeName(j))
		}
	}

	// A meta change reaches every member as NodeUpdated.
	newMeta := Meta{Role: RoleAgent, AgentVersion: "v1.1.0", ProtocolVersion: "1",
		Labels: map[string]string{"idx": "3", "sku": "h100", "rack": "r9"}}
	if err := mc.pools[3].UpdateMeta(newMeta); err != nil {
		t.Fatal(err)
	}
	for i, p := range mc.pools {
		testwait.For(t, 5*time.Second, nodeName(i)+" seeing n3's new meta", func() (bool, string) {
			m, _ := p.Member("n3")
			return m.Meta.Labels["rack"] == "r9" && m.Meta.AgentVersion == "v1.1.0", fmt.Sprintf("%+v", m.Meta)
		})
		rec := mc.recs[i]
		testwait.Until(t, 2*time.Second, nodeName(i)+" getting an event with n3's new meta", func() bool {
			e, ok := rec.find("updated", "n3")
			if !ok {
				// A member that wrongly held n3 dead for a moment (a
				// starved test machine) learns the new meta as a rejoin.
				e, ok = rec.find("joined", "n3")
			}
			return ok && e.member.Meta.Labels["rack"] == "r9"
		})
	}

	if err := mc.pools[3].UpdateMeta(Meta{Role: "bogus"}); !errors.Is(err, ErrInvalidMeta) {
		t.Fatalf("UpdateMeta(bad role) = %v, want ErrInvalidMeta", err)
	}
	huge := Meta{Role: RoleAgent, Labels: map[string]string{"x": strings.Repeat("y", 600)}}
	if err := mc.pools[3].UpdateMeta(huge); !errors.Is(err, ErrMetaTooLarge) {
		t.Fatalf("UpdateMeta(huge) = %v, want ErrMetaTooLarge", err)
	}
}

func TestKilledMemberReportedDead(t *testing.T) {
	t.Parallel()
	const n = 4
	mc := newMockCluster(t, n, nil)
	mc.joinAll(t, upTo(n)[1:]...)

	killed := time.Now()
	if err := mc.pools[3].Shutdown(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		rec := mc.recs[i]
		testwait.Until(t, 10*time.Second, nodeName(i)+" told n3 died", func() bool {
			e, ok := rec.find("left", "n3")
			return ok && e.member.State == StateDead
		})
		e, _ := rec.find("left", "n3")
		t.Logf("%s: n3 dead after %s", nodeName(i), e.at.Sub(killed).Round(time.Millisecond))
		if m, ok := mc.pools[i].Member("n3"); !ok || m.State != StateDead {
			t.Fatalf("%s: Member(n3) = %+v, %v; want dead", nodeName(i), m, ok)
		}
	}
}

func TestLeaveReportedAsLeft(t *testing.T) {
	t.Parallel()
	const n = 3
	mc := newMockCluster(t, n, nil)
	mc.joinAll(t, upTo(n)[1:]...)

	if err := mc.pools[2].Leave(3 * time.Second); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		rec := mc.recs[i]
		testwait.Until(t, 5*time.Second, nodeName(i)+" seeing n2 leave", func() bool {
			e, ok := rec.find("left", "n2")
			return ok && e.member.State == StateLeft
		})
	}
}

// partitionScenario splits n2 and n3 off a four-member pool until both sides
// have declared the other dead and memberlist has stopped gossiping to the
// dead (GossipToTheDeadTime = PushPullInterval), then heals the network.
func partitionScenario(t *testing.T, rejoin time.Duration, seeds bool) *mockCluster {
	t.Helper()
	const n = 4
	mc := newMockCluster(t, n, func(i int, c *Config, started []*Pool) {
		c.RejoinInterval = rejoin
		if seeds && i > 0 {
			// Agents know the coordinator's address; the coordinator knows nobody.
			c.Join = []string{started[0].LocalMember().Addr}
		}
	})
	if seeds {
		mc.waitAlive(t, upTo(n)...)
	} else {
		mc.joinAll(t, upTo(n)[1:]...)
	}

	mc.faults.Partition(mc.addr(2), mc.addr(3))
	for i, p := range mc.pools {
		other := []string{"n2", "n3"}
		if i >= 2 {
			other = []string{"n0", "n1"}
		}
		testwait.For(t, 10*time.Second, fmt.Sprintf("%s holding %v dead during the partition", nodeName(i), other), func() (bool, string) {
			return stateIs(p, StateDead, other...), fmt.Sprintf("%+v", p.Members())
		})
	}
	if mc.faults.Dropped() == 0 {
		t.Fatal("the partition dropped no packets")
	}
	// The partition outlives the state exchanges under way when it began:
	// every member has had a push-pull round (a stream to a live member of
	// its side) since, counted rather than slept for.
	dialed := mc.faults.Dialed()
	testwait.Value(t, 10*time.Second, "a push-pull round of every member during the partition", mc.faults.Dialed,
		func(n uint64) bool { return n >= dialed+uint64(len(mc.pools)) })
	mc.faults.Heal()
	return mc
}

func TestPartitionHealsThroughRejoin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		seeds bool
	}{
		{"seeds", true},         // n2, n3 find the coordinator again
		{"dead members", false}, // nobody has seeds: members retry the dead ones' addresses
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mc := partitionScenario(t, 200*time.Millisecond, tc.seeds)
			healed := time.Now()
			mc.waitAlive(t, upTo(len(mc.pools))...)
			t.Logf("all members alive again %s after the heal", time.Since(healed).Round(time.Millisecond))
			e, ok := mc.recs[0].find("joined", "n2")
			if !ok || e.at.Before(healed) {
				t.Fatalf("n0 got no NodeJoined for n2 after the heal")
			}
		})
	}
}

func TestPartitionStaysWithoutRejoin(t *testing.T) {
	t.Parallel()
	// The control for the test above: memberlist alone does not merge the
	// two sides once each holds the other dead.
	mc := partitionScenario(t, -1, false)
	// Every member has had push-pull rounds since the heal (each opens a
	// stream to a live member every interval): had memberlist a way to
	// merge the sides, it has had the chance.
	dialed := mc.faults.Dialed()
	testwait.Value(t, 10*time.Second, "two push-pull rounds of every member after the heal", mc.faults.Dialed,
		func(n uint64) bool { return n >= dialed+2*uint64(len(mc.pools)) })
	if !stateIs(mc.pools[0], StateDead, "n2", "n3") {
		t.Fatalf("memberlist merged the sides by itself, so the rejoin tests prove nothing: %+v", mc.pools[0].Members())
	}
}

func TestKeyringRotationKeepsMembers(t *testing.T) {
	t.Parallel()
	oldKey := []byte("old-key-16-bytes")
	newKey := []byte("new-key-32-bytes-new-key-32-byte")
	const pool = 3 // members 0-2 rotate; 3 and 4 try to join afterwards
	mc := newMockCluster(t, pool+2, func(i int, c *Config, _ []*Pool) {
		c.Keyring = [][]byte{oldKey}
		switch i {
		case pool:
			c.Keyring = [][]byte{newKey}
		case pool + 1:
			c.Keyring = [][]byte{oldKey}
		}
	})
	mc.joinAll(t, upTo(pool)[1:]...)
	members := mc.pools[:pool]

	// settle lets each step reach the wire: two probe rounds of every
	// member (a ping and its ack each) delivered since, counted.
	settle := func(what string) {
		t.Helper()
		d := mc.faults.Delivered()
		testwait.Value(t, 10*time.Second, "two probe rounds "+what, mc.faults.Delivered,
			func(n uint64) bool { return n >= d+4*uint64(len(members)) })
	}
	for _, p := range members {
		if err := p.InstallKey(newKey); err != nil {
			t.Fatal(err)
		}
	}
	settle("with the new key installed")
	for _, p := range members {
		if err := p.UseKey(newKey); err != nil {
			t.Fatal(err)
		}
	}
	settle("on the new key, the old one still accepted")
	for _, p := range members {
		if err := p.RemoveKey(oldKey); err != nil {
			t.Fatal(err)
		}
	}
	// Five probe rounds on the new key alone (a ping and its ack each).
	delivered := mc.faults.Delivered()
	testwait.Value(t, 10*time.Second, "five probe rounds on the new key", mc.faults.Delivered,
		func(n uint64) bool { return n >= delivered+10*uint64(len(members)) })

	mc.waitAlive(t, upTo(pool)...)
	for i, p := range members {
		if n := mc.recs[i].count("left"); n != 0 {
			// A starved test machine can cost a member a moment as dead;
			// a broken rotation would keep it dead, which waitAlive catches.
			t.Logf("%s: %d NodeLeft events during rotation", nodeName(i), n)
		}
		keys := p.Keys()
		if len(keys) != 1 || string(keys[0]) != string(newKey) {
			t.Fatalf("%s: keys %q, want only the new key", nodeName(i), keys)
		}
	}

	if _, err := mc.pools[pool].Join([]string{mc.addr(0)}); err != nil {
		t.Fatalf("member with the new key cannot join: %v", err)
	}
	if _, err := mc.pools[pool+1].Join([]string{mc.addr(0)}); err == nil {
		t.Fatal("member with only the retired key joined")
	}
	// The newcomer hears the others only if they all gossip on the new key.
	mc.waitAlive(t, upTo(pool+1)...)
}

func TestForeignMembersDoNotJoin(t *testing.T) {
	t.Parallel()
	key := []byte("fleet-key-16byte")
	otherKey := []byte("other-key-16byte")
	tests := []struct {
		name    string
		label   string
		keyring [][]byte
	}{
		{"other cluster label", "other-fleet", [][]byte{key}},
		{"no cluster label", "", [][]byte{key}},
		{"wrong key", "fleet", [][]byte{otherKey}},
		{"no encryption", "fleet", nil},
	}
	mc := newMockCluster(t, len(tests)+1, func(i int, c *Config, _ []*Pool) {
		c.ClusterLabel, c.Keyring = "fleet", [][]byte{key}
		if i > 0 {
			c.ClusterLabel, c.Keyring = tests[i-1].label, tests[i-1].keyring
		}
	})
	for i, tc := range tests {
		if _, err := mc.pools[i+1].Join([]string{mc.addr(0)}); err == nil {
			t.Errorf("%s: join succeeded", tc.name)
		}
	}
	// n0 handles each join on a goroutine of its own, after the joiner
	// has given up: wait until it has refused every one (its log says so),
	// then check that nobody got in on either side, not even for a moment
	// (n0's recorder saw every join event).
	testwait.For(t, 10*time.Second, "n0 refusing every foreign join", func() (bool, string) {
		logs := mc.logs[0].String()
		return strings.Count(logs, `"subsystem":"memberlist"`) >= len(tests), logs
	})
	t.Logf("n0 refused with:\n%s", mc.logs[0].String())
	if e, ok := mc.recs[0].firstOther("joined", "n0"); ok {
		t.Fatalf("n0 saw %s join", e.member.Name)
	}
	if got := mc.pools[0].NumAlive(); got != 1 {
		t.Fatalf("n0 sees %d alive members: %+v", got, mc.pools[0].Members())
	}
	for i := range tests {
		if got := mc.pools[i+1].NumAlive(); got != 1 {
			t.Fatalf("%s sees %d alive members", tests[i].name, got)
		}
	}
}

func TestEventsMayCallBackIntoPool(t *testing.T) {
	t.Parallel()
	var self atomic.Pointer[Pool]
	var seen atomic.Int64
	c := fastConfig("solo")
	events := EventFuncs{Joined: func(m Member) {
		if p := self.Load(); p != nil {
			seen.Store(int64(len(p.Members())))
		}
	}}
	p, err := New(c, testLogger(), events)
	if err != nil {
		t.Fatal(err)
	}
	self.Store(p)
	// Trigger another event now that the callback can see the pool.
	p.observe(eventJoined, p.ml.LocalNode())
	testwait.Until(t, time.Second, "the callback to run", func() bool { return seen.Load() == 1 })
	if err := p.Shutdown(); err != nil {
		t.Fatal(err)
	}
}

func TestLifecycleErrors(t *testing.T) {
	t.Parallel()
	plain, err := New(fastConfig("plain"), testLogger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("0123456789abcdef")
	if err := plain.InstallKey(key); !errors.Is(err, ErrNoKeyring) {
		t.Errorf("InstallKey without keyring = %v", err)
	}
	if plain.Keys() != nil {
		t.Errorf("Keys without keyring = %q", plain.Keys())
	}

	c := fastConfig("keyed")
	c.Keyring = [][]byte{key}
	keyed, err := New(c, testLogger(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := keyed.UseKey([]byte("not-installed-16")); err == nil {
		t.Error("UseKey of a key not installed succeeded")
	}
	if err := keyed.RemoveKey(key); err == nil {
		t.Error("RemoveKey of the primary key succeeded")
	}
	if err := keyed.InstallKey([]byte("short")); err == nil {
		t.Error("InstallKey of a 5-byte key succeeded")
	}

	for _, p := range []*Pool{plain, keyed} {
		if err := p.Shutdown(); err != nil {
			t.Fatal(err)
		}
		if err := p.Shutdown(); err != nil {
			t.Fatalf("second Shutdown: %v", err)
		}
		if _, err := p.Join([]string{"127.0.0.1:1"}); !errors.Is(err, ErrShutdown) {
			t.Errorf("Join after Shutdown = %v", err)
		}
		if err := p.Leave(time.Second); !errors.Is(err, ErrShutdown) {
			t.Errorf("Leave after Shutdown = %v", err)
		}
		if err := p.UpdateMeta(Meta{Role: RoleAgent}); !errors.Is(err, ErrShutdown) {
			t.Errorf("UpdateMeta after Shutdown = %v", err)
		}
	}
}
