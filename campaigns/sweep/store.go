package sweep

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/baselines"
)

// ErrNotFound is returned (wrapped) for an unknown sweep id.
var ErrNotFound = errors.New("sweep not found")

// ErrExists is returned (wrapped) by CreateSweep for an id in use.
var ErrExists = errors.New("sweep exists")

// State is a sweep's life stage.
type State string

const (
	StateRunning State = "running" // started, not finished (maybe interrupted)
	StateDone    State = "done"
	StateFailed  State = "failed" // stopped on an error it cannot continue past
)

// Phase is a sweep's round.
type Phase string

const (
	PhaseIntra    Phase = "intra"    // round 1: single-node
	PhaseInter    Phase = "inter"    // round 2: pairs
	PhaseLocalise Phase = "localise" // round 3: localisation
	PhaseDone     Phase = "done"
)

// Round is the phase's number (1..3; 0 for done).
func (p Phase) Round() int {
	switch p {
	case PhaseIntra:
		return 1
	case PhaseInter:
		return 2
	case PhaseLocalise:
		return 3
	}
	return 0
}

// NodeInfo is what a sweep keeps of a node it tests.
type NodeInfo struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	GPUs   int               `json:"gpus,omitempty"`
	// SKU is the baseline SKU (baselines.SKUFromInventory); pairs are made
	// within one SKU.
	SKU   string          `json:"sku,omitempty"`
	Stack baselines.Stack `json:"stack"`
}

// Record is a sweep as stored: what it was asked, what it selected and
// where it stands. Tests and drains are stored beside it.
type Record struct {
	ID      string     `json:"id"`
	Spec    Spec       `json:"spec"`
	Seed    uint64     `json:"seed"`
	State   State      `json:"state"`
	Error   string     `json:"error,omitempty"`
	Phase   Phase      `json:"phase"`
	Wave    int        `json:"wave"`
	Created time.Time  `json:"created"`
	Started time.Time  `json:"started"`
	Ended   time.Time  `json:"ended,omitzero"`
	Nodes   []NodeInfo `json:"nodes"` // selected to be tested
	// Unreachable nodes were selected but not connected at the start.
	Unreachable []string `json:"unreachable,omitempty"`
	Skipped     []Skip   `json:"skipped,omitempty"`
	// Deferred nodes were eligible but left for a later sweep by the budget.
	Deferred []string `json:"deferred,omitempty"`
	Coverage Coverage `json:"coverage"`
	Report   *Report  `json:"report,omitempty"` // once done

	index map[string]int // Nodes by name (indexNodes)
}

// Skip is a node the sweep did not test, and why.
type Skip struct {
	Node   string `json:"node"`
	Reason string `json:"reason"`
}

// Purpose is why a test runs.
type Purpose string

const (
	PurposeSingle   Purpose = "single"   // round 1
	PurposePair     Purpose = "pair"     // round 2
	PurposeMember   Purpose = "member"   // round 3: a slow pair's member with a reference
	PurposeLeftover Purpose = "leftover" // round 3: a node without a round-2 result, with a reference
	PurposeProbe    Purpose = "probe"    // round 3: two references across a slow pair's leaf-to-leaf path
	// PurposeMutual pairs two suspects of one leaf when the leaf has no
	// reference (every pair from it was slow, as when a path fails in a
	// two-leaf fleet): fine clears both.
	PurposeMutual Purpose = "mutual"
)

// TestState is a test's life stage.
type TestState string

const (
	TestPlanned TestState = "planned"
	TestRunning TestState = "running" // started; no result stored yet
	TestDone    TestState = "done"
)

// Outcome is one finished test's reading.
type Outcome string

const (
	OutFine        Outcome = "fine"
	OutNear        Outcome = "near" // within the noise band of the threshold
	OutSlow        Outcome = "slow"
	OutError       Outcome = "error"       // no usable measurement
	OutNoBaseline  Outcome = "no_baseline" // measured, nothing to judge it by
	OutUnreachable Outcome = "unreachable" // a node disconnected
	OutRefused     Outcome = "refused"     // an agent refused (busy)
)

