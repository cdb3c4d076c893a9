package kmsg

import (
	"strings"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// MaxEventsPerKind bounds the events a parsed log keeps of each kind: a
// log of millions of Xid lines keeps its newest ones (the lookback window
// judges those) and counts the rest in KernelLog.Dropped, so memory does
// not grow with the log. Reset markers beyond the bound are still kept
// when they are the newest for their GPU, since they decide which of the
// kept Xids count.
const MaxEventsPerKind = 5000

// maxEventText bounds the text an event keeps of an overlong line (the
// parser judges up to maxLine of it); real driver lines are far shorter.
const maxEventText = 512

// keep appends an event, clipped, and drops the oldest events of each
// kind past the bound now and then: amortised, the log costs O(1) per
// event and never holds more than a few times the bound.
func (p *parser) keep(e snapshot.KernelEvent) {
	p.log.Events = append(p.log.Events, clip(e))
	if p.compactAt == 0 {
		p.compactAt = 4 * MaxEventsPerKind
	}
	if len(p.log.Events) >= p.compactAt {
		p.compact()
		p.compactAt = max(2*len(p.log.Events), 4*MaxEventsPerKind)
	}
}

// compact keeps the newest MaxEventsPerKind events of each kind, in log
// order, and the newest reset marker of each GPU (up to the bound again).
func (p *parser) compact() {
	events := p.log.Events
	kept := map[snapshot.KernelEventKind]int{}
	resetBus := map[string]bool{}
	keepIdx := make([]bool, len(events))
	n := 0
	for i := len(events) - 1; i >= 0; i-- {
		e := events[i]
		ok := kept[e.Kind] < MaxEventsPerKind
		if e.Kind == snapshot.EventGPUReset && !resetBus[e.PCIBusID] && len(resetBus) < MaxEventsPerKind {
			resetBus[e.PCIBusID] = true
			ok = true
		}
		if !ok {
			if p.log.Dropped == nil {
				p.log.Dropped = map[snapshot.KernelEventKind]int{}
			}
			p.log.Dropped[e.Kind]++
			continue
		}
		kept[e.Kind]++
		keepIdx[i] = true
		n++
	}
	if n == len(events) {
		return
	}
	out := make([]snapshot.KernelEvent, 0, n)
	for i, e := range events {
		if keepIdx[i] {
			out = append(out, e)
		}
	}
	p.log.Events = out
}

// clip cuts an event of an overlong line down to maxEventText per field,
// copying the strings so the long line's memory is not kept alive.
func clip(e snapshot.KernelEvent) snapshot.KernelEvent {
	if len(e.Raw) <= maxEventText {
		return e
	}
	cut := func(s string) string {
		if len(s) > maxEventText {
			s = s[:maxEventText]
		}
		return strings.Clone(s)
	}
	e.Raw, e.Message, e.Process, e.Device, e.PCIBusID = cut(e.Raw), cut(e.Message), cut(e.Process), cut(e.Device), cut(e.PCIBusID)
	return e
}
