package agent

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/compat"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/membership"
	"github.com/fleetcheck/fleetcheck/internal/pki"
)

// Config is the agent's configuration file (`fleetcheck agent --config FILE`).
// docs/agent.md describes every key; relative paths are relative to the file.
type Config struct {
	// Node is the name the agent speaks for; default: the hostname.
	Node string `yaml:"node"`
	// Labels describe the node for selectors (sku, rack, leaf, ...).
	Labels map[string]string `yaml:"labels"`
	// Coordinator is the coordinator's gRPC address, "host:port" (or a
	// gRPC target such as "dns:///coord.example:7443").
	Coordinator string `yaml:"coordinator"`
	// Coordinators lists several coordinators (over one PostgreSQL
	// store) to fail over between, instead of Coordinator. A host name
	// that resolves to several addresses counts each (failover.go).
	Coordinators []string `yaml:"coordinators"`
	// Insecure allows plaintext to the coordinator. Without it, TLS is required.
	Insecure bool      `yaml:"insecure"`
	TLS      TLSConfig `yaml:"tls"`
	// StateDir holds the spool, counter/Xid state and the activity file.
	StateDir string `yaml:"state_dir"`
	// HostRoot is where /sys and /proc are read (tests and containers).
	HostRoot string `yaml:"host_root"`
	// Host chooses the machine the agent reads: live (default), a
	// simulated node or a replayed bundle; see HostConfig.
	Host HostConfig `yaml:"host"`

	// Interval between quick passes of the enabled passive checks.
	Interval config.Duration `yaml:"interval"`
	// PassTimeout bounds one quick pass.
	PassTimeout config.Duration `yaml:"pass_timeout"`
	// EnabledChecks are the only checks this agent runs, on its schedule
	// (the passive ones) or when the coordinator asks; default: every
	// passive check. Disruptive checks run only when listed here.
	EnabledChecks []string `yaml:"enabled_checks"`
	// DisruptiveAllowedWhen lists the node activities in which disruptive
	// checks may run; default: idle, drained.
	DisruptiveAllowedWhen []Activity `yaml:"disruptive_allowed_when"`
	// Activity is the node's activity when nothing better says it: the
	// activity file in the state dir, when present, overrides it.
	Activity Activity `yaml:"activity"`
	// ActivityFile is read for the activity (one word: idle, busy,
	// drained); default STATE_DIR/activity. Scheduler prolog/epilog scripts
	// write it.
	ActivityFile string `yaml:"activity_file"`

	Work  WorkConfig  `yaml:"work"`
	Spool SpoolConfig `yaml:"spool"`
	// Reconnect tunes the backoff between connection attempts.
	Reconnect ReconnectConfig `yaml:"reconnect"`

	// MetricsListen is where /metrics is served (Prometheus text format),
	// "host:port"; "off" (or empty) serves nothing. Default:
	// DefaultMetricsListen, loopback only.
	MetricsListen string `yaml:"metrics_listen"`

	// Actions are the only actions the coordinator may ask this agent to
	// run, by name (driver upgrade, drill faults and their reverts); see
	// ActionConfig.
	Actions map[string]ActionConfig `yaml:"actions"`
	// MultiNode, when set, lets this node launch and join multi-node
	// all_reduce_perf runs; see MultiNodeConfig.
	MultiNode *MultiNodeConfig `yaml:"multi_node"`

	// Gossip, when its bind is set, joins the fleet's gossip pool so that
	// the coordinator learns within seconds that this node stopped
	// answering; a liveness hint only (docs/agent.md, "Gossip").
	Gossip *membership.FileConfig `yaml:"gossip"`

	// Checks is the checks' configuration: expectations and limits.
	Checks config.Config `yaml:"checks"`
}

// TLSConfig names the files of the agent's mutual TLS identity.
type TLSConfig struct {
	CAFile   string `yaml:"ca_file"`   // the coordinator's CA
	CertFile string `yaml:"cert_file"` // this node's certificate
	KeyFile  string `yaml:"key_file"`
	// ServerName overrides the name checked in the coordinator's certificate.
	ServerName string `yaml:"server_name"`
	// TrustDomain, when set, also requires the coordinator's certificate
	// to carry spiffe://TRUST_DOMAIN/coordinator/NAME, so that another
	// node's certificate (valid for server auth too) cannot pose as the
	// coordinator. Leave it empty for a coordinator certificate from a PKI
	// that writes no SPIFFE ID.
	TrustDomain string `yaml:"trust_domain"`
}

