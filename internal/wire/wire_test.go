package wire

import (
	"bytes"
	"context"
	"fmt"
	"google.golang.org/protobuf/encoding/protowire"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/inspect"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// bundleReport runs the passive checks on an example bundle: a real report,
// with findings, metrics, skips with reasons and a full inventory.
func bundleReport(t *testing.T, name string) report.Report {
	t.Helper()
	b, err := bundle.Open("../../examples/bundles/" + name)
	if err != nil {
		t.Fatal(err)
	}
	list, err := checks.Select(registry.All(), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	return inspect.Run(context.Background(), b, inspect.Options{Checks: list}).Report
}

// normalized is what a report looks like after a trip through the wire:
// findings and inventory lists are never nil, empty metrics are nil, and
// CollectedAt (not on the wire) is dropped.
func normalized(r report.Report) report.Report {
	out := r
	out.CollectedAt = ""
	out.Checks = make([]report.CheckResult, len(r.Checks))
	for i, c := range r.Checks {
		if c.Findings == nil {
			c.Findings = []report.Finding{}
		}
		if len(c.Metrics) == 0 {
			c.Metrics = nil
		}
		out.Checks[i] = c
	}
	inv := r.Inventory
	if inv.GPUs == nil {
		inv.GPUs = []report.GPU{}
	}
	inv.HCAs = make([]report.HCA, len(r.Inventory.HCAs))
	for i, h := range r.Inventory.HCAs {
		if h.Ports == nil {
			h.Ports = []report.Port{}
		}
		inv.HCAs[i] = h
	}
	out.Inventory = inv
	return out
}

func TestResultRoundTrip(t *testing.T) {
	t.Parallel()
	started := time.Date(2025, 3, 4, 5, 6, 7, 123_000_000, time.UTC)
	tests := []struct {
		name string
		rep  func(t *testing.T) report.Report
	}{
		{"healthy bundle", func(t *testing.T) report.Report { return bundleReport(t, "h100-healthy") }},
		{"xid and ecc bundle", func(t *testing.T) report.Report { return bundleReport(t, "h100-xid79-ecc") }},
		{"ib down and pcie bundle", func(t *testing.T) report.Report { return bundleReport(t, "h100-ibdown-pcie") }},
		{"hand made, edge values", func(*testing.T) report.Report {
			return report.Report{
				Status: report.Fail,
				Inventory: report.Inventory{
					DriverVersion: "550.54.15", CUDAVersion: "12.4", Kernel: "5.15.0-105-generic",
					FabricManagerVersion: "550.54.15", RDMAStack: "MLNX_OFED_LINUX-23.10-1.1.9.0",
					GPUs: []report.GPU{{Index: 7, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-x", PCIBusID: "00000000:DB:00.0",
						Serial: "1654923009876", VBIOSVersion: "96.00.89.00.01", MemoryTotalMiB: 81559}},
					HCAs: []report.HCA{
						{Name: "mlx5_0", Model: "MT4129", FWVersion: "28.39.1002",
							Ports: []report.Port{{Port: 1, State: "ACTIVE", PhysState: "LinkUp", RateGbps: 400, LinkLayer: "InfiniBand"}}},
						{Name: "mlx5_9", Model: "MT4129"}, // no ports read
					},
				},
				Checks: []report.CheckResult{
					{Name: "gpu.ecc", Status: report.Fail, DurationMS: 1.25,
						Findings: []report.Finding{{Severity: report.SevFail, Component: "GPU3", PCIBusID: "00000000:3B:00.0",
							Code: "ECC_UNCORRECTABLE", Message: "2 uncorrectable DRAM errors", Action: report.ActionReplace}},
						Metrics: map[string]float64{"gpu3.ecc.dram_uncorrectable": 2, "gpu3.temp_c": -0.5, "x.max": math.MaxFloat64}},
					{Name: "nccl.allreduce", Status: report.Skip, Reason: "all_reduce_perf.txt absent", Metrics: map[string]float64{}},
					{Name: "ib.ports", Status: report.Pass},
				},
			}
		}},
		{"empty report", func(*testing.T) report.Report { return report.Report{Status: report.Pass} }},
	}
	for _, tc := range tests {
		for _, form := range []Form{Entries, Columns} {
			t.Run(fmt.Sprintf("%s, form %d", tc.name, form), func(t *testing.T) {
				t.Parallel()
				roundTrip(t, tc.rep(t), started, form)
			})
		}
	}
}

// roundTrip sends rep through bytes and back in the given form.
func roundTrip(t *testing.T, rep report.Report, started time.Time, form Form) {
	rep.Node = "gpu-017"
	meta := Meta{ID: "0193a1b2c3d4e5f60718293a4b5c6d7e", Node: "gpu-017", WorkID: "w-20250304T050607-abcd1234",
		Started: started, Finished: started.Add(1500 * time.Millisecond), Full: true}
	p := ResultToProto(meta, &rep, form)
	if err := CheckMetricsValid(p); err != nil {
		t.Fatal(err)
	}
	// Through bytes, as on the stream.
	b, err := proto.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var q pb.Result
	if err := proto.Unmarshal(b, &q); err != nil {
		t.Fatal(err)
	}
	gotMeta, got := ResultFromProto(&q)
	if gotMeta != meta {
		t.Errorf("meta: got %+v, want %+v", gotMeta, meta)
	}
	if want := normalized(rep); !reflect.DeepEqual(got, want) {
		t.Errorf("report changed on the wire:\n got %+v\nwant %+v", got, want)
	}
	// And back again: the proto side is a fixed point.
	again := ResultToProto(gotMeta, &got, form)
	if !proto.Equal(again, &q) {
		t.Errorf("proto changed on the second trip:\n got %v\nwant %v", again, &q)
	}
}

func TestInventoryNilStaysAbsent(t *testing.T) {
	t.Parallel()
	if InventoryToProto(nil) != nil {
		t.Error("a nil inventory (hello before the first pass) must stay absent on the wire")
	}
	if got := InventoryFromProto(nil); got.GPUs == nil || got.HCAs == nil {
		t.Errorf("inventory lists must be empty, not nil: %+v", got)
	}
	_, r := ResultFromProto(&pb.Result{Id: "x", Node: "n", Status: "pass"})
	if !reflect.DeepEqual(r.Inventory, report.Inventory{}) {
		t.Errorf("absent inventory: got %+v, want the zero inventory", r.Inventory)
	}
}

func TestTimes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   time.Time
		want int64
	}{
		{time.Time{}, 0},
		{time.UnixMilli(1).UTC(), 1},
		{time.Date(2025, 1, 2, 3, 4, 5, 678_900_000, time.FixedZone("x", 3600)), time.Date(2025, 1, 2, 2, 4, 5, 678_000_000, time.UTC).UnixMilli()},
	}
	for _, tc := range tests {
		if got := UnixMS(tc.in); got != tc.want {
			t.Errorf("UnixMS(%v) = %d, want %d", tc.in, got, tc.want)
		}
	}
	if !FromUnixMS(0).IsZero() || !FromUnixMS(-62135596800000).IsZero() {
		t.Error("zero and negative milliseconds must read as unset")
	}
	if got := FromUnixMS(1741064767123); got.Location() != time.UTC || got.UnixMilli() != 1741064767123 {
		t.Errorf("FromUnixMS: %v", got)
	}
}

