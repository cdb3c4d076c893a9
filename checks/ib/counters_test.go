package ib

import (
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

var prevAt = time.Date(2026, 11, 28, 1, 0, 0, 0, time.UTC)

// healthyCounters are the fixture's mlx5_0 values: a healthy port after
// ~3×10^11 packets, with lifetime errors that are not zero.
func healthyCounters() map[string]uint64 {
	return map[string]uint64{
		"symbol_error": 0, "link_downed": 0, "link_error_recovery": 0, "port_rcv_errors": 14,
		"port_rcv_remote_physical_errors": 0, "local_link_integrity_errors": 0,
		"excessive_buffer_overrun_errors": 15, "port_rcv_switch_relay_errors": 1,
		"port_rcv_packets": 317548853677, "port_rcv_data": 230539874932483, "port_xmit_data": 230442669431839,
	}
}

func onePort(counters, hw map[string]uint64) []snapshot.HCA {
	p := ibPort(1, 400)
	p.Counters, p.HWCounters = counters, hw
	return []snapshot.HCA{{Name: "mlx5_0", Model: "MT4129", Ports: []snapshot.IBPort{p}}}
}

// bump returns a copy of m with deltas added.
func bump(m map[string]uint64, deltas map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	for k, d := range deltas {
		out[k] += d
	}
	return out
}

func prevOf(hcas []snapshot.HCA) *checks.State {
	return checks.NextState(&snapshot.Snapshot{HCAs: hcas}, nil, prevAt)
}

func TestCounters(t *testing.T) {
	t.Parallel()
	withTotals := func(m map[string]uint64) *config.Config {
		c := config.Defaults()
		c.Limits.IBCounterTotal = m
		return c
	}
	withRise := func(m map[string]uint64) *config.Config {
		c := config.Defaults()
		for k, v := range m {
			c.Limits.IBCounterRise[k] = v
		}
		return c
	}
	h := healthyCounters()
	tests := []struct {
		name string
		hcas []snapshot.HCA
		prev *checks.State
		cfg  *config.Config
		want want
	}{
		{
			name: "first run passes with metrics; lifetime totals not judged by default",
			hcas: onePort(h, nil),
			want: want{status: report.Pass, metrics: map[string]float64{
				"ib.mlx5_0.port1.port_rcv_errors_count":                 14,
				"ib.mlx5_0.port1.excessive_buffer_overrun_errors_count": 15,
				"ib.mlx5_0.port1.rcv_bytes":                             230539874932483 * 4,
				"ib.mlx5_0.port1.xmit_bytes":                            230442669431839 * 4,
				"ib.mlx5_0.port1.saturated_count":                       1, // excessive_buffer_overrun_errors is 4 bits
				"ib.counters.ports_judged_count":                        1,
			}, absent: []string{"ib.mlx5_0.port1.port_rcv_errors_rise_count", "ib.mlx5_0.port1.rcv_error_ratio", "ib.mlx5_0.port1.counter_reset_count"}},
		},
		{
			name: "first run over a configured lifetime limit",
			hcas: onePort(h, nil),
			cfg:  withTotals(map[string]uint64{"port_rcv_errors": 10}),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_0/1", code: CodeCounterTotal, sev: report.SevFail, action: report.ActionReseat, msg: "port_rcv_errors is 14 on the first run (lifetime limit 10)"},
			}},
		},
		{
			name: "no rise",
			hcas: onePort(h, nil),
			prev: prevOf(onePort(h, nil)),
			want: want{status: report.Pass, metrics: map[string]float64{
				"ib.mlx5_0.port1.symbol_error_rise_count": 0, "ib.mlx5_0.port1.counter_reset_count": 0,
			}, absent: []string{"ib.mlx5_0.port1.excessive_buffer_overrun_errors_rise_count"}},
		},
		{
			name: "lifetime limits are not applied when the rise is known",
			hcas: onePort(h, nil),
			prev: prevOf(onePort(h, nil)),
			cfg:  withTotals(map[string]uint64{"port_rcv_errors": 10}),
			want: want{status: report.Pass},
		},
		{
			name: "symbol errors rising",
			hcas: onePort(bump(h, map[string]uint64{"symbol_error": 1200, "port_rcv_packets": 1000000, "port_rcv_errors": 50}), nil),
			prev: prevOf(onePort(h, nil)),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_0/1", code: CodeCounterRising, sev: report.SevFail, action: report.ActionReseat, msg: "symbol_error rose by 1200 since 2026-11-28T01:00:00Z (limit 10)"},
				{comp: "mlx5_0/1", code: CodeCounterRising, sev: report.SevFail, action: report.ActionReseat, msg: "port_rcv_errors rose by 50"},
			}, metrics: map[string]float64{
				"ib.mlx5_0.port1.symbol_error_rise_count": 1200,
				"ib.mlx5_0.port1.rcv_error_ratio":         50.0 / 1000000,
			}},
		},
		{
			name: "rise at the limit passes",
			hcas: onePort(bump(h, map[string]uint64{"symbol_error": 10}), nil),
			prev: prevOf(onePort(h, nil)),
			want: want{status: report.Pass, metrics: map[string]float64{"ib.mlx5_0.port1.symbol_error_rise_count": 10}},
		},
		{
			name: "link_downed limit is zero: one flap fails",
			hcas: onePort(bump(h, map[string]uint64{"link_downed": 1}), nil),
			prev: prevOf(onePort(h, nil)),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_0/1", code: CodeCounterRising, sev: report.SevFail, action: report.ActionReseat, msg: "link_downed rose by 1"},
			}},
		},
		{
			name: "counters reset since the last run are not an error",
			hcas: onePort(map[string]uint64{"symbol_error": 3, "port_rcv_errors": 0, "link_downed": 0, "link_error_recovery": 0,
				"port_rcv_remote_physical_errors": 0, "local_link_integrity_errors": 0, "excessive_buffer_overrun_errors": 0, "port_rcv_packets": 10}, nil),
			prev: prevOf(onePort(bump(h, map[string]uint64{"symbol_error": 500}), nil)),
			want: want{status: report.Pass, metrics: map[string]float64{"ib.mlx5_0.port1.counter_reset_count": 4},
				absent: []string{"ib.mlx5_0.port1.symbol_error_rise_count", "ib.mlx5_0.port1.rcv_error_ratio"}},
		},
		{
			name: "after a reset the lifetime limit applies",
			hcas: onePort(map[string]uint64{"symbol_error": 3, "port_rcv_errors": 0}, nil),
			prev: prevOf(onePort(bump(h, map[string]uint64{"symbol_error": 500}), nil)),
			cfg:  withTotals(map[string]uint64{"symbol_error": 2}),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_0/1", code: CodeCounterTotal, sev: report.SevFail, action: report.ActionReseat, msg: "symbol_error is 3 since the counters were reset (lifetime limit 2)"},
				{comp: "mlx5_0/1", code: CodeCounterUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "link_downed could not be read"},
				{comp: "mlx5_0/1", code: CodeCounterUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "link_error_recovery"},
				{comp: "mlx5_0/1", code: CodeCounterUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "port_rcv_remote_physical_errors"},
				{comp: "mlx5_0/1", code: CodeCounterUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "local_link_integrity_errors"},
				{comp: "mlx5_0/1", code: CodeCounterUnreadable, sev: report.SevWarn, action: report.ActionMonitor, msg: "excessive_buffer_overrun_errors"},
			}},
		},
		{
			name: "a saturated 4-bit counter has an unknown rise, not zero",
			hcas: onePort(h, nil),
			prev: prevOf(onePort(h, nil)),
			cfg:  withRise(map[string]uint64{"excessive_buffer_overrun_errors": 0}),
			want: want{status: report.Pass, metrics: map[string]float64{"ib.mlx5_0.port1.saturated_count": 1},
				absent: []string{"ib.mlx5_0.port1.excessive_buffer_overrun_errors_rise_count"}},
		},
		{
			name: "a rise into saturation is a lower bound and judged",
			hcas: onePort(h, nil),
			prev: prevOf(onePort(func() map[string]uint64 {
				m := bump(h, nil)
				m["excessive_buffer_overrun_errors"] = 10
				return m
			}(), nil)),
			cfg: withRise(map[string]uint64{"excessive_buffer_overrun_errors": 2}),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_0/1", code: CodeCounterRising, sev: report.SevFail, action: report.ActionReseat, msg: "excessive_buffer_overrun_errors rose by 5"},
			}, metrics: map[string]float64{"ib.mlx5_0.port1.excessive_buffer_overrun_errors_rise_count": 5}},
		},
		{
			name: "hw counter limit",
			hcas: onePort(h, map[string]uint64{"out_of_sequence": 700}),
			prev: prevOf(onePort(h, map[string]uint64{"out_of_sequence": 100})),
			cfg:  withRise(map[string]uint64{"hw.out_of_sequence": 100}),
			want: want{status: report.Fail, findings: []wantFinding{
				{comp: "mlx5_0/1", code: CodeCounterRising, sev: report.SevFail, action: report.ActionReseat, msg: "hw.out_of_sequence rose by 600"},
			}, metrics: map[string]float64{"ib.mlx5_0.port1.hw_out_of_sequence_rise_count": 600, "ib.mlx5_0.port1.hw_out_of_sequence_count": 700}},
		},
		{
			name: "hw counter limit on a port without hw_counters is not judged",
			hcas: onePort(h, nil),
			prev: prevOf(onePort(h, nil)),
			cfg:  withRise(map[string]uint64{"hw.out_of_sequence": 100}),
			want: want{status: report.Pass},
		},
		{
			name: "a port new since the last run is judged as a first run",
			hcas: onePort(bump(h, map[string]uint64{"symbol_error": 5000}), nil),
			prev: &checks.State{At: prevAt, IBCounters: map[string]map[string]uint64{"mlx5_9/1": h}},
			want: want{status: report.Pass, absent: []string{"ib.mlx5_0.port1.symbol_error_rise_count"}},
		},
		{
			name: "previous run without adapters",
			hcas: onePort(bump(h, map[string]uint64{"symbol_error": 5000}), nil),
			prev: &checks.State{At: prevAt},
			want: want{status: report.Pass},
		},
		{
			name: "ports without counters are not judged",
			hcas: []snapshot.HCA{{Name: "mlx5_0", Ports: []snapshot.IBPort{ibPort(1, 400)}}},
			want: want{status: report.Skip, reason: "no port counters"},
		},
		{
			name: "no adapters",
			want: want{status: report.Skip, reason: "no InfiniBand HCAs"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := checks.Input{Snap: ok(tc.hcas, snapshot.SrcInfiniBand), Config: tc.cfg, Prev: tc.prev, Now: prevAt.Add(time.Hour)}
			check(t, Counters{}, in, tc.want)
		})
	}
}

func TestCountersSourceStates(t *testing.T) {
	t.Parallel()
	s := &snapshot.Snapshot{}
	s.SetSource(snapshot.SrcInfiniBand, snapshot.SourceState{State: snapshot.StateTimeout})
	check(t, Counters{}, checks.Input{Snap: s}, want{status: report.Error, reason: "timed out"})
}
