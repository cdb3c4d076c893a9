package sweep

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/config"
)

// Defaults.
const (
	DefaultThreshold   = 0.30
	DefaultMaxRepeats  = 2
	DefaultBandSigmas  = 2.0 // noise window = sigmas × the baseline's robust spread
	DefaultTestTimeout = 10 * time.Minute
	DefaultLeafLabel   = "leaf"
	DefaultNodeTest    = 4 * time.Minute // a node's share of one sweep, for GPU-hour budgets
	DefaultCoverNights = 7
	DefaultGPUsPerNode = 8
)

// ErrInvalidSpec wraps every spec validation error.
var ErrInvalidSpec = errors.New("invalid sweep spec")

// Spec is what an operator asks a sweep to do. The zero value (plus a
// selector) is a full sweep with the defaults.
type Spec struct {
	// Selector picks nodes by label (Kubernetes syntax, plus name=); "" = all.
	Selector string `json:"selector" yaml:"selector"`
	// Threshold is the deviation (shortfall below baseline as a fraction of
	// it) above which a measurement is slow. Default 0.30.
	Threshold float64 `json:"threshold" yaml:"threshold"`
	// Repeat says when a measurement is taken again before it is called.
	Repeat RepeatPolicy `json:"repeat" yaml:"repeat"`
	// Budget bounds how much of the fleet one sweep takes.
	Budget Budget `json:"budget" yaml:"budget"`
	// IgnoreLeaves pairs nodes at random instead of across leaf switches.
	IgnoreLeaves bool `json:"ignore_leaves,omitempty" yaml:"ignore_leaves"`
	// LeafLabel is the label that names a node's leaf switch. Default "leaf".
	LeafLabel string `json:"leaf_label,omitempty" yaml:"leaf_label"`
	// Drain asks the Drainer to take gpu-side and network-side nodes out of
	// service once the sweep has called them.
	Drain bool `json:"drain,omitempty" yaml:"drain"`
	// Concurrency caps the tests running at once; 0 runs a whole wave at once.
	Concurrency int `json:"concurrency,omitempty" yaml:"concurrency"`
	// TestTimeout bounds one all_reduce run. Default 10m.
	TestTimeout config.Duration `json:"test_timeout,omitempty" yaml:"test_timeout"`
	// Seed varies the pairing; 0 derives it from the sweep's id, so each
	// night pairs nodes differently and paths are covered over nights.
	Seed uint64 `json:"seed,omitempty" yaml:"seed"`
	// Note is free text kept with the sweep (who, why).
	Note string `json:"note,omitempty" yaml:"note"`
	// ConnectGrace is how long the sweep waits, before its first round,
	// for selected nodes whose agent is not connected (default 2m, from 5s
	// to 24h); those still away are reported unreachable, never passed.
	ConnectGrace config.Duration `json:"connect_grace,omitempty" yaml:"connect_grace"`
}

// RepeatPolicy decides repeats.
type RepeatPolicy struct {
	// MaxRepeats caps repeats of one measurement. 0 means the default (2);
	// negative means never repeat.
	MaxRepeats int `json:"max_repeats,omitempty" yaml:"max_repeats"`
	// NoConfirm calls a node slow on one slow single-node run instead of
	// repeating it (no transient verdicts from round 1 then).
	NoConfirm bool `json:"no_confirm,omitempty" yaml:"no_confirm"`
	// A deviation within the noise window of the threshold is measured
	// again. The window is BandSigmas robust standard deviations of the
	// baseline's samples (default 2), at least Band (a fraction; 0 takes
	// the baselines package's floor, 2 %).
	Band       float64 `json:"band,omitempty" yaml:"band"`
	BandSigmas float64 `json:"band_sigmas,omitempty" yaml:"band_sigmas"`
}

// Budget bounds one sweep and rotates through the fleet across nights.
// With no limit set every selected node is tested.
type Budget struct {
	// MaxShare of the selected nodes tested in one sweep, in (0, 1].
	MaxShare float64 `json:"max_share,omitempty" yaml:"max_share"`
	// MaxNodes tested in one sweep.
	MaxNodes int `json:"max_nodes,omitempty" yaml:"max_nodes"`
	// MaxGPUHours per sweep, counting NodeTestTime per node on all its GPUs.
	MaxGPUHours float64 `json:"max_gpu_hours,omitempty" yaml:"max_gpu_hours"`
	// NodeTestTime is a node's estimated share of one sweep. Default 4m.
	NodeTestTime config.Duration `json:"node_test_time,omitempty" yaml:"node_test_time"`
	// CoverWithinNights is the rotation target: every selected node tested
	// at least once within this many nights (a night = 24 h). Default 7.
	CoverWithinNights int `json:"cover_within_nights,omitempty" yaml:"cover_within_nights"`
}

