// Package burnin runs pre-acceptance burn-in campaigns: new or repaired
// nodes are drained, stressed with a named suite of checks and agent
// actions, compared with their SKU baseline and with their peers in the
// same campaign, and each ends accepted or rejected with its evidence.
// Campaigns are durable state machines in SQLite (burnin_ tables): every
// transition is written before it is acted on, so a restarted coordinator
// continues where it stopped. docs/burnin.md is the operator's page.
package burnin

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/selector"
)

// ErrInvalidSpec wraps every validation error of a burn-in spec.
var ErrInvalidSpec = errors.New("invalid burn-in spec")

// Level names a suite.
type Level string

// Levels, from cheapest to longest.
const (
	Quick    Level = "quick"
	Standard Level = "standard"
	Extended Level = "extended"
)

// StepKind says how a step reaches the agents.
type StepKind string

// Step kinds.
const (
	// StepChecks runs named checks on one node (Fleet.RunChecks).
	StepChecks StepKind = "checks"
	// StepAction runs a named agent action on one node (Fleet.RunAction);
	// with sample_checks, those checks are polled while it runs.
	StepAction StepKind = "action"
	// StepPairs runs a multi-node check over pairs of nodes
	// (Fleet.RunMulti), in rounds with different partners.
	StepPairs StepKind = "pairs"
)

// Step is one element of a suite. Only names and bounded parameters reach
// the agent; the agent's own config decides what a name runs.
type Step struct {
	Name   string            `yaml:"name" json:"name"`
	Kind   StepKind          `yaml:"kind" json:"kind"`
	Checks []string          `yaml:"checks,omitempty" json:"checks,omitempty"`
	Action string            `yaml:"action,omitempty" json:"action,omitempty"`
	Params map[string]string `yaml:"params,omitempty" json:"params,omitempty"`
	// Timeout bounds one run of the step on one node (or pair).
	Timeout config.Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	// SampleChecks are polled every SampleEvery while an action runs (the
	// temperatures during stress).
	SampleChecks []string        `yaml:"sample_checks,omitempty" json:"sample_checks,omitempty"`
	SampleEvery  config.Duration `yaml:"sample_every,omitempty" json:"sample_every,omitempty"`
	// Rounds is how many pairings a pairs step runs (each node meets a
	// different partner in every round); default 2, so a slow pair can be
	// told from a slow node.
	Rounds int `yaml:"rounds,omitempty" json:"rounds,omitempty"`
}

// Suite is a named list of steps.
type Suite struct {
	Name  string `yaml:"name" json:"name"`
	Steps []Step `yaml:"steps" json:"steps"`
}

// Metric is a number compared with the SKU baseline and with peers.
type Metric struct {
	// Name as in the report (`nccl.allreduce.busbw_gbps`); pairs steps
	// report theirs as `nccl.allreduce2.busbw_gbps`.
	Name string `yaml:"name" json:"name"`
	// Direction: higher (bandwidth) or lower (latency); default from the
	// unit in the name, else higher.
	Direction string `yaml:"direction,omitempty" json:"direction,omitempty"`
	// Required: a node without this number is inconclusive (rejected).
	Required bool `yaml:"required,omitempty" json:"required,omitempty"`
	// Floor is an absolute limit in the bad direction (0 = none).
	Floor float64 `yaml:"floor,omitempty" json:"floor,omitempty"`
}

// OutlierRule decides when a node is an outlier among identical peers:
// its shortfall from the campaign median (in the bad direction) exceeds
// MinShortfall AND its distance from the median exceeds MADs median
// absolute deviations. Both must hold: the first ignores noise on a tight
// fleet, the second ignores a loose fleet's normal spread.
type OutlierRule struct {
	MinShortfall float64 `yaml:"min_shortfall" json:"min_shortfall"`
	MADs         float64 `yaml:"mads" json:"mads"`
	// MinPeers is the fewest nodes of one SKU with a value for the rule to
	// apply; with fewer, a median says little and peers are not compared.
	MinPeers int `yaml:"min_peers" json:"min_peers"`
}

