package baselines

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Metric names with a baseline in the shipped references. The single-node
// name is the one the nccl.allreduce check reports.
const (
	// MetricAllReduceBusBW is single-node all_reduce_perf bus bandwidth at
	// the largest message size, in GB/s, under node: or sku: scopes.
	MetricAllReduceBusBW = "nccl.allreduce.busbw_gbps"
	// MetricAllReduce2BusBW is the same measurement over two nodes (one
	// rank per GPU on both), under link: scopes for one pair and sku:
	// scopes for the fleet's reference. A separate name, because a sku:
	// scope cannot otherwise tell a 2-node figure from a 1-node one.
	MetricAllReduce2BusBW = "nccl.allreduce2.busbw_gbps"
)

// Sentinel errors; test them with errors.Is.
var (
	ErrInvalid      = errors.New("invalid baseline")
	ErrNotFound     = errors.New("no baseline")
	ErrSchemaTooNew = errors.New("baselines schema is newer than this fleetcheck")
)

// Limits on stored text, so one bad import cannot bloat every listing.
const (
	maxMetricLen = 200
	maxNameLen   = 253 // a DNS name
	maxStackLen  = 128
	maxWhoLen    = 256
	maxNoteLen   = 4096
)

// ScopeKind is what a baseline's scope covers.
type ScopeKind string

// Scope kinds.
const (
	ScopeNode ScopeKind = "node" // one node
	ScopeSKU  ScopeKind = "sku"  // every node of one hardware SKU
	ScopeLink ScopeKind = "link" // one pair of nodes
)

// Scope is "node:NAME", "sku:SKU" or "link:A|B" (A and B sorted, so a pair
// has one spelling). Build it with NodeScope, SKUScope, LinkScope or
// ParseScope.
type Scope string

// NodeScope is the scope of one node.
func NodeScope(name string) Scope { return Scope("node:" + name) }

// SKUScope is the scope of one SKU; SKUs are lowercase.
func SKUScope(sku string) Scope { return Scope("sku:" + strings.ToLower(strings.TrimSpace(sku))) }

// LinkScope is the scope of a pair of nodes, in either order.
func LinkScope(a, b string) Scope {
	if b < a {
		a, b = b, a
	}
	return Scope("link:" + a + "|" + b)
}

// ParseScope validates s and returns it in its one spelling (link nodes
// sorted, SKU lowercase).
func ParseScope(s string) (Scope, error) {
	kind, name, ok := strings.Cut(s, ":")
	if !ok {
		return "", fmt.Errorf("%w: scope %q: want node:NAME, sku:SKU or link:A|B", ErrInvalid, s)
	}
	switch ScopeKind(kind) {
	case ScopeNode:
		if err := validNode(name); err != nil {
			return "", fmt.Errorf("%w: scope %q: %w", ErrInvalid, s, err)
		}
		return NodeScope(name), nil
	case ScopeSKU:
		name = strings.ToLower(name)
		if err := ValidSKU(name); err != nil {
			return "", fmt.Errorf("%w: scope %q: %w", ErrInvalid, s, err)
		}
		return SKUScope(name), nil
	case ScopeLink:
		a, b, ok := strings.Cut(name, "|")
		if !ok {
			return "", fmt.Errorf("%w: scope %q: a link is two nodes, link:A|B", ErrInvalid, s)
		}
		for _, n := range []string{a, b} {
			if err := validNode(n); err != nil {
				return "", fmt.Errorf("%w: scope %q: %w", ErrInvalid, s, err)
			}
		}
		if a == b {
			return "", fmt.Errorf("%w: scope %q: a link joins two different nodes", ErrInvalid, s)
		}
		return LinkScope(a, b), nil
	default:
		return "", fmt.Errorf("%w: scope %q: unknown kind %q (node, sku or link)", ErrInvalid, s, kind)
	}
}

