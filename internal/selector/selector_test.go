package selector

import (
	"errors"
	"strings"
	"testing"
)

var h100 = map[string]string{"sku": "h100", "rack": "r1", "leaf": "l7", "name": "label-name"}
var a100 = map[string]string{"sku": "a100", "rack": "r3"}

func TestMatches(t *testing.T) {
	t.Parallel()
	tests := []struct {
		sel        string
		h100, a100 bool // gpu-001 carries h100's labels, gpu-002 a100's
	}{
		{"", true, true},
		{"   ", true, true},
		{"sku=h100", true, false},
		{"sku==h100", true, false},
		{"sku = h100", true, false},
		{"sku!=h100", false, true},
		{"sku=h100,rack in (r1,r2)", true, false},
		{"rack in (r2, r3)", false, true},
		{"rack notin (r1)", false, true},
		{"leaf", true, false},
		{"!leaf", false, true},
		{"leaf!=l7", false, true},        // absent key satisfies !=
		{"leaf notin (l7)", false, true}, // and notin
		{"name=gpu-001", true, false},    // name is the node's name, not the label
		{"name in (gpu-001,gpu-002)", true, true},
		{"name!=gpu-001", false, true},
		{"name", true, true},
		{"!name", false, false},
		{"sku=h100,sku=a100", false, false},
		{"sku=", false, false},
		{"missing=", false, false},
		{"rack in (r1,)", true, false},
		{"in in (x)", false, false}, // "in" as a key
		{"!in", true, true},         // and absent
		{"example.com/pool=p1", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.sel, func(t *testing.T) {
			t.Parallel()
			s, err := Parse(tt.sel)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.sel, err)
			}
			if got := s.Matches("gpu-001", h100); got != tt.h100 {
				t.Errorf("gpu-001: got %v, want %v", got, tt.h100)
			}
			if got := s.Matches("gpu-002", a100); got != tt.a100 {
				t.Errorf("gpu-002: got %v, want %v", got, tt.a100)
			}
			again, err := Parse(s.String())
			if err != nil {
				t.Fatalf("reparse %q: %v", s.String(), err)
			}
			if again.String() != s.String() {
				t.Errorf("canonical form not stable: %q then %q", s.String(), again.String())
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		sel  string
		want string // part of the message
	}{
		{"sku=h100,", "expected a label key, found end of selector"},
		{",", "expected a label key, found ','"},
		{"=h100", "expected a label key, found '='"},
		{"rack in r1", "expected '(' after 'in'"},
		{"rack in (r1", "expected ',' or ')' in value list"},
		{"rack in ()", "empty value list"},
		{"rack notin (r1 r2)", "expected ',' or ')'"},
		{"sku h100", "expected '=', '!=', 'in', 'notin'"},
		{"!", "expected a label key after '!'"},
		{"!sku=h100", "expected ',' or end of selector, found '='"},
		{"sku=h1/00", "label value"},
		{"sk$u=h100", "label key"},
		{"/sku=1", "empty prefix"},
		{"a.com/=1", "empty name"},
		{"sku=(h100)", "expected a value after '='"},
		{"sku>1", "label key"},
		{"sku=" + strings.Repeat("x", 300), "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.sel, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(tt.sel)
			if err == nil {
				t.Fatalf("Parse(%q) succeeded, want an error", tt.sel)
			}
			if !errors.Is(err, ErrSyntax) {
				t.Errorf("error does not wrap ErrSyntax: %v", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

func TestRequirements(t *testing.T) {
	t.Parallel()
	s, err := Parse("rack in (r2,r1,r2),!gpu")
	if err != nil {
		t.Fatal(err)
	}
	reqs := s.Requirements()
	if len(reqs) != 2 || reqs[0].Op != OpIn || strings.Join(reqs[0].Values, ",") != "r1,r2" || reqs[1].Op != OpNotExists {
		t.Fatalf("requirements = %+v", reqs)
	}
	reqs[0].Values[0] = "changed"
	if !s.Matches("n", map[string]string{"rack": "r1"}) {
		t.Fatal("Requirements must return a copy")
	}
	if s.String() != "rack in (r1,r2),!gpu" {
		t.Fatalf("String() = %q", s.String())
	}
	if !Everything().Empty() || s.Empty() {
		t.Fatal("Empty")
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "sku=h100,rack in (r1,r2)", "!a,b!=c,d notin (e,,f)", "name=gpu-001", "in in (in)", "a.b/c==d", "x=", "(", "!=", "k in (a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := Parse(in)
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("error does not wrap ErrSyntax: %v", err)
			}
			return
		}
		canon := s.String()
		again, err := Parse(canon)
		if err != nil {
			t.Fatalf("canonical %q of %q does not parse: %v", canon, in, err)
		}
		if again.String() != canon {
			t.Fatalf("canonical form not stable: %q -> %q", canon, again.String())
		}
		labels := map[string]string{"sku": "h100", "rack": "r1", "": ""}
		for _, r := range s.Requirements() {
			for _, v := range r.Values {
				labels[r.Key] = v
			}
		}
		if s.Matches("n", labels) != again.Matches("n", labels) {
			t.Fatalf("%q and its canonical form %q disagree", in, canon)
		}
	})
}