func TestMetricsEntries(t *testing.T) {
	t.Parallel()
	m := map[string]float64{"gpu1.temp_c": 44, "gpu0.temp_c": 41, "a.count": 0, "z": -1.5}
	entries := MetricsToProto(m)
	var names []string
	for _, e := range entries {
		names = append(names, e.GetKey())
	}
	if want := []string{"a.count", "gpu0.temp_c", "gpu1.temp_c", "z"}; !slices.Equal(names, want) {
		t.Fatalf("entries in order %v, want %v", names, want)
	}
	if got := CheckFromProto(&pb.CheckResult{Name: "gpu.thermal", Status: "pass", Metrics: entries}).Metrics; !maps.Equal(got, m) {
		t.Fatalf("round trip %v, want %v", got, m)
	}
	// A name sent twice keeps its last value, as a map field's decoding does.
	twice := []*pb.Metric{{Key: "x", Value: 1}, {Key: "x", Value: 2}}
	if got := MetricsFromProto(twice); len(got) != 1 || got["x"] != 2 {
		t.Fatalf("repeated name: %v", got)
	}
	if MetricsToProto(nil) != nil || MetricsToProto(map[string]float64{}) != nil {
		t.Error("no metrics must send no entries")
	}
	if c := CheckFromProto(&pb.CheckResult{Name: "x", Status: "pass", Metrics: []*pb.Metric{}}); c.Metrics != nil {
		t.Errorf("empty metrics: %v, want nil", c.Metrics)
	}
}

