package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/inspect"
)

// wantMetricsJSON is what the store wrote before it had its own encoder:
// json.Marshal of the values JSON can carry, {} for an empty map.
func wantMetricsJSON(t testing.TB, m map[string]float64) string {
	t.Helper()
	if len(m) == 0 {
		return "{}"
	}
	clean := make(map[string]float64, len(m))
	for k, v := range m {
		if finite(v) == v {
			clean[k] = v
		}
	}
	b, err := json.Marshal(clean)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wantFindingsJSON is what the store wrote before: json.Marshal, with []
// for none.
func wantFindingsJSON(t testing.TB, fs []report.Finding) string {
	t.Helper()
	if fs == nil {
		fs = []report.Finding{}
	}
	b, err := json.Marshal(fs)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkMetricsJSON encodes m every way the store can: without remembered
// orders, and with orders (the first call may make one, the second finds
// it), each after a prefix, and compares with encoding/json.
func checkMetricsJSON(t testing.TB, orders *metricOrders, check string, m map[string]float64) {
	t.Helper()
	want := wantMetricsJSON(t, m)
	for _, o := range []*metricOrders{nil, orders, orders} {
		got := appendMetricsJSON([]byte("prefix"), o, check, m)
		if string(got) != "prefix"+want {
			t.Fatalf("metrics %#v (check %q, orders %v)\n got %s\nwant prefix%s", m, check, o != nil, got, want)
		}
	}
}

func TestMetricsJSONTable(t *testing.T) {
	t.Parallel()
	nan, inf := math.NaN(), math.Inf(1)
	for _, tc := range []struct {
		m    map[string]float64
		want string // literal, besides the comparison with encoding/json
	}{
		{nil, `{}`},
		{map[string]float64{}, `{}`},
		{map[string]float64{"a": nan}, `{}`},
		{map[string]float64{"a": nan, "b": inf, "c": math.Inf(-1), "d": 1.5e308, "e": -1.5e308}, `{}`},
		{map[string]float64{"b": 2, "a": 1, "c": nan}, `{"a":1,"b":2}`},
		{map[string]float64{"a": nan, "b": 2}, `{"b":2}`},
		{map[string]float64{"gpu0.temperature_c": 31, "gpu0.power_w": 70.33, "ib.mlx5_4.port1.port_xmit_wait_count": 2.489603687e+09},
			`{"gpu0.power_w":70.33,"gpu0.temperature_c":31,"ib.mlx5_4.port1.port_xmit_wait_count":2489603687}`},
		{map[string]float64{"z": math.Copysign(0, -1), "y": 0}, `{"y":0,"z":-0}`},
		{map[string]float64{"a": 1e-6, "b": 9.99e-7, "c": 1e-7, "d": 1e20, "e": 1e21, "f": 123456789.125},
			`{"a":0.000001,"b":9.99e-7,"c":1e-7,"d":100000000000000000000,"e":1e+21,"f":123456789.125}`},
		{map[string]float64{"max": math.MaxFloat64, "tiny": math.SmallestNonzeroFloat64, "big": 1e308, "neg": -2.5e-300},
			`{"big":1e+308,"neg":-2.5e-300,"tiny":5e-324}`},
		{map[string]float64{"": 1, "q\"uote": 2, `back\slash`: 3}, `{"":1,"back\\slash":3,"q\"uote":2}`},
		{map[string]float64{"x<y": 1, "a>b": 2, "amp&": 3}, `{"a\u003eb":2,"amp\u0026":3,"x\u003cy":1}`},
		{map[string]float64{"ctl\x01": 1, "tab\t": 2, "nl\n": 3, "cr\r": 4, "bs\b": 5, "ff\f": 6, "nul\x00": 7, "us\x1f": 8, "del\x7f": 9},
			`{"bs\b":5,"cr\r":4,"ctl\u0001":1,"del` + "\x7f" + `":9,"ff\f":6,"nl\n":3,"nul\u0000":7,"tab\t":2,"us\u001f":8}`},
		{map[string]float64{"é.utf8": 1, "ls\u2028": 2, "ps\u2029": 3, "emoji😀": 4},
			`{"emoji😀":4,"ls\u2028":2,"ps\u2029":3,"é.utf8":1}`},
		{map[string]float64{"bad\xff": 1, "bad\xfe": 2, "cut\xe2\x80": 3, "surrogate\xed\xa0\x80": 4},
			`{"bad\ufffd":2,"bad\ufffd":1,"cut\ufffd\ufffd":3,"surrogate\ufffd\ufffd\ufffd":4}`},
	} {
		if got := wantMetricsJSON(t, tc.m); got != tc.want {
			t.Fatalf("encoding/json wrote %s, the table says %s", got, tc.want)
		}
		checkMetricsJSON(t, &metricOrders{}, "c", tc.m)
	}
}

// appendJSONFloat's shortcut for integers writes what strconv does.
func TestJSONFloatIntegers(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	vals := []float64{0, math.Copysign(0, -1), 1, -1, 1 << 53, 1<<53 - 1, -(1<<53 - 1), 1<<53 + 2, 1e15, 1e16, 1e20, 1e21,
		2.489603687e+09, 0.5, -0.5, 1e-7, math.MaxInt64, math.MinInt64}
	for range 100000 {
		e := rng.IntN(60)
		v := math.Trunc(rng.Float64() * math.Pow(2, float64(e)))
		if rng.IntN(2) == 0 {
			v = -v
		}
		vals = append(vals, v, v+0.5, math.Nextafter(v, math.Inf(1)))
	}
	for _, v := range vals {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONFloat(nil, v); string(got) != string(b) {
			t.Fatalf("%v: got %s, want %s", v, got, b)
		}
	}
}

// Random maps of tricky names and values, the test the store had before
// its encoder remembered key orders; now also with orders shared between
// the maps, under a few check names.
func TestMetricsJSONRandom(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"gpu0.temp_c", "ib.mlx5_0.1.symbol_error", "a", "Z", "x<y", "q\"uote", "back\\slash", "ctl\x01",
		"é.utf8", "amp&", "tab\t", "bad\xff", "del\x7f", "", "ls\u2028"}
	values := []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 1e-6, 9.99e-7, 1e-7, 1e20, 1e21, 123456789.125, -2.5e-300,
		math.MaxFloat64, math.SmallestNonzeroFloat64, math.NaN(), math.Inf(1), math.Inf(-1), 1e308, 1.5e308, 400}
	orders := &metricOrders{}
	for range 2000 {
		m := map[string]float64{}
		for range rng.IntN(20) {
			m[keys[rng.IntN(len(keys))]+fmt.Sprint(rng.IntN(3))] = values[rng.IntN(len(values))] * float64(rng.IntN(5)+1)
		}
		checkMetricsJSON(t, orders, fmt.Sprint("check", rng.IntN(3)), m)
	}
}