// TestRecord is one all_reduce test: planned, running or done.
type TestRecord struct {
	Seq     int     `json:"seq"` // 1.. in plan order; the test's id in its sweep
	Phase   Phase   `json:"phase"`
	Wave    int     `json:"wave"`
	Purpose Purpose `json:"purpose"`
	// Series groups a measurement and its repeats: single:NODE,
	// pair:A|B, loc:NODE, path:LEAF|LEAF, mutual:A|B.
	Series string `json:"series"`
	// Nodes run the test; Nodes[0] launches a multi-node run. For member
	// and leftover tests Nodes[0] is the node under test and Nodes[1] its
	// reference.
	Nodes []string `json:"nodes"`
	// Cross is set when a reference sits on another leaf than the node
	// under test (no reference was free on its own leaf).
	Cross string    `json:"cross,omitempty"`
	State TestState `json:"state"`
	// Attempts counts starts; more than one means a restart re-ran it.
	Attempts int       `json:"attempts"`
	Started  time.Time `json:"started,omitzero"`
	Ended    time.Time `json:"ended,omitzero"`

	Outcome   Outcome    `json:"outcome,omitempty"`
	GBps      float64    `json:"gbps,omitempty"`
	Baseline  *Reference `json:"baseline,omitempty"`
	Deviation float64    `json:"deviation,omitempty"`
	Band      float64    `json:"band,omitempty"`
	Error     string     `json:"error,omitempty"`
	// Lost names nodes found disconnected (unreachable) or busy (refused).
	Lost []string `json:"lost,omitempty"`
	// NotRun: the test never started, its Lost nodes' agents were not
	// connected within the connect grace after its turn came.
	NotRun bool `json:"not_run,omitempty"`
}

// DrainState is a drain request's life stage.
type DrainState string

const (
	DrainPlanned DrainState = "planned"
	DrainDone    DrainState = "done"
	DrainFailed  DrainState = "failed"
	DrainSkipped DrainState = "skipped" // no drain adapter
	DrainRefused DrainState = "refused" // the circuit breaker said no
)

// DrainRecord is one request to take a node out of service.
type DrainRecord struct {
	Node   string     `json:"node"`
	Reason string     `json:"reason"`
	State  DrainState `json:"state"`
	Error  string     `json:"error,omitempty"`
	At     time.Time  `json:"at"`
}

// Store keeps sweeps durably. Every method is one atomic write or read;
// the engine calls a write before acting on what it records.
type Store interface {
	// CreateSweep stores a new sweep (ErrExists when the id is taken).
	CreateSweep(ctx context.Context, r Record) error
	// Sweep returns one sweep (ErrNotFound).
	Sweep(ctx context.Context, id string) (Record, error)
	// Sweeps lists sweeps, newest first, without their reports.
	Sweeps(ctx context.Context) ([]Record, error)
	// SaveSelection rewrites the sweep's node selection (nodes tested,
	// unreachable, skipped, deferred) before its first round.
	SaveSelection(ctx context.Context, r Record) error
	// SavePlan records that the sweep moved to phase/wave and the tests
	// planned for it, in one transaction.
	SavePlan(ctx context.Context, id string, phase Phase, wave int, tests []TestRecord) error
	// SaveTest updates one test (started, finished).
	SaveTest(ctx context.Context, id string, t TestRecord) error
	// Tests returns the sweep's tests in Seq order.
	Tests(ctx context.Context, id string) ([]TestRecord, error)
	// SaveDrain records a drain request's state.
	SaveDrain(ctx context.Context, id string, d DrainRecord) error
	// Drains returns the sweep's drain requests in node order.
	Drains(ctx context.Context, id string) ([]DrainRecord, error)
	// Finish records the sweep's end: state, error, report, and that the
	// tested nodes were covered at ended (for rotation).
	Finish(ctx context.Context, id string, state State, errText string, rep *Report, covered []string, ended time.Time) error
	// Coverage returns when each node was last covered by a finished sweep.
	Coverage(ctx context.Context) (map[string]time.Time, error)
}

// MemStore is an in-memory Store for tests and simulations.
type MemStore struct {
	mu       sync.Mutex
	sweeps   map[string]Record
	tests    map[string][]TestRecord
	drains   map[string]map[string]DrainRecord
	coverage map[string]time.Time
}

var _ Store = (*MemStore)(nil)

// NewMemStore returns an empty store.
func NewMemStore() *MemStore {
	return &MemStore{
		sweeps:   map[string]Record{},
		tests:    map[string][]TestRecord{},
		drains:   map[string]map[string]DrainRecord{},
		coverage: map[string]time.Time{},
	}
}

