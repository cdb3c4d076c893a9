package config

import (
	"errors"
	"math"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestRangeCheck(t *testing.T) {
	t.Parallel()
	type tc struct {
		name string
		err  error
		want string // "" = in range
	}
	cases := []tc{
		{"int low edge", R(1, 36500).Check("retention_days", 1), ""},
		{"int high edge", R(1, 36500).Check("retention_days", 36500), ""},
		{"int huge", R(1, 36500).Check("retention_days", 1_000_000_000_000), "retention_days 1000000000000 is out of range: must be within 1..36500"},
		{"int zero", R(1, 36500).Check("retention_days", 0), "retention_days 0 is out of range: must be within 1..36500"},
		{"negative", R(0, 64).Check("expect.gpu_count", -1), "expect.gpu_count -1 is out of range: must be within 0..64"},
		{"duration", R(time.Duration(0), 100*time.Millisecond).Check("batch.delay", 10*time.Hour), "batch.delay 10h is out of range: must be within 0s..100ms"},
		{"config duration", R(Duration(time.Minute), Duration(720*time.Hour)).Check("xid.lookback", Duration(90*time.Second)), ""},
		{"config duration low", R(Duration(time.Minute), Duration(720*time.Hour)).Check("xid.lookback", Duration(time.Second)), "xid.lookback 1s is out of range: must be within 1m..720h"},
		{"float", R(0.0, 0.99).Check("nccl.max_deviation", 1.5), "nccl.max_deviation 1.5 is out of range: must be within 0..0.99"},
		{"NaN", R(0.0, 150).Check("limits.gpu_temp_warn_c", math.NaN()), "limits.gpu_temp_warn_c NaN is out of range"},
		{"+Inf", R(0.0, 10000).Check("nccl.baseline_gbps", math.Inf(1)), "nccl.baseline_gbps +Inf is out of range"},
		{"uint64 max", R[uint64](0, math.MaxUint32).Check("limits.nvlink_error_rise", math.MaxUint64), "limits.nvlink_error_rise 18446744073709551615 is out of range: must be within 0..4294967295"},
		{"or zero: zero", R(1, 4).CheckOrZero("tools.dcgm_level", 0), ""},
		{"or zero: in", R(1, 4).CheckOrZero("tools.dcgm_level", 4), ""},
		{"or zero: out", R(1, 4).CheckOrZero("tools.dcgm_level", 5), "tools.dcgm_level 5 is out of range: must be within 1..4"},
		{"or zero: negative", R(1, 4).CheckOrZero("tools.dcgm_level", -1), "tools.dcgm_level -1 is out of range"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			switch {
			case c.want == "" && c.err != nil:
				t.Fatalf("in range, got %v", c.err)
			case c.want != "" && c.err == nil:
				t.Fatalf("out of range, got nil; want %q", c.want)
			case c.want != "" && !strings.Contains(c.err.Error(), c.want):
				t.Fatalf("got %q, want %q", c.err, c.want)
			case c.want != "" && !errors.Is(c.err, ErrOutOfRange):
				t.Fatalf("%v does not wrap ErrOutOfRange", c.err)
			}
		})
	}
}

