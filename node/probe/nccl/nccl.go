// Package nccl parses the standard output of nccl-tests' all_reduce_perf
// into a snapshot.AllReduceRun.
//
// The output is a table of message sizes framed by comment lines, with
// whatever else shares the terminal interleaved: Open MPI help messages,
// NCCL INFO/WARN lines (NCCL_DEBUG=INFO), mpirun --tag-output prefixes.
// Columns are located by the "#  size ..." header line, so old layouts
// (no root column, an "error" magnitude instead of a "#wrong" count) and
// future extra columns parse without a table of versions.
package nccl

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// ErrNoRows is returned when the input holds neither a result row nor a
// failure line: the run produced nothing to judge.
var ErrNoRows = errors.New("no result rows")

// Bounds on what a hostile or runaway output can make the parser keep.
const (
	maxFailures    = 64  // distinct failure lines kept
	maxFailureLine = 512 // bytes kept of one failure line
	maxFields      = 32  // a table line with more fields is noise
	// maxRows is far beyond any real sweep (-f 2 from 8 B to 16 GiB is 32
	// sizes) and keeps a runaway output from growing the run without end.
	maxRows = 1 << 16
)

// Parse reads all_reduce_perf stdout. An input with failure lines but no
// rows is a run (the test failed before measuring), not an error. Errors
// wrap ErrNoRows and name the source.
func Parse(data []byte) (*snapshot.AllReduceRun, error) {
	p := parser{run: &snapshot.AllReduceRun{}}
	for len(data) > 0 {
		var line []byte
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			line, data = data, nil
		}
		p.line(line)
	}
	p.finish()
	if len(p.run.Rows) == 0 && len(p.run.Failures) == 0 {
		return nil, fmt.Errorf("parse all_reduce_perf output: %w", ErrNoRows)
	}
	return p.run, nil
}

// layout maps column names to field positions; -1 is absent.
type layout struct {
	fields                        int
	size, count, typ, redop, root int
	groups                        [2]group // out-of-place, in-place
}

type group struct{ time, algbw, busbw, wrong int }

func noGroup() group { return group{-1, -1, -1, -1} }

// valid reports whether the group has the two columns a result needs.
func (g group) valid() bool { return g.time >= 0 && g.busbw >= 0 }

// defaultLayout is assumed for rows seen before any header line (a capture
// that lost its head): the modern 13-column and the old 12-column forms.
func defaultLayout(n int) (layout, bool) {
	switch n {
	case 13: // size count type redop root + 2 × (time algbw busbw #wrong)
		return layout{fields: 13, size: 0, count: 1, typ: 2, redop: 3, root: 4,
			groups: [2]group{{5, 6, 7, 8}, {9, 10, 11, 12}}}, true
	case 12: // size count type redop + 2 × (time algbw busbw error)
		return layout{fields: 12, size: 0, count: 1, typ: 2, redop: 3, root: -1,
			groups: [2]group{{4, 5, 6, 7}, {8, 9, 10, 11}}}, true
	}
	return layout{}, false
}

type parser struct {
	run    *snapshot.AllReduceRun
	lay    layout
	hasLay bool

	ranks        map[int]struct{}
	seenFailures map[string]struct{}
	libVersion   string // from "nccl-library=NNNNN", used when no version line

	// Transport evidence, strongest first: per-channel "via NET/...",
	// "Using network X", then the plugin's "NET/X : Using" init line.
	chanIB, chanSocket bool
	netIB, netSocket   bool
	initIB, initSocket bool
}

func (p *parser) line(raw []byte) {
	raw = bytes.TrimRight(raw, "\r")
	raw = stripTag(raw)
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 {
		return
	}
	// NCCL log lines and failures can sit anywhere, even in a comment.
	p.logLine(trimmed)
	if p.failureLine(trimmed) {
		return
	}
	if trimmed[0] == '#' {
		p.comment(bytes.TrimSpace(trimmed[1:]))
		return
	}
	if p.footer(trimmed) {
		return
	}
	if trimmed[0] >= '0' && trimmed[0] <= '9' {
		p.row(trimmed)
	}
}

