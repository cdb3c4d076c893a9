package gpu

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

func TestECC(t *testing.T) {
	t.Parallel()
	noECC := func(g *snapshot.GPU) {
		g.ECC = snapshot.ECC{}
		g.RemappedRows, g.RetiredPages, g.ResetRequired, g.DrainAndReset, g.RecoveryAction = nil, nil, nil, nil, ""
	}
	preAmpere := func(single, double uint64, pending bool) func(*snapshot.GPU) {
		return func(g *snapshot.GPU) {
			g.RemappedRows = nil
			g.RetiredPages = &snapshot.RetiredPages{SingleBit: u64(single), DoubleBit: u64(double), Pending: bp(pending)}
		}
	}
	recovery := func(a string) func(*snapshot.GPU) { return func(g *snapshot.GPU) { g.RecoveryAction = a } }

	runTable(t, ECC{}, []tcase{
		{name: "clean", snap: eight(-1), want: report.Pass, metrics: map[string]float64{
			"gpu3.ecc.volatile_uncorrectable_count": 0, "gpu3.ecc.aggregate_uncorrectable_count": 0,
			"gpu3.ecc.aggregate_correctable_count": 0, "gpu3.remapped_rows.uncorrectable_count": 0, "gpu3.remapped_rows.pending_flag": 0}},
		{name: "correctable errors are metrics only", snap: eight(1, func(g *snapshot.GPU) {
			g.ECC.Volatile.Correctable, g.ECC.Aggregate.Correctable = u64(12), u64(4000)
		}), want: report.Pass, metrics: map[string]float64{"gpu1.ecc.volatile_correctable_count": 12, "gpu1.ecc.aggregate_correctable_count": 4000}},
		{name: "volatile uncorrectable", snap: eight(3, func(g *snapshot.GPU) {
			g.ECC.Volatile.Uncorrectable = u64(2)
			g.ECC.Volatile.Detail = map[string]uint64{"dram_uncorrectable": 2, "sram_correctable": 9}
		}), want: report.Fail, findings: []string{"GPU3 ECC_UNCORRECTABLE drain"},
			metrics: map[string]float64{"gpu3.ecc.volatile_uncorrectable_count": 2}},
		{name: "aggregate uncorrectable only", snap: eight(0, func(g *snapshot.GPU) { g.ECC.Aggregate.Uncorrectable = u64(1) }),
			want: report.Fail, findings: []string{"GPU0 ECC_UNCORRECTABLE drain"}},
		{name: "remap failure", snap: eight(6, func(g *snapshot.GPU) {
			g.RemappedRows = &snapshot.RemappedRows{Uncorrectable: 8, Failure: true}
		}), want: report.Fail, findings: []string{"GPU6 ROW_REMAP_FAILURE replace"},
			metrics: map[string]float64{"gpu6.remapped_rows.failure_flag": 1, "gpu6.remapped_rows.uncorrectable_count": 8}},
		{name: "remap pending", snap: eight(2, func(g *snapshot.GPU) {
			g.RemappedRows = &snapshot.RemappedRows{Uncorrectable: 1, Pending: true}
		}), want: report.Warn, findings: []string{"GPU2 ROW_REMAP_PENDING reset_gpu"}},
		{name: "retired pages under the limit", snap: node(gpu(0, preAmpere(30, 2, false))), want: report.Pass,
			metrics: map[string]float64{"gpu0.retired_pages.single_bit_count": 30, "gpu0.retired_pages.double_bit_count": 2}},
		{name: "retired pages over the default limit", snap: node(gpu(0, preAmpere(55, 6, false))),
			want: report.Fail, findings: []string{"GPU0 RETIRED_PAGES_LIMIT replace"}},
		{name: "retired pages over a configured limit", snap: node(gpu(0, preAmpere(3, 0, false))),
			cfg:  withCfg(func(c *config.Config) { c.Limits.RetiredPagesMax = 2 }),
			want: report.Fail, findings: []string{"GPU0 RETIRED_PAGES_LIMIT replace"}},
		{name: "retirement pending", snap: node(gpu(0, preAmpere(1, 0, true))),
			want: report.Warn, findings: []string{"GPU0 RETIRED_PAGES_PENDING reset_gpu"}},
		{name: "recovery action none", snap: eight(0, recovery("None")), want: report.Pass},
		{name: "recovery: GPU reset", snap: eight(1, recovery("GPU Reset")),
			want: report.Fail, findings: []string{"GPU1 GPU_RECOVERY_ACTION reset_gpu"}},
		{name: "recovery: node reboot", snap: eight(1, recovery("Node Reboot")),
			want: report.Fail, findings: []string{"GPU1 GPU_RECOVERY_ACTION reboot"}},
		{name: "recovery: drain P2P", snap: eight(1, recovery("Drain P2P")),
			want: report.Fail, findings: []string{"GPU1 GPU_RECOVERY_ACTION drain"}},
		{name: "recovery: drain and reset", snap: eight(1, recovery("Drain and Reset")),
			want: report.Fail, findings: []string{"GPU1 GPU_RECOVERY_ACTION drain"}},
		{name: "recovery: unknown action still asks for something", snap: eight(1, recovery("Recalibrate Flux")),
			want: report.Fail, findings: []string{"GPU1 GPU_RECOVERY_ACTION drain"}},
		{name: "reset required", snap: eight(4, func(g *snapshot.GPU) { g.ResetRequired = bp(true) }),
			want: report.Warn, findings: []string{"GPU4 GPU_RESET_REQUIRED reset_gpu"}},
		{name: "drain and reset recommended", snap: eight(4, func(g *snapshot.GPU) { g.DrainAndReset = bp(true) }),
			want: report.Warn, findings: []string{"GPU4 GPU_DRAIN_AND_RESET_RECOMMENDED drain"}},
		{name: "SRAM threshold exceeded", snap: eight(5, func(g *snapshot.GPU) { g.ECC.SRAMThresholdExceeded = bp(true) }),
			want: report.Fail, findings: []string{"GPU5 SRAM_THRESHOLD_EXCEEDED replace"}},
		{name: "several at once, worst first", snap: node(
			gpu(0, func(g *snapshot.GPU) { g.RemappedRows = &snapshot.RemappedRows{Pending: true} }),
			gpu(1, func(g *snapshot.GPU) {
				g.ECC.Volatile.Uncorrectable = u64(1)
				g.RemappedRows = &snapshot.RemappedRows{Uncorrectable: 1, Pending: true}
			})),
			want: report.Fail, findings: []string{"GPU1 ECC_UNCORRECTABLE drain", "GPU0 ROW_REMAP_PENDING reset_gpu", "GPU1 ROW_REMAP_PENDING reset_gpu"}},
		{name: "one GPU without ECC data among others", snap: eight(2, noECC), want: report.Pass,
			absent: []string{"gpu2.ecc.volatile_uncorrectable_count", "gpu2.remapped_rows.pending_flag"}},
		{name: "no ECC data at all", snap: node(gpu(0, noECC), gpu(1, noECC)), want: report.Skip, reason: "ECC off or not supported"},
		{name: "source failed", snap: withSource(eight(-1), snapshot.SourceState{State: snapshot.StateFailed, Error: "exit status 15"}),
			want: report.Error, reason: "exit status 15"},
		{name: "source absent", snap: withSource(eight(-1), snapshot.SourceState{State: snapshot.StateAbsent}),
			want: report.Skip, reason: "no nvidia-smi.xml"},
	})
}