// The entries are a map<string, double> on the wire: a message from an
// agent built with the map (an older release) decodes into them, and the
// entries decode as that map.
func TestMetricsWireCompatibleWithMap(t *testing.T) {
	t.Parallel()
	m := map[string]float64{"gpu0.temp_c": 41, "ib.mlx5_0.symbol_error": 3}
	// Field 6 as a map writes one length-delimited entry per name, with
	// the key as field 1 and the value as field 2 (protobuf's map encoding).
	var asMap []byte
	for _, k := range []string{"gpu0.temp_c", "ib.mlx5_0.symbol_error"} {
		var entry []byte
		entry = protowire.AppendTag(entry, 1, protowire.BytesType)
		entry = protowire.AppendString(entry, k)
		entry = protowire.AppendTag(entry, 2, protowire.Fixed64Type)
		entry = protowire.AppendFixed64(entry, math.Float64bits(m[k]))
		asMap = protowire.AppendTag(asMap, 6, protowire.BytesType)
		asMap = protowire.AppendBytes(asMap, entry)
	}
	var got pb.CheckResult
	if err := proto.Unmarshal(asMap, &got); err != nil {
		t.Fatal(err)
	}
	if back := MetricsFromProto(got.GetMetrics()); !maps.Equal(back, m) {
		t.Fatalf("map-encoded metrics read as %v, want %v", back, m)
	}
	ours, err := proto.MarshalOptions{Deterministic: true}.Marshal(&pb.CheckResult{Metrics: MetricsToProto(m)})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ours, asMap) {
		t.Fatalf("entries marshal as %x, a map as %x", ours, asMap)
	}
}

func TestMetricColumns(t *testing.T) {
	t.Parallel()
	m := map[string]float64{"gpu1.temp_c": 44, "gpu0.temp_c": 41, "a.count": 0, "z": -1.5}
	c := CheckToProtoColumns(report.CheckResult{Name: "gpu.thermal", Status: report.Pass, Metrics: m})
	if c.GetMetricNames() != "a.count\ngpu0.temp_c\ngpu1.temp_c\nz\n" || !slices.Equal(c.GetMetricValues(), []float64{0, 41, 44, -1.5}) ||
		len(c.GetMetrics()) != 0 {
		t.Fatalf("columns: %q %v (entries %d)", c.GetMetricNames(), c.GetMetricValues(), len(c.GetMetrics()))
	}
	if got := CheckFromProto(c).Metrics; !maps.Equal(got, m) {
		t.Fatalf("round trip %v, want %v", got, m)
	}
	// A name holding the separator cannot be a column: that check goes as entries.
	odd := map[string]float64{"bad\nname": 1, "ok": 2}
	c = CheckToProtoColumns(report.CheckResult{Name: "custom", Status: report.Pass, Metrics: odd})
	if c.GetMetricNames() != "" || len(c.GetMetricValues()) != 0 || len(c.GetMetrics()) != 2 {
		t.Fatalf("a name with a newline: %v", c)
	}
	if got := CheckFromProto(c).Metrics; !maps.Equal(got, odd) {
		t.Fatalf("entries fallback read as %v, want %v", got, odd)
	}
	if c := CheckToProtoColumns(report.CheckResult{Name: "x", Status: report.Pass}); c.GetMetricNames() != "" || c.GetMetricValues() != nil {
		t.Errorf("no metrics must send no columns: %v", c)
	}
	// A name sent twice keeps its last value, as entries do.
	if got := CheckFromProto(&pb.CheckResult{MetricNames: "x\nx\n", MetricValues: []float64{1, 2}}).Metrics; len(got) != 1 || got["x"] != 2 {
		t.Errorf("repeated name: %v", got)
	}
}

