package gpu

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/internal/xid"
)

// Finding codes. They are stable: dashboards and drain reasons key on them.
// Xid findings use "XID_<code>" (XID_79, XID_48 ...).
const (
	CodeFellOffBus         = "GPU_FELL_OFF_BUS"
	CodeNVLinkDown         = "NVLINK_DOWN"
	CodeNVLinkSpeedLow     = "NVLINK_SPEED_LOW"
	CodeNVLinkErrorsRising = "NVLINK_ERRORS_RISING"
	CodeFabricNotReady     = "FABRIC_NOT_READY"
	CodeFabricFailed       = "FABRIC_FAILED"
	CodeFabricStateUnknown = "FABRIC_STATE_UNKNOWN"
	CodeFabricMissing      = "FABRIC_MISSING"
	CodeFMMismatch         = "FABRIC_MANAGER_MISMATCH"
	CodeSXidFatal          = "SXID_FATAL"
	CodeSXidNonFatal       = "SXID_NONFATAL"
)

// defaultLookback is docs/design.md's Xid window, used when the config has none.
const defaultLookback = 24 * time.Hour

// maxMessage bounds the driver text quoted in a finding.
const maxMessage = 200

// refNow is the clock events are aged against: the run's time, or the
// snapshot's collection time for a bundle analysed later.
func refNow(in checks.Input) time.Time {
	if !in.Now.IsZero() {
		return in.Now
	}
	if in.Snap != nil {
		return in.Snap.CollectedAt
	}
	return time.Time{}
}

// gpuIndexByBus maps normalized PCI bus ids to nvidia-smi GPU indexes; empty
// when nvidia-smi did not answer (a GPU that fell off the bus often takes
// nvidia-smi with it).
func gpuIndexByBus(snap *snapshot.Snapshot) map[string]int {
	m := map[string]int{}
	if snap == nil || snap.GPU == nil {
		return m
	}
	for _, g := range snap.GPU.GPUs {
		if g.PCIBusID != "" {
			m[snapshot.NormalizeBusID(g.PCIBusID)] = g.Index
		}
	}
	return m
}

// busByIndex maps GPU indexes to their PCI bus ids.
func busByIndex(snap *snapshot.Snapshot) map[int]string {
	m := map[int]string{}
	if snap == nil || snap.GPU == nil {
		return m
	}
	for _, g := range snap.GPU.GPUs {
		m[g.Index] = snapshot.NormalizeBusID(g.PCIBusID)
	}
	return m
}

// component names the GPU at a bus id, or the node when it is not known.
func component(byBus map[string]int, bus string) string {
	if bus != "" {
		if i, ok := byBus[snapshot.NormalizeBusID(bus)]; ok {
			return checks.GPUComponent(i)
		}
	}
	return checks.NodeComponent
}

// eventFilter decides which kernel events still count: inside the lookback
// window, not before a reset of their GPU, and (for reporting) new since
// the previous run.
type eventFilter struct {
	snap     *snapshot.Snapshot
	prev     *checks.State
	now      time.Time
	lookback time.Duration
	// resetAfter[i] is true when a reset that covers event i comes later
	// in the log.
	resetAfter []bool
}

func newEventFilter(in checks.Input, lookback time.Duration) *eventFilter {
	f := &eventFilter{snap: in.Snap, prev: in.Prev, now: refNow(in), lookback: lookback}
	if in.Snap != nil && in.Snap.Kernel != nil {
		f.resetAfter = resetsAfter(in.Snap.Kernel.Events)
	}
	return f
}

// skipReason says why event i does not count ("" when it counts).
func (f *eventFilter) skipReason(i int, e snapshot.KernelEvent) string {
	if i < len(f.resetAfter) && f.resetAfter[i] {
		return "before_reset"
	}
	if age, ok := f.age(e); ok && age > f.lookback {
		return "outside_lookback"
	}
	return ""
}

// isNew reports whether the previous run had not seen the event.
func (f *eventFilter) isNew(e snapshot.KernelEvent) bool {
	return f.prev == nil || !f.prev.KernelEvents[checks.EventKey(e)]
}

