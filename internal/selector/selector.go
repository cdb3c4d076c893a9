// Package selector parses node selectors: Kubernetes label-selector syntax
// over the labels agents declare, plus the pseudo-label `name` for the node's
// own name.
//
//	sku=h100,rack in (r1,r2)   every requirement must hold (AND)
//	key=value, key==value      equal
//	key!=value                 not equal, or the key is absent
//	key in (a,b)               one of
//	key notin (a,b)            none of, or the key is absent
//	key                        the key exists
//	!key                       the key does not exist
//
// The empty selector matches every node. `name` always means the node's
// name, even when an agent declares a label called "name".
//
// Where both accept a selector, ours and apimachinery's (k8s.io/apimachinery
// /pkg/labels) select the same nodes: FuzzAgainstKubernetes checks it. They
// differ only in what they accept:
//   - keys: ours takes any key of letters, digits, '-', '_', '.' and one '/'
//     up to 253 bytes; Kubernetes also wants the name part at most 63 bytes
//     and starting and ending with a letter or digit, and the prefix a
//     lowercase DNS subdomain.
//   - values: ours also takes ':' (firmware and driver versions) and values
//     up to 253 bytes that start or end with '-', '_' or '.'; Kubernetes
//     wants at most 63 bytes, starting and ending with a letter or digit.
//   - "key in ()" is an error here; Kubernetes reads it as key in ("").
//   - the numeric operators "key>4" and "key<4" are Kubernetes only.
//   - a NUL byte is an error here; Kubernetes' lexer takes it for the end of
//     the selector and ignores the rest.
//
// The selector never goes to Kubernetes as written: the drain adapter
// names nodes, so a wider key or value costs nothing there.
package selector

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// NameKey is the pseudo-label that selects on the node's name.
const NameKey = "name"

// Limits keep a hostile selector from costing much.
const (
	maxKeyLen   = 253
	maxValueLen = 253
	maxLen      = 16 << 10
)

// ErrSyntax is wrapped by every parse error.
var ErrSyntax = errors.New("invalid selector")

// Op is a requirement's operator.
type Op string

const (
	OpEquals    Op = "="
	OpNotEquals Op = "!="
	OpIn        Op = "in"
	OpNotIn     Op = "notin"
	OpExists    Op = "exists"
	OpNotExists Op = "!"
)

// Requirement is one comma-separated term.
type Requirement struct {
	Key    string
	Op     Op
	Values []string // sorted and unique; one for = and !=, none for exists/!
}

// Selector is a parsed selector: a conjunction of requirements. The zero
// value matches everything.
type Selector struct {
	reqs []Requirement
}

// Everything returns the selector that matches every node.
func Everything() Selector { return Selector{} }

// Empty reports whether the selector matches every node.
func (s Selector) Empty() bool { return len(s.reqs) == 0 }

// Requirements returns a copy of the selector's terms.
func (s Selector) Requirements() []Requirement {
	out := make([]Requirement, len(s.reqs))
	for i, r := range s.reqs {
		out[i] = Requirement{Key: r.Key, Op: r.Op, Values: append([]string(nil), r.Values...)}
	}
	return out
}

// Matches reports whether a node with this name and these labels is selected.
func (s Selector) Matches(name string, labels map[string]string) bool {
	for _, r := range s.reqs {
		if !r.matches(name, labels) {
			return false
		}
	}
	return true
}

func (r Requirement) matches(name string, labels map[string]string) bool {
	var v string
	var ok bool
	if r.Key == NameKey {
		v, ok = name, true
	} else {
		v, ok = labels[r.Key]
	}
	switch r.Op {
	case OpExists:
		return ok
	case OpNotExists:
		return !ok
	case OpEquals, OpIn:
		return ok && r.has(v)
	case OpNotEquals, OpNotIn:
		return !ok || !r.has(v)
	}
	return false
}

func (r Requirement) has(v string) bool {
	i := sort.SearchStrings(r.Values, v)
	return i < len(r.Values) && r.Values[i] == v
}

