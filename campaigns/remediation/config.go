package remediation

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/escalate"
	"github.com/fleetcheck/fleetcheck/internal/selector"
)

// Config is the coordinator config's remediation section
// (docs/remediation.md). The zero value is shadow mode with the defaults.
//
//	remediation:
//	  mode: shadow            # or auto
//	  recur_window: 168h      # a fault back on the same part within this climbs the ladder
//	  actions: {reset_gpu: gpu-reset, reset_ib_port: ib-port-reset, reboot: reboot, collect: collect-bundle}
//	  maintenance: [{nodes: "rack=r7", from: 2026-06-01T00:00:00Z, until: 2026-06-02T00:00:00Z}]
//	  rma: {webhook: https://tickets.example/hooks/rma, source: fleetcheck/dc1}
//	  rules: {...}            # internal/escalate
//
// It is read from YAML only; its durations carry no JSON name because
// encoding/json would write them as nanoseconds.
type Config struct {
	Mode        Mode          `yaml:"mode" json:"mode"`
	RecurWindow time.Duration `yaml:"recur_window"`
	// Actions maps a step (and "collect", the support bundle) to the
	// agent's configured action name: the coordinator only names it.
	Actions map[string]string `yaml:"actions" json:"actions"`
	// VerifyChecks are the passive checks run to verify; VerifyAllReduce
	// the single-node all_reduce check ("" skips it); Tolerance how far
	// below the node's baseline its bandwidth may be.
	VerifyChecks    []string      `yaml:"verify_checks" json:"verify_checks"`
	VerifyAllReduce string        `yaml:"verify_allreduce" json:"verify_allreduce"`
	Tolerance       float64       `yaml:"tolerance" json:"tolerance"`
	ActionTimeout   time.Duration `yaml:"action_timeout"`
	// Settle is how long after a reset the node is left before it is
	// verified; a reboot waits RebootSettle, then up to VerifyTimeout for
	// the agent to come back.
	Settle        time.Duration `yaml:"settle"`
	RebootSettle  time.Duration `yaml:"reboot_settle"`
	VerifyTimeout time.Duration `yaml:"verify_timeout"`
	// HeldRetry is how long a drain the breaker refused waits to ask again.
	HeldRetry time.Duration `yaml:"held_retry"`
	// Parallel bounds the remediations moving at once (each drain, agent
	// action, verification in a step of its own): a slow action holds
	// only its node.
	Parallel    int       `yaml:"parallel" json:"parallel"`
	OptOutLabel string    `yaml:"opt_out_label" json:"opt_out_label"`
	Maintenance []Window  `yaml:"maintenance" json:"maintenance"`
	RMA         RMAConfig `yaml:"rma" json:"rma"`
	// Rules are the escalation and correlation rules.
	Rules escalate.Config `yaml:"rules" json:"rules"`
}

// Window is a maintenance window: nodes matching the selector are left
// alone from From until Until.
type Window struct {
	Nodes string    `yaml:"nodes" json:"nodes"`
	From  time.Time `yaml:"from" json:"from"`
	Until time.Time `yaml:"until" json:"until"`
}

// RMAConfig says where RMA records go.
type RMAConfig struct {
	// Webhook receives each RMA as a CloudEvent (structured mode); ""
	// keeps them in the store only.
	Webhook string `yaml:"webhook" json:"webhook"`
	// Source is the CloudEvents source attribute.
	Source string `yaml:"source" json:"source"`
	// Retries bounds the sends of one record; Backoff is the first wait,
	// doubled each time.
	Retries int           `yaml:"retries" json:"retries"`
	Backoff time.Duration `yaml:"backoff"`
	Timeout time.Duration `yaml:"timeout"`
}

// Defaults and ranges (docs/coordinator-config.md).
const (
	DefaultRecurWindow   = 7 * 24 * time.Hour
	DefaultTolerance     = 0.3
	DefaultActionTimeout = 15 * time.Minute
	DefaultSettle        = time.Minute
	DefaultRebootSettle  = 10 * time.Minute
	DefaultVerifyTimeout = 30 * time.Minute
	DefaultHeldRetry     = 5 * time.Minute
	DefaultOptOutLabel   = "fleetcheck.io/remediation"
	DefaultRMARetries    = 8
	DefaultRMABackoff    = 30 * time.Second
	DefaultRMATimeout    = 10 * time.Second
	DefaultParallel      = 16
	// ActionCollect names the support-bundle action in Actions.
	ActionCollect = "collect"
)

// DefaultActions are the agent action names the shipped agent config
// (examples/agent.yaml) defines.
var DefaultActions = map[string]string{
	StepResetGPU: "gpu-reset", StepResetIBPort: "ib-port-reset", StepReboot: "reboot", ActionCollect: "collect-bundle",
}

// DefaultVerifyChecks are the passive checks a verification runs.
var DefaultVerifyChecks = []string{"gpu.inventory", "gpu.xid", "gpu.ecc", "gpu.pcie", "gpu.nvlink", "ib.ports", "ib.counters"}

