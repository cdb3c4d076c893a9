package console

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
)

// Config is the console section of the coordinator's config:
//
//	console:
//	  enabled: true
//	  listen: 127.0.0.1:7445   # its own address; HTTPS with the coordinator's certificate when tls: is set
//	  token_file: console.tokens  # "NAME TOKEN" lines, mode 0600; read at start, on SIGHUP and when it changes
//	  actions: false           # true lets operators pause/resume/abort campaigns and approve waves
//	  refresh: 2s              # how often an open page asks for fresh data
//	  page_size: 100           # nodes per page of the fleet list
type Config struct {
	Enabled   bool          `yaml:"enabled"`
	Listen    string        `yaml:"listen"`
	TokenFile string        `yaml:"token_file"`
	Actions   bool          `yaml:"actions"`
	Refresh   time.Duration `yaml:"refresh"`
	PageSize  int           `yaml:"page_size"`
}

// Defaults.
const (
	DefaultListen   = "127.0.0.1:7445"
	DefaultRefresh  = 2 * time.Second
	DefaultPageSize = 100
)

// Ranges (docs/coordinator-config.md).
var (
	// Faster than 250ms is load, not news; slower than a minute is not live.
	rangeRefresh = config.R(250*time.Millisecond, time.Minute)
	// A page of 1,000 nodes is still under the page-weight target.
	rangePageSize = config.R(10, 1000)
)

// WithDefaults fills in unset fields.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Refresh == 0 {
		c.Refresh = DefaultRefresh
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	return c
}

// Validate reports what is wrong with the section (after defaults). A
// disabled console is not checked beyond its numbers.
func (c Config) Validate() error {
	errs := []error{
		rangeRefresh.Check("console.refresh", c.Refresh),
		rangePageSize.Check("console.page_size", c.PageSize),
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("console.listen %q: %w", c.Listen, err))
	}
	return errors.Join(errs...)
}
