package membership

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

func TestRejoinTargets(t *testing.T) {
	t.Parallel()
	now := time.Now()
	const (
		self  = "127.0.0.1:7000"
		coord = "127.0.0.1:7001"
		peer  = "127.0.0.1:7002"
		gone  = "127.0.0.1:7003"
	)
	rec := func(name, addr string, s State, age time.Duration) memberRecord {
		return memberRecord{Member: Member{Name: name, Addr: addr, State: s}, since: now.Add(-age)}
	}
	tests := []struct {
		name    string
		seeds   []string
		members []memberRecord
		left    bool
		want    []string
	}{
		{
			name:  "steady state sends nothing",
			seeds: []string{coord},
			members: []memberRecord{
				rec("self", self, StateAlive, time.Hour), rec("coord", coord, StateAlive, time.Hour),
				rec("peer", peer, StateAlive, time.Hour),
			},
		},
		{
			name:    "alone: contact the seed",
			seeds:   []string{coord},
			members: []memberRecord{rec("self", self, StateAlive, time.Hour)},
			want:    []string{coord},
		},
		{
			name:  "seed dead: contact it once, not twice",
			seeds: []string{coord},
			members: []memberRecord{
				rec("self", self, StateAlive, time.Hour), rec("coord", coord, StateDead, time.Minute),
			},
			want: []string{coord},
		},
		{
			name:  "dead peer",
			seeds: []string{coord},
			members: []memberRecord{
				rec("self", self, StateAlive, time.Hour), rec("coord", coord, StateAlive, time.Hour),
				rec("peer", peer, StateDead, time.Minute),
			},
			want: []string{peer},
		},
		{
			name: "left peer is not chased",
			members: []memberRecord{
				rec("self", self, StateAlive, time.Hour), rec("peer", peer, StateLeft, time.Minute),
			},
		},
		{
			name: "dead too long is forgotten",
			members: []memberRecord{
				rec("self", self, StateAlive, time.Hour), rec("gone", gone, StateDead, 25*time.Hour),
			},
		},
		{
			name:    "own address among the seeds",
			seeds:   []string{self},
			members: []memberRecord{rec("self", self, StateAlive, time.Hour)},
		},
		{
			name:    "after Leave nothing",
			seeds:   []string{coord},
			members: []memberRecord{rec("self", self, StateAlive, time.Hour)},
			left:    true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := &Pool{
				cfg:     Config{NodeName: "self"}.withDefaults(),
				members: make(map[string]memberRecord),
				seeds:   tc.seeds,
				left:    tc.left,
			}
			for _, r := range tc.members {
				p.members[r.Name] = r
			}
			got := p.rejoinTargets(now)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("targets = %v, want %v", got, tc.want)
			}
			if _, kept := p.members["gone"]; kept {
				t.Fatal("a member dead longer than ReconnectTimeout was kept")
			}
		})
	}
}

func TestRejoinIsRationedInLargePools(t *testing.T) {
	t.Parallel()
	now := time.Now()
	p := &Pool{
		cfg:     Config{NodeName: "self"}.withDefaults(),
		members: make(map[string]memberRecord),
		seeds:   []string{"127.0.0.1:7000"}, // the coordinator, dead
	}
	for i := range 200 {
		name := fmt.Sprintf("a%03d", i)
		p.members[name] = memberRecord{Member: Member{Name: name, Addr: fmt.Sprintf("127.0.0.1:%d", 8000+i)}, since: now}
	}
	p.members["self"] = memberRecord{Member: Member{Name: "self", Addr: "127.0.0.1:7999"}, since: now}
	p.members["coord"] = memberRecord{Member: Member{Name: "coord", Addr: "127.0.0.1:7000", State: StateDead}, since: now}

	const rounds = 2000
	attempts := 0
	for range rounds {
		if len(p.rejoinTargets(now)) > 0 {
			attempts++
		}
	}
	// Expected per member and round: (rejoinFanout+1)/200, at most 2 %:
	// about 40 of 2000. Without rationing it would be all 2000.
	if attempts == 0 || attempts > 120 {
		t.Fatalf("%d rejoin attempts in %d rounds, want about %d", attempts, rounds, rounds*(rejoinFanout+1)/200)
	}
}

func TestSeedAliveResolvesHostNames(t *testing.T) {
	t.Parallel()
	alive := map[string]bool{"127.0.0.1:7001": true}
	if !seedAlive("127.0.0.1:7001", alive) || seedAlive("127.0.0.1:7002", alive) {
		t.Fatal("IP seeds matched wrongly")
	}
	// localhost comes from /etc/hosts: no DNS traffic.
	if !seedAlive("localhost:7001", alive) {
		t.Fatal("localhost:7001 not matched to 127.0.0.1:7001")
	}
}