// WithDefaults returns the spec with defaults filled in.
func (s Spec) WithDefaults() Spec {
	if s.Threshold == 0 {
		s.Threshold = DefaultThreshold
	}
	if s.Repeat.MaxRepeats == 0 {
		s.Repeat.MaxRepeats = DefaultMaxRepeats
	}
	if s.Repeat.BandSigmas == 0 {
		s.Repeat.BandSigmas = DefaultBandSigmas
	}
	if s.LeafLabel == "" {
		s.LeafLabel = DefaultLeafLabel
	}
	if s.TestTimeout == 0 {
		s.TestTimeout = config.Duration(DefaultTestTimeout)
	}
	if s.Budget.NodeTestTime == 0 {
		s.Budget.NodeTestTime = config.Duration(DefaultNodeTest)
	}
	if s.Budget.CoverWithinNights == 0 {
		s.Budget.CoverWithinNights = DefaultCoverNights
	}
	return s
}

// Ranges of the spec's numeric values (docs/campaigns.md), after defaults.
var (
	rangeThreshold  = config.R(0.01, 0.99)
	rangeMaxRepeats = config.R(-1, 10) // -1: never repeat
	rangeBand       = config.R(0.0, 0.5)
	rangeSigmas     = config.R(0.1, 10)
	rangeShare      = config.R(0.0, 1)
	rangeNodes      = config.R(0, 100_000)
	rangeGPUHours   = config.R(0.0, 1_000_000)
	rangeNodeTest   = config.R(config.Duration(time.Second), config.Duration(24*time.Hour))
	rangeNights     = config.R(1, 365)
	rangeTimeout    = config.R(config.Duration(time.Second), config.Duration(24*time.Hour))
	rangeGrace      = config.R(config.Duration(kit.MinConnectGrace), config.Duration(kit.MaxConnectGrace))
)

// Validate reports everything wrong with the spec (after defaults): each
// numeric value outside its range, by key.
func (s Spec) Validate() error {
	errs := []error{
		rangeThreshold.Check("threshold", s.Threshold),
		rangeMaxRepeats.Check("repeat.max_repeats", s.Repeat.MaxRepeats),
		rangeBand.Check("repeat.band", s.Repeat.Band),
		rangeSigmas.Check("repeat.band_sigmas", s.Repeat.BandSigmas),
		rangeShare.Check("budget.max_share", s.Budget.MaxShare),
		rangeNodes.Check("budget.max_nodes", s.Budget.MaxNodes),
		rangeGPUHours.Check("budget.max_gpu_hours", s.Budget.MaxGPUHours),
		rangeNodeTest.Check("budget.node_test_time", s.Budget.NodeTestTime),
		rangeNights.Check("budget.cover_within_nights", s.Budget.CoverWithinNights),
		rangeNodes.Check("concurrency", s.Concurrency),
		rangeTimeout.Check("test_timeout", s.TestTimeout),
		rangeGrace.CheckOrZero("connect_grace", s.ConnectGrace),
	}
	if s.Repeat.Band >= s.Threshold {
		errs = append(errs, fmt.Errorf("repeat.band %v must be below threshold %v", s.Repeat.Band, s.Threshold))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSpec, err)
	}
	return nil
}

// connectGrace is the spec's grace, or the default.
func (s Spec) connectGrace() time.Duration {
	if s.ConnectGrace <= 0 {
		return kit.DefaultConnectGrace
	}
	return time.Duration(s.ConnectGrace)
}

// ParseSpec reads a sweep spec, YAML or JSON (JSON is YAML), with the
// strict decoder every spec uses: unknown keys and a second document are
// refused, and durations are written as durations ("10m"; a bare number
// is refused, never read as nanoseconds). The defaults are filled in for
// validation only: the spec returned is as written.
func ParseSpec(data []byte) (Spec, error) {
	var s Spec
	if err := config.DecodeStrict(data, &s); err != nil {
		if errors.Is(err, io.EOF) {
			return Spec{}, fmt.Errorf("%w: empty spec", ErrInvalidSpec)
		}
		return Spec{}, fmt.Errorf("%w: %w", ErrInvalidSpec, err)
	}
	if err := s.WithDefaults().Validate(); err != nil {
		return Spec{}, err
	}
	return s, nil
}

func (s Spec) maxRepeats() int {
	if s.Repeat.MaxRepeats < 0 {
		return 0
	}
	return s.Repeat.MaxRepeats
}