// ordersBytes adds up the sizes of the orders in orders' slots.
func ordersBytes(orders *metricOrders) int64 {
	var n int64
	if p := orders.slots.Load(); p != nil {
		for _, s := range *p {
			if l := s.load(); l != nil {
				for _, o := range *l {
					n += o.size
				}
			}
		}
	}
	return n
}

// A check's remembered orders: key sets of the same size and other names,
// more sets than are kept, a set growing and shrinking, values that come
// and go (dropped or not), a key set too big to remember, and more check
// names than are remembered.
func TestMetricOrders(t *testing.T) {
	t.Parallel()
	orders := &metricOrders{}
	sets := [][]string{
		{"gpu0.a", "gpu0.b", "gpu1.a", "gpu1.b"},
		{"gpu0.a", "gpu0.b", "gpu2.a", "gpu2.b"}, // same size, last keys differ
		{"hca0.x", "gpu0.b", "gpu1.a", "gpu1.b"}, // same size, first key differs
		{"gpu0.a", "gpu0.b"},
		{"gpu0.a", "gpu0.b", "gpu1.a", "gpu1.b", "gpu2.a"},
	}
	for i := range maxOrdersPerCheck {
		sets = append(sets, []string{fmt.Sprint("s", i, ".a"), fmt.Sprint("s", i, ".b"), "x", "y"})
	}
	for round := range 5 {
		for i, set := range sets {
			m := map[string]float64{}
			for j, k := range set {
				m[k] = float64(j*10 + round)
				if (i+j+round)%4 == 0 {
					m[k] = math.NaN()
				}
			}
			checkMetricsJSON(t, orders, "gpu.x", m)
		}
	}
	list := orders.slot("gpu.x").load()
	if n := len(*list); n != maxOrdersPerCheck {
		t.Fatalf("%d orders kept for a check, want %d", n, maxOrdersPerCheck)
	}
	if got, want := orders.bytes.Load(), ordersBytes(orders); got != want {
		t.Fatalf("orders counted as %d bytes, hold %d", got, want)
	}
	// Too big to remember: written right, not remembered.
	big := map[string]float64{}
	for i := range 25000 {
		big[fmt.Sprintf("k%06d", i)] = float64(i)
	}
	checkMetricsJSON(t, orders, "gpu.big", big)
	if l := orders.slot("gpu.big").load(); l != nil {
		t.Fatalf("%d orders remembered for a map of %d keys", len(*l), len(big))
	}
	for i := range maxOrderChecks + 10 {
		checkMetricsJSON(t, orders, fmt.Sprint("check.", i), map[string]float64{"k": float64(i)})
	}
	if n := len(*orders.slots.Load()); n != maxOrderChecks {
		t.Fatalf("%d check names remembered, want at most %d", n, maxOrderChecks)
	}
	if orders.slot("one.more") != nil {
		t.Fatal("a check name remembered past the bound")
	}
}

