package kmsg

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// xidLines streams n Xid lines without holding them, as a huge dmesg.txt
// arrives from a bundle.
type xidLines struct {
	n, i int
	buf  []byte
}

func (x *xidLines) Read(p []byte) (int, error) {
	for len(x.buf) == 0 {
		if x.i == x.n {
			return 0, io.EOF
		}
		x.buf = fmt.Appendf(x.buf[:0], "[%7d.000000] NVRM: Xid (PCI:0000:%02x:00): 13, pid=%d, name=python, Graphics Exception\n", x.i+1, 0x17+x.i%8, x.i)
		x.i++
	}
	n := copy(p, x.buf)
	x.buf = x.buf[n:]
	return n, nil
}

// A log of many more events than the bound keeps the newest of each kind,
// in order, and counts the rest; the newest reset of each GPU survives.
func TestParseKeepsNewestEventsAndCountsTheRest(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	// One reset per GPU, then a flood of resets of GPU 0x17 that pushes
	// the others past the bound, then the Xids.
	for g := range 8 {
		fmt.Fprintf(&b, "[%d.000000] NVRM: GPU at PCI:0000:%02x:00: GPU-%08x-0000-0000-0000-000000000000\n", g+1, 0x17+g, g)
	}
	for i := range MaxEventsPerKind + 10 {
		fmt.Fprintf(&b, "[%d.500000] NVRM: GPU at PCI:0000:17:00: GPU-00000000-0000-0000-0000-000000000000\n", 10+i)
	}
	total := 3*MaxEventsPerKind + 7
	log, err := ParseReader(io.MultiReader(strings.NewReader(b.String()), &xidLines{n: total}), time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var xids []snapshot.KernelEvent
	resets := map[string]int{}
	for _, e := range log.Events {
		switch e.Kind {
		case snapshot.EventXid:
			xids = append(xids, e)
		case snapshot.EventGPUReset:
			resets[e.PCIBusID]++
		}
	}
	if len(xids) != MaxEventsPerKind {
		t.Fatalf("kept %d Xids, want %d", len(xids), MaxEventsPerKind)
	}
	if got := log.Dropped[snapshot.EventXid]; got != total-MaxEventsPerKind {
		t.Errorf("dropped %d Xids, want %d", got, total-MaxEventsPerKind)
	}
	if first, last := xids[0].PID, xids[len(xids)-1].PID; first != total-MaxEventsPerKind || last != total-1 {
		t.Errorf("kept Xids from pid %d to %d, want the newest: %d to %d", first, last, total-MaxEventsPerKind, total-1)
	}
	for i := 1; i < len(xids); i++ {
		if xids[i].PID != xids[i-1].PID+1 {
			t.Fatalf("log order lost at %d: pid %d after %d", i, xids[i].PID, xids[i-1].PID)
		}
	}
	if len(resets) != 8 {
		t.Errorf("resets kept for %d GPUs, want all 8: %v", len(resets), resets)
	}
	if log.Lines != 8+MaxEventsPerKind+10+total {
		t.Errorf("Lines = %d", log.Lines)
	}
}

// An event of an overlong line keeps a bounded part of it.
func TestParseClipsOverlongEventLines(t *testing.T) {
	t.Parallel()
	line := "[1.0] NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=x, " + strings.Repeat("A", 12000) + "\n"
	log, err := Parse([]byte(line), time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(log.Events) != 1 {
		t.Fatalf("events %d", len(log.Events))
	}
	e := log.Events[0]
	if e.Code != 79 || len(e.Raw) > maxEventText || len(e.Message) > maxEventText {
		t.Errorf("code %d, raw %d bytes, message %d bytes; want 79 and at most %d", e.Code, len(e.Raw), len(e.Message), maxEventText)
	}
}

// BenchmarkParseReaderXidFlood parses 100k Xid lines from a stream: memory
// per op stays near the bound, not the log's size.
func BenchmarkParseReaderXidFlood(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseReader(&xidLines{n: 100000}, time.Time{}, 0); err != nil {
			b.Fatal(err)
		}
	}
}
