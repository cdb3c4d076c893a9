package gpu

import (
	"strings"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Thermal is gpu.thermal: core and memory temperature against the limits,
// and the clock-event reasons. Thermal slowdown (hw or sw) is a fault;
// hw_slowdown together with the power brake and no thermal reason is what
// a healthy H100 reports at idle, so it is not; hw_slowdown alone (the
// board's external slowdown signal) warns. Power capping is normal under
// load and is not judged.
type Thermal struct{}

// Name implements checks.Check.
func (Thermal) Name() string { return "gpu.thermal" }

// Needs implements checks.Check.
func (Thermal) Needs() []snapshot.Source { return []snapshot.Source{snapshot.SrcNvidiaSMI} }

// Disruptive implements checks.Check.
func (Thermal) Disruptive() bool { return false }

// Run implements checks.Check.
func (Thermal) Run(in checks.Input) checks.Result {
	gs, res, ok := gpus(in)
	if !ok {
		return res
	}
	lim := conf(in).Limits
	judged := false
	for _, g := range gs {
		if g.PowerDrawW != nil {
			res.Metric(metric(g, "power_w"), *g.PowerDrawW)
		}
		if g.MemoryTempC != nil {
			judged = true
			res.Metric(metric(g, "memory_temperature_c"), *g.MemoryTempC)
			if lim.MemoryTempFailC > 0 && *g.MemoryTempC > lim.MemoryTempFailC {
				res.Add(finding(g, report.SevFail, CodeMemoryTempHigh, report.ActionDrain,
					"memory at %.0f °C, limit %.0f °C", *g.MemoryTempC, lim.MemoryTempFailC))
			}
		}
		if g.TemperatureC != nil {
			judged = true
			coreTemp(&res, g, lim.GPUTempWarnC, lim.GPUTempFailC)
		}
		if g.ClockEvents != nil {
			judged = true
			clockEvents(&res, g)
		}
	}
	if !judged {
		return checks.Skipf("no GPU reports a temperature or clock-event reasons")
	}
	return res
}

// coreTemp applies the fail limit (or, when it is 0, the GPU's own slowdown
// threshold) and the warn limit; a limit of 0 is off.
func coreTemp(res *checks.Result, g snapshot.GPU, warnC, failC float64) {
	t := *g.TemperatureC
	res.Metric(metric(g, "temperature_c"), t)
	failFrom := "limits.gpu_temp_fail_c"
	if failC == 0 && g.SlowdownTempC != nil {
		failC, failFrom = *g.SlowdownTempC, "the GPU's slowdown threshold"
	}
	switch {
	case failC > 0 && t > failC:
		res.Add(finding(g, report.SevFail, CodeGPUTempHigh, report.ActionDrain,
			"GPU at %.0f °C, over %.0f °C (%s)", t, failC, failFrom))
	case warnC > 0 && t > warnC:
		res.Add(finding(g, report.SevWarn, CodeGPUTempWarn, report.ActionMonitor,
			"GPU at %.0f °C, over the warning limit of %.0f °C", t, warnC))
	}
}

func clockEvents(res *checks.Result, g snapshot.GPU) {
	ev := g.ClockEvents
	var thermal []string
	for _, r := range []string{"hw_thermal_slowdown", "sw_thermal_slowdown"} {
		if ev[r] {
			thermal = append(thermal, r)
		}
	}
	switch {
	case len(thermal) > 0:
		res.Add(finding(g, report.SevFail, CodeThermalSlowdown, report.ActionDrain,
			"clocks held down by %s%s", strings.Join(thermal, " and "), tempSuffix(g)))
	case ev["hw_slowdown"] && !ev["hw_power_brake_slowdown"]:
		res.Add(finding(g, report.SevWarn, CodeHWSlowdown, report.ActionMonitor,
			"hw_slowdown active without a thermal or power-brake reason%s: the board is signalling a slowdown", tempSuffix(g)))
	}
}

func tempSuffix(g snapshot.GPU) string {
	if g.TemperatureC == nil {
		return ""
	}
	s := " at " + formatC(*g.TemperatureC)
	if g.PowerDrawW != nil {
		s += ", " + formatW(*g.PowerDrawW)
	}
	return s
}