// Kind is the scope's kind, "" when it has none.
func (s Scope) Kind() ScopeKind {
	k, _, ok := strings.Cut(string(s), ":")
	if !ok {
		return ""
	}
	return ScopeKind(k)
}

// Name is what follows the kind: the node, the SKU or "A|B".
func (s Scope) Name() string {
	_, n, _ := strings.Cut(string(s), ":")
	return n
}

// LinkNodes returns a link scope's two nodes.
func (s Scope) LinkNodes() (a, b string, ok bool) {
	if s.Kind() != ScopeLink {
		return "", "", false
	}
	return strings.Cut(s.Name(), "|")
}

// validNode accepts host and Kubernetes node names.
func validNode(n string) error {
	if n == "" {
		return errors.New("empty node name")
	}
	if len(n) > maxNameLen {
		return fmt.Errorf("node name longer than %d bytes", maxNameLen)
	}
	for i, c := range n {
		alnum := c < utf8.RuneSelf && (unicode.IsLetter(c) || unicode.IsDigit(c))
		if alnum || (i > 0 && (c == '-' || c == '.' || c == '_')) {
			continue
		}
		return fmt.Errorf("node name %q: only letters, digits, '-', '.' and '_' (not first)", n)
	}
	return nil
}

// ValidSKU reports whether s is a usable SKU: lowercase letters, digits,
// '-', '.' and '_', starting with a letter or digit.
func ValidSKU(s string) error {
	if s == "" {
		return errors.New("empty SKU")
	}
	if len(s) > maxNameLen {
		return fmt.Errorf("SKU longer than %d bytes", maxNameLen)
	}
	for i, c := range s {
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (i > 0 && (c == '-' || c == '.' || c == '_')) {
			continue
		}
		return fmt.Errorf("SKU %q: only lowercase letters, digits, '-', '.' and '_' (not first)", s)
	}
	return nil
}

// ValidMetric checks a metric name: dotted, lowercase, at least two parts
// (the report's convention, unit in the last word).
func ValidMetric(m string) error {
	if m == "" {
		return errors.New("empty metric name")
	}
	if len(m) > maxMetricLen {
		return fmt.Errorf("metric name longer than %d bytes", maxMetricLen)
	}
	parts := strings.Split(m, ".")
	if len(parts) < 2 {
		return fmt.Errorf("metric %q: want dotted words such as nccl.allreduce.busbw_gbps", m)
	}
	for _, p := range parts {
		if p == "" {
			return fmt.Errorf("metric %q: empty word", m)
		}
		for _, c := range p {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
				return fmt.Errorf("metric %q: only lowercase letters, digits and '_' between dots", m)
			}
		}
	}
	return nil
}

// Stack is the software a measurement ran under. Empty fields are
// unknown: only two known, different values make stacks differ.
type Stack struct {
	Driver    string `json:"driver,omitempty"`
	NCCL      string `json:"nccl,omitempty"`
	RDMAStack string `json:"rdma_stack,omitempty"` // "MLNX_OFED 23.10-1.1.9.0", "DOCA 2.10.0", "inbox"
}

// StackFromVersions takes the stack from a snapshot's versions.
func StackFromVersions(v snapshot.Versions) Stack {
	return Stack{Driver: v.Driver, NCCL: v.NCCL, RDMAStack: v.RDMAStack}.Normalize()
}

// Normalize trims spaces and drops NCCL's "+cudaX.Y" build suffix: the
// same NCCL built for another CUDA is the same NCCL for a baseline.
func (s Stack) Normalize() Stack {
	s.Driver = strings.TrimSpace(s.Driver)
	s.NCCL = strings.TrimSpace(s.NCCL)
	if i := strings.IndexByte(s.NCCL, '+'); i >= 0 {
		s.NCCL = s.NCCL[:i]
	}
	s.RDMAStack = strings.TrimSpace(s.RDMAStack)
	return s
}

// IsZero reports whether nothing about the stack is known.
func (s Stack) IsZero() bool { return s == Stack{} }