// Past its byte budget, metricOrders remembers nothing more, and still
// writes every map right.
func TestMetricOrdersBudget(t *testing.T) {
	t.Parallel()
	const budget = 4 << 10
	orders := &metricOrders{budget: budget}
	for i := range 100 {
		m := map[string]float64{}
		for j := range 10 {
			m[fmt.Sprintf("gpu%d.metric_%d", j, i)] = float64(j)
		}
		checkMetricsJSON(t, orders, fmt.Sprint("check.", i%20), m)
	}
	got := orders.bytes.Load()
	if got > budget || got < budget/2 {
		t.Fatalf("orders of %d bytes remembered, budget %d", got, budget)
	}
	if want := ordersBytes(orders); got != want {
		t.Fatalf("orders counted as %d bytes, hold %d", got, want)
	}
}

// Many goroutines, few check names, key sets changing under them (for the
// race detector as much as for the bytes).
func TestMetricOrdersConcurrent(t *testing.T) {
	t.Parallel()
	orders := &metricOrders{}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := range 300 {
				m := map[string]float64{}
				for j := range 3 + rng.IntN(3) {
					m[fmt.Sprintf("gpu%d.m%d", rng.IntN(2), j)] = float64(i)
				}
				want := wantMetricsJSON(t, m)
				if got := appendMetricsJSON(nil, orders, fmt.Sprint("c", i%3), m); string(got) != want {
					t.Errorf("got %s, want %s", got, want)
					return
				}
			}
		})
	}
	wg.Wait()
	if got, want := orders.bytes.Load(), ordersBytes(orders); got != want {
		t.Fatalf("orders counted as %d bytes, hold %d", got, want)
	}
}

