// Package kmsg parses a kernel log into the GPU-related events that checks
// judge: NVRM Xid lines, NVSwitch SXid lines, "fallen off the bus" messages
// that come without an Xid, and markers after which a GPU's earlier Xids no
// longer count (GPU re-initialised, driver loaded, node booted).
//
// Accepted line shapes (mixed freely, one per line):
//
//	[2397166.923949] NVRM: ...                  dmesg: seconds since boot
//	[Sat Nov 28 01:58:17 2026] NVRM: ...       dmesg -T: local time of the host
//	2026-11-28T01:33:41,902311+00:00 NVRM: ... dmesg --time-format iso
//	6,1234,5678901234,-;NVRM: ...              /dev/kmsg record: µs since boot
//	Nov 28 01:58:17 host kernel: NVRM: ...     syslog / journalctl (short, short-iso)
//	NVRM: ...                                  no timestamp: the event's age is unknown
//
// Lines that start with blank space continue the previous message (dmesg
// indents the later lines of a multi-line record, /dev/kmsg dumps put
// KEY=value dictionaries there): they never start an event.
//
// Time zones: dmesg -T and syslog stamps carry no zone. They are read in the
// location of collectedAt, so a live probe passes time.Now() (the host's
// local zone) and a bundle passes its collected_at with the host's offset.
// With a zero collectedAt they are read as UTC.
package kmsg

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// maxLine bounds the part of a line that is looked at. The kernel's own
// records are under 1 KiB; anything longer is not a driver message, and
// the bound keeps memory flat on hostile or binary input.
const maxLine = 16 << 10

// pendingLines is how many lines a "The NVIDIA GPU <bdf>" header waits for
// its "fallen off the bus" line (the driver prints three lines).
const pendingLines = 4

// Parse reads a kernel log held in memory. collectedAt is when it was read
// and uptime the host's uptime then: with both, seconds-since-boot stamps
// become wall-clock times; without uptime they stay in SinceBoot only.
// Parse does not fail on content: lines it does not understand, binary
// garbage included, are counted and skipped.
func Parse(data []byte, collectedAt time.Time, uptime time.Duration) (*snapshot.KernelLog, error) {
	p := newParser(collectedAt, uptime)
	for len(data) > 0 {
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			line, data = data, nil
		}
		p.line(line)
	}
	return p.finish(), nil
}

// ParseReader is Parse for a stream (a large log file), reading it line by
// line in bounded memory. It fails only when reading fails.
func ParseReader(r io.Reader, collectedAt time.Time, uptime time.Duration) (*snapshot.KernelLog, error) {
	p := newParser(collectedAt, uptime)
	br := bufio.NewReaderSize(r, maxLine)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// An overlong line: judge its head, drop the rest.
			p.line(line)
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("read kernel log: %w", err)
			}
			if errors.Is(err, io.EOF) {
				break
			}
			continue
		}
		if len(line) > 0 {
			p.line(bytes.TrimSuffix(line, []byte{'\n'}))
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read kernel log: %w", err)
		}
	}
	return p.finish(), nil
}

type parser struct {
	collectedAt time.Time
	uptime      time.Duration
	loc         *time.Location
	log         snapshot.KernelLog

	// A "NVRM: The NVIDIA GPU <bdf>" header waiting for its "fallen off the
	// bus" line.
	pending     *snapshot.KernelEvent
	pendingLeft int

	// compactAt is the event count at which keep (bound.go) next drops
	// the oldest events past MaxEventsPerKind.
	compactAt int
}

func newParser(collectedAt time.Time, uptime time.Duration) *parser {
	if uptime < 0 {
		uptime = 0
	}
	return &parser{collectedAt: collectedAt, uptime: uptime, loc: collectedAt.Location()}
}

func (p *parser) finish() *snapshot.KernelLog {
	if len(p.log.Events) > MaxEventsPerKind {
		p.compact()
	}
	l := p.log
	return &l
}

// stamp is what a line's prefix says about its time.
type stamp struct {
	wall     time.Time
	since    time.Duration
	hasSince bool
}

func (p *parser) line(b []byte) {
	p.log.Lines++
	if len(b) > maxLine {
		b = b[:maxLine]
	}
	b = bytes.TrimSuffix(b, []byte{'\r'})
	if p.pending != nil {
		p.pendingLeft--
		if p.pendingLeft < 0 {
			p.pending = nil
		}
	}
	if len(b) == 0 {
		return
	}
	if b[0] == ' ' || b[0] == '\t' {
		// A continuation never starts an event; it may only finish the
		// fallen-off-the-bus message whose first line is pending.
		if p.pending != nil && bytes.Contains(b, []byte("fallen off the bus")) {
			p.emit(*p.pending)
			p.pending = nil
		}
		return
	}
	// Cheap prefilter: nearly every line of a big log stops here.
	if !bytes.Contains(b, []byte("NVRM")) && !bytes.Contains(b, []byte("SXid")) &&
		!bytes.Contains(b, []byte("Linux version")) {
		return
	}
	st, msg := p.stamp(b)
	p.message(st, msg, b)
}

