package membership

import (
	"errors"
	"fmt"
	"log"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// Errors callers can test with errors.Is.
var (
	ErrShutdown  = errors.New("membership: pool is shut down")
	ErrNoKeyring = errors.New("membership: encryption is off (no keyring at start)")
)

// metaSendWait bounds how long UpdateMeta waits for memberlist to send the
// new alive message. The message is queued before the wait starts and is
// gossiped whether or not the wait ends in time, so the wait is kept short.
const metaSendWait = 10 * time.Millisecond

// Pool is this process's membership in the gossip pool.
type Pool struct {
	cfg     Config
	log     zerolog.Logger
	ml      *memberlist.Memberlist
	keyring *memberlist.Keyring // nil when encryption is off
	events  *eventQueue

	metaMu    sync.Mutex
	metaValue Meta
	meta      []byte // metaValue encoded, with the Pool's flags

	mu      sync.Mutex
	members map[string]memberRecord
	seeds   []string
	left    bool

	// lifeMu serialises Leave and Shutdown: memberlist panics on a Leave
	// after Shutdown.
	lifeMu   sync.Mutex
	shutdown bool
	stop     chan struct{}
	loopDone chan struct{}
}

type memberRecord struct {
	Member
	since time.Time // when State last changed
}

// New validates cfg, starts listening and returns the running Pool. It
// contacts cfg.Join in the background (see the package documentation on
// rejoin); call Join to contact peers and wait for the answer. events may be
// nil.
func New(cfg Config, logger zerolog.Logger, events Events) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	meta, err := cfg.Meta.Encode()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if events == nil {
		events = EventFuncs{}
	}
	p := &Pool{
		cfg:       cfg,
		log:       logger.With().Str("subsystem", "membership").Logger(),
		meta:      meta,
		metaValue: cfg.Meta,
		members:   make(map[string]memberRecord),
		seeds:     append([]string(nil), cfg.Join...),
		stop:      make(chan struct{}),
		loopDone:  make(chan struct{}),
	}
	if len(cfg.Keyring) > 0 {
		// Copies: memberlist keeps the slices it is given.
		keys := make([][]byte, len(cfg.Keyring))
		for i, k := range cfg.Keyring {
			keys[i] = append([]byte(nil), k...)
		}
		p.keyring, err = memberlist.NewKeyring(keys, keys[0])
		if err != nil {
			return nil, fmt.Errorf("%w: keyring: %w", ErrInvalidConfig, err)
		}
	}

	transport := cfg.Transport
	if transport == nil {
		if transport, err = netTransport(cfg, logger); err != nil {
			return nil, err
		}
	}
	screened := screenStreams(transport, cfg.TCPTimeout, logger)
	mc := p.memberlistConfig(logger, screened)
	// The queue must run before Create: memberlist reports the local node's
	// join from inside Create.
	p.events = newEventQueue(events)
	p.ml, err = memberlist.Create(mc)
	if err != nil {
		_ = screened.Shutdown()
		p.events.close()
		return nil, fmt.Errorf("start memberlist on %s:%d: %w", cfg.BindAddr, cfg.BindPort, err)
	}
	local := p.LocalMember()
	p.log.Info().Str("node", local.Name).Str("addr", local.Addr).Bool("encrypted", p.keyring != nil).
		Str("cluster_label", cfg.ClusterLabel).Msg("gossip pool started")

	if cfg.RejoinInterval > 0 {
		go p.rejoinLoop(cfg.RejoinInterval)
	} else {
		close(p.loopDone)
	}
	return p, nil
}

