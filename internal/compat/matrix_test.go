package compat

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func TestParseErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, doc string
		want      []string // substrings of the error
	}{
		{"empty document", "", []string{"empty document"}},
		{"comments only", "# nothing\n", []string{"empty document"}},
		{"empty mapping", "{}\n", []string{"line 1", "no rules"}},
		{"not a mapping", "- a\n", []string{"line 1", "want a mapping"}},
		{"unknown top key", "gpus:\n  - model: H100\n    drivers: 535.*\ndriver: 535\n", []string{"line 4", `unknown key "driver"`}},
		{"unknown gpu key", "gpus:\n  - model: H100\n    driver: 535.*\n", []string{"line 3", "gpus[0]", `unknown key "driver"`, "drivers"}},
		{"repeated key", "kernels: '*'\nkernels: '*'\n", []string{"line 2", `"kernels" repeated`}},
		{"empty gpu rule", "gpus:\n  - model: H100\n", []string{"line 2", "gpus[0]", "empty rule"}},
		{"gpu without model", "gpus:\n  - drivers: 535.*\n", []string{"line 2", "missing model"}},
		{"empty list", "gpus: []\n", []string{"line 1", "empty list"}},
		{"bad range", "gpus:\n  - model: H100\n    drivers:\n      - 535.*\n      - '>=560, <535'\n", []string{"line 5", "gpus[0].drivers", "matches no version"}},
		{"bad version", "kernels: ['>=six']\n", []string{"line 1", "kernels", "must start with a digit"}},
		{"bad regex", "kernels: 're:(['\n", []string{"line 1", "bad regular expression"}},
		{"null value", "kernels:\n", []string{"line 1", "kernels", "missing value"}},
		{"list where value", "fabric_manager:\n  - driver: [535]\n    version: same\n", []string{"line 2", "fabric_manager[0].driver", "want a single value"}},
		{"fm without version", "fabric_manager:\n  - driver: '*'\n", []string{"line 2", "missing version"}},
		{"fm without driver", "fabric_manager:\n  - version: same\n", []string{"line 2", "missing driver"}},
		{"fm bad version", "fabric_manager:\n  - driver: '*'\n    version: newest\n", []string{"line 3", "must start with a digit"}},
		{"hca empty rule", "hcas:\n  - model: MT4129\n    name: ConnectX-7\n", []string{"line 2", "hcas[0]", "empty rule"}},
		{"hca bad min", "hcas:\n  - model: MT4129\n    min_firmware: latest\n", []string{"line 3", "hcas[0].min_firmware", "must start with a digit"}},
		{"rdma bad", "rdma_stacks: ['>=23.10']\n", []string{"line 1", "rdma_stacks", "stack name"}},
		{"known bad no reason", "known_bad:\n  - when: {driver: 550.54.14}\n", []string{"line 2", "known_bad[0]", "missing reason"}},
		{"known bad empty when", "known_bad:\n  - when: {}\n    reason: x\n", []string{"line 2", "known_bad[0].when", "empty combination"}},
		{"known bad unknown field", "known_bad:\n  - when: {driver: 550.54.14, bios: 96.*}\n    reason: x\n", []string{"line 2", `unknown key "bios"`}},
		{"known bad no when", "known_bad:\n  - reason: x\n", []string{"missing when"}},
		{"merge key", "base: &b {drivers: 535.*}\n", []string{`unknown key "base"`}},
		{"two documents", "kernels: '*'\n---\nkernels: '*'\n", []string{"line 2", "more than one"}},
		{"syntax", "gpus: [\n", []string{"invalid compatibility matrix"}},
		{"number key", "1: x\n", []string{`unknown key "1"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tc.doc))
			if err == nil {
				t.Fatalf("Parse: want error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseAccepts(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, doc string }{
		{"scalar list", "gpus:\n  - model: H100\n    drivers: 535.*\n"},
		{"numbers stay text", "gpus:\n  - model: H100\n    cuda: [12.10, 12.2]\n"},
		{"anchors", "gpus:\n  - model: H100\n    drivers: &d ['535.*']\n  - model: A100\n    drivers: *d\n"},
		{"kernels only", "kernels: ['*']\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := Parse([]byte(tc.doc)); err != nil {
				t.Fatal(err)
			}
		})
	}
	// 12.10 must not become the float 12.1.
	m, err := Parse([]byte("gpus:\n  - model: H100\n    cuda: [12.10]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.gpus[0].cuda.String(); got != "12.10" {
		t.Errorf("cuda rule = %q, want 12.10", got)
	}
}

func TestAliasBudget(t *testing.T) {
	t.Parallel()
	// Aliases let a small document name a large tree; the node budget stops it.
	drivers := strings.Repeat("'1',", 999) + "'1'"
	doc := "gpus:\n  - &r {model: H100, drivers: [" + drivers + "]}\n"
	if _, err := Parse([]byte(doc + strings.Repeat("  - *r\n", 5))); err != nil {
		t.Fatalf("aliases within budget: %v", err)
	}
	_, err := Parse([]byte(doc + strings.Repeat("  - *r\n", 25)))
	if err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("alias expansion: %v", err)
	}
}

func TestUnmarshalInline(t *testing.T) {
	t.Parallel()
	var cfg struct {
		Matrix *Matrix `yaml:"matrix"`
	}
	doc := "matrix:\n  kernels: ['>=6.5, <6.6']\n  gpus:\n    - model: H100\n      drivers: 535.*\n"
	if err := yaml.Unmarshal([]byte(doc), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Matrix == nil || len(cfg.Matrix.gpus) != 1 || len(cfg.Matrix.kernels) != 1 {
		t.Fatalf("matrix not decoded: %+v", cfg.Matrix)
	}
	// Unknown keys are rejected inline too, with the line in the outer document.
	bad := "matrix:\n  gpus:\n    - model: H100\n      drivres: 535.*\n"
	err := yaml.Unmarshal([]byte(bad), &cfg)
	if err == nil || !strings.Contains(err.Error(), "line 4") || !strings.Contains(err.Error(), `unknown key "drivres"`) {
		t.Fatalf("inline unknown key: %v", err)
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	t.Parallel()
	m, err := Load(filepath.Join("..", "..", "examples", "matrix.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := Parse(out)
	if err != nil {
		t.Fatalf("re-parse:\n%s\n%v", out, err)
	}
	out2, err := yaml.Marshal(m2)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != string(out2) {
		t.Errorf("round trip changed the matrix:\n%s\n---\n%s", out, out2)
	}
	n := pinnedNode()
	if a, b := m.Evaluate(n), m2.Evaluate(n); !reflect.DeepEqual(stripRefs(a), stripRefs(b)) {
		t.Errorf("verdicts differ after round trip:\n%+v\n%+v", a, b)
	}
}

// stripRefs drops line numbers, which a re-marshalled document changes.
func stripRefs(v Verdict) Verdict {
	for i := range v.Violations {
		v.Violations[i].Rule = ""
	}
	return v
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	p := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(p, []byte("gpus:\n  - model: H100\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("bad file: %v", err)
	}
}
