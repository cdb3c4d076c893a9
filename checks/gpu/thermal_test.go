package gpu

import (
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

func TestThermal(t *testing.T) {
	t.Parallel()
	temp := func(c float64) func(*snapshot.GPU) { return func(g *snapshot.GPU) { g.TemperatureC = f64(c) } }
	events := func(active ...string) func(*snapshot.GPU) {
		return func(g *snapshot.GPU) {
			g.ClockEvents = map[string]bool{"gpu_idle": false, "hw_slowdown": false, "hw_power_brake_slowdown": false,
				"hw_thermal_slowdown": false, "sw_thermal_slowdown": false, "sw_power_cap": false}
			for _, a := range active {
				g.ClockEvents[a] = true
			}
		}
	}
	slow := func(c float64) func(*snapshot.GPU) { return func(g *snapshot.GPU) { g.SlowdownTempC = f64(c) } }
	noLimits := &config.Config{}

	runTable(t, Thermal{}, []tcase{
		{name: "cool", snap: eight(-1), want: report.Pass,
			metrics: map[string]float64{"gpu0.temperature_c": 35, "gpu0.memory_temperature_c": 40, "gpu0.power_w": 70}},
		{name: "over the warn limit", snap: eight(2, temp(86)), want: report.Warn, findings: []string{"GPU2 GPU_TEMP_WARN monitor"}},
		{name: "at the warn limit is not over it", snap: eight(2, temp(85)), want: report.Pass},
		{name: "over the configured fail limit", snap: eight(2, temp(91)),
			cfg:  withCfg(func(c *config.Config) { c.Limits.GPUTempFailC = 90 }),
			want: report.Fail, findings: []string{"GPU2 GPU_TEMP_HIGH drain"}},
		{name: "over the GPU's own slowdown threshold", snap: eight(2, temp(90), slow(89)),
			want: report.Fail, findings: []string{"GPU2 GPU_TEMP_HIGH drain"}},
		{name: "configured fail limit wins over slowdown threshold", snap: eight(2, temp(90), slow(89)),
			cfg:  withCfg(func(c *config.Config) { c.Limits.GPUTempFailC = 95 }),
			want: report.Warn, findings: []string{"GPU2 GPU_TEMP_WARN monitor"}},
		{name: "limits off", snap: eight(2, temp(99)), cfg: noLimits, want: report.Pass},
		{name: "memory over its limit", snap: eight(1, func(g *snapshot.GPU) { g.MemoryTempC = f64(96) }),
			cfg:  withCfg(func(c *config.Config) { c.Limits.MemoryTempFailC = 95 }),
			want: report.Fail, findings: []string{"GPU1 MEMORY_TEMP_HIGH drain"}},
		{name: "memory hot without a limit", snap: eight(1, func(g *snapshot.GPU) { g.MemoryTempC = f64(96) }), want: report.Pass},
		{name: "hw thermal slowdown", snap: eight(5, events("hw_thermal_slowdown", "hw_slowdown")),
			want: report.Fail, findings: []string{"GPU5 THERMAL_SLOWDOWN drain"}},
		{name: "sw thermal slowdown", snap: eight(5, events("sw_thermal_slowdown")),
			want: report.Fail, findings: []string{"GPU5 THERMAL_SLOWDOWN drain"}},
		{name: "power brake with hw_slowdown at idle (healthy H100)", snap: eight(5, events("hw_slowdown", "hw_power_brake_slowdown")),
			want: report.Pass},
		{name: "hw_slowdown alone", snap: eight(5, events("hw_slowdown")),
			want: report.Warn, findings: []string{"GPU5 HW_SLOWDOWN monitor"}},
		{name: "power cap under load", snap: eight(5, events("sw_power_cap")), want: report.Pass},
		{name: "hot and throttling", snap: eight(0, temp(92), slow(90), events("hw_thermal_slowdown")),
			want: report.Fail, findings: []string{"GPU0 GPU_TEMP_HIGH drain", "GPU0 THERMAL_SLOWDOWN drain"}},
		{name: "unknown values are left out", snap: eight(3, func(g *snapshot.GPU) { g.TemperatureC, g.PowerDrawW, g.MemoryTempC = nil, nil, nil }),
			want: report.Pass, absent: []string{"gpu3.temperature_c", "gpu3.power_w", "gpu3.memory_temperature_c"}},
		{name: "nothing to judge", snap: node(gpu(0, func(g *snapshot.GPU) { g.TemperatureC, g.MemoryTempC, g.ClockEvents = nil, nil, nil })),
			want: report.Skip, reason: "no GPU reports"},
	})
}

func TestThermalFixtures(t *testing.T) {
	t.Parallel()
	runTable(t, Thermal{}, []tcase{
		// Every H100 shows hw_slowdown and the power brake active at idle.
		{name: "h100x8 idle with power brake", snap: fixture(t, "h100x8_v12.xml"), want: report.Pass,
			metrics: map[string]float64{"gpu0.temperature_c": 29, "gpu0.memory_temperature_c": 39, "gpu0.power_w": 67.74}},
		{name: "a100 has absolute thresholds", snap: fixture(t, "a100_mig_v12.xml"), want: report.Pass,
			metrics: map[string]float64{"gpu0.temperature_c": 27}},
		{name: "a10g old throttle reasons", snap: fixture(t, "a10g_v11.xml"), want: report.Pass,
			absent: []string{"gpu0.memory_temperature_c"}},
		{name: "a10g against a low fail limit", snap: fixture(t, "a10g_v11.xml"),
			cfg:  withCfg(func(c *config.Config) { c.Limits.GPUTempFailC = 15 }),
			want: report.Fail, findings: []string{"GPU0 GPU_TEMP_HIGH drain"}},
	})
}
