package rollout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/compat"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// ErrNoMatrix: a rollout is never planned without a compatibility matrix.
var ErrNoMatrix = errors.New("no compatibility matrix")

// Exclusion kinds.
const (
	ExcludedIncompatible = "incompatible" // the matrix does not allow the target
	ExcludedUnknown      = "unknown"      // the matrix could not judge (inventory incomplete)
	ExcludedUpToDate     = "up-to-date"   // already runs the target driver
)

// DisconnectedNote marks a planned node whose agent was away when the plan
// was made: it keeps its place, and its turn waits for the agent.
func DisconnectedNote(grace time.Duration) string {
	return fmt.Sprintf("disconnected at plan time: will be waited for %v (connect_grace) at its turn", grace)
}

// PlanResult is what a rollout would do: the waves with their nodes, and
// the nodes left out with the reason. `rollout plan` prints it; Start runs
// the same plan.
type PlanResult struct {
	Spec      *Spec         `json:"spec"`
	Selected  int           `json:"selected"`
	Waves     []PlannedWave `json:"waves"`
	Excluded  []Exclusion   `json:"excluded"`
	FleetSize int           `json:"fleet_size"`
	// MaxUnavailable is the spec's limit resolved against the scope's size
	// at planning time (it is re-resolved as the fleet changes).
	MaxUnavailable int `json:"max_unavailable"`
}

// PlannedWave is one wave.
type PlannedWave struct {
	Index int    `json:"index"`
	Name  string `json:"name"` // "canary", "wave 1", ...
	// Budget is the number of failed nodes the wave tolerates.
	Budget int           `json:"budget"`
	Nodes  []PlannedNode `json:"nodes"`
}

// PlannedNode is a node in a wave with the driver it runs now (the
// version a rollback returns to).
type PlannedNode struct {
	Name   string `json:"name"`
	Driver string `json:"driver"`
	// Disconnected: the agent was away at plan time. The node is planned
	// all the same (a coordinator restart or an agent's reconnect backoff
	// must not leave it out); Note says how its turn treats it.
	Disconnected bool   `json:"disconnected_at_plan,omitempty"`
	Note         string `json:"note,omitempty"`
}

// Exclusion is a selected node the rollout leaves alone.
type Exclusion struct {
	Node   string   `json:"node"`
	Kind   string   `json:"kind"`
	Reason string   `json:"reason"`
	Rules  []string `json:"rules,omitempty"` // the matrix rules broken or not judged
}

