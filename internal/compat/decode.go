package compat

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// maxNodes bounds the nodes one matrix may expand to: aliases let a small
// document name a huge tree, and a matrix is a few hundred lines at most.
const maxNodes = 20000

// decoder walks a YAML node tree by hand so that every error names its line
// and field, and unknown keys are rejected whatever the caller's decoder
// settings (yaml.Node.Decode does not inherit KnownFields).
type decoder struct {
	budget int
}

type keyVal struct {
	key string
	val *yaml.Node
}

func (d *decoder) errf(n *yaml.Node, path, format string, a ...any) error {
	return fmt.Errorf("%w: line %d: %s: %s", ErrInvalid, n.Line, path, fmt.Sprintf(format, a...))
}

func (d *decoder) wrap(n *yaml.Node, path string, err error) error {
	return fmt.Errorf("%w: line %d: %s: %w", ErrInvalid, n.Line, path, err)
}

// resolve follows aliases and spends the node budget.
func (d *decoder) resolve(n *yaml.Node, path string) (*yaml.Node, error) {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i > 100 {
			return nil, d.errf(n, path, "alias chain too long")
		}
		n = n.Alias
	}
	if n == nil {
		return nil, fmt.Errorf("%w: %s: missing value", ErrInvalid, path)
	}
	d.budget--
	if d.budget < 0 {
		return nil, d.errf(n, path, "document too large (more than %d nodes after aliases)", maxNodes)
	}
	return n, nil
}

// mapping returns a mapping's entries in order, rejecting unknown and
// repeated keys.
func (d *decoder) mapping(n *yaml.Node, path string, allowed []string) ([]keyVal, error) {
	n, err := d.resolve(n, path)
	if err != nil {
		return nil, err
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, d.errf(n, path, "want a mapping of %s, got %s", keyList(allowed), kindName(n))
	}
	out := make([]keyVal, 0, len(n.Content)/2)
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, err := d.resolve(n.Content[i], path)
		if err != nil {
			return nil, err
		}
		if k.Kind != yaml.ScalarNode {
			return nil, d.errf(k, path, "keys must be plain names")
		}
		if k.Tag == "!!merge" {
			return nil, d.errf(k, path, "merge keys (<<) are not supported")
		}
		if !contains(allowed, k.Value) {
			return nil, d.errf(k, path, "unknown key %q (allowed: %s)", k.Value, keyList(allowed))
		}
		if seen[k.Value] {
			return nil, d.errf(k, path, "key %q repeated", k.Value)
		}
		seen[k.Value] = true
		out = append(out, keyVal{k.Value, n.Content[i+1]})
	}
	return out, nil
}

// seq calls fn for each element of a non-empty sequence.
func (d *decoder) seq(n *yaml.Node, path string, fn func(int, *yaml.Node) error) error {
	n, err := d.resolve(n, path)
	if err != nil {
		return err
	}
	if n.Kind != yaml.SequenceNode {
		return d.errf(n, path, "want a list, got %s", kindName(n))
	}
	if len(n.Content) == 0 {
		return d.errf(n, path, "empty list (leave the key out instead)")
	}
	for i, e := range n.Content {
		if err := fn(i, e); err != nil {
			return err
		}
	}
	return nil
}

// scalar returns a non-empty scalar's text. Values are read as written, so
// `cuda: 12.10` stays "12.10" instead of becoming the float 12.1.
func (d *decoder) scalar(n *yaml.Node, path string) (string, error) {
	n, err := d.resolve(n, path)
	if err != nil {
		return "", err
	}
	if n.Kind != yaml.ScalarNode {
		return "", d.errf(n, path, "want a single value, got %s", kindName(n))
	}
	if n.Tag == "!!null" {
		return "", d.errf(n, path, "missing value")
	}
	s := strings.TrimSpace(n.Value)
	if s == "" {
		return "", d.errf(n, path, "empty value")
	}
	return s, nil
}

// scalars accepts one value or a non-empty list of values.
func (d *decoder) scalars(n *yaml.Node, path string) ([]string, []*yaml.Node, error) {
	r, err := d.resolve(n, path)
	if err != nil {
		return nil, nil, err
	}
	if r.Kind != yaml.SequenceNode {
		s, err := d.scalar(r, path)
		return []string{s}, []*yaml.Node{r}, err
	}
	var out []string
	var nodes []*yaml.Node
	err = d.seq(r, path, func(i int, e *yaml.Node) error {
		s, err := d.scalar(e, fmt.Sprintf("%s[%d]", path, i))
		out = append(out, s)
		nodes = append(nodes, e)
		return err
	})
	return out, nodes, err
}

func (d *decoder) spec(n *yaml.Node, path string) (spec, error) {
	s, err := d.scalar(n, path)
	if err != nil {
		return spec{}, err
	}
	sp, err := parseSpec(s)
	if err != nil {
		return sp, d.wrap(n, fmt.Sprintf("%s %q", path, s), err)
	}
	return sp, nil
}

func (d *decoder) specList(n *yaml.Node, path string) (specList, error) {
	vals, nodes, err := d.scalars(n, path)
	if err != nil {
		return nil, err
	}
	out := make(specList, 0, len(vals))
	for i, v := range vals {
		sp, err := parseSpec(v)
		if err != nil {
			return nil, d.wrap(nodes[i], fmt.Sprintf("%s %q", path, v), err)
		}
		out = append(out, sp)
	}
	return out, nil
}

func (d *decoder) stackList(n *yaml.Node, path string) (stackList, error) {
	vals, nodes, err := d.scalars(n, path)
	if err != nil {
		return nil, err
	}
	out := make(stackList, 0, len(vals))
	for i, v := range vals {
		ss, err := parseStackSpec(v)
		if err != nil {
			return nil, d.wrap(nodes[i], fmt.Sprintf("%s %q", path, v), err)
		}
		out = append(out, ss)
	}
	return out, nil
}

func (d *decoder) matcher(n *yaml.Node, path string, substring bool) (matcher, error) {
	s, err := d.scalar(n, path)
	if err != nil {
		return matcher{}, err
	}
	m, err := parseMatcher(s, substring)
	if err != nil {
		return m, d.wrap(n, fmt.Sprintf("%s %q", path, s), err)
	}
	return m, nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "an unexpected node"
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func keyList(keys []string) string { return strings.Join(keys, ", ") }

var _ yaml.Unmarshaler = (*Matrix)(nil)
