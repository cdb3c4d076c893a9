package simfleet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
)

// ErrBadFault is returned (wrapped) for a fault that names an unknown node
// or leaf, or whose factor is out of range.
var ErrBadFault = errors.New("simfleet: bad fault")

// Fault is something wrong in the simulated fleet. Sealed: every fault is
// one the model knows.
type Fault interface {
	apply(f *Fleet) error
}

// GPUSlow degrades a node on its GPU side (NVLink, a GPU): its single-node
// all_reduce and every pair it joins run at Factor of the healthy speed.
type GPUSlow struct {
	Node   string
	Factor float64 // 0 < Factor <= 1
}

// NetworkSlow degrades a node on its network side (an HCA, a cable, a
// port): it is fine alone and slow with every partner.
type NetworkSlow struct {
	Node   string
	Factor float64
}

// PathSlow degrades the path between two leaf switches (a spine uplink,
// a cable between them): only pairs with one node on each leaf are slow.
type PathSlow struct {
	LeafA, LeafB string
	Factor       float64
}

// Transient makes the node's next Runs all_reduce runs slow (single-node
// runs too when GPUSide), then it is fine again: slowness that does not
// repeat. Runs 0 means one.
type Transient struct {
	Node    string
	Factor  float64
	Runs    int
	GPUSide bool
}

// Dies makes the node's agent disconnect partway through its run number
// AfterRuns+1 (0: its first run): that run and everything after it return
// kit.ErrUnreachable, and Nodes reports it disconnected.
type Dies struct {
	Node      string
	AfterRuns int
}

// Busy marks the node busy: its agent refuses disruptive checks
// (kit.ErrRefused), as it does while a job holds the node.
type Busy struct{ Node string }

func checkFactor(f float64) error {
	if !(f > 0 && f <= 1) {
		return fmt.Errorf("%w: factor %v not in (0, 1]", ErrBadFault, f)
	}
	return nil
}

func (g GPUSlow) apply(f *Fleet) error {
	n, err := f.nodeFor(g.Node)
	if err != nil {
		return err
	}
	if err := checkFactor(g.Factor); err != nil {
		return err
	}
	n.gpu = g.Factor
	return nil
}

func (g NetworkSlow) apply(f *Fleet) error {
	n, err := f.nodeFor(g.Node)
	if err != nil {
		return err
	}
	if err := checkFactor(g.Factor); err != nil {
		return err
	}
	n.net = g.Factor
	return nil
}

func (p PathSlow) apply(f *Fleet) error {
	if err := checkFactor(p.Factor); err != nil {
		return err
	}
	if p.LeafA == p.LeafB {
		return fmt.Errorf("%w: a path needs two different leaves, got %q twice", ErrBadFault, p.LeafA)
	}
	for _, l := range []string{p.LeafA, p.LeafB} {
		if !f.leaves[l] {
			return fmt.Errorf("%w: no leaf %q", ErrBadFault, l)
		}
	}
	f.paths[pathKey(p.LeafA, p.LeafB)] = p.Factor
	return nil
}

func (t Transient) apply(f *Fleet) error {
	n, err := f.nodeFor(t.Node)
	if err != nil {
		return err
	}
	if err := checkFactor(t.Factor); err != nil {
		return err
	}
	n.transient = t.Factor
	n.transientRuns = max(t.Runs, 1)
	n.transientGPU = t.GPUSide
	n.transientSet = true
	return nil
}

func (d Dies) apply(f *Fleet) error {
	n, err := f.nodeFor(d.Node)
	if err != nil {
		return err
	}
	if d.AfterRuns < 0 {
		return fmt.Errorf("%w: AfterRuns %d < 0", ErrBadFault, d.AfterRuns)
	}
	n.diesAfter = n.runs + d.AfterRuns
	return nil
}

func (b Busy) apply(f *Fleet) error {
	n, err := f.nodeFor(b.Node)
	if err != nil {
		return err
	}
	n.busy = true
	return nil
}

