package metrics

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/internal/promserve"
)

// BenchmarkScrape10kNodes is one /metrics scrape of a coordinator that
// knows 10,000 nodes (one fleetcheck_node_state series each) and runs a
// rollout and a burn-in of 1,000 nodes each.
func BenchmarkScrape10kNodes(b *testing.B) {
	reg := prometheus.NewRegistry()
	cm, err := NewCoordinator(reg)
	if err != nil {
		b.Fatal(err)
	}
	states := coordinator.States()
	st := coordinator.Stats{Version: "1.4.0", NodesByState: map[string]int{}}
	for i := 0; i < 10000; i++ {
		s := states[i%len(states)]
		st.Nodes = append(st.Nodes, coordinator.NodeState{Node: fmt.Sprintf("gpu-%05d", i), State: s})
		st.NodesByState[s]++
	}
	if testing.Short() {
		st.Nodes = nil // the same scrape without fleetcheck_node_state
	}
	cm.Watch(func() coordinator.Stats { return st })
	cm.WatchCampaigns(func(context.Context) ([]coordinator.KindStats, error) {
		return []coordinator.KindStats{
			{Kind: "rollout", States: map[string]int{"running": 1, "completed": 40},
				Running: []coordinator.CampaignRun{{ID: "r-1", Round: 2, Nodes: map[string]int{"done": 400, "pending": 600}}}},
			{Kind: "burnin", States: map[string]int{"running": 1, "done": 12},
				Running: []coordinator.CampaignRun{{ID: "b-1", TestsDone: 3000, Tests: 9000, Nodes: map[string]int{"active": 1000}}}},
		}, nil
	})
	h := promserve.Handler(reg)
	b.ReportAllocs()
	var size int
	for b.Loop() {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Accept", "text/plain")
		h.ServeHTTP(rec, req)
		size = rec.Body.Len()
	}
	b.ReportMetric(float64(size), "bytes/scrape")
}