// BaselinePolicy is how the campaign uses and updates baselines.
type BaselinePolicy struct {
	// SKU overrides the SKU read from the inventory for every node.
	SKU string `yaml:"sku,omitempty" json:"sku,omitempty"`
	// MaxDeviation is the floor against the SKU baseline: a shortfall
	// above it rejects (default 0.30).
	MaxDeviation float64 `yaml:"max_deviation" json:"max_deviation"`
	// Missing says what a missing SKU baseline means: "reject" (default:
	// inconclusive is never a pass) or "peers" (the peer comparison
	// alone decides; for the first campaign of a new SKU).
	Missing string `yaml:"missing" json:"missing"`
	// RecordNode records node baselines for accepted nodes (median of the
	// repeats); default true.
	RecordNode *bool `yaml:"record_node,omitempty" json:"record_node,omitempty"`
	// UpdateSKU sets the SKU baseline from the campaign median of the
	// accepted nodes.
	UpdateSKU bool `yaml:"update_sku" json:"update_sku"`
}

// Spec is a burn-in campaign as an operator writes it (burnin.yaml).
type Spec struct {
	Name     string `yaml:"name,omitempty" json:"name,omitempty"`
	Selector string `yaml:"selector" json:"selector"`
	Level    Level  `yaml:"level" json:"level"`
	// Repeats runs the single-node steps (and pair rounds) this many
	// times; default 1, 3 at extended.
	Repeats int `yaml:"repeats,omitempty" json:"repeats,omitempty"`
	// StressDuration is passed to the stress action as "duration"
	// (default 30m).
	StressDuration config.Duration `yaml:"stress_duration,omitempty" json:"stress_duration,omitempty"`
	// Concurrency bounds the nodes worked on at once (default 64).
	Concurrency int `yaml:"concurrency,omitempty" json:"concurrency,omitempty"`
	// RejectOn lists the check statuses that reject (default fail, error;
	// add warn for a stricter acceptance).
	RejectOn []string       `yaml:"reject_on,omitempty" json:"reject_on,omitempty"`
	Outlier  OutlierRule    `yaml:"outlier" json:"outlier"`
	Baseline BaselinePolicy `yaml:"baseline" json:"baseline"`
	Metrics  []Metric       `yaml:"metrics,omitempty" json:"metrics,omitempty"`
	// UndrainAccepted returns accepted nodes to service when this campaign
	// drained them (default true). Rejected nodes always stay drained.
	UndrainAccepted *bool `yaml:"undrain_accepted,omitempty" json:"undrain_accepted,omitempty"`
	// RejectRepeatOffenders rejects a node carrying a part rejected in an
	// earlier campaign; by default such parts are only called out.
	RejectRepeatOffenders bool `yaml:"reject_repeat_offenders,omitempty" json:"reject_repeat_offenders,omitempty"`
	// Suite replaces the level's built-in suite.
	Suite *Suite `yaml:"suite,omitempty" json:"suite,omitempty"`
	// Who started it, for the baselines' history and the report.
	Who string `yaml:"who,omitempty" json:"who,omitempty"`
	// ConnectGrace is how long a node whose agent is not connected when
	// its turn comes (to be drained, or for its next run) is waited for
	// (default 2m, from 5s to 24h). After it, the node is rejected as
	// inconclusive, never accepted.
	ConnectGrace config.Duration `yaml:"connect_grace,omitempty" json:"connect_grace,omitempty"`
}

// connectGrace is the spec's grace; a campaign stored before the field
// existed gets the default.
func (s *Spec) connectGrace() time.Duration {
	if s.ConnectGrace <= 0 {
		return kit.DefaultConnectGrace
	}
	return time.Duration(s.ConnectGrace)
}

