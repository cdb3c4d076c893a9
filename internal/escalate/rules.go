// Package escalate holds the escalation and correlation rules the
// coordinator applies over the fleet's event stream (Xids, correctable ECC
// errors, IB link flaps) before anything is remediated:
//
//   - N occurrences of a non-fatal event on one GPU or port within a
//     window escalate to a remediation (Xid 13 three times in an hour on
//     one GPU; a correctable ECC rate);
//   - a port whose link flaps N times within a window is flagged, and stays
//     flagged until it has been stable for a period (a sticky window), so a
//     port that flaps every few minutes is not cleared between flaps;
//   - application Xids on many nodes at the same moment are one job's
//     crash: ONE job event, and no node is drained or counted for it.
//
// The package is pure: time comes in with each event and with Flush, so
// the coordinator, the simulator's virtual clock and tests drive it alike.
package escalate

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/xid"
)

// Kind is what an event is.
type Kind string

// Event kinds.
const (
	KindXid Kind = "xid"
	// KindECCCorrectable carries a GPU's correctable ECC counter (Total);
	// the rules take its rise.
	KindECCCorrectable Kind = "ecc_correctable"
	// KindLinkFlap is a port's link going down (Count times).
	KindLinkFlap Kind = "link_flap"
)

// Event is one observation on one component of one node.
type Event struct {
	At        time.Time `json:"at"`
	Node      string    `json:"node"`
	Component string    `json:"component"` // GPU3, mlx5_0/1
	Kind      Kind      `json:"kind"`
	Xid       int       `json:"xid,omitempty"`
	// Count is how many occurrences the event stands for (0 counts as 1).
	Count int `json:"count,omitempty"`
	// Total is a lifetime counter (KindECCCorrectable).
	Total float64 `json:"total,omitempty"`
	// Job is the scheduler's job on the node, when known.
	Job string `json:"job,omitempty"`
}

func (e Event) count() int { return max(e.Count, 1) }

// Remediation steps the rules may name (campaigns/remediation's ladder).
const (
	StepResetGPU    = "reset_gpu"
	StepResetIBPort = "reset_ib_port"
	StepReboot      = "reboot"
	StepReplace     = "replace"
	StepReseat      = "reseat"
)

// Steps are the steps a rule may name.
var Steps = []string{StepResetGPU, StepResetIBPort, StepReboot, StepReplace, StepReseat}

// XidRule escalates Count occurrences of one Xid on one GPU within Window.
type XidRule struct {
	Code   int             `yaml:"code" json:"code"`
	Count  int             `yaml:"count" json:"count"`
	Window config.Duration `yaml:"window" json:"window"`
	Action string          `yaml:"action" json:"action"`
}

// ECCRule escalates a GPU whose correctable ECC errors rise by Count or
// more within Window.
type ECCRule struct {
	Count  int             `yaml:"count" json:"count"`
	Window config.Duration `yaml:"window" json:"window"`
	Action string          `yaml:"action" json:"action"`
}

// LinkRule flags a port that goes down Flaps times within Window; it stays
// flagged until no flap was seen for Stable.
type LinkRule struct {
	Flaps  int             `yaml:"flaps" json:"flaps"`
	Window config.Duration `yaml:"window" json:"window"`
	Stable config.Duration `yaml:"stable" json:"stable"`
	Action string          `yaml:"action" json:"action"`
}

// CorrelateRule: application Xids on MinNodes or more nodes within Window
// of the first are one job event.
type CorrelateRule struct {
	Window   config.Duration `yaml:"window" json:"window"`
	MinNodes int             `yaml:"min_nodes" json:"min_nodes"`
}

// Config is the rules section of the coordinator config
// (remediation.rules, docs/remediation.md). Zero values take the defaults.
type Config struct {
	Xid       []XidRule     `yaml:"xid" json:"xid"`
	ECC       ECCRule       `yaml:"ecc_correctable" json:"ecc_correctable"`
	Link      LinkRule      `yaml:"link_flaps" json:"link_flaps"`
	Correlate CorrelateRule `yaml:"correlate" json:"correlate"`
}

