package coordinator

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/membership"
)

// Gossip is a liveness hint (membership package doc): a member reported
// dead marks its node unreachable and one back alive clears that, and
// nothing else. Gossip never drains, decides a result or moves a campaign:
// campaigns see the state the agent stream and the results give (fleet.go).
//
// Gossip meta (labels, versions) is shown by GossipMembers but never
// replaces what the node's authenticated stream said: without a keyring
// anyone on the network can gossip, and with one any member can claim any
// name.

// A member another member declared dead is believed only once the death
// has stood for deathConfirmProbes probe intervals. A member cut off from
// the pool declares everyone else dead, and once healed it gossips those
// deaths; memberlist applies a peer's dead message at once, and the accused
// member refutes it within a few gossip rounds. Without the wait every node
// of a healthy fleet flapped healthy -> unreachable -> healthy whenever one
// member's partition healed.
const deathConfirmProbes = 2

// gossipKeyringFile is where a rotation leaves the coordinator's keyring,
// so a restart after a rotation starts with the rotated keys.
const gossipKeyringFile = "gossip.keyring"

// gossipCause prefixes the reasons of states gossip set, so that only
// those are cleared when the member is alive again.
const gossipCause = "gossip: "

// startGossip joins (forms) the pool when the config turns gossip on.
func (s *Server) startGossip() error {
	g := s.cfg.Gossip
	if !g.Enabled() {
		return nil
	}
	keys, from, err := membership.LoadKeyring(g.KeyringFile, filepath.Join(s.cfg.DataDir, gossipKeyringFile))
	if err != nil {
		return fmt.Errorf("gossip keyring: %w", err)
	}
	name := g.Name
	if name == "" {
		name = DefaultGossipName
	}
	mc, err := g.Config(name, membership.Meta{Role: membership.RoleCoordinator, AgentVersion: s.opts.Version,
		ProtocolVersion: ProtocolVersion}, keys)
	if err != nil {
		return err
	}
	if s.opts.Gossip != nil {
		s.opts.Gossip(&mc)
	}
	probe := mc.ProbeInterval
	if probe <= 0 {
		probe = membership.DefaultProbeInterval
	}
	s.gossipDeaths = &deathConfirms{wait: deathConfirmProbes * probe, stop: make(chan struct{})}
	pool, err := membership.New(mc, s.log, gossipEvents{s: s, self: name, deaths: s.gossipDeaths})
	if err != nil {
		return err
	}
	s.gossip.Store(pool)
	ev := s.log.Info().Str("addr", pool.LocalMember().Addr).Bool("encrypted", len(keys) > 0)
	if from != "" {
		ev = ev.Str("keyring", from)
	}
	ev.Msg("gossip pool formed")
	return nil
}

// stopGossip leaves the pool so agents see the coordinator left rather
// than failed. Queued events are delivered first: the store is still open.
func (s *Server) stopGossip() {
	pool := s.gossip.Load()
	if pool == nil {
		return
	}
	if err := pool.Leave(time.Second); err != nil {
		s.log.Debug().Err(err).Msg("gossip leave")
	}
	if err := pool.Shutdown(); err != nil {
		s.log.Warn().Err(err).Msg("gossip shutdown")
	}
	// Deaths still waiting for confirmation are dropped: the store closes next.
	s.gossipDeaths.close()
}

// deathConfirms runs the waits before a gossip death is believed, and
// ends them when the pool stops.
type deathConfirms struct {
	wait    time.Duration
	mu      sync.Mutex
	stopped bool
	stop    chan struct{}
	wg      sync.WaitGroup
	// ran counts the waits that ran their fn to its end: a test waits on
	// it to know a refuted death was looked at, not for a while.
	ran atomic.Int64
}

// after runs fn once d.wait has passed, unless the pool stops first.
func (d *deathConfirms) after(fn func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		t := time.NewTimer(d.wait)
		defer t.Stop()
		select {
		case <-t.C:
			fn()
			d.ran.Add(1)
		case <-d.stop:
		}
	}()
}

