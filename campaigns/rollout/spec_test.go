package rollout

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// docSpec returns the first yaml block of docs/rollout.md.
func docSpec(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "rollout.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "```yaml\n")
	if !ok {
		t.Fatal("no yaml block in docs/rollout.md")
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("unterminated yaml block")
	}
	return []byte(block)
}

func TestDocsExampleSpec(t *testing.T) {
	t.Parallel()
	s, err := ParseSpec(docSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	if s.Target.Driver != "550.90.07" || s.Target.FabricManager != "same" || s.Target.Firmware.HCA["MT4129"] != "28.39.1002" {
		t.Fatalf("target %+v", s.Target)
	}
	if *s.Canary != 1 || len(s.Waves) != 3 || s.Waves[0].String() != "5%" || s.MaxUnavailable.String() != "5%" {
		t.Fatalf("waves %v max %v", s.Waves, s.MaxUnavailable)
	}
	if s.FailureBudget.Wave.String() != "1%" || s.Soak.D() != 30*time.Minute || s.Approval != ApprovalManual {
		t.Fatalf("budget %v soak %v approval %v", s.FailureBudget, s.Soak, s.Approval)
	}
	if float64(s.Validation.MaxRegression) != 0.30 || len(s.Validation.Checks) != 11 || s.Deadlines.Draining.D() != 2*time.Hour {
		t.Fatalf("validation %+v deadlines %+v", s.Validation, s.Deadlines)
	}
	if p := s.actionParams(); p["version"] != "550.90.07" || p["vbios"] != "96.00.99.00.01" || p["fabric_manager"] != "" {
		t.Fatalf("params %v", p)
	}
	// The same spec can be written out and read back.
	f := filepath.Join(t.TempDir(), "rollout.yaml")
	if err := os.WriteFile(f, docSpec(t), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSpec(f); err != nil {
		t.Fatal(err)
	}
}

func TestSpecDefaults(t *testing.T) {
	t.Parallel()
	s, err := ParseSpec([]byte("target: {driver: 550.90.07}\naction: up\nwaves: [10]\nmax_unavailable: 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	if *s.Canary != 1 || s.Approval != ApprovalManual || s.MaxUnavailableScope != ScopeFleet ||
		s.FailureBudget.Canary.Of(5) != 0 || s.FailureBudget.Wave.Of(5) != 0 ||
		float64(s.Validation.MaxRegression) != DefaultMaxRegression || s.Validation.Baseline != BaselineAuto ||
		!*s.Validation.PreCheck || s.Deadlines.Rebooting.D() != DefaultRebooting ||
		strings.Join(s.Validation.Require, ",") != "gpu.inventory,nccl.allreduce" {
		t.Fatalf("defaults: %+v", s)
	}
}

func TestSpecErrors(t *testing.T) {
	t.Parallel()
	base := "target: {driver: 550.90.07}\naction: up\nwaves: [10]\nmax_unavailable: 3\n"
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"unknown key", base + "wavez: [1]\n", `line 5: unknown key "wavez"`},
		{"unknown nested key", base + "deadlines: {rebooting: 5m, reboot: 3m}\n", `unknown key "reboot"`},
		{"no driver", "action: up\nwaves: [1]\nmax_unavailable: 1\n", "target.driver: missing"},
		{"no action", "target: {driver: 550.90.07}\nwaves: [1]\nmax_unavailable: 1\n", "action: missing"},
		{"no waves", "target: {driver: 550.90.07}\naction: up\nmax_unavailable: 1\n", "waves: missing"},
		{"no max unavailable", "target: {driver: 550.90.07}\naction: up\nwaves: [1]\n", "max_unavailable: missing"},
		{"zero max unavailable", strings.Replace(base, "max_unavailable: 3", "max_unavailable: 0", 1), "max_unavailable: 0: must allow"},
		{"bad percent", strings.Replace(base, "waves: [10]", "waves: [150%]", 1), "want a percentage"},
		{"zero wave", strings.Replace(base, "waves: [10]", "waves: [0]", 1), "waves[0]: 0"},
		{"canary zero", base + "canary: 0\n", "canary: 0"},
		{"canary names", base + "canary: 2\ncanary_nodes: [a]\n", "canary_nodes: 1 names"},
		{"bad duration", base + "soak: soon\n", `"soon": want a duration`},
		{"bad approval", base + "approval: maybe\n", "approval: \"maybe\""},
		{"bad check", base + "validation: {checks: [\"rm -rf\"]}\n", "not a check name"},
		{"require not run", base + "validation: {checks: [gpu.ecc], require: [gpu.xid]}\n", "validation.require"},
		{"regression", base + "validation: {max_regression: 130%}\n", "validation.max_regression"},
		{"bad selector", base + "selector: \"sku in (\"\n", "selector:"},
		{"bad version", "target: {driver: \"550 90\"}\naction: up\nwaves: [1]\nmax_unavailable: 1\n", "not a version"},
		{"bad action", strings.Replace(base, "action: up", "action: \"up; reboot\"", 1), "not an action name"},
		{"short deadline", base + "deadlines: {upgrading: 10ms}\n", "deadlines.upgrading"},
		{"two documents", base + "---\nname: x\n", "more than one YAML document"},
		{"empty", "", "empty document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseSpec([]byte(tc.doc))
			if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
