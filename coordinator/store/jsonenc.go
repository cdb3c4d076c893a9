package store

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

// The JSON of a check's findings and metrics is written here, without
// encoding/json: it runs for every check of every result, outside the
// writer but on the coordinator's CPU, and a result carries hundreds of
// metrics. Readers decode these columns with encoding/json, and the bytes
// are the ones encoding/json writes (json.Marshal of the findings, and of
// the metrics map once the values JSON cannot carry are dropped): the
// tests in jsonenc_test.go and the fuzz targets FuzzMetricsJSON and
// FuzzFindingsJSON compare the two.
//
// Where the time went (a 13-check, ~350-metric result): sorting the keys,
// scanning them for characters to escape, and one allocation per column.
// So a result's columns are appended to one pooled buffer and made into one
// string, and each check's sorted key order, with its keys already quoted,
// is remembered (metricOrders): agents send the same metric names for a
// check with every result, and a map whose keys are those of a remembered
// order is written in that order, looking each key up once.

// jsonBufs holds the buffers prepare appends a result's JSON to.
var jsonBufs = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// maxPooledJSON is the largest buffer put back in jsonBufs: one huge result
// should not stay in the pool.
const maxPooledJSON = 1 << 20

// appendFindingsJSON appends fs as json.Marshal writes a []report.Finding,
// with [] for none (nil included). TestFindingFieldsEncoded fails when a
// field is added to report.Finding and not here.
func appendFindingsJSON(dst []byte, fs []report.Finding) []byte {
	if len(fs) == 0 {
		return append(dst, "[]"...)
	}
	dst = append(dst, '[')
	for i := range fs {
		f := &fs[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"severity":`...)
		dst = appendJSONString(dst, string(f.Severity))
		dst = append(dst, `,"component":`...)
		dst = appendJSONString(dst, f.Component)
		if f.PCIBusID != "" {
			dst = append(dst, `,"pci_bus_id":`...)
			dst = appendJSONString(dst, f.PCIBusID)
		}
		dst = append(dst, `,"code":`...)
		dst = appendJSONString(dst, f.Code)
		dst = append(dst, `,"message":`...)
		dst = appendJSONString(dst, f.Message)
		dst = append(dst, `,"action":`...)
		dst = appendJSONString(dst, string(f.Action))
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

// jsonValue says whether a metric value is written: NaN, ±Inf and
// magnitudes over 1e308 are dropped (JSON cannot carry the first ones; the
// report contract forbids them all), as the store always has.
func jsonValue(v float64) bool { return finite(v) == v }

// appendMetricsJSON appends m as json.Marshal writes it (keys sorted, each
// value as encoding/json formats a float64), without the values jsonValue
// drops; {} for an empty or nil map. check names the check, for the
// remembered key orders; orders may be nil.
func appendMetricsJSON(dst []byte, orders *metricOrders, check string, m map[string]float64) []byte {
	if len(m) == 0 {
		return append(dst, "{}"...)
	}
	slot := orders.slot(check)
	if slot != nil {
		if list := slot.load(); list != nil {
			for _, o := range *list {
				if len(o.keys) != len(m) {
					continue
				}
				if out, ok := o.appendTo(dst, m); ok {
					return out
				}
				// Same count, other names: appendTo wrote only past len(dst).
			}
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if slot != nil {
		if o := newMetricOrder(keys); o != nil {
			orders.remember(slot, o)
			out, _ := o.appendTo(dst, m) // its keys are m's
			return out
		}
	}
	return appendSortedMetricsJSON(dst, keys, m)
}

// appendSortedMetricsJSON appends the JSON object of m's keys (sorted),
// leaving out values JSON cannot hold.
func appendSortedMetricsJSON(dst []byte, keys []string, m map[string]float64) []byte {
	dst = append(dst, '{')
	first := true
	for _, k := range keys {
		v := m[k]
		if !jsonValue(v) {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendJSONString(dst, k)
		dst = append(dst, ':')
		dst = appendJSONFloat(dst, v)
	}
	return append(dst, '}')
}

// metricOrder is one remembered key set of a check's metrics: its keys,
// sorted, and each as encoding/json writes it with the colon after it.
type metricOrder struct {
	keys   []string // sorted and distinct, substrings of one string
	quoted []string // `"key":`, substrings of one string
	size   int64    // bytes it holds, about
}

// Bounds on what is remembered. Agents name their checks and metrics, so
// what is remembered is bounded whatever they send: at most maxOrderChecks
// check names, each with its maxOrdersPerCheck latest key sets (nodes with
// other hardware have other metric names for a check), and maxOrderBytes
// in all, a key set at most a sixteenth of it. Past the bounds, keys are
// sorted every time, as they were before anything was remembered.
const (
	maxOrderChecks    = 512
	maxOrdersPerCheck = 8
	maxOrderBytes     = 16 << 20
)

// newMetricOrder makes the order of sorted keys, or nil when it is too
// big to remember.
func newMetricOrder(sorted []string) *metricOrder {
	n := 0
	for _, k := range sorted {
		n += len(k)
	}
	const perKey = 2 * 16 // the two string headers
	if int64(2*n+perKey*len(sorted)) > maxOrderBytes/16 {
		return nil
	}
	raw := make([]byte, 0, n)
	quoted := make([]byte, 0, n+3*len(sorted))
	qend := make([]int, len(sorted))
	for i, k := range sorted {
		raw = append(raw, k...)
		quoted = appendJSONString(quoted, k)
		quoted = append(quoted, ':')
		qend[i] = len(quoted)
	}
	rs, qs := string(raw), string(quoted)
	o := &metricOrder{keys: make([]string, len(sorted)), quoted: make([]string, len(sorted)),
		size: int64(len(rs) + len(qs) + perKey*len(sorted) + 64)}
	ri, qi := 0, 0
	for i, k := range sorted {
		o.keys[i] = rs[ri : ri+len(k)]
		ri += len(k)
		o.quoted[i] = qs[qi:qend[i]]
		qi = qend[i]
	}
	return o
}

// appendTo writes m in o's order. It fails, having appended only past
// len(dst), when a key of o is not in m; with len(m) == len(o.keys) and
// every key found, o's keys are m's.
func (o *metricOrder) appendTo(dst []byte, m map[string]float64) ([]byte, bool) {
	start := len(dst)
	dst = append(dst, '{')
	first := true
	for i, k := range o.keys {
		v, ok := m[k]
		if !ok {
			return dst[:start], false
		}
		if !jsonValue(v) {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, o.quoted[i]...)
		dst = appendJSONFloat(dst, v)
	}
	return append(dst, '}'), true
}

// metricOrders remembers key orders by check name. Reads take no lock:
// the map of slots is replaced whole when a name is added (at most
// maxOrderChecks times), and each slot's list is replaced whole.
type metricOrders struct {
	mu     sync.Mutex // serializes additions to slots
	slots  atomic.Pointer[map[string]*orderSlot]
	bytes  atomic.Int64 // the size of the orders in the slots
	budget int64        // most bytes remembered; 0: maxOrderBytes
}

type orderSlot struct {
	list atomic.Pointer[[]*metricOrder] // newest first
}

// slot returns check's slot, adding it while there is room; nil when there
// is none, or on a nil metricOrders.
func (c *metricOrders) slot(check string) *orderSlot {
	if c == nil {
		return nil
	}
	if p := c.slots.Load(); p != nil {
		if s, ok := (*p)[check]; ok {
			return s
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var cur map[string]*orderSlot
	if p := c.slots.Load(); p != nil {
		cur = *p
	}
	if s, ok := cur[check]; ok {
		return s
	}
	if len(cur) >= maxOrderChecks {
		return nil
	}
	next := make(map[string]*orderSlot, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	s := &orderSlot{}
	next[check] = s
	c.slots.Store(&next)
	return s
}

func (s *orderSlot) load() *[]*metricOrder { return s.list.Load() }

// remember puts o first in s, dropping the oldest beyond
// maxOrdersPerCheck, while the budget allows.
func (c *metricOrders) remember(s *orderSlot, o *metricOrder) {
	budget := c.budget
	if budget == 0 {
		budget = maxOrderBytes
	}
	for { // reserve o's bytes
		cur := c.bytes.Load()
		if cur+o.size > budget {
			return
		}
		if c.bytes.CompareAndSwap(cur, cur+o.size) {
			break
		}
	}
	for {
		old := s.list.Load()
		next := []*metricOrder{o}
		var dropped int64
		if old != nil {
			keep := min(len(*old), maxOrdersPerCheck-1)
			next = append(next, (*old)[:keep]...)
			for _, d := range (*old)[keep:] {
				dropped += d.size
			}
		}
		if s.list.CompareAndSwap(old, &next) {
			c.bytes.Add(-dropped)
			return
		}
	}
}

// jsonSafe says which ASCII bytes encoding/json copies into a string as they
// are (its htmlSafeSet: it escapes <, > and & by default).
var jsonSafe = func() (t [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\' && b != '<' && b != '>' && b != '&'
	}
	return t
}()

const jsonHex = "0123456789abcdef"

// appendJSONString appends s quoted as encoding/json quotes a string:
// \" \\ \b \f \n \r \t, \u00XX for the other control bytes and for < > &,
// \ufffd for each byte that is not valid UTF-8, \u2028 and \u2029.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if jsonSafe[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', jsonHex[b>>4], jsonHex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', jsonHex[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendJSONFloat formats a finite v as encoding/json does: like
// ECMAScript, plain decimals between 1e-6 and 1e21, exponents outside,
// without a leading zero in the exponent.
func appendJSONFloat(b []byte, v float64) []byte {
	// Most metrics are counts. An integer below 2^53 in magnitude is its own
	// shortest form, and 'f' writes it as its digits (but -0 as "-0").
	if v == math.Trunc(v) && math.Abs(v) < 1<<53 && (v != 0 || !math.Signbit(v)) {
		return strconv.AppendInt(b, int64(v), 10)
	}
	format := byte('f')
	if abs := math.Abs(v); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, v, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
