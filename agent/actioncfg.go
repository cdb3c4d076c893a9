package agent

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/fleetcheck/fleetcheck/internal/config"
)

// ActionConfig is one entry of the config's `actions:` section: a named
// command the coordinator may ask for. The coordinator sends the name and
// parameter values only; each value must match its pattern, and then
// replaces a placeholder argument "{name}" whole. No shell, ever.
type ActionConfig struct {
	// Command is the argv: the program (never a placeholder) and its
	// arguments, each a literal or exactly one "{param}" placeholder.
	Command []string `yaml:"command"`
	// Params maps each parameter the action takes to the pattern its value
	// must match in full (anchoring is implied). A parameter may be
	// declared without appearing in the command (a revert told what it
	// reverts); every placeholder must be declared.
	Params map[string]Pattern `yaml:"params"`
	// Timeout bounds one run (default 5m); a request may ask for less.
	Timeout config.Duration `yaml:"timeout"`
	// Disruptive actions (an upgrade, a stress load) run only in the
	// activities disruptive_allowed_when lists, and never beside another
	// disruptive check, action or multi-node run.
	Disruptive bool `yaml:"disruptive"`
	// Revert names the action that undoes this one (a drill fault's
	// revert). The agent then arms a timer before running it, runs the
	// revert by itself when the timer fires, and keeps the timer in its
	// state dir across restarts. A request must carry revert_after, or
	// RevertAfterDefault must be set.
	Revert string `yaml:"revert"`
	// RevertAfterDefault applies when a request names no revert_after.
	RevertAfterDefault config.Duration `yaml:"revert_after_default"`
	// RevertAfterMax caps a requested revert_after (default 24h): a fault
	// is never left in place longer than this by the agent's timer.
	RevertAfterMax config.Duration `yaml:"revert_after_max"`
}

// MultiNodeConfig is the config's `multi_node:` section: how this node
// launches an all_reduce_perf across nodes, and with whom it may run one.
type MultiNodeConfig struct {
	// LauncherCommand is the argv of the launcher (mpirun, srun) with the
	// placeholders {hosts} (the participants, comma-separated, launcher
	// first), {np} (participants × procs_per_node) and {nodes}, each a
	// whole argument.
	LauncherCommand []string `yaml:"launcher_command"`
	// AllowedPeers is the pattern every other participant's name must
	// match in full (anchoring is implied).
	AllowedPeers Pattern `yaml:"allowed_peers"`
	// ProcsPerNode is the rank processes per node {np} counts (default 1:
	// one process driving every GPU with -g).
	ProcsPerNode int `yaml:"procs_per_node"`
	// SlotsPerNode, when set, writes {hosts} as "a:N,b:N" (mpirun -H slots).
	SlotsPerNode int `yaml:"slots_per_node"`
	// MaxNodes bounds the participants (default 16).
	MaxNodes int `yaml:"max_nodes"`
	// Timeout bounds a run (default 15m); a request may ask for less.
	Timeout config.Duration `yaml:"timeout"`
	// MinBusBWGBps and BaselineGBps judge the 2-node bandwidth as
	// checks.nccl does the single-node one (0: not judged here; campaigns
	// compare with the link and SKU baselines).
	MinBusBWGBps float64 `yaml:"min_busbw_gbps"`
	BaselineGBps float64 `yaml:"baseline_gbps"`
}

// Pattern is a regular expression from the config, matched against a
// whole value.
type Pattern struct {
	src string
	re  *regexp.Regexp
}

// ParsePattern compiles s anchored at both ends.
func ParsePattern(s string) (Pattern, error) {
	if s == "" {
		return Pattern{}, fmt.Errorf("empty pattern")
	}
	re, err := regexp.Compile(`^(?:` + s + `)$`)
	if err != nil {
		return Pattern{}, fmt.Errorf("pattern %q: %w", s, err)
	}
	return Pattern{src: s, re: re}, nil
}

// UnmarshalYAML compiles the pattern.
func (p *Pattern) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := ParsePattern(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*p = v
	return nil
}

// MarshalYAML writes the pattern as written.
func (p Pattern) MarshalYAML() (any, error) { return p.src, nil }

// String is the pattern as written.
func (p Pattern) String() string { return p.src }

// Match reports whether the whole of v matches; the zero Pattern matches
// nothing.
func (p Pattern) Match(v string) bool { return p.re != nil && p.re.MatchString(v) }

// Limits on actions and their parameters.
const (
	DefaultActionTimeout     = 5 * time.Minute
	DefaultRevertAfterMax    = 24 * time.Hour
	DefaultMultiNodeTimeout  = 15 * time.Minute
	DefaultMultiNodeMaxNodes = 16
	maxParams                = 16
	maxParamValue            = 256
	maxActions               = 64
)

// The action-config patterns are compiled on first use: their counted
// repetitions cost tens of KB each at every start of the node binary,
// and only an agent with actions configured ever matches them.
var (
	actionNameRE = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$`)
	})
	paramNameRE = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)
	})
	placeholder = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^\{([a-z][a-z0-9_]{0,31})\}$`)
	})
)

