package ib

import (
	"fmt"
	"sort"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Ports is ib.ports: every HCA port's state, physical state and rate.
//
//   - A port whose physical link is not LinkUp fails IB_PORT_DOWN (action
//     reseat: a cable or transceiver is the usual cause).
//   - A port whose physical link is LinkUp but whose logical state is not
//     ACTIVE (DOWN, INIT, ARMED) fails IB_PORT_LOGICAL_DOWN with action
//     monitor: the cable trained, so reseating it would not help; the
//     subnet manager has not activated the port (SM not running or not
//     reaching this port, the port's GUID missing from its partition
//     configuration). The fix is at the SM, and the message says so; the
//     node itself is drained through IB_PORTS_MISSING when expect.ib_ports
//     counts the port.
//   - A port whose state could not be read warns IB_PORT_STATE_UNKNOWN.
//   - With expect.ib_rate_gbps, an active InfiniBand port slower than that
//     fails IB_RATE_LOW (reseat: a down-trained link).
//   - Ports no expectation covers (all of them without one, Ethernet ports
//     always) are compared with their siblings: active ports of the same HCA
//     model AND link layer on this node. A port slower than the fastest
//     sibling fails IB_RATE_BELOW_SIBLINGS. A 200G BlueField Ethernet port is
//     therefore never judged against 400G ConnectX-7 InfiniBand ports.
//   - With expect.ib_ports, fewer active InfiniBand ports than expected fails
//     IB_PORTS_MISSING on the node (action drain: the node cannot reach its
//     multi-node bandwidth until the ports are back, whatever the cause).
//   - Files the probe could not read warn IB_SYSFS_UNREADABLE (action
//     monitor), naming the file; everything else is still judged.
//
// Metrics: ib.<hca>.port<n>.rate_gbps per active port with a known rate,
// ib.ports.active_count (active InfiniBand ports, what expect.ib_ports
// counts) and ib.ports.total_count (all ports read).
type Ports struct{}

var _ checks.Check = Ports{}

// Name is the check's fixed name.
func (Ports) Name() string { return "ib.ports" }

// Needs the adapter tree: without it there is nothing to judge.
func (Ports) Needs() []snapshot.Source { return []snapshot.Source{snapshot.SrcInfiniBand} }

// Disruptive is false: the check only reads the snapshot.
func (Ports) Disruptive() bool { return false }

// siblingKey groups ports that should run at the same rate.
type siblingKey struct{ model, linkLayer string }

type portRef struct {
	hca  *snapshot.HCA
	port *snapshot.IBPort
}

// Run judges the snapshot's ports.
func (Ports) Run(in checks.Input) checks.Result {
	exp := conf(in).Expect
	res := checks.Result{Status: report.Pass}
	var hcas []snapshot.HCA
	if in.Snap != nil {
		hcas = in.Snap.HCAs
	}

	total, activeIB := 0, 0
	groups := map[siblingKey][]portRef{}
	for hi := range hcas {
		h := &hcas[hi]
		addReadErrors(&res, h)
		for pi := range h.Ports {
			p := &h.Ports[pi]
			total++
			comp := checks.PortComponent(h.Name, p.Port)
			if !judgeState(&res, comp, p) {
				continue
			}
			// A port that is not up shows a meaningless rate: leave it out.
			if p.RateGbps > 0 {
				res.Metric(portMetric(h.Name, p.Port, "rate_gbps"), p.RateGbps)
			}
			ib := p.LinkLayer == linkLayerInfiniBand
			if ib {
				activeIB++
			}
			switch {
			case exp.IBRateGbps > 0 && ib && p.RateGbps <= 0:
				res.Add(report.Finding{
					Severity: report.SevWarn, Component: comp, Code: CodeRateUnknown, Action: report.ActionMonitor,
					Message: fmt.Sprintf("rate unknown; expected %s Gb/s", num(exp.IBRateGbps)),
				})
			case exp.IBRateGbps > 0 && ib:
				if p.RateGbps < exp.IBRateGbps {
					res.Add(report.Finding{
						Severity: report.SevFail, Component: comp, Code: CodeRateLow, Action: report.ActionReseat,
						Message: fmt.Sprintf("rate %s Gb/s (%s) is below the expected %s Gb/s: link trained down",
							num(p.RateGbps), p.RateText, num(exp.IBRateGbps)),
					})
				}
			case p.RateGbps > 0 && h.Model != "" && p.LinkLayer != "":
				k := siblingKey{h.Model, p.LinkLayer}
				groups[k] = append(groups[k], portRef{h, p})
			}
		}
	}
	judgeSiblings(&res, groups)

	if exp.IBPorts > 0 && activeIB < exp.IBPorts {
		res.Add(report.Finding{
			Severity: report.SevFail, Component: checks.NodeComponent, Code: CodePortsMissing, Action: report.ActionDrain,
			Message: fmt.Sprintf("%d of %d expected InfiniBand ports are ACTIVE/LinkUp", activeIB, exp.IBPorts),
		})
	}
	res.Metric("ib.ports.active_count", float64(activeIB))
	res.Metric("ib.ports.total_count", float64(total))
	if total == 0 && len(res.Findings) == 0 {
		res.Status = report.Skip
		if len(hcas) == 0 {
			res.Reason = "no InfiniBand HCAs"
		} else {
			res.Reason = "HCAs have no ports"
		}
	}
	return res
}

// judgeState reports a port that is not up, and whether it is up (only up
// ports have a meaningful rate).
func judgeState(res *checks.Result, comp string, p *snapshot.IBPort) bool {
	down := p.State != "" && p.State != stateActive || p.PhysState != "" && p.PhysState != physLinkUp
	switch {
	case down && p.PhysState == physLinkUp:
		res.Add(report.Finding{
			Severity: report.SevFail, Component: comp, Code: CodePortLogicalDown, Action: report.ActionMonitor,
			Message: fmt.Sprintf("port is %s/%s: the link is physically up but the subnet manager has not made the port %s; "+
				"check the SM (is it running and reaching this port, is the port GUID in its partition config), not the cable",
				p.State, p.PhysState, stateActive),
		})
		return false
	case down:
		res.Add(report.Finding{
			Severity: report.SevFail, Component: comp, Code: CodePortDown, Action: report.ActionReseat,
			Message: fmt.Sprintf("port is %s/%s, want %s/%s", orUnknown(p.State), orUnknown(p.PhysState), stateActive, physLinkUp),
		})
		return false
	case p.State == "" || p.PhysState == "":
		res.Add(report.Finding{
			Severity: report.SevWarn, Component: comp, Code: CodePortStateUnknown, Action: report.ActionMonitor,
			Message: fmt.Sprintf("port state could not be read (state %s, phys_state %s)", orUnknown(p.State), orUnknown(p.PhysState)),
		})
		return false
	}
	return true
}

// judgeSiblings fails ports slower than the fastest active port of the same
// model and link layer: identical adapters on one node should train alike.
func judgeSiblings(res *checks.Result, groups map[siblingKey][]portRef) {
	keys := make([]siblingKey, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].model != keys[j].model {
			return keys[i].model < keys[j].model
		}
		return keys[i].linkLayer < keys[j].linkLayer
	})
	for _, k := range keys {
		g := groups[k]
		if len(g) < 2 {
			continue
		}
		fastest := g[0].port.RateGbps
		for _, r := range g[1:] {
			if r.port.RateGbps > fastest {
				fastest = r.port.RateGbps
			}
		}
		atFastest := 0
		for _, r := range g {
			if r.port.RateGbps == fastest {
				atFastest++
			}
		}
		for _, r := range g {
			if r.port.RateGbps >= fastest {
				continue
			}
			res.Add(report.Finding{
				Severity: report.SevFail, Component: checks.PortComponent(r.hca.Name, r.port.Port),
				Code: CodeRateBelowSiblings, Action: report.ActionReseat,
				Message: fmt.Sprintf("rate %s Gb/s (%s) is below the %s Gb/s of %d of its %d sibling %s %s ports: link trained down",
					num(r.port.RateGbps), r.port.RateText, num(fastest), atFastest, len(g)-1, k.model, k.linkLayer),
			})
		}
	}
}

