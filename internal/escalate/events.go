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
			// gpu3.ecc.volatile_correctable_count
			gpu, rest, ok := strings.Cut(name, ".")
			if !ok || rest != "ecc.volatile_correctable_count" || !strings.HasPrefix(gpu, "gpu") {
				continue
			}
			out = append(out, Event{At: at, Node: node, Component: "GPU" + strings.TrimPrefix(gpu, "gpu"), Kind: KindECCCorrectable, Total: v})
		}
	case "ib.counters":
		for name, v := range c.Metrics {
			// ib.mlx5_0.port1.link_downed_rise_count
			rest, ok := strings.CutPrefix(name, "ib.")
			if !ok || !strings.HasSuffix(rest, ".link_downed_rise_count") || v <= 0 {
				continue
			}
			parts := strings.Split(strings.TrimSuffix(rest, ".link_downed_rise_count"), ".")
			if len(parts) != 2 || !strings.HasPrefix(parts[1], "port") {
				continue
			}
			out = append(out, Event{At: at, Node: node, Component: parts[0] + "/" + strings.TrimPrefix(parts[1], "port"), Kind: KindLinkFlap, Count: int(v)})
		}
	}
	sortEvents(out)
	return out
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