func (p *Pool) memberlistConfig(logger zerolog.Logger, transport memberlist.NodeAwareTransport) *memberlist.Config {
	cfg := p.cfg
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.NodeName
	mc.BindAddr = cfg.BindAddr
	mc.BindPort = cfg.BindPort
	// Always explicit, so that memberlist never advertises an address it
	// picked from the host's interfaces.
	mc.AdvertiseAddr = cfg.AdvertiseAddr
	mc.AdvertisePort = cfg.AdvertisePort
	if mc.AdvertisePort == 0 {
		// A transport that bound port 0 says which port it got.
		mc.AdvertisePort = cfg.BindPort
		if ap, ok := transport.(interface{ GetAutoBindPort() int }); ok && ap.GetAutoBindPort() > 0 {
			mc.AdvertisePort = ap.GetAutoBindPort()
		}
	}
	mc.Transport = transport
	mc.Label = cfg.ClusterLabel
	mc.Keyring = p.keyring
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeTimeout
	mc.GossipInterval = cfg.GossipInterval
	mc.SuspicionMult = cfg.SuspicionMult
	mc.PushPullInterval = cfg.PushPullInterval
	mc.GossipToTheDeadTime = cfg.PushPullInterval
	mc.TCPTimeout = cfg.TCPTimeout
	mc.DeadNodeReclaimTime = cfg.DeadNodeReclaimTime
	mc.Delegate = metaDelegate{p: p}
	mc.Events = eventDelegate{p: p}
	mc.Logger = log.New(newLogWriter(logger), "", 0)
	return mc
}

func (p *Pool) localMeta() []byte {
	p.metaMu.Lock()
	defer p.metaMu.Unlock()
	return p.meta
}

// observe records a memberlist event and queues it for the consumer.
// It runs under memberlist's node lock: no calls back into memberlist.
func (p *Pool) observe(kind eventKind, n *memberlist.Node) {
	// memberlist.Node.State is not maintained by memberlist (its own copy of
	// the state is private), so the state comes from the event and the
	// leaving flag.
	m := Member{Name: n.Name, Addr: n.Address(), State: StateAlive}
	var flags metaFlags
	if len(n.Meta) > 0 {
		meta, f, err := decodeMeta(n.Meta)
		if err != nil {
			p.log.Warn().Err(err).Str("node", n.Name).Str("addr", m.Addr).Msg("undecodable member meta")
		} else {
			m.Meta, flags = meta, f
		}
	}
	if kind == eventLeft {
		m.State = StateDead
		if flags&flagLeaving != 0 {
			m.State = StateLeft
		}
	}
	now := time.Now()

	p.mu.Lock()
	since := now
	if old, ok := p.members[m.Name]; ok && old.State == m.State {
		since = old.since
	}
	p.members[m.Name] = memberRecord{Member: m, since: since}
	p.mu.Unlock()

	switch kind {
	case eventJoined:
		p.log.Info().Str("node", m.Name).Str("addr", m.Addr).Str("role", m.Meta.Role).Msg("member joined")
	case eventLeft:
		p.log.Info().Str("node", m.Name).Str("addr", m.Addr).Stringer("state", m.State).Msg("member gone")
	case eventUpdated:
		if flags&flagLeaving != 0 {
			// The announcement that precedes a leave, not a change of meta.
			return
		}
		p.log.Debug().Str("node", m.Name).Str("addr", m.Addr).Msg("member updated")
	}
	p.events.push(event{kind: kind, member: m.clone()})
}

// LocalMember returns this member as the pool sees it.
func (p *Pool) LocalMember() Member {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.members[p.cfg.NodeName].clone()
}

// Member returns one member by name, including dead and left ones still
// within ReconnectTimeout.
func (p *Pool) Member(name string) (Member, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.members[name]
	return r.clone(), ok
}

// Members returns every member known, sorted by name: this one, the alive
// ones, and dead or left ones for ReconnectTimeout after they went.
func (p *Pool) Members() []Member {
	p.mu.Lock()
	out := make([]Member, 0, len(p.members))
	for _, r := range p.members {
		out = append(out, r.clone())
	}
	p.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// NumAlive counts the alive members, this one included.
func (p *Pool) NumAlive() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.members {
		if r.State == StateAlive {
			n++
		}
	}
	return n
}

// Join contacts the given addresses now and merges state with each that
// answers; it fails only when none did. The addresses become seeds for the
// rejoin loop.
func (p *Pool) Join(addrs []string) (int, error) {
	if p.isShutdown() {
		return 0, ErrShutdown
	}
	p.addSeeds(addrs)
	n, err := p.ml.Join(addrs)
	if err != nil {
		return n, fmt.Errorf("join %v: %w", addrs, err)
	}
	return n, nil
}

