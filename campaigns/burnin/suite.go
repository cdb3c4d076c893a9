package burnin

import (
	"bufio"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/config"
)

// Metric names the default suites compare.
const (
	MetricBusBW     = "nccl.allreduce.busbw_gbps"  // single node, largest size
	MetricPairBusBW = "nccl.allreduce2.busbw_gbps" // two nodes, largest size
	MetricPCIeH2D   = "pcie.h2d_bandwidth_gbps"    // from the pcie-bandwidth action
	MetricPCIeD2H   = "pcie.d2h_bandwidth_gbps"
)

// Names of the default suites' agent actions. Each must be configured in
// the agent (docs/burnin.md says what each runs).
const (
	ActionPCIeBandwidth = "pcie-bandwidth"
	ActionGPUStress     = "gpu-burn"
)

// PassiveChecks lists every check that is not disruptive, in report order.
func PassiveChecks() []string {
	var out []string
	for _, c := range registry.All() {
		if !c.Disruptive() {
			out = append(out, c.Name())
		}
	}
	return out
}

// DefaultSuite returns the built-in suite of a level:
//
//   - quick (suite burnin.quick): every passive check.
//   - standard (burnin.standard): the passive checks, dcgm.diag at level
//     2, a single-node all_reduce sweep over sizes (8 B..8 GiB), the
//     pcie-bandwidth action, and the passive checks again (what the
//     stress shook loose: Xids, ECC, links).
//   - extended (burnin.extended): as standard with dcgm.diag at level 3
//     (a superset of level 2, so level 2 is not run as well), a timed
//     gpu-burn with gpu.thermal sampled every minute, and 2-node
//     all_reduce pairs in two rounds; repeated 3 times by default.
func DefaultSuite(l Level, stress time.Duration) Suite {
	if stress <= 0 {
		stress = DefaultStressDuration
	}
	passive := Step{Name: "passive", Kind: StepChecks, Checks: PassiveChecks(), Timeout: config.Duration(5 * time.Minute)}
	after := passive
	after.Name = "passive-after"
	sweepParams := map[string]string{"min_bytes": "8", "max_bytes": "8G", "step_factor": "2"}
	dcgm := func(level string, t time.Duration) Step {
		return Step{Name: "dcgm-r" + level, Kind: StepChecks, Checks: []string{"dcgm.diag"},
			Params: map[string]string{"level": level}, Timeout: config.Duration(t)}
	}
	sweep := Step{Name: "allreduce-sweep", Kind: StepChecks, Checks: []string{"nccl.allreduce"},
		Params: sweepParams, Timeout: config.Duration(15 * time.Minute)}
	pcie := Step{Name: "pcie-bandwidth", Kind: StepAction, Action: ActionPCIeBandwidth, Timeout: config.Duration(10 * time.Minute)}
	switch l {
	case Standard:
		return Suite{Name: "burnin.standard", Steps: []Step{passive, dcgm("2", 20*time.Minute), sweep, pcie, after}}
	case Extended:
		stressStep := Step{Name: "gpu-stress", Kind: StepAction, Action: ActionGPUStress,
			Params:       map[string]string{"duration": stress.String()},
			Timeout:      config.Duration(stress + stressMargin),
			SampleChecks: []string{"gpu.thermal"}, SampleEvery: config.Duration(DefaultSampleEvery)}
		// No parameters: an agent's multi_node.launcher_command fixes the
		// sizes of a multi-node run, and agents refuse any sent.
		pairs := Step{Name: "allreduce-pairs", Kind: StepPairs, Checks: []string{"nccl.allreduce"},
			Rounds: DefaultRounds, Timeout: config.Duration(15 * time.Minute)}
		return Suite{Name: "burnin.extended", Steps: []Step{passive, dcgm("3", time.Hour), sweep, pcie, stressStep, after, pairs}}
	default:
		return Suite{Name: "burnin.quick", Steps: []Step{passive}}
	}
}

// DefaultMetrics returns the metrics a suite produces that are compared:
// all_reduce bus bandwidth (required where measured) and the PCIe
// bandwidths (compared when the action reports them).
func DefaultMetrics(su Suite) []Metric {
	var out []Metric
	add := func(m Metric) {
		for _, o := range out {
			if o.Name == m.Name {
				return
			}
		}
		out = append(out, m)
	}
	for _, st := range su.Steps {
		switch {
		case st.Kind == StepChecks && contains(st.Checks, "nccl.allreduce"):
			add(Metric{Name: MetricBusBW, Direction: "higher", Required: true})
		case st.Kind == StepPairs:
			add(Metric{Name: MetricPairBusBW, Direction: "higher", Required: true})
		case st.Kind == StepAction && st.Action == ActionPCIeBandwidth:
			add(Metric{Name: MetricPCIeH2D, Direction: "higher"})
			add(Metric{Name: MetricPCIeD2H, Direction: "higher"})
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// maxActionMetrics bounds what one action's output can add.
const maxActionMetrics = 64

// ParseActionMetrics reads the numbers an agent action reports in its
// output, one per line: "metric NAME VALUE" (NAME a dotted lowercase
// metric name, VALUE a finite number). Other lines are ignored, so an
// action can print its tool's own output around them.
func ParseActionMetrics(out string) map[string]float64 {
	m := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() && len(m) < maxActionMetrics {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || f[0] != "metric" || validMetricName(f[1]) != nil {
			continue
		}
		v, err := strconv.ParseFloat(f[2], 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			continue
		}
		m[f[1]] = v
	}
	return m
}
