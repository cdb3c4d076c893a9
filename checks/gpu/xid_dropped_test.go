package gpu

import (
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// After a flood the parser keeps the newest events; the check still judges
// those and says how many older ones it did not see.
func TestXidReportsDroppedEvents(t *testing.T) {
	t.Parallel()
	s := h100Node()
	s.Kernel.Events = []snapshot.KernelEvent{xidEvent(79, "0000:18:00", time.Hour, "GPU has fallen off the bus.")}
	s.Kernel.Dropped = map[snapshot.KernelEventKind]int{snapshot.EventXid: 12000, snapshot.EventSXid: 5}
	r := run(Xid{}, s, nil, nil)
	if r.Metrics["xid.dropped_count"] != 12000 || r.Metrics["xid.event_count"] != 1 {
		t.Errorf("metrics %v: want xid.dropped_count 12000 and xid.event_count 1", r.Metrics)
	}
	if len(r.Findings) != 1 || r.Findings[0].Code != "XID_79" {
		t.Errorf("findings %+v", r.Findings)
	}
	s.Kernel.Dropped = nil
	if _, ok := run(Xid{}, s, nil, nil).Metrics["xid.dropped_count"]; ok {
		t.Error("xid.dropped_count reported with nothing dropped")
	}
}
