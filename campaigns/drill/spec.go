// Package drill runs fault drills: a failure is injected on purpose on
// opted-in nodes through an agent action, the engine watches which check
// detects it and when, whether the node is taken out of service as
// expected, reverts it and waits until the node is healthy again. Drills
// are durable state machines in SQLite (drill_ tables), bounded by a blast
// radius, an opt-in label, the drain circuit breaker, the fleet's health
// and a deadline. docs/drill.md is the operator's page.
package drill

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
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/selector"
)

// ErrInvalidSpec wraps every validation error of a drill spec.
var ErrInvalidSpec = errors.New("invalid drill spec")

// Fault kinds with built-in defaults. Each is an action in the agent's
// config with a revert action beside it (docs/drill.md says what each
// runs); a spec may name any other action when it says what detects it
// and how to revert it.
const (
	FaultXid          = "xid-inject"    // an NVRM Xid line written to /dev/kmsg
	FaultIBPortDown   = "ib-port-down"  // ip link set down / ibportstate disable
	FaultGPUReset     = "gpu-reset"     // nvidia-smi -r
	FaultKillWorkload = "kill-workload" // kill -9 of the workload's processes
	FaultGPUSlowdown  = "gpu-slowdown"  // a background GPU load
)

// Fault describes a built-in fault kind.
type Fault struct {
	Kind   string
	Revert string
	// Check is the check expected to detect it.
	Check string
	// Params are the defaults the spec's params override.
	Params map[string]string
}

// Catalog returns the built-in fault kinds.
func Catalog() map[string]Fault {
	return map[string]Fault{
		FaultXid:          {Kind: FaultXid, Revert: FaultXid + "-revert", Check: "gpu.xid", Params: map[string]string{"xid": "79", "gpu": "0"}},
		FaultIBPortDown:   {Kind: FaultIBPortDown, Revert: FaultIBPortDown + "-revert", Check: "ib.ports", Params: map[string]string{"hca": "mlx5_0", "port": "1"}},
		FaultGPUReset:     {Kind: FaultGPUReset, Revert: FaultGPUReset + "-revert", Check: "gpu.inventory", Params: map[string]string{"gpu": "0"}},
		FaultKillWorkload: {Kind: FaultKillWorkload, Revert: FaultKillWorkload + "-revert", Check: "gpu.processes", Params: map[string]string{}},
		FaultGPUSlowdown:  {Kind: FaultGPUSlowdown, Revert: FaultGPUSlowdown + "-revert", Check: "nccl.allreduce", Params: map[string]string{"load": "50"}},
	}
}

// Expect is what the drill expects to happen.
type Expect struct {
	// Check is the check expected to detect the fault.
	Check string `yaml:"check" json:"check"`
	// Code, when set, must prefix the code of one of that check's
	// findings (XID_79, IB_PORT_DOWN): a failure for another reason is
	// not this fault's detection.
	Code string `yaml:"code,omitempty" json:"code,omitempty"`
	// OutOfService: the node is expected to be taken out of service (by
	// the coordinator's drain policy) once the fault is detected.
	OutOfService bool `yaml:"out_of_service" json:"out_of_service"`
	// OutOfServiceWithin bounds the wait for that after detection
	// (default 5m).
	OutOfServiceWithin config.Duration `yaml:"out_of_service_within,omitempty" json:"out_of_service_within,omitempty"`
}

// BlastRadius bounds how many nodes one drill touches.
type BlastRadius struct {
	// MaxNodes is the most targets (default 1).
	MaxNodes int `yaml:"max_nodes" json:"max_nodes"`
	// MaxShare is the most targets as a share of the fleet (0 = no share
	// limit). The stricter of the two applies; a share that rounds down
	// to zero nodes refuses the drill.
	MaxShare float64 `yaml:"max_share,omitempty" json:"max_share,omitempty"`
}

// FleetHealth is how degraded the fleet may already be for a drill to
// start (and to go on: a non-target node degrading during a drill aborts
// it).
type FleetHealth struct {
	// MaxDegradedShare of the fleet may be failed, degraded or unreachable
	// (default 0.05).
	MaxDegradedShare float64 `yaml:"max_degraded_share" json:"max_degraded_share"`
	// MaxDegradedNodes, when > 0, also bounds their count.
	MaxDegradedNodes int `yaml:"max_degraded_nodes,omitempty" json:"max_degraded_nodes,omitempty"`
}