func TestFindingsJSON(t *testing.T) {
	t.Parallel()
	for _, fs := range [][]report.Finding{
		nil,
		{},
		{{}},
		{{Severity: report.SevFail, Component: "GPU3", Code: "ECC_UNCORRECTABLE", Message: "3 uncorrectable", Action: report.ActionResetGPU}},
		{{Severity: report.SevWarn, Component: "mlx5_4/1", PCIBusID: "0000:1a:00.0", Code: "LINK_DOWN", Message: "port <down> & \"out\"\n",
			Action: report.ActionMonitor}, {Severity: "fail\xff", Component: "ctl\x01\u2028", Message: "é😀\\"}},
	} {
		want := wantFindingsJSON(t, fs)
		if got := appendFindingsJSON([]byte("prefix"), fs); string(got) != "prefix"+want {
			t.Fatalf("findings %#v\n got %s\nwant prefix%s", fs, got, want)
		}
	}
}

// appendFindingsJSON writes report.Finding's fields by hand: this fails
// when one is added, renamed, retagged or made other than a string.
func TestFindingFieldsEncoded(t *testing.T) {
	t.Parallel()
	typ := reflect.TypeFor[report.Finding]()
	for _, filled := range []bool{false, true} {
		var f report.Finding
		v := reflect.ValueOf(&f).Elem()
		for i := range typ.NumField() {
			if typ.Field(i).Type.Kind() != reflect.String {
				t.Fatalf("report.Finding.%s is a %s: teach appendFindingsJSON to write it", typ.Field(i).Name, typ.Field(i).Type)
			}
			if filled {
				v.Field(i).SetString(fmt.Sprintf("v%d<\"%s\">", i, typ.Field(i).Name))
			}
		}
		fs := []report.Finding{f}
		if got, want := string(appendFindingsJSON(nil, fs)), wantFindingsJSON(t, fs); got != want {
			t.Fatalf("report.Finding changed: teach appendFindingsJSON\n got %s\nwant %s", got, want)
		}
	}
}

// The rows Ingest prepares carry the same JSON as the encoders alone.
func TestPrepareJSONColumns(t *testing.T) {
	t.Parallel()
	r := &Result{Finished: time.Now(), Checks: []report.CheckResult{
		{Name: "a", Metrics: map[string]float64{"x": 1, "y": math.NaN()}},
		{Name: "b", Findings: []report.Finding{{Severity: report.SevWarn, Code: "C<"}}},
		{Name: "c"},
	}}
	for range 18 { // past the ends array prepare keeps on its stack
		r.Checks = append(r.Checks, report.CheckResult{Name: fmt.Sprint("n", len(r.Checks)), Metrics: map[string]float64{"k": 2}})
	}
	orders := &metricOrders{}
	for range 2 {
		p := prepare(r, orders, nil)
		for i, c := range r.Checks {
			if got, want := p.checks[i].metrics, wantMetricsJSON(t, c.Metrics); got != want {
				t.Fatalf("check %s metrics %s, want %s", c.Name, got, want)
			}
			if got, want := p.checks[i].findings, wantFindingsJSON(t, c.Findings); got != want {
				t.Fatalf("check %s findings %s, want %s", c.Name, got, want)
			}
		}
	}
}

// fuzzMetrics reads a map from data: entries of a length byte, that many
// bytes of name and eight bytes of float64.
func fuzzMetrics(data []byte) map[string]float64 {
	m := map[string]float64{}
	for len(data) > 0 {
		n := min(int(data[0])%32, len(data)-1)
		k := string(data[1 : 1+n])
		data = data[1+n:]
		var bits [8]byte
		data = data[copy(bits[:], data):]
		m[k] = math.Float64frombits(binary.LittleEndian.Uint64(bits[:]))
	}
	return m
}

func fuzzEntry(k string, v float64) []byte {
	return binary.LittleEndian.AppendUint64(append([]byte{byte(len(k))}, k...), math.Float64bits(v))
}

// fuzzOrders is shared by FuzzMetricsJSON's inputs, so that maps meet the
// orders remembered for others under the same check name.
var fuzzOrders metricOrders

