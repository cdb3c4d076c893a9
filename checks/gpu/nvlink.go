package gpu

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// NVLink is gpu.nvlink: NVLink link state, speed and error counters from
// nvidia-smi nvlink --status / -e.
//
//   - A node where no GPU has an active link has no NVLink in use
//     (PCIe-only GPUs print nothing or only inactive links): the check skips
//     with "no active NVLink", unless expect.nvswitch is true, which makes
//     every GPU's missing links NVLINK_DOWN.
//   - Otherwise an inactive link, or a GPU listing fewer links than the most
//     any GPU of its model lists, fails NVLINK_DOWN. Action reset_gpu: a
//     reset retrains the links; a link that stays down after it means the
//     GPU or baseboard is replaced.
//   - An active link slower than the fastest active link of a GPU of the
//     same model warns NVLINK_SPEED_LOW (action reset_gpu).
//   - With a previous run, a counter that rose by more than
//     limits.nvlink_error_rise (default 0) fails NVLINK_ERRORS_RISING
//     (action reset_gpu; replace when it keeps rising). A counter lower than
//     before was cleared (GPU reset, driver reload) and its rise is unknown.
//     Pre-FEC counters that grow on healthy NVLink5 links (fec_*, symbol)
//     are metrics only. Without a previous run counters are metrics only.
//
// Metrics per GPU i: gpu<i>.nvlink.active_link_count, gpu<i>.nvlink.inactive_link_count,
// gpu<i>.nvlink.speed_gbps (sum over active links of the
// per-link, per-direction speed nvidia-smi prints, in gigaBYTES per second),
// gpu<i>.nvlink.<counter>_count (summed over links) and, with a previous
// run, gpu<i>.nvlink.<counter>_rise_count; node-wide nvlink.active_link_count and
// nvlink.inactive_link_count.
type NVLink struct{}

var _ checks.Check = NVLink{}

// Name is the check's fixed name.
func (NVLink) Name() string { return "gpu.nvlink" }

// Needs the nvidia-smi nvlink output.
func (NVLink) Needs() []snapshot.Source { return []snapshot.Source{snapshot.SrcNVLink} }

// Disruptive is false: the check only reads the snapshot.
func (NVLink) Disruptive() bool { return false }

// speedTolerance absorbs rounding in nvidia-smi's printed speeds.
const speedTolerance = 0.99

