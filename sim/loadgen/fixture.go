// Package loadgen simulates a large fleet of agents against a real
// coordinator: each simulated agent opens its own gRPC stream and speaks
// the real protocol through the generated client — Hello, heartbeats at the
// welcome's interval, results that wait for their acks, RunChecks answered
// with ACCEPTED, the result carrying the work id, then DONE — without
// running a full agent.Agent per node, which ten thousand of would not fit
// on one machine. Results are real: a captured bundle is analyzed once, and
// every agent replays that report under fresh result ids.
//
// It talks to 127.0.0.1 only. cmd/fleetcheck-loadgen drives it and
// scripts/bench-fleet.sh measures the coordinator with it (docs/scale.md).
package loadgen

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/inspect"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Fixture is one real node report, analyzed once and converted to its wire
// form once. Every result a simulated agent sends shares the fixture's
// check and inventory messages: they are only read (marshalled), never
// changed, which protobuf allows from many goroutines at once.
type Fixture struct {
	names     []string // the checks, in report order
	byName    map[string]*pb.CheckResult
	inventory *pb.Inventory
	all       subset

	mu      sync.Mutex
	subsets map[string]subset // by the requested names, joined
}

// subset is the part of the report one request asks for.
type subset struct {
	checks []*pb.CheckResult
	status string
	full   bool // every passive check: a "full result"
}

// LoadFixture analyzes the bundle at dir (a directory or .tar.gz) with every
// passive check, as `fleetcheck analyze` does.
func LoadFixture(ctx context.Context, dir string) (*Fixture, error) {
	b, err := bundle.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("load fixture: %w", err)
	}
	list, err := checks.Select(registry.All(), nil, false)
	if err != nil {
		return nil, fmt.Errorf("load fixture: %w", err)
	}
	rep := inspect.Run(ctx, b, inspect.Options{Checks: list}).Report
	return NewFixture(&rep), nil
}

// NewFixture builds a fixture from a report whose checks are the passive ones.
func NewFixture(rep *report.Report) *Fixture {
	p := wire.ResultToProto(wire.Meta{}, rep)
	f := &Fixture{byName: map[string]*pb.CheckResult{}, inventory: p.GetInventory(), subsets: map[string]subset{}}
	for _, c := range p.GetChecks() {
		f.names = append(f.names, c.GetName())
		f.byName[c.GetName()] = c
	}
	f.all = subset{checks: p.GetChecks(), status: string(rep.Status), full: true}
	return f
}

// Checks names the fixture's checks, in report order.
func (f *Fixture) Checks() []string { return slices.Clone(f.names) }

// Status is the fixture report's status.
func (f *Fixture) Status() string { return f.all.status }

// pick returns the fixture's part for a request's names (none: all of
// them). Unknown names are refused, as a real agent refuses them.
func (f *Fixture) pick(names []string) (subset, error) {
	if len(names) == 0 {
		return f.all, nil
	}
	key := strings.Join(names, ",")
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.subsets[key]; ok {
		return s, nil
	}
	var s subset
	st := report.Status("")
	for _, n := range f.names { // report order, each once
		if !slices.Contains(names, n) {
			continue
		}
		c := f.byName[n]
		s.checks = append(s.checks, c)
		st = report.Worse(st, report.Status(c.GetStatus()))
	}
	for _, n := range names {
		if _, ok := f.byName[n]; !ok {
			return subset{}, fmt.Errorf("unknown check %q", n)
		}
	}
	if st == "" {
		st = report.Pass
	}
	s.status = string(st)
	s.full = len(s.checks) == len(f.names)
	f.subsets[key] = s
	return s, nil
}

// result builds one wire result from a part of the fixture. The message is
// new; what it points to is shared.
func (f *Fixture) result(s subset, id, node, workID string, now time.Time) *pb.Result {
	return &pb.Result{
		Id:             id,
		Node:           node,
		WorkId:         workID,
		StartedUnixMs:  now.Add(-250 * time.Millisecond).UnixMilli(),
		FinishedUnixMs: now.UnixMilli(),
		Status:         s.status,
		Checks:         s.checks,
		Inventory:      f.inventory,
		Full:           s.full,
	}
}