// age is how long before now the event happened. Plain dmesg stamps get
// their wall time from the snapshot's uptime when the parser had none. An
// event whose age cannot be told counts (ok false).
func (f *eventFilter) age(e snapshot.KernelEvent) (time.Duration, bool) {
	if f.now.IsZero() {
		return 0, false
	}
	if !e.Time.IsZero() {
		return f.now.Sub(e.Time), true
	}
	if e.SinceBoot != nil && f.snap != nil && f.snap.Uptime > 0 && !f.snap.CollectedAt.IsZero() {
		at := f.snap.CollectedAt.Add(*e.SinceBoot - f.snap.Uptime)
		return f.now.Sub(at), true
	}
	return 0, false
}

// isResetMarker reports whether an event clears the Xids before it: a GPU
// (re)initialisation, a driver load or boot (bus id empty: every GPU), or
// Xid 154 saying the GPU's recovery action is back to None.
func isResetMarker(e snapshot.KernelEvent) bool {
	if e.Kind == snapshot.EventGPUReset {
		return true
	}
	if e.Kind == snapshot.EventXid && e.Code == 154 {
		target, ok := xid.RecoveryAction(e.Message)
		return ok && target == "None"
	}
	return false
}

// driverLoadWindow is how long before its load banner the driver may print
// what it found while probing the GPUs ("GPU has fallen off the bus",
// Xid 79): the banner comes last, after every GPU was probed. Those lines
// belong to that load and still count.
const driverLoadWindow = 30 * time.Second

// resetsAfter marks, walking the log backwards, the events that a later
// reset covers. Log order is the clock here: it holds even for lines whose
// time cannot be told. A driver load covers only what came more than
// driverLoadWindow before it (or whose distance to it cannot be told).
func resetsAfter(events []snapshot.KernelEvent) []bool {
	out := make([]bool, len(events))
	var node nodeResets
	busReset := map[string]bool{}
	for i := len(events) - 1; i >= 0; i-- {
		e := events[i]
		bus := e.PCIBusID
		if bus != "" {
			bus = snapshot.NormalizeBusID(bus)
		}
		out[i] = node.covers(e) || (bus != "" && busReset[bus])
		if isResetMarker(e) {
			if bus == "" {
				node.add(e)
			} else {
				busReset[bus] = true
			}
		}
	}
	return out
}

// nodeResets is what the node-wide resets (driver loads, boots) seen later
// in the log say about an earlier event.
type nodeResets struct {
	// other: a boot, or a driver load whose distance to some event cannot
	// be told, came later.
	other bool
	// loads holds the later driver loads' clocks; only the latest matters
	// (an event inside the latest load's window is inside every earlier
	// one's), but a log may mix stamped and unstamped lines.
	latestWall  time.Time
	latestSince *time.Duration
	untimed     bool
}

func (n *nodeResets) add(e snapshot.KernelEvent) {
	if !e.DriverLoad {
		n.other = true
		return
	}
	switch {
	case !e.Time.IsZero():
		if e.Time.After(n.latestWall) {
			n.latestWall = e.Time
		}
	case e.SinceBoot != nil:
		if n.latestSince == nil || *e.SinceBoot > *n.latestSince {
			d := *e.SinceBoot
			n.latestSince = &d
		}
	default:
		n.untimed = true
	}
}

// covers reports whether a later node-wide reset makes e stale.
func (n *nodeResets) covers(e snapshot.KernelEvent) bool {
	if n.other || n.untimed {
		return true
	}
	if !n.latestWall.IsZero() {
		if e.Time.IsZero() || n.latestWall.Sub(e.Time) > driverLoadWindow {
			return true
		}
	}
	if n.latestSince != nil {
		if e.SinceBoot == nil || *n.latestSince-*e.SinceBoot > driverLoadWindow {
			return true
		}
	}
	return false
}

// clip shortens driver text for a finding message.
func clip(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	i := maxMessage
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// metricWord lowercases s and replaces anything outside [a-z0-9_] with "_",
// so a counter name from any source makes a well-formed metric name.
func metricWord(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

func times(n int) string {
	if n == 1 {
		return "1 time"
	}
	return strconv.Itoa(n) + " times"
}