func (s Stack) fields() [3][2]string {
	return [3][2]string{{"driver", s.Driver}, {"nccl", s.NCCL}, {"rdma_stack", s.RDMAStack}}
}

// Differences lists the fields known on both sides that differ, as
// "driver 535.129.03 → 550.54.15" (s first).
func (s Stack) Differences(o Stack) []string {
	var out []string
	a, b := s.fields(), o.fields()
	for i := range a {
		if a[i][1] != "" && b[i][1] != "" && a[i][1] != b[i][1] {
			out = append(out, fmt.Sprintf("%s %s → %s", a[i][0], a[i][1], b[i][1]))
		}
	}
	return out
}

// matches counts the fields known on both sides and equal.
func (s Stack) matches(o Stack) int {
	n := 0
	a, b := s.fields(), o.fields()
	for i := range a {
		if a[i][1] != "" && a[i][1] == b[i][1] {
			n++
		}
	}
	return n
}

// String is "driver=X nccl=Y rdma_stack=Z" over the known fields, or "unknown stack".
func (s Stack) String() string {
	var parts []string
	for _, f := range s.fields() {
		if f[1] != "" {
			parts = append(parts, f[0]+"="+f[1])
		}
	}
	if len(parts) == 0 {
		return "unknown stack"
	}
	return strings.Join(parts, " ")
}

func (s Stack) validate() error {
	for _, f := range s.fields() {
		if len(f[1]) > maxStackLen {
			return fmt.Errorf("stack %s longer than %d bytes", f[0], maxStackLen)
		}
		if err := plainText(f[1], false); err != nil {
			return fmt.Errorf("stack %s: %w", f[0], err)
		}
	}
	return nil
}

// Key names one baseline series; its versions share it.
type Key struct {
	Metric string `json:"metric"`
	Scope  Scope  `json:"scope"`
	Stack  Stack  `json:"stack"`
}

// Normalize validates the key and returns it in its one spelling.
func (k Key) Normalize() (Key, error) {
	if err := ValidMetric(k.Metric); err != nil {
		return Key{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	sc, err := ParseScope(string(k.Scope))
	if err != nil {
		return Key{}, err
	}
	st := k.Stack.Normalize()
	if err := st.validate(); err != nil {
		return Key{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return Key{Metric: k.Metric, Scope: sc, Stack: st}, nil
}

// String is "METRIC at SCOPE (STACK)".
func (k Key) String() string {
	return fmt.Sprintf("%s at %s (%s)", k.Metric, k.Scope, k.Stack)
}

// Direction says which way a metric is better.
type Direction string

// Directions.
const (
	HigherBetter Direction = "higher" // bandwidth
	LowerBetter  Direction = "lower"  // latency, time
)

func (d Direction) valid() bool { return d == HigherBetter || d == LowerBetter }

// DirectionFor guesses a metric's direction from the unit in its last
// word; ok is false when the unit says nothing.
func DirectionFor(metric string) (d Direction, ok bool) {
	last := metric[strings.LastIndexByte(metric, '.')+1:]
	if strings.HasSuffix(last, "_per_s") || strings.HasSuffix(last, "_per_second") {
		return HigherBetter, true
	}
	switch last[strings.LastIndexByte(last, '_')+1:] {
	case "gbps", "gbs", "mbps", "bps", "tflops", "gflops", "iops", "ops":
		return HigherBetter, true
	case "us", "ms", "ns", "s", "seconds":
		return LowerBetter, true
	}
	return "", false
}

// plainText rejects invalid UTF-8 and control characters (newlines and
// tabs allowed only when multiline).
func plainText(s string, multiline bool) error {
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	for _, c := range s {
		if multiline && (c == '\n' || c == '\t') {
			continue
		}
		if unicode.IsControl(c) {
			return fmt.Errorf("control character %U", c)
		}
	}
	return nil
}
