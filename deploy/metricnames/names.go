// Package metricnames says which metric names fleetcheck exports, asked of
// the exporters themselves (agent/metrics, coordinator/metrics), so the
// tests of what deploy/ ships (alert rules, the Grafana dashboard) fail on
// a name no code exports. It holds no list of its own.
package metricnames

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/fleetcheck/fleetcheck/agent/metrics"
	coordmetrics "github.com/fleetcheck/fleetcheck/coordinator/metrics"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// Names are the exported metric names.
type Names struct {
	// Families are every name a fleetcheck daemon exports, as its
	// collectors describe them, with the go_* and process_* collectors
	// both daemons register and up, which Prometheus adds.
	Families map[string]bool
	// Histograms are those that are histograms (their series are
	// NAME_bucket, NAME_sum and NAME_count).
	Histograms map[string]bool
}

// Known reports whether a series name is exported: a family, or the
// _bucket, _sum or _count series of a histogram.
func (n Names) Known(series string) bool {
	if n.Families[series] {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, suf); ok && n.Histograms[base] {
			return true
		}
	}
	return false
}

// recorder keeps what is registered on it, so that every collector can
// describe itself, including series that exist only after events.
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }

var reName = regexp.MustCompile(`fqName: "([^"]+)"`)

// Exported asks both exporters for their names. The histograms are found
// by observing one value in each and gathering: a registry says a
// family's type only for series it has.
func Exported() (Names, error) {
	n := Names{Families: map[string]bool{"up": true}, Histograms: map[string]bool{}}
	rec := &recorder{cs: []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})}}
	if _, err := metrics.NewAgent(rec, metrics.AgentInfo{Node: "n"}); err != nil {
		return n, err
	}
	if _, err := coordmetrics.NewCoordinator(rec); err != nil {
		return n, err
	}
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, c := range rec.cs {
			c.Describe(ch)
		}
		close(ch)
	}()
	for d := range ch {
		if m := reName.FindStringSubmatch(d.String()); m != nil {
			n.Families[m[1]] = true
		}
	}

	// One registry each, as the daemons have (both export
	// fleetcheck_build_info, the agent's with node).
	areg, creg := prometheus.NewRegistry(), prometheus.NewRegistry()
	am, err := metrics.NewAgent(areg, metrics.AgentInfo{Node: "n"})
	if err != nil {
		return n, err
	}
	am.PassDone("", &report.Report{Status: report.Pass, Checks: []report.CheckResult{{Name: "gpu.ecc", Status: report.Pass}}}, time.Second)
	cm, err := coordmetrics.NewCoordinator(creg)
	if err != nil {
		return n, err
	}
	cm.StoreCommit(1, time.Millisecond)
	for _, g := range []prometheus.Gatherer{areg, creg} {
		fams, err := g.Gather()
		if err != nil {
			return n, err
		}
		for _, f := range fams {
			if f.GetType() == dto.MetricType_HISTOGRAM {
				n.Histograms[f.GetName()] = true
			}
		}
	}
	if len(n.Families) < 40 || len(n.Histograms) < 3 {
		return n, fmt.Errorf("only %d metric names and %d histograms described: %v", len(n.Families), len(n.Histograms), n.Families)
	}
	return n, nil
}