func FuzzMetricsJSON(f *testing.F) {
	for _, seed := range [][]byte{
		nil,
		fuzzEntry("gpu0.temperature_c", 31),
		slices.Concat(fuzzEntry("gpu0.power_w", 70.33), fuzzEntry("ib.mlx5_4.port1.port_xmit_wait_count", 2.489603687e+09)),
		slices.Concat(fuzzEntry("a", math.NaN()), fuzzEntry("b", math.Inf(-1)), fuzzEntry("c", 1.5e308), fuzzEntry("d", 1e308)),
		slices.Concat(fuzzEntry("q\"uote", 1e-7), fuzzEntry(`back\slash`, 1e21), fuzzEntry("x<y>&", math.Copysign(0, -1))),
		slices.Concat(fuzzEntry("ctl\x00\x01\b\f\n\r\t\x1f\x7f", 5e-324), fuzzEntry("", math.MaxFloat64)),
		slices.Concat(fuzzEntry("ls\u2028ps\u2029", 1), fuzzEntry("bad\xff", 2), fuzzEntry("bad\xfe", 3), fuzzEntry("cut\xe2\x80", 4)),
		slices.Concat(fuzzEntry("é😀", 123456789.125), fuzzEntry("\xed\xa0\x80", -2.5e-300)),
	} {
		f.Add(byte(0), seed)
		f.Add(byte(1), seed)
	}
	f.Fuzz(func(t *testing.T, check byte, data []byte) {
		checkMetricsJSON(t, &fuzzOrders, fmt.Sprint("check", check%3), fuzzMetrics(data))
	})
}

func FuzzFindingsJSON(f *testing.F) {
	f.Add("fail", "GPU3", "", "ECC_UNCORRECTABLE", "3 uncorrectable errors", "reset_gpu", 1)
	f.Add("warn", "mlx5_4/1", "0000:1a:00.0", "LINK<DOWN>", "a \"port\" & \\ \n\t\x01", "monitor", 2)
	f.Add("\xff", "\u2028\u2029", "\x7f", "é😀", "\xe2\x80", "", 0)
	f.Fuzz(func(t *testing.T, sev, comp, pci, code, msg, action string, n int) {
		f := report.Finding{Severity: report.Severity(sev), Component: comp, PCIBusID: pci, Code: code, Message: msg,
			Action: report.Action(action)}
		var fs []report.Finding
		for range n & 3 {
			fs = append(fs, f)
			f.PCIBusID, f.Code = f.Code, f.PCIBusID
		}
		want := wantFindingsJSON(t, fs)
		if got := appendFindingsJSON(nil, fs); string(got) != want {
			t.Fatalf("findings %#v\n got %s\nwant %s", fs, got, want)
		}
	})
}

var (
	h100Once   sync.Once
	h100Report report.Report
	h100Err    error
)

// h100Result is a full result as the coordinator receives it from a
// healthy H100 node: examples/bundles/h100-healthy analyzed with every
// passive check (13 checks, ~350 metrics), as the load generator does.
func h100Result(tb testing.TB) *Result {
	tb.Helper()
	h100Once.Do(func() {
		b, err := bundle.Open("../../examples/bundles/h100-healthy")
		if err != nil {
			h100Err = err
			return
		}
		list, err := checks.Select(registry.All(), nil, false)
		if err != nil {
			h100Err = err
			return
		}
		h100Report = inspect.Run(context.Background(), b, inspect.Options{Checks: list}).Report
	})
	if h100Err != nil {
		tb.Fatal(h100Err)
	}
	now := time.Now()
	return &Result{ID: "r", Node: "n", Started: now, Finished: now, Status: report.Pass, Full: true,
		Checks: h100Report.Checks, Inventory: &h100Report.Inventory}
}

