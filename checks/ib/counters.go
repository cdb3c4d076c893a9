package ib

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Counters is ib.counters: port error counters judged by their rise since
// the previous run. "Active" proves little on its own: a port whose error
// counters keep rising retransmits.
//
// Limits come from limits.ib_counter_rise and limits.ib_counter_total,
// keyed by counter name; hw_counters are named with an "hw." prefix
// ("hw.out_of_sequence"), as in checks.State.
//
//   - With a previous run, each limited counter's rise (now - previous)
//     above its limit fails IB_COUNTER_RISING (action reseat: symbol errors,
//     link downs and receive errors are cable and transceiver faults).
//   - A counter lower than before was reset (reboot, driver reload, perfquery
//     -x): its rise is unknown and it is judged as on a first run.
//   - On a first run (or for a new port, or after a reset) only lifetime
//     totals are judged, and only against limits.ib_counter_total, empty by
//     default: healthy long-running ports are rarely at zero, so a first run
//     passes and records metrics.
//   - A limited counter missing from a port that has counters warns
//     IB_COUNTER_UNREADABLE: its rise could not be judged.
//
// The kernel's legacy error counters are narrow and stop at their maximum
// instead of wrapping (symbol_error 16 bits, link_downed 8,
// excessive_buffer_overrun_errors and local_link_integrity_errors 4 bits:
// 15). A counter sitting at its maximum in both runs has an unknown rise:
// no rise metric is given for it, and ib.<hca>.port<n>.saturated_count
// says how many counters of the port are stuck there (clearing the port
// counters makes them useful again). It is not a finding: 4-bit counters at
// 15 are common on healthy ports.
//
// Metrics per port (ib.<hca>.port<n>.):
//
//	<counter>_count        lifetime value of each error counter and limited counter
//	<counter>_rise_count   rise since the previous run, where known
//	rcv_bytes, xmit_bytes  port_rcv_data / port_xmit_data × 4 (the kernel counts 4-byte words)
//	rcv_error_ratio        port_rcv_errors rise / port_rcv_packets rise, when packets rose
//	counter_reset_count    counters lower than in the previous run
//	saturated_count        counters stuck at their maximum
//
// and ib.counters.ports_judged_count.
type Counters struct{}

var _ checks.Check = Counters{}

// Name is the check's fixed name.
func (Counters) Name() string { return "ib.counters" }

// Needs the adapter tree.
func (Counters) Needs() []snapshot.Source { return []snapshot.Source{snapshot.SrcInfiniBand} }

// Disruptive is false: the check only reads the snapshot.
func (Counters) Disruptive() bool { return false }

// errorCounters names the counters/ files reported as metrics on every run.
func errorCounters() []string {
	return []string{
		"symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
		"port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
		"port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
		"excessive_buffer_overrun_errors", "VL15_dropped", "port_xmit_wait",
	}
}

// counterMax is where each legacy PortCounters field stops (its width in the
// kernel's drivers/infiniband/core/sysfs.c). Data and packet counters are
// 64-bit extended counters on current adapters and are left out.
func counterMax(name string) (uint64, bool) {
	switch name {
	case "symbol_error", "port_rcv_errors", "port_rcv_remote_physical_errors",
		"port_rcv_switch_relay_errors", "port_xmit_discards", "VL15_dropped":
		return 1<<16 - 1, true
	case "link_error_recovery", "link_downed", "port_xmit_constraint_errors", "port_rcv_constraint_errors":
		return 1<<8 - 1, true
	case "local_link_integrity_errors", "excessive_buffer_overrun_errors":
		return 1<<4 - 1, true
	case "port_xmit_wait":
		return 1<<32 - 1, true
	}
	return 0, false
}

// Run judges every port's counters.
func (Counters) Run(in checks.Input) checks.Result {
	lim := conf(in).Limits
	res := checks.Result{Status: report.Pass}
	var hcas []snapshot.HCA
	if in.Snap != nil {
		hcas = in.Snap.HCAs
	}
	var prev map[string]map[string]uint64
	var prevAt time.Time
	if in.Prev != nil {
		prev, prevAt = in.Prev.IBCounters, in.Prev.At
	}

	limited := limitedCounters(lim.IBCounterRise, lim.IBCounterTotal)
	metricNames := mergeNames(errorCounters(), limited)
	judged := 0
	for _, h := range hcas {
		for _, p := range h.Ports {
			if len(p.Counters) == 0 && len(p.HWCounters) == 0 {
				continue // no counters on this port: nothing to judge
			}
			judged++
			pc := portCounters{
				hca: h.Name, port: p.Port, comp: checks.PortComponent(h.Name, p.Port),
				now: flatten(p),
			}
			pc.prev, pc.hasPrev = prev[pc.comp]
			pc.metrics(&res, metricNames)
			for _, name := range limited {
				pc.judge(&res, name, lim.IBCounterRise, lim.IBCounterTotal, prevAt)
			}
		}
	}
	res.Metric("ib.counters.ports_judged_count", float64(judged))
	if judged == 0 {
		res.Status = report.Skip
		res.Reason = "no port counters to judge"
		if len(hcas) == 0 {
			res.Reason = "no InfiniBand HCAs"
		}
	}
	return res
}

