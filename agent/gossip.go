package agent

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/membership"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/proto/version"
)

// gossipKeyringFile is where a rotation leaves the keyring, in the state
// dir, so that a restarted agent still speaks the pool's current key.
const gossipKeyringFile = "gossip.keyring"

// gossipLeaveTimeout bounds the leave announcement on stop: long enough for
// peers to hear "left" rather than wait out the suspicion timeout, short
// enough not to hold up a stop.
const gossipLeaveTimeout = 2 * time.Second

// errGossipOff answers a key operation on an agent without a gossip pool.
var errGossipOff = errors.New("gossip is off on this agent")

// gossipConfig builds the pool configuration from the `gossip:` block.
// keyring nil reads gossip.keyring_file (see membership.FileConfig.Config).
func (c *Config) gossipConfig(agentVersion string, keyring [][]byte) (membership.Config, error) {
	meta := membership.Meta{
		Role:            membership.RoleAgent,
		Labels:          maps.Clone(c.Labels),
		AgentVersion:    agentVersion,
		ProtocolVersion: version.Protocol,
	}
	mc, err := c.Gossip.Config(c.Node, meta, keyring)
	if err != nil {
		return membership.Config{}, fmt.Errorf("%w: gossip: %w", ErrInvalid, err)
	}
	return mc, nil
}

// gossip is the agent's side of the gossip pool. Membership is a liveness
// hint for the coordinator only: nothing the agent does depends on it.
type gossip struct {
	pool    *membership.Pool
	keyring string // STATE_DIR/gossip.keyring

	keyMu sync.Mutex // serialises key operations and their keyring writes

	mu     sync.Mutex
	joined []string // coordinator addresses already given to Join
}

// startGossip joins the gossip pool when the config turns it on. A failure
// leaves gossip off and the agent running: the stream and results are
// what matter, gossip only tells the coordinator sooner that a node is gone.
func (a *Agent) startGossip() {
	if !a.cfg.Gossip.Enabled() {
		return
	}
	saved := filepath.Join(a.cfg.StateDir, gossipKeyringFile)
	keys, from, err := membership.LoadKeyring(a.cfg.Gossip.KeyringFile, saved)
	if err != nil {
		a.log.Error().Err(err).Msg("gossip off: cannot read the keyring")
		return
	}
	mc, err := a.cfg.gossipConfig(a.o.version, keys)
	if err != nil {
		a.log.Error().Err(err).Msg("gossip off: bad configuration")
		return
	}
	if a.o.gossipTune != nil {
		a.o.gossipTune(&mc)
	}
	counts := &gossipCounts{m: a.o.metrics, states: map[string]gossipSeen{}}
	pool, err := membership.New(mc, a.log, membership.EventFuncs{
		Joined: counts.seen, Left: counts.seen, Updated: counts.seen,
	})
	if err != nil {
		a.log.Error().Err(err).Msg("gossip off: cannot start the gossip pool")
		return
	}
	if from != "" {
		a.log.Info().Str("keyring", from).Strs("keys", membership.Fingerprints(keys)).Msg("gossip encrypted")
	}
	a.gossip = &gossip{pool: pool, keyring: saved}
}

// stopGossip leaves the pool on purpose, so the coordinator sees "left"
// rather than "dead", then stops it.
func (a *Agent) stopGossip() {
	g := a.gossip
	if g == nil {
		return
	}
	if err := g.pool.Leave(gossipLeaveTimeout); err != nil {
		a.log.Warn().Err(err).Msg("gossip leave not confirmed; peers will see this node dead")
	}
	if err := g.pool.Shutdown(); err != nil {
		a.log.Warn().Err(err).Msg("gossip shutdown")
	}
}

// gossipAddr is the address the hello announces, "" with gossip off.
func (a *Agent) gossipAddr() string {
	if a.gossip == nil {
		return ""
	}
	return a.gossip.pool.LocalMember().Addr
}