// Defaults.
const (
	DefaultConcurrency    = 64
	DefaultStressDuration = 30 * time.Minute
	stressMargin          = 10 * time.Minute // the stress step's timeout beyond its duration
	MaxStressDuration     = kit.MaxRunTimeout - stressMargin
	DefaultMaxDeviation   = 0.30
	DefaultMinShortfall   = 0.10
	DefaultMADs           = 3
	DefaultMinPeers       = 4
	DefaultRounds         = 2
	DefaultSampleEvery    = time.Minute
	maxRepeats            = 20
	maxSteps              = 32
	maxParams             = 16
	maxNameLen            = 63
)

// Missing-baseline policies.
const (
	MissingReject = "reject"
	MissingPeers  = "peers"
)

var (
	nameRE  = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)
	paramRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)
	// Parameter values are bounded words: sizes, levels, durations.
	valueRE = regexp.MustCompile(`^[A-Za-z0-9._:/+-]{0,64}$`)
)

// ParseSpec reads a YAML spec, fills the defaults and validates it.
// Unknown keys are errors: a misspelled key must not become a default.
func ParseSpec(data []byte) (*Spec, error) {
	var s Spec
	if err := config.DecodeStrict(data, &s); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty document", ErrInvalidSpec)
		}
		return nil, fmt.Errorf("%w: %w", ErrInvalidSpec, err)
	}
	if err := s.Normalize(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Normalize fills the defaults and validates; every error wraps
// ErrInvalidSpec and names the key.
func (s *Spec) Normalize() error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: "+f, append([]any{ErrInvalidSpec}, a...)...)
	}
	if s.Name != "" && !nameRE.MatchString(s.Name) {
		return bad("name %q: lowercase letters, digits, '.', '_', '-' (at most 63)", s.Name)
	}
	if _, err := selector.Parse(s.Selector); err != nil {
		return bad("selector: %w", err)
	}
	if strings.TrimSpace(s.Selector) == "" {
		return bad("selector is required (burn-in never selects the whole fleet by default)")
	}
	switch s.Level {
	case Quick, Standard, Extended:
	case "":
		return bad("level is required: quick, standard or extended")
	default:
		return bad("level %q: quick, standard or extended", s.Level)
	}
	if s.Repeats == 0 {
		s.Repeats = 1
		if s.Level == Extended {
			s.Repeats = 3
		}
	}
	if s.Repeats < 1 || s.Repeats > maxRepeats {
		return bad("repeats %d: between 1 and %d", s.Repeats, maxRepeats)
	}
	if s.StressDuration == 0 {
		s.StressDuration = config.Duration(DefaultStressDuration)
	}
	if d := time.Duration(s.StressDuration); d < time.Minute || d > MaxStressDuration {
		// The stress step's run is bounded by the coordinator's cap on one run.
		return bad("stress_duration %v: between 1m and %v (the run takes %v more, and one run is at most %v)",
			d, MaxStressDuration, stressMargin, kit.MaxRunTimeout)
	}
	if s.Concurrency == 0 {
		s.Concurrency = DefaultConcurrency
	}
	if s.Concurrency < 1 || s.Concurrency > 4096 {
		return bad("concurrency %d: between 1 and 4096", s.Concurrency)
	}
	if len(s.RejectOn) == 0 {
		s.RejectOn = []string{"fail", "error"}
	}
	for _, st := range s.RejectOn {
		if st != "fail" && st != "error" && st != "warn" {
			return bad("reject_on: %q is not fail, error or warn", st)
		}
	}
	if !slices.Contains(s.RejectOn, "fail") || !slices.Contains(s.RejectOn, "error") {
		// An error is inconclusive and inconclusive is never a pass.
		return bad("reject_on must include fail and error")
	}
	if err := s.Outlier.normalize(); err != nil {
		return bad("outlier: %w", err)
	}
	if err := s.Baseline.normalize(); err != nil {
		return bad("baseline: %w", err)
	}
	if s.UndrainAccepted == nil {
		t := true
		s.UndrainAccepted = &t
	}
	if s.Suite == nil {
		su := DefaultSuite(s.Level, time.Duration(s.StressDuration))
		s.Suite = &su
	}
	if err := s.Suite.validate(); err != nil {
		return bad("suite: %w", err)
	}
	if len(s.Metrics) == 0 {
		s.Metrics = DefaultMetrics(*s.Suite)
	}
	seen := map[string]bool{}
	for i := range s.Metrics {
		m := &s.Metrics[i]
		if err := validMetricName(m.Name); err != nil {
			return bad("metrics[%d]: %w", i, err)
		}
		if seen[m.Name] {
			return bad("metrics: %s listed twice", m.Name)
		}
		seen[m.Name] = true
		switch m.Direction {
		case "":
			m.Direction = guessDirection(m.Name)
		case "higher", "lower":
		default:
			return bad("metrics[%s].direction %q: higher or lower", m.Name, m.Direction)
		}
		if m.Floor < 0 || math.IsNaN(m.Floor) || math.IsInf(m.Floor, 0) {
			return bad("metrics[%s].floor must be a finite number >= 0", m.Name)
		}
	}
	if len(s.Who) > 256 {
		return bad("who: at most 256 bytes")
	}
	grace := time.Duration(s.ConnectGrace)
	if err := kit.CheckConnectGrace(&grace); err != nil {
		return bad("connect_grace %w", err)
	}
	s.ConnectGrace = config.Duration(grace)
	return nil
}

