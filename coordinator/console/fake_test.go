package console

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/escalate"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// fakeSource is a fleet in memory: racks of eight nodes, a leaf per four
// racks, the first node of every fifth rack failing gpu.ecc.
type fakeSource struct {
	mu       sync.Mutex
	nodes    []store.Node
	events   []store.Event
	results  map[string][]store.StoredCheck
	controls []string // "actor kind id action reason"
	camps    bool
	remeds   []remediation.Remediation // newest first
	remedOff bool
}

func fakeFleet(n int) *fakeSource {
	f := &fakeSource{results: map[string][]store.StoredCheck{}, camps: true}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range n {
		rack := i / 8
		nd := store.Node{
			Name:   fmt.Sprintf("gpu-%05d", i+1),
			Labels: map[string]string{"sku": "h100-sxm-80g-x8", "rack": fmt.Sprintf("r%03d", rack+1), "leaf": fmt.Sprintf("leaf%02d", rack/4+1)},
			State:  "healthy", StateSince: t0, LastSeen: t0, Connected: true, HasFull: true,
			Checks: []store.CheckState{{Name: "gpu.ecc", Status: report.Pass}, {Name: "ib.ports", Status: report.Pass}},
		}
		if i%8 == 0 && rack%5 == 0 {
			nd.State, nd.StateReason = "failed", "healthy -> failed: gpu.ecc fail: GPU3 ECC_UNCORRECTABLE"
			nd.Checks[0].Status = report.Fail
		}
		f.nodes = append(f.nodes, nd)
	}
	return f
}

func (f *fakeSource) setState(name, state string, check string, st report.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range f.nodes {
		if f.nodes[i].Name == name {
			f.nodes[i].State = state
			for j := range f.nodes[i].Checks {
				if f.nodes[i].Checks[j].Name == check {
					f.nodes[i].Checks[j].Status = st
				}
			}
		}
	}
}

func (f *fakeSource) Nodes(context.Context) ([]store.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]store.Node, len(f.nodes))
	copy(out, f.nodes)
	for i := range out {
		out[i].Checks = append([]store.CheckState(nil), out[i].Checks...)
	}
	return out, nil
}

func (f *fakeSource) Node(ctx context.Context, name string) (store.Node, error) {
	nodes, _ := f.Nodes(ctx)
	for _, n := range nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return store.Node{}, fmt.Errorf("node %s: %w", name, store.ErrNotFound)
}

func (f *fakeSource) Results(_ context.Context, q store.ResultQuery) ([]store.StoredCheck, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.results[q.Node], nil
}

func (f *fakeSource) Events(context.Context, store.EventQuery) ([]store.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]store.Event(nil), f.events...), nil
}

func (f *fakeSource) Baselines() baselines.Finder { return nil }

func (f *fakeSource) Campaigns() Campaigns {
	if !f.camps {
		return nil
	}
	return fakeCampaigns{f}
}

type fakeCampaigns struct{ f *fakeSource }

func (fakeCampaigns) Sweeps(context.Context) ([]sweep.Summary, error) { return nil, nil }
func (fakeCampaigns) Sweep(context.Context, string) (sweep.Progress, *sweep.Report, error) {
	return sweep.Progress{}, nil, store.ErrNotFound
}
func (fakeCampaigns) Rollouts(context.Context) ([]rollout.Summary, error) {
	return []rollout.Summary{{ID: "ro-1", Driver: "570.124.06", Phase: "running", Waves: 3, Wave: 1, Nodes: 24}}, nil
}
func (fakeCampaigns) Rollout(_ context.Context, id string) (*rollout.Status, error) {
	if id != "ro-1" {
		return nil, store.ErrNotFound
	}
	return &rollout.Status{ID: "ro-1", Driver: "570.124.06", Phase: "running", Waves: []rollout.WaveStatus{{Index: 0, Name: "canary", State: "soaking", Size: 2}}}, nil
}
func (fakeCampaigns) Burnins(context.Context) ([]burnin.CampaignStatus, error) { return nil, nil }
func (fakeCampaigns) Burnin(context.Context, string) (burnin.CampaignStatus, error) {
	return burnin.CampaignStatus{}, store.ErrNotFound
}
func (fakeCampaigns) BurninHTML(context.Context, string) ([]byte, error) {
	return nil, store.ErrNotFound
}
func (fakeCampaigns) Drills(context.Context) ([]drill.Drill, error)  { return nil, nil }
func (fakeCampaigns) DrillRows(context.Context) ([]drill.Row, error) { return nil, nil }
func (c fakeCampaigns) Control(ctx context.Context, kind, id, action, reason string) error {
	id2, _ := authz.IdentityFrom(ctx)
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	c.f.controls = append(c.f.controls, fmt.Sprintf("%s %s %s %s %s", id2.Actor(), kind, id, action, reason))
	return nil
}

func (f *fakeSource) controlled() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.controls...)
}

func (f *fakeSource) Remediations() Remediations {
	if f.remedOff {
		return nil
	}
	return fakeRemediations{f}
}

