package rollout

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/compat"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/selector"
)

// ErrInvalidSpec wraps every error about a rollout spec's content.
var ErrInvalidSpec = errors.New("invalid rollout spec")

// Defaults.
const (
	DefaultCanary        = 1
	DefaultMaxRegression = 0.30
	DefaultMetric        = "nccl.allreduce.busbw_gbps"
	DefaultNCCLCheck     = "nccl.allreduce"
	DefaultDraining      = 2 * time.Hour
	DefaultUpgrading     = 30 * time.Minute
	DefaultRebooting     = 20 * time.Minute
	DefaultValidating    = 30 * time.Minute
	DefaultUndraining    = 10 * time.Minute
)

// DefaultChecks returns the default post-upgrade inspection: what
// operators run after a driver upgrade (nvidia-smi, Xid, ECC, thermals,
// PCIe, NVLink, fabric, IB ports and counters, NCCL).
func DefaultChecks() []string {
	return []string{
		"gpu.inventory", "gpu.config", "gpu.ecc", "gpu.xid", "gpu.thermal", "gpu.pcie",
		"gpu.nvlink", "gpu.fabric", "ib.ports", "ib.counters", DefaultNCCLCheck,
	}
}

// Spec is a rollout as an operator writes it (rollout.yaml). docs/rollout.md
// describes every field.
type Spec struct {
	// Name is a label for people; the rollout's id is derived from it.
	Name string `yaml:"name" json:"name,omitempty"`
	// Selector picks the nodes (label-selector syntax, plus name=).
	Selector string `yaml:"selector" json:"selector"`
	Target   Target `yaml:"target" json:"target"`
	// Action is the agent action that performs the upgrade; the agent's
	// config names it and the versions it accepts. The coordinator sends
	// the name and the target versions as parameters, never a command.
	Action string `yaml:"action" json:"action"`
	// RollbackAction is the agent action that goes back to the node's
	// previous driver ("version" parameter); needed for Rollback.
	RollbackAction string `yaml:"rollback_action" json:"rollback_action,omitempty"`
	// Canary is the number of nodes in the first wave (default 1).
	Canary *int `yaml:"canary" json:"canary,omitempty"`
	// CanaryNodes picks the canary nodes by name instead of the first ones.
	CanaryNodes []string `yaml:"canary_nodes" json:"canary_nodes,omitempty"`
	// Waves after the canary: sizes or percentages of the nodes left after
	// the canary; the last entry repeats until every node is in a wave.
	Waves []Amount `yaml:"waves" json:"waves"`
	// MaxUnavailable bounds the nodes out of service at once, counted over
	// the scope (the whole fleet by default), whoever took them out.
	MaxUnavailable Amount `yaml:"max_unavailable" json:"max_unavailable"`
	// MaxUnavailableScope is "fleet" (default: every node the coordinator
	// knows) or "selection" (the selector's nodes).
	MaxUnavailableScope string `yaml:"max_unavailable_scope" json:"max_unavailable_scope,omitempty"`
	FailureBudget       Budget `yaml:"failure_budget" json:"failure_budget"`
	// Soak is the wait after a wave before the next starts.
	Soak Duration `yaml:"soak" json:"soak"`
	// Approval after the canary: "manual" (default) or "auto".
	Approval   string     `yaml:"approval" json:"approval,omitempty"`
	Validation Validation `yaml:"validation" json:"validation"`
	Deadlines  Deadlines  `yaml:"deadlines" json:"deadlines"`
	// ConnectGrace is how long a node whose agent is not connected when
	// its turn comes is waited for before it is skipped (default 2m, from
	// 5s to 24h); a skipped node counts against its wave's budget.
	ConnectGrace Duration `yaml:"connect_grace" json:"connect_grace"`
}

// Target is the versions the rollout moves nodes to.
type Target struct {
	Driver string `yaml:"driver" json:"driver"`
	// CUDA is the new driver's CUDA version (as nvidia-smi prints it), so
	// the matrix can judge it; empty leaves it unknown to the matrix.
	CUDA string `yaml:"cuda" json:"cuda,omitempty"`
	// FabricManager: "same" (moves with the driver) or a version.
	FabricManager string   `yaml:"fabric_manager" json:"fabric_manager,omitempty"`
	Firmware      Firmware `yaml:"firmware" json:"firmware,omitempty"`
}

