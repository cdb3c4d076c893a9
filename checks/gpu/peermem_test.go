package gpu

import (
	"testing"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

func TestPeerMem(t *testing.T) {
	t.Parallel()
	required := func(v bool) *config.Config {
		c := config.Defaults()
		c.PeerMem.Required = &v
		return c
	}
	withMods := func(s *snapshot.Snapshot, mods ...string) *snapshot.Snapshot {
		s.Modules = append([]string{}, mods...)
		s.SetSource(snapshot.SrcModules, snapshot.SourceState{State: snapshot.StateOK})
		return s
	}
	ethOnly := []snapshot.HCA{{Name: "mlx5_bond_0", Model: "MT41692", Ports: []snapshot.IBPort{ethPort(1, 200)}}}
	notLoaded := wantFinding{comp: "node", code: CodePeerMemNotLoaded, sev: report.SevFail, action: report.ActionNone, msg: "modprobe nvidia_peermem"}
	failed := func(src snapshot.Source, s *snapshot.Snapshot) *snapshot.Snapshot {
		s.SetSource(src, snapshot.SourceState{State: snapshot.StateFailed, Error: "boom"})
		return s
	}
	tests := []struct {
		name string
		snap *snapshot.Snapshot
		cfg  *config.Config
		want want
	}{
		{
			name: "loaded on an IB node",
			snap: withMods(ok(h100HCAs(), snapshot.SrcInfiniBand), "nvidia", "nvidia_peermem", "mlx5_ib"),
			want: want{status: report.Pass, metrics: map[string]float64{"gpu.peermem.loaded_flag": 1}},
		},
		{
			name: "legacy nv_peer_mem counts",
			snap: withMods(ok(h100HCAs(), snapshot.SrcInfiniBand), "nvidia", "nv_peer_mem"),
			want: want{status: report.Pass},
		},
		{
			name: "not loaded on an IB node",
			snap: withMods(ok(h100HCAs(), snapshot.SrcInfiniBand), "nvidia", "mlx5_ib"),
			want: want{status: report.Fail, findings: []wantFinding{notLoaded}, metrics: map[string]float64{"gpu.peermem.loaded_flag": 0}},
		},
		{
			name: "disabled in config",
			snap: withMods(ok(h100HCAs(), snapshot.SrcInfiniBand), "nvidia"),
			cfg:  required(false),
			want: want{status: report.Skip, reason: "disabled in config"},
		},
		{
			name: "Ethernet-only adapters",
			snap: withMods(ok(ethOnly, snapshot.SrcInfiniBand), "nvidia"),
			want: want{status: report.Skip, reason: "no InfiniBand HCAs"},
		},
		{
			name: "no adapter tree",
			snap: withMods(&snapshot.Snapshot{}, "nvidia"),
			want: want{status: report.Skip, reason: "no InfiniBand HCAs"},
		},
		{
			name: "adapter tree failed: cannot tell",
			snap: withMods(failed(snapshot.SrcInfiniBand, &snapshot.Snapshot{}), "nvidia"),
			want: want{status: report.Error, reason: "boom"},
		},
		{
			name: "required without adapters",
			snap: withMods(&snapshot.Snapshot{}, "nvidia"),
			cfg:  required(true),
			want: want{status: report.Fail, findings: []wantFinding{notLoaded}},
		},
		{
			name: "required, loaded",
			snap: withMods(&snapshot.Snapshot{}, "nvidia_peermem"),
			cfg:  required(true),
			want: want{status: report.Pass},
		},
		{
			name: "module list absent",
			snap: ok(h100HCAs(), snapshot.SrcInfiniBand),
			want: want{status: report.Skip, reason: "proc-modules"},
		},
		{
			name: "module list failed",
			snap: failed(snapshot.SrcModules, ok(h100HCAs(), snapshot.SrcInfiniBand)),
			cfg:  required(true),
			want: want{status: report.Error, reason: "boom"},
		},
		{
			name: "module source ok but list missing",
			snap: ok(h100HCAs(), snapshot.SrcInfiniBand, snapshot.SrcModules),
			want: want{status: report.Error, reason: "module list is missing"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			check(t, PeerMem{}, checks.Input{Snap: tc.snap, Config: tc.cfg}, tc.want)
		})
	}
	if (PeerMem{}).Needs() != nil || (PeerMem{}).Disruptive() || (PeerMem{}).Name() != "gpu.peermem" {
		t.Error("PeerMem contract")
	}
}
