package loadgen

import (
	"context"
	"errors"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/protobuf/proto"

	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

func fixture(t *testing.T) *Fixture {
	t.Helper()
	fx, err := LoadFixture(context.Background(), "../../examples/bundles/h100-healthy")
	if err != nil {
		t.Fatal(err)
	}
	return fx
}

// A small fleet against a real coordinator: every agent connects and has
// its first result acked, a fleet-wide check completes on every node with
// the results the agents saw acked, and sustained sending stores results.
func TestFleetAgainstCoordinator(t *testing.T) {
	t.Parallel()
	srv, err := coordinator.New(coordinator.Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(),
		Insecure: true, HeartbeatInterval: time.Second}, coordinator.Options{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(context.Background())
	addr := srv.GRPCAddr().String()
	fx := fixture(t)

	const n = 12
	fleet, err := Start(ctx, Config{Addr: addr, Agents: n, AgentsPerConn: 4, Window: 2, Fixture: fx, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	if err := fleet.PassAll(ctx); err != nil {
		t.Fatal(err)
	}
	if c := fleet.Counters(); c.Acked != n || c.CheckResults != int64(n*len(fx.Checks())) {
		t.Errorf("after connecting: %+v, want %d results acked", c, n)
	}
	// The coordinator stored what the pre-encoded results carry: every
	// check with its metrics, and the inventory.
	nodes, err := srv.Store().Nodes(ctx)
	if err != nil || len(nodes) != n {
		t.Fatalf("stored nodes: %d, %v", len(nodes), err)
	}
	for _, nd := range nodes {
		if len(nd.Inventory.GPUs) != 8 || len(nd.Checks) != len(fx.Checks()) {
			t.Errorf("%s stored with %d GPUs and %d checks", nd.Name, len(nd.Inventory.GPUs), len(nd.Checks))
		}
	}
	rows, err := srv.Store().ChecksAfter(ctx, 0, 0, 1000, store.ChecksRead{})
	if err != nil || len(rows) != n*len(fx.Checks()) {
		t.Fatalf("stored check results: %d, %v", len(rows), err)
	}
	metrics := 0
	for _, r := range rows {
		metrics += len(r.Check.Metrics)
	}
	if metrics < 300*n {
		t.Errorf("%d metrics stored for %d results", metrics, n)
	}

	op, err := DialOperator(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	if err := op.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	run, err := op.RunCheck(ctx, "", fx.Checks(), 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if f := run.Final; f.GetTotal() != n || f.GetDone() != n || f.GetFailed() != 0 || f.GetRefused() != 0 {
		t.Fatalf("fleet-wide check: %v", f)
	}
	for _, o := range run.Final.GetOutcomes() {
		if o.GetStatus() != fx.Status() || o.GetResultId() == "" {
			t.Errorf("%s: outcome %v, want %s with a result", o.GetNode(), o, fx.Status())
		}
	}
	testwait.Until(t, 20*time.Second, "work results acked at the agents", func() bool {
		got, _ := fleet.WorkAcked(run.Final.GetWorkId())
		return got == n
	})

	// A check the fixture does not have is refused, as an agent would.
	run, err = op.RunCheck(ctx, "", []string{"gpu.ecc", "no.such.check"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if run.Final.GetRefused() != n {
		t.Errorf("unknown check: %v, want every node to refuse", run.Final)
	}

	st, err := fleet.Sustain(ctx, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if st.Results == 0 || st.CheckResults != st.Results*int64(len(fx.Checks())) {
		t.Errorf("sustained: %+v", st)
	}
	if err := fleet.Lost(); err != nil {
		t.Error(err)
	}
	c := fleet.Counters()
	if c.Refused != 0 || c.Sent != c.Acked+c.Duplicates {
		t.Errorf("counters %+v: every result sent must be acked", c)
	}
}

func TestFixtureParts(t *testing.T) {
	t.Parallel()
	fx := fixture(t)
	if len(fx.Checks()) != 13 || fx.Status() != "pass" {
		t.Fatalf("fixture: %d checks, %s", len(fx.Checks()), fx.Status())
	}
	all, err := fx.pick(nil)
	if err != nil || !all.full || len(all.checks) != 13 {
		t.Fatalf("all checks: %+v %v", all, err)
	}
	// Asked in any order, answered in report order, once each.
	part, err := fx.pick([]string{"ib.ports", "gpu.ecc", "ib.ports"})
	if err != nil || part.full || len(part.checks) != 2 || part.checks[0].GetName() != "gpu.ecc" {
		t.Fatalf("part: %+v %v", part, err)
	}
	if _, err := fx.pick([]string{"gpu.ecc", "rm -rf /"}); err == nil {
		t.Error("an unknown check was not refused")
	}
	// What goes on the wire is the result with the part's messages in it,
	// byte for byte what marshalling them writes.
	now := time.Now()
	for _, c := range []struct {
		sub  subset
		form wire.Form
	}{{part, wire.Entries}, {all, wire.Entries}, {part, wire.Columns}, {all, wire.Columns}} {
		sub := c.sub
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(fx.result(sub, c.form, "id-1", "n1", "w1", now))
		if err != nil {
			t.Fatal(err)
		}
		var r pb.Result
		if err := proto.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		if r.GetId() != "id-1" || r.GetWorkId() != "w1" || len(r.GetChecks()) != len(sub.checks) || r.GetInventory() == nil ||
			r.GetFull() != sub.full || len(r.ProtoReflect().GetUnknown()) != 0 {
			t.Errorf("result: %v", &r)
		}
		checks := sub.checks
		if c.form == wire.Columns {
			checks = sub.cols
			// Either form, a coordinator reads the same checks.
			if got, want := wire.ChecksFromProto(r.GetChecks()), wire.ChecksFromProto(sub.checks); !reflect.DeepEqual(got, want) {
				t.Errorf("columns read as\n%v\nnot\n%v", got, want)
			}
		}
		want := &pb.Result{Id: "id-1", Node: "n1", WorkId: "w1", StartedUnixMs: now.Add(-250 * time.Millisecond).UnixMilli(),
			FinishedUnixMs: now.UnixMilli(), Status: sub.status, Checks: checks, Inventory: fx.inventory, Full: sub.full}
		if !proto.Equal(&r, want) {
			t.Errorf("the encoded result reads back as\n%v\nnot\n%v", &r, want)
		}
	}
}

func TestLoopbackOnly(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"10.0.0.1:7443", "localhost:7443", "[::1]:7443", "0.0.0.0:7443", "127.0.0.1"} {
		if err := Loopback(addr); err == nil {
			t.Errorf("%s accepted", addr)
		}
	}
	if err := Loopback("127.0.0.1:7443"); err != nil {
		t.Error(err)
	}
	_, err := Start(context.Background(), Config{Addr: "192.0.2.1:7443", Agents: 1, Fixture: &Fixture{}})
	if !errors.Is(err, ErrNotLoopback) {
		t.Errorf("Start to another address: %v", err)
	}
	if _, err := DialOperator("192.0.2.1:7443"); !errors.Is(err, ErrNotLoopback) {
		t.Errorf("operator to another address: %v", err)
	}
}

func TestProcReadings(t *testing.T) {
	t.Parallel()
	p, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.RSSKiB <= 0 || p.CPU < 0 {
		t.Errorf("own reading %+v", p)
	}
	m, err := ReadMachine()
	if err != nil {
		t.Fatal(err)
	}
	if m.Total <= 0 || m.Busy < 0 || m.Busy > m.Total || m.CPUs < 1 || m.Load1 < 0 {
		t.Errorf("machine reading %+v", m)
	}
	if lim, err := RaiseFileLimit(); err != nil || lim == 0 {
		t.Errorf("file limit %d: %v", lim, err)
	}
}

func TestParseLoadAvg(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"0.42 0.61 0.50 1/123 4567\n", 0.42, true},
		{"17.06 13.48 8.55 40/900 1234", 17.06, true},
		{"", 0, false},
		{"-1 0 0 1/1 1", 0, false},
		{"load 0 0", 0, false},
	} {
		got, err := parseLoadAvg(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseLoadAvg(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
