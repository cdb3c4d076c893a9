package coordinator

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/coordinator/console"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/membership"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// resolveStoreURL takes a relative SQLite path in store_url relative to
// the config file's directory, like data_dir.
func resolveStoreURL(base, raw string) string {
	t, err := sqldb.Parse(raw)
	if raw == "" || err != nil || t.Dialect != sqldb.SQLite {
		return raw // Validate reports a bad one
	}
	p := t.Path
	config.ResolvePath(base, &p)
	return "sqlite:" + p
}

// Config is the coordinator's YAML configuration. Zero values take the
// defaults that WithDefaults fills in.
//
//	listen: 127.0.0.1:7443        # gRPC, agents and operators
//	http_listen: 127.0.0.1:7444   # /healthz (and /metrics)
//	data_dir: /var/lib/fleetcheck
//	# store_url: postgres://fleetcheck@db.example/fleetcheck  # default: SQLite in data_dir (docs/store.md)
//	retention_days: 30            # raw results older than this are deleted
//	heartbeat_interval: 10s       # a stream silent for 3 intervals is closed
//	tls:                          # mutual TLS for agents and operators (docs/security.md)
//	  cert_file: coordinator.crt  # spiffe://TRUST_DOMAIN/coordinator/NAME
//	  key_file: coordinator.key
//	  ca_file: ca.crt             # the CAs agents' and operators' certificates chain to
//	  trust_domain: fleet.example # the only trust domain let in
//	# insecure: true              # plaintext, no authorization: demos and tests only
//	console: {enabled: true, listen: 127.0.0.1:7445}  # the web console (docs/console.md)
type Config struct {
	Listen string `yaml:"listen"`
	// HTTPListen serves /healthz (and /metrics); "off" serves no HTTP.
	HTTPListen string `yaml:"http_listen"`
	DataDir    string `yaml:"data_dir"`
	// StoreURL is the database: empty for SQLite in DataDir (the
	// default), sqlite:PATH for another SQLite file, or postgres://...
	// (docs/store.md).
	StoreURL          string        `yaml:"store_url"`
	RetentionDays     int           `yaml:"retention_days"`
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// Insecure serves plaintext gRPC with no authorization. Without it the
	// coordinator needs transport credentials: TLS below, wired by Secure,
	// or Options.Credentials.
	Insecure bool `yaml:"insecure"`
	// TLS names the coordinator's certificate files and trust domain.
	TLS TLSConfig `yaml:"tls"`
	// Batch tunes the store's group commit.
	Batch BatchConfig `yaml:"batch"`
	// SendQueue bounds the messages waiting to be sent on one agent stream.
	SendQueue int `yaml:"send_queue"`
	// Drain is how campaigns take nodes out of service (campaigns.go).
	Drain DrainConfig `yaml:"drain"`
	// Breaker bounds what campaigns together may drain.
	Breaker BreakerConfig `yaml:"breaker"`
	// Remediation is the remediation ladder and its escalation rules
	// (docs/remediation.md); shadow mode unless mode: auto.
	Remediation remediation.Config `yaml:"remediation"`
	// SweepSchedule, when set, runs the nightly slow-node sweep.
	SweepSchedule *SweepScheduleConfig `yaml:"sweep_schedule"`
	// CompatMatrix is the compatibility matrix file rollouts use when the
	// operator sends none.
	CompatMatrix string `yaml:"compat_matrix"`
	// Gossip, when its bind is set, joins the gossip pool agents join: a
	// node whose member stops answering is marked unreachable within
	// seconds (a hint only; docs/config.md).
	Gossip *membership.FileConfig `yaml:"gossip"`
	// Console is the web console (docs/console.md): off unless enabled.
	Console console.Config `yaml:"console"`
	// HA joins the leader election of several coordinators over one
	// PostgreSQL store (campaign_lead.go, docs/ha.md).
	HA HAConfig `yaml:"ha"`
}

// TLSConfig is the coordinator's mutual-TLS identity. Relative paths are
// relative to the config file (LoadConfig).
type TLSConfig struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// CAFile is the bundle of CAs that agents' and operators' certificates
	// must chain to.
	CAFile string `yaml:"ca_file"`
	// TrustDomain is the only trust domain whose identities are let in.
	TrustDomain string `yaml:"trust_domain"`
}

// set reports whether any field is set.
func (t TLSConfig) set() bool {
	return t.CertFile != "" || t.KeyFile != "" || t.CAFile != "" || t.TrustDomain != ""
}

// BatchConfig tunes how results are grouped into transactions.
type BatchConfig struct {
	MaxResults int           `yaml:"max_results"` // results per transaction at most
	Delay      time.Duration `yaml:"delay"`       // how long to wait for more once one is queued
	Writers    int           `yaml:"writers"`     // PostgreSQL: transactions committing results at once
}

// Defaults.
const (
	DefaultListen            = "127.0.0.1:7443"
	DefaultHTTPListen        = "127.0.0.1:7444"
	DefaultRetentionDays     = 30
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultSendQueue         = 256
	// DefaultGossipName is the coordinator's gossip member name.
	DefaultGossipName = "coordinator"
)

