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

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/inspect"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Fixture is one real node report, analyzed once and converted to its wire
// form once. Every result a simulated agent sends carries the fixture's
// checks and inventory already encoded: the load generator shares the
// machine with the coordinator it measures, and marshalling ~350 metrics
// a result again and again cost it a fifth of the machine's CPU. The
// bytes are what marshalling the messages writes, so the coordinator
// reads the same results.
type Fixture struct {
	names     []string // the checks, in report order
	byName    map[string]*pb.CheckResult
	columns   map[string]*pb.CheckResult // the same, metrics as columns (protocol 1.2)
	inventory *pb.Inventory
	all       subset

	mu      sync.Mutex
	subsets map[string]subset // by the requested names, joined
}

// subset is the part of the report one request asks for.
type subset struct {
	checks []*pb.CheckResult
	status string
	full   bool              // every passive check: a "full result"
	wire   [2][]byte         // by wire.Form: checks and inventory as a pb.Result's encoded fields
	cols   []*pb.CheckResult // checks, metrics as columns
}

// Result's field numbers for the pre-encoded parts.
var (
	resultFields    = (&pb.Result{}).ProtoReflect().Descriptor().Fields()
	checksField     = resultFields.ByName("checks").Number()
	inventoryField  = resultFields.ByName("inventory").Number()
	marshalFixtures = proto.MarshalOptions{Deterministic: true}
)

// encode fills s.wire: each check, then the inventory, as length-delimited
// fields of a pb.Result, the encoding proto.Marshal gives them; in both
// forms of the metrics, for coordinators of either protocol.
func (s *subset) encode(inv *pb.Inventory) error {
	for form, checks := range [][]*pb.CheckResult{wire.Entries: s.checks, wire.Columns: s.cols} {
		b, err := encodeFields(checks, inv)
		if err != nil {
			return err
		}
		s.wire[form] = b
	}
	return nil
}

func encodeFields(checks []*pb.CheckResult, inv *pb.Inventory) ([]byte, error) {
	var b []byte
	for _, c := range checks {
		m, err := marshalFixtures.Marshal(c)
		if err != nil {
			return nil, fmt.Errorf("check %s: %w", c.GetName(), err)
		}
		b = protowire.AppendBytes(protowire.AppendTag(b, checksField, protowire.BytesType), m)
	}
	if inv != nil {
		m, err := marshalFixtures.Marshal(inv)
		if err != nil {
			return nil, fmt.Errorf("inventory: %w", err)
		}
		b = protowire.AppendBytes(protowire.AppendTag(b, inventoryField, protowire.BytesType), m)
	}
	return b, nil
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
	return NewFixture(&rep)
}

// NewFixture builds a fixture from a report whose checks are the passive ones.
func NewFixture(rep *report.Report) (*Fixture, error) {
	p := wire.ResultToProto(wire.Meta{}, rep, wire.Entries)
	cols := wire.ChecksToProto(rep.Checks, wire.Columns)
	f := &Fixture{byName: map[string]*pb.CheckResult{}, columns: map[string]*pb.CheckResult{}, inventory: p.GetInventory(),
		subsets: map[string]subset{}}
	for i, c := range p.GetChecks() {
		f.names = append(f.names, c.GetName())
		f.byName[c.GetName()] = c
		f.columns[c.GetName()] = cols[i]
	}
	f.all = subset{checks: p.GetChecks(), cols: cols, status: string(rep.Status), full: true}
	if err := f.all.encode(f.inventory); err != nil {
		return nil, err
	}
	return f, nil
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
		s.cols = append(s.cols, f.columns[n])
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
	if err := s.encode(f.inventory); err != nil {
		return subset{}, err
	}
	f.subsets[key] = s
	return s, nil
}

// result builds one wire result from a part of the fixture: its own
// fields, and the part's checks and inventory as encoded bytes (shared,
// only read), their metrics in the given form. Marshalled, it is the
// result with those messages in it.
func (f *Fixture) result(s subset, form wire.Form, id, node, workID string, now time.Time) *pb.Result {
	r := &pb.Result{
		Id:             id,
		Node:           node,
		WorkId:         workID,
		StartedUnixMs:  now.Add(-250 * time.Millisecond).UnixMilli(),
		FinishedUnixMs: now.UnixMilli(),
		Status:         s.status,
		Full:           s.full,
	}
	r.ProtoReflect().SetUnknown(s.wire[form])
	return r
}
