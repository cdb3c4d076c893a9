package compat

import (
	"errors"
	"strings"
	"testing"
)

func TestCompareVersions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b string
		want int
	}{
		{"535.161.08", "535.161.7", 1}, // numeric, not text: 08 > 7
		{"535.161.07", "535.161.7", 0}, // leading zeros do not count
		{"535.129.03", "535.129.03", 0},
		{"535.104", "535.104.05", -1}, // 2-part vs 3-part: missing segment is 0
		{"535.104", "535.104.0", 0},
		{"535.104.0.0", "535.104", 0},
		{"560", "559.99.99", 1},
		{"570.133.20", "570.86.15", 1},
		{"550.54.14", "550.54.15", -1},
		{"28.39.1002", "28.39.1001", 1},
		{"28.39.1002", "28.40.0", -1},
		{"6.5.0-1007-nvidia", "6.5.0-1007", 1}, // text after a version sorts after it
		{"6.5.0-1007-nvidia", "6.5.0-1010-nvidia", -1},
		{"6.5.0-1007-nvidia", "6.6", -1},
		{"6.5.0-1007-generic", "6.5.0-1007-nvidia", -1},
		{"23.10-1.1.9.0", "23.10", 1},
		{"23.10-1.1.9.0", "24.01-0.3.3.1", -1},
		{"1.2", "1-2", 0},                                         // separators are equivalent
		{"99999999999999999999999", "99999999999999999999998", 1}, // longer than int64
		{"", "", 0},
		{"", "0", 0},
		{"1", "", 1},
		{"1.a", "1.1", 1}, // a number sorts before text
		{"1..2", "1.2", 0},
		{" 535.129.03 ", "535.129.03", 0},
	}
	for _, tc := range tests {
		t.Run(tc.a+"_vs_"+tc.b, func(t *testing.T) {
			t.Parallel()
			if got := CompareVersions(tc.a, tc.b); got != tc.want {
				t.Errorf("CompareVersions(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
			}
			if got := CompareVersions(tc.b, tc.a); got != -tc.want {
				t.Errorf("CompareVersions(%q, %q) = %d, want %d (antisymmetry)", tc.b, tc.a, got, -tc.want)
			}
		})
	}
}

func TestSpecMatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		spec string
		yes  []string
		no   []string
	}{
		{"535.129.03", []string{"535.129.03", "535.129.3"}, []string{"535.129.04", "535.129", "535.129.03.1"}},
		{"=535.129.03", []string{"535.129.03"}, []string{"535.129.02"}},
		{"535.*", []string{"535.129.03", "535", "535.161.08"}, []string{"5350.1", "550.54.14", "53.5"}},
		{"96.00.99.*", []string{"96.00.99.00.01", "96.0.99.0.1"}, []string{"96.00.9.00.01", "96.00.74.00.02"}},
		{">=535.104, <560", []string{"535.104", "535.104.05", "550.54.14", "559.99"}, []string{"535.103.99", "560", "560.0.1", "570.133.20"}},
		{">535.104", []string{"535.104.01"}, []string{"535.104", "535.104.0"}},
		{"<=550", []string{"550", "550.0.0", "549.9"}, []string{"550.0.1"}},
		{"!=550.54.14", []string{"550.54.15"}, []string{"550.54.14"}},
		{"535.*, !=535.54.03", []string{"535.129.03"}, []string{"535.54.03", "550.1"}},
		{"!=535.*", []string{"550.54.14"}, []string{"535.129.03"}},
		{">= 28.39.1002", []string{"28.39.1002", "v28.39.1002", "28.40.1000"}, []string{"28.39.1001", "22.39.1002"}},
		{"*", []string{"anything", "1"}, nil},
		{`re:^6\.5\.0-\d+-nvidia$`, []string{"6.5.0-1007-nvidia"}, []string{"6.5.0-1007-generic", "6.8.0-1007-nvidia"}},
		{">=6.5.0-1007, <6.6", []string{"6.5.0-1007-nvidia", "6.5.0-1010-nvidia"}, []string{"6.5.0-1006-nvidia", "6.8.0-40-generic"}},
		{"v2.9", []string{"2.9", "2.9.0"}, []string{"2.10"}},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			t.Parallel()
			sp, err := parseSpec(tc.spec)
			if err != nil {
				t.Fatalf("parseSpec(%q): %v", tc.spec, err)
			}
			for _, v := range tc.yes {
				if !sp.match(v) {
					t.Errorf("%q should match %q", tc.spec, v)
				}
			}
			for _, v := range tc.no {
				if sp.match(v) {
					t.Errorf("%q should not match %q", tc.spec, v)
				}
			}
		})
	}
}

func TestParseSpecErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		spec, want string
	}{
		{"", "empty version rule"},
		{">=560, <535", "matches no version"},
		{">535, <535", "matches no version"},
		{">=535, <535", "matches no version"},
		{"=535.129.03, >=550", "matches no version"},
		{"535.*, >=536", "matches no version"},
		{"535.*, <535", "matches no version"},
		{"535.129.03, !=535.129.03", "matches no version"},
		{">=abc", "must start with a digit"},
		{">=", "missing version"},
		{"535..129", "empty segment"},
		{"535.", "ends with a separator"},
		{"535.129.03,", "empty clause"},
		{">=535.*", "cannot be used with >="},
		{"*, 535", `"*" stands alone`},
		{"re:", "empty regular expression"},
		{"re:([", "bad regular expression"},
		{"535 129", "unexpected character"},
		{"535*", "write it as VERSION.*"},
		{"=*", `"*" stands alone`},
		{"5*5.*", "unexpected character"},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			t.Parallel()
			_, err := parseSpec(tc.spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("parseSpec(%q) = %v, want error containing %q", tc.spec, err, tc.want)
			}
			if strings.Contains(tc.want, "matches no version") && !errors.Is(err, errEmptyRange) {
				t.Errorf("want errEmptyRange, got %v", err)
			}
		})
	}
}

func TestSpecValidEdges(t *testing.T) {
	t.Parallel()
	// Ranges that look empty but are not.
	for _, s := range []string{">=535, <=535", "535.*, >=535.104", "535.*, <536", ">535, <535.0.0.1", "96.00.99.*, <=96.00.99.00.01"} {
		if _, err := parseSpec(s); err != nil {
			t.Errorf("parseSpec(%q): %v", s, err)
		}
	}
}

func TestStackSpec(t *testing.T) {
	t.Parallel()
	tests := []struct {
		spec string
		yes  []string
		no   []string
	}{
		{"MLNX_OFED >=23.10", []string{"MLNX_OFED 23.10-1.1.9.0", "MLNX_OFED_LINUX-23.10-1.1.9.0", "mlnx_ofed 24.01-0.3.3.1",
			"MLNX_OFED_LINUX-23.10-1.1.9.0 (OFED-23.10-1.1.9): 6.5.0-1007-nvidia"},
			[]string{"MLNX_OFED 23.07-0.5.0.0", "DOCA 2.10.0", "MLNX_OFED", "inbox"}},
		{"DOCA >=2.9", []string{"DOCA 2.10.0", "DOCA-HOST 2.9.1", "doca_host 3.0.0"}, []string{"DOCA 2.8.0", "MLNX_OFED 23.10-1.1.9.0"}},
		{"DOCA", []string{"DOCA 2.10.0", "DOCA"}, []string{"MLNX_OFED 23.10"}},
		{"inbox", []string{"inbox"}, []string{"MLNX_OFED 23.10"}},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			t.Parallel()
			ss, err := parseStackSpec(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range tc.yes {
				if !ss.match(v) {
					t.Errorf("%q should match %q", tc.spec, v)
				}
			}
			for _, v := range tc.no {
				if ss.match(v) {
					t.Errorf("%q should not match %q", tc.spec, v)
				}
			}
		})
	}
	for _, bad := range []string{"", ">=23.10", "23.10", "MLNX/OFED 23", "MLNX_OFED >=560, <535"} {
		if _, err := parseStackSpec(bad); err == nil {
			t.Errorf("parseStackSpec(%q): want error", bad)
		}
	}
}

// FuzzCompareVersions checks the comparator is a total order that never
// panics, whatever a node reports.
func FuzzCompareVersions(f *testing.F) {
	seeds := [][3]string{
		{"535.161.08", "535.161.7", "535.104"},
		{"6.5.0-1007-nvidia", "6.5.0-1007", "6.6"},
		{"23.10-1.1.9.0", "MLNX_OFED", ""},
		{"1..2", "1.2.0", "1.a"},
		{"0000001", "1", "01.0"},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, a, b, c string) {
		ab, ba := CompareVersions(a, b), CompareVersions(b, a)
		if ab != -ba {
			t.Fatalf("not antisymmetric: %q %q: %d %d", a, b, ab, ba)
		}
		if CompareVersions(a, a) != 0 {
			t.Fatalf("not reflexive: %q", a)
		}
		bc, ac := CompareVersions(b, c), CompareVersions(a, c)
		if ab <= 0 && bc <= 0 && ac > 0 {
			t.Fatalf("not transitive: %q <= %q <= %q but %q > %q", a, b, c, a, c)
		}
		if ab == 0 && bc == 0 && ac != 0 {
			t.Fatalf("equality not transitive: %q %q %q", a, b, c)
		}
		// A branch holds its own prefix.
		if _, err := cleanVersion(a); err == nil && !hasPrefixVersion(a, a) {
			t.Fatalf("%q not in its own branch", a)
		}
		// Parsing a rule never panics, and a rule it accepts can be matched.
		if sp, err := parseSpec(a); err == nil {
			sp.match(b)
		}
	})
}