// CreateSweep implements Store.
func (m *MemStore) CreateSweep(_ context.Context, r Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.sweeps[r.ID]; ok {
		return fmt.Errorf("create sweep %s: %w", r.ID, ErrExists)
	}
	m.sweeps[r.ID] = r
	return nil
}

// Sweep implements Store.
func (m *MemStore) Sweep(_ context.Context, id string) (Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.sweeps[id]
	if !ok {
		return Record{}, fmt.Errorf("sweep %s: %w", id, ErrNotFound)
	}
	return r, nil
}

// Sweeps implements Store.
func (m *MemStore) Sweeps(context.Context) ([]Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Record, 0, len(m.sweeps))
	for _, r := range m.sweeps {
		r.Report = nil
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.After(out[j].Created)
		}
		return out[i].ID > out[j].ID
	})
	return out, nil
}

// SaveSelection implements Store.
func (m *MemStore) SaveSelection(_ context.Context, r Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	old, ok := m.sweeps[r.ID]
	if !ok {
		return fmt.Errorf("sweep %s: %w", r.ID, ErrNotFound)
	}
	old.Nodes, old.Unreachable = slices.Clone(r.Nodes), slices.Clone(r.Unreachable)
	old.Skipped, old.Deferred = slices.Clone(r.Skipped), slices.Clone(r.Deferred)
	m.sweeps[r.ID] = old
	return nil
}

// SavePlan implements Store.
func (m *MemStore) SavePlan(_ context.Context, id string, phase Phase, wave int, tests []TestRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.sweeps[id]
	if !ok {
		return fmt.Errorf("save plan: sweep %s: %w", id, ErrNotFound)
	}
	r.Phase, r.Wave = phase, wave
	m.sweeps[id] = r
	for _, t := range tests {
		m.tests[id] = append(m.tests[id], cloneTest(t))
	}
	return nil
}

// SaveTest implements Store.
func (m *MemStore) SaveTest(_ context.Context, id string, t TestRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ts := m.tests[id]
	i := sort.Search(len(ts), func(i int) bool { return ts[i].Seq >= t.Seq })
	if i == len(ts) || ts[i].Seq != t.Seq {
		return fmt.Errorf("save test %d of sweep %s: %w", t.Seq, id, ErrNotFound)
	}
	ts[i] = cloneTest(t)
	return nil
}

// Tests implements Store.
func (m *MemStore) Tests(_ context.Context, id string) ([]TestRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.sweeps[id]; !ok {
		return nil, fmt.Errorf("tests: sweep %s: %w", id, ErrNotFound)
	}
	out := make([]TestRecord, len(m.tests[id]))
	for i, t := range m.tests[id] {
		out[i] = cloneTest(t)
	}
	return out, nil
}

// SaveDrain implements Store.
func (m *MemStore) SaveDrain(_ context.Context, id string, d DrainRecord) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.drains[id] == nil {
		m.drains[id] = map[string]DrainRecord{}
	}
	m.drains[id][d.Node] = d
	return nil
}

// Drains implements Store.
func (m *MemStore) Drains(_ context.Context, id string) ([]DrainRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []DrainRecord
	for _, d := range m.drains[id] {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// Finish implements Store.
func (m *MemStore) Finish(_ context.Context, id string, state State, errText string, rep *Report, covered []string, ended time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.sweeps[id]
	if !ok {
		return fmt.Errorf("finish: sweep %s: %w", id, ErrNotFound)
	}
	r.State, r.Error, r.Report, r.Ended = state, errText, rep, ended
	if state == StateDone {
		r.Phase = PhaseDone
	}
	m.sweeps[id] = r
	for _, n := range covered {
		if ended.After(m.coverage[n]) {
			m.coverage[n] = ended
		}
	}
	return nil
}

// Coverage implements Store.
func (m *MemStore) Coverage(context.Context) (map[string]time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]time.Time, len(m.coverage))
	for k, v := range m.coverage {
		out[k] = v
	}
	return out, nil
}

func cloneTest(t TestRecord) TestRecord {
	t.Nodes = slices.Clone(t.Nodes)
	t.Lost = slices.Clone(t.Lost)
	if t.Baseline != nil {
		b := *t.Baseline
		t.Baseline = &b
	}
	return t
}