// Firmware the upgrade action also installs.
type Firmware struct {
	VBIOS string `yaml:"vbios" json:"vbios,omitempty"`
	// HCA maps an HCA model (hca_type, "MT4129", or "*") to its firmware.
	HCA map[string]string `yaml:"hca" json:"hca,omitempty"`
}

// Budget is how many failed nodes a wave may have before the rollout halts.
type Budget struct {
	// Canary defaults to 0: one failed canary halts.
	Canary Amount `yaml:"canary" json:"canary"`
	// Wave applies to every later wave (default 0).
	Wave Amount `yaml:"wave" json:"wave"`
}

// Validation is the post-upgrade inspection.
type Validation struct {
	// Checks run on the node after the upgrade (default DefaultChecks).
	Checks []string `yaml:"checks" json:"checks"`
	// Require lists checks that must pass (or warn): a skip is
	// inconclusive. Default: gpu.inventory and the NCCL check when listed.
	Require []string `yaml:"require" json:"require,omitempty"`
	// NCCLCheck is the check whose metric is compared with the pre-upgrade
	// baseline (default nccl.allreduce); Metric its metric.
	NCCLCheck string `yaml:"nccl_check" json:"nccl_check,omitempty"`
	Metric    string `yaml:"metric" json:"metric,omitempty"`
	// MaxRegression is the largest allowed shortfall below the baseline,
	// a fraction or a percentage (default 30 %).
	MaxRegression Fraction `yaml:"max_regression" json:"max_regression"`
	// Baseline: "auto" (default: the stored baseline when the coordinator
	// has one for the node's current stack, else measured before the
	// upgrade), "stored" or "measured".
	Baseline string `yaml:"baseline" json:"baseline,omitempty"`
	// PreCheck runs the suite on the drained node before upgrading
	// (default true): a node already failing is left as it was found, not
	// upgraded, and a check that passed before and skips after is
	// inconclusive instead of "not applicable".
	PreCheck *bool `yaml:"pre_check" json:"pre_check,omitempty"`
}

// Deadlines bound each per-node state.
type Deadlines struct {
	// Draining covers taking the node out and waiting for its work to end.
	Draining Duration `yaml:"draining" json:"draining"`
	// Upgrading bounds the agent's upgrade action.
	Upgrading Duration `yaml:"upgrading" json:"upgrading"`
	// Rebooting bounds the wait for the agent to return with the new driver.
	Rebooting Duration `yaml:"rebooting" json:"rebooting"`
	// Validating bounds each inspection run (before and after).
	Validating Duration `yaml:"validating" json:"validating"`
	// Undraining bounds returning the node to service.
	Undraining Duration `yaml:"undraining" json:"undraining"`
}

// Amount is a node count ("8") or a percentage ("10%").
type Amount struct {
	N       int     // count, when !Percent
	Pct     float64 // 0..100, when Percent
	Percent bool
	set     bool
}

// IsSet reports whether the amount was given.
func (a Amount) IsSet() bool { return a.set }

// Count is an amount as a count.
func Count(n int) Amount { return Amount{N: n, set: true} }

// Percent is an amount as a percentage.
func Percent(p float64) Amount { return Amount{Pct: p, Percent: true, set: true} }

func (a Amount) String() string {
	if a.Percent {
		return strconv.FormatFloat(a.Pct, 'f', -1, 64) + "%"
	}
	return strconv.Itoa(a.N)
}

// Of resolves the amount against total; percentages round up, so a
// percentage of a non-empty set is never zero nodes unless it is 0 %.
func (a Amount) Of(total int) int {
	if !a.Percent {
		return a.N
	}
	return int(math.Ceil(a.Pct*float64(total)/100 - 1e-9))
}

// Floor resolves the amount against total, rounding a percentage down:
// for limits, where rounding up would allow more than was written.
func (a Amount) Floor(total int) int {
	if !a.Percent {
		return a.N
	}
	return int(math.Floor(a.Pct*float64(total)/100 + 1e-9))
}

