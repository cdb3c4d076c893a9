package gpu

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/internal/xid"
)

// Xid is gpu.xid: NVRM Xid lines in the kernel log, judged by NVIDIA's
// catalog (package xid) with the operator's overrides.
//
// An Xid counts unless xid.ignore lists it, it is older than xid.lookback
// (default 24 h, against the run's time; plain dmesg stamps get their wall
// time from the uptime), or its GPU was reset after it (a GPU
// re-initialisation, a driver load, a boot, or Xid 154 back to "None"). A
// driver load covers only lines more than 30 s before its banner: the
// driver prints what it found probing the GPUs (a GPU off the bus) just
// before the banner, and that belongs to the load. An
// Xid whose age cannot be told counts. With a previous run, only Xids whose
// line that run had not seen become findings; the metrics count them all.
//
// Counted Xids with the same code on the same GPU (and the same verdict)
// make one finding, "XID_<code>", with the count in the message. Severity
// and action come from the catalog, or from xid.overrides; application
// Xids (13, 31, 43, 45) warn with restart_app whatever the override, since
// one job's crash prints them on every node it ran on. Xid 154 back to
// "None" says the GPU recovered and is not a finding.
//
// "GPU has fallen off the bus" without an Xid 79 for the same GPU fails
// GPU_FELL_OFF_BUS with action reseat (replace if it recurs): the GPU did
// not come up at all, which points at the slot, riser or board.
//
// Metrics: xid.event_count (counted), xid.new_event_count (not seen by the previous
// run), xid.<code>.count, xid.fell_off_bus_count, and the events left out:
// xid.ignored_count, xid.before_reset_count, xid.outside_lookback_count,
// and, after a flood, xid.dropped_count (the oldest lines past the
// parser's bound, kmsg.MaxEventsPerKind, counted but not judged).
type Xid struct{}

var _ checks.Check = Xid{}

// Name is the check's fixed name.
func (Xid) Name() string { return "gpu.xid" }

// Needs the kernel log.
func (Xid) Needs() []snapshot.Source { return []snapshot.Source{snapshot.SrcKernelLog} }

// Disruptive is false: the check only reads the snapshot.
func (Xid) Disruptive() bool { return false }

type xidKey struct {
	code   int
	bus    string
	action report.Action
}

type xidGroup struct {
	entry xid.Entry
	comp  string
	bus   string
	count int
	first snapshot.KernelEvent
	last  snapshot.KernelEvent
	// overridden marks a config override of the catalog's action.
	overridden bool
}

// Run judges the kernel log's Xid events.
func (Xid) Run(in checks.Input) checks.Result {
	if in.Snap == nil || in.Snap.Kernel == nil {
		return checks.Errorf("kernel log: source is ok but holds no parsed log")
	}
	cfg := conf(in)
	f := newEventFilter(in, cfg.Xid.Lookback.D(defaultLookback))
	ignore := map[int]bool{}
	for _, c := range cfg.Xid.Ignore {
		ignore[c] = true
	}
	byBus := gpuIndexByBus(in.Snap)

	res := checks.Result{Status: report.Pass}
	skipped := map[string]int{}
	perCode := map[int]int{}
	counted, fresh := 0, 0
	groups := map[xidKey]*xidGroup{}
	var order []xidKey
	var fell []snapshot.KernelEvent
	xid79 := map[string]bool{}

	for i, e := range in.Snap.Kernel.Events {
		if e.Kind != snapshot.EventXid && e.Kind != snapshot.EventFellOffBus {
			continue
		}
		if e.Kind == snapshot.EventXid && ignore[e.Code] {
			skipped["ignored"]++
			continue
		}
		if why := f.skipReason(i, e); why != "" {
			skipped[why]++
			continue
		}
		isNew := f.isNew(e)
		if e.Kind == snapshot.EventFellOffBus {
			if isNew {
				fell = append(fell, e)
			}
			continue
		}
		counted++
		perCode[e.Code]++
		bus := snapshot.NormalizeBusID(e.PCIBusID)
		if e.Code == 79 {
			xid79[bus] = true
		}
		if !isNew {
			continue
		}
		fresh++
		if isResetMarker(e) {
			continue // 154 back to None: the GPU recovered
		}
		entry, overridden := classify(e, cfg.Xid.Overrides)
		k := xidKey{code: e.Code, bus: bus, action: entry.Action}
		g := groups[k]
		if g == nil {
			g = &xidGroup{entry: entry, comp: component(byBus, bus), bus: bus, first: e, overridden: overridden}
			groups[k] = g
			order = append(order, k)
		}
		g.count++
		g.last = e
	}

	for _, k := range order {
		res.Add(groups[k].finding())
	}
	fellOffFindings(&res, fell, xid79, byBus)

	res.Metric("xid.event_count", float64(counted))
	res.Metric("xid.new_event_count", float64(fresh))
	for code, n := range perCode {
		res.Metric("xid."+strconv.Itoa(code)+".count", float64(n))
	}
	res.Metric("xid.fell_off_bus_count", float64(len(fell)))
	res.Metric("xid.ignored_count", float64(skipped["ignored"]))
	res.Metric("xid.before_reset_count", float64(skipped["before_reset"]))
	res.Metric("xid.outside_lookback_count", float64(skipped["outside_lookback"]))
	if d := in.Snap.Kernel.Dropped[snapshot.EventXid] + in.Snap.Kernel.Dropped[snapshot.EventFellOffBus]; d > 0 {
		// The parser keeps the newest events of a flood; the oldest are only counted.
		res.Metric("xid.dropped_count", float64(d))
	}
	return res
}