// Ranges of the rules' numbers (docs/coordinator-config.md).
var (
	RangeCount       = config.R(1, 1000)
	RangeWindow      = config.R(time.Minute, 30*24*time.Hour)
	RangeECCCount    = config.R(1, 1_000_000_000)
	RangeStable      = config.R(time.Minute, 7*24*time.Hour)
	RangeCorrWindow  = config.R(time.Second, time.Hour)
	RangeCorrNodes   = config.R(2, 100_000)
	RangeXidCode     = config.R(1, 1000)
	DefaultXidRules  = []XidRule{{Code: 13, Count: 3, Window: config.Duration(time.Hour), Action: StepResetGPU}, {Code: 31, Count: 3, Window: config.Duration(time.Hour), Action: StepResetGPU}}
	DefaultECC       = ECCRule{Count: 1000, Window: config.Duration(24 * time.Hour), Action: StepResetGPU}
	DefaultLink      = LinkRule{Flaps: 3, Window: config.Duration(time.Hour), Stable: config.Duration(2 * time.Hour), Action: StepResetIBPort}
	DefaultCorrelate = CorrelateRule{Window: config.Duration(2 * time.Minute), MinNodes: 4}
)

// WithDefaults fills zero values.
func (c Config) WithDefaults() Config {
	if c.Xid == nil {
		c.Xid = slices.Clone(DefaultXidRules)
	}
	fill := func(d *config.Duration, v config.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	filli := func(d *int, v int) {
		if *d == 0 {
			*d = v
		}
	}
	fills := func(d *string, v string) {
		if *d == "" {
			*d = v
		}
	}
	for i := range c.Xid {
		filli(&c.Xid[i].Count, 1)
		fill(&c.Xid[i].Window, config.Duration(time.Hour))
		fills(&c.Xid[i].Action, StepResetGPU)
	}
	filli(&c.ECC.Count, DefaultECC.Count)
	fill(&c.ECC.Window, DefaultECC.Window)
	fills(&c.ECC.Action, DefaultECC.Action)
	filli(&c.Link.Flaps, DefaultLink.Flaps)
	fill(&c.Link.Window, DefaultLink.Window)
	fill(&c.Link.Stable, DefaultLink.Stable)
	fills(&c.Link.Action, DefaultLink.Action)
	fill(&c.Correlate.Window, DefaultCorrelate.Window)
	filli(&c.Correlate.MinNodes, DefaultCorrelate.MinNodes)
	return c
}

// Validate checks every number against its range and every action; keys
// are named under prefix ("remediation.rules").
func (c Config) Validate(prefix string) error {
	var errs []error
	step := func(key, a string) {
		if a != "" && !slices.Contains(Steps, a) {
			errs = append(errs, fmt.Errorf("%s %q: must be one of %s", key, a, strings.Join(Steps, ", ")))
		}
	}
	seen := map[int]bool{}
	for i, r := range c.Xid {
		k := fmt.Sprintf("%s.xid[%d]", prefix, i)
		errs = append(errs,
			RangeXidCode.Check(prefix+".xid[].code", r.Code),
			RangeCount.CheckOrZero(prefix+".xid[].count", r.Count),
			RangeWindow.CheckOrZero(prefix+".xid[].window", time.Duration(r.Window)))
		step(k+".action", r.Action)
		if seen[r.Code] {
			errs = append(errs, fmt.Errorf("%s: Xid %d has two rules", k, r.Code))
		}
		seen[r.Code] = true
	}
	errs = append(errs,
		RangeECCCount.CheckOrZero(prefix+".ecc_correctable.count", c.ECC.Count),
		RangeWindow.CheckOrZero(prefix+".ecc_correctable.window", time.Duration(c.ECC.Window)),
		RangeCount.CheckOrZero(prefix+".link_flaps.flaps", c.Link.Flaps),
		RangeWindow.CheckOrZero(prefix+".link_flaps.window", time.Duration(c.Link.Window)),
		RangeStable.CheckOrZero(prefix+".link_flaps.stable", time.Duration(c.Link.Stable)),
		RangeCorrWindow.CheckOrZero(prefix+".correlate.window", time.Duration(c.Correlate.Window)),
		RangeCorrNodes.CheckOrZero(prefix+".correlate.min_nodes", c.Correlate.MinNodes))
	step(prefix+".ecc_correctable.action", c.ECC.Action)
	step(prefix+".link_flaps.action", c.Link.Action)
	return errors.Join(errs...)
}

// VerdictKind is what the rules concluded.
type VerdictKind string

// Verdict kinds.
const (
	// Escalate: a component crossed a rule; Action names the step.
	Escalate VerdictKind = "escalate"
	// JobEvent: application Xids on many nodes at once; nobody is drained.
	JobEvent VerdictKind = "job_event"
	// Cleared: a flagged port has been stable for its period.
	Cleared VerdictKind = "cleared"
)

// Verdict is one conclusion of the rules.
type Verdict struct {
	Kind      VerdictKind `json:"kind"`
	At        time.Time   `json:"at"`
	Node      string      `json:"node,omitempty"`
	Component string      `json:"component,omitempty"`
	Action    string      `json:"action,omitempty"`
	Rule      string      `json:"rule"`
	Reason    string      `json:"reason"`
	// Nodes are a job event's nodes; Job its job when the events said.
	Nodes []string `json:"nodes,omitempty"`
	Job   string   `json:"job,omitempty"`
	Xid   int      `json:"xid,omitempty"`
}

type key struct{ node, comp string }

type xidKey struct {
	key
	code int
}

// FlaggedPort is a port the link rule holds flagged.
type FlaggedPort struct {
	Node      string    `json:"node"`
	Component string    `json:"component"`
	Since     time.Time `json:"since"`
	LastFlap  time.Time `json:"last_flap"`
	// Until is when it clears if it stays stable.
	Until time.Time `json:"until"`
	// armed: a flap now escalates again (Rearm, after a remediation).
	armed bool
}

// Rules applies a Config to events. Not safe for concurrent use: the
// caller serializes (the remediation engine holds its own lock).
type Rules struct {
	cfg    Config
	byCode map[int]XidRule

	xids    map[xidKey][]stamp // occurrences within the window
	ecc     map[key][]stamp    // correctable rises within the window
	eccLast map[key]float64    // last correctable total seen
	flaps   map[key][]stamp
	flagged map[key]*FlaggedPort
	groups  []*group // open application-Xid groups, oldest first
}

type stamp struct {
	at time.Time
	n  int
}

// group is application Xids waiting for the correlation window to close.
type group struct {
	start  time.Time
	events []Event
}

// New returns rules for cfg (defaults filled; Validate first).
func New(cfg Config) *Rules {
	cfg = cfg.WithDefaults()
	r := &Rules{cfg: cfg, byCode: map[int]XidRule{}, xids: map[xidKey][]stamp{}, ecc: map[key][]stamp{},
		eccLast: map[key]float64{}, flaps: map[key][]stamp{}, flagged: map[key]*FlaggedPort{}}
	for _, x := range cfg.Xid {
		r.byCode[x.Code] = x
	}
	return r
}

// Config is the rules' configuration, defaults filled.
func (r *Rules) Config() Config { return r.cfg }

// Horizon is how far back the rules' windows reach: events older than
// this conclude nothing more (a port's flag lasts a stable period past
// the flap window). A new leader rebuilds the windows from that much of
// the stored history.
func (r *Rules) Horizon() time.Duration {
	c := r.cfg
	h := max(time.Duration(c.ECC.Window), time.Duration(c.Link.Window)+time.Duration(c.Link.Stable), time.Duration(c.Correlate.Window))
	for _, x := range c.Xid {
		h = max(h, time.Duration(x.Window))
	}
	return h
}

// Observe takes one event and returns what the rules conclude from it and
// from the windows it closes. Events should come in time order; a late one
// counts at its own time.
func (r *Rules) Observe(ev Event) []Verdict {
	out := r.Flush(ev.At)
	switch ev.Kind {
	case KindXid:
		if xid.IsApplication(ev.Xid) {
			// Wait for the correlation window: one crash prints these on
			// every node of the job at once.
			r.join(ev)
			return out
		}
		out = append(out, r.countXid(ev)...)
	case KindECCCorrectable:
		out = append(out, r.countECC(ev)...)
	case KindLinkFlap:
		out = append(out, r.countFlap(ev)...)
	}
	return out
}

func (r *Rules) join(ev Event) {
	for _, g := range r.groups {
		if !ev.At.Before(g.start) && ev.At.Sub(g.start) <= time.Duration(r.cfg.Correlate.Window) {
			g.events = append(g.events, ev)
			return
		}
	}
	r.groups = append(r.groups, &group{start: ev.At, events: []Event{ev}})
}

// Flush closes the correlation groups and sticky windows that now has
// passed and returns what they conclude.
func (r *Rules) Flush(now time.Time) []Verdict {
	var out []Verdict
	keep := r.groups[:0]
	for _, g := range r.groups {
		if now.Sub(g.start) <= time.Duration(r.cfg.Correlate.Window) {
			keep = append(keep, g)
			continue
		}
		out = append(out, r.close(g)...)
	}
	clear(r.groups[len(keep):])
	r.groups = keep
	var cleared []key
	for k, f := range r.flagged {
		if !now.Before(f.Until) {
			cleared = append(cleared, k)
		}
	}
	sort.Slice(cleared, func(i, j int) bool {
		if cleared[i].node != cleared[j].node {
			return cleared[i].node < cleared[j].node
		}
		return cleared[i].comp < cleared[j].comp
	})
	for _, k := range cleared {
		f := r.flagged[k]
		delete(r.flagged, k)
		delete(r.flaps, k)
		out = append(out, Verdict{Kind: Cleared, At: f.Until, Node: k.node, Component: k.comp, Rule: r.linkRule(),
			Reason: fmt.Sprintf("%s stable for %v since its last flap at %s", k.comp, config.FormatDuration(time.Duration(r.cfg.Link.Stable)), f.LastFlap.UTC().Format(time.RFC3339))})
	}
	return out
}

// close decides a correlation group: many nodes are one job event; a few
// count on their GPUs like any other Xid.
func (r *Rules) close(g *group) []Verdict {
	nodes := map[string]bool{}
	job := ""
	for _, e := range g.events {
		nodes[e.Node] = true
		if e.Job != "" {
			job = e.Job
		}
	}
	if len(nodes) >= r.cfg.Correlate.MinNodes {
		names := make([]string, 0, len(nodes))
		for n := range nodes {
			names = append(names, n)
		}
		sort.Strings(names)
		codes := map[int]bool{}
		for _, e := range g.events {
			codes[e.Xid] = true
		}
		var cs []string
		for c := range codes {
			cs = append(cs, fmt.Sprint(c))
		}
		sort.Strings(cs)
		return []Verdict{{Kind: JobEvent, At: g.start, Nodes: names, Job: job, Xid: g.events[0].Xid,
			Rule:   fmt.Sprintf("correlate: %d+ nodes within %s", r.cfg.Correlate.MinNodes, config.FormatDuration(time.Duration(r.cfg.Correlate.Window))),
			Reason: fmt.Sprintf("application Xid %s on %d nodes within %s: one job's crash, no node drained", strings.Join(cs, ","), len(names), config.FormatDuration(time.Duration(r.cfg.Correlate.Window)))}}
	}
	var out []Verdict
	for _, e := range g.events {
		out = append(out, r.countXid(e)...)
	}
	return out
}

// within keeps the stamps after at-window.
func within(s []stamp, at time.Time, window time.Duration) []stamp {
	cut := at.Add(-window)
	i := 0
	for i < len(s) && !s[i].at.After(cut) {
		i++
	}
	return s[i:]
}

func sum(s []stamp) int {
	n := 0
	for _, x := range s {
		n += x.n
	}
	return n
}

func (r *Rules) countXid(ev Event) []Verdict {
	rule, ok := r.byCode[ev.Xid]
	if !ok {
		return nil
	}
	k := xidKey{key{ev.Node, ev.Component}, ev.Xid}
	s := append(within(r.xids[k], ev.At, time.Duration(rule.Window)), stamp{ev.At, ev.count()})
	if n := sum(s); n >= rule.Count {
		delete(r.xids, k) // counted once: the next escalation needs N more
		return []Verdict{{Kind: Escalate, At: ev.At, Node: ev.Node, Component: ev.Component, Action: rule.Action, Xid: ev.Xid,
			Rule:   fmt.Sprintf("xid %d: %d in %s", rule.Code, rule.Count, config.FormatDuration(time.Duration(rule.Window))),
			Reason: fmt.Sprintf("Xid %d %d times within %s on %s", ev.Xid, n, config.FormatDuration(time.Duration(rule.Window)), ev.Component)}}
	}
	r.xids[k] = s
	return nil
}

func (r *Rules) countECC(ev Event) []Verdict {
	k := key{ev.Node, ev.Component}
	last, seen := r.eccLast[k]
	r.eccLast[k] = ev.Total
	rise := int(ev.Total - last)
	if !seen || rise <= 0 {
		return nil // a first reading, or a reset counter: no rise known
	}
	rule := r.cfg.ECC
	s := append(within(r.ecc[k], ev.At, time.Duration(rule.Window)), stamp{ev.At, rise})
	if n := sum(s); n >= rule.Count {
		delete(r.ecc, k)
		return []Verdict{{Kind: Escalate, At: ev.At, Node: ev.Node, Component: ev.Component, Action: rule.Action,
			Rule:   fmt.Sprintf("ecc_correctable: %d in %s", rule.Count, config.FormatDuration(time.Duration(rule.Window))),
			Reason: fmt.Sprintf("%d correctable ECC errors within %s on %s", n, config.FormatDuration(time.Duration(rule.Window)), ev.Component)}}
	}
	r.ecc[k] = s
	return nil
}

func (r *Rules) linkRule() string {
	return fmt.Sprintf("link_flaps: %d in %s, stable %s", r.cfg.Link.Flaps, config.FormatDuration(time.Duration(r.cfg.Link.Window)), config.FormatDuration(time.Duration(r.cfg.Link.Stable)))
}

func (r *Rules) countFlap(ev Event) []Verdict {
	k := key{ev.Node, ev.Component}
	rule := r.cfg.Link
	if f := r.flagged[k]; f != nil {
		// Sticky: each flap pushes the clearing out.
		f.LastFlap, f.Until = ev.At, ev.At.Add(time.Duration(rule.Stable))
		if !f.armed {
			return nil
		}
		f.armed = false
		return []Verdict{{Kind: Escalate, At: ev.At, Node: ev.Node, Component: ev.Component, Action: rule.Action, Rule: r.linkRule(),
			Reason: fmt.Sprintf("%s flapped again after its remediation (flagged since %s)", ev.Component, f.Since.UTC().Format(time.RFC3339))}}
	}
	s := append(within(r.flaps[k], ev.At, time.Duration(rule.Window)), stamp{ev.At, ev.count()})
	if n := sum(s); n >= rule.Flaps {
		delete(r.flaps, k)
		r.flagged[k] = &FlaggedPort{Node: ev.Node, Component: ev.Component, Since: ev.At, LastFlap: ev.At, Until: ev.At.Add(time.Duration(rule.Stable))}
		return []Verdict{{Kind: Escalate, At: ev.At, Node: ev.Node, Component: ev.Component, Action: rule.Action, Rule: r.linkRule(),
			Reason: fmt.Sprintf("%s went down %d times within %s: flagged until stable for %s", ev.Component, n, config.FormatDuration(time.Duration(rule.Window)), config.FormatDuration(time.Duration(rule.Stable)))}}
	}
	r.flaps[k] = s
	return nil
}

// Flagged lists the ports the link rule holds flagged on node ("" for all).
func (r *Rules) Flagged(node string) []FlaggedPort {
	var out []FlaggedPort
	for _, f := range r.flagged {
		if node == "" || f.Node == node {
			out = append(out, *f)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].Component < out[j].Component
	})
	return out
}

// Rearm makes the next flap of a flagged port escalate again: its
// remediation is done, so a flap now is a recurrence, not the same
// episode. The port stays flagged until it has been stable.
func (r *Rules) Rearm(node, comp string) {
	if f := r.flagged[key{node, comp}]; f != nil {
		f.armed = true
	}
}

// IsFlagged reports whether a port is flagged.
func (r *Rules) IsFlagged(node, comp string) bool { return r.flagged[key{node, comp}] != nil }
