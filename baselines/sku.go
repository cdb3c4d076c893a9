package baselines

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

// SKULabel is the node label that names a node's SKU outright, for
// hardware the derivation below gets wrong. It is not the coarse "sku"
// label selectors use ("sku=h100"): that one names a family, not a
// baseline SKU.
const SKULabel = "baseline-sku"

// SKUFromInventory names a node's hardware SKU for baselines, in the
// form MODEL[-FORM]-MEMg-xCOUNT-INTRA[-NET], for example
// h100-sxm-80g-x8-nvlink-ib400x8:
//
//   - MODEL: the GPU name without "NVIDIA"/"Tesla", lowercase, up to and
//     including the first word with a digit ("h100", "a100", "rtx6000").
//   - FORM: "sxm", "pcie" or "nvl" from the name ("A100-SXM4-80GB",
//     "H100 PCIe", "H100 NVL"); names that carry none but only ship as SXM
//     boards ("NVIDIA H100 80GB HBM3", H200, H800, H20, B100, B200, B300)
//     get "sxm"; otherwise none.
//   - MEM: the "NNGB" word of the name, else total memory in GiB rounded
//     and snapped to the marketed size within 3 % (81559 MiB is 80,
//     143771 MiB is 141).
//   - COUNT: the number of GPUs the inventory lists (the most common name
//     gives MODEL when they differ).
//   - INTRA: "nvlink" for SXM and NVL boards and Grace superchips
//     (GH200, GB200, GB300), "pcie" otherwise.
//   - NET: the RDMA fabric, "ib<rate>x<ports>" or "roce<rate>x<ports>":
//     InfiniBand ports when there are any, else Ethernet (RoCE) ports;
//     among them the HCA model with the most ports (the compute fabric,
//     not a lone storage or BlueField port), every port of that model
//     counted whatever its state, at the highest rate any of them runs.
//     So a port that went down or trained slower does not change the SKU,
//     and the node is still judged against its SKU's baseline.
//
// A node whose GPUs are missing from the inventory gets a different COUNT
// (gpu.inventory fails it on its own). The label SKULabel, when set to a
// valid SKU, wins over all of this. No GPUs and no label: "".
func SKUFromInventory(inv report.Inventory, labels map[string]string) string {
	if l, ok := labels[SKULabel]; ok {
		l = strings.ToLower(strings.TrimSpace(l))
		if ValidSKU(l) == nil {
			return l
		}
	}
	if len(inv.GPUs) == 0 {
		return ""
	}
	name, mem := commonGPU(inv.GPUs)
	g := parseGPUName(name)
	if g.model == "" {
		return ""
	}
	if g.memGB == 0 {
		g.memGB = snapMemGB(mem)
	}
	parts := []string{g.model}
	if g.form != "" {
		parts = append(parts, g.form)
	}
	if g.memGB > 0 {
		parts = append(parts, strconv.Itoa(g.memGB)+"g")
	}
	parts = append(parts, "x"+strconv.Itoa(len(inv.GPUs)), g.intra)
	if n := netPart(inv.HCAs); n != "" {
		parts = append(parts, n)
	}
	sku := strings.Join(parts, "-")
	if ValidSKU(sku) != nil {
		return ""
	}
	return sku
}

// SKUBase is the SKU without its network part: intra-node baselines
// (single-node all_reduce) do not depend on the network, so Resolve also
// looks them up under the base SKU.
func SKUBase(sku string) string {
	i := strings.LastIndexByte(sku, '-')
	if i < 0 || !isNetWord(sku[i+1:]) {
		return sku
	}
	return sku[:i]
}

// isNetWord matches the NET part: "ib400x8", "roce200x8", "ibx8".
func isNetWord(w string) bool {
	rest, ok := strings.CutPrefix(w, "ib")
	if !ok {
		if rest, ok = strings.CutPrefix(w, "roce"); !ok {
			return false
		}
	}
	rate, ports, ok := strings.Cut(rest, "x")
	return ok && allDigits(rate, true) && allDigits(ports, false)
}

