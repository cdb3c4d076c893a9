package compat

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// spec is one version rule:
//
//   - any version
//     re:REGEX             a Go regular expression matched against the raw value
//     CLAUSE[, CLAUSE...]  every clause holds
//
// where a clause is VERSION, =VERSION, !=VERSION, >V, >=V, <V, <=V, and
// VERSION may end in ".*" for a branch ("535.*": any 535 driver).
type spec struct {
	text    string
	any     bool
	re      *regexp.Regexp
	clauses []clause
}

type clause struct {
	op     string // "=", "!=", ">", ">=", "<", "<="
	ver    string
	branch bool // ver is a prefix: "535.*"
}

var errEmptyRange = errors.New("range matches no version")

func parseSpec(s string) (spec, error) {
	text := strings.TrimSpace(s)
	sp := spec{text: text}
	switch {
	case text == "":
		return sp, errors.New("empty version rule")
	case text == "*":
		sp.any = true
		return sp, nil
	case strings.HasPrefix(text, "re:"):
		expr := strings.TrimSpace(strings.TrimPrefix(text, "re:"))
		if expr == "" {
			return sp, errors.New(`empty regular expression (use "*" for any version)`)
		}
		re, err := regexp.Compile(expr)
		if err != nil {
			return sp, fmt.Errorf("bad regular expression: %w", err)
		}
		sp.re = re
		return sp, nil
	}
	for _, part := range strings.Split(text, ",") {
		c, err := parseClause(strings.TrimSpace(part))
		if err != nil {
			return sp, err
		}
		sp.clauses = append(sp.clauses, c)
	}
	if err := checkNonEmpty(sp.clauses); err != nil {
		return sp, err
	}
	return sp, nil
}

func parseClause(s string) (clause, error) {
	if s == "" {
		return clause{}, errors.New("empty clause (stray comma?)")
	}
	c := clause{op: "="}
	for _, op := range []string{">=", "<=", "!=", "==", ">", "<", "="} {
		if strings.HasPrefix(s, op) {
			c.op = op
			if op == "==" {
				c.op = "="
			}
			s = strings.TrimSpace(s[len(op):])
			break
		}
	}
	if s == "*" {
		return c, errors.New(`"*" stands alone: it cannot follow an operator or join other clauses`)
	}
	if strings.HasSuffix(s, "*") {
		c.branch = true
		base := strings.TrimSuffix(s, "*")
		if base == "" || !isSep(rune(base[len(base)-1])) {
			return c, fmt.Errorf("branch %q: write it as VERSION.* (segments compare whole: 535.* is not 5350)", s)
		}
		s = strings.TrimRightFunc(base, isSep)
		if c.op != "=" && c.op != "!=" {
			return c, fmt.Errorf("branch %q cannot be used with %s", s+".*", c.op)
		}
	}
	v, err := cleanVersion(s)
	if err != nil {
		return c, err
	}
	c.ver = v
	return c, nil
}

// cleanVersion validates a version written in a matrix: it starts with a
// digit (an optional leading "v" is dropped), and its segments are letters
// and digits joined by single separators.
func cleanVersion(s string) (string, error) {
	if len(s) > 1 && (s[0] == 'v' || s[0] == 'V') && s[1] >= '0' && s[1] <= '9' {
		s = s[1:]
	}
	if s == "" {
		return "", errors.New("missing version")
	}
	if s[0] < '0' || s[0] > '9' {
		return "", fmt.Errorf("version %q must start with a digit", s)
	}
	prevSep := false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch >= '0' && ch <= '9', ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z':
			prevSep = false
		case isSep(rune(ch)):
			if prevSep {
				return "", fmt.Errorf("version %q has an empty segment", s)
			}
			prevSep = true
		default:
			return "", fmt.Errorf("version %q: unexpected character %q", s, ch)
		}
	}
	if prevSep {
		return "", fmt.Errorf("version %q ends with a separator", s)
	}
	return s, nil
}

// haveVersion normalizes a value read from a node for comparison.
func haveVersion(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 1 && (s[0] == 'v' || s[0] == 'V') && s[1] >= '0' && s[1] <= '9' {
		s = s[1:]
	}
	return s
}

