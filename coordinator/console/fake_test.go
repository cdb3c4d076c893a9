package console

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
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