// Spec is a drill as an operator writes it (drill.yaml).
type Spec struct {
	Name  string `yaml:"name,omitempty" json:"name,omitempty"`
	Fault string `yaml:"fault" json:"fault"`
	// Revert is the agent action that undoes the fault (default: the
	// catalog's, "<fault>-revert").
	Revert string            `yaml:"revert,omitempty" json:"revert,omitempty"`
	Params map[string]string `yaml:"params,omitempty" json:"params,omitempty"`
	Expect Expect            `yaml:"expect" json:"expect"`
	// Targets is a node selector.
	Targets     string      `yaml:"targets" json:"targets"`
	BlastRadius BlastRadius `yaml:"blast_radius" json:"blast_radius"`
	// OptInLabel is "key=value" every target must carry.
	OptInLabel string `yaml:"opt_in_label,omitempty" json:"opt_in_label,omitempty"`
	// Deadline bounds the drill from injection to recovery (default 15m).
	Deadline config.Duration `yaml:"deadline,omitempty" json:"deadline,omitempty"`
	// PollInterval is how often the watched checks run (default 30s,
	// half the agent's default quick-check interval).
	PollInterval config.Duration `yaml:"poll_interval,omitempty" json:"poll_interval,omitempty"`
	// Watch lists the checks polled for detection and recovery (default:
	// every passive check and the expected one).
	Watch []string `yaml:"watch,omitempty" json:"watch,omitempty"`
	// RevertAfter is the agent's own timer: it reverts by itself this long
	// after injecting (default deadline + 5m).
	RevertAfter config.Duration `yaml:"revert_after,omitempty" json:"revert_after,omitempty"`
	// RevertOnDisconnect: an agent that lost the coordinator this long
	// during a drill reverts at once (default 2m).
	RevertOnDisconnect config.Duration `yaml:"revert_on_disconnect,omitempty" json:"revert_on_disconnect,omitempty"`
	// RecoverGrace is how long an aborted drill waits for the node to be
	// healthy after its revert (default 10m).
	RecoverGrace config.Duration `yaml:"recover_grace,omitempty" json:"recover_grace,omitempty"`
	FleetHealth  FleetHealth     `yaml:"fleet_health" json:"fleet_health"`
	Who          string          `yaml:"who,omitempty" json:"who,omitempty"`
	// ConnectGrace is how long an agent not connected at a target's turn,
	// or a non-target's agent that went away, is waited for before it
	// counts (default 2m, from 5s to 24h): after a coordinator restart
	// every agent reconnects with backoff.
	ConnectGrace config.Duration `yaml:"connect_grace,omitempty" json:"connect_grace,omitempty"`
}

// connectGrace is the spec's grace; a drill stored before the field
// existed gets the default.
func (s *Spec) connectGrace() time.Duration {
	if s.ConnectGrace <= 0 {
		return kit.DefaultConnectGrace
	}
	return time.Duration(s.ConnectGrace)
}

// Defaults.
const (
	DefaultOptIn              = "fleetcheck.io/drill=allowed"
	DefaultDeadline           = 15 * time.Minute
	DefaultPollInterval       = 30 * time.Second
	DefaultOutOfServiceWithin = 5 * time.Minute
	DefaultRevertMargin       = 5 * time.Minute
	DefaultRevertOnDisconnect = 2 * time.Minute
	DefaultRecoverGrace       = 10 * time.Minute
	DefaultMaxDegradedShare   = 0.05
)