// Truth is what is really wrong in the fleet, to score a sweep against.
type Truth struct {
	GPUSide     []string    `json:"gpu_side"`
	NetworkSide []string    `json:"network_side"`
	Paths       [][2]string `json:"paths"` // leaf pairs, each sorted
	Transient   []string    `json:"transient"`
	Dead        []string    `json:"dead"`
	Busy        []string    `json:"busy"`
}

// Truth lists the faults injected so far.
func (f *Fleet) Truth() Truth {
	f.mu.Lock()
	defer f.mu.Unlock()
	var t Truth
	for _, n := range f.order {
		if n.gpu < 1 {
			t.GPUSide = append(t.GPUSide, n.name)
		}
		if n.net < 1 {
			t.NetworkSide = append(t.NetworkSide, n.name)
		}
		if n.transientSet {
			t.Transient = append(t.Transient, n.name)
		}
		if n.diesAfter >= 0 {
			t.Dead = append(t.Dead, n.name)
		}
		if n.busy {
			t.Busy = append(t.Busy, n.name)
		}
	}
	for k := range f.paths {
		t.Paths = append(t.Paths, k)
	}
	sort.Slice(t.Paths, func(i, j int) bool {
		if t.Paths[i][0] != t.Paths[j][0] {
			return t.Paths[i][0] < t.Paths[j][0]
		}
		return t.Paths[i][1] < t.Paths[j][1]
	})
	return t
}

// Scenario describes random faults for a benchmark fleet.
type Scenario struct {
	// BadNodeShare of the nodes are slow (at least one when > 0), half of
	// them on the GPU side and half on the network side.
	BadNodeShare float64
	// Slower is the range of slowdowns, e.g. 0.35..0.60 (35-60 % slower).
	SlowerMin, SlowerMax float64
	// BadPaths leaf-to-leaf paths are slow by the same range.
	BadPaths int
	// Seed picks the nodes, paths and slowdowns.
	Seed uint64
}

// InjectScenario places the scenario's faults and returns what it placed.
func (f *Fleet) InjectScenario(s Scenario) (Truth, error) {
	if s.SlowerMin <= 0 || s.SlowerMax < s.SlowerMin || s.SlowerMax >= 1 {
		return Truth{}, fmt.Errorf("%w: slowdown range %v..%v", ErrBadFault, s.SlowerMin, s.SlowerMax)
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x5ca1ab1e))
	slower := func() float64 { return 1 - (s.SlowerMin + rng.Float64()*(s.SlowerMax-s.SlowerMin)) }
	names := f.Names()
	bad := 0
	if s.BadNodeShare > 0 {
		bad = max(1, int(float64(len(names))*s.BadNodeShare+0.5))
	}
	if bad > len(names) {
		return Truth{}, fmt.Errorf("%w: %d bad nodes in a fleet of %d", ErrBadFault, bad, len(names))
	}
	perm := rng.Perm(len(names))
	for i := range bad {
		var ft Fault = GPUSlow{Node: names[perm[i]], Factor: slower()}
		if i%2 == 1 {
			ft = NetworkSlow{Node: names[perm[i]], Factor: slower()}
		}
		if err := f.Inject(ft); err != nil {
			return Truth{}, err
		}
	}
	leaves := f.Leaves()
	if s.BadPaths > 0 && len(leaves) < 2 {
		return Truth{}, fmt.Errorf("%w: bad paths need at least two leaves", ErrBadFault)
	}
	var placed [][2]string
	for len(placed) < s.BadPaths {
		a, b := rng.IntN(len(leaves)), rng.IntN(len(leaves))
		if a == b {
			continue
		}
		k := pathKey(leaves[a], leaves[b])
		if slices.Contains(placed, k) {
			continue
		}
		placed = append(placed, k)
		if err := f.Inject(PathSlow{LeafA: k[0], LeafB: k[1], Factor: slower()}); err != nil {
			return Truth{}, err
		}
	}
	return f.Truth(), nil
}

func pathKey(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}