// match reports whether have satisfies the rule. have must be non-empty:
// callers treat empty values as unknown before asking.
func (sp spec) match(have string) bool {
	if sp.any {
		return true
	}
	if sp.re != nil {
		return sp.re.MatchString(strings.TrimSpace(have))
	}
	v := haveVersion(have)
	for _, c := range sp.clauses {
		if !c.match(v) {
			return false
		}
	}
	return true
}

func (c clause) match(v string) bool {
	if c.branch {
		in := hasPrefixVersion(v, c.ver)
		if c.op == "!=" {
			return !in
		}
		return in
	}
	cmp := CompareVersions(v, c.ver)
	switch c.op {
	case "=":
		return cmp == 0
	case "!=":
		return cmp != 0
	case ">":
		return cmp > 0
	case ">=":
		return cmp >= 0
	case "<":
		return cmp < 0
	case "<=":
		return cmp <= 0
	}
	return false
}

// bound is one end of an interval of versions.
type bound struct {
	v      string
	strict bool
	set    bool
}

// checkNonEmpty rejects clause lists no version can satisfy, such as
// ">=560, <535" or "=535.129.03, >=550": they are typos, and a rule that
// allows nothing would fail every node.
func checkNonEmpty(cs []clause) error {
	var lo, hi bound
	raise := func(v string, strict bool) {
		c := CompareVersions(v, lo.v)
		if !lo.set || c > 0 || (c == 0 && strict) {
			lo = bound{v: v, strict: strict, set: true}
		}
	}
	lower := func(v string, strict bool) {
		c := CompareVersions(v, hi.v)
		if !hi.set || c < 0 || (c == 0 && strict) {
			hi = bound{v: v, strict: strict, set: true}
		}
	}
	for _, c := range cs {
		switch {
		case c.branch && c.op == "=":
			raise(c.ver, false)
			if next, ok := nextBranch(c.ver); ok {
				lower(next, true)
			}
		case c.op == "=":
			raise(c.ver, false)
			lower(c.ver, false)
		case c.op == ">":
			raise(c.ver, true)
		case c.op == ">=":
			raise(c.ver, false)
		case c.op == "<":
			lower(c.ver, true)
		case c.op == "<=":
			lower(c.ver, false)
		}
	}
	if lo.set && hi.set {
		c := CompareVersions(lo.v, hi.v)
		if c > 0 || (c == 0 && (lo.strict || hi.strict)) {
			return errEmptyRange
		}
		if c == 0 {
			// A single version: it must also pass the != clauses.
			for _, cl := range cs {
				if cl.op == "!=" && !cl.match(lo.v) {
					return errEmptyRange
				}
			}
		}
	}
	return nil
}

// nextBranch returns the first version after a branch: "535" → "536",
// "96.00.99" → "96.00.100". ok is false when the last segment is not a number.
func nextBranch(prefix string) (string, bool) {
	seg := segments(prefix)
	if len(seg) == 0 || !isDigits(seg[len(seg)-1]) {
		return "", false
	}
	seg[len(seg)-1] = incDigits(seg[len(seg)-1])
	return strings.Join(seg, "."), true
}

// incDigits adds one to a decimal string of any length.
func incDigits(s string) string {
	b := []byte(s)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < '9' {
			b[i]++
			return string(b)
		}
		b[i] = '0'
	}
	return "1" + string(b)
}

// specList allows a value when any of its rules matches.
type specList []spec

func (l specList) match(have string) bool {
	for _, s := range l {
		if s.match(have) {
			return true
		}
	}
	return false
}

func (l specList) String() string {
	t := make([]string, len(l))
	for i, s := range l {
		t[i] = s.text
	}
	return strings.Join(t, " | ")
}

func (l specList) texts() []string {
	t := make([]string, len(l))
	for i, s := range l {
		t[i] = s.text
	}
	return t
}

// stackSpec is an RDMA stack rule: a stack name and an optional version
// rule, "MLNX_OFED >=23.10" or "DOCA >=2.9, <3" or "inbox".
type stackSpec struct {
	text string
	name string // normalized
	ver  spec   // any when the rule names no version
}