// gossipWelcome joins the coordinator's gossip address when the config
// names no seeds of its own. Only an address not given before is joined:
// Join makes it a seed, and from then on the pool's rejoin loop contacts
// it, rationed, whenever it is not an alive member — thousands of agents
// reconnecting after a coordinator restart must not all join it at once.
func (a *Agent) gossipWelcome(addr string) {
	g := a.gossip
	if g == nil || addr == "" || len(a.cfg.Gossip.Join) > 0 {
		return
	}
	g.mu.Lock()
	if slices.Contains(g.joined, addr) {
		g.mu.Unlock()
		return
	}
	g.joined = append(g.joined, addr)
	g.mu.Unlock()
	// In the background: a join to an unreachable address takes up to the
	// TCP timeout, and the stream must not wait for it.
	go func() {
		if _, err := g.pool.Join([]string{addr}); err != nil {
			a.log.Warn().Err(err).Str("gossip_addr", addr).Msg("cannot join the coordinator's gossip pool yet; will retry")
			return
		}
		a.log.Info().Str("gossip_addr", addr).Msg("joined the coordinator's gossip pool")
	}()
}

// onGossipKey applies one round of a keyring rotation the coordinator
// drives and answers with the outcome. The keyring is saved after every
// applied round, so a restart in the middle of a rotation resumes with
// the keys the pool uses.
func (a *Agent) onGossipKey(op *fleetcheckv1.GossipKeyOp) *fleetcheckv1.AgentMessage {
	st := &fleetcheckv1.GossipKeyStatus{OpId: op.GetOpId()}
	reply := &fleetcheckv1.AgentMessage{Msg: &fleetcheckv1.AgentMessage_GossipKeyStatus{GossipKeyStatus: st}}
	log := a.log.With().Str("op_id", op.GetOpId()).Stringer("op", op.GetOp()).
		Str("key", membership.Fingerprint(op.GetKey())).Logger()
	g := a.gossip
	if g == nil {
		st.Error = errGossipOff.Error()
		log.Warn().Err(errGossipOff).Msg("gossip key operation refused")
		return reply
	}
	g.keyMu.Lock()
	defer g.keyMu.Unlock()
	var err error
	switch op.GetOp() {
	case fleetcheckv1.GossipKeyOp_OP_INSTALL:
		err = g.pool.InstallKey(op.GetKey())
	case fleetcheckv1.GossipKeyOp_OP_USE:
		err = g.pool.UseKey(op.GetKey())
	case fleetcheckv1.GossipKeyOp_OP_REMOVE:
		err = g.pool.RemoveKey(op.GetKey())
	default:
		err = fmt.Errorf("unknown gossip key operation %v", op.GetOp())
	}
	keys := g.pool.Keys()
	if err == nil {
		if werr := membership.WriteKeyringFile(g.keyring, keys); werr != nil {
			// Applied in memory, lost at restart: the rotation must not
			// count this node as done.
			err = fmt.Errorf("applied but not saved: %w", werr)
		}
	}
	st.Keys = int32(len(keys))
	if err != nil {
		st.Error = err.Error()
		log.Warn().Err(err).Strs("keys", membership.Fingerprints(keys)).Msg("gossip key operation failed")
		return reply
	}
	log.Info().Strs("keys", membership.Fingerprints(keys)).Msg("gossip key operation applied")
	return reply
}

// gossipCounts turns pool events into member counts by state for the
// metrics. It runs on the pool's single event goroutine, so it needs no
// lock, and counts incrementally: recounting on every event would cost
// O(members²) while thousands join at once.
type gossipCounts struct {
	m         Metrics
	states    map[string]gossipSeen
	n         [3]int // by membership.State: alive, dead, left
	lastPrune time.Time
}

type gossipSeen struct {
	state membership.State
	at    time.Time
}

func (c *gossipCounts) seen(m membership.Member) {
	gm, ok := c.m.(GossipMetrics)
	if !ok {
		return
	}
	now := time.Now()
	c.count(m.Name, -1)
	c.states[m.Name] = gossipSeen{state: m.State, at: now}
	c.count(m.Name, +1)
	// The pool forgets members gone longer than its reconnect timeout
	// without an event; forget them here too, looking at most once a minute.
	if now.Sub(c.lastPrune) > time.Minute {
		c.lastPrune = now
		for name, s := range c.states {
			if s.state != membership.StateAlive && now.Sub(s.at) > membership.DefaultReconnectTimeout {
				c.count(name, -1)
				delete(c.states, name)
			}
		}
	}
	gm.GossipMembers(c.n[membership.StateAlive], c.n[membership.StateDead], c.n[membership.StateLeft])
}

func (c *gossipCounts) count(name string, d int) {
	if s, ok := c.states[name]; ok && int(s.state) < len(c.n) {
		c.n[s.state] += d
	}
}