func (d *deathConfirms) close() {
	d.mu.Lock()
	if !d.stopped {
		d.stopped = true
		close(d.stop)
	}
	d.mu.Unlock()
	d.wg.Wait()
}

// GossipAddr is the coordinator's advertised gossip address, "" when off.
func (s *Server) GossipAddr() string {
	if pool := s.gossip.Load(); pool != nil {
		return pool.LocalMember().Addr
	}
	return ""
}

// GossipPool is the coordinator's gossip membership, nil when off.
func (s *Server) GossipPool() *membership.Pool { return s.gossip.Load() }

// gossipEvents turns membership events into node-state hints.
type gossipEvents struct {
	s      *Server
	self   string
	deaths *deathConfirms
}

func (g gossipEvents) relevant(m membership.Member) bool {
	return m.Name != g.self && m.Meta.Role == membership.RoleAgent
}

func (g gossipEvents) NodeLeft(m membership.Member) {
	if !g.relevant(m) {
		return
	}
	s := g.s
	e := s.reg.lookup(m.Name)
	if e == nil {
		s.log.Debug().Str("member", m.Name).Str("state", m.State.String()).Msg("gossip: member with no node record")
		return
	}
	now := s.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.gossipGen++
	if m.State == membership.StateLeft {
		// A clean stop: the stream's end says the rest.
		e.gossip, e.gossipSince = m.State, now
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.event(ctx, m.Name, store.EventConnection, "gossip", "left the gossip pool")
		return
	}
	gen := e.gossipGen
	g.deaths.after(func() { g.confirmDead(e, gen, now) })
}

// confirmDead believes a death that stood for the confirmation wait: no
// gossip event about the member came since (gen), so nobody refuted it.
func (g gossipEvents) confirmDead(e *nodeEntry, gen uint64, at time.Time) {
	s := g.s
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gossipGen != gen {
		return
	}
	e.gossip, e.gossipSince = membership.StateDead, at
	// A node whose agent said goodbye is left, whatever gossip says.
	if campaignOwned(e.state) || e.state == "" || (e.state == StateLeft && e.sess == nil) {
		return
	}
	state, reason := e.liveState()
	s.setState(ctx, e, state, reason, reason, nil, s.now())
}

func (g gossipEvents) NodeJoined(m membership.Member) {
	if !g.relevant(m) {
		return
	}
	s := g.s
	e := s.reg.lookup(m.Name)
	if e == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.gossipGen++ // a death still waiting for confirmation was refuted
	wasDead := e.gossip == membership.StateDead
	e.gossip, e.gossipSince, e.gossipMeta = membership.StateAlive, s.now(), m.Meta
	// Only a state gossip set is cleared, and only while the stream is up:
	// without it the node stays unreachable for the stream's reason.
	if wasDead && e.sess != nil && !campaignOwned(e.state) && strings.HasPrefix(e.reason, gossipCause) {
		state, reason := e.liveState()
		s.setState(ctx, e, state, reason, "gossip: member answers probes again", nil, s.now())
	}
}

func (g gossipEvents) NodeUpdated(m membership.Member) {
	if !g.relevant(m) {
		return
	}
	if e := g.s.reg.lookup(m.Name); e != nil {
		e.mu.Lock()
		e.gossipMeta = m.Meta
		e.mu.Unlock()
	}
}

// liveState is the state a node's results give, except that a node gossip
// reports dead is unreachable unless its results say failed (the stronger
// evidence). e.mu is held.
func (e *nodeEntry) liveState() (string, string) {
	state, reason := deriveState(e.checks, e.hasFull)
	if e.gossip != membership.StateDead || state == StateFailed {
		return state, reason
	}
	why := gossipCause + "member stopped answering probes"
	if e.sess != nil {
		why += "; agent stream still connected"
	}
	return StateUnreachable, why
}

// streamState is the state campaigns see: what the stream and results
// give, without the gossip hint. e.mu is held.
func (e *nodeEntry) streamState() string {
	if e.state == StateUnreachable && e.sess != nil && strings.HasPrefix(e.reason, gossipCause) {
		state, _ := deriveState(e.checks, e.hasFull)
		return state
	}
	return e.state
}