// stripTag removes the prefix that `mpirun --tag-output`
// ("[1,0]<stdout>:") or `srun --label` ("  0: ") puts before each line.
func stripTag(b []byte) []byte {
	if len(b) > 0 && b[0] == '[' {
		for _, tag := range [][]byte{[]byte("]<stdout>:"), []byte("]<stderr>:")} {
			if i := bytes.Index(b, tag); i > 0 && i < 32 {
				return b[i+len(tag):]
			}
		}
		return b
	}
	t := bytes.TrimLeft(b, " ")
	i := 0
	for i < len(t) && i < 8 && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i > 0 && i < len(t) && t[i] == ':' && (i+1 == len(t) || t[i+1] == ' ') {
		return t[i+1:]
	}
	return b
}

// Markers in NCCL's and nccl-tests' log lines.
const (
	tokNCCLVersion = "NCCL version "
	tokVia         = " via NET/"
	tokUsingNet    = "NCCL INFO Using network "
	tokNETIB       = "NCCL INFO NET/IB : Using"
	tokNETSocket   = "NCCL INFO NET/Socket : Using"
	tokGDR         = "/GDRDMA"
)

// failureLine records lines that say the test or NCCL failed.
func (p *parser) failureLine(b []byte) bool {
	for _, m := range [...]string{"Test NCCL failure", "Test CUDA failure", "Test failure", "NCCL WARN"} {
		if bytes.Contains(b, []byte(m)) {
			p.addFailure(b)
			return true
		}
	}
	return false
}

func (p *parser) addFailure(b []byte) {
	if len(b) > maxFailureLine {
		b = b[:maxFailureLine]
	}
	s := strings.ToValidUTF8(string(b), "?")
	if p.seenFailures == nil {
		p.seenFailures = make(map[string]struct{})
	}
	if _, dup := p.seenFailures[s]; dup {
		return
	}
	if len(p.run.Failures) >= maxFailures {
		return
	}
	p.seenFailures[s] = struct{}{}
	p.run.Failures = append(p.run.Failures, s)
}

// logLine picks the NCCL version and the transport out of NCCL's own
// log lines (NCCL_DEBUG=VERSION or INFO).
func (p *parser) logLine(b []byte) {
	if p.run.NCCLVersion == "" {
		if i := bytes.Index(b, []byte(tokNCCLVersion)); i >= 0 {
			if v := leadingVersion(b[i+len(tokNCCLVersion):]); v != "" {
				p.run.NCCLVersion = v
			}
		}
	}
	if i := bytes.Index(b, []byte(tokVia)); i >= 0 {
		rest := b[i+len(tokVia):]
		switch {
		case bytes.HasPrefix(rest, []byte("IB")):
			p.chanIB = true
			if bytes.Contains(rest, []byte(tokGDR)) {
				p.run.GPUDirect = true
			}
		case bytes.HasPrefix(rest, []byte("Socket")):
			p.chanSocket = true
		}
	}
	if i := bytes.Index(b, []byte(tokUsingNet)); i >= 0 {
		switch name := firstField(b[i+len(tokUsingNet):]); name {
		case "IB":
			p.netIB = true
		case "Socket":
			p.netSocket = true
		}
	}
	if bytes.Contains(b, []byte(tokNETIB)) {
		p.initIB = true
	}
	if bytes.Contains(b, []byte(tokNETSocket)) {
		p.initSocket = true
	}
}

// comment handles "#" lines: header, device list, version, footers.
func (p *parser) comment(b []byte) {
	switch {
	case bytes.HasPrefix(b, []byte("Rank ")):
		p.device(b)
	case bytes.HasPrefix(b, []byte("nccl-tests version ")):
		if i := bytes.Index(b, []byte("nccl-library=")); i >= 0 {
			p.libVersion = libraryVersion(firstField(b[i+len("nccl-library="):]))
		}
	case bytes.HasPrefix(b, []byte("size ")), bytes.HasPrefix(b, []byte("bytes ")):
		p.header(b)
	default:
		p.footer(b)
	}
}

// device counts "#  Rank  0 Group  0 Pid ... device  0 [..] NAME" lines,
// once per rank so repeated output does not inflate the count.
func (p *parser) device(b []byte) {
	f := bytes.Fields(b)
	if len(f) < 2 || !bytes.Contains(b, []byte(" device ")) {
		return
	}
	r, err := strconv.Atoi(string(f[1]))
	if err != nil || r < 0 {
		return
	}
	if p.ranks == nil {
		p.ranks = make(map[int]struct{})
	}
	if _, ok := p.ranks[r]; !ok && len(p.ranks) < maxRows {
		p.ranks[r] = struct{}{}
		p.run.Devices = len(p.ranks)
	}
}

