// Package rules holds the tests of the shipped Prometheus alerting rules.
// The rules are validated two ways: always, by parsing the file and every
// expression with Prometheus' own PromQL parser (a light dependency: the
// parser, not the server) and checking each metric it names is one
// fleetcheck exports; and, where promtool is installed, with `promtool
// check rules` and the promtool unit tests in fleetcheck-rules.test.yml.
package rules

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"text/template"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"

	"github.com/fleetcheck/fleetcheck/deploy/metricnames"
	"github.com/fleetcheck/fleetcheck/internal/needs"
)

const (
	rulesFile = "fleetcheck-rules.yml"
	testsFile = "fleetcheck-rules.test.yml"
)

type ruleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval"`
		Rules    []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert         string            `yaml:"alert"`
	Record        string            `yaml:"record"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for"`
	KeepFiringFor string            `yaml:"keep_firing_for"`
	Labels        map[string]string `yaml:"labels"`
	Annotations   map[string]string `yaml:"annotations"`
}

func load(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true) // a misspelt key would be ignored by a lenient reader
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return f
}

// exported is every metric name fleetcheck exports, asked of the
// exporters themselves.
func exported(t *testing.T) metricnames.Names {
	t.Helper()
	n, err := metricnames.Exported()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// promFuncs are the template functions Prometheus gives annotations; the
// test only needs their names to parse the templates.
func promFuncs() template.FuncMap {
	fm := template.FuncMap{}
	for _, n := range []string{"humanize", "humanize1024", "humanizeDuration", "humanizePercentage", "humanizeTimestamp",
		"query", "first", "label", "value", "strvalue", "args", "reReplaceAll", "safeHtml", "match", "title", "toUpper",
		"toLower", "graphLink", "tableLink", "sortByLabel", "stripPort", "stripDomain", "externalURL", "pathPrefix", "parseDuration", "toTime"} {
		fm[n] = func(...any) any { return nil }
	}
	return fm
}

func TestRulesParse(t *testing.T) {
	t.Parallel()
	f := load(t)
	known := exported(t)
	p := parser.NewParser(parser.Options{})
	groups := map[string]bool{}
	alerts := map[string]bool{}
	for _, g := range f.Groups {
		if g.Name == "" || groups[g.Name] {
			t.Errorf("group %q: empty or repeated name", g.Name)
		}
		groups[g.Name] = true
		if len(g.Rules) == 0 {
			t.Errorf("group %s has no rules", g.Name)
		}
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			if (r.Alert == "") == (r.Record == "") {
				t.Errorf("%s: a rule is an alert or a recording rule", name)
				continue
			}
			if r.Alert != "" {
				if alerts[r.Alert] {
					t.Errorf("alert %s defined twice", r.Alert)
				}
				alerts[r.Alert] = true
				if !strings.HasPrefix(r.Alert, "Fleetcheck") {
					t.Errorf("alert %s: names start with Fleetcheck", r.Alert)
				}
			}
			expr, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("%s: expr %q: %v", name, r.Expr, err)
				continue
			}
			if r.Alert != "" && expr.Type() != parser.ValueTypeVector && expr.Type() != parser.ValueTypeScalar {
				t.Errorf("%s: an alert's expression must be a vector, not %s", name, expr.Type())
			}
			parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
				vs, ok := n.(*parser.VectorSelector)
				if !ok {
					return nil
				}
				m := vs.Name
				if !known.Known(m) {
					t.Errorf("%s: %s is not a metric fleetcheck exports", name, m)
				}
				return nil
			})
			for _, d := range []string{r.For, r.KeepFiringFor} {
				if d == "" {
					continue
				}
				if _, err := model.ParseDuration(d); err != nil {
					t.Errorf("%s: duration %q: %v", name, d, err)
				}
			}
			if r.Alert == "" {
				continue
			}
			switch r.Labels["severity"] {
			case "critical", "warning":
			default:
				t.Errorf("%s: severity %q, want critical or warning", name, r.Labels["severity"])
			}
			switch r.Labels["layer"] {
			case "device", "platform":
			default:
				t.Errorf("%s: layer %q, want device or platform", name, r.Labels["layer"])
			}
			for _, k := range []string{"summary", "description"} {
				a := r.Annotations[k]
				if a == "" {
					t.Errorf("%s: no %s", name, k)
					continue
				}
				// Prometheus wraps annotations with $labels and $value definitions.
				src := "{{$labels := .Labels}}{{$value := .Value}}" + a
				if _, err := template.New(name).Funcs(promFuncs()).Parse(src); err != nil {
					t.Errorf("%s: %s template: %v", name, k, err)
				}
			}
		}
	}
	// The conditions DOMAIN.md lists, each with its alert.
	for _, want := range []string{
		"FleetcheckGPUXidHardware", "FleetcheckGPUXidApplication", "FleetcheckGPUUncorrectableECC",
		"FleetcheckGPURowRemapFailure", "FleetcheckGPURowRemapPending", "FleetcheckGPUTemperatureHigh",
		"FleetcheckGPUThermalSlowdown", "FleetcheckGPUPCIeWidthDegraded", "FleetcheckIBPortDown",
		"FleetcheckIBErrorCountersRising", "FleetcheckNCCLBelowBaseline", "FleetcheckNCCLAllReduceFailed",
		"FleetcheckAgentReportStale", "FleetcheckAgentSpoolGrowing", "FleetcheckNodesFailed",
		"FleetcheckNodesUnreachable", "FleetcheckNodesUnreachableShare",
	} {
		if !alerts[want] {
			t.Errorf("no alert %s", want)
		}
	}
	t.Run("every alert unit-tested", func(t *testing.T) {
		t.Parallel()
		var tf struct {
			RuleFiles []string `yaml:"rule_files"`
			Tests     []struct {
				AlertRuleTest []struct {
					Alertname string `yaml:"alertname"`
					ExpAlerts []any  `yaml:"exp_alerts"`
				} `yaml:"alert_rule_test"`
			} `yaml:"tests"`
		}
		data, err := os.ReadFile(testsFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, &tf); err != nil {
			t.Fatal(err)
		}
		if len(tf.RuleFiles) != 1 || tf.RuleFiles[0] != rulesFile {
			t.Errorf("%s tests %v, want %s", testsFile, tf.RuleFiles, rulesFile)
		}
		fired := map[string]bool{}
		for _, tc := range tf.Tests {
			for _, a := range tc.AlertRuleTest {
				if !alerts[a.Alertname] {
					t.Errorf("%s tests unknown alert %s", testsFile, a.Alertname)
				}
				if len(a.ExpAlerts) > 0 {
					fired[a.Alertname] = true
				}
			}
		}
		for a := range alerts {
			if !fired[a] {
				t.Errorf("alert %s is never seen firing in %s", a, testsFile)
			}
		}
	})
}

// TestPromtool runs promtool's own checks and the rule unit tests when
// promtool is installed (Debian: apt-get install prometheus).
func TestPromtool(t *testing.T) {
	t.Parallel()
	bin := needs.Tool(t, "promtool", "apt-get install prometheus; the rules are still parsed by TestRulesParse")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", testsFile}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
