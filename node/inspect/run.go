package inspect

import (
	"context"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
)

// Options select what one inspection runs.
type Options struct {
	Config *config.Config // nil: defaults
	Checks []checks.Check // already selected (checks.Select)
	Prev   *checks.State  // state from the previous run, nil on the first
	// Labels are the node's declared labels (an agent's), nil when none.
	Labels map[string]string
}

// Result is one inspection: the report, the snapshot it judged and the
// state to keep for the next run.
type Result struct {
	Report   report.Report
	Snapshot *snapshot.Snapshot
	State    *checks.State
}

// Run reads h once and runs the selected checks.
func Run(ctx context.Context, h host.Host, opts Options) Result {
	cfg := opts.Config
	if cfg == nil {
		cfg = config.Defaults()
	}
	want := Want{}
	for _, c := range opts.Checks {
		for _, src := range c.Needs() {
			switch src {
			case snapshot.SrcAllReduce:
				want.AllReduce = true
			case snapshot.SrcDCGMDiag:
				want.DCGM = true
			}
		}
	}
	snap := Read(ctx, h, want)
	return judge(snap, opts.Checks, cfg, opts.Prev, opts.Labels)
}

// Judge runs checks over an existing snapshot.
func Judge(snap *snapshot.Snapshot, list []checks.Check, cfg *config.Config, prev *checks.State) Result {
	return judge(snap, list, cfg, prev, nil)
}

func judge(snap *snapshot.Snapshot, list []checks.Check, cfg *config.Config, prev *checks.State, labels map[string]string) Result {
	if cfg == nil {
		cfg = config.Defaults()
	}
	at := now(snap)
	in := checks.Input{Snap: snap, Config: cfg, Prev: prev, Now: at, Labels: labels}
	r := report.Report{
		Node:      snap.Hostname,
		Inventory: Inventory(snap),
		Checks:    checks.Run(list, in),
	}
	if !snap.CollectedAt.IsZero() {
		r.CollectedAt = snap.CollectedAt.UTC().Format(time.RFC3339)
	}
	r.Summarize()
	return Result{Report: r, Snapshot: snap, State: checks.NextState(snap, prev, at)}
}

// Inventory builds the report's inventory from a snapshot.
func Inventory(s *snapshot.Snapshot) report.Inventory {
	inv := report.Inventory{
		DriverVersion:        s.Versions.Driver,
		CUDAVersion:          s.Versions.CUDA,
		Kernel:               s.Versions.Kernel,
		FabricManagerVersion: s.Versions.FabricManager,
		RDMAStack:            s.Versions.RDMAStack,
		GPUs:                 []report.GPU{},
		HCAs:                 []report.HCA{},
	}
	if s.GPU != nil {
		for _, g := range s.GPU.GPUs {
			rg := report.GPU{Index: g.Index, Name: g.Name, UUID: g.UUID, PCIBusID: g.PCIBusID, Serial: g.Serial, VBIOSVersion: g.VBIOS}
			if g.MemoryTotalMiB != nil {
				rg.MemoryTotalMiB = *g.MemoryTotalMiB
			}
			inv.GPUs = append(inv.GPUs, rg)
		}
	}
	for _, h := range s.HCAs {
		rh := report.HCA{Name: h.Name, Model: h.Model, FWVersion: h.FWVersion, Ports: []report.Port{}}
		for _, p := range h.Ports {
			rh.Ports = append(rh.Ports, report.Port{Port: p.Port, State: p.State, PhysState: p.PhysState, RateGbps: p.RateGbps, LinkLayer: p.LinkLayer})
		}
		inv.HCAs = append(inv.HCAs, rh)
	}
	return inv
}
