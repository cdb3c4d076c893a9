package store

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

// keepShort keeps names of at most four bytes: a filter that keeps some
// of every test's names and drops others.
func keepShort(_, name string) bool { return len(name) <= 4 }

// checkDecodeMetrics decodes s with and without a filter and compares
// both with encoding/json's reading of s (filtered the same way): the
// same maps, an error exactly when encoding/json has one. It returns
// whether the fast scan read s.
func checkDecodeMetrics(t testing.TB, s string) bool {
	t.Helper()
	var want map[string]float64
	wantErr := json.Unmarshal([]byte(s), &want)
	for _, keep := range []func(check, name string) bool{nil, keepShort} {
		got, err := decodeMetrics(s, "c", keep)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("decode %q (filtered %v): error %v, encoding/json's %v", s, keep != nil, err, wantErr)
		}
		if err != nil {
			continue
		}
		w := maps.Clone(want)
		if w == nil {
			w = map[string]float64{}
		}
		if keep != nil {
			maps.DeleteFunc(w, func(k string, _ float64) bool { return !keep("c", k) })
		}
		if got == nil {
			got = map[string]float64{}
		}
		if !maps.EqualFunc(got, w, func(a, b float64) bool { return math.Float64bits(a) == math.Float64bits(b) }) {
			t.Fatalf("decode %q (filtered %v):\n got %v\nwant %v", s, keep != nil, got, w)
		}
	}
	_, fast := scanMetrics(s, "c", nil)
	return fast
}

func TestDecodeMetricsTable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		fast bool // read by the scan, not handed to encoding/json
	}{
		{`{}`, true},
		{`{"a":1}`, true},
		{`{"gpu0.power_w":70.33,"gpu0.temperature_c":31,"ib.mlx5_4.port1.port_xmit_wait_count":2489603687}`, true},
		{`{"a":0.000001,"b":9.99e-7,"c":1e-7,"d":100000000000000000000,"e":1e+21,"f":123456789.125}`, true},
		{`{"big":1e+308,"neg":-2.5e-300,"tiny":5e-324,"z":-0,"E":1E5}`, true},
		{`{"":1,"x y":2}`, true},
		// Escaped and non-ASCII names: encoding/json reads them.
		{`{"":1,"back\\slash":3,"q\"uote":2}`, false},
		{`{"a\u003eb":2,"amp\u0026":3}`, false},
		{`{"é.utf8":1,"emoji😀":4}`, false},
		{"{\"bad\xff\":1}", false},
		{"{\"del\x7f\":9}", false},
		// Not the written form, still JSON.
		{` {"a":1}`, false},
		{`{"a": 1}`, false},
		{`{ "a":1}`, false},
		{`{"a":1,"a":2}`, false},
		{`{"abcde":1,"abcde":2}`, false},
		{`{"a":1e999}`, false},
		{`{"abcdef":1e999}`, false}, // out of range, unread: still an error
		{`{"a":null}`, false},
		// Not JSON, or not numbers.
		{``, false},
		{`{`, false},
		{`}`, false},
		{`{"a":1,}`, false},
		{`{,}`, false},
		{`{"a":}`, false},
		{`{"a"1}`, false},
		{`{"a:1}`, false},
		{`{a:1}`, false},
		{`{"a":01}`, false},
		{`{"a":+1}`, false},
		{`{"a":1.}`, false},
		{`{"a":.5}`, false},
		{`{"a":1e}`, false},
		{`{"a":-}`, false},
		{`{"a":"1"}`, false},
		{`{"a":true}`, false},
		{`{"a":[1]}`, false},
		{`{"a":1}x`, false},
		{`[]`, false},
		{`null`, false},
	} {
		if fast := checkDecodeMetrics(t, tc.in); fast != tc.fast {
			t.Errorf("%q: read by the scan %v, want %v", tc.in, fast, tc.fast)
		}
	}
}

// What the store writes reads back as it was, through the scan, for the
// names it writes (TestMetricsJSONRandom's).
func TestDecodeMetricsReadsWhatIsWritten(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 6))
	keys := []string{"gpu0.temp_c", "ib.mlx5_0.port1.link_downed_rise_count", "a", "Z", "x<y", "gpu3.ecc.volatile_correctable_count", ""}
	values := []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 1e-6, 9.99e-7, 1e-7, 1e20, 1e21, 123456789.125, -2.5e-300,
		math.SmallestNonzeroFloat64, 1e308, 400, 2.489603687e+09} // what the store keeps (not 1.5e308)
	orders := &metricOrders{}
	for range 2000 {
		m := map[string]float64{}
		for range rng.IntN(20) {
			m[keys[rng.IntN(len(keys))]+fmt.Sprint(rng.IntN(3))] = values[rng.IntN(len(values))]
		}
		s := string(appendMetricsJSON(nil, orders, "c", m))
		fast := checkDecodeMetrics(t, s)
		escaped := strings.Contains(s, `\u`)
		if fast == escaped {
			t.Fatalf("%s: read by the scan %v", s, fast)
		}
		got, err := decodeMetrics(s, "c", nil)
		if err != nil || !maps.Equal(got, m) {
			t.Fatalf("wrote %v as %s, read back %v (%v)", m, s, got, err)
		}
	}
}

func TestDecodeFindings(t *testing.T) {
	t.Parallel()
	fs := []report.Finding{{Severity: report.SevFail, Component: "GPU3", Code: "ECC_UNCORRECTABLE", Message: "2 \"errors\"",
		Action: report.ActionReplace}}
	for _, tc := range []struct {
		in      string
		want    []report.Finding
		wantErr bool
	}{
		{`[]`, nil, false},
		{string(appendFindingsJSON(nil, fs)), fs, false},
		{`null`, nil, false},
		{`[`, nil, true},
		{`{}`, nil, true},
	} {
		got, err := decodeFindings(tc.in)
		if (err != nil) != tc.wantErr || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%q: %v (%v), want %v (error %v)", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func FuzzDecodeMetrics(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"a":1}`, `{"a":1,"b":-2.5e-300}`, `{"a":1,"a":2}`, `{"abcdef":1e999}`, `{"q\"":1}`, `{"a":01}`,
		`{"gpu0.power_w":70.33,"ib.mlx5_4.port1.port_xmit_wait_count":2489603687}`, "{\"\xff\":1}", `{"a":1,}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkDecodeMetrics(t, s)
	})
}