// paramPlaceholder returns the parameter an argument stands for.
func paramPlaceholder(arg string) (string, bool) {
	m := placeholder().FindStringSubmatch(arg)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// validateArgv checks a configured command: a literal program, then
// literals or whole placeholders that allowed names; it returns the
// placeholders used.
func validateArgv(argv []string, allowed func(string) bool) ([]string, error) {
	if len(argv) == 0 {
		return nil, fmt.Errorf("command is empty")
	}
	var used []string
	for i, a := range argv {
		name, ok := paramPlaceholder(a)
		switch {
		case ok && i == 0:
			return nil, fmt.Errorf("command[0] %q: the program must be a literal", a)
		case ok && !allowed(name):
			return nil, fmt.Errorf("command[%d] %q: no such parameter", i, a)
		case ok:
			used = append(used, name)
		case strings.ContainsAny(a, "{}"):
			return nil, fmt.Errorf("command[%d] %q: a placeholder must be a whole argument, e.g. \"{version}\"", i, a)
		case a == "" && i == 0:
			return nil, fmt.Errorf("command[0]: empty program")
		}
	}
	return used, nil
}

// validateActions checks the actions section and the multi_node section.
func (c *Config) validateActions() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrInvalid}, a...)...) }
	if len(c.Actions) > maxActions {
		return bad("actions: at most %d", maxActions)
	}
	for _, name := range slices.Sorted(maps.Keys(c.Actions)) {
		a := c.Actions[name]
		if !actionNameRE().MatchString(name) {
			return bad("actions: name %q: lowercase letters, digits, '.', '_', '-' (at most 64)", name)
		}
		if len(a.Params) > maxParams {
			return bad("actions.%s.params: at most %d", name, maxParams)
		}
		for p, pat := range a.Params {
			if !paramNameRE().MatchString(p) {
				return bad("actions.%s.params: name %q: lowercase letters, digits and '_' (at most 32)", name, p)
			}
			if pat.re == nil {
				return bad("actions.%s.params.%s: a pattern is required", name, p)
			}
		}
		if _, err := validateArgv(a.Command, func(p string) bool { _, ok := a.Params[p]; return ok }); err != nil {
			return bad("actions.%s: %v", name, err)
		}
		if a.Revert == "" {
			if a.RevertAfterDefault != 0 || a.RevertAfterMax != 0 {
				return bad("actions.%s: revert_after_default and revert_after_max need revert", name)
			}
			continue
		}
		r, ok := c.Actions[a.Revert]
		switch {
		case !ok:
			return bad("actions.%s.revert: no action %q", name, a.Revert)
		case a.Revert == name:
			return bad("actions.%s.revert: an action cannot revert itself", name)
		case r.Revert != "":
			return bad("actions.%s.revert: %q has a revert of its own; a revert must be final", name, a.Revert)
		}
		if a.RevertAfterMax != 0 && a.RevertAfterDefault > a.RevertAfterMax {
			return bad("actions.%s: revert_after_default %s exceeds revert_after_max %s", name,
				time.Duration(a.RevertAfterDefault), time.Duration(a.RevertAfterMax))
		}
	}
	if m := c.MultiNode; m != nil {
		_, err := validateArgv(m.LauncherCommand, func(p string) bool { return p == "hosts" || p == "np" || p == "nodes" })
		if err != nil {
			return bad("multi_node.launcher_command: %v (placeholders: {hosts}, {np}, {nodes})", err)
		}
		if m.AllowedPeers.re == nil {
			return bad("multi_node.allowed_peers: a pattern for the peers' names is required")
		}
	}
	return nil
}

// actionNames lists the configured actions, sorted.
func (c *Config) actionNames() []string { return slices.Sorted(maps.Keys(c.Actions)) }

// timeout is the action's own bound.
func (a ActionConfig) timeout() time.Duration { return a.Timeout.D(DefaultActionTimeout) }

// revertMax is the longest revert timer the action allows.
func (a ActionConfig) revertMax() time.Duration { return a.RevertAfterMax.D(DefaultRevertAfterMax) }

// safeValue is the character set every parameter value keeps to, whatever
// its pattern allows: no shell or glob metacharacters, no whitespace or
// control characters, no leading '-' that a program would read as an
// option. Nothing runs through a shell; this is the second fence.
var safeValue = regexp.MustCompile(`^[A-Za-z0-9._:/+=,@%][A-Za-z0-9._:/+=,@%-]*$`)

// checkParams validates a request's parameters against the action's:
// every name declared, every value safe and matching its pattern, every
// placeholder of the command given.
func (a ActionConfig) checkParams(params map[string]string) error {
	if len(params) > maxParams {
		return fmt.Errorf("%d parameters, at most %d", len(params), maxParams)
	}
	for _, k := range slices.Sorted(maps.Keys(params)) {
		v := params[k]
		pat, ok := a.Params[k]
		switch {
		case !ok:
			return fmt.Errorf("parameter %q is not one this action takes (%s)", clip(k), strings.Join(slices.Sorted(maps.Keys(a.Params)), ", "))
		case len(v) > maxParamValue:
			return fmt.Errorf("parameter %s: value longer than %d bytes", k, maxParamValue)
		case !safeValue.MatchString(v):
			return fmt.Errorf("parameter %s: value %q holds characters no parameter may hold", k, clip(v))
		case !pat.Match(v):
			return fmt.Errorf("parameter %s: value %q does not match %s", k, clip(v), pat.src)
		}
	}
	for _, arg := range a.Command {
		if p, ok := paramPlaceholder(arg); ok {
			if _, given := params[p]; !given {
				return fmt.Errorf("parameter %s is required", p)
			}
		}
	}
	return nil
}

// argv substitutes validated parameters into the command: a placeholder
// argument becomes the value, whole, as one argument.
func (a ActionConfig) argv(params map[string]string) []string {
	out := make([]string, len(a.Command))
	for i, arg := range a.Command {
		if p, ok := paramPlaceholder(arg); ok {
			out[i] = params[p]
			continue
		}
		out[i] = arg
	}
	return out
}

// only keeps the parameters the action declares (a revert is given the
// parameters of what it reverts that it takes).
func (a ActionConfig) only(params map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range params {
		if _, ok := a.Params[k]; ok {
			out[k] = v
		}
	}
	return out
}
