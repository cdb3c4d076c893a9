package baselines

import (
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

func TestParseScope(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"node:gpu-017", "node:gpu-017", true},
		{"node:GPU_17.dc1", "node:GPU_17.dc1", true},
		{"sku:H100-SXM-80G-x8-nvlink", "sku:h100-sxm-80g-x8-nvlink", true},
		{"link:gpu-2|gpu-1", "link:gpu-1|gpu-2", true},
		{"link:gpu-1|gpu-2", "link:gpu-1|gpu-2", true},
		{"link:gpu-1|gpu-1", "", false},
		{"link:gpu-1", "", false},
		{"link:gpu-1|", "", false},
		{"node:", "", false},
		{"node:-lead", "", false},
		{"node:a b", "", false},
		{"node:a|b", "", false},
		{"rack:r1", "", false},
		{"gpu-017", "", false},
		{"sku:h100 sxm", "", false},
	}
	for _, tc := range tests {
		got, err := ParseScope(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseScope(%q) error %v, want ok %v", tc.in, err, tc.ok)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("ParseScope(%q) error %v is not ErrInvalid", tc.in, err)
			}
			continue
		}
		if string(got) != tc.want {
			t.Errorf("ParseScope(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if LinkScope("b", "a") != LinkScope("a", "b") {
		t.Error("LinkScope depends on order")
	}
	a, b, ok := LinkScope("n2", "n1").LinkNodes()
	if !ok || a != "n1" || b != "n2" {
		t.Errorf("LinkNodes = %q %q %v", a, b, ok)
	}
	if _, _, ok := NodeScope("n1").LinkNodes(); ok {
		t.Error("a node scope has link nodes")
	}
}

func TestValidMetricAndDirection(t *testing.T) {
	t.Parallel()
	for _, m := range []string{MetricAllReduceBusBW, MetricAllReduce2BusBW, "gpu3.ecc.dram_uncorrectable"} {
		if err := ValidMetric(m); err != nil {
			t.Errorf("ValidMetric(%q): %v", m, err)
		}
	}
	for _, m := range []string{"", "busbw", "nccl..busbw", "NCCL.busbw", "nccl.bus bw", "nccl.busbw."} {
		if ValidMetric(m) == nil {
			t.Errorf("ValidMetric(%q) accepted", m)
		}
	}
	dirs := map[string]Direction{
		MetricAllReduceBusBW:         HigherBetter,
		"nccl.sendrecv.latency_us":   LowerBetter,
		"burnin.duration_s":          LowerBetter,
		"storage.read.bytes_per_s":   HigherBetter,
		"gpu.matmul.tflops":          HigherBetter,
		"nccl.allreduce.size_bytes":  "",
		"nccl.allreduce.wrong_count": "",
	}
	for m, want := range dirs {
		got, ok := DirectionFor(m)
		if got != want || ok != (want != "") {
			t.Errorf("DirectionFor(%q) = %q %v, want %q", m, got, ok, want)
		}
	}
}