func (p *parser) emit(e snapshot.KernelEvent) { p.keep(e) }

// event builds an event with the line's time fields filled in.
func (p *parser) event(kind snapshot.KernelEventKind, st stamp, raw string) snapshot.KernelEvent {
	e := snapshot.KernelEvent{Kind: kind, Raw: raw}
	if st.hasSince {
		d := st.since
		e.SinceBoot = &d
	}
	switch {
	case !st.wall.IsZero():
		e.Time = st.wall
	case st.hasSince && p.uptime > 0 && !p.collectedAt.IsZero():
		e.Time = p.collectedAt.Add(st.since - p.uptime)
	}
	return e
}

// message recognises the driver lines in msg (the line after its stamp).
func (p *parser) message(st stamp, msg, raw []byte) {
	// One copy per candidate line: the event's Raw, and every string cut
	// from the message, share it.
	line := string(raw)
	s := line[len(raw)-len(msg):]
	switch {
	case strings.Contains(s, "NVRM: Xid ("):
		p.xid(st, s, line)
	case strings.Contains(s, ": SXid ("):
		p.sxid(st, s, line)
	case strings.Contains(s, "NVRM: GPU at PCI:"):
		p.gpuAt(st, s, line)
	case strings.Contains(s, "NVRM: GPU ") && strings.Contains(s, "fallen off the bus"):
		// NV_DEV_PRINTF: "NVRM: GPU 0000:29:00.0: GPU has fallen off the bus."
		rest := s[strings.Index(s, "NVRM: GPU ")+len("NVRM: GPU "):]
		e := p.event(snapshot.EventFellOffBus, st, line)
		if i := strings.Index(rest, ": "); i >= 0 {
			e.PCIBusID = normalizeBusID(rest[:i])
			e.Message = strings.TrimSpace(rest[i+2:])
		} else {
			e.Message = strings.TrimSpace(rest)
		}
		p.emit(e)
	case strings.Contains(s, "NVRM: The NVIDIA GPU "):
		// First of three lines; the third says "fallen off the bus".
		rest := s[strings.Index(s, "NVRM: The NVIDIA GPU ")+len("NVRM: The NVIDIA GPU "):]
		e := p.event(snapshot.EventFellOffBus, st, line)
		e.PCIBusID = normalizeBusID(firstField(rest))
		e.Message = "GPU has fallen off the bus and is not responding to commands"
		p.pending, p.pendingLeft = &e, pendingLines
		if strings.Contains(rest, "fallen off the bus") {
			p.emit(e)
			p.pending = nil
		}
	case strings.Contains(s, "fallen off the bus and is not responding"):
		if p.pending != nil {
			p.emit(*p.pending)
			p.pending = nil
			return
		}
		e := p.event(snapshot.EventFellOffBus, st, line)
		e.Message = "GPU has fallen off the bus and is not responding to commands"
		p.emit(e)
	case strings.Contains(s, "NVRM: loading NVIDIA UNIX"):
		// The driver (re)loaded: every GPU was initialised afresh.
		e := p.event(snapshot.EventGPUReset, st, line)
		e.Message = "NVIDIA driver loaded"
		e.DriverLoad = true
		p.emit(e)
	case strings.HasPrefix(s, "Linux version "):
		// A boot banner inside the log (journalctl -k over several boots):
		// every GPU was reset by the reboot.
		e := p.event(snapshot.EventGPUReset, st, line)
		e.Message = "node booted"
		p.emit(e)
	}
}

// xid parses "NVRM: Xid (PCI:0000:9b:00): 79, pid=..., name=..., msg".
// The parenthesis may hold "0000:03:00" without "PCI:", or MIG attribution
// after the address ("PCI:0000:01:00 GPU-I:05"); pid and name are optional.
func (p *parser) xid(st stamp, s, raw string) {
	s = s[strings.Index(s, "NVRM: Xid (")+len("NVRM: Xid ("):]
	closeIdx := strings.IndexByte(s, ')')
	if closeIdx < 0 {
		return
	}
	attr := s[:closeIdx]
	rest := s[closeIdx+1:]
	colon := strings.Index(rest, ": ")
	if colon < 0 {
		return
	}
	code, rest, ok := leadingInt(rest[colon+2:])
	if !ok {
		return
	}
	e := p.event(snapshot.EventXid, st, raw)
	e.Code = code
	e.PCIBusID = normalizeBusID(firstField(attr))
	rest = strings.TrimLeft(strings.TrimPrefix(rest, ","), " ")
	if v, r, ok := field(rest, "pid="); ok {
		e.PID = atoiOrZero(strings.Trim(v, "'\""))
		rest = r
	}
	if v, r, ok := field(rest, "name="); ok {
		if v != "<unknown>" {
			e.Process = v
		}
		rest = r
	}
	e.Message = strings.TrimSpace(rest)
	p.emit(e)
}

