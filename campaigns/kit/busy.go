package kit

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// Holders lists the nodes an engine's unfinished campaigns hold, each
// with who holds it ("burnin b-20260302T020000Z-4f0c1a").
type Holders func(ctx context.Context) (map[string]string, error)

// Busy is which nodes campaigns hold across engines: a node busy in any
// campaign is not taken by another. Engines Register how to list theirs
// and start campaigns inside Claim, which holds one lock across engines
// while the new campaign checks and writes its nodes, so two starts
// cannot take the same node. Safe for concurrent use.
type Busy struct {
	claim sync.Mutex // held through a Claim
	mu    sync.Mutex
	kinds map[string]Holders
}

// Register adds (or replaces) an engine's lister under its kind.
func (b *Busy) Register(kind string, h Holders) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kinds == nil {
		b.kinds = map[string]Holders{}
	}
	b.kinds[kind] = h
}

// Held maps every held node to its holder, across engines.
func (b *Busy) Held(ctx context.Context) (map[string]string, error) {
	b.mu.Lock()
	kinds := maps.Clone(b.kinds)
	b.mu.Unlock()
	out := map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(kinds)) {
		held, err := kinds[k](ctx)
		if err != nil {
			return nil, fmt.Errorf("nodes held by %s campaigns: %w", k, err)
		}
		for n, who := range held {
			if _, ok := out[n]; !ok {
				out[n] = who
			}
		}
	}
	return out, nil
}

// Claim runs start with the nodes held now, holding every other Claim
// off until start returns: start checks its nodes against held and
// writes its campaign.
func (b *Busy) Claim(ctx context.Context, start func(held map[string]string) error) error {
	b.claim.Lock()
	defer b.claim.Unlock()
	held, err := b.Held(ctx)
	if err != nil {
		return err
	}
	return start(held)
}

// Holding says which campaign holds node, if any (remediation leaves such
// a node alone). An error listing them counts as held: when in doubt a
// campaign's node is not touched.
func (b *Busy) Holding(ctx context.Context, node string) (string, bool) {
	held, err := b.Held(ctx)
	if err != nil {
		return err.Error(), true
	}
	who, ok := held[node]
	return who, ok
}