// withRemediations gives the fake three remediations of gpu-00001 (a
// shadow GPU reset, a replace waiting on its RMA, a done reboot) and one
// of gpu-00002, in shadow mode.
func (f *fakeSource) withRemediations() *fakeSource {
	t0 := time.Date(2026, 1, 2, 3, 30, 0, 0, time.UTC)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.remeds = []remediation.Remediation{
		{ID: "rem-4", Node: "gpu-00002", Component: "mlx5_0/1", Step: "reseat", Ladder: []string{"reseat", "replace"}, State: remediation.StateShadow,
			Mode: remediation.ModeShadow, Reason: "shadow mode: recorded, not run", Would: []string{"drain gpu-00002", "wait for hands: reseat mlx5_0/1"},
			Trigger: remediation.Trigger{Node: "gpu-00002", Component: "mlx5_0/1", Step: "reseat", Code: "IB_PORT_DOWN", Source: "finding", At: t0}, CreatedAt: t0, UpdatedAt: t0},
		{ID: "rem-3", Node: "gpu-00001", Component: "GPU3", Step: "reset_gpu", Ladder: []string{"reset_gpu", "reboot", "replace"}, State: remediation.StateShadow,
			Mode: remediation.ModeShadow, Reason: "shadow mode: recorded, not run", Would: []string{"drain gpu-00001", "run action gpu-reset (gpu=3)", "verify: passive checks and all_reduce", "return to service"},
			Trigger:   remediation.Trigger{Node: "gpu-00001", Component: "GPU3", Step: "reset_gpu", Code: "XID_79", Source: "finding", Reason: "gpu.xid: GPU3 XID_79", At: t0},
			CreatedAt: t0, UpdatedAt: t0, Events: []remediation.Event{{At: t0, Node: "gpu-00001", What: "opened in shadow mode"}}},
		{ID: "rem-2", Node: "gpu-00001", Component: "GPU1", Step: "replace", Ladder: []string{"reset_gpu", "reboot", "replace"}, Rung: 2, State: remediation.StateRMA,
			Mode: remediation.ModeAuto, Drained: true, Reason: "replace: RMA rma-2 opened", Recurs: "rem-1",
			RMA: &remediation.RMA{ID: "rma-2", Attempts: 3, LastErr: "rma webhook: 503 Service Unavailable", Evidence: remediation.Evidence{Node: "gpu-00001", Component: "GPU1",
				Findings: []string{"gpu.ecc: GPU1 ECC_UNCORRECTABLE"}, Serials: []remediation.Part{{Component: "GPU1", Model: "H100", Serial: "1650923012345"}},
				Bundle: "/var/lib/fleetcheck/bundles/gpu-00001.tar.gz", Opened: t0}},
			CreatedAt: t0.Add(-time.Hour), UpdatedAt: t0},
		{ID: "rem-1", Node: "gpu-00001", Component: "GPU1", Step: "reboot", Ladder: []string{"reset_gpu", "reboot", "replace"}, Rung: 1, State: remediation.StateDone,
			Mode: remediation.ModeAuto, Reason: "verified: back in service", CreatedAt: t0.Add(-2 * time.Hour), UpdatedAt: t0.Add(-2 * time.Hour)},
	}
	return f
}

type fakeRemediations struct{ f *fakeSource }

func (fakeRemediations) Mode() remediation.Mode { return remediation.ModeShadow }

func (fakeRemediations) JobEvents(_ context.Context, limit int) ([]remediation.JobEvent, error) {
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	evs := []remediation.JobEvent{{At: t0, Job: "4711", Xid: 13, Nodes: []string{"gpu-00003", "gpu-00004", "gpu-00005"},
		Reason: "Xid 13 on 3 nodes within 1m: one job's crash"}}
	return evs[:min(limit, len(evs))], nil
}

func (fakeRemediations) Flagged(node string) []escalate.FlaggedPort {
	t0 := time.Date(2026, 1, 2, 3, 10, 0, 0, time.UTC)
	if node != "" && node != "gpu-00002" {
		return nil
	}
	return []escalate.FlaggedPort{{Node: "gpu-00002", Component: "mlx5_0/1", Since: t0, LastFlap: t0.Add(time.Minute), Until: t0.Add(2 * time.Hour)}}
}

func (k fakeRemediations) List(_ context.Context, node string, state remediation.State) ([]remediation.Remediation, error) {
	k.f.mu.Lock()
	defer k.f.mu.Unlock()
	var out []remediation.Remediation
	for _, r := range k.f.remeds {
		if (node == "" || r.Node == node) && (state == "" || r.State == state) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (k fakeRemediations) Get(_ context.Context, id string) (remediation.Remediation, error) {
	k.f.mu.Lock()
	defer k.f.mu.Unlock()
	for _, r := range k.f.remeds {
		if r.ID == id {
			return r, nil
		}
	}
	return remediation.Remediation{}, fmt.Errorf("%w: %w: %s", store.ErrNotFound, remediation.ErrNotFound, id)
}

// act moves a remediation as the engine would, recording the caller as
// the service audits it: "actor remediation id action reason".
func (k fakeRemediations) act(ctx context.Context, id, action, reason string, fn func(*remediation.Remediation) error) error {
	caller, _ := authz.IdentityFrom(ctx)
	k.f.mu.Lock()
	defer k.f.mu.Unlock()
	k.f.controls = append(k.f.controls, strings.TrimSpace(fmt.Sprintf("%s remediation %s %s %s", caller.Actor(), id, action, reason)))
	for i := range k.f.remeds {
		if k.f.remeds[i].ID == id {
			return fn(&k.f.remeds[i])
		}
	}
	return fmt.Errorf("%w: %s", store.ErrNotFound, id)
}

func (k fakeRemediations) Approve(ctx context.Context, id string) error {
	return k.act(ctx, id, "approve", "", func(r *remediation.Remediation) error {
		if r.State != remediation.StateShadow {
			return fmt.Errorf("%w: %s is %s", remediation.ErrState, r.ID, r.State)
		}
		r.State, r.Mode, r.Would = remediation.StateDraining, remediation.ModeAuto, nil
		return nil
	})
}

func (k fakeRemediations) Cancel(ctx context.Context, id, reason string) error {
	return k.act(ctx, id, "cancel", reason, func(r *remediation.Remediation) error {
		if r.State.Final() {
			return fmt.Errorf("%w: %s is already %s", remediation.ErrState, r.ID, r.State)
		}
		r.State = remediation.StateCancelled
		return nil
	})
}
