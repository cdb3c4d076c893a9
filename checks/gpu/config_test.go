package gpu

import (
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

func TestConfig(t *testing.T) {
	t.Parallel()
	eccOff := func(g *snapshot.GPU) { g.ECCEnabled, g.ECCPending = bp(false), bp(false) }
	expectAll := withCfg(func(c *config.Config) {
		c.Expect.ECCEnabled, c.Expect.PersistenceMode, c.Expect.MIGEnabled = bp(true), bp(true), bp(false)
		c.Expect.ComputeMode = "Default"
	})
	unknown := func(g *snapshot.GPU) {
		g.ECCEnabled, g.ECCPending, g.PersistenceMode, g.MIGEnabled, g.ComputeMode = nil, nil, nil, nil, ""
	}
	half := node(gpu(0), gpu(1), gpu(2, eccOff), gpu(3, eccOff))

	runTable(t, Config{}, []tcase{
		{name: "uniform, nothing expected", snap: eight(-1), want: report.Pass},
		{name: "uniform, all as expected", snap: eight(-1), cfg: expectAll, want: report.Pass},
		{name: "ECC off against the expectation", snap: eight(5, eccOff), cfg: expectAll,
			want: report.Fail, findings: []string{"GPU5 ECC_MODE_MISMATCH reset_gpu"}},
		{name: "ECC off, majority on", snap: eight(5, eccOff),
			want: report.Warn, findings: []string{"GPU5 ECC_MODE_INCONSISTENT reset_gpu"}},
		{name: "ECC split evenly: one node warning", snap: half,
			want: report.Warn, findings: []string{"node ECC_MODE_INCONSISTENT reset_gpu"}},
		{name: "ECC pending differs", snap: eight(2, func(g *snapshot.GPU) { g.ECCPending = bp(false) }),
			want: report.Warn, findings: []string{"GPU2 ECC_MODE_PENDING reset_gpu"}},
		{name: "persistence off against the expectation", snap: eight(0, func(g *snapshot.GPU) { g.PersistenceMode = bp(false) }),
			cfg: expectAll, want: report.Fail, findings: []string{"GPU0 PERSISTENCE_MODE_MISMATCH none"}},
		{name: "MIG on against the expectation", snap: eight(7, func(g *snapshot.GPU) { g.MIGEnabled = bp(true) }),
			cfg: expectAll, want: report.Fail, findings: []string{"GPU7 MIG_MODE_MISMATCH reset_gpu"}},
		{name: "MIG not supported meets 'off'", snap: node(gpu(0, func(g *snapshot.GPU) { g.MIGEnabled = nil })),
			cfg: expectAll, want: report.Pass},
		{name: "MIG not supported fails 'on'", snap: node(gpu(0, func(g *snapshot.GPU) { g.MIGEnabled = nil })),
			cfg:  withCfg(func(c *config.Config) { c.Expect.MIGEnabled = bp(true) }),
			want: report.Fail, findings: []string{"GPU0 MIG_MODE_MISMATCH reset_gpu"}},
		{name: "compute mode spelled differently still matches",
			snap: eight(-1), cfg: withCfg(func(c *config.Config) { c.Expect.ComputeMode = "default" }), want: report.Pass},
		{name: "compute mode drift", snap: eight(4, func(g *snapshot.GPU) { g.ComputeMode = "Exclusive_Process" }),
			want: report.Warn, findings: []string{"GPU4 COMPUTE_MODE_INCONSISTENT none"}},
		{name: "mode not reported but expected", snap: node(gpu(0, unknown)),
			cfg:  withCfg(func(c *config.Config) { c.Expect.ECCEnabled = bp(true) }),
			want: report.Warn, findings: []string{"GPU0 GPU_CONFIG_UNKNOWN monitor"}},
		{name: "nothing reported, nothing expected", snap: node(gpu(0, unknown), gpu(1, unknown)),
			want: report.Skip, reason: "no GPU reports"},
		{name: "no GPUs", snap: node(), want: report.Skip, reason: "no GPUs"},
	})
}

func TestConfigFixtures(t *testing.T) {
	t.Parallel()
	runTable(t, Config{}, []tcase{
		{name: "h100x8 uniform", snap: fixture(t, "h100x8_v12.xml"), want: report.Pass},
		{name: "h100x8 against persistence off", snap: fixture(t, "h100x8_v12.xml"),
			cfg:  withCfg(func(c *config.Config) { c.Expect.PersistenceMode = bp(false) }),
			want: report.Fail, findings: []string{
				"GPU0 PERSISTENCE_MODE_MISMATCH none", "GPU1 PERSISTENCE_MODE_MISMATCH none",
				"GPU2 PERSISTENCE_MODE_MISMATCH none", "GPU3 PERSISTENCE_MODE_MISMATCH none",
				"GPU4 PERSISTENCE_MODE_MISMATCH none", "GPU5 PERSISTENCE_MODE_MISMATCH none",
				"GPU6 PERSISTENCE_MODE_MISMATCH none", "GPU7 PERSISTENCE_MODE_MISMATCH none"}},
		{name: "a100 MIG on as expected", snap: fixture(t, "a100_mig_v12.xml"),
			cfg:  withCfg(func(c *config.Config) { c.Expect.MIGEnabled, c.Expect.ECCEnabled = bp(true), bp(true) }),
			want: report.Pass},
		{name: "a10g without MIG support, MIG off expected", snap: fixture(t, "a10g_v11.xml"),
			cfg: withCfg(func(c *config.Config) { c.Expect.MIGEnabled = bp(false) }), want: report.Pass},
	})
}