// classify is the catalog's verdict for one Xid line, with the operator's
// override when there is one.
func classify(e snapshot.KernelEvent, overrides map[int]string) (xid.Entry, bool) {
	entry := xid.Classify(e.Code, e.Message)
	if a, ok := overrides[e.Code]; ok {
		return entry.WithAction(report.Action(a)), true
	}
	return entry, false
}

func (g *xidGroup) finding() report.Finding {
	e := g.entry
	var b strings.Builder
	fmt.Fprintf(&b, "Xid %d", e.Code)
	if e.Description != "" && e.Description != "Unused" {
		fmt.Fprintf(&b, " (%s)", e.Description)
	} else if e.Mnemonic != "" {
		fmt.Fprintf(&b, " (%s)", e.Mnemonic)
	}
	b.WriteString(" " + times(g.count))
	if at := eventTime(g.last); at != "" {
		if g.count > 1 {
			if first := eventTime(g.first); first != "" && first != at {
				fmt.Fprintf(&b, " from %s", first)
			}
			fmt.Fprintf(&b, " to %s", at)
		} else {
			fmt.Fprintf(&b, " at %s", at)
		}
	}
	if g.last.PID != 0 || g.last.Process != "" {
		fmt.Fprintf(&b, " (last by pid %d %s)", g.last.PID, g.last.Process)
	}
	if msg := strings.TrimSpace(g.last.Message); msg != "" {
		fmt.Fprintf(&b, ": %s", clip(msg))
	}
	if e.NVIDIAAction != "" {
		fmt.Fprintf(&b, "; NVIDIA: %s", e.NVIDIAAction)
	}
	switch {
	case g.overridden:
		b.WriteString("; action set by xid.overrides")
	case e.Application:
		b.WriteString("; usually the application: look at the job before the node")
	}
	return report.Finding{
		Severity:  e.Severity,
		Component: g.comp,
		PCIBusID:  g.bus,
		Code:      "XID_" + strconv.Itoa(e.Code),
		Message:   b.String(),
		Action:    e.Action,
	}
}

// fellOffFindings reports fallen-off-the-bus lines whose GPU has no Xid 79
// (which already says it, with its own action), one finding per GPU.
func fellOffFindings(res *checks.Result, fell []snapshot.KernelEvent, xid79 map[string]bool, byBus map[string]int) {
	count := map[string]int{}
	last := map[string]snapshot.KernelEvent{}
	var order []string
	for _, e := range fell {
		bus := snapshot.NormalizeBusID(e.PCIBusID)
		if xid79[bus] {
			continue
		}
		if _, seen := count[bus]; !seen {
			order = append(order, bus)
		}
		count[bus]++
		last[bus] = e
	}
	for _, bus := range order {
		e := last[bus]
		where := "a GPU"
		if bus != "" {
			where = "GPU at " + bus
		}
		msg := fmt.Sprintf("%s has fallen off the bus (%s, no Xid 79)", where, times(count[bus]))
		if at := eventTime(e); at != "" {
			msg += " last at " + at
		}
		msg += ": reseat it; replace it if it falls off again"
		res.Add(report.Finding{
			Severity:  report.SevFail,
			Component: component(byBus, bus),
			PCIBusID:  bus,
			Code:      CodeFellOffBus,
			Message:   msg,
			Action:    report.ActionReseat,
		})
	}
}

// eventTime renders an event's time for a message, "" when unknown.
func eventTime(e snapshot.KernelEvent) string {
	if !e.Time.IsZero() {
		return e.Time.UTC().Format(time.RFC3339)
	}
	if e.SinceBoot != nil {
		return fmt.Sprintf("%.0fs after boot", e.SinceBoot.Seconds())
	}
	return ""
}