// WorkConfig bounds the checks the coordinator asks for.
type WorkConfig struct {
	// DefaultTimeout applies when a request names none.
	DefaultTimeout config.Duration `yaml:"default_timeout"`
	// MaxTimeout caps any requested timeout.
	MaxTimeout config.Duration `yaml:"max_timeout"`
	// MaxConcurrent is how many requests may run at once; more are refused.
	MaxConcurrent int `yaml:"max_concurrent"`
}

// SpoolConfig bounds the results kept until acknowledged.
type SpoolConfig struct {
	MaxResults int      `yaml:"max_results"`
	MaxBytes   ByteSize `yaml:"max_bytes"`
}

// ReconnectConfig is the exponential backoff with full jitter between
// connection attempts.
type ReconnectConfig struct {
	Initial config.Duration `yaml:"initial"`
	Max     config.Duration `yaml:"max"`
	// HelloTimeout is how long a coordinator may take to welcome the
	// agent before it is left for the next one: a paused (SIGSTOPped)
	// coordinator accepts the connection and answers nothing.
	HelloTimeout config.Duration `yaml:"hello_timeout"`
}

// Activity is what the node is doing, as far as the agent knows.
type Activity string

// Activities. The zero value is "unknown": disruptive checks never run then.
const (
	ActivityUnknown Activity = ""
	ActivityIdle    Activity = "idle"
	ActivityBusy    Activity = "busy"
	ActivityDrained Activity = "drained"
)

// String names the activity for logs and refusals.
func (a Activity) String() string {
	if a == ActivityUnknown {
		return "unknown"
	}
	return string(a)
}

// ParseActivity reads an activity word.
func ParseActivity(s string) (Activity, error) {
	switch a := Activity(strings.ToLower(strings.TrimSpace(s))); a {
	case ActivityIdle, ActivityBusy, ActivityDrained:
		return a, nil
	}
	return ActivityUnknown, fmt.Errorf("activity must be idle, busy or drained, not %q", s)
}

// UnmarshalYAML accepts idle, busy or drained.
func (a *Activity) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := ParseActivity(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*a = v
	return nil
}

// ByteSize is a size in bytes that reads "256MiB", "1GB" or a plain number.
type ByteSize int64

// byteUnit is the multiplier of a size unit, 0 when unknown.
func byteUnit(u string) int64 {
	switch u {
	case "", "b":
		return 1
	case "kb":
		return 1e3
	case "mb":
		return 1e6
	case "gb":
		return 1e9
	case "tb":
		return 1e12
	case "kib":
		return 1 << 10
	case "mib":
		return 1 << 20
	case "gib":
		return 1 << 30
	case "tib":
		return 1 << 40
	}
	return 0
}

// String writes the size with the largest binary unit that divides it:
// "256MiB", "64GiB", "1500".
func (b ByteSize) String() string {
	for _, u := range []struct {
		name string
		n    ByteSize
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b != 0 && b%u.n == 0 {
			return strconv.FormatInt(int64(b/u.n), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(b), 10)
}

// ParseByteSize reads "256MiB", "1.5GB", "1048576".
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	}
	mult := byteUnit(unit)
	if mult == 0 || num == "" {
		return 0, fmt.Errorf("bad size %q (use bytes or a unit: KiB, MiB, GiB, KB, MB, GB)", s)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return ByteSize(v * float64(mult)), nil
}

// UnmarshalYAML accepts a number or a string with a unit.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := ParseByteSize(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*b = v
	return nil
}