func (o *OutlierRule) normalize() error {
	if o.MinShortfall == 0 {
		o.MinShortfall = DefaultMinShortfall
	}
	if o.MADs == 0 {
		o.MADs = DefaultMADs
	}
	if o.MinPeers == 0 {
		o.MinPeers = DefaultMinPeers
	}
	if !(o.MinShortfall > 0 && o.MinShortfall < 1) {
		return fmt.Errorf("min_shortfall %v: between 0 and 1 (0.10 = 10 %%)", o.MinShortfall)
	}
	if !(o.MADs > 0 && o.MADs <= 100) {
		return fmt.Errorf("mads %v: between 0 and 100", o.MADs)
	}
	if o.MinPeers < 3 {
		return fmt.Errorf("min_peers %d: at least 3 (a median of two says nothing)", o.MinPeers)
	}
	return nil
}

func (b *BaselinePolicy) normalize() error {
	if b.MaxDeviation == 0 {
		b.MaxDeviation = DefaultMaxDeviation
	}
	if !(b.MaxDeviation > 0 && b.MaxDeviation < 1) {
		return fmt.Errorf("max_deviation %v: between 0 and 1 (0.30 = 30 %%)", b.MaxDeviation)
	}
	switch b.Missing {
	case "":
		b.Missing = MissingReject
	case MissingReject, MissingPeers:
	default:
		return fmt.Errorf("missing %q: reject or peers", b.Missing)
	}
	if b.RecordNode == nil {
		t := true
		b.RecordNode = &t
	}
	if b.SKU != "" && !nameRE.MatchString(b.SKU) {
		return fmt.Errorf("sku %q: lowercase letters, digits, '.', '_', '-'", b.SKU)
	}
	return nil
}

func (su *Suite) validate() error {
	if su.Name == "" {
		return errors.New("name is required")
	}
	if !nameRE.MatchString(su.Name) {
		return fmt.Errorf("name %q: lowercase letters, digits, '.', '_', '-'", su.Name)
	}
	if len(su.Steps) == 0 || len(su.Steps) > maxSteps {
		return fmt.Errorf("between 1 and %d steps", maxSteps)
	}
	names := map[string]bool{}
	for i := range su.Steps {
		st := &su.Steps[i]
		if !nameRE.MatchString(st.Name) {
			return fmt.Errorf("steps[%d].name %q: lowercase letters, digits, '.', '_', '-'", i, st.Name)
		}
		if names[st.Name] {
			return fmt.Errorf("steps: %q twice", st.Name)
		}
		names[st.Name] = true
		if err := st.validate(); err != nil {
			return fmt.Errorf("steps[%s]: %w", st.Name, err)
		}
	}
	return nil
}