func allDigits(s string, emptyOK bool) bool {
	if s == "" {
		return emptyOK
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// commonGPU returns the most common GPU name (first seen on ties) and
// the memory of a GPU with that name.
func commonGPU(gpus []report.GPU) (string, uint64) {
	counts := map[string]int{}
	best, bestN := "", 0
	var mem uint64
	for _, g := range gpus {
		counts[g.Name]++
		if counts[g.Name] > bestN {
			best, bestN = g.Name, counts[g.Name]
		}
	}
	for _, g := range gpus {
		if g.Name == best && g.MemoryTotalMiB > mem {
			mem = g.MemoryTotalMiB
		}
	}
	return best, mem
}

type gpuName struct {
	model, form, intra string
	memGB              int
}

func parseGPUName(name string) gpuName {
	words := strings.FieldsFunc(strings.ToLower(name), func(r rune) bool {
		return r == ' ' || r == '-' || r == '_' || r == '/'
	})
	var model []string
	var g gpuName
	seenDigit := false
	for _, w := range words {
		if len(model) == 0 && (w == "nvidia" || w == "tesla") {
			continue
		}
		switch {
		case strings.HasPrefix(w, "sxm"):
			g.form = "sxm"
			seenDigit = true
			continue
		case w == "pcie":
			g.form = "pcie"
			seenDigit = true
			continue
		case w == "nvl":
			g.form = "nvl"
			seenDigit = true
			continue
		}
		if gb, ok := strings.CutSuffix(w, "gb"); ok {
			if n, err := strconv.Atoi(gb); err == nil && n > 0 && n < 100000 {
				g.memGB = n
				seenDigit = true
				continue
			}
		}
		if !seenDigit {
			model = append(model, sanitizeWord(w))
			seenDigit = strings.ContainsAny(w, "0123456789")
		}
	}
	g.model = strings.Join(model, "")
	bare, superchip := false, false
	switch g.model {
	case "h100", "h200", "h800", "h20", "b100", "b200", "b300":
		bare = true
	case "gh200", "gb200", "gb300":
		superchip = true
	}
	if g.form == "" && bare {
		g.form = "sxm"
	}
	g.intra = "pcie"
	if g.form == "sxm" || g.form == "nvl" || superchip {
		g.intra = "nvlink"
	}
	return g
}

func sanitizeWord(w string) string {
	var b strings.Builder
	for _, c := range w {
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') {
			b.WriteRune(c)
		}
	}
	return b.String()
}

// snapMemGB rounds MiB to GiB and snaps to a marketed size within 3 %
// (nvidia-smi reports usable memory, a little under the label).
func snapMemGB(mib uint64) int {
	if mib == 0 {
		return 0
	}
	gib := float64(mib) / 1024
	for _, m := range []float64{16, 24, 32, 40, 48, 80, 94, 96, 141, 144, 180, 186, 192, 288} {
		if math.Abs(gib-m)/m <= 0.03 {
			return int(m)
		}
	}
	return int(math.Round(gib))
}

// netPart names the RDMA fabric; see SKUFromInventory.
func netPart(hcas []report.HCA) string {
	type group struct {
		ports int
		rate  float64
	}
	pick := func(layer string) (string, group) {
		byModel := map[string]*group{}
		var order []string
		for _, h := range hcas {
			for _, p := range h.Ports {
				if !strings.EqualFold(p.LinkLayer, layer) {
					continue
				}
				g, ok := byModel[h.Model]
				if !ok {
					g = &group{}
					byModel[h.Model] = g
					order = append(order, h.Model)
				}
				g.ports++
				if p.RateGbps > g.rate && !math.IsInf(p.RateGbps, 0) {
					g.rate = p.RateGbps
				}
			}
		}
		best, bg := "", group{}
		for _, m := range order {
			g := *byModel[m]
			if g.ports > bg.ports || (g.ports == bg.ports && g.rate > bg.rate) {
				best, bg = m, g
			}
		}
		return best, bg
	}
	prefix := "ib"
	_, g := pick("InfiniBand")
	if g.ports == 0 {
		prefix = "roce"
		_, g = pick("Ethernet")
	}
	if g.ports == 0 {
		return ""
	}
	rate := ""
	if g.rate >= 1 && g.rate < 1e6 {
		rate = strconv.FormatFloat(math.Round(g.rate), 'f', -1, 64)
	}
	return fmt.Sprintf("%s%sx%d", prefix, rate, g.ports)
}