var (
	RangeRecurWindow   = config.R(time.Hour, 90*24*time.Hour)
	RangeTolerance     = config.R(0.01, 0.9)
	RangeActionTimeout = config.R(10*time.Second, 2*time.Hour)
	RangeSettle        = config.R(time.Duration(0), time.Hour)
	RangeRebootSettle  = config.R(time.Duration(0), 2*time.Hour)
	RangeVerifyTimeout = config.R(time.Minute, 24*time.Hour)
	RangeHeldRetry     = config.R(10*time.Second, 24*time.Hour)
	RangeRMARetries    = config.R(1, 100)
	RangeRMABackoff    = config.R(time.Second, time.Hour)
	RangeRMATimeout    = config.R(time.Second, 5*time.Minute)
	RangeParallel      = config.R(1, 256)
)

var actionNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// WithDefaults fills zero values.
func (c Config) WithDefaults() Config {
	if c.Mode == "" {
		c.Mode = ModeShadow
	}
	acts := map[string]string{}
	for k, v := range DefaultActions {
		acts[k] = v
	}
	for k, v := range c.Actions {
		acts[k] = v
	}
	c.Actions = acts
	if c.VerifyChecks == nil {
		c.VerifyChecks = slices.Clone(DefaultVerifyChecks)
	}
	if c.VerifyAllReduce == "" {
		c.VerifyAllReduce = "nccl.allreduce"
	}
	if c.VerifyAllReduce == "none" {
		c.VerifyAllReduce = ""
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.RecurWindow, DefaultRecurWindow)
	def(&c.ActionTimeout, DefaultActionTimeout)
	def(&c.Settle, DefaultSettle)
	def(&c.RebootSettle, DefaultRebootSettle)
	def(&c.VerifyTimeout, DefaultVerifyTimeout)
	def(&c.HeldRetry, DefaultHeldRetry)
	def(&c.RMA.Backoff, DefaultRMABackoff)
	def(&c.RMA.Timeout, DefaultRMATimeout)
	if c.Tolerance == 0 {
		c.Tolerance = DefaultTolerance
	}
	if c.RMA.Retries == 0 {
		c.RMA.Retries = DefaultRMARetries
	}
	if c.Parallel == 0 {
		c.Parallel = DefaultParallel
	}
	if c.RMA.Source == "" {
		c.RMA.Source = "fleetcheck/coordinator"
	}
	if c.OptOutLabel == "" {
		c.OptOutLabel = DefaultOptOutLabel
	}
	c.Rules = c.Rules.WithDefaults()
	return c
}

// Validate checks the section; keys are named under "remediation.".
func (c Config) Validate() error {
	const p = "remediation."
	var errs []error
	switch c.Mode {
	case "", ModeShadow, ModeAuto:
	default:
		errs = append(errs, fmt.Errorf("%smode %q: must be shadow or auto", p, c.Mode))
	}
	errs = append(errs,
		RangeRecurWindow.CheckOrZero(p+"recur_window", c.RecurWindow),
		RangeTolerance.CheckOrZero(p+"tolerance", c.Tolerance),
		RangeActionTimeout.CheckOrZero(p+"action_timeout", c.ActionTimeout),
		RangeSettle.Check(p+"settle", c.Settle),
		RangeRebootSettle.Check(p+"reboot_settle", c.RebootSettle),
		RangeVerifyTimeout.CheckOrZero(p+"verify_timeout", c.VerifyTimeout),
		RangeHeldRetry.CheckOrZero(p+"held_retry", c.HeldRetry),
		RangeRMARetries.CheckOrZero(p+"rma.retries", c.RMA.Retries),
		RangeRMABackoff.CheckOrZero(p+"rma.backoff", c.RMA.Backoff),
		RangeRMATimeout.CheckOrZero(p+"rma.timeout", c.RMA.Timeout),
		RangeParallel.CheckOrZero(p+"parallel", c.Parallel))
	keys := make([]string, 0, len(c.Actions))
	for k := range c.Actions {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k != ActionCollect && !slices.Contains(escalate.Steps, k) || k == StepReplace || k == StepReseat {
			errs = append(errs, fmt.Errorf("%sactions: %q: a step the agent acts on (reset_gpu, reset_ib_port, reboot) or collect", p, k))
		}
		if !actionNameRE.MatchString(c.Actions[k]) {
			errs = append(errs, fmt.Errorf("%sactions.%s %q: an agent action name (letters, digits, . _ -)", p, k, c.Actions[k]))
		}
	}
	for i, w := range c.Maintenance {
		if _, err := selector.Parse(w.Nodes); err != nil || w.Nodes == "" {
			errs = append(errs, fmt.Errorf("%smaintenance[%d].nodes %q: a node selector (rack=r7): %v", p, i, w.Nodes, err))
		}
		if w.From.IsZero() || !w.Until.After(w.From) {
			errs = append(errs, fmt.Errorf("%smaintenance[%d]: from and until are times, until after from", p, i))
		}
	}
	if c.RMA.Webhook != "" {
		u, err := url.Parse(c.RMA.Webhook)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%srma.webhook %q: an http(s) URL", p, c.RMA.Webhook))
		}
	}
	if err := c.Rules.Validate(p + "rules"); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}
