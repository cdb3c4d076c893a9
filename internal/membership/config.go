package membership

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/memberlist"
)

// ErrInvalidConfig wraps every configuration error New returns.
var ErrInvalidConfig = errors.New("membership: invalid config")

// Defaults for the Config durations left at zero. The failure-detection ones
// are memberlist's LAN defaults: suspicion timeout = SuspicionMult ×
// log10(members) × ProbeInterval, so about 11 s at 500 members and 16 s at
// 10,000, plus a probe interval or two to notice.
const (
	// DefaultPort is the port production configs use (memberlist's own).
	DefaultPort                = 7946
	DefaultProbeInterval       = time.Second
	DefaultProbeTimeout        = 500 * time.Millisecond
	DefaultGossipInterval      = 200 * time.Millisecond
	DefaultSuspicionMult       = 4
	DefaultPushPullInterval    = 30 * time.Second
	DefaultTCPTimeout          = 10 * time.Second
	DefaultRejoinInterval      = 20 * time.Second
	DefaultReconnectTimeout    = 24 * time.Hour
	DefaultDeadNodeReclaimTime = 30 * time.Second
)

// Config describes one member. Zero durations take the defaults above.
type Config struct {
	// NodeName is the member's unique name: the agent's node name, or the
	// coordinator's.
	NodeName string

	// BindAddr is the IP to listen on, UDP and TCP. Required: production sets
	// the node's data-plane address; tests and the demo use 127.0.0.1.
	BindAddr string
	// BindPort 0 lets the kernel pick a free port (tests).
	BindPort int
	// AdvertiseAddr is the IP peers reach this member at. Empty means
	// BindAddr; it is required when BindAddr is 0.0.0.0 or ::, so that
	// memberlist never picks an interface address by itself.
	AdvertiseAddr string
	// AdvertisePort 0 means the bound port.
	AdvertisePort int

	// Join holds seed addresses ("ip:port" or "host:port"), typically the
	// coordinator's. New contacts them in the background and the rejoin loop
	// keeps doing so while none of them is an alive member.
	Join []string

	// ClusterLabel keeps pools apart that share addresses or ports: a member
	// drops packets and streams carrying another label.
	ClusterLabel string

	// Keyring enables encryption. Keyring[0] is the primary (encrypting) key;
	// all of them decrypt. AES-128/192/256: 16, 24 or 32 bytes each.
	Keyring [][]byte

	// Meta is what this member gossips about itself.
	Meta Meta

	ProbeInterval    time.Duration
	ProbeTimeout     time.Duration
	GossipInterval   time.Duration
	SuspicionMult    int
	PushPullInterval time.Duration
	TCPTimeout       time.Duration

	// RejoinInterval is how often the rejoin loop runs; negative disables it.
	RejoinInterval time.Duration
	// ReconnectTimeout is how long a dead member's last address stays a
	// rejoin target and the member stays in Members as dead or left.
	ReconnectTimeout time.Duration
	// DeadNodeReclaimTime is how long a dead member's name stays tied to its
	// old address; after it, the name may rejoin from a new address (an agent
	// restarted on another port or IP).
	DeadNodeReclaimTime time.Duration

	// Transport replaces the UDP/TCP transport, e.g. with a
	// memberlist.MockNetwork transport or a faultnet.Network wrapper in tests.
	Transport memberlist.Transport
}

// LoopbackConfig is the configuration tests and the demo start from: bind
// and advertise 127.0.0.1 on a kernel-chosen port, role agent.
func LoopbackConfig(name string) Config {
	return Config{
		NodeName:      name,
		BindAddr:      "127.0.0.1",
		AdvertiseAddr: "127.0.0.1",
		Meta:          Meta{Role: RoleAgent},
	}
}

// Validate reports the first problem with the configuration, wrapping
// ErrInvalidConfig (and ErrInvalidMeta or ErrMetaTooLarge for the meta).
func (c Config) Validate() error {
	if c.NodeName == "" {
		return fmt.Errorf("%w: node name is required", ErrInvalidConfig)
	}
	if c.BindAddr == "" {
		return fmt.Errorf("%w: bind address is required (no default: set the node's address, 127.0.0.1 in tests)", ErrInvalidConfig)
	}
	bind := net.ParseIP(c.BindAddr)
	if bind == nil {
		return fmt.Errorf("%w: bind address %q is not an IP address", ErrInvalidConfig, c.BindAddr)
	}
	if c.AdvertiseAddr == "" && bind.IsUnspecified() {
		return fmt.Errorf("%w: bind address %s needs an explicit advertise address", ErrInvalidConfig, c.BindAddr)
	}
	if c.AdvertiseAddr != "" {
		adv := net.ParseIP(c.AdvertiseAddr)
		if adv == nil || adv.IsUnspecified() {
			return fmt.Errorf("%w: advertise address %q is not a usable IP address", ErrInvalidConfig, c.AdvertiseAddr)
		}
	}
	if c.BindPort < 0 || c.BindPort > 65535 || c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return fmt.Errorf("%w: ports must be within 0-65535", ErrInvalidConfig)
	}
	for _, addr := range c.Join {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return fmt.Errorf("%w: join address %q: %w", ErrInvalidConfig, addr, err)
		}
	}
	if len(c.ClusterLabel) > memberlist.LabelMaxSize {
		return fmt.Errorf("%w: cluster label longer than %d bytes", ErrInvalidConfig, memberlist.LabelMaxSize)
	}
	for i, k := range c.Keyring {
		if err := memberlist.ValidateKey(k); err != nil {
			return fmt.Errorf("%w: keyring[%d]: %w", ErrInvalidConfig, i, err)
		}
	}
	if c.ProbeInterval < 0 || c.ProbeTimeout < 0 || c.GossipInterval < 0 || c.SuspicionMult < 0 ||
		c.PushPullInterval < 0 || c.TCPTimeout < 0 || c.ReconnectTimeout < 0 || c.DeadNodeReclaimTime < 0 {
		return fmt.Errorf("%w: negative duration or multiplier", ErrInvalidConfig)
	}
	if c.ProbeTimeout > 0 && c.ProbeInterval > 0 && c.ProbeTimeout >= c.ProbeInterval {
		return fmt.Errorf("%w: probe timeout %s must be shorter than the probe interval %s", ErrInvalidConfig, c.ProbeTimeout, c.ProbeInterval)
	}
	if err := c.Meta.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if _, err := c.Meta.Encode(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// withDefaults fills the zero durations.
func (c Config) withDefaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.ProbeInterval, DefaultProbeInterval)
	def(&c.ProbeTimeout, DefaultProbeTimeout)
	def(&c.GossipInterval, DefaultGossipInterval)
	def(&c.PushPullInterval, DefaultPushPullInterval)
	def(&c.TCPTimeout, DefaultTCPTimeout)
	def(&c.RejoinInterval, DefaultRejoinInterval)
	def(&c.ReconnectTimeout, DefaultReconnectTimeout)
	def(&c.DeadNodeReclaimTime, DefaultDeadNodeReclaimTime)
	if c.SuspicionMult == 0 {
		c.SuspicionMult = DefaultSuspicionMult
	}
	// A probe timeout left at its default must still fit a short test interval.
	if c.ProbeTimeout >= c.ProbeInterval {
		c.ProbeTimeout = c.ProbeInterval / 2
	}
	if c.AdvertiseAddr == "" {
		c.AdvertiseAddr = c.BindAddr
	}
	return c
}
