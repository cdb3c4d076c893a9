package drain

import (
	"context"
	"errors"
	"testing"
)

func TestNone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var changes []string
	n := NewNone(func(node string, st Status) {
		changes = append(changes, node+":"+st.Reason)
	})
	n.Set("gpu-002", Status{Drained: true, Reason: "bad PSU"})

	if err := n.Drain(ctx, "gpu-001", "rollout r-1"); err != nil {
		t.Fatal(err)
	}
	st, _ := n.Status(ctx, "gpu-001")
	if !st.Drained || !st.ByFleetcheck || st.Reason != "fleetcheck: rollout r-1" {
		t.Fatalf("status %+v", st)
	}
	if !Owns(st, "fleetcheck: rollout r-1") || Owns(st, "fleetcheck: rollout r-2") {
		t.Fatal("Owns")
	}
	if err := n.Drain(ctx, "gpu-002", "x"); !errors.Is(err, ErrNotOurs) {
		t.Fatalf("drain foreign: %v", err)
	}
	if err := n.Undrain(ctx, "gpu-002"); !errors.Is(err, ErrNotOurs) {
		t.Fatalf("undrain foreign: %v", err)
	}
	un, _ := n.Unavailable(ctx)
	if len(un) != 2 {
		t.Fatalf("unavailable %+v", un)
	}
	if err := n.Undrain(ctx, "gpu-001"); err != nil {
		t.Fatal(err)
	}
	if err := n.Undrain(ctx, "gpu-001"); err != nil {
		t.Fatal(err)
	}
	if err := n.Drain(ctx, "gpu[1-2]", "x"); !errors.Is(err, ErrInvalidNode) {
		t.Fatalf("hostlist: %v", err)
	}
	if len(changes) != 2 || changes[0] != "gpu-001:fleetcheck: rollout r-1" || changes[1] != "gpu-001:" {
		t.Fatalf("changes %q", changes)
	}
	if st, _ := n.Status(ctx, "gpu-002"); !st.Drained || st.Reason != "bad PSU" {
		t.Fatalf("foreign drain changed: %+v", st)
	}
}

func TestReason(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                      "fleetcheck:",
		"rollout r-1":           "fleetcheck: rollout r-1",
		"fleetcheck: sweep s-2": "fleetcheck: sweep s-2",
	} {
		if got := Reason(in); got != want {
			t.Errorf("Reason(%q) = %q, want %q", in, got, want)
		}
	}
	if Ours("maintenance") || !Ours(" fleetcheck: x") {
		t.Fatal("Ours")
	}
}