// Run judges every GPU's links.
func (NVLink) Run(in checks.Input) checks.Result {
	cfg := conf(in)
	expectNV := cfg.Expect.NVSwitch != nil && *cfg.Expect.NVSwitch
	var gpus []snapshot.NVLinkGPU
	if in.Snap != nil && in.Snap.NVLink != nil {
		gpus = in.Snap.NVLink.GPUs
	}
	res := checks.Result{Status: report.Pass}
	buses := busByIndex(in.Snap)

	if len(gpus) == 0 {
		if expectNV {
			res.Add(report.Finding{Severity: report.SevFail, Component: checks.NodeComponent, Code: CodeNVLinkDown,
				Message: "nvidia-smi nvlink lists no GPUs on a node expected to have an NVSwitch fabric (expect.nvswitch)",
				Action:  report.ActionResetGPU})
			return res
		}
		return checks.Skipf("nvidia-smi nvlink lists no GPUs")
	}

	// What siblings show: the most links any GPU of a model lists and the
	// fastest active link per model.
	maxLinks := map[string]int{}
	maxSpeed := map[string]float64{}
	totalActive, totalInactive := 0, 0
	for _, g := range gpus {
		if len(g.Links) > maxLinks[g.Name] {
			maxLinks[g.Name] = len(g.Links)
		}
		for _, l := range g.Links {
			if l.Active {
				totalActive++
				if l.SpeedGBps > maxSpeed[g.Name] {
					maxSpeed[g.Name] = l.SpeedGBps
				}
			} else {
				totalInactive++
			}
		}
	}
	res.Metric("nvlink.active_link_count", float64(totalActive))
	res.Metric("nvlink.inactive_link_count", float64(totalInactive))

	if totalActive == 0 && !expectNV {
		// Metrics stay: a skip with numbers still says what was seen.
		res.Status, res.Reason = report.Skip, "no active NVLink"
		return res
	}

	var prev map[string]map[string]uint64
	if in.Prev != nil {
		prev = in.Prev.NVLinkErrors
	}
	limit := cfg.Limits.NVLinkErrorRise
	for _, g := range gpus {
		comp := checks.GPUComponent(g.Index)
		bus := buses[g.Index]
		pfx := "gpu" + strconv.Itoa(g.Index) + ".nvlink."
		var active, inactive, slow []string
		speed := 0.0
		sums := map[string]uint64{}
		rises := map[string]uint64{}
		var rising []string
		for _, l := range g.Links {
			if l.Active {
				active = append(active, strconv.Itoa(l.Link))
				speed += l.SpeedGBps
				if top := maxSpeed[g.Name]; l.SpeedGBps < top*speedTolerance {
					slow = append(slow, fmt.Sprintf("link %d at %s GB/s", l.Link, fmtSpeed(l.SpeedGBps)))
				}
			} else {
				inactive = append(inactive, strconv.Itoa(l.Link))
			}
			pl, hasPrev := prev[checks.NVLinkKey(g.Index, l.Link)]
			for _, name := range sortedKeys(l.Errors) {
				v := l.Errors[name]
				sums[name] += v
				pv, ok := pl[name]
				if !hasPrev || !ok || v < pv {
					continue
				}
				rises[name] += v - pv
				if v-pv > limit && judgedCounter(name) {
					rising = append(rising, fmt.Sprintf("link %d %s +%d", l.Link, name, v-pv))
				}
			}
		}
		res.Metric(pfx+"active_link_count", float64(len(active)))
		res.Metric(pfx+"inactive_link_count", float64(len(inactive)))
		// nvidia-smi prints three decimals; summing floats adds noise below that.
		res.Metric(pfx+"speed_gbps", math.Round(speed*1000)/1000)
		for name, v := range sums {
			res.Metric(pfx+metricWord(name)+"_count", float64(v))
		}
		for name, v := range rises {
			res.Metric(pfx+metricWord(name)+"_rise_count", float64(v))
		}

		missing := maxLinks[g.Name] - len(g.Links)
		switch {
		case totalActive == 0:
			res.Add(report.Finding{Severity: report.SevFail, Component: comp, PCIBusID: bus, Code: CodeNVLinkDown,
				Message: fmt.Sprintf("no active NVLink (%d links listed) on a node expected to have an NVSwitch fabric: reset the GPU; replace it if the links stay down", len(g.Links)),
				Action:  report.ActionResetGPU})
		case len(inactive) > 0 || missing > 0:
			msg := fmt.Sprintf("%d of %d NVLink links active", len(active), maxLinks[g.Name])
			if len(inactive) > 0 {
				msg += "; inactive: " + strings.Join(inactive, ", ")
			}
			if missing > 0 {
				msg += fmt.Sprintf("; %d links not listed that other %s GPUs list", missing, g.Name)
			}
			msg += ": reset the GPU; replace it if the links stay down"
			res.Add(report.Finding{Severity: report.SevFail, Component: comp, PCIBusID: bus, Code: CodeNVLinkDown,
				Message: msg, Action: report.ActionResetGPU})
		}
		if len(slow) > 0 {
			res.Add(report.Finding{Severity: report.SevWarn, Component: comp, PCIBusID: bus, Code: CodeNVLinkSpeedLow,
				Message: fmt.Sprintf("%s, below the %s GB/s of its siblings", strings.Join(slow, ", "), fmtSpeed(maxSpeed[g.Name])),
				Action:  report.ActionResetGPU})
		}
		if len(rising) > 0 {
			res.Add(report.Finding{Severity: report.SevFail, Component: comp, PCIBusID: bus, Code: CodeNVLinkErrorsRising,
				Message: fmt.Sprintf("NVLink error counters rose since the previous run by more than %d: %s; reset the GPU, replace it if they keep rising",
					limit, strings.Join(rising, ", ")),
				Action: report.ActionResetGPU})
		}
	}
	return res
}

// judgedCounter leaves out counters taken before forward error correction:
// on NVLink5 they grow on healthy links, and the post-FEC counters
// (effective errors, replays, recoveries) carry the verdict.
func judgedCounter(name string) bool {
	return !strings.HasPrefix(name, "fec") && !strings.HasPrefix(name, "symbol")
}

func fmtSpeed(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func sortedKeys(m map[string]uint64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
