package escalate

import (
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

// FromCheck turns one check result of node into the events the rules
// read: gpu.xid findings (one per Xid line group the agent saw as new),
// the correctable ECC counters gpu.ecc reports, and the link_downed rise
// ib.counters reports per port.
func FromCheck(node string, c report.CheckResult, at time.Time, job string) []Event {
	var out []Event
	switch c.Name {
	case "gpu.xid":
		for _, f := range c.Findings {
			code, ok := strings.CutPrefix(f.Code, "XID_")
			if !ok {
				continue
			}
			n, err := strconv.Atoi(code)
			if err != nil {
				continue
			}
			out = append(out, Event{At: at, Node: node, Component: f.Component, Kind: KindXid, Xid: n, Job: job})
		}
	case "gpu.ecc":
		for name, v := range c.Metrics {
			if gpu, ok := eccCorrectableGPU(name); ok {
				out = append(out, Event{At: at, Node: node, Component: gpu, Kind: KindECCCorrectable, Total: v})
			}
		}
	case "ib.counters":
		for name, v := range c.Metrics {
			if port, ok := linkDownedPort(name); ok && v > 0 {
				out = append(out, Event{At: at, Node: node, Component: port, Kind: KindLinkFlap, Count: int(v)})
			}
		}
	}
	sortEvents(out)
	return out
}

// EventChecks are the checks FromCheck reads events from.
var EventChecks = []string{"gpu.xid", "gpu.ecc", "ib.counters"}

// MetricChecks are the checks whose metrics FromCheck reads; MetricWanted
// says which of their metrics. A reader of every stored result (the
// remediation feed) reads back only those.
var MetricChecks = []string{"gpu.ecc", "ib.counters"}

// MetricWanted reports whether FromCheck reads check's metric name.
func MetricWanted(check, name string) bool {
	switch check {
	case "gpu.ecc":
		_, ok := eccCorrectableGPU(name)
		return ok
	case "ib.counters":
		_, ok := linkDownedPort(name)
		return ok
	}
	return false
}

// eccCorrectableGPU is the GPU of a gpu.ecc correctable counter,
// gpu3.ecc.volatile_correctable_count: GPU3.
func eccCorrectableGPU(name string) (string, bool) {
	gpu, rest, ok := strings.Cut(name, ".")
	if !ok || rest != "ecc.volatile_correctable_count" || !strings.HasPrefix(gpu, "gpu") {
		return "", false
	}
	return "GPU" + strings.TrimPrefix(gpu, "gpu"), true
}

// linkDownedPort is the port of an ib.counters link_downed rise,
// ib.mlx5_0.port1.link_downed_rise_count: mlx5_0/1.
func linkDownedPort(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "ib.")
	if !ok || !strings.HasSuffix(rest, ".link_downed_rise_count") {
		return "", false
	}
	parts := strings.Split(strings.TrimSuffix(rest, ".link_downed_rise_count"), ".")
	if len(parts) != 2 || !strings.HasPrefix(parts[1], "port") {
		return "", false
	}
	return parts[0] + "/" + strings.TrimPrefix(parts[1], "port"), true
}

// sortEvents orders events of one result by component, so map order
// never changes what the rules conclude.
func sortEvents(es []Event) {
	sort.Slice(es, func(i, j int) bool {
		if es[i].Component != es[j].Component {
			return es[i].Component < es[j].Component
		}
		return es[i].Xid < es[j].Xid
	})
}