// addReadErrors warns about each file the probe could not read, at most a
// few per adapter. The component is the port when the file belongs to one.
func addReadErrors(res *checks.Result, h *snapshot.HCA) {
	for i, e := range h.Errors {
		if i == maxErrorFindingsPerHCA {
			res.Add(report.Finding{
				Severity: report.SevWarn, Component: h.Name, Code: CodeSysfsUnreadable, Action: report.ActionMonitor,
				Message: fmt.Sprintf("and %d more unreadable files", len(h.Errors)-i),
			})
			return
		}
		res.Add(report.Finding{
			Severity: report.SevWarn, Component: errorComponent(h, e), Code: CodeSysfsUnreadable, Action: report.ActionMonitor,
			Message: "cannot read /sys/class/infiniband/" + e,
		})
	}
}

// errorComponent finds the port an error entry ("mlx5_0/ports/1/rate: ...")
// is about; other entries belong to the adapter.
func errorComponent(h *snapshot.HCA, e string) string {
	rest, ok := strings.CutPrefix(e, h.Name+"/ports/")
	if !ok {
		return h.Name
	}
	n, _, _ := strings.Cut(rest, "/")
	n, _, _ = strings.Cut(n, ":")
	for _, p := range h.Ports {
		if fmt.Sprint(p.Port) == n {
			return checks.PortComponent(h.Name, p.Port)
		}
	}
	return h.Name
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// num prints a rate without a needless fraction: 400, 2.5.
func num(v float64) string { return fmt.Sprintf("%g", v) }