// header reads the column header line. Names are matched, not positions:
// old layouts have no root column and an "error" (or "res") column where
// newer ones have "#wrong".
func (p *parser) header(b []byte) {
	f := bytes.Fields(b)
	if len(f) > maxFields {
		return
	}
	l := layout{fields: len(f), size: -1, count: -1, typ: -1, redop: -1, root: -1,
		groups: [2]group{noGroup(), noGroup()}}
	g := -1
	for i, tok := range f {
		switch string(tok) {
		case "size", "bytes":
			l.size = i
		case "count", "N":
			l.count = i
		case "type":
			l.typ = i
		case "redop", "op":
			l.redop = i
		case "root":
			l.root = i
		case "time":
			g++
			if g < len(l.groups) {
				l.groups[g].time = i
			}
		case "algbw":
			if g >= 0 && g < len(l.groups) {
				l.groups[g].algbw = i
			}
		case "busbw":
			if g >= 0 && g < len(l.groups) {
				l.groups[g].busbw = i
			}
		case "#wrong", "wrong", "error", "res":
			if g >= 0 && g < len(l.groups) {
				l.groups[g].wrong = i
			}
		}
	}
	if l.size < 0 || !l.groups[0].valid() {
		return
	}
	if !l.groups[1].valid() {
		l.groups[1] = noGroup()
	}
	p.lay, p.hasLay = l, true
}

// footer reads "Out of bounds values" and "Avg bus bandwidth"; old
// nccl-tests print them without the leading "#".
func (p *parser) footer(b []byte) bool {
	switch {
	case bytes.HasPrefix(b, []byte("Out of bounds values")):
		f := bytes.Fields(afterColon(b))
		if len(f) == 0 {
			return true
		}
		n, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil {
			return true
		}
		p.run.OutOfBounds = &n
		p.run.OutOfBoundsFailed = n > 0 || (len(f) > 1 && string(f[1]) == "FAILED")
		return true
	case bytes.HasPrefix(b, []byte("Avg bus bandwidth")):
		f := bytes.Fields(afterColon(b))
		if len(f) == 0 {
			return true
		}
		if v, ok := parseBW(f[0]); ok {
			p.run.AvgBusBW = &v
		}
		// With NCCL_TESTS_MIN_BW set the test judges itself and exits non-zero.
		if len(f) > 1 && string(f[1]) == "FAILED" {
			p.addFailure(b)
		}
		return true
	}
	return false
}

// row parses one table line. A line that does not fit the layout is noise
// (an interleaved warning that happens to start with a digit), not an error.
func (p *parser) row(b []byte) {
	if len(p.run.Rows) >= maxRows {
		return
	}
	var buf [maxFields][]byte
	f := splitFields(b, buf[:0])
	if f == nil {
		return
	}
	// Rows before any header, or ones the header does not describe, are
	// tried against the usual layouts; the field checks below keep noise out.
	l := p.lay
	if !p.hasLay || len(f) != l.fields {
		var ok bool
		if l, ok = defaultLayout(len(f)); !ok {
			return
		}
	}
	var r snapshot.AllReduceRow
	var err error
	if r.SizeBytes, err = strconv.ParseUint(string(f[l.size]), 10, 64); err != nil {
		return
	}
	if l.count >= 0 {
		if r.Count, err = strconv.ParseUint(string(f[l.count]), 10, 64); err != nil {
			return
		}
	}
	if l.typ >= 0 {
		r.Type = string(f[l.typ])
		if !isWord(r.Type) {
			return
		}
	}
	if l.redop >= 0 {
		r.RedOp = string(f[l.redop])
		if !isWord(r.RedOp) {
			return
		}
	}
	if l.root >= 0 {
		if _, err := strconv.Atoi(string(f[l.root])); err != nil {
			return
		}
	}
	var ok bool
	if r.OutOfPlace, ok = parseGroup(f, l.groups[0]); !ok {
		return
	}
	if l.groups[1].valid() {
		if r.InPlace, ok = parseGroup(f, l.groups[1]); !ok {
			return
		}
	}
	p.run.Rows = append(p.run.Rows, r)
}

