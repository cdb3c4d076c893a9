package burnin

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestParseSpecDefaults(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		level   Level
		steps   []string
		repeats int
		metrics []string
	}{
		{Quick, []string{"passive"}, 1, nil},
		{Standard, []string{"passive", "dcgm-r2", "allreduce-sweep", "pcie-bandwidth", "passive-after"}, 1,
			[]string{MetricBusBW, MetricPCIeH2D, MetricPCIeD2H}},
		{Extended, []string{"passive", "dcgm-r3", "allreduce-sweep", "pcie-bandwidth", "gpu-stress", "passive-after", "allreduce-pairs"}, 3,
			[]string{MetricBusBW, MetricPCIeH2D, MetricPCIeD2H, MetricPairBusBW}},
	} {
		s, err := ParseSpec([]byte("selector: sku=h100\nlevel: " + string(c.level) + "\n"))
		if err != nil {
			t.Fatalf("%s: %v", c.level, err)
		}
		var names []string
		for _, st := range s.Suite.Steps {
			names = append(names, st.Name)
		}
		if strings.Join(names, ",") != strings.Join(c.steps, ",") {
			t.Errorf("%s steps %v", c.level, names)
		}
		if s.Repeats != c.repeats || s.Suite.Name != "burnin."+string(c.level) {
			t.Errorf("%s: repeats %d suite %s", c.level, s.Repeats, s.Suite.Name)
		}
		var ms []string
		for _, m := range s.Metrics {
			ms = append(ms, m.Name)
		}
		if strings.Join(ms, ",") != strings.Join(c.metrics, ",") {
			t.Errorf("%s metrics %v", c.level, ms)
		}
		if s.Outlier.MinShortfall != 0.10 || s.Outlier.MADs != 3 || s.Baseline.MaxDeviation != 0.30 || s.Baseline.Missing != MissingReject {
			t.Errorf("%s rule defaults %+v %+v", c.level, s.Outlier, s.Baseline)
		}
	}
	// One run is at most the coordinator's 1h: a stress that cannot fit is
	// refused at start, not rejected as inconclusive on every node later.
	if _, err := ParseSpec([]byte("{selector: a=b, level: extended, stress_duration: 2h}")); err == nil || !strings.Contains(err.Error(), "stress_duration 2h0m0s") {
		t.Fatalf("2h stress: %v", err)
	}
	s, err := ParseSpec([]byte("{selector: a=b, level: extended, stress_duration: 45m}"))
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range s.Suite.Steps {
		if st.Name == "gpu-stress" && (st.Params["duration"] != "45m0s" || time.Duration(st.Timeout) != 55*time.Minute) {
			t.Errorf("stress step %+v", st)
		}
	}
	for _, c := range PassiveChecks() {
		if c == "nccl.allreduce" || c == "dcgm.diag" {
			t.Errorf("%s listed as passive", c)
		}
	}
}

func TestParseSpecRejects(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, yaml, want string }{
		{"unknown key", "selector: a=b\nlevel: quick\nrepeat: 3\n", "repeat"},
		{"no selector", "level: quick\n", "selector"},
		{"bad selector", "selector: 'a in (b'\nlevel: quick\n", "selector"},
		{"no level", "selector: a=b\n", "level"},
		{"bad level", "selector: a=b\nlevel: heavy\n", "level"},
		{"repeats", "selector: a=b\nlevel: quick\nrepeats: 50\n", "repeats"},
		{"reject_on without error", "selector: a=b\nlevel: quick\nreject_on: [fail]\n", "reject_on"},
		{"outlier share", "selector: a=b\nlevel: quick\noutlier: {min_shortfall: 1.5}\n", "min_shortfall"},
		{"min peers", "selector: a=b\nlevel: quick\noutlier: {min_peers: 2}\n", "min_peers"},
		{"missing policy", "selector: a=b\nlevel: quick\nbaseline: {missing: ignore}\n", "missing"},
		{"shell in a param", "selector: a=b\nlevel: quick\nsuite: {name: s, steps: [{name: x, kind: checks, checks: [gpu.xid], params: {a: '$(reboot)'}}]}\n", "param"},
		{"action with checks", "selector: a=b\nlevel: quick\nsuite: {name: s, steps: [{name: x, kind: action, action: gpu-burn, checks: [gpu.xid]}]}\n", "action"},
		{"pairs two checks", "selector: a=b\nlevel: quick\nsuite: {name: s, steps: [{name: x, kind: pairs, checks: [nccl.allreduce, gpu.xid]}]}\n", "pairs"},
		{"duplicate step", "selector: a=b\nlevel: quick\nsuite: {name: s, steps: [{name: x, kind: checks, checks: [gpu.xid]}, {name: x, kind: checks, checks: [gpu.ecc]}]}\n", "twice"},
		{"metric name", "selector: a=b\nlevel: quick\nmetrics: [{name: BusBW}]\n", "metric"},
		{"two documents", "selector: a=b\nlevel: quick\n---\nselector: c=d\n", "document"},
		{"empty", "", "empty"},
	} {
		_, err := ParseSpec([]byte(c.yaml))
		if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// TestShippedSpecs loads examples/burnin.yaml and every YAML block of
// docs/burnin.md, so the documentation cannot drift from the code.
func TestShippedSpecs(t *testing.T) {
	t.Parallel()
	ex, err := os.ReadFile("../../examples/burnin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseSpec(ex); err != nil {
		t.Errorf("examples/burnin.yaml: %v", err)
	}
	doc, err := os.ReadFile("../../docs/burnin.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) == 0 {
		t.Fatal("docs/burnin.md has no yaml blocks")
	}
	for i, b := range blocks {
		if _, err := ParseSpec(b[1]); err != nil {
			t.Errorf("docs/burnin.md block %d: %v", i+1, err)
		}
	}
}