func parseAmount(s string) (Amount, error) {
	s = strings.TrimSpace(s)
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || math.IsNaN(v) || v < 0 || v > 100 {
			return Amount{}, fmt.Errorf("%q: want a percentage from 0%% to 100%%", s)
		}
		return Percent(v), nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return Amount{}, fmt.Errorf("%q: want a node count or a percentage such as 10%%", s)
	}
	return Count(n), nil
}

// UnmarshalYAML reads 8 or "10%".
func (a *Amount) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a node count or a percentage", n.Line)
	}
	v, err := parseAmount(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*a = v
	return nil
}

// MarshalYAML writes the amount as written.
func (a Amount) MarshalYAML() (any, error) { return a.String(), nil }

// MarshalJSON writes 8 or "10%".
func (a Amount) MarshalJSON() ([]byte, error) {
	if !a.set {
		return []byte("null"), nil
	}
	if a.Percent {
		return json.Marshal(a.String())
	}
	return json.Marshal(a.N)
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (a *Amount) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*a = Amount{}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int
		if err := json.Unmarshal(b, &n); err != nil {
			return fmt.Errorf("amount: %w", err)
		}
		s = strconv.Itoa(n)
	}
	v, err := parseAmount(s)
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// Duration is a time.Duration written as "30m", "2h", "90s".
type Duration time.Duration

// D is the duration as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// UnmarshalYAML reads a Go duration.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a duration such as 30m", n.Line)
	}
	v, err := time.ParseDuration(strings.TrimSpace(n.Value))
	if err != nil || v < 0 {
		return fmt.Errorf("line %d: %q: want a duration such as 30m or 2h", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes "30m".
func (d Duration) MarshalYAML() (any, error) { return config.FormatDuration(time.Duration(d)), nil }

// MarshalJSON writes "30m".
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(config.FormatDuration(time.Duration(d)))
}

// UnmarshalJSON reads a Go duration.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// Fraction is a share written as 0.3 or "30%".
type Fraction float64

// UnmarshalYAML reads 0.3 or "30%".
func (f *Fraction) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a fraction such as 0.3 or 30%%", n.Line)
	}
	s := strings.TrimSpace(n.Value)
	div := 1.0
	if p, ok := strings.CutSuffix(s, "%"); ok {
		s, div = strings.TrimSpace(p), 100
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("line %d: %q: want a fraction such as 0.3 or 30%%", n.Line, n.Value)
	}
	*f = Fraction(v / div)
	return nil
}

// The approval modes.
const (
	ApprovalManual = "manual"
	ApprovalAuto   = "auto"
)

// Baseline sources.
const (
	BaselineAuto     = "auto"
	BaselineStored   = "stored"
	BaselineMeasured = "measured"
)

// Scopes for MaxUnavailable.
const (
	ScopeFleet     = "fleet"
	ScopeSelection = "selection"
)

// names of checks and actions: what agents accept as names.
var (
	checkName  = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$`)
	actionName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	versionRe  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+~-]{0,63}$`)
)

// LoadSpec reads and validates a spec file.
func LoadSpec(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read rollout spec: %w", err)
	}
	s, err := ParseSpec(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// ParseSpec reads one YAML document, rejects unknown keys, fills the
// defaults and validates.
func ParseSpec(data []byte) (*Spec, error) {
	var s Spec
	if err := config.DecodeStrict(data, &s); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty document", ErrInvalidSpec)
		}
		return nil, fmt.Errorf("%w: %s", ErrInvalidSpec, yamlMessage(err))
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// fieldNotFound matches yaml.v3's message for an unknown key.
var fieldNotFound = regexp.MustCompile(`field (\S+) not found in type \S+`)

// yamlMessage turns yaml.v3's type errors into one readable line:
// "line 7: unknown key \"wavez\"".
func yamlMessage(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err.Error()
	}
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		msgs[i] = fieldNotFound.ReplaceAllString(m, `unknown key "$1"`)
	}
	return strings.Join(msgs, "; ")
}