// sxid parses "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, ...".
// The driver follows an SXid with "Severity ..." and "Data {...}" lines
// that repeat the code: those belong to the SXid before them.
func (p *parser) sxid(st stamp, s, raw string) {
	at := strings.Index(s, ": SXid (")
	device := s[:at]
	if i := strings.LastIndexAny(device, " ]:;"); i >= 0 {
		device = device[i+1:]
	}
	s = s[at+len(": SXid ("):]
	closeIdx := strings.IndexByte(s, ')')
	if closeIdx < 0 {
		return
	}
	bus := normalizeBusID(firstField(s[:closeIdx]))
	rest := s[closeIdx+1:]
	colon := strings.Index(rest, ": ")
	if colon < 0 {
		return
	}
	code, rest, ok := leadingInt(rest[colon+2:])
	if !ok {
		return
	}
	rest = strings.TrimSpace(strings.TrimPrefix(rest, ","))
	if strings.HasPrefix(rest, "Severity ") || strings.HasPrefix(rest, "Data {") {
		if n := len(p.log.Events); n > 0 {
			last := p.log.Events[n-1]
			if last.Kind == snapshot.EventSXid && last.Code == code && last.Device == device && last.PCIBusID == bus {
				return
			}
		}
	}
	e := p.event(snapshot.EventSXid, st, raw)
	e.Code = code
	e.Device = device
	e.PCIBusID = bus
	e.Fatal = strings.HasPrefix(rest, "Fatal")
	e.Message = rest
	p.emit(e)
}

// gpuAt handles the two "NVRM: GPU at PCI:" shapes:
//
//	NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-...   (identity)
//	NVRM: GPU at PCI:0000:01:00.0 has fallen off the bus
//
// The driver prints the identity line once per GPU initialisation, just
// before that GPU's first Xid (kernel_rc.c, _krcLogUuidOnce; its flag lives
// in an object that a GPU reset or driver reload recreates). So every Xid
// on that GPU printed before this line predates a re-initialisation: the
// line is this parser's GPU-reset marker. The driver prints nothing on a
// successful `nvidia-smi -r` itself.
func (p *parser) gpuAt(st stamp, s, raw string) {
	rest := s[strings.Index(s, "NVRM: GPU at PCI:")+len("NVRM: GPU at PCI:"):]
	if i := strings.Index(rest, ": GPU-"); i >= 0 {
		e := p.event(snapshot.EventGPUReset, st, raw)
		e.PCIBusID = normalizeBusID(rest[:i])
		e.Message = "GPU initialised: " + firstField(rest[i+2:])
		p.emit(e)
		return
	}
	if strings.Contains(rest, "fallen off the bus") {
		e := p.event(snapshot.EventFellOffBus, st, raw)
		e.PCIBusID = normalizeBusID(firstField(rest))
		e.Message = "GPU has fallen off the bus"
		p.emit(e)
	}
}

// stamp splits a line into its time prefix and the kernel message.
func (p *parser) stamp(b []byte) (stamp, []byte) {
	var st stamp
	msg := b
	switch {
	case b[0] == '[':
		st, msg = p.bracket(b)
	case isDigit(b[0]):
		if s, m, ok := kmsgRecord(b); ok {
			st, msg = s, m
		} else if s, m, ok := isoPrefix(b); ok {
			st, msg = s, m
		}
	case len(b) >= 16 && b[3] == ' ' && isMonth(b[:3]):
		if t, err := time.ParseInLocation(time.Stamp, string(b[:15]), p.loc); err == nil && !p.collectedAt.IsZero() {
			st.wall = p.withYear(t)
		}
		msg = b[15:]
	}
	// syslog and journalctl put "host kernel: " before the message, and the
	// kernel's own "[ 123.456]" stamp may follow it.
	if i := bytes.Index(msg, []byte("kernel: ")); i >= 0 && i < 128 {
		msg = msg[i+len("kernel: "):]
		if len(msg) > 0 && msg[0] == '[' {
			inner, rest := p.bracket(msg)
			if st.wall.IsZero() {
				st = inner
			} else if inner.hasSince {
				st.since, st.hasSince = inner.since, true
			}
			msg = rest
		}
	}
	return st, bytes.TrimLeft(msg, " ")
}