func parseStackSpec(s string) (stackSpec, error) {
	text := strings.TrimSpace(s)
	ss := stackSpec{text: text}
	name, rest, _ := strings.Cut(text, " ")
	if name == "" {
		return ss, errors.New("empty RDMA stack rule")
	}
	for i := 0; i < len(name); i++ {
		ch := name[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '_' || ch == '-') {
			return ss, fmt.Errorf("RDMA stack name %q: unexpected character %q (want e.g. \"MLNX_OFED >=23.10\")", name, ch)
		}
	}
	if name[0] >= '0' && name[0] <= '9' {
		return ss, fmt.Errorf("RDMA stack rule %q must start with the stack name (e.g. \"MLNX_OFED >=23.10\")", text)
	}
	ss.name = stackName(name)
	rest = strings.TrimSpace(rest)
	if rest == "" {
		ss.ver = spec{text: "*", any: true}
		return ss, nil
	}
	v, err := parseSpec(rest)
	if err != nil {
		return ss, err
	}
	ss.ver = v
	return ss, nil
}

// stackName folds the spellings one stack goes by: ofed_info says
// "MLNX_OFED_LINUX-23.10-1.1.9.0", operators write "MLNX_OFED"; DOCA-host
// installs call themselves "DOCA-HOST" or "doca_host".
func stackName(n string) string {
	n = strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(n), "-", "_"))
	n = strings.TrimSuffix(n, "_LINUX")
	switch n {
	case "DOCA_HOST", "DOCA_OFED":
		return "DOCA"
	}
	return n
}

// splitStack splits a node's RDMA stack value into name and version:
// "MLNX_OFED 23.10-1.1.9.0", "MLNX_OFED_LINUX-23.10-1.1.9.0 (OFED-...)",
// "DOCA 2.10.0", "inbox".
func splitStack(have string) (name, version string) {
	fields := strings.Fields(have)
	if len(fields) == 0 {
		return "", ""
	}
	first := fields[0]
	for i := 0; i+1 < len(first); i++ {
		if first[i] == '-' && first[i+1] >= '0' && first[i+1] <= '9' {
			return stackName(first[:i]), first[i+1:]
		}
	}
	if len(fields) > 1 {
		version = fields[1]
	}
	return stackName(first), version
}

func (ss stackSpec) match(have string) bool {
	name, ver := splitStack(have)
	if name != ss.name {
		return false
	}
	if ss.ver.any {
		return true
	}
	if ver == "" {
		return false
	}
	return ss.ver.match(ver)
}

type stackList []stackSpec

func (l stackList) match(have string) bool {
	for _, s := range l {
		if s.match(have) {
			return true
		}
	}
	return false
}

func (l stackList) String() string {
	t := make([]string, len(l))
	for i, s := range l {
		t[i] = s.text
	}
	return strings.Join(t, " | ")
}

// matcher matches a model name: a case-insensitive substring (GPU product
// names) or exact name (HCA types), or "re:REGEX".
type matcher struct {
	text      string
	re        *regexp.Regexp
	substring bool
}

func parseMatcher(s string, substring bool) (matcher, error) {
	text := strings.TrimSpace(s)
	m := matcher{text: text, substring: substring}
	if text == "" {
		return m, errors.New("empty model")
	}
	if strings.HasPrefix(text, "re:") {
		expr := strings.TrimSpace(strings.TrimPrefix(text, "re:"))
		if expr == "" {
			return m, errors.New("empty regular expression")
		}
		re, err := regexp.Compile(expr)
		if err != nil {
			return m, fmt.Errorf("bad regular expression: %w", err)
		}
		m.re = re
	}
	return m, nil
}

func (m matcher) match(name string) bool {
	name = strings.TrimSpace(name)
	if name == "" {
		return false
	}
	if m.re != nil {
		return m.re.MatchString(name)
	}
	if m.substring {
		return strings.Contains(strings.ToLower(name), strings.ToLower(m.text))
	}
	return strings.EqualFold(name, m.text)
}