// Defaults.
const (
	DefaultInterval       = 60 * time.Second
	DefaultPassTimeout    = 2 * time.Minute
	DefaultWorkTimeout    = 5 * time.Minute
	DefaultMaxWorkTimeout = 30 * time.Minute
	DefaultMaxConcurrent  = 4
	DefaultSpoolResults   = 10000
	DefaultSpoolBytes     = 256 << 20
	DefaultReconnectInit  = time.Second
	DefaultReconnectMax   = 30 * time.Second
	DefaultHelloTimeout   = 30 * time.Second
	DefaultStateDir       = "/var/lib/fleetcheck"
	// DefaultMetricsListen keeps /metrics on loopback: a node's
	// measurements are for the local Prometheus agent or a scraper
	// reached through a tunnel, not for the whole network.
	DefaultMetricsListen = "127.0.0.1:9478"
)

// ErrInvalid wraps every validation error of an agent config.
var ErrInvalid = errors.New("invalid agent config")

// DefaultConfig returns a config with every default filled in and no
// coordinator: Validate fails until one is set.
func DefaultConfig() *Config {
	return &Config{
		StateDir:              DefaultStateDir,
		HostRoot:              "/",
		Interval:              config.Duration(DefaultInterval),
		PassTimeout:           config.Duration(DefaultPassTimeout),
		DisruptiveAllowedWhen: []Activity{ActivityIdle, ActivityDrained},
		Work: WorkConfig{
			DefaultTimeout: config.Duration(DefaultWorkTimeout),
			MaxTimeout:     config.Duration(DefaultMaxWorkTimeout),
			MaxConcurrent:  DefaultMaxConcurrent,
		},
		Spool: SpoolConfig{MaxResults: DefaultSpoolResults, MaxBytes: DefaultSpoolBytes},
		Reconnect: ReconnectConfig{Initial: config.Duration(DefaultReconnectInit), Max: config.Duration(DefaultReconnectMax),
			HelloTimeout: config.Duration(DefaultHelloTimeout)},
		MetricsListen: DefaultMetricsListen,
		Checks:        *config.Defaults(),
	}
}

// ParseConfig reads a YAML agent config over the defaults and validates it.
// Unknown keys are errors: a misspelled key must not silently become a
// default. Relative paths stay relative (see LoadConfig); an empty node
// name becomes the hostname.
func ParseConfig(data []byte) (*Config, error) {
	c := DefaultConfig()
	if err := config.DecodeStrict(data, c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if c.Checks.Matrix != nil && c.Checks.MatrixFile != "" {
		return nil, fmt.Errorf("%w: checks: set matrix or matrix_file, not both", ErrInvalid)
	}
	if c.Node == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("%w: node not set and no hostname: %v", ErrInvalid, err)
		}
		c.Node = h
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// LoadConfig reads an agent config file. Relative paths in it (state_dir,
// activity_file, tls files, checks.matrix_file, gossip.keyring_file,
// host.path, and programs given with a directory: actions' and
// multi_node's command[0], checks.tools) are taken relative to the file's
// directory, whatever the working directory; the compatibility matrix is
// loaded and the gossip keyring checked.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read agent config: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	base := config.ConfigDir(path)
	for _, p := range []*string{&c.StateDir, &c.ActivityFile, &c.TLS.CAFile, &c.TLS.CertFile, &c.TLS.KeyFile, &c.Host.Path} {
		config.ResolvePath(base, p)
	}
	c.Checks.ResolvePaths(base)
	for name, a := range c.Actions {
		if len(a.Command) > 0 {
			a.Command = slices.Clone(a.Command)
			config.ResolveProgram(base, &a.Command[0])
			c.Actions[name] = a
		}
	}
	if m := c.MultiNode; m != nil && len(m.LauncherCommand) > 0 {
		config.ResolveProgram(base, &m.LauncherCommand[0])
	}
	if c.Checks.MatrixFile != "" && c.Checks.Matrix == nil {
		m, err := compat.Load(c.Checks.MatrixFile)
		if err != nil {
			return nil, fmt.Errorf("%s: checks.matrix_file: %w", path, err)
		}
		c.Checks.Matrix = m
	}
	c.Gossip.Resolve(base)
	if c.Gossip.Enabled() && c.Gossip.KeyringFile != "" {
		// Validate could not read it: the path was not resolved yet.
		if _, err := c.gossipConfig("", nil); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return c, nil
}

// These are compiled on first use, not at start: their counted
// repetitions ({0,251}) make them the costliest part of the package's
// init, which every `fleetcheck-node analyze` would pay for nothing.
var (
	// Node names end up in certificate SANs and file names: DNS-like only.
	nodeNameRE = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$`)
	})
	// Label keys and values follow Kubernetes' rules, since node selectors
	// use the label-selector syntax.
	labelKeyRE = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)
	})
	labelValueRE = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$`)
	})
)