// Ranges of the coordinator config's numeric values
// (docs/coordinator-config.md). Zero takes the default where one is noted.
var (
	// A century; far more would wrap the retention cutoff into the future
	// and delete every result.
	rangeRetentionDays = config.R(1, 36500)
	rangeHeartbeat     = config.R(10*time.Millisecond, 10*time.Minute)
	// Messages queued per agent stream: each slot is memory held for a
	// slow agent, times the fleet.
	rangeSendQueue    = config.R(1, 4096)
	rangeBatchResults = config.R(1, 10_000)
	rangeBatchWriters = config.R(1, store.MaxWriters)
	// Results wait this long for company before their transaction: acks
	// wait with them.
	rangeBatchDelay    = config.R(time.Duration(0), 100*time.Millisecond)
	rangeBreakerWindow = config.R(time.Minute, 7*24*time.Hour)
	rangeBreakerShare  = config.R(0.0, 1)
	rangeBreakerCount  = config.R(0, 100_000)
	rangeSlurmTimeout  = config.R(time.Second, 10*time.Minute)
	rangeEvictTimeout  = config.R(10*time.Second, time.Hour)
)

// WithDefaults returns the config with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.HTTPListen == "" {
		c.HTTPListen = DefaultHTTPListen
	}
	if c.RetentionDays == 0 {
		c.RetentionDays = DefaultRetentionDays
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.SendQueue == 0 {
		c.SendQueue = DefaultSendQueue
	}
	c.Console = c.Console.WithDefaults()
	return c
}

// Validate reports the first thing wrong with a config (after defaults).
func (c Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("data_dir is required"))
	}
	if c.StoreURL != "" {
		if _, err := sqldb.Parse(c.StoreURL); err != nil {
			errs = append(errs, fmt.Errorf("store_url: %w", err))
		}
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen %q: %w", c.Listen, err))
	}
	if c.HTTPListen != "off" {
		if _, _, err := net.SplitHostPort(c.HTTPListen); err != nil {
			errs = append(errs, fmt.Errorf("http_listen %q: %w", c.HTTPListen, err))
		}
	}
	errs = append(errs,
		rangeRetentionDays.Check("retention_days", c.RetentionDays),
		rangeHeartbeat.Check("heartbeat_interval", c.HeartbeatInterval),
		rangeSendQueue.Check("send_queue", c.SendQueue),
		rangeBatchResults.CheckOrZero("batch.max_results", c.Batch.MaxResults),
		rangeBatchWriters.CheckOrZero("batch.writers", c.Batch.Writers),
		rangeBatchDelay.Check("batch.delay", c.Batch.Delay))
	switch {
	case c.Insecure && c.TLS.set():
		errs = append(errs, errors.New("insecure: true and tls: both set; choose one"))
	case c.TLS.set() && (c.TLS.CertFile == "" || c.TLS.KeyFile == "" || c.TLS.CAFile == "" || c.TLS.TrustDomain == ""):
		errs = append(errs, errors.New("tls: cert_file, key_file, ca_file and trust_domain are all required"))
	case c.TLS.TrustDomain != "":
		if err := pki.ValidateTrustDomain(c.TLS.TrustDomain); err != nil {
			errs = append(errs, fmt.Errorf("tls.trust_domain: %w", err))
		}
	}
	if err := c.Console.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Console.Enabled && !c.Insecure && !c.TLS.set() {
		errs = append(errs, errors.New("console: needs tls: (it serves HTTPS with the coordinator's certificate) or insecure: true"))
	}
	if err := c.HA.validate(c.StoreURL); err != nil {
		errs = append(errs, err)
	}
	if err := c.validateCampaigns(); err != nil {
		errs = append(errs, err)
	}
	if c.Gossip.Enabled() {
		// The keyring file is read at start, where its errors are reported.
		g := *c.Gossip
		g.KeyringFile = ""
		if _, err := g.Config(DefaultGossipName, membership.Meta{Role: membership.RoleCoordinator}, nil); err != nil {
			errs = append(errs, fmt.Errorf("gossip: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("coordinator config: %w", err)
	}
	return nil
}

// LoadConfig reads a YAML config file, fills in defaults and validates it.
// Unknown keys are errors: a misspelt key would otherwise be ignored.
// Relative paths (data_dir, the tls files, compat_matrix, the kubeconfig,
// gossip.keyring_file, Slurm tools given with a directory) are taken
// relative to the file's directory, whatever the working directory.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("coordinator config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return Config{}, err
	}
	base := config.ConfigDir(path)
	c.Gossip.Resolve(base)
	c.StoreURL = resolveStoreURL(base, c.StoreURL)
	for _, p := range []*string{&c.DataDir, &c.TLS.CertFile, &c.TLS.KeyFile, &c.TLS.CAFile, &c.CompatMatrix, &c.Drain.Kubernetes.Kubeconfig, &c.Console.TokenFile} {
		config.ResolvePath(base, p)
	}
	for _, p := range []*string{&c.Drain.Slurm.Scontrol, &c.Drain.Slurm.Sinfo, &c.Drain.Slurm.Squeue} {
		config.ResolveProgram(base, p)
	}
	return c, nil
}

// ParseConfig is LoadConfig on bytes.
func ParseConfig(b []byte) (Config, error) {
	var c Config
	// A second document is refused too: it would be ignored.
	if err := config.DecodeStrict(b, &c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("coordinator config: %w", err)
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}