func TestNewStats(t *testing.T) {
	t.Parallel()
	st, err := NewStats([]float64{490, 470, 300, 481, 480})
	if err != nil {
		t.Fatal(err)
	}
	// Sorted 300 470 480 481 490; |x-480| = 180 10 0 1 10 → MAD 10.
	want := Stats{Count: 5, Median: 480, MAD: 10, Min: 300, Max: 490, Values: []float64{300, 470, 480, 481, 490}}
	if !st.same(want) {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	even, _ := NewStats([]float64{1, 2, 3, 4})
	if even.Median != 2.5 || even.MAD != 1 {
		t.Errorf("even stats %+v", even)
	}
	many := make([]float64, 1000)
	for i := range many {
		many[i] = float64(999 - i)
	}
	big, _ := NewStats(many)
	if big.Count != 1000 || len(big.Values) != MaxValues || big.Values[0] != 0 || big.Values[MaxValues-1] != 999 || big.Median != 499.5 {
		t.Errorf("thinned stats: count %d, %d values from %v to %v, median %v", big.Count, len(big.Values), big.Values[0], big.Values[len(big.Values)-1], big.Median)
	}
	if !slices.IsSorted(big.Values) {
		t.Error("thinned values out of order")
	}
	if err := big.validate(); err != nil {
		t.Errorf("thinned stats invalid: %v", err)
	}
	huge, err := NewStats([]float64{math.MaxFloat64, math.MaxFloat64})
	if err != nil || huge.Median != math.MaxFloat64 {
		t.Errorf("huge median %v, %v", huge.Median, err)
	}
	for _, bad := range [][]float64{nil, {math.NaN()}, {1, math.Inf(1)}, {-1}} {
		if _, err := NewStats(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewStats(%v) error %v, want ErrInvalid", bad, err)
		}
	}
}

func h100Inventory() report.Inventory {
	inv := report.Inventory{}
	for i := range 8 {
		inv.GPUs = append(inv.GPUs, report.GPU{Index: i, Name: "NVIDIA H100 80GB HBM3", MemoryTotalMiB: 81559})
	}
	for _, n := range []string{"mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"} {
		inv.HCAs = append(inv.HCAs, report.HCA{Name: n, Model: "MT4129",
			Ports: []report.Port{{Port: 1, State: "ACTIVE", RateGbps: 400, LinkLayer: "InfiniBand"}}})
	}
	inv.HCAs = append(inv.HCAs, report.HCA{Name: "mlx5_bond_0", Model: "MT41692",
		Ports: []report.Port{{Port: 1, State: "ACTIVE", RateGbps: 200, LinkLayer: "Ethernet"}}})
	return inv
}

func TestSKUFromInventory(t *testing.T) {
	t.Parallel()
	gpus := func(name string, mib uint64, n int) []report.GPU {
		var out []report.GPU
		for i := range n {
			out = append(out, report.GPU{Index: i, Name: name, MemoryTotalMiB: mib})
		}
		return out
	}
	ports := func(model, layer string, rate float64, n int) []report.HCA {
		var out []report.HCA
		for range n {
			out = append(out, report.HCA{Model: model, Ports: []report.Port{{Port: 1, RateGbps: rate, LinkLayer: layer}}})
		}
		return out
	}
	degraded := h100Inventory()
	degraded.HCAs[2].Ports[0] = report.Port{Port: 1, State: "DOWN", RateGbps: 10, LinkLayer: "InfiniBand"}
	degraded.HCAs[3].Ports[0].RateGbps = 200
	mixed := h100Inventory()
	mixed.GPUs[7].Name = "NVIDIA H100 PCIe"
	tests := []struct {
		name   string
		inv    report.Inventory
		labels map[string]string
		want   string
	}{
		{"HGX H100 with BlueField storage port", h100Inventory(), nil, "h100-sxm-80g-x8-nvlink-ib400x8"},
		{"a port down and one slow: same SKU", degraded, nil, "h100-sxm-80g-x8-nvlink-ib400x8"},
		{"one odd GPU name: the common one", mixed, nil, "h100-sxm-80g-x8-nvlink-ib400x8"},
		{"no HCAs", report.Inventory{GPUs: gpus("NVIDIA H100 80GB HBM3", 81559, 8)}, nil, "h100-sxm-80g-x8-nvlink"},
		{"A100 SXM4 80GB, HDR", report.Inventory{GPUs: gpus("NVIDIA A100-SXM4-80GB", 81920, 8), HCAs: ports("MT4123", "InfiniBand", 200, 8)}, nil, "a100-sxm-80g-x8-nvlink-ib200x8"},
		{"A100 SXM4 40GB", report.Inventory{GPUs: gpus("NVIDIA A100-SXM4-40GB", 40960, 8)}, nil, "a100-sxm-40g-x8-nvlink"},
		{"A100 PCIe", report.Inventory{GPUs: gpus("NVIDIA A100 80GB PCIe", 81920, 4)}, nil, "a100-pcie-80g-x4-pcie"},
		{"A100 PCIe old name", report.Inventory{GPUs: gpus("NVIDIA A100-PCIE-40GB", 40960, 2)}, nil, "a100-pcie-40g-x2-pcie"},
		{"H100 NVL", report.Inventory{GPUs: gpus("NVIDIA H100 NVL", 95830, 8)}, nil, "h100-nvl-94g-x8-nvlink"},
		{"H200 memory snapped", report.Inventory{GPUs: gpus("NVIDIA H200", 143771, 8), HCAs: ports("MT4129", "InfiniBand", 400, 8)}, nil, "h200-sxm-141g-x8-nvlink-ib400x8"},
		{"GH200", report.Inventory{GPUs: gpus("NVIDIA GH200 480GB", 97871, 1)}, nil, "gh200-480g-x1-nvlink"},
		{"L40S", report.Inventory{GPUs: gpus("NVIDIA L40S", 46068, 8)}, nil, "l40s-45g-x8-pcie"},
		{"V100", report.Inventory{GPUs: gpus("Tesla V100-SXM2-32GB", 32768, 8)}, nil, "v100-sxm-32g-x8-nvlink"},
		{"RoCE fabric", report.Inventory{GPUs: gpus("NVIDIA H100 80GB HBM3", 81559, 8), HCAs: append(ports("MT4129", "Ethernet", 400, 8), ports("MT4125", "Ethernet", 100, 2)...)}, nil, "h100-sxm-80g-x8-nvlink-roce400x8"},
		{"label wins", h100Inventory(), map[string]string{SKULabel: " DGX-H100 "}, "dgx-h100"},
		{"invalid label ignored", h100Inventory(), map[string]string{SKULabel: "dgx h100"}, "h100-sxm-80g-x8-nvlink-ib400x8"},
		{"coarse sku label ignored", h100Inventory(), map[string]string{"sku": "h100"}, "h100-sxm-80g-x8-nvlink-ib400x8"},
		{"no GPUs", report.Inventory{HCAs: ports("MT4129", "InfiniBand", 400, 8)}, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := SKUFromInventory(tc.inv, tc.labels)
			if got != tc.want {
				t.Errorf("SKU %q, want %q", got, tc.want)
			}
			if got != "" {
				if err := ValidSKU(got); err != nil {
					t.Errorf("derived SKU invalid: %v", err)
				}
			}
		})
	}
}

func TestSKUBase(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"h100-sxm-80g-x8-nvlink-ib400x8":   "h100-sxm-80g-x8-nvlink",
		"h100-sxm-80g-x8-nvlink-roce400x8": "h100-sxm-80g-x8-nvlink",
		"h100-sxm-80g-x8-nvlink-ibx8":      "h100-sxm-80g-x8-nvlink",
		"h100-sxm-80g-x8-nvlink":           "h100-sxm-80g-x8-nvlink",
		"dgx-h100":                         "dgx-h100",
		"custom-ib":                        "custom-ib",
		"ib400x8":                          "ib400x8",
	} {
		if got := SKUBase(in); got != want {
			t.Errorf("SKUBase(%q) = %q, want %q", in, got, want)
		}
	}
}
