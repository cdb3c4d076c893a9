package store

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

func TestDispatchRecordedAndPruned(t *testing.T) { both(t, testDispatchRecordedAndPruned) }

func testDispatchRecordedAndPruned(t *testing.T, be backend) {
	dir := be.loc(t)
	clk := newClock()
	s := open(t, dir, func(o *Options) { o.Now = clk.Now })
	ctx := context.Background()
	if err := s.RecordDispatch(ctx, "w-1", []string{"n1", "n2"}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	// Recording again is harmless (a retried dispatch).
	if err := s.RecordDispatch(ctx, "w-1", []string{"n2"}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordDispatch(ctx, "", []string{"n1"}, time.Time{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty work id: %v", err)
	}
	for _, tc := range []struct {
		work, node string
		want       bool
	}{{"w-1", "n1", true}, {"w-1", "n2", true}, {"w-1", "n3", false}, {"w-2", "n1", false}} {
		got, err := s.Dispatched(ctx, tc.work, tc.node)
		if err != nil || got != tc.want {
			t.Errorf("Dispatched(%s, %s) = %v, %v; want %v", tc.work, tc.node, got, err, tc.want)
		}
	}
	// The record outlives a restart.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir, func(o *Options) { o.Now = clk.Now })
	defer s.Close()
	if ok, err := s.Dispatched(ctx, "w-1", "n2"); !ok || err != nil {
		t.Fatalf("after reopen: %v %v", ok, err)
	}
	// And goes with retention.
	clk.Add(48 * time.Hour)
	if err := s.RecordDispatch(ctx, "w-3", []string{"n1"}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	st, err := s.Prune(ctx, clk.Now().Add(-24*time.Hour))
	if err != nil || st.Dispatches != 2 {
		t.Fatalf("prune: %+v %v, want 2 dispatches", st, err)
	}
	if ok, _ := s.Dispatched(ctx, "w-1", "n1"); ok {
		t.Error("pruned dispatch still found")
	}
	if ok, _ := s.Dispatched(ctx, "w-3", "n1"); !ok {
		t.Error("recent dispatch pruned")
	}
}

func TestEventsByKind(t *testing.T) { both(t, testEventsByKind) }

func testEventsByKind(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	defer s.Close()
	ctx := context.Background()
	for _, e := range []Event{
		{Node: "n1", Kind: EventStateChange, Actor: "coordinator", Message: "healthy -> failed"},
		{Node: "", Kind: EventOperatorAction, Actor: "admin:alice", Message: "run gpu.ecc"},
		{Node: "n1", Kind: EventAudit, Actor: "admin:alice", Message: "drain: burnin-1"},
		{Node: "n2", Kind: EventAudit, Actor: "admin:bob", Message: "drain: burnin-2"},
	} {
		if err := s.AddEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		q    EventQuery
		want []string
	}{
		{EventQuery{Kind: EventAudit}, []string{"drain: burnin-1", "drain: burnin-2"}},
		{EventQuery{Kind: EventAudit, Node: "n2"}, []string{"drain: burnin-2"}},
		{EventQuery{Node: "n1"}, []string{"healthy -> failed", "drain: burnin-1"}},
		{EventQuery{Kind: EventOperatorAction}, []string{"run gpu.ecc"}},
		{EventQuery{Kind: "nonsense"}, nil},
		{EventQuery{}, []string{"healthy -> failed", "run gpu.ecc", "drain: burnin-1", "drain: burnin-2"}},
	} {
		evs, err := s.Events(ctx, tc.q)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range evs {
			got = append(got, e.Message)
		}
		if len(got) != len(tc.want) {
			t.Errorf("%+v: %v, want %v", tc.q, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%+v: %v, want %v", tc.q, got, tc.want)
				break
			}
		}
	}
}

func TestOnCommitObservesBatches(t *testing.T) { both(t, testOnCommitObservesBatches) }

func testOnCommitObservesBatches(t *testing.T, be backend) {
	var mu sync.Mutex
	var batches, results int
	s := open(t, be.loc(t), func(o *Options) {
		o.OnCommit = func(n int, took time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			if took <= 0 {
				t.Errorf("commit took %s", took)
			}
			batches++
			results += n
		}
	})
	defer s.Close()
	at := time.Now()
	for i := 0; i < 3; i++ {
		if _, err := s.Ingest(context.Background(), eccResult("r"+string(rune('a'+i)), "n1", at, report.Pass)); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if results != 3 || batches < 1 || batches > 3 {
		t.Fatalf("observed %d batches of %d results, want 3 results", batches, results)
	}
}

func TestMultiDispatches(t *testing.T) { both(t, testMultiDispatches) }

func testMultiDispatches(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	ctx := context.Background()
	t0 := time.UnixMilli(1_800_000_000_000)
	for _, d := range []struct {
		work  string
		nodes []string
		at    time.Time
	}{
		{"pair", []string{"n1", "n2"}, t0.Add(time.Minute)},
		{"single", []string{"n1"}, t0.Add(time.Minute)},
		{"wide", []string{"n1", "n2", "n3", "n4"}, t0.Add(time.Minute)},
		{"old-pair", []string{"n1", "n2"}, t0.Add(-time.Minute)},
		{"new-pair", []string{"n2", "n3"}, t0.Add(time.Hour)},
	} {
		if err := s.RecordDispatch(ctx, d.work, d.nodes, d.at); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.MultiDispatches(ctx, t0, t0.Add(time.Hour), 3)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"n1": {"pair"}, "n2": {"pair"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("multi dispatches %v, want %v (the single, the 4-node, the older and the newer works left out)", got, want)
	}
}
