package ib

import (
	"testing"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

func TestPorts(t *testing.T) {
	t.Parallel()
	expect := func(ports int, rate float64) *config.Config {
		c := config.Defaults()
		c.Expect.IBPorts, c.Expect.IBRateGbps = ports, rate
		return c
	}
	mod := func(f func(hs []snapshot.HCA)) []snapshot.HCA {
		hs := h100HCAs()
		f(hs)
		return hs
	}
	tests := []struct {
		name string
		hcas []snapshot.HCA
		cfg  *config.Config
		want want
	}{
		{
			name: "healthy node, no expectations",
			hcas: h100HCAs(),
			want: want{status: report.Pass, metrics: map[string]float64{
				"ib.mlx5_0.port1.rate_gbps": 400, "ib.mlx5_bond_0.port1.rate_gbps": 200,
				"ib.ports.active_count": 8, "ib.ports.total_count": 9,
			}},
		},
		{
			name: "healthy node meets expectations",
			hcas: h100HCAs(),
			cfg:  expect(8, 400),
			want: want{status: report.Pass},
		},
		{
			name: "port down",
			hcas: mod(func(hs []snapshot.HCA) { hs[2].Ports[0].State, hs[2].Ports[0].PhysState = "DOWN", "Polling" }),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_4/1", code: CodePortDown, sev: report.SevFail, action: report.ActionReseat, msg: "port is DOWN/Polling, want ACTIVE/LinkUp"},
			}, metrics: map[string]float64{"ib.ports.active_count": 7, "ib.ports.total_count": 9}, absent: []string{"ib.mlx5_4.port1.rate_gbps"}},
		},
		{
			name: "active but physically disabled",
			hcas: mod(func(hs []snapshot.HCA) { hs[0].Ports[0].PhysState = "Disabled" }),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_0/1", code: CodePortDown, sev: report.SevFail, action: report.ActionReseat, msg: "ACTIVE/Disabled"},
			}},
		},
		{
			name: "down with unknown physical state is still down",
			hcas: mod(func(hs []snapshot.HCA) { hs[0].Ports[0].State, hs[0].Ports[0].PhysState = "INIT", "" }),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_0/1", code: CodePortDown, sev: report.SevFail, action: report.ActionReseat, msg: "INIT/unknown"},
			}},
		},
		{
			name: "unreadable state warns, never passes",
			hcas: mod(func(hs []snapshot.HCA) { hs[1].Ports[0].State = "" }),
			want: want{status: report.Warn, findings: []wantFinding{
				{comp: "mlx5_1/1", code: CodePortStateUnknown, sev: report.SevWarn, action: report.ActionMonitor, msg: "state unknown"},
			}},
		},
		{
			name: "rate below expectation; Ethernet bond not judged by it",
			hcas: mod(func(hs []snapshot.HCA) { hs[5].Ports[0].RateGbps, hs[5].Ports[0].RateText = 200, "200 Gb/sec (4X HDR)" }),
			cfg:  expect(0, 400),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_7/1", code: CodeRateLow, sev: report.SevFail, action: report.ActionReseat, msg: "rate 200 Gb/s (200 Gb/sec (4X HDR)) is below the expected 400 Gb/s"},
			}},
		},
		{
			name: "unknown rate with an expectation warns",
			hcas: mod(func(hs []snapshot.HCA) { hs[5].Ports[0].RateGbps, hs[5].Ports[0].RateText = 0, "" }),
			cfg:  expect(0, 400),
			want: want{status: report.Warn, findings: []wantFinding{
				{comp: "mlx5_7/1", code: CodeRateUnknown, sev: report.SevWarn, action: report.ActionMonitor, msg: "expected 400 Gb/s"},
			}},
		},
		{
			name: "rate below siblings of the same model and link layer",
			hcas: mod(func(hs []snapshot.HCA) { hs[3].Ports[0].RateGbps, hs[3].Ports[0].RateText = 200, "200 Gb/sec (2X NDR)" }),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_5/1", code: CodeRateBelowSiblings, sev: report.SevFail, action: report.ActionReseat,
					msg: "rate 200 Gb/s (200 Gb/sec (2X NDR)) is below the 400 Gb/s of 7 of its 7 sibling MT4129 InfiniBand ports"},
			}},
		},
		{
			name: "different models are not siblings",
			hcas: mod(func(hs []snapshot.HCA) {
				hs[8].Model, hs[8].Ports[0].LinkLayer = "MT41692", "InfiniBand" // a 200G BlueField IB port beside 400G CX-7
			}),
			want: want{status: report.Pass},
		},
		{
			name: "Ethernet ports judged by their siblings even with an IB expectation",
			hcas: append(h100HCAs(), snapshot.HCA{Name: "mlx5_bond_1", Model: "MT41692", Ports: []snapshot.IBPort{ethPort(1, 100)}}),
			cfg:  expect(8, 400),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_bond_1/1", code: CodeRateBelowSiblings, sev: report.SevFail, action: report.ActionReseat, msg: "below the 200 Gb/s of 1 of its 1 sibling MT41692 Ethernet ports"},
			}},
		},
		{
			name: "a down port's rate is not compared",
			hcas: mod(func(hs []snapshot.HCA) {
				p := &hs[3].Ports[0]
				p.State, p.PhysState, p.RateGbps = "DOWN", "Polling", 10
			}),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_5/1", code: CodePortDown, sev: report.SevFail, action: report.ActionReseat, msg: "DOWN/Polling"},
			}},
		},
		{
			name: "fewer active IB ports than expected",
			hcas: h100HCAs()[:7],
			cfg:  expect(8, 0),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "node", code: CodePortsMissing, sev: report.SevFail, action: report.ActionDrain, msg: "7 of 8 expected InfiniBand ports are ACTIVE/LinkUp"},
			}},
		},
		{
			name: "Ethernet ports do not count toward expected IB ports",
			hcas: []snapshot.HCA{{Name: "mlx5_bond_0", Model: "MT41692", Ports: []snapshot.IBPort{ethPort(1, 200)}}},
			cfg:  expect(1, 0),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "node", code: CodePortsMissing, sev: report.SevFail, action: report.ActionDrain, msg: "0 of 1"},
			}},
		},
		{
			name: "unreadable files warn and the rest is still judged",
			hcas: mod(func(hs []snapshot.HCA) {
				hs[0].Errors = []string{"mlx5_0/ports/1/counters/symbol_error: read: input/output error", "mlx5_0/fw_ver: open: permission denied"}
				hs[4].Ports[0].State = "DOWN"
			}),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_0/1", code: CodeSysfsUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "cannot read /sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error: read: input/output error"},
				{comp: "mlx5_0", code: CodeSysfsUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "mlx5_0/fw_ver: open: permission denied"},
				{comp: "mlx5_6/1", code: CodePortLogicalDown, sev: report.SevFail, action: report.ActionMonitor, msg: "DOWN/LinkUp: the link is physically up but the subnet manager"},
			}},
		},
		{
			name: "a flood of unreadable files is capped",
			hcas: mod(func(hs []snapshot.HCA) {
				for i := 0; i < 8; i++ {
					hs[0].Errors = append(hs[0].Errors, "mlx5_0/ports/1/hw_counters/x: read: input/output error")
				}
			}),
			want: want{status: report.Warn, findings: []wantFinding{
				{comp: "mlx5_0/1", code: CodeSysfsUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "hw_counters/x"},
				{comp: "mlx5_0/1", code: CodeSysfsUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "hw_counters/x"},
				{comp: "mlx5_0/1", code: CodeSysfsUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "hw_counters/x"},
				{comp: "mlx5_0/1", code: CodeSysfsUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "hw_counters/x"},
				{comp: "mlx5_0/1", code: CodeSysfsUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "hw_counters/x"},
				{comp: "mlx5_0", code: CodeSysfsUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "and 3 more unreadable files"},
			}},
		},
		{
			name: "a dangling adapter with no ports warns",
			hcas: []snapshot.HCA{{Name: "mlx5_2", Errors: []string{"mlx5_2: stat: no such file or directory"}}},
			want: want{status: report.Warn, findings: []wantFinding{
				{comp: "mlx5_2", code: CodeSysfsUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "mlx5_2: stat"},
			}},
		},
		{
			name: "no adapters",
			want: want{status: report.Skip, reason: "no InfiniBand HCAs"},
		},
		{
			name: "no adapters but ports expected",
			cfg:  expect(8, 400),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "node", code: CodePortsMissing, sev: report.SevFail, action: report.ActionDrain, msg: "0 of 8"},
			}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := checks.Input{Snap: ok(tc.hcas, snapshot.SrcInfiniBand), Config: tc.cfg}
			check(t, Ports{}, in, tc.want)
		})
	}
}

func TestPortsSourceStates(t *testing.T) {
	t.Parallel()
	s := &snapshot.Snapshot{}
	check(t, Ports{}, checks.Input{Snap: s}, want{status: report.Skip, reason: "sysfs-infiniband"})
	s.SetSource(snapshot.SrcInfiniBand, snapshot.SourceState{State: snapshot.StateAbsent, Error: "no /sys/class/infiniband"})
	check(t, Ports{}, checks.Input{Snap: s}, want{status: report.Skip, reason: "no /sys/class/infiniband"})
	s.SetSource(snapshot.SrcInfiniBand, snapshot.SourceState{State: snapshot.StateFailed, Error: "read /sys/class/infiniband: permission denied"})
	check(t, Ports{}, checks.Input{Snap: s}, want{status: report.Error, reason: "permission denied"})
}

func TestMetricWord(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"mlx5_0": "mlx5_0", "mlx5_bond_0": "mlx5_bond_0", "VL15_dropped": "vl15_dropped", "hw.out_of_sequence": "hw_out_of_sequence", "irdma-ens1": "irdma_ens1", "": "_"} {
		if got := metricWord(in); got != want {
			t.Errorf("metricWord(%q) = %q, want %q", in, got, want)
		}
	}
}