// portCounters is one port's counters now and in the previous run.
type portCounters struct {
	hca     string
	port    int
	comp    string
	now     map[string]uint64
	prev    map[string]uint64
	hasPrev bool
}

// riseKind says what is known about a counter's rise.
type riseKind int

const (
	riseFresh riseKind = iota // no previous value: first run, new port, new counter
	riseKnown                 // now >= previous
	riseReset                 // lower than before: reset since the previous run
	riseStuck                 // at its maximum in both runs: rise unknown
)

// rise returns now - prev for a counter, and what is known about it.
func (pc *portCounters) rise(name string) (uint64, riseKind) {
	v, ok := pc.now[name]
	if !ok || !pc.hasPrev {
		return 0, riseFresh
	}
	pv, ok := pc.prev[name]
	if !ok {
		return 0, riseFresh
	}
	if v < pv {
		return 0, riseReset
	}
	if max, narrow := counterMax(name); narrow && v == max && pv == max {
		return 0, riseStuck
	}
	return v - pv, riseKnown
}

func (pc *portCounters) metrics(res *checks.Result, names []string) {
	m := func(what string, v float64) { res.Metric(portMetric(pc.hca, pc.port, what), v) }
	for _, name := range names {
		v, ok := pc.now[name]
		if !ok {
			continue
		}
		w := metricWord(name)
		m(w+"_count", float64(v))
		if r, kind := pc.rise(name); kind == riseKnown {
			m(w+"_rise_count", float64(r))
		}
	}
	// The kernel counts data in 4-byte words; float64 avoids overflowing
	// uint64 on the multiplication.
	if v, ok := pc.now["port_rcv_data"]; ok {
		m("rcv_bytes", float64(v)*4)
	}
	if v, ok := pc.now["port_xmit_data"]; ok {
		m("xmit_bytes", float64(v)*4)
	}
	if pkts, kind := pc.rise("port_rcv_packets"); kind == riseKnown && pkts > 0 {
		if errs, kind := pc.rise("port_rcv_errors"); kind == riseKnown {
			m("rcv_error_ratio", float64(errs)/float64(pkts))
		}
	}
	saturated := 0
	for name, v := range pc.now {
		if max, narrow := counterMax(name); narrow && v == max {
			saturated++
		}
	}
	m("saturated_count", float64(saturated))
	if pc.hasPrev {
		resets := 0
		for name := range pc.now {
			if _, kind := pc.rise(name); kind == riseReset {
				resets++
			}
		}
		m("counter_reset_count", float64(resets))
	}
}

// judge applies the limits to one counter.
func (pc *portCounters) judge(res *checks.Result, name string, riseLim, totalLim map[string]uint64, prevAt time.Time) {
	v, ok := pc.now[name]
	if !ok {
		if pc.hasFamily(name) {
			res.Add(report.Finding{
				Severity: report.SevWarn, Component: pc.comp, Code: CodeCounterUnreadable, Action: report.ActionMonitor,
				Message: fmt.Sprintf("%s could not be read: not judged", name),
			})
		}
		return
	}
	r, kind := pc.rise(name)
	switch kind {
	case riseKnown:
		if limit, ok := riseLim[name]; ok && r > limit {
			res.Add(report.Finding{
				Severity: report.SevFail, Component: pc.comp, Code: CodeCounterRising, Action: report.ActionReseat,
				Message: fmt.Sprintf("%s rose by %d since %s (limit %d)", name, r, prevAt.UTC().Format(time.RFC3339), limit),
			})
		}
		return
	case riseStuck:
		return // see saturated_count
	}
	// No usable previous value: only the lifetime total can be judged.
	if limit, ok := totalLim[name]; ok && v > limit {
		when := "on the first run"
		switch {
		case kind == riseReset:
			when = "since the counters were reset"
		case pc.hasPrev:
			when = "on the first run that saw it"
		}
		res.Add(report.Finding{
			Severity: report.SevFail, Component: pc.comp, Code: CodeCounterTotal, Action: report.ActionReseat,
			Message: fmt.Sprintf("%s is %d %s (lifetime limit %d)", name, v, when, limit),
		})
	}
}

// hasFamily reports whether the port has any counter of name's kind
// (counters/ or hw_counters/): a limited counter missing beside others was
// expected and could not be read.
func (pc *portCounters) hasFamily(name string) bool {
	hw := strings.HasPrefix(name, hwPrefix)
	for k := range pc.now {
		if strings.HasPrefix(k, hwPrefix) == hw {
			return true
		}
	}
	return false
}

// flatten merges a port's counters the way checks.State keeps them:
// hw_counters prefixed with "hw.".
func flatten(p snapshot.IBPort) map[string]uint64 {
	m := make(map[string]uint64, len(p.Counters)+len(p.HWCounters))
	for k, v := range p.Counters {
		m[k] = v
	}
	for k, v := range p.HWCounters {
		m[hwPrefix+k] = v
	}
	return m
}

// limitedCounters returns the sorted names that either limit map holds.
func limitedCounters(a, b map[string]uint64) []string {
	seen := make(map[string]bool, len(a)+len(b))
	var out []string
	for _, m := range []map[string]uint64{a, b} {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

func mergeNames(a, b []string) []string {
	seen := make(map[string]bool, len(a)+len(b))
	out := make([]string, 0, len(a)+len(b))
	for _, l := range [][]string{a, b} {
		for _, k := range l {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	return out
}