func TestNumericKeys(t *testing.T) {
	t.Parallel()
	type inner struct {
		D     Duration `yaml:"d"`
		Name  string   `yaml:"name"`
		Share float64  `yaml:"share"`
	}
	type outer struct {
		Count  int               `yaml:"count"`
		In     inner             `yaml:"in"`
		Ptr    *inner            `yaml:"ptr"`
		ByName map[string]uint64 `yaml:"by_name"`
		ByNum  map[int]string    `yaml:"by_num"`
		List   []int             `yaml:"list"`
		Skip   inner             `yaml:"skip"`
		Hidden int               `yaml:"-"`
	}
	got := strings.Join(NumericKeys(outer{}, "skip"), " ")
	want := "by_name.* by_num{} count in.d in.share list[] ptr.d ptr.share"
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// rangeCase is one numeric key held to its range: doc is the key as the
// Ranges table writes it, yaml a config with a value just outside.
type rangeCase struct{ doc, yaml string }

var outOfRangeRE = regexp.MustCompile(`(\S+) (\S+) is out of range: must be within (\S+)`)

// checkRanges parses each case and wants the error to name the key, the
// value and the range the doc's Ranges table gives; it returns the doc
// keys covered.
func checkRanges(t *testing.T, docPath string, cases []rangeCase, parse func([]byte) error) map[string]bool {
	t.Helper()
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.doc] = true
		err := parse([]byte(c.yaml))
		if err == nil {
			t.Errorf("%s: %q accepted", c.doc, c.yaml)
			continue
		}
		if !errors.Is(err, ErrOutOfRange) {
			t.Errorf("%s: %v does not wrap ErrOutOfRange", c.doc, err)
		}
		if key := strings.NewReplacer(".*", ".", "[]", "", "{}", "").Replace(c.doc); !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %q does not name the key", c.doc, err)
		}
		m := outOfRangeRE.FindStringSubmatch(err.Error())
		if m == nil {
			t.Errorf("%s: %q does not say key, value and range", c.doc, err)
			continue
		}
		rowKey := "| `" + c.doc + "`"
		i := strings.Index(string(doc), rowKey)
		if i < 0 {
			t.Errorf("%s: no row in %s", c.doc, docPath)
			continue
		}
		row, _, _ := strings.Cut(string(doc)[i:], "\n")
		if !strings.Contains(row, " "+m[3]) {
			t.Errorf("%s: the code's range is %s; %s says %q", c.doc, m[3], docPath, row)
		}
	}
	return covered
}

// TestNodeConfigRanges holds every numeric key of the node config to the
// range docs/config.md gives.
func TestNodeConfigRanges(t *testing.T) {
	t.Parallel()
	cases := []rangeCase{
		{"expect.gpu_count", "expect: {gpu_count: 65}"},
		{"expect.ib_ports", "expect: {ib_ports: -1}"},
		{"expect.ib_rate_gbps", "expect: {ib_rate_gbps: 4000}"},
		{"limits.gpu_temp_warn_c", "limits: {gpu_temp_warn_c: 151}"},
		{"limits.gpu_temp_fail_c", "limits: {gpu_temp_fail_c: .nan}"},
		{"limits.memory_temp_fail_c", "limits: {memory_temp_fail_c: 1000}"},
		{"limits.retired_pages_max", "limits: {retired_pages_max: 100001}"},
		{"limits.ib_counter_rise.*", "limits: {ib_counter_rise: {symbol_error: 4294967296}}"},
		{"limits.ib_counter_total.*", "limits: {ib_counter_total: {link_downed: 18446744073709551615}}"},
		{"limits.nvlink_error_rise", "limits: {nvlink_error_rise: 4294967296}"},
		{"xid.lookback", "xid: {lookback: 10s}"},
		{"xid.overrides{}", "xid: {overrides: {100000: replace}}"},
		{"xid.ignore[]", "xid: {ignore: [0]}"},
		{"nccl.min_busbw_gbps", "nccl: {min_busbw_gbps: 10001}"},
		{"nccl.baseline_gbps", "nccl: {baseline_gbps: .inf}"},
		{"nccl.max_deviation", "nccl: {max_deviation: 1}"},
		{"tools.dcgm_level", "tools: {dcgm_level: 5}"},
		{"tools.timeout", "tools: {timeout: 1h}"},
		{"tools.nccl_timeout", "tools: {nccl_timeout: 13h}"},
		{"tools.dcgm_timeout", "tools: {dcgm_timeout: 500ms}"},
	}
	covered := checkRanges(t, "../../docs/config.md", cases, func(b []byte) error { _, err := Parse(b); return err })
	for _, k := range NumericKeys(Config{}) {
		if !covered[k] {
			t.Errorf("numeric key %s has no range case (and maybe no range)", k)
		}
	}
}

// TestAllOutOfRangeAtOnce: every value out of range is named in one error.
func TestAllOutOfRangeAtOnce(t *testing.T) {
	t.Parallel()
	_, err := Parse([]byte("expect: {gpu_count: 500}\ntools: {dcgm_level: 9}\n"))
	if err == nil || !strings.Contains(err.Error(), "expect.gpu_count 500") || !strings.Contains(err.Error(), "tools.dcgm_level 9") {
		t.Fatalf("got %v", err)
	}
}