func (p *Pool) addSeeds(addrs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range addrs {
		known := false
		for _, s := range p.seeds {
			known = known || s == a
		}
		if !known {
			p.seeds = append(p.seeds, a)
		}
	}
}

// UpdateMeta replaces this member's meta and queues the change for gossip;
// peers see NodeUpdated within a few gossip intervals. It does not wait for
// the change to reach them.
func (p *Pool) UpdateMeta(meta Meta) error {
	if err := meta.Validate(); err != nil {
		return err
	}
	b, err := meta.Encode()
	if err != nil {
		return err
	}
	if p.isShutdown() {
		return ErrShutdown
	}
	p.metaMu.Lock()
	p.metaValue, p.meta = meta, b
	p.metaMu.Unlock()
	// The only error is "not yet sent" after metaSendWait; the message is
	// queued and goes out with the next gossip rounds either way.
	_ = p.ml.UpdateNode(metaSendWait)
	return nil
}

// Leave tells the pool this member is going away on purpose (peers see
// NodeLeft with StateLeft instead of waiting out the suspicion timeout) and
// stops the rejoin loop. It takes up to timeout: half to announce the leave
// in this member's meta, the rest for memberlist's leave message. Call
// Shutdown afterwards.
func (p *Pool) Leave(timeout time.Duration) error {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	if p.shutdown {
		return ErrShutdown
	}
	p.mu.Lock()
	p.left = true
	p.mu.Unlock()

	p.metaMu.Lock()
	// The flag costs no byte (uvarint 0 and 1 are both one byte), so a
	// meta that fitted still fits.
	meta, err := p.metaValue.encode(flagLeaving)
	if err == nil {
		p.meta = meta
	}
	p.metaMu.Unlock()
	if err == nil {
		// Wait for the announcement to be gossiped in full: memberlist
		// drops a queued message about a node once a newer one about the
		// same node (the leave) is queued.
		start := time.Now()
		_ = p.ml.UpdateNode(timeout / 2)
		timeout -= time.Since(start)
	}
	if err := p.ml.Leave(max(timeout, time.Millisecond)); err != nil {
		return fmt.Errorf("leave gossip pool: %w", err)
	}
	return nil
}

// Shutdown stops gossip without telling anyone (peers will report this member
// dead), stops the rejoin loop and delivers the events still queued. It must
// not be called from an Events callback. Safe to call more than once.
func (p *Pool) Shutdown() error {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	if p.shutdown {
		return nil
	}
	p.shutdown = true
	close(p.stop)
	<-p.loopDone
	err := p.ml.Shutdown()
	p.events.close()
	if err != nil {
		return fmt.Errorf("shut down memberlist: %w", err)
	}
	return nil
}

func (p *Pool) isShutdown() bool {
	select {
	case <-p.stop:
		return true
	default:
		return false
	}
}

// InstallKey adds a key that this member decrypts with; it does not change
// the key it encrypts with. Step 1 of a rotation (see the package doc).
func (p *Pool) InstallKey(key []byte) error {
	if p.keyring == nil {
		return ErrNoKeyring
	}
	// A copy: memberlist keeps the slice it is given.
	if err := p.keyring.AddKey(append([]byte(nil), key...)); err != nil {
		return fmt.Errorf("install gossip key: %w", err)
	}
	return nil
}

// UseKey makes an installed key the primary one, used to encrypt. Step 2.
func (p *Pool) UseKey(key []byte) error {
	if p.keyring == nil {
		return ErrNoKeyring
	}
	if err := p.keyring.UseKey(key); err != nil {
		return fmt.Errorf("use gossip key: %w", err)
	}
	return nil
}

// RemoveKey drops a key that is not the primary one. Step 3.
func (p *Pool) RemoveKey(key []byte) error {
	if p.keyring == nil {
		return ErrNoKeyring
	}
	if err := p.keyring.RemoveKey(key); err != nil {
		return fmt.Errorf("remove gossip key: %w", err)
	}
	return nil
}

// Keys returns copies of the installed keys, the primary one first, or nil
// when encryption is off.
func (p *Pool) Keys() [][]byte {
	if p.keyring == nil {
		return nil
	}
	keys := p.keyring.GetKeys()
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = append([]byte(nil), k...)
	}
	return out
}