func TestPrepareH100(t *testing.T) {
	t.Parallel()
	r := h100Result(t)
	orders := &metricOrders{}
	n := 0
	for range 2 {
		p := prepare(r, orders, nil)
		for i, c := range r.Checks {
			n += len(c.Metrics)
			if got, want := p.checks[i].metrics, wantMetricsJSON(t, c.Metrics); got != want {
				t.Fatalf("check %s metrics\n got %s\nwant %s", c.Name, got, want)
			}
			if got, want := p.checks[i].findings, wantFindingsJSON(t, c.Findings); got != want {
				t.Fatalf("check %s findings %s, want %s", c.Name, got, want)
			}
		}
	}
	if n < 2*300 {
		t.Fatalf("the h100-healthy result has %d metrics, expected ~350", n/2)
	}
}

// prepareBefore is prepare before this file's encoders: findings through
// json.Marshal, metrics through marshalMetricsBefore, a string each. Kept
// for BenchmarkMetricsJSON.
func prepareBefore(r *Result) (*prepared, error) {
	p := &prepared{checks: make([]preparedCheck, len(r.Checks))}
	for i := range r.Checks {
		c := &r.Checks[i]
		findings := c.Findings
		if findings == nil {
			findings = []report.Finding{}
		}
		fj, err := json.Marshal(findings)
		if err != nil {
			return nil, err
		}
		mj, err := marshalMetricsBefore(c.Metrics)
		if err != nil {
			return nil, err
		}
		p.checks[i] = preparedCheck{findings: string(fj), metrics: mj, detail: CheckDetail(*c),
			reason: clip(c.Reason), duration: finite(c.DurationMS)}
	}
	if r.Inventory != nil {
		p.invSum = inventorySum(r.Inventory)
	}
	return p, nil
}

// marshalMetricsBefore is the store's metrics encoder before this file's:
// keys sorted every time, a strings.Builder per check, encoding/json for a
// name that needs escaping.
func marshalMetricsBefore(m map[string]float64) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	keys := make([]string, 0, len(m))
	size := 2
	for k, v := range m {
		if finite(v) == v {
			keys = append(keys, k)
			size += len(k) + 26
		}
	}
	slices.Sort(keys)
	var b strings.Builder // its String() does not copy
	b.Grow(size)
	b.WriteByte('{')
	var num [32]byte
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		if err := writeJSONStringBefore(&b, k); err != nil {
			return "", err
		}
		b.WriteByte(':')
		b.Write(appendJSONFloat(num[:0], m[k]))
	}
	b.WriteByte('}')
	return b.String(), nil
}

func writeJSONStringBefore(b *strings.Builder, s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, err := json.Marshal(s)
			b.Write(q)
			return err
		}
	}
	b.WriteByte('"')
	b.WriteString(s)
	b.WriteByte('"')
	return nil
}

// BenchmarkMetricsJSON prepares one full H100 result's rows (13 checks,
// ~350 metrics; its JSON is most of the work) per op:
//   - json.Marshal: the findings and metrics JSON alone, through
//     encoding/json (the store's first encoder), for scale;
//   - before: prepare as it was (prepareBefore);
//   - cold: prepare with no key order remembered (every map's keys sorted,
//     as for a check name past the bound);
//   - warm: prepare as Ingest runs it, key orders remembered.
func BenchmarkMetricsJSON(b *testing.B) {
	r := h100Result(b)
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for i := range r.Checks {
				c := &r.Checks[i]
				fs := c.Findings
				if fs == nil {
					fs = []report.Finding{}
				}
				if _, err := json.Marshal(fs); err != nil {
					b.Fatal(err)
				}
				if _, err := json.Marshal(c.Metrics); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("before", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := prepareBefore(r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cold", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			prepare(r, nil, nil)
		}
	})
	b.Run("warm", func(b *testing.B) {
		orders := &metricOrders{}
		b.ReportAllocs()
		for b.Loop() {
			prepare(r, orders, nil)
		}
	})
}