func TestCheckMetricsValid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		check *pb.CheckResult
		want  string // "" for valid
	}{
		{"entries", &pb.CheckResult{Name: "a", Metrics: []*pb.Metric{{Key: "x", Value: 1}}}, ""},
		{"columns", &pb.CheckResult{Name: "a", MetricNames: "x\ny\n", MetricValues: []float64{1, 2}}, ""},
		{"no metrics", &pb.CheckResult{Name: "a"}, ""},
		{"an empty name", &pb.CheckResult{Name: "a", MetricNames: "\n", MetricValues: []float64{1}}, ""},
		{"more values", &pb.CheckResult{Name: "a", MetricNames: "x\n", MetricValues: []float64{1, 2}}, `check "a" sends 1 metric names and 2 values`},
		{"more names", &pb.CheckResult{Name: "a", MetricNames: "x\ny\n", MetricValues: []float64{1}}, `check "a" sends 2 metric names and 1 values`},
		{"values only", &pb.CheckResult{Name: "a", MetricValues: []float64{1}}, `check "a" sends 0 metric names and 1 values`},
		{"names only", &pb.CheckResult{Name: "a", MetricNames: "x\n"}, `check "a" sends 1 metric names and 0 values`},
		{"no last newline", &pb.CheckResult{Name: "a", MetricNames: "x\ny", MetricValues: []float64{1, 2}}, `does not end with a newline`},
		{"both forms", &pb.CheckResult{Name: "a", MetricNames: "x\n", MetricValues: []float64{1}, Metrics: []*pb.Metric{{Key: "y"}}},
			`both as entries and as columns`},
		{"a long name clipped", &pb.CheckResult{Name: strings.Repeat("n", 500), MetricValues: []float64{1}}, `"` + strings.Repeat("n", 64) + `..."`},
	}
	for _, tc := range tests {
		err := CheckMetricsValid(&pb.Result{Checks: []*pb.CheckResult{{Name: "fine"}, tc.check}})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// FuzzMetricColumns: whatever the columns hold, the check reads without
// a panic, and a check that passes CheckMetricsValid keeps one metric
// per distinct name, each with its last value.
func FuzzMetricColumns(f *testing.F) {
	f.Add("a\nb\n", 2)
	f.Add("a\na\n", 2)
	f.Add("\n\n", 1)
	f.Add("no newline", 3)
	f.Add("", 0)
	f.Fuzz(func(t *testing.T, names string, n int) {
		n = max(0, min(n, 1000))
		values := make([]float64, n)
		for i := range values {
			values[i] = float64(i)
		}
		c := &pb.CheckResult{Name: "fuzz", MetricNames: names, MetricValues: values}
		got := CheckFromProto(c).Metrics
		if CheckMetricsValid(&pb.Result{Checks: []*pb.CheckResult{c}}) != nil {
			return
		}
		want := map[string]float64{}
		for i, k := range strings.Split(strings.TrimSuffix(names, "\n"), "\n") {
			if names != "" {
				want[k] = values[i]
			}
		}
		if len(want) == 0 {
			want = nil
		}
		if !maps.Equal(got, want) {
			t.Fatalf("columns %q %v read as %v, want %v", names, values, got, want)
		}
	})
}