// Validate checks the config; every error wraps ErrInvalid and names the key.
func (c *Config) Validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrInvalid}, a...)...) }
	if !nodeNameRE().MatchString(c.Node) {
		return bad("node %q: use letters, digits, '.', '_' and '-' (at most 253)", c.Node)
	}
	for k, v := range c.Labels {
		if k == "name" {
			return bad("labels: \"name\" is reserved: selectors use name= for the node name")
		}
		if !labelKeyRE().MatchString(k) {
			return bad("labels: bad key %q", k)
		}
		if !labelValueRE().MatchString(v) {
			return bad("labels[%s]: bad value %q (at most 63 letters, digits, '.', '_', '-')", k, v)
		}
	}
	if err := c.validateCoordinators(); err != nil {
		return bad("%w", err)
	}
	tlsSet := c.TLS.CAFile != "" || c.TLS.CertFile != "" || c.TLS.KeyFile != ""
	switch {
	case c.Insecure && tlsSet:
		return bad("insecure: true and tls: both set; choose one")
	case !c.Insecure && (c.TLS.CAFile == "" || c.TLS.CertFile == "" || c.TLS.KeyFile == ""):
		return bad("tls: ca_file, cert_file and key_file are required (or insecure: true for plaintext)")
	}
	if c.TLS.TrustDomain != "" {
		if err := pki.ValidateTrustDomain(c.TLS.TrustDomain); err != nil {
			return bad("tls.trust_domain: %v", err)
		}
	}
	if c.MetricsListen != "off" && c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			return bad("metrics_listen %q: want host:port, or off", c.MetricsListen)
		}
	}
	if c.StateDir == "" {
		return bad("state_dir is required")
	}
	if c.HostRoot == "" {
		return bad("host_root must not be empty (default /)")
	}
	if err := c.checkRanges(); err != nil {
		return bad("%w", err)
	}
	known := registry.All()
	for _, n := range c.EnabledChecks {
		if !slices.ContainsFunc(known, func(k checks.Check) bool { return k.Name() == n }) {
			return bad("enabled_checks: unknown check %q (see `fleetcheck checks`)", n)
		}
	}
	for _, a := range c.DisruptiveAllowedWhen {
		if a == ActivityUnknown {
			return bad("disruptive_allowed_when: use idle, busy or drained")
		}
	}
	if c.Work.DefaultTimeout > c.Work.MaxTimeout {
		return bad("work.default_timeout %s exceeds work.max_timeout %s", time.Duration(c.Work.DefaultTimeout), time.Duration(c.Work.MaxTimeout))
	}
	if c.Reconnect.Max < c.Reconnect.Initial {
		return bad("reconnect: initial %s exceeds max %s", c.Reconnect.Initial, c.Reconnect.Max)
	}
	if err := c.validateActions(); err != nil {
		return err
	}
	if err := c.validateHost(); err != nil {
		return err
	}
	if c.Gossip.Enabled() {
		// An empty keyring: the file is read by LoadConfig, once its path
		// is resolved, and by Run.
		if _, err := c.gossipConfig("", [][]byte{}); err != nil {
			return err
		}
	}
	if err := c.Checks.Validate(); err != nil {
		return fmt.Errorf("%w: checks: %w", ErrInvalid, err)
	}
	return nil
}

