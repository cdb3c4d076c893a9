package kit

import (
	"context"
	"errors"
	"testing"
)

func TestBusyAcrossEngines(t *testing.T) {
	var b Busy
	b.Register("burnin", func(context.Context) (map[string]string, error) {
		return map[string]string{"gpu-1": "burnin b-1"}, nil
	})
	b.Register("drill", func(context.Context) (map[string]string, error) {
		return map[string]string{"gpu-2": "drill d-1"}, nil
	})
	ctx := context.Background()
	var seen map[string]string
	if err := b.Claim(ctx, func(held map[string]string) error { seen = held; return nil }); err != nil {
		t.Fatal(err)
	}
	if seen["gpu-1"] != "burnin b-1" || seen["gpu-2"] != "drill d-1" || len(seen) != 2 {
		t.Errorf("Claim saw %v, want both engines' nodes", seen)
	}
	if who, ok := b.Holding(ctx, "gpu-2"); !ok || who != "drill d-1" {
		t.Errorf("Holding(gpu-2) = %q, %v", who, ok)
	}
	if _, ok := b.Holding(ctx, "gpu-3"); ok {
		t.Error("gpu-3 is held by nobody")
	}
	b.Register("rollout", func(context.Context) (map[string]string, error) { return nil, errors.New("db gone") })
	if _, ok := b.Holding(ctx, "gpu-3"); !ok {
		t.Error("when the holders cannot be listed a node counts as held")
	}
	if err := b.Claim(ctx, func(map[string]string) error { t.Error("start ran without knowing the holders"); return nil }); err == nil {
		t.Error("Claim with a failing lister: want its error")
	}
}
