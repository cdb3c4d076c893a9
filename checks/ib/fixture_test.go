package ib

import (
	"io/fs"
	"os"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/gpu"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/probe/ibsysfs"
)

// fixtureSnapshot reads the real H100 sysfs capture through the probe, as
// the agent would (see node/probe/ibsysfs/testdata/SOURCES.md).
func fixtureSnapshot(t *testing.T) *snapshot.Snapshot {
	t.Helper()
	hcas, err := ibsysfs.Read(os.DirFS("../../node/probe/ibsysfs/testdata"))
	if err != nil {
		t.Fatalf("read fixture: %v", err)
	}
	return ok(hcas, snapshot.SrcInfiniBand)
}

func TestFixturePorts(t *testing.T) {
	t.Parallel()
	snap := fixtureSnapshot(t)
	// The bond's 200G Ethernet port is not judged against the 400G IB ports.
	check(t, Ports{}, checks.Input{Snap: snap}, want{status: report.Pass, metrics: map[string]float64{
		"ib.ports.active_count": 8, "ib.ports.total_count": 9,
		"ib.mlx5_4.port1.rate_gbps": 400, "ib.mlx5_bond_0.port1.rate_gbps": 200,
	}})
	cfg := config.Defaults()
	cfg.Expect.IBPorts, cfg.Expect.IBRateGbps = 8, 400
	check(t, Ports{}, checks.Input{Snap: snap, Config: cfg}, want{status: report.Pass})

	// The same node with one port trained down to 200G.
	snap.HCAs[2].Ports[0].RateGbps, snap.HCAs[2].Ports[0].RateText = 200, "200 Gb/sec (2X NDR)"
	check(t, Ports{}, checks.Input{Snap: snap}, want{status: report.Fail, findings: []wantFinding{
		{comp: "mlx5_4/1", code: CodeRateBelowSiblings, sev: report.SevFail, action: report.ActionReseat, msg: "below the 400 Gb/s of 7 of its 7 sibling MT4129 InfiniBand ports"},
	}})
}

func TestFixtureCounters(t *testing.T) {
	t.Parallel()
	snap := fixtureSnapshot(t)
	// First run: lifetime totals (port_rcv_errors 14, link_downed 255 on
	// mlx5_1) are reported, not judged.
	check(t, Counters{}, checks.Input{Snap: snap}, want{status: report.Pass, metrics: map[string]float64{
		"ib.mlx5_1.port1.link_downed_count":     255,
		"ib.mlx5_1.port1.saturated_count":       2, // link_downed at 255, excessive_buffer_overrun_errors at 15
		"ib.mlx5_0.port1.saturated_count":       1,
		"ib.mlx5_0.port1.port_rcv_errors_count": 14,
		"ib.mlx5_0.port1.rcv_bytes":             230539874932483 * 4,
		"ib.counters.ports_judged_count":        9,
	}})

	// Second run an hour later: mlx5_4's symbol errors rose by 1200 and
	// mlx5_1's saturated link_downed tells nothing.
	prev := checks.NextState(snap, nil, prevAt)
	now := fixtureSnapshot(t)
	c := now.HCAs[2].Ports[0].Counters
	c["symbol_error"] += 1200
	c["port_rcv_packets"] += 4000000
	c["port_rcv_errors"] += 2
	check(t, Counters{}, checks.Input{Snap: now, Prev: prev, Now: prevAt.Add(time.Hour)}, want{
		status: report.Fail,
		findings: []wantFinding{
			{comp: "mlx5_4/1", code: CodeCounterRising, sev: report.SevFail, action: report.ActionReseat, msg: "symbol_error rose by 1200 since 2026-11-28T01:00:00Z (limit 10)"},
		},
		metrics: map[string]float64{
			"ib.mlx5_4.port1.symbol_error_rise_count": 1200,
			"ib.mlx5_4.port1.rcv_error_ratio":         2.0 / 4000000,
			"ib.mlx5_0.port1.symbol_error_rise_count": 0,
		},
		absent: []string{"ib.mlx5_1.port1.link_downed_rise_count", "ib.mlx5_0.port1.rcv_error_ratio"},
	})
}

func TestFixturePeerMem(t *testing.T) {
	t.Parallel()
	snap := fixtureSnapshot(t)
	snap.Modules = []string{"nvidia", "mlx5_ib", "mlx5_core"}
	snap.SetSource(snapshot.SrcModules, snapshot.SourceState{State: snapshot.StateOK})
	res := checks.Run([]checks.Check{gpu.PeerMem{}}, checks.Input{Snap: snap})[0]
	if res.Status != report.Fail || len(res.Findings) != 1 || !strings.Contains(res.Findings[0].Message, "nvidia_peermem") {
		t.Fatalf("peermem on the fixture node without the module: %+v", res)
	}
}

// overlayFS replaces a few files of a captured tree.
type overlayFS struct {
	base  fs.FS
	files fstest.MapFS
}

func (o overlayFS) Open(name string) (fs.File, error) {
	if _, ok := o.files[name]; ok {
		return o.files.Open(name)
	}
	return o.base.Open(name)
}

// TestFixtureLogicalDown: the real H100 capture with one port's state file
// saying "1: DOWN" while its phys_state stays "5: LinkUp" (the cable
// trained; the subnet manager did not activate the port) is an SM matter,
// not a reseat; a port physically down is still a reseat.
func TestFixtureLogicalDown(t *testing.T) {
	t.Parallel()
	read := func(files fstest.MapFS) *snapshot.Snapshot {
		hcas, err := ibsysfs.Read(overlayFS{base: os.DirFS("../../node/probe/ibsysfs/testdata"), files: files})
		if err != nil {
			t.Fatalf("read fixture: %v", err)
		}
		return ok(hcas, snapshot.SrcInfiniBand)
	}
	const port = "sys/class/infiniband/mlx5_4/ports/1/"
	cfg := config.Defaults()
	cfg.Expect.IBPorts = 8
	for _, tc := range []struct {
		name  string
		files fstest.MapFS
		want  wantFinding
	}{
		{"DOWN/LinkUp", fstest.MapFS{port + "state": {Data: []byte("1: DOWN\n")}},
			wantFinding{comp: "mlx5_4/1", code: CodePortLogicalDown, sev: report.SevFail, action: report.ActionMonitor, msg: "subnet manager"}},
		{"INIT/LinkUp", fstest.MapFS{port + "state": {Data: []byte("2: INIT\n")}},
			wantFinding{comp: "mlx5_4/1", code: CodePortLogicalDown, sev: report.SevFail, action: report.ActionMonitor, msg: "INIT/LinkUp"}},
		{"DOWN/Disabled", fstest.MapFS{port + "state": {Data: []byte("1: DOWN\n")}, port + "phys_state": {Data: []byte("3: Disabled\n")}},
			wantFinding{comp: "mlx5_4/1", code: CodePortDown, sev: report.SevFail, action: report.ActionReseat, msg: "DOWN/Disabled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			check(t, Ports{}, checks.Input{Snap: read(tc.files), Config: cfg}, want{status: report.Fail, findings: []wantFinding{
				tc.want,
				{comp: "node", code: CodePortsMissing, sev: report.SevFail, action: report.ActionDrain, msg: "7 of 8"},
			}})
		})
	}
}