func (st *Step) validate() error {
	for _, c := range append(slices.Clone(st.Checks), st.SampleChecks...) {
		if err := validCheckName(c); err != nil {
			return err
		}
	}
	switch st.Kind {
	case StepChecks:
		if len(st.Checks) == 0 || st.Action != "" {
			return errors.New("a checks step names checks and no action")
		}
	case StepAction:
		if st.Action == "" || len(st.Checks) != 0 {
			return errors.New("an action step names one action and no checks")
		}
		if !nameRE.MatchString(st.Action) {
			return fmt.Errorf("action %q: lowercase letters, digits, '.', '_', '-'", st.Action)
		}
	case StepPairs:
		if len(st.Checks) != 1 || st.Action != "" {
			return errors.New("a pairs step names exactly one multi-node check")
		}
		if st.Rounds == 0 {
			st.Rounds = DefaultRounds
		}
		if st.Rounds < 1 || st.Rounds > 8 {
			return fmt.Errorf("rounds %d: between 1 and 8", st.Rounds)
		}
	default:
		return fmt.Errorf("kind %q: checks, action or pairs", st.Kind)
	}
	if t := time.Duration(st.Timeout); t != 0 && (t < kit.MinRunTimeout || t > kit.MaxRunTimeout) {
		return fmt.Errorf("timeout %v: between %v and %v (the coordinator's bounds on one run)", t, kit.MinRunTimeout, kit.MaxRunTimeout)
	}
	if len(st.SampleChecks) > 0 && st.Kind != StepAction {
		return errors.New("sample_checks only go with an action step")
	}
	if len(st.SampleChecks) > 0 && st.SampleEvery == 0 {
		st.SampleEvery = config.Duration(DefaultSampleEvery)
	}
	if st.SampleEvery != 0 && time.Duration(st.SampleEvery) < time.Second {
		return errors.New("sample_every: at least 1s")
	}
	if len(st.Params) > maxParams {
		return fmt.Errorf("at most %d params", maxParams)
	}
	for k, v := range st.Params {
		if !paramRE.MatchString(k) {
			return fmt.Errorf("param %q: lowercase name, at most 32", k)
		}
		if !valueRE.MatchString(v) {
			return fmt.Errorf("param %s=%q: a bounded word (letters, digits, . _ : / + -; at most 64)", k, v)
		}
	}
	return nil
}

var checkRE = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$`)

func validCheckName(c string) error {
	if len(c) > 64 || !checkRE.MatchString(c) {
		return fmt.Errorf("check %q: a dotted lowercase name such as gpu.xid", c)
	}
	return nil
}

var metricRE = regexp.MustCompile(`^[a-z0-9_]+(\.[a-z0-9_]+)+$`)

func validMetricName(m string) error {
	if len(m) > 200 || !metricRE.MatchString(m) {
		return fmt.Errorf("metric %q: dotted lowercase words such as nccl.allreduce.busbw_gbps", m)
	}
	return nil
}

// guessDirection reads the unit in the metric's last word: times are
// better lower, everything else (bandwidths, rates) higher.
func guessDirection(m string) string {
	last := m[strings.LastIndexByte(m, '.')+1:]
	for _, u := range []string{"_us", "_ms", "_ns", "_s", "_seconds", "_c"} {
		if strings.HasSuffix(last, u) {
			return "lower"
		}
	}
	return "higher"
}

// clone returns a deep copy (the engine stores it as JSON anyway; this
// keeps a caller's later edits out of a running campaign).
func (s *Spec) clone() *Spec {
	c := *s
	c.RejectOn = slices.Clone(s.RejectOn)
	c.Metrics = slices.Clone(s.Metrics)
	if s.Suite != nil {
		su := *s.Suite
		su.Steps = make([]Step, len(s.Suite.Steps))
		for i, st := range s.Suite.Steps {
			st.Checks = slices.Clone(st.Checks)
			st.SampleChecks = slices.Clone(st.SampleChecks)
			st.Params = maps.Clone(st.Params)
			su.Steps[i] = st
		}
		c.Suite = &su
	}
	return &c
}