var (
	nameRE  = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)
	paramRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)
	valueRE = regexp.MustCompile(`^[A-Za-z0-9._:/+-]{0,64}$`)
	checkRE = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$`)
	codeRE  = regexp.MustCompile(`^[A-Z0-9_]{1,64}$`)
)

// Params the engine adds to the fault and revert actions; a spec may not
// set them.
const (
	ParamDrillID            = "drill_id"
	ParamRevertAfter        = "revert_after"
	ParamRevertOnDisconnect = "revert_on_disconnect"
)

// ParseSpec reads a YAML spec, fills the defaults and validates it.
// Unknown keys are errors.
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
	if !nameRE.MatchString(s.Fault) {
		return bad("fault %q: an action name from the agent's config (e.g. %s)", s.Fault, strings.Join(FaultKinds(), ", "))
	}
	cat, known := Catalog()[s.Fault]
	if s.Revert == "" {
		if !known {
			return bad("revert: required for fault %q (not a built-in kind)", s.Fault)
		}
		s.Revert = cat.Revert
	}
	if !nameRE.MatchString(s.Revert) || s.Revert == s.Fault {
		return bad("revert %q: an action name other than the fault's", s.Revert)
	}
	params := map[string]string{}
	if known {
		maps.Copy(params, cat.Params)
	}
	maps.Copy(params, s.Params)
	s.Params = params
	if len(s.Params) > 16 {
		return bad("params: at most 16")
	}
	for k, v := range s.Params {
		if !paramRE.MatchString(k) {
			return bad("params: name %q: lowercase, at most 32", k)
		}
		if k == ParamDrillID || k == ParamRevertAfter || k == ParamRevertOnDisconnect {
			return bad("params: %s is set by the engine", k)
		}
		if !valueRE.MatchString(v) {
			return bad("params[%s] %q: a bounded word (letters, digits, . _ : / + -; at most 64)", k, v)
		}
	}
	if s.Expect.Check == "" {
		if !known {
			return bad("expect.check: required for fault %q (not a built-in kind)", s.Fault)
		}
		s.Expect.Check = cat.Check
	}
	if !checkRE.MatchString(s.Expect.Check) {
		return bad("expect.check %q: a check name such as gpu.xid", s.Expect.Check)
	}
	if s.Expect.Code != "" && !codeRE.MatchString(s.Expect.Code) {
		return bad("expect.code %q: a finding code such as XID_79", s.Expect.Code)
	}
	if s.Expect.OutOfServiceWithin == 0 {
		s.Expect.OutOfServiceWithin = config.Duration(DefaultOutOfServiceWithin)
	}
	if _, err := selector.Parse(s.Targets); err != nil {
		return bad("targets: %w", err)
	}
	if strings.TrimSpace(s.Targets) == "" {
		return bad("targets: a selector is required (a drill never targets the whole fleet by default)")
	}
	if s.BlastRadius.MaxNodes == 0 {
		s.BlastRadius.MaxNodes = 1
	}
	if s.BlastRadius.MaxNodes < 1 || s.BlastRadius.MaxNodes > 1000 {
		return bad("blast_radius.max_nodes %d: between 1 and 1000", s.BlastRadius.MaxNodes)
	}
	if !(s.BlastRadius.MaxShare >= 0 && s.BlastRadius.MaxShare <= 1) {
		return bad("blast_radius.max_share %v: between 0 and 1", s.BlastRadius.MaxShare)
	}
	if s.OptInLabel == "" {
		s.OptInLabel = DefaultOptIn
	}
	if k, v, ok := strings.Cut(s.OptInLabel, "="); !ok || k == "" || v == "" {
		return bad("opt_in_label %q: key=value", s.OptInLabel)
	} else if _, err := selector.Parse(k + "=" + v); err != nil {
		return bad("opt_in_label: %w", err)
	}
	if s.Deadline == 0 {
		s.Deadline = config.Duration(DefaultDeadline)
	}
	if s.PollInterval == 0 {
		s.PollInterval = config.Duration(DefaultPollInterval)
	}
	if time.Duration(s.PollInterval) < time.Second {
		return bad("poll_interval: at least 1s")
	}
	if time.Duration(s.Deadline) < 2*time.Duration(s.PollInterval) {
		return bad("deadline %s: at least two poll intervals (%s)", time.Duration(s.Deadline), 2*time.Duration(s.PollInterval))
	}
	if time.Duration(s.Deadline) > 24*time.Hour {
		return bad("deadline: at most 24h")
	}
	if s.RevertAfter == 0 {
		s.RevertAfter = config.Duration(time.Duration(s.Deadline) + DefaultRevertMargin)
	}
	if time.Duration(s.RevertAfter) <= time.Duration(s.Deadline) {
		// The agent's timer is the backstop: it must not fire while the
		// coordinator is still within the deadline it enforces itself.
		return bad("revert_after %s: must be longer than the deadline %s", time.Duration(s.RevertAfter), time.Duration(s.Deadline))
	}
	if s.RevertOnDisconnect == 0 {
		s.RevertOnDisconnect = config.Duration(DefaultRevertOnDisconnect)
	}
	if s.RecoverGrace == 0 {
		s.RecoverGrace = config.Duration(DefaultRecoverGrace)
	}
	grace := time.Duration(s.ConnectGrace)
	if err := kit.CheckConnectGrace(&grace); err != nil {
		return bad("connect_grace %w", err)
	}
	s.ConnectGrace = config.Duration(grace)
	if len(s.Watch) == 0 {
		s.Watch = DefaultWatch(s.Expect.Check)
	}
	if !slices.Contains(s.Watch, s.Expect.Check) {
		s.Watch = append(s.Watch, s.Expect.Check)
	}
	for _, c := range s.Watch {
		if !checkRE.MatchString(c) {
			return bad("watch: %q is not a check name", c)
		}
	}
	if s.FleetHealth.MaxDegradedShare == 0 {
		s.FleetHealth.MaxDegradedShare = DefaultMaxDegradedShare
	}
	if !(s.FleetHealth.MaxDegradedShare > 0 && s.FleetHealth.MaxDegradedShare <= 1) || math.IsNaN(s.FleetHealth.MaxDegradedShare) {
		return bad("fleet_health.max_degraded_share %v: between 0 and 1", s.FleetHealth.MaxDegradedShare)
	}
	if s.FleetHealth.MaxDegradedNodes < 0 {
		return bad("fleet_health.max_degraded_nodes: not negative")
	}
	if len(s.Who) > 256 {
		return bad("who: at most 256 bytes")
	}
	return nil
}

// FaultKinds lists the built-in kinds.
func FaultKinds() []string {
	out := slices.Collect(maps.Keys(Catalog()))
	slices.Sort(out)
	return out
}

// DefaultWatch is every passive check (what the agent's quick pass runs)
// plus the expected one.
func DefaultWatch(expected string) []string {
	var out []string
	for _, c := range registry.All() {
		if !c.Disruptive() || c.Name() == expected {
			out = append(out, c.Name())
		}
	}
	if !slices.Contains(out, expected) {
		out = append(out, expected)
	}
	return out
}

func (s *Spec) clone() *Spec {
	c := *s
	c.Params = maps.Clone(s.Params)
	c.Watch = slices.Clone(s.Watch)
	return &c
}

// optIn splits the opt-in label.
func (s *Spec) optIn() (string, string) {
	k, v, _ := strings.Cut(s.OptInLabel, "=")
	return k, v
}