// Validate fills defaults and checks the spec; errors wrap ErrInvalidSpec
// and name the field.
func (s *Spec) Validate() error {
	bad := func(field, format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidSpec, field, fmt.Sprintf(format, a...))
	}
	s.Name = strings.TrimSpace(s.Name)
	if len(s.Name) > 64 || (s.Name != "" && !actionName.MatchString(s.Name)) {
		return bad("name", "%q: letters, digits, '.', '_' and '-', at most 64", s.Name)
	}
	if _, err := selector.Parse(s.Selector); err != nil {
		return bad("selector", "%v", err)
	}
	t := &s.Target
	switch {
	case t.Driver == "":
		return bad("target.driver", "missing (the driver version to roll out)")
	case !versionRe.MatchString(t.Driver):
		return bad("target.driver", "%q is not a version", t.Driver)
	case t.CUDA != "" && !versionRe.MatchString(t.CUDA):
		return bad("target.cuda", "%q is not a version", t.CUDA)
	case t.FabricManager != "" && t.FabricManager != "same" && !versionRe.MatchString(t.FabricManager):
		return bad("target.fabric_manager", `%q: want "same" or a version`, t.FabricManager)
	case t.Firmware.VBIOS != "" && !versionRe.MatchString(t.Firmware.VBIOS):
		return bad("target.firmware.vbios", "%q is not a version", t.Firmware.VBIOS)
	}
	for model, fw := range t.Firmware.HCA {
		if model == "" || !versionRe.MatchString(fw) {
			return bad("target.firmware.hca", "%q: %q: want an HCA model and a firmware version", model, fw)
		}
	}
	if s.Action == "" {
		return bad("action", "missing (the agent action that performs the upgrade)")
	}
	if !actionName.MatchString(s.Action) {
		return bad("action", "%q is not an action name", s.Action)
	}
	if s.RollbackAction != "" && !actionName.MatchString(s.RollbackAction) {
		return bad("rollback_action", "%q is not an action name", s.RollbackAction)
	}
	if s.Canary == nil {
		c := DefaultCanary
		if len(s.CanaryNodes) > 0 {
			c = len(s.CanaryNodes)
		}
		s.Canary = &c
	}
	if *s.Canary < 1 {
		return bad("canary", "%d: at least one node goes first", *s.Canary)
	}
	if len(s.CanaryNodes) > 0 && len(s.CanaryNodes) != *s.Canary {
		return bad("canary_nodes", "%d names for a canary of %d", len(s.CanaryNodes), *s.Canary)
	}
	seen := map[string]bool{}
	for _, n := range s.CanaryNodes {
		if seen[n] {
			return bad("canary_nodes", "%q named twice", n)
		}
		seen[n] = true
	}
	if len(s.Waves) == 0 {
		return bad("waves", "missing (sizes or percentages, e.g. [5%%, 25%%, 100%%])")
	}
	for i, w := range s.Waves {
		if (w.Percent && w.Pct <= 0) || (!w.Percent && w.N < 1) {
			return bad(fmt.Sprintf("waves[%d]", i), "%s: a wave holds at least one node", w)
		}
	}
	if !s.MaxUnavailable.IsSet() {
		return bad("max_unavailable", "missing (how many nodes may be out of service at once, e.g. 5%% or 8)")
	}
	if (s.MaxUnavailable.Percent && s.MaxUnavailable.Pct <= 0) || (!s.MaxUnavailable.Percent && s.MaxUnavailable.N < 1) {
		return bad("max_unavailable", "%s: must allow at least one node", s.MaxUnavailable)
	}
	switch s.MaxUnavailableScope {
	case "":
		s.MaxUnavailableScope = ScopeFleet
	case ScopeFleet, ScopeSelection:
	default:
		return bad("max_unavailable_scope", "%q: want fleet or selection", s.MaxUnavailableScope)
	}
	if !s.FailureBudget.Canary.IsSet() {
		s.FailureBudget.Canary = Count(0)
	}
	if !s.FailureBudget.Wave.IsSet() {
		s.FailureBudget.Wave = Count(0)
	}
	switch s.Approval {
	case "":
		s.Approval = ApprovalManual
	case ApprovalManual, ApprovalAuto:
	default:
		return bad("approval", "%q: want manual or auto", s.Approval)
	}
	if err := s.Validation.validate(bad); err != nil {
		return err
	}
	d := &s.Deadlines
	for _, f := range []struct {
		name string
		v    *Duration
		def  time.Duration
	}{
		{"draining", &d.Draining, DefaultDraining},
		{"upgrading", &d.Upgrading, DefaultUpgrading},
		{"rebooting", &d.Rebooting, DefaultRebooting},
		{"validating", &d.Validating, DefaultValidating},
		{"undraining", &d.Undraining, DefaultUndraining},
	} {
		if *f.v == 0 {
			*f.v = Duration(f.def)
		}
		if f.v.D() < time.Second {
			return bad("deadlines."+f.name, "%v: at least 1s", f.v.D())
		}
	}
	grace := s.ConnectGrace.D()
	if err := kit.CheckConnectGrace(&grace); err != nil {
		return bad("connect_grace", "%v", err)
	}
	s.ConnectGrace = Duration(grace)
	return nil
}