// Ranges of the agent config's numeric values (docs/config.md, "Ranges").
var (
	rangeInterval      = config.R(config.Duration(time.Second), config.Duration(24*time.Hour))
	rangePassTimeout   = config.R(config.Duration(time.Second), config.Duration(time.Hour))
	rangeWorkTimeout   = config.R(config.Duration(time.Second), config.Duration(48*time.Hour))
	rangeMaxConcurrent = config.R(1, 64)
	rangeSpoolResults  = config.R(1, 1_000_000)
	rangeSpoolBytes    = config.R[ByteSize](1<<20, 64<<30)
	rangeReconnectInit = config.R(config.Duration(10*time.Millisecond), config.Duration(10*time.Minute))
	rangeReconnectMax  = config.R(config.Duration(10*time.Millisecond), config.Duration(time.Hour))
	rangeHelloTimeout  = config.R(config.Duration(time.Second), config.Duration(10*time.Minute))
	rangeCoordinators  = config.R(1, 16)                                                         // entries of coordinators:
	rangeActionTimeout = config.R(config.Duration(time.Second), config.Duration(7*24*time.Hour)) // a burn-in stress runs for a day
	rangeRevertAfter   = config.R(config.Duration(time.Second), config.Duration(7*24*time.Hour))
	rangeProcsPerNode  = config.R(1, 256)
	rangeSlotsPerNode  = config.R(1, 256)
	rangeMultiNodes    = config.R(2, 64) // the coordinator sends at most 64 nodes
	rangeMultiBusBW    = config.R(0.0, 10_000)
)

// checkRanges holds every numeric value of the agent's own sections to
// its range and reports all that are outside at once (the checks: section
// and gossip: check their own).
func (c *Config) checkRanges() error {
	errs := []error{
		rangeInterval.Check("interval", c.Interval),
		rangePassTimeout.Check("pass_timeout", c.PassTimeout),
		rangeWorkTimeout.Check("work.default_timeout", c.Work.DefaultTimeout),
		rangeWorkTimeout.Check("work.max_timeout", c.Work.MaxTimeout),
		rangeMaxConcurrent.Check("work.max_concurrent", c.Work.MaxConcurrent),
		rangeSpoolResults.Check("spool.max_results", c.Spool.MaxResults),
		rangeSpoolBytes.Check("spool.max_bytes", c.Spool.MaxBytes),
		rangeReconnectInit.Check("reconnect.initial", c.Reconnect.Initial),
		rangeReconnectMax.Check("reconnect.max", c.Reconnect.Max),
		rangeHelloTimeout.Check("reconnect.hello_timeout", c.Reconnect.HelloTimeout),
	}
	for _, name := range slices.Sorted(maps.Keys(c.Actions)) {
		a, key := c.Actions[name], "actions."+name
		errs = append(errs,
			rangeActionTimeout.CheckOrZero(key+".timeout", a.Timeout),
			rangeRevertAfter.CheckOrZero(key+".revert_after_default", a.RevertAfterDefault),
			rangeRevertAfter.CheckOrZero(key+".revert_after_max", a.RevertAfterMax))
	}
	if m := c.MultiNode; m != nil {
		errs = append(errs,
			rangeProcsPerNode.CheckOrZero("multi_node.procs_per_node", m.ProcsPerNode),
			rangeSlotsPerNode.CheckOrZero("multi_node.slots_per_node", m.SlotsPerNode),
			rangeMultiNodes.CheckOrZero("multi_node.max_nodes", m.MaxNodes),
			rangeActionTimeout.CheckOrZero("multi_node.timeout", m.Timeout),
			rangeMultiBusBW.Check("multi_node.min_busbw_gbps", m.MinBusBWGBps),
			rangeMultiBusBW.Check("multi_node.baseline_gbps", m.BaselineGBps))
	}
	return errors.Join(errs...)
}

// enabledChecks resolves the enabled check names against the known checks,
// in the known list's order; default: every passive check.
func (c *Config) enabledChecks(known []checks.Check) []checks.Check {
	var out []checks.Check
	for _, k := range known {
		if len(c.EnabledChecks) == 0 {
			if !k.Disruptive() {
				out = append(out, k)
			}
			continue
		}
		if slices.Contains(c.EnabledChecks, k.Name()) {
			out = append(out, k)
		}
	}
	return out
}

// activityFile is where the activity is read from.
func (c *Config) activityFile() string {
	if c.ActivityFile != "" {
		return c.ActivityFile
	}
	return filepath.Join(c.StateDir, "activity")
}
