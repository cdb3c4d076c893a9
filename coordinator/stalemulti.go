package coordinator

import (
	"context"
	"sync"
	"time"

	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// A peer of a multi-node run holds its reservation until the leader that
// started the run ends it (EndMulti) or the peer's own timeout, up to an
// hour later, passes. A leader killed mid-run sends no EndMulti, so the
// next leader would find those peers reserved and its resumed sweep's
// tests refused. The next leader therefore reads, once per term, the
// multi-node works dispatched before it began and, before it reserves a
// node for a run of its own, calls off that node's old ones: the EndMulti
// travels on the same stream ahead of the new request. An agent ignores
// an EndMulti for a run it does not hold.

// staleWindow is how far back a reservation can still be held.
const staleWindow = MaxRunTimeout + peerMargin

type staleMultis struct {
	mu sync.Mutex
	by map[string][]string // node -> work ids of earlier leaders' multi-node runs
}

// loadStaleMultis reads the multi-node works dispatched before the term
// began at start; the term's runs call them off node by node.
func (s *Server) loadStaleMultis(ctx context.Context, start time.Time) error {
	// s.store directly, as dispatch does: Start calls this holding s.mu
	// (a single coordinator leads at once), and sets the store before.
	if s.store == nil {
		return nil
	}
	by, err := s.store.MultiDispatches(ctx, start.Add(-staleWindow), start, maxMultiNodes)
	if err != nil {
		return err
	}
	s.stale.mu.Lock()
	s.stale.by = by
	s.stale.mu.Unlock()
	return nil
}

// callOffStale ends, on node, the multi-node runs an earlier leader left
// reserved there (each once per term).
func (f *fleet) callOffStale(ctx context.Context, node string) {
	st := &f.s.stale
	st.mu.Lock()
	ids := st.by[node]
	delete(st.by, node)
	st.mu.Unlock()
	for _, id := range ids {
		// Launcher names the node itself: the agent reads it only for the
		// note of a run that ended with a result, never for a call-off.
		f.endMultiOn(ctx, node, &pb.EndMulti{MultiId: id, Launcher: node,
			AbortReason: "called off by the next leader: the coordinator that started the run is gone"})
	}
}
