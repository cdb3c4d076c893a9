package coordinator

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// TestNextLeaderCallsOffStaleReservations: a leader reserved a peer for a
// multi-node run and died before it launched or called it off (kill -9);
// the peer stays reserved for its own timeout. The next term's first run
// on that peer calls the old run off first, so it is not refused.
func TestNextLeaderCallsOffStaleReservations(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	f := s.Fleet()
	fabric := sim.NewFabric()
	startSimAgent(t, s, fabric, "gpu-001", nil)
	startSimAgent(t, s, fabric, "gpu-002", nil)
	waitConnected(t, f, "gpu-001", "gpu-002")
	ctx := context.Background()
	fl := &fleet{s: s}

	// What the dead leader did: the work recorded, the peer reserved.
	w, done, err := fl.dispatch(ctx, []string{"gpu-001", "gpu-002"})
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	w.nudgeOnAccept = true // as RunMulti: the peer's ACCEPTED is the answer
	w.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rc := &pb.RunChecks{WorkId: w.id, Checks: []string{"nccl.allreduce"}, TimeoutMs: (10 * time.Minute).Milliseconds(),
		Role: pb.MultiRole_MULTI_ROLE_PEER, Participants: []string{"gpu-001", "gpu-002"}, MultiId: w.id}
	if _, _, err := fl.runOn(rctx, w, "gpu-002", rc, 20*time.Second, true); err != nil {
		t.Fatalf("reserve the peer: %v", err)
	}
	done()

	opts := kit.RunOptions{Timeout: 20 * time.Second}
	// In the same term the reservation holds: the run is refused.
	if _, err := f.RunMulti(ctx, []string{"gpu-001", "gpu-002"}, "nccl.allreduce", opts); !errors.Is(err, kit.ErrRefused) ||
		!strings.Contains(err.Error(), "gpu-002") {
		t.Fatalf("a run on the reserved peer: %v, want refused", err)
	}
	// A new term: what was dispatched before it is called off first.
	if err := s.loadStaleMultis(ctx, s.now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	rep, err := f.RunMulti(ctx, []string{"gpu-001", "gpu-002"}, "nccl.allreduce", opts)
	if err != nil {
		t.Fatalf("the next term's run: %v", err)
	}
	if c := rep.Check("nccl.allreduce"); c == nil || c.Status != "pass" {
		t.Errorf("the next term's run: %+v", rep)
	}
}
