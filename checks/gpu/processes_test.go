package gpu

import (
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

func TestProcesses(t *testing.T) {
	t.Parallel()
	idle := withCfg(func(c *config.Config) { c.Processes.ExpectIdle = true })
	idleAllow := withCfg(func(c *config.Config) {
		c.Processes.ExpectIdle = true
		c.Processes.Allowed = []string{"nv-hostengine"}
	})
	procs := func(used uint64, ps ...snapshot.GPUProcess) func(*snapshot.GPU) {
		return func(g *snapshot.GPU) { g.MemoryUsedMiB, g.Processes = u64(used), ps }
	}
	train := snapshot.GPUProcess{PID: 4242, Name: "python3", Type: "C", UsedMemoryMiB: u64(40960)}
	dcgm := snapshot.GPUProcess{PID: 900, Name: "/usr/bin/nv-hostengine", Type: "C", UsedMemoryMiB: u64(300)}
	hidden := snapshot.GPUProcess{PID: 77, Type: "C"}

	runTable(t, Processes{}, []tcase{
		{name: "busy node, not expected idle", snap: eight(0, procs(40960, train)), want: report.Pass,
			metrics: map[string]float64{"gpu0.process_count": 1, "gpu0.memory_used_mib": 40960, "gpu1.process_count": 0}},
		{name: "idle node, idle GPUs", snap: eight(-1), cfg: idle, want: report.Pass},
		{name: "ghost process on an idle node", snap: eight(3, procs(40960, train)), cfg: idle,
			want: report.Warn, findings: []string{"GPU3 GHOST_PROCESS restart_app"}},
		{name: "allowed by base name", snap: eight(3, procs(300, dcgm)), cfg: idleAllow, want: report.Pass},
		{name: "allowed one beside a ghost", snap: eight(3, procs(41260, dcgm, train)), cfg: idleAllow,
			want: report.Warn, findings: []string{"GPU3 GHOST_PROCESS restart_app"}},
		{name: "unnamed process", snap: eight(3, procs(500, hidden)), cfg: idleAllow,
			want: report.Warn, findings: []string{"GPU3 GHOST_PROCESS restart_app"}},
		{name: "memory held with no process", snap: eight(5, procs(30000)), cfg: idle,
			want: report.Warn, findings: []string{"GPU5 GHOST_MEMORY reset_gpu"}},
		{name: "driver overhead is not a ghost", snap: eight(5, procs(50)), cfg: idle, want: report.Pass},
		{name: "memory held, not expected idle", snap: eight(5, procs(30000)), want: report.Pass},
		{name: "memory unknown", snap: eight(5, func(g *snapshot.GPU) { g.MemoryUsedMiB = nil }), cfg: idle,
			want: report.Pass, absent: []string{"gpu5.memory_used_mib"}},
		{name: "no GPUs", snap: node(), want: report.Skip, reason: "no GPUs"},
	})
}

func TestProcessesFixtures(t *testing.T) {
	t.Parallel()
	runTable(t, Processes{}, []tcase{
		{name: "h100x8 idle", snap: fixture(t, "h100x8_v12.xml"), cfg: withCfg(func(c *config.Config) { c.Processes.ExpectIdle = true }),
			want: report.Pass, metrics: map[string]float64{"gpu0.process_count": 0, "gpu0.memory_used_mib": 0}},
		{name: "a10g Xorg on an idle node", snap: fixture(t, "a10g_v11.xml"),
			cfg:  withCfg(func(c *config.Config) { c.Processes.ExpectIdle = true }),
			want: report.Warn, findings: []string{"GPU0 GHOST_PROCESS restart_app"}},
		{name: "a10g Xorg allowed", snap: fixture(t, "a10g_v11.xml"),
			cfg:  withCfg(func(c *config.Config) { c.Processes.ExpectIdle, c.Processes.Allowed = true, []string{"Xorg"} }),
			want: report.Pass, metrics: map[string]float64{"gpu0.process_count": 1, "gpu0.memory_used_mib": 22}},
		// 50 MiB used by four MIG instances, no process: overhead, not a ghost.
		{name: "a100 MIG overhead", snap: fixture(t, "a100_mig_v12.xml"),
			cfg: withCfg(func(c *config.Config) { c.Processes.ExpectIdle = true }), want: report.Pass},
	})
}
