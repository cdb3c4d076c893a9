package gpu

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
)

// gpuExpectation is what the node's configuration and labels say about its
// GPUs: a count, or only that there are some.
type gpuExpectation struct {
	count int    // > 0: exactly this many
	some  bool   // GPUs are expected (count may still be unknown)
	why   string // where it comes from, for messages
}

// Labels that say a node has GPUs. nvidia.com/gpu.count is what NVIDIA's
// GPU feature discovery puts on Kubernetes nodes; baseline-sku is the
// baselines SKU (h100-sxm-80g-x8-nvlink-ib400x8); sku is the coarse family
// selectors use (sku=h100, sku=h100-sxm-8).
const (
	labelGPUCount = "nvidia.com/gpu.count"
	labelSKU      = "sku"
	// labelBaselineSKU is labelBaselineSKU (a test holds them equal),
	// not imported: package baselines carries its store and the SQL
	// drivers under it into the node build, for one string.
	labelBaselineSKU = "baseline-sku"
)

// skuCount is the xN word of a baseline SKU.
var skuCount = regexp.MustCompile(`(?:^|-)x([0-9]{1,3})(?:-|$)`)

// gpuFamily matches the GPU model word of a SKU label: h100, a100, b200,
// gb200, gh200, l40s, l4, a10g, v100, h20, rtx6000, t4.
var gpuFamily = regexp.MustCompile(`^(?:[abhlv][0-9]{1,4}[a-z]?|g[bh][0-9]{2,4}|rtx[0-9]{3,5}[a-z]*|t4)$`)

// expectedGPUs reads the expectation: expect.gpu_count first, then the
// labels. A label that cannot be read says nothing rather than guessing.
func expectedGPUs(in checks.Input) gpuExpectation {
	if n := conf(in).Expect.GPUCount; n > 0 {
		return gpuExpectation{count: n, some: true, why: "expect.gpu_count"}
	}
	l := in.Labels
	if v, ok := l[labelGPUCount]; ok {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 && n <= 1024 {
			return gpuExpectation{count: n, some: true, why: fmt.Sprintf("label %s=%s", labelGPUCount, v)}
		}
	}
	if v, ok := l[labelBaselineSKU]; ok {
		if m := skuCount.FindStringSubmatch(strings.ToLower(v)); m != nil {
			if n, _ := strconv.Atoi(m[1]); n > 0 {
				return gpuExpectation{count: n, some: true, why: fmt.Sprintf("label %s=%s", labelBaselineSKU, v)}
			}
		}
	}
	for _, key := range []string{labelSKU, labelBaselineSKU} {
		v, ok := l[key]
		if !ok {
			continue
		}
		for _, w := range strings.FieldsFunc(strings.ToLower(v), func(r rune) bool {
			return r == '-' || r == '_' || r == '.' || r == ' ' || r == '/'
		}) {
			if gpuFamily.MatchString(w) {
				return gpuExpectation{some: true, why: fmt.Sprintf("label %s=%s", key, v)}
			}
		}
	}
	return gpuExpectation{}
}

// String says what is expected: "8 GPU(s) (expect.gpu_count)".
func (e gpuExpectation) String() string {
	if e.count > 0 {
		return fmt.Sprintf("%d GPU(s) (%s)", e.count, e.why)
	}
	return "GPUs (" + e.why + ")"
}
