package sweep

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/fleetcheck/fleetcheck/campaign"
	"github.com/fleetcheck/fleetcheck/config"
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
	Selector string `json:"selector"`
	// Threshold is the deviation (shortfall below baseline as a fraction of
	// it) above which a measurement is slow. Default 0.30.
	Threshold float64 `json:"threshold"`
	// Repeat says when a measurement is taken again before it is called.
	Repeat RepeatPolicy `json:"repeat"`
	// Budget bounds how much of the fleet one sweep takes.
	Budget Budget `json:"budget"`
	// IgnoreLeaves pairs nodes at random instead of across leaf switches.
	IgnoreLeaves bool `json:"ignore_leaves,omitempty"`
	// LeafLabel is the label that names a node's leaf switch. Default "leaf".
	LeafLabel string `json:"leaf_label,omitempty"`
	// Drain asks the Drainer to take gpu-side and network-side nodes out of
	// service once the sweep has called them.
	Drain bool `json:"drain,omitempty"`
	// Concurrency caps the tests running at once; 0 runs a whole wave at once.
	Concurrency int `json:"concurrency,omitempty"`
	// TestTimeout bounds one all_reduce run. Default 10m.
	TestTimeout config.Duration `json:"test_timeout,omitempty"`
	// Seed varies the pairing; 0 derives it from the sweep's id, so each
	// night pairs nodes differently and paths are covered over nights.
	Seed uint64 `json:"seed,omitempty"`
	// Note is free text kept with the sweep (who, why).
	Note string `json:"note,omitempty"`
	// ConnectGrace is how long the sweep waits, before its first round,
	// for selected nodes whose agent is not connected (default 2m, from 5s
	// to 24h); those still away are reported unreachable, never passed.
	ConnectGrace config.Duration `json:"connect_grace,omitempty"`
}

// RepeatPolicy decides repeats.
type RepeatPolicy struct {
	// MaxRepeats caps repeats of one measurement. 0 means the default (2);
	// negative means never repeat.
	MaxRepeats int `json:"max_repeats,omitempty"`
	// NoConfirm calls a node slow on one slow single-node run instead of
	// repeating it (no transient verdicts from round 1 then).
	NoConfirm bool `json:"no_confirm,omitempty"`
	// A deviation within the noise window of the threshold is measured
	// again. The window is BandSigmas robust standard deviations of the
	// baseline's samples (default 2), at least Band (a fraction; 0 takes
	// the baselines package's floor, 2 %).
	Band       float64 `json:"band,omitempty"`
	BandSigmas float64 `json:"band_sigmas,omitempty"`
}

// Budget bounds one sweep and rotates through the fleet across nights.
// With no limit set every selected node is tested.
type Budget struct {
	// MaxShare of the selected nodes tested in one sweep, in (0, 1].
	MaxShare float64 `json:"max_share,omitempty"`
	// MaxNodes tested in one sweep.
	MaxNodes int `json:"max_nodes,omitempty"`
	// MaxGPUHours per sweep, counting NodeTestTime per node on all its GPUs.
	MaxGPUHours float64 `json:"max_gpu_hours,omitempty"`
	// NodeTestTime is a node's estimated share of one sweep. Default 4m.
	NodeTestTime config.Duration `json:"node_test_time,omitempty"`
	// CoverWithinNights is the rotation target: every selected node tested
	// at least once within this many nights (a night = 24 h). Default 7.
	CoverWithinNights int `json:"cover_within_nights,omitempty"`
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

// Validate reports the first thing wrong with the spec (after defaults).
func (s Spec) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, a...))
	}
	switch {
	case !(s.Threshold > 0 && s.Threshold < 1):
		return bad("threshold %v not in (0, 1)", s.Threshold)
	case s.Repeat.Band < 0 || math.IsNaN(s.Repeat.Band) || s.Repeat.Band >= s.Threshold:
		return bad("noise band %v not in [0, threshold)", s.Repeat.Band)
	case !(s.Repeat.BandSigmas > 0):
		return bad("band sigmas %v must be positive", s.Repeat.BandSigmas)
	case s.Budget.MaxShare < 0 || s.Budget.MaxShare > 1 || math.IsNaN(s.Budget.MaxShare):
		return bad("budget share %v not in [0, 1]", s.Budget.MaxShare)
	case s.Budget.MaxNodes < 0:
		return bad("budget max nodes %d < 0", s.Budget.MaxNodes)
	case s.Budget.MaxGPUHours < 0 || math.IsNaN(s.Budget.MaxGPUHours):
		return bad("budget GPU-hours %v < 0", s.Budget.MaxGPUHours)
	case s.Budget.NodeTestTime < 0:
		return bad("node test time %v < 0", s.Budget.NodeTestTime)
	case s.Budget.CoverWithinNights < 0:
		return bad("cover within %d nights", s.Budget.CoverWithinNights)
	case s.Concurrency < 0:
		return bad("concurrency %d < 0", s.Concurrency)
	case s.TestTimeout < 0:
		return bad("test timeout %v < 0", s.TestTimeout)
	}
	if s.ConnectGrace != 0 {
		g := time.Duration(s.ConnectGrace)
		if err := campaign.CheckConnectGrace(&g); err != nil {
			return bad("connect_grace %v", err)
		}
	}
	return nil
}

// connectGrace is the spec's grace, or the default.
func (s Spec) connectGrace() time.Duration {
	if s.ConnectGrace <= 0 {
		return campaign.DefaultConnectGrace
	}
	return time.Duration(s.ConnectGrace)
}

func (s Spec) maxRepeats() int {
	if s.Repeat.MaxRepeats < 0 {
		return 0
	}
	return s.Repeat.MaxRepeats
}
