package baselines

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseYAMLForms(t *testing.T) {
	t.Parallel()
	file := `# a comment
format: 1
baselines:
  - metric: nccl.allreduce.busbw_gbps
    scope: sku:H100-SXM-80G-x8-nvlink
    value: 480
    taken_at: 2024-05-06
  - metric: nccl.allreduce2.busbw_gbps
    scope: link:gpu-2|gpu-1
    stack: {driver: " 535.161.08 ", nccl: 2.21.5+cuda12.4}
    samples:
      values: [452, 450, 448]
    taken_at: 2026-01-02T03:04:05.5+01:00
  - metric: nccl.sendrecv.latency_us
    scope: node:gpu-1
    direction: lower
    threshold: 0.5
    value: 10
    samples: {count: 1000, median: 10, mad: 0.5, min: 8, max: 30, values: [30, 8, 10]}
`
	bs, err := ParseYAML([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 3 {
		t.Fatalf("%d entries", len(bs))
	}
	a, b, c := bs[0], bs[1], bs[2]
	if a.Scope != "sku:h100-sxm-80g-x8-nvlink" || a.Value != 480 || a.Samples.Count != 1 || a.Direction != HigherBetter ||
		!a.TakenAt.Equal(time.Date(2024, 5, 6, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("plain value: %v %+v %v", a, a.Samples, a.TakenAt)
	}
	if b.Scope != "link:gpu-1|gpu-2" || b.Value != 450 || b.Samples.MAD != 2 || b.Stack != (Stack{Driver: "535.161.08", NCCL: "2.21.5"}) ||
		!b.TakenAt.Equal(time.Date(2026, 1, 2, 2, 4, 5, 5e8, time.UTC)) {
		t.Errorf("values: %v %+v %+v %v", b, b.Samples, b.Stack, b.TakenAt)
	}
	if c.Direction != LowerBetter || c.Threshold != 0.5 || c.Samples.Count != 1000 || c.Samples.Values[0] != 8 {
		t.Errorf("summary: %v %+v", c, c.Samples)
	}
	if bs, err := ParseYAML([]byte("baselines:\n")); err != nil || len(bs) != 0 {
		t.Errorf("empty list: %v %v", bs, err)
	}
	anchors := "baselines:\n  - &e {metric: nccl.allreduce.busbw_gbps, scope: node:a, value: 1}\n  - *e\n"
	if _, err := ParseYAML([]byte(anchors)); err == nil || !strings.Contains(err.Error(), "given 2 times") {
		t.Errorf("an alias repeating an entry: %v", err)
	}
}

// TestParseYAMLErrors: every bad entry is named, by position, line, metric
// and scope, with what is wrong.
func TestParseYAMLErrors(t *testing.T) {
	t.Parallel()
	entry := func(fields string) string {
		return "baselines:\n  - metric: nccl.allreduce.busbw_gbps\n    scope: node:gpu-1\n" + fields
	}
	tests := []struct {
		name string
		file string
		want []string
	}{
		{"empty file", "", []string{"empty"}},
		{"not a mapping", "- a\n- b\n", []string{"want a mapping"}},
		{"no list", "format: 1\n", []string{"no 'baselines:' list"}},
		{"list is a string", "baselines: nope\n", []string{"must be a list"}},
		{"unknown top-level", "baselines: []\nbaseline: []\n", []string{`unknown field "baseline"`}},
		{"newer format", "format: 2\nbaselines: []\n", []string{"format \"2\""}},
		{"yaml syntax", "baselines: [\n", []string{"baselines file"}},
		{"second document", "baselines: []\n---\nbaselines:\n  - {metric: a.b_gbps, scope: node:a, value: 1}\n", []string{"line 2: a second YAML document"}},
		{"bad second document", "baselines: []\n---\n[\n", []string{"baselines file"}},
		{"entry not a mapping", "baselines:\n  - just a string\n", []string{"entry 1 (line 2)", "must be a mapping"}},
		{"misspelt field", entry("    value: 480\n    treshold: 0.2\n"), []string{"entry 1 (line 2, nccl.allreduce.busbw_gbps at node:gpu-1)", "line 5", `unknown field "treshold"`}},
		{"repeated field", entry("    value: 480\n    value: 470\n"), []string{`field "value" repeated`}},
		{"merge key", "base: &b {value: 480}\nbaselines:\n  - metric: nccl.allreduce.busbw_gbps\n    scope: node:gpu-1\n    <<: *b\n", []string{"unknown field \"base\""}},
		{"merge key in entry", entry("    <<: {value: 480}\n"), []string{"merge keys"}},
		{"unknown stack field", entry("    value: 480\n    stack: {drivers: x}\n"), []string{`unknown field "drivers" in stack`}},
		{"stack not a mapping", entry("    value: 480\n    stack: 535\n"), []string{"stack must be a mapping"}},
		{"bad scope", "baselines:\n  - {metric: nccl.allreduce.busbw_gbps, scope: rack:r1, value: 480}\n", []string{"entry 1 (line 2, nccl.allreduce.busbw_gbps at rack:r1)", "unknown kind"}},
		{"bad metric", "baselines:\n  - {metric: BusBW, scope: node:a, value: 480}\n", []string{"metric \"BusBW\""}},
		{"negative value", entry("    value: -480\n"), []string{"not a positive number"}},
		{"zero value", entry("    value: 0\n"), []string{"value 0 is not a positive number"}},
		{"NaN value", entry("    value: .nan\n"), []string{"not a positive number"}},
		{"infinite value", entry("    value: .inf\n"), []string{"not a positive number"}},
		{"value a string", entry("    value: fast\n"), []string{"cannot unmarshal"}},
		{"nothing to compare with", entry(""), []string{"no value and no samples"}},
		{"value is not the median", entry("    value: 470\n    samples: {values: [480, 490, 500]}\n"), []string{"value 470 is not the samples' median 490"}},
		{"stated median wrong", entry("    samples: {values: [480, 490, 500], median: 480}\n"), []string{"samples median 480 does not match the values (490)"}},
		{"count below values", entry("    samples: {count: 1, values: [480, 490]}\n"), []string{"count 1 is less than the 2 values"}},
		{"count above values, no summary", entry("    samples: {count: 10, values: [480]}\n"), []string{"needs median, mad, min, max"}},
		{"samples empty", entry("    samples: {}\n"), []string{"give values, or count"}},
		{"negative sample", entry("    samples: {values: [-1, 480]}\n"), []string{"sample 1 is -1"}},
		{"summary out of order", entry("    samples: {count: 5, median: 480, mad: 1, min: 490, max: 500}\n"), []string{"out of order"}},
		{"no direction", "baselines:\n  - {metric: nccl.allreduce.wrong_count, scope: node:a, value: 1}\n", []string{"add direction"}},
		{"bad direction", entry("    value: 480\n    direction: up\n"), []string{`direction "up"`}},
		{"negative threshold", entry("    value: 480\n    threshold: -0.3\n"), []string{"threshold -0.3"}},
		{"bad time", entry("    value: 480\n    taken_at: yesterday\n"), []string{"taken_at yesterday"}},
		{"negative version", entry("    value: 480\n    version: -1\n"), []string{"version -1"}},
		{"control character", entry("    value: 480\n    who: \"a\\u0007b\"\n"), []string{"who: control character"}},
		{"duplicate key", "baselines:\n  - {metric: nccl.allreduce.busbw_gbps, scope: link:a|b, value: 480}\n  - {metric: nccl.allreduce.busbw_gbps, scope: link:b|a, value: 470}\n",
			[]string{"link:a|b", "given 2 times"}},
		{"duplicate versions", "baselines:\n  - {metric: nccl.allreduce.busbw_gbps, scope: node:a, value: 480, version: 1}\n  - {metric: nccl.allreduce.busbw_gbps, scope: node:a, value: 470, version: 1}\n",
			[]string{"given 2 times"}},
		{"several bad entries", "baselines:\n  - {metric: nccl.allreduce.busbw_gbps, scope: node:a, value: -1}\n  - {metric: nccl.allreduce.busbw_gbps, scope: node:b, value: 480}\n  - {metric: nccl.allreduce.busbw_gbps, scope: node:c}\n",
			[]string{"2 bad entries", "entry 1 (line 2, nccl.allreduce.busbw_gbps at node:a)", "entry 3 (line 4, nccl.allreduce.busbw_gbps at node:c)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseYAML([]byte(tc.file))
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error is not ErrInvalid: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestParseYAMLBoundsErrorList(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("baselines:\n")
	for range 50 {
		b.WriteString("  - {metric: nccl.allreduce.busbw_gbps, scope: rack:r1, value: 1}\n")
	}
	_, err := ParseYAML([]byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "50 bad entries") || !strings.Contains(err.Error(), "and 30 more") {
		t.Errorf("error: %v", err)
	}
	if n := strings.Count(err.Error(), "\n"); n > maxReportedErrs+2 {
		t.Errorf("error has %d lines", n)
	}
	big := make([]byte, maxImportBytes+1)
	if _, err := ParseYAML(big); !errors.Is(err, ErrInvalid) {
		t.Errorf("oversized file: %v", err)
	}
}

// TestMarshalParseRoundTrip: what MarshalYAML writes, ParseYAML reads back
// unchanged.
func TestMarshalParseRoundTrip(t *testing.T) {
	t.Parallel()
	refs, err := Reference()
	if err != nil {
		t.Fatal(err)
	}
	b := sampled(Key{Metric: MetricAllReduce2BusBW, Scope: LinkScope("n1", "n2"), Stack: stackA}, 0.1, 1e-7, 3.14159265358979, 1e300)
	b.TakenAt, b.Threshold, b.Note = time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), 0.25, "line one\nline: two #not a comment"
	b, err = b.normalize()
	if err != nil {
		t.Fatal(err)
	}
	in := append(refs, b)
	data, err := MarshalYAML(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ParseYAML(data)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	if len(out) != len(in) {
		t.Fatalf("%d back, want %d", len(out), len(in))
	}
	for i := range in {
		if !sameBaseline(in[i], out[i]) {
			t.Errorf("entry %d:\n got %v %+v\nwant %v %+v", i, out[i], out[i], in[i], in[i])
		}
	}
}

// sameBaseline compares everything a file carries.
func sameBaseline(a, b Baseline) bool {
	return a.Key == b.Key && a.sameValue(b) && a.TakenAt.Equal(b.TakenAt) &&
		a.Who == b.Who && a.FromRun == b.FromRun && a.Note == b.Note
}
