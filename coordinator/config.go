package coordinator

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is the coordinator's YAML configuration. Zero values take the
// defaults that WithDefaults fills in.
//
//	listen: 127.0.0.1:7443        # gRPC, agents and operators
//	http_listen: 127.0.0.1:7444   # /healthz (and /metrics)
//	data_dir: /var/lib/fleetcheck
//	retention_days: 30            # raw results older than this are deleted
//	heartbeat_interval: 10s       # a stream silent for 3 intervals is closed
//	insecure: true                # plaintext gRPC; required until TLS is configured
type Config struct {
	Listen string `yaml:"listen"`
	// HTTPListen serves /healthz (and /metrics); "off" serves no HTTP.
	HTTPListen        string        `yaml:"http_listen"`
	DataDir           string        `yaml:"data_dir"`
	RetentionDays     int           `yaml:"retention_days"`
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// Insecure serves plaintext gRPC. Without it the coordinator needs
	// transport credentials (Options.Credentials).
	Insecure bool `yaml:"insecure"`
	// Batch tunes the store's group commit.
	Batch BatchConfig `yaml:"batch"`
	// SendQueue bounds the messages waiting to be sent on one agent stream.
	SendQueue int `yaml:"send_queue"`
}

// BatchConfig tunes how results are grouped into transactions.
type BatchConfig struct {
	MaxResults int           `yaml:"max_results"` // results per transaction at most
	Delay      time.Duration `yaml:"delay"`       // how long to wait for more once one is queued
}

// Defaults.
const (
	DefaultListen            = "127.0.0.1:7443"
	DefaultHTTPListen        = "127.0.0.1:7444"
	DefaultRetentionDays     = 30
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultSendQueue         = 256
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
	return c
}

// Validate reports the first thing wrong with a config (after defaults).
func (c Config) Validate() error {
	var errs []error
	if c.DataDir == "" {
		errs = append(errs, errors.New("data_dir is required"))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen %q: %w", c.Listen, err))
	}
	if c.HTTPListen != "off" {
		if _, _, err := net.SplitHostPort(c.HTTPListen); err != nil {
			errs = append(errs, fmt.Errorf("http_listen %q: %w", c.HTTPListen, err))
		}
	}
	if c.RetentionDays < 1 {
		errs = append(errs, fmt.Errorf("retention_days %d: must be at least 1", c.RetentionDays))
	}
	if c.HeartbeatInterval < 10*time.Millisecond || c.HeartbeatInterval > 10*time.Minute {
		errs = append(errs, fmt.Errorf("heartbeat_interval %s: must be between 10ms and 10m", c.HeartbeatInterval))
	}
	if c.SendQueue < 1 {
		errs = append(errs, fmt.Errorf("send_queue %d: must be at least 1", c.SendQueue))
	}
	if c.Batch.MaxResults < 0 || c.Batch.Delay < 0 {
		errs = append(errs, errors.New("batch: max_results and delay must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("coordinator config: %w", err)
	}
	return nil
}

// LoadConfig reads a YAML config file, fills in defaults and validates it.
// Unknown keys are errors: a misspelt key would otherwise be ignored.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("coordinator config: %w", err)
	}
	return ParseConfig(b)
}

// ParseConfig is LoadConfig on bytes.
func ParseConfig(b []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("coordinator config: %w", err)
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}