// String renders the selector in canonical form; Parse(s.String()) selects
// the same nodes.
func (s Selector) String() string {
	parts := make([]string, len(s.reqs))
	for i, r := range s.reqs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// String renders one requirement.
func (r Requirement) String() string {
	switch r.Op {
	case OpExists:
		return r.Key
	case OpNotExists:
		return "!" + r.Key
	case OpEquals, OpNotEquals:
		return r.Key + string(r.Op) + r.Values[0]
	default:
		return r.Key + " " + string(r.Op) + " (" + strings.Join(r.Values, ",") + ")"
	}
}

// Parse reads a selector. Errors wrap ErrSyntax and say where and what was
// expected.
func Parse(in string) (Selector, error) {
	if len(in) > maxLen {
		return Selector{}, fmt.Errorf("%w: longer than %d bytes", ErrSyntax, maxLen)
	}
	p := parser{in: in}
	p.toks = lex(in)
	var reqs []Requirement
	if p.peek().kind == tEOF {
		return Selector{}, nil
	}
	for {
		r, err := p.requirement()
		if err != nil {
			return Selector{}, err
		}
		reqs = append(reqs, r)
		t := p.next()
		switch t.kind {
		case tEOF:
			return Selector{reqs: reqs}, nil
		case tComma:
			continue
		default:
			return Selector{}, p.errorf(t, "expected ',' or end of selector, found %s", t)
		}
	}
}

type tokKind int

const (
	tEOF tokKind = iota
	tIdent
	tComma
	tLParen
	tRParen
	tEq    // = or ==
	tNotEq // !=
	tBang  // !
	tIn
	tNotIn
)

type token struct {
	kind tokKind
	text string
	pos  int // byte offset, for messages
}

func (t token) String() string {
	switch t.kind {
	case tEOF:
		return "end of selector"
	case tIdent:
		return fmt.Sprintf("%q", t.text)
	default:
		return fmt.Sprintf("'%s'", t.text)
	}
}

// special characters end an identifier.
func special(c byte) bool {
	switch c {
	case ',', '(', ')', '=', '!', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

func lex(in string) []token {
	var toks []token
	for i := 0; i < len(in); {
		c := in[i]
		switch c {
		case ' ', '\t', '\n', '\r':
			i++
		case ',':
			toks = append(toks, token{tComma, ",", i})
			i++
		case '(':
			toks = append(toks, token{tLParen, "(", i})
			i++
		case ')':
			toks = append(toks, token{tRParen, ")", i})
			i++
		case '=':
			if i+1 < len(in) && in[i+1] == '=' {
				toks = append(toks, token{tEq, "==", i})
				i += 2
			} else {
				toks = append(toks, token{tEq, "=", i})
				i++
			}
		case '!':
			if i+1 < len(in) && in[i+1] == '=' {
				toks = append(toks, token{tNotEq, "!=", i})
				i += 2
			} else {
				toks = append(toks, token{tBang, "!", i})
				i++
			}
		default:
			j := i
			for j < len(in) && !special(in[j]) {
				j++
			}
			word := in[i:j]
			kind := tIdent
			switch word {
			case "in":
				kind = tIn
			case "notin":
				kind = tNotIn
			}
			toks = append(toks, token{kind, word, i})
			i = j
		}
	}
	return append(toks, token{tEOF, "", len(in)})
}

type parser struct {
	in   string
	toks []token
	i    int
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tEOF {
		p.i++
	}
	return t
}

func (p *parser) errorf(t token, format string, args ...any) error {
	return fmt.Errorf("%w %q at offset %d: %s", ErrSyntax, p.in, t.pos, fmt.Sprintf(format, args...))
}

func (p *parser) requirement() (Requirement, error) {
	t := p.next()
	if t.kind == tBang {
		k := p.next()
		if k.kind == tIn || k.kind == tNotIn {
			k.kind = tIdent // "!in" is the key "in" absent, as "in" alone is the key present
		}
		if k.kind != tIdent {
			return Requirement{}, p.errorf(k, "expected a label key after '!', found %s", k)
		}
		if err := p.checkKey(k); err != nil {
			return Requirement{}, err
		}
		return Requirement{Key: k.text, Op: OpNotExists}, nil
	}
	if t.kind == tIn || t.kind == tNotIn {
		// "in" and "notin" are valid keys when not followed by an operator's place.
		t.kind = tIdent
	}
	if t.kind != tIdent {
		return Requirement{}, p.errorf(t, "expected a label key, found %s", t)
	}
	if err := p.checkKey(t); err != nil {
		return Requirement{}, err
	}
	key := t.text
	op := p.peek()
	switch op.kind {
	case tComma, tEOF:
		return Requirement{Key: key, Op: OpExists}, nil
	case tEq, tNotEq:
		p.next()
		v := p.peek()
		value := ""
		switch v.kind {
		case tIdent, tIn, tNotIn:
			p.next()
			value = v.text
			if err := p.checkValue(v); err != nil {
				return Requirement{}, err
			}
		case tComma, tEOF:
			// key= selects an empty value, as Kubernetes allows.
		default:
			return Requirement{}, p.errorf(v, "expected a value after '%s', found %s", op.text, v)
		}
		o := OpEquals
		if op.kind == tNotEq {
			o = OpNotEquals
		}
		return Requirement{Key: key, Op: o, Values: []string{value}}, nil
	case tIn, tNotIn:
		p.next()
		vals, err := p.valueSet(op)
		if err != nil {
			return Requirement{}, err
		}
		o := OpIn
		if op.kind == tNotIn {
			o = OpNotIn
		}
		return Requirement{Key: key, Op: o, Values: vals}, nil
	default:
		return Requirement{}, p.errorf(op, "expected '=', '!=', 'in', 'notin', ',' or end after key %q, found %s", key, op)
	}
}

func (p *parser) valueSet(op token) ([]string, error) {
	t := p.next()
	if t.kind != tLParen {
		return nil, p.errorf(t, "expected '(' after '%s', found %s", op.text, t)
	}
	if e := p.peek(); e.kind == tRParen {
		return nil, p.errorf(e, "empty value list after '%s'", op.text)
	}
	var vals []string
	for {
		v := p.next()
		switch v.kind {
		case tIdent, tIn, tNotIn:
			if err := p.checkValue(v); err != nil {
				return nil, err
			}
			vals = append(vals, v.text)
		case tComma, tRParen:
			// an empty value between commas, as in "(a,,b)", means "".
			vals = append(vals, "")
			p.i--
		default:
			return nil, p.errorf(v, "expected a value in '%s (...)', found %s", op.text, v)
		}
		sep := p.next()
		switch sep.kind {
		case tComma:
			continue
		case tRParen:
			sort.Strings(vals)
			return uniq(vals), nil
		default:
			return nil, p.errorf(sep, "expected ',' or ')' in value list, found %s", sep)
		}
	}
}

func uniq(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// Keys follow Kubernetes: an optional DNS-subdomain prefix and '/', then a
// name of letters, digits, '-', '_' and '.'.
func (p *parser) checkKey(t token) error {
	k := t.text
	if len(k) > maxKeyLen {
		return p.errorf(t, "label key longer than %d characters", maxKeyLen)
	}
	name := k
	if i := strings.IndexByte(k, '/'); i >= 0 {
		prefix := k[:i]
		name = k[i+1:]
		if prefix == "" {
			return p.errorf(t, "label key %q has an empty prefix before '/'", k)
		}
		for j := 0; j < len(prefix); j++ {
			c := prefix[j]
			if !(alnum(c) || c == '-' || c == '.') {
				return p.errorf(t, "label key prefix %q may hold only letters, digits, '-' and '.'", prefix)
			}
		}
	}
	if name == "" {
		return p.errorf(t, "label key %q has an empty name", k)
	}
	for j := 0; j < len(name); j++ {
		c := name[j]
		if !(alnum(c) || c == '-' || c == '_' || c == '.') {
			return p.errorf(t, "label key %q may hold only letters, digits, '-', '_', '.' and one '/'", k)
		}
	}
	return nil
}

func (p *parser) checkValue(t token) error {
	v := t.text
	if len(v) > maxValueLen {
		return p.errorf(t, "label value longer than %d characters", maxValueLen)
	}
	for j := 0; j < len(v); j++ {
		c := v[j]
		if !(alnum(c) || c == '-' || c == '_' || c == '.' || c == ':') {
			return p.errorf(t, "label value %q may hold only letters, digits, '-', '_', '.' and ':'", v)
		}
	}
	return nil
}

func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