func (v *Validation) validate(bad func(field, format string, a ...any) error) error {
	if len(v.Checks) == 0 {
		v.Checks = DefaultChecks()
	}
	if v.NCCLCheck == "" {
		v.NCCLCheck = DefaultNCCLCheck
	}
	if v.Metric == "" {
		v.Metric = DefaultMetric
	}
	seen := map[string]bool{}
	for _, c := range v.Checks {
		if !checkName.MatchString(c) {
			return bad("validation.checks", "%q is not a check name", c)
		}
		if seen[c] {
			return bad("validation.checks", "%q listed twice", c)
		}
		seen[c] = true
	}
	if !checkName.MatchString(v.NCCLCheck) {
		return bad("validation.nccl_check", "%q is not a check name", v.NCCLCheck)
	}
	if !checkName.MatchString(v.Metric) {
		return bad("validation.metric", "%q is not a metric name", v.Metric)
	}
	if v.Require == nil {
		for _, c := range []string{"gpu.inventory", v.NCCLCheck} {
			if seen[c] {
				v.Require = append(v.Require, c)
			}
		}
	}
	for _, c := range v.Require {
		if !seen[c] {
			return bad("validation.require", "%q is not among validation.checks", c)
		}
	}
	if v.MaxRegression == 0 {
		v.MaxRegression = DefaultMaxRegression
	}
	if v.MaxRegression < 0 || v.MaxRegression >= 1 {
		return bad("validation.max_regression", "%v: want a share between 0 and 1 (30%% is 0.3)", float64(v.MaxRegression))
	}
	switch v.Baseline {
	case "":
		v.Baseline = BaselineAuto
	case BaselineAuto, BaselineStored, BaselineMeasured:
	default:
		return bad("validation.baseline", "%q: want auto, stored or measured", v.Baseline)
	}
	if v.PreCheck == nil {
		yes := true
		v.PreCheck = &yes
	}
	return nil
}

// connectGrace is the spec's grace; a rollout stored before the field
// existed gets the default.
func (s *Spec) connectGrace() time.Duration {
	if s.ConnectGrace <= 0 {
		return kit.DefaultConnectGrace
	}
	return s.ConnectGrace.D()
}

// compares reports whether validation compares the NCCL metric with a
// baseline.
func (v *Validation) compares() bool { return slices.Contains(v.Checks, v.NCCLCheck) }

// CompatTarget is the spec's target as the compatibility matrix takes it.
func (s *Spec) CompatTarget() compat.Target {
	return compat.Target{
		Driver:        s.Target.Driver,
		CUDA:          s.Target.CUDA,
		FabricManager: s.Target.FabricManager,
		VBIOS:         s.Target.Firmware.VBIOS,
		HCAFirmware:   s.Target.Firmware.HCA,
	}
}

// actionParams are the bounded parameters the upgrade action receives.
func (s *Spec) actionParams() map[string]string {
	p := map[string]string{"version": s.Target.Driver}
	if fm := s.Target.FabricManager; fm != "" && fm != "same" {
		p["fabric_manager"] = fm
	}
	if s.Target.Firmware.VBIOS != "" {
		p["vbios"] = s.Target.Firmware.VBIOS
	}
	return p
}