// Plan checks every selected node's inventory against the compatibility
// matrix for the target versions and lays the rest out in waves: the
// canary first, then the spec's waves over the remaining nodes in name
// order. A node whose agent is not connected is planned like the others
// and marked: its turn waits connect_grace for the agent. An automatic
// canary is taken from the connected nodes first, so a restart's
// reconnecting agents do not become the canary. It changes nothing.
func Plan(ctx context.Context, spec *Spec, fleet kit.Fleet, matrix *compat.Matrix) (*PlanResult, error) {
	if spec == nil {
		return nil, fmt.Errorf("plan: %w: nil spec", ErrInvalidSpec)
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if matrix == nil {
		return nil, fmt.Errorf("plan: %w: the target must be checked against one before any node is touched", ErrNoMatrix)
	}
	selected, err := fleet.Nodes(ctx, spec.Selector)
	if err != nil {
		return nil, fmt.Errorf("plan: list nodes: %w", err)
	}
	all := selected
	if spec.MaxUnavailableScope == ScopeFleet && spec.Selector != "" {
		if all, err = fleet.Nodes(ctx, ""); err != nil {
			return nil, fmt.Errorf("plan: list fleet: %w", err)
		}
	}
	slices.SortFunc(selected, func(a, b kit.Node) int { return strings.Compare(a.Name, b.Name) })
	p := &PlanResult{Spec: spec, Selected: len(selected), FleetSize: len(all), Excluded: []Exclusion{}}
	p.MaxUnavailable = maxUnavailable(spec, len(all), len(selected))

	target := spec.CompatTarget()
	var eligible []PlannedNode
	for _, n := range selected {
		if ex, ok := judge(n, spec, matrix, target); !ok {
			p.Excluded = append(p.Excluded, ex)
			continue
		}
		pn := PlannedNode{Name: n.Name, Driver: n.Inventory.DriverVersion}
		if !n.Connected {
			pn.Disconnected, pn.Note = true, DisconnectedNote(spec.connectGrace())
		}
		eligible = append(eligible, pn)
	}

	// The canary: the named nodes, or the first eligible ones.
	var canary, rest []PlannedNode
	if len(spec.CanaryNodes) > 0 {
		want := map[string]bool{}
		for _, c := range spec.CanaryNodes {
			want[c] = true
		}
		for _, n := range eligible {
			if want[n.Name] {
				canary = append(canary, n)
				delete(want, n.Name)
			} else {
				rest = append(rest, n)
			}
		}
		for _, c := range spec.CanaryNodes {
			if !want[c] {
				continue
			}
			for _, ex := range p.Excluded {
				if ex.Node == c {
					return nil, fmt.Errorf("plan: canary node %s is excluded: %s", c, ex.Reason)
				}
			}
			return nil, fmt.Errorf("plan: canary node %s is not selected by %q", c, spec.Selector)
		}
	} else {
		// Connected nodes first, each group in name order: deterministic
		// for one fleet state.
		ordered := slices.Clone(eligible)
		slices.SortStableFunc(ordered, func(a, b PlannedNode) int {
			switch {
			case a.Disconnected == b.Disconnected:
				return 0
			case b.Disconnected:
				return -1
			}
			return 1
		})
		k := min(*spec.Canary, len(ordered))
		canary = ordered[:k]
		taken := map[string]bool{}
		for _, c := range canary {
			taken[c.Name] = true
		}
		for _, n := range eligible {
			if !taken[n.Name] {
				rest = append(rest, n)
			}
		}
	}
	if len(canary) > 0 {
		p.Waves = append(p.Waves, PlannedWave{
			Index: 0, Name: "canary", Nodes: canary,
			Budget: spec.FailureBudget.Canary.Floor(len(canary)),
		})
	}
	total := len(rest)
	for i := 0; len(rest) > 0; i++ {
		a := spec.Waves[min(i, len(spec.Waves)-1)]
		size := min(max(a.Of(total), 1), len(rest))
		w := PlannedWave{Index: len(p.Waves), Name: fmt.Sprintf("wave %d", len(p.Waves)), Nodes: rest[:size]}
		w.Budget = spec.FailureBudget.Wave.Floor(size)
		p.Waves = append(p.Waves, w)
		rest = rest[size:]
	}
	return p, nil
}

// judge decides whether a node takes part; ok false comes with the reason.
func judge(n kit.Node, spec *Spec, m *compat.Matrix, target compat.Target) (Exclusion, bool) {
	ex := Exclusion{Node: n.Name}
	if n.Inventory.DriverVersion != "" && compat.CompareVersions(n.Inventory.DriverVersion, spec.Target.Driver) == 0 {
		ex.Kind, ex.Reason = ExcludedUpToDate, "already runs driver "+n.Inventory.DriverVersion
		return ex, false
	}
	ok, v := m.Allows(NodeFromInventory(n.Inventory), target)
	if !ok {
		for _, vi := range v.Violations {
			ex.Rules = append(ex.Rules, fmt.Sprintf("%s (%s)", vi.String(), vi.Rule))
		}
		ex.Rules = append(ex.Rules, v.Unknown...)
		switch {
		case len(v.Violations) > 0:
			ex.Kind = ExcludedIncompatible
			parts := make([]string, len(v.Violations))
			for i, vi := range v.Violations {
				parts[i] = vi.String()
			}
			ex.Reason = "target not allowed by the compatibility matrix: " + strings.Join(parts, "; ")
		case len(v.Unknown) > 0:
			ex.Kind = ExcludedUnknown
			ex.Reason = "the compatibility matrix cannot judge the target here: " + strings.Join(v.Unknown, "; ")
		default:
			ex.Kind = ExcludedUnknown
			ex.Reason = "no compatibility rule applies to this node (unknown GPU model or empty inventory)"
		}
		return ex, false
	}
	return ex, true
}

// NodeFromInventory gathers what the compatibility matrix judges from the
// inventory a node's agent reported. Whether the node has an NVSwitch
// fabric is not in the inventory: it stays unknown, so Fabric Manager
// rules apply wherever the matrix ties them to the GPU model.
func NodeFromInventory(inv report.Inventory) compat.Node {
	n := compat.Node{
		Driver:        inv.DriverVersion,
		CUDA:          inv.CUDAVersion,
		FabricManager: inv.FabricManagerVersion,
		RDMAStack:     inv.RDMAStack,
		Kernel:        inv.Kernel,
	}
	for _, g := range inv.GPUs {
		n.GPUs = append(n.GPUs, compat.GPU{Index: g.Index, Name: g.Name, VBIOS: g.VBIOSVersion})
	}
	for _, h := range inv.HCAs {
		n.HCAs = append(n.HCAs, compat.HCA{Name: h.Name, Model: h.Model, FW: h.FWVersion})
	}
	return n
}

// maxUnavailable resolves the limit against the scope's size; a
// percentage rounds down but never below one node.
func maxUnavailable(spec *Spec, fleetSize, selected int) int {
	size := fleetSize
	if spec.MaxUnavailableScope == ScopeSelection {
		size = selected
	}
	return max(spec.MaxUnavailable.Floor(size), 1)
}