// bracket reads "[ 123.456789] msg" or "[Sat Nov 28 01:58:17 2026] msg".
func (p *parser) bracket(b []byte) (stamp, []byte) {
	var st stamp
	end := bytes.IndexByte(b, ']')
	if end < 0 || end > 64 {
		return st, b
	}
	inner := bytes.TrimSpace(b[1:end])
	msg := b[end+1:]
	if d, ok := secondsSinceBoot(inner); ok {
		st.since, st.hasSince = d, true
		return st, msg
	}
	if t, err := time.ParseInLocation(time.ANSIC, string(inner), p.loc); err == nil {
		st.wall = t
		return st, msg
	}
	return st, b
}

// withYear gives a year-less syslog stamp the collection year, or the one
// before when that would put it in the future (a log spanning New Year).
func (p *parser) withYear(t time.Time) time.Time {
	y := p.collectedAt.Year()
	w := time.Date(y, t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), p.loc)
	if w.After(p.collectedAt.Add(24 * time.Hour)) {
		w = w.AddDate(-1, 0, 0)
	}
	return w
}

// kmsgRecord reads a /dev/kmsg record prefix "PRI,SEQ,USEC,FLAGS[,...];".
func kmsgRecord(b []byte) (stamp, []byte, bool) {
	var st stamp
	semi := bytes.IndexByte(b, ';')
	if semi < 0 || semi > 96 {
		return st, nil, false
	}
	head := b[:semi]
	var nums [3]uint64
	for i := range nums {
		j := 0
		for j < len(head) && isDigit(head[j]) {
			j++
		}
		if j == 0 || j > 19 {
			return st, nil, false
		}
		var n uint64
		for _, c := range head[:j] {
			n = n*10 + uint64(c-'0')
		}
		nums[i] = n
		head = head[j:]
		if len(head) == 0 || head[0] != ',' {
			if i < 2 {
				return st, nil, false
			}
			break
		}
		head = head[1:]
	}
	const maxUS = uint64(1<<63-1) / uint64(time.Microsecond)
	if nums[2] > maxUS {
		return st, nil, false
	}
	st.since, st.hasSince = time.Duration(nums[2])*time.Microsecond, true
	return st, b[semi+1:], true
}

// isoPrefix reads "2026-11-28T01:33:41,902311+00:00 " (dmesg --time-format
// iso) and journalctl's short-iso "2026-11-28T01:33:41+0000 ".
func isoPrefix(b []byte) (stamp, []byte, bool) {
	var st stamp
	if len(b) < 20 || b[4] != '-' || b[10] != 'T' {
		return st, nil, false
	}
	sp := bytes.IndexByte(b, ' ')
	if sp < 0 || sp > 40 {
		return st, nil, false
	}
	tok := string(b[:sp])
	for _, layout := range []string{"2006-01-02T15:04:05Z07:00", "2006-01-02T15:04:05Z0700"} {
		if t, err := time.Parse(layout, tok); err == nil {
			st.wall = t
			return st, b[sp+1:], true
		}
	}
	return st, nil, false
}

// secondsSinceBoot parses "2397166.923949" without floating point, so the
// microseconds survive exactly.
func secondsSinceBoot(b []byte) (time.Duration, bool) {
	dot := bytes.IndexByte(b, '.')
	if dot <= 0 || dot > 11 || len(b)-dot-1 > 9 || len(b)-dot-1 == 0 {
		return 0, false
	}
	var sec int64
	for _, c := range b[:dot] {
		if !isDigit(c) {
			return 0, false
		}
		sec = sec*10 + int64(c-'0')
	}
	var frac int64
	digits := 0
	for _, c := range b[dot+1:] {
		if !isDigit(c) {
			return 0, false
		}
		frac = frac*10 + int64(c-'0')
		digits++
	}
	for ; digits < 9; digits++ {
		frac *= 10
	}
	return time.Duration(sec)*time.Second + time.Duration(frac), true
}

// leadingInt reads up to 9 decimal digits at the start of s.
func leadingInt(s string) (int, string, bool) {
	i, n := 0, 0
	for i < len(s) && i < 9 && isDigit(s[i]) {
		n = n*10 + int(s[i]-'0')
		i++
	}
	if i == 0 || (i < len(s) && isDigit(s[i])) {
		return 0, s, false
	}
	return n, s[i:], true
}

// field reads `key=value, ` at the start of s.
func field(s, key string) (value, rest string, ok bool) {
	if !strings.HasPrefix(s, key) {
		return "", s, false
	}
	s = s[len(key):]
	if i := strings.Index(s, ", "); i >= 0 {
		return s[:i], s[i+2:], true
	}
	return strings.TrimSuffix(s, ","), "", true
}

func atoiOrZero(s string) int {
	n, rest, ok := leadingInt(s)
	if !ok || rest != "" {
		return 0
	}
	return n
}

func firstField(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, " \t"); i >= 0 {
		return s[:i]
	}
	return s
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isMonth(b []byte) bool {
	switch string(b) {
	case "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec":
		return true
	}
	return false
}