func TestECCMessageNamesCounters(t *testing.T) {
	t.Parallel()
	s := eight(3, func(g *snapshot.GPU) {
		g.ECC.Volatile.Uncorrectable = u64(2)
		g.ECC.Volatile.Detail = map[string]uint64{"dram_uncorrectable": 2, "sram_uncorrectable_parity": 0}
		g.ECC.Aggregate.Uncorrectable = u64(5)
	})
	cr := checks.Run([]checks.Check{ECC{}}, checks.Input{Snap: s, Now: time.Now()})[0]
	if len(cr.Findings) != 1 {
		t.Fatalf("findings: %+v", cr.Findings)
	}
	f := cr.Findings[0]
	for _, want := range []string{"2 volatile", "5 aggregate", "volatile dram_uncorrectable=2"} {
		if !strings.Contains(f.Message, want) {
			t.Errorf("message %q lacks %q", f.Message, want)
		}
	}
	if strings.Contains(f.Message, "parity") || f.PCIBusID != "0000:1c:00.0" {
		t.Errorf("message %q / bus %q", f.Message, f.PCIBusID)
	}
}

func TestECCFixtures(t *testing.T) {
	t.Parallel()
	runTable(t, ECC{}, []tcase{
		{name: "h100x8 clean", snap: fixture(t, "h100x8_v12.xml"), want: report.Pass,
			metrics: map[string]float64{"gpu7.ecc.aggregate_uncorrectable_count": 0, "gpu7.remapped_rows.failure_flag": 0}},
		// remapped_rows is the bare string N/A under MIG: the counters still judge.
		{name: "a100 MIG without remap data", snap: fixture(t, "a100_mig_v12.xml"), want: report.Pass,
			absent: []string{"gpu0.remapped_rows.pending_flag"}},
		{name: "a10g old schema", snap: fixture(t, "a10g_v11.xml"), want: report.Pass},
	})
}