func parseGroup(f [][]byte, g group) (snapshot.AllReduceResult, bool) {
	var res snapshot.AllReduceResult
	var ok bool
	if res.TimeUS, ok = parseBW(f[g.time]); !ok {
		return res, false
	}
	if g.algbw >= 0 {
		if res.AlgBW, ok = parseBW(f[g.algbw]); !ok {
			return res, false
		}
	}
	if res.BusBW, ok = parseBW(f[g.busbw]); !ok {
		return res, false
	}
	if g.wrong >= 0 {
		if res.Wrong, ok = parseWrong(f[g.wrong]); !ok {
			return res, false
		}
	}
	return res, true
}

// parseWrong reads the validation column. "#wrong" is a count of wrong
// elements; "N/A" means not validated. Old nccl-tests print the largest
// relative error instead ("1e-07"): a magnitude the test itself judges in
// the "Out of bounds" footer, so it is not reported as a count.
func parseWrong(b []byte) (*uint64, bool) {
	s := string(b)
	if s == "N/A" {
		return nil, true
	}
	if n, err := strconv.ParseUint(s, 10, 64); err == nil {
		return &n, true
	}
	if _, ok := parseBW(b); ok {
		return nil, true
	}
	return nil, false
}

// parseBW reads a non-negative finite decimal number.
func parseBW(b []byte) (float64, bool) {
	if len(b) == 0 || len(b) > 32 {
		return 0, false
	}
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
			return 0, false // rejects "NaN", "Inf" and hex floats
		}
	}
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, false
	}
	return v, true
}

// splitFields splits on spaces and tabs into dst without allocating;
// nil when the line has more than maxFields fields.
func splitFields(b []byte, dst [][]byte) [][]byte {
	i := 0
	for i < len(b) {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
			i++
		}
		if i == len(b) {
			break
		}
		j := i
		for j < len(b) && b[j] != ' ' && b[j] != '\t' {
			j++
		}
		if len(dst) == cap(dst) {
			return nil
		}
		dst = append(dst, b[i:j])
		i = j
	}
	return dst
}

func isWord(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func afterColon(b []byte) []byte {
	if i := bytes.IndexByte(b, ':'); i >= 0 {
		return b[i+1:]
	}
	return nil
}

func firstField(b []byte) string {
	f := bytes.Fields(b)
	if len(f) == 0 {
		return ""
	}
	return string(f[0])
}

// leadingVersion returns "2.26.2" from "2.26.2+cuda12.8 ...": the NCCL
// version without the CUDA build suffix, which is what a baseline's stack
// key compares.
func leadingVersion(b []byte) string {
	end := 0
	dots := 0
	for end < len(b) && end < 24 {
		c := b[end]
		if c == '.' {
			dots++
		} else if c < '0' || c > '9' {
			break
		}
		end++
	}
	v := string(bytes.TrimRight(b[:end], "."))
	if dots < 1 || v == "" || v[0] == '.' {
		return ""
	}
	return v
}

// libraryVersion decodes NCCL_VERSION_CODE ("21903" → "2.19.3"). NCCL 2.9
// moved from major*1000+minor*100+patch to major*10000+minor*100+patch.
func libraryVersion(code string) string {
	n, err := strconv.Atoi(code)
	if err != nil || n <= 0 || n > 999999 {
		return ""
	}
	if n >= 10000 {
		return fmt.Sprintf("%d.%d.%d", n/10000, n%10000/100, n%100)
	}
	return fmt.Sprintf("%d.%d.%d", n/1000, n%1000/100, n%100)
}

// finish settles what needs the whole input. Any sign of a socket
// fallback wins over IB evidence: in a multi-node run one node falling
// back to TCP is enough to make the whole collective slow.
func (p *parser) finish() {
	if p.run.NCCLVersion == "" {
		p.run.NCCLVersion = p.libVersion
	}
	switch {
	case p.chanSocket:
		p.run.Transport = "Socket"
	case p.chanIB:
		p.run.Transport = "IB"
	case p.netSocket:
		p.run.Transport = "Socket"
	case p.netIB:
		p.run.Transport = "IB"
	case p.initSocket:
		p.run.Transport = "Socket"
	case p.initIB:
		p.run.Transport = "IB"
	}
}
