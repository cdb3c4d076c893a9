package selector

import (
	"sort"
	"strings"
	"testing"

	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The selector is Kubernetes label-selector syntax (DESIGN). This fuzz target
// parses every input with ours and with apimachinery's, and wherever both
// accept it the two must select the same nodes over a set of label maps
// built from the selector's own keys and values. Where only one accepts it,
// the difference must be one the package comment documents; an
// undocumented difference fails.
func FuzzAgainstKubernetes(f *testing.F) {
	for _, s := range []string{
		"", "sku=h100,rack in (r1,r2)", "!a,b!=c,d notin (e,,f)", "name=gpu-001", "in in (in)",
		"a.b/c==d", "x=", "(", "!=", "k in (a", "k in ()", "k notin (a,b),!j", "gpu>4", "gpu<4",
		"a=b:c", "-a=b", "a=-b", "example.com/sku=h100", "A/b=c", "a==", "a!=", ",", "a,", "a,,b",
		"name", "!name", "name notin (n)", "k in (a,a)", "k=" + strings.Repeat("v", 64),
		strings.Repeat("k", 64) + "=v", "k in(a)", "k=(a)", "k in (a b)", "x = y", "!x=y",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		ours, oerr := Parse(in)
		theirs, kerr := k8slabels.Parse(in)
		switch {
		case oerr == nil && kerr == nil:
			compareMatches(t, in, ours, theirs)
		case oerr == nil:
			if why := onlyOursAccepts(ours); why == "" {
				t.Fatalf("%q: we accept it (%s), Kubernetes refuses it (%v), and no documented difference explains it", in, ours, kerr)
			}
		case kerr == nil:
			if why := onlyKubernetesAccepts(in, theirs); why == "" {
				t.Fatalf("%q: Kubernetes accepts it (%s), we refuse it (%v), and no documented difference explains it", in, theirs, oerr)
			}
		}
	})
}

// compareMatches runs both selectors over label maps made of the
// selector's keys and values; `name` is the node's name in both (ours by
// definition, Kubernetes' by giving it the label).
func compareMatches(t *testing.T, in string, ours Selector, theirs k8slabels.Selector) {
	t.Helper()
	keys, values := map[string]bool{}, map[string]bool{"zz": true, "": true}
	for _, r := range ours.Requirements() {
		keys[r.Key] = true
		for _, v := range r.Values {
			values[v] = true
		}
	}
	ks, vs := sorted(keys), sorted(values)
	maps := []map[string]string{{}}
	for _, k := range ks {
		for _, v := range vs {
			maps = append(maps, map[string]string{k: v})
		}
	}
	for _, v := range vs {
		all := map[string]string{}
		for _, k := range ks {
			all[k] = v
		}
		maps = append(maps, all)
	}
	for _, m := range maps {
		for _, name := range vs {
			if name == "" {
				continue // a node always has a name
			}
			withName := k8slabels.Set{}
			for k, v := range m {
				withName[k] = v
			}
			withName[NameKey] = name
			if got, want := ours.Matches(name, m), theirs.Matches(withName); got != want {
				t.Fatalf("%q on node %q with labels %v: ours %v, Kubernetes %v (parsed as %q and %q)", in, name, m, got, want, ours, theirs)
			}
		}
	}
}

// onlyOursAccepts names the documented difference that makes Kubernetes
// refuse a selector ours accepts, or "" when none does.
func onlyOursAccepts(s Selector) string {
	for _, r := range s.Requirements() {
		if errs := validation.IsQualifiedName(r.Key); len(errs) > 0 {
			return "key " + r.Key + ": " + strings.Join(errs, "; ")
		}
		for _, v := range r.Values {
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				return "value " + v + ": " + strings.Join(errs, "; ")
			}
		}
	}
	return ""
}

// onlyKubernetesAccepts names the documented difference that makes ours
// refuse a selector Kubernetes accepts, or "" when none does.
func onlyKubernetesAccepts(in string, s k8slabels.Selector) string {
	if strings.IndexByte(in, 0) >= 0 {
		return "a NUL byte: Kubernetes' lexer reads it as the end of the selector"
	}
	reqs, _ := s.Requirements()
	for _, r := range reqs {
		switch op := string(r.Operator()); op {
		case "gt", "lt":
			return "the numeric operator " + op
		case "in", "notin":
			// Kubernetes reads "()" as the one value ""; ours refuses it.
			if r.Values().Len() == 1 && r.Values().Has("") && strings.Contains(strings.Join(strings.Fields(in), ""), "()") {
				return "an empty value list"
			}
		}
	}
	return ""
}

func sorted(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
