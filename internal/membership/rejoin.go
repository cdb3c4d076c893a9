package membership

import (
	"context"
	"math/rand/v2"
	"net"
	"slices"
	"time"
)

// resolveTimeout bounds the DNS lookup of a seed given by host name.
const resolveTimeout = 2 * time.Second

// rejoinLoop re-contacts seeds and dead members; see the package doc for why.
// It returns as soon as the pool stops; a join still in flight then ends on
// its own within TCPTimeout per address.
func (p *Pool) rejoinLoop(interval time.Duration) {
	defer close(p.loopDone)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		if targets := p.rejoinTargets(time.Now()); len(targets) > 0 {
			done := make(chan struct{})
			go func() {
				defer close(done)
				p.rejoin(targets)
			}()
			select {
			case <-done:
			case <-p.stop:
				return
			}
		}
		select {
		case <-ticker.C:
		case <-p.stop:
			return
		}
	}
}

func (p *Pool) rejoin(targets []string) {
	n, err := p.ml.Join(targets)
	if err != nil {
		// Expected while the coordinator is down or the partition lasts;
		// the agent stream reports that to operators, not this log.
		p.log.Debug().Err(err).Strs("targets", targets).Msg("rejoin found nobody")
		return
	}
	p.log.Info().Int("contacted", n).Strs("targets", targets).Msg("rejoined gossip pool")
}

// rejoinFanout is how many members of a pool that lost its seeds are
// expected to contact them per RejoinInterval, all together.
const rejoinFanout = 3

// rejoinTargets forgets members gone longer than ReconnectTimeout and returns
// the addresses worth contacting now:
//
//   - the seeds that are not alive members: always when this member is alone
//     (it is the one cut off), otherwise with probability rejoinFanout/alive,
//     so that a pool that lost its coordinator sends it a few joins per
//     interval rather than one per member when it comes back;
//   - the last address of one randomly chosen dead member, with probability
//     dead/alive, so that each dead member gets about one attempt per interval
//     from the whole pool.
//
// A join is a full state exchange, which in a pool of thousands is a
// megabyte or more, hence the budget. In steady state (seeds alive, nobody
// dead) it returns nothing.
func (p *Pool) rejoinTargets(now time.Time) []string {
	p.mu.Lock()
	if p.left {
		p.mu.Unlock()
		return nil
	}
	self := p.members[p.cfg.NodeName].Addr
	alive := make(map[string]bool)
	var dead []string
	for name, r := range p.members {
		switch {
		case r.State == StateAlive:
			alive[r.Addr] = true
		case now.Sub(r.since) > p.cfg.ReconnectTimeout:
			delete(p.members, name)
		case r.State == StateDead && r.Addr != self:
			dead = append(dead, r.Addr)
		}
	}
	seeds := append([]string(nil), p.seeds...)
	p.mu.Unlock()

	others := len(alive) - 1 // alive includes this member
	chance := func(expected int) bool {
		return others <= 0 || rand.Float64()*float64(others) < float64(expected)
	}
	var targets []string
	for _, s := range seeds {
		if !seedAlive(s, alive) {
			targets = append(targets, s)
		}
	}
	if len(targets) > 0 && !chance(rejoinFanout) {
		targets = nil
	}
	if len(dead) > 0 && chance(len(dead)) {
		pick := dead[rand.IntN(len(dead))]
		if !slices.Contains(targets, pick) {
			targets = append(targets, pick)
		}
	}
	return targets
}

// seedAlive reports whether a seed address is the address of an alive member
// (this one included, so a coordinator listed among its own seeds does not
// dial itself). A host name is resolved; if that fails the seed counts as not
// alive and memberlist's join tries it.
func seedAlive(seed string, alive map[string]bool) bool {
	host, port, err := net.SplitHostPort(seed)
	if err != nil {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return alive[net.JoinHostPort(ip.String(), port)]
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	ips, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if parsed := net.ParseIP(ip); parsed != nil && alive[net.JoinHostPort(parsed.String(), port)] {
			return true
		}
	}
	return false
}
