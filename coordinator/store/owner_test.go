package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

func TestNodeOwner(t *testing.T) { both(t, testNodeOwner) }

// The coordinator holding a node's stream is recorded at attach, moves
// with the agent, and is cleared at detach only by its owner: a stream
// that ended on a coordinator the agent already left changes nothing.
func testNodeOwner(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	defer s.Close()
	ctx := context.Background()
	t0 := time.Now()
	join := func(owner, addr, act string) {
		t.Helper()
		if _, _, err := s.NodeJoined(ctx, Join{Node: "n1", At: t0, InitialState: "initializing", Owner: owner, OwnerAddr: addr, Activity: act}); err != nil {
			t.Fatal(err)
		}
	}
	owner := func() (string, string) {
		t.Helper()
		o, a, err := s.NodeOwner(ctx, "n1")
		if err != nil {
			t.Fatal(err)
		}
		return o, a
	}
	if _, _, err := s.NodeOwner(ctx, "n1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown node: %v, want ErrNotFound", err)
	}
	join("coord-a-1", "10.0.0.1:7443", "idle")
	if o, a := owner(); o != "coord-a-1" || a != "10.0.0.1:7443" {
		t.Fatalf("owner after attach to a: %q %q", o, a)
	}
	// The agent moves to b; a's stream ends afterwards.
	join("coord-b-1", "10.0.0.2:7443", "busy")
	off := false
	_, err := s.SetNodeState(ctx, StateChange{Node: "n1", State: "unreachable", Reason: "stream lost", At: t0, Connected: &off, Owner: "coord-a-1"})
	if !errors.Is(err, ErrNotOwner) {
		t.Fatalf("detach by the old owner: %v, want ErrNotOwner", err)
	}
	n, err := s.Node(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if !n.Connected || n.State != "initializing" || n.Owner != "coord-b-1" || n.OwnerAddr != "10.0.0.2:7443" || n.Activity != "busy" {
		t.Fatalf("after the old owner's detach: %+v", n)
	}
	// Activities are the owner's to record.
	if err := s.SetActivities(ctx, "coord-a-1", map[string]string{"n1": "drained"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetActivities(ctx, "coord-b-1", map[string]string{"n1": "idle"}); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Node(ctx, "n1"); n.Activity != "idle" {
		t.Fatalf("activity %q, want idle (the owner's)", n.Activity)
	}
	if err := s.SetActivities(ctx, "coord-b-1", map[string]string{"n1": string(make([]byte, 33))}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("oversized activity: %v", err)
	}
	// The owner's detach clears it.
	if _, err := s.SetNodeState(ctx, StateChange{Node: "n1", State: "unreachable", Reason: "stream lost", At: t0, Connected: &off, Owner: "coord-b-1"}); err != nil {
		t.Fatal(err)
	}
	if o, a := owner(); o != "" || a != "" {
		t.Fatalf("owner after its detach: %q %q", o, a)
	}
	nodes, err := s.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].Connected || nodes[0].State != "unreachable" {
		t.Fatalf("nodes: %+v %v", nodes, err)
	}

	// A restarting coordinator marks only what its address held.
	join("coord-a-1", "10.0.0.1:7443", "idle")
	if _, _, err := s.NodeJoined(ctx, Join{Node: "n2", At: t0, InitialState: "initializing", Owner: "coord-b-1", OwnerAddr: "10.0.0.2:7443"}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.MarkDisconnected(ctx, "10.0.0.1:7443"); err != nil || n != 1 {
		t.Fatalf("marked %d (%v), want 1", n, err)
	}
	if o, _ := owner(); o != "" {
		t.Fatalf("n1 owner after a's restart: %q", o)
	}
	if o, a, _ := s.NodeOwner(ctx, "n2"); o != "coord-b-1" || a != "10.0.0.2:7443" {
		t.Fatalf("n2 owner after a's restart: %q %q, want b's", o, a)
	}
	if n, err := s.MarkAllDisconnected(ctx); err != nil || n != 1 {
		t.Fatalf("all: marked %d (%v), want 1", n, err)
	}
	if o, _, _ := s.NodeOwner(ctx, "n2"); o != "" {
		t.Fatalf("n2 owner after marking all: %q", o)
	}
}

func TestLoadResult(t *testing.T) { both(t, testLoadResult) }

// A result stored by one coordinator reads back whole on another: its
// header, every check and the node's inventory.
func testLoadResult(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	defer s.Close()
	ctx := context.Background()
	at := time.Now().Truncate(time.Millisecond)
	if _, _, err := s.NodeJoined(ctx, Join{Node: "n1", At: at, InitialState: "initializing"}); err != nil {
		t.Fatal(err)
	}
	r := eccResult("r1", "n1", at, report.Fail)
	r.WorkID = "w-1"
	r.Inventory = &report.Inventory{DriverVersion: "570.86.15", GPUs: []report.GPU{{Index: 0, Serial: "S0"}, {Index: 1, Serial: "S1"}}}
	if _, err := s.Ingest(ctx, r); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadResult(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "r1" || got.Node != "n1" || got.WorkID != "w-1" || got.Status != report.Fail || !got.Finished.Equal(at) || len(got.Checks) != 2 {
		t.Fatalf("loaded %+v", got)
	}
	ecc := got.Checks[0]
	if ecc.Name != "gpu.ecc" || ecc.Status != report.Fail || len(ecc.Findings) != 1 || ecc.Findings[0].Code != "ECC_UNCORRECTABLE" ||
		ecc.Metrics["gpu3.ecc.dram_uncorrectable"] != 2 {
		t.Fatalf("ecc check %+v", ecc)
	}
	// With the node's inventory: a campaign judging the result reads its
	// GPUs (none would be inconclusive).
	if got.Inventory == nil || got.Inventory.DriverVersion != "570.86.15" || len(got.Inventory.GPUs) != 2 {
		t.Fatalf("loaded inventory %+v", got.Inventory)
	}
	if _, err := s.LoadResult(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown result: %v", err)
	}
}

func TestLoadResultReadsByIndex(t *testing.T) { both(t, testLoadResultReadsByIndex) }

// LoadResult finds a result's rows along an index, not by reading the
// whole table: each database's plan for its query says so (PostgreSQL
// told to avoid sequential scans it can avoid, as a full table would).
func testLoadResultReadsByIndex(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	defer s.Close()
	ctx := context.Background()
	conn, err := s.r.SQL().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	explain := "EXPLAIN QUERY PLAN "
	if s.d == sqldb.Postgres {
		explain = "EXPLAIN "
		if _, err := conn.ExecContext(ctx, `SET enable_seqscan = off`); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := conn.QueryContext(ctx, explain+s.d.Rebind(loadResultChecks), "n1", int64(1), "r1", 10)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var plan []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, fmt.Sprint(vals[len(vals)-1]))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	p := strings.Join(plan, " | ")
	if !strings.Contains(p, "check_results_node_finished") || strings.Contains(p, "Seq Scan") {
		t.Errorf("LoadResult's plan reads no index: %s", p)
	}
}
