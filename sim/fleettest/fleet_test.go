package fleettest

import (
	"context"
	"fmt"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/proto/version"
)

// auditNode checks what the store holds for one node against what its
// agent saw and made: every result it saw acknowledged is stored; no
// result is stored twice (each holds exactly one row per check, and the
// daily summaries count each check once); and, with the agent stopped,
// every pass it made is stored or still in its spool. It returns the
// stored result ids.
func auditNode(t *testing.T, st *store.Store, n *node, checksPerResult int) map[string]int {
	t.Helper()
	rows := checkRows(t, st, n.name)
	for id, c := range rows {
		if c != checksPerResult {
			t.Errorf("%s: result %s has %d stored check rows, want %d (stored twice?)", n.name, id, c, checksPerResult)
		}
	}
	if got, want := summarized(t, st, n.name), checksPerResult*len(rows); got != want {
		t.Errorf("%s: daily summaries count %d check results, the store holds %d", n.name, got, want)
	}
	for _, id := range n.tap.ackedIDs() {
		if _, ok := rows[id]; !ok {
			t.Errorf("%s: result %s was acknowledged to the agent but is not stored", n.name, id)
		}
	}
	for id := range n.tap.sentIDs() {
		if _, ok := rows[id]; !ok && !slices.Contains(n.spooled(), id) {
			t.Errorf("%s: result %s was sent, is not stored and not spooled: lost", n.name, id)
		}
	}
	all := map[string]bool{}
	for id := range rows {
		all[id] = true
	}
	for _, id := range n.spooled() {
		all[id] = true
	}
	if passes, _, _ := n.m.read(); len(all) != passes {
		t.Errorf("%s: the agent made %d passes; %d distinct results are stored or spooled", n.name, passes, len(all))
	}
	return rows
}

// (a) A coordinator killed twice — once in steady state, once while the
// agents flush what they spooled while it was down — and restarted on the
// same data directory loses no acknowledged result and stores none twice.
func TestCoordinatorKilledMidRun(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	nodes := make([]*node, 3)
	for i := range nodes {
		nodes[i] = f.newNode(fmt.Sprintf("gpu-a%d", i), nil)
		nodes[i].start()
	}
	acked := func() int {
		n := 0
		for _, x := range nodes {
			n += x.tap.ackCount()
		}
		return n
	}
	testwait.Until(t, waitLong, "a result acknowledged to every agent", func() bool {
		for _, x := range nodes {
			if x.tap.ackCount() == 0 {
				return false
			}
		}
		return true
	})

	f.stopCoordinator(true)
	testwait.Until(t, waitLong, "two results spooled on every agent while the coordinator is down", func() bool {
		for _, x := range nodes {
			if _, sp, _ := x.m.read(); sp < 2 {
				return false
			}
		}
		return true
	})

	before := acked()
	f.startCoordinator()
	testwait.Until(t, waitLong, "the backlog being acknowledged", func() bool { return acked() > before })
	f.stopCoordinator(true) // mid-flush
	f.startCoordinator()

	testwait.Until(t, waitLong, "every spool drained after the second restart", func() bool {
		for _, x := range nodes {
			if _, sp, up := x.m.read(); sp != 0 || !up {
				return false
			}
		}
		return true
	})

	for _, x := range nodes {
		x.stop()
	}
	f.stopCoordinator(false)

	st := f.openStore()
	total := 0
	for _, x := range nodes {
		rows := auditNode(t, st, x, len(passiveChecks(t)))
		total += len(rows)
		if len(x.tap.ackedIDs()) == 0 {
			t.Errorf("%s: no acks seen", x.name)
		}
	}
	c, err := st.Count(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c.Results != total {
		t.Errorf("store holds %d results, the nodes' audits found %d", c.Results, total)
	}
	t.Logf("%d results stored from %d agents across two coordinator kills", total, len(nodes))
}

// (b) An agent that dies is marked unreachable, with an event; started
// again on the same state directory its node returns to the state its
// stored results give — failed for the faulty node, healthy for the other.
func TestAgentKilledUnreachableThenBack(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	sick := f.newNode("gpu-b1", nil, withFaults(sim.ECCUncorrectable{GPU: 3, Count: 2}))
	well := f.newNode("gpu-b2", nil)
	want := map[*node]string{sick: "failed", well: "healthy"}
	for x, state := range want {
		x.start()
		testwait.Until(t, waitLong, x.name+" "+state, stateIs(f.store, x.name, state))
	}

	for x, state := range want {
		x.kill()
		testwait.Until(t, waitLong, x.name+" unreachable", stateIs(f.store, x.name, "unreachable"))
		n := stateOf(t, f.store(), x.name)
		if n.Connected {
			t.Errorf("%s: unreachable but still marked connected", x.name)
		}
		if evs := events(t, f.store(), x.name); !hasEvent(evs, "state_change: "+state+" -> unreachable") {
			t.Errorf("%s: no state_change event to unreachable: %q", x.name, evs)
		}
	}

	for x, state := range want {
		x.start()
		testwait.Until(t, waitLong, x.name+" back to "+state, stateIs(f.store, x.name, state))
		// The state comes back from the stored results at reconnect, not
		// from a fresh pass: the event says so.
		if evs := events(t, f.store(), x.name); !hasEvent(evs, "state_change: unreachable -> "+state, "agent reconnected") {
			t.Errorf("%s: no event for the return: %q", x.name, evs)
		}
		if n := stateOf(t, f.store(), x.name); !n.Connected {
			t.Errorf("%s: back but not connected", x.name)
		}
	}
	op := f.operator()
	resp, err := op.ListNodes(context.Background(), &pb.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range resp.GetNodes() {
		if n.GetName() == sick.name && !slices.Contains(n.GetFailingChecks(), "gpu.ecc") {
			t.Errorf("%s failing checks %v, want gpu.ecc", n.GetName(), n.GetFailingChecks())
		}
	}
}

// (c) An agent cut off from the coordinator for a few passes keeps its
// results in the spool and delivers every one of them once the
// connection is back.
func TestConnectionCutKeepsResults(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	x := f.newNode("gpu-c1", nil)
	x.start()
	testwait.Until(t, waitLong, "a first result acknowledged", func() bool { return x.tap.ackCount() > 0 })

	cutAt := time.Now()
	x.gate.sever()
	testwait.Until(t, waitLong, "node unreachable while cut", stateIs(f.store, x.name, "unreachable"))
	p0, _, _ := x.m.read()
	testwait.Until(t, waitLong, "two more passes spooled while cut", func() bool {
		p, sp, up := x.m.read()
		return p >= p0+2 && sp >= 2 && !up
	})

	healAt := time.Now()
	x.gate.heal()

	testwait.Until(t, waitLong, "spool drained after the cut", func() bool {
		_, sp, up := x.m.read()
		return sp == 0 && up
	})

	testwait.Until(t, waitLong, "node healthy again", stateIs(f.store, x.name, "healthy"))
	x.stop()

	rows := auditNode(t, f.store(), x, len(passiveChecks(t)))
	during := 0
	for id := range rows {
		r, err := f.store().Result(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if r.Finished.After(cutAt) && r.Finished.Before(healAt) {
			during++
			if !r.Stored.After(healAt) {
				t.Errorf("result %s made during the cut was stored at %s, before the heal at %s", id, r.Stored, healAt)
			}
		}
	}
	if during < 2 {
		t.Errorf("%d results made during the cut are stored, want at least 2", during)
	}
}

// (d) A result sent again — on the same stream, several copies at once,
// and after a reconnect although the welcome lists it as known — is stored
// once and answered with the original ack every time. Another node reusing
// its id is refused.
func TestDuplicateResultStoredOnce(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	cc, err := grpc.NewClient(f.address(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	open := func(node string) (pb.AgentService_ConnectClient, *pb.Welcome, context.CancelFunc) {
		ctx, cancel := context.WithTimeout(context.Background(), waitLong)
		s, err := pb.NewAgentServiceClient(cc).Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		hello := &pb.Hello{Node: node, ProtocolVersion: version.Protocol, AgentVersion: "fleettest"}
		if err := s.Send(&pb.AgentMessage{Msg: &pb.AgentMessage_Hello{Hello: hello}}); err != nil {
			t.Fatal(err)
		}
		m, err := s.Recv()
		if err != nil || m.GetWelcome() == nil {
			t.Fatalf("welcome: %v %v", m, err)
		}
		return s, m.GetWelcome(), cancel
	}
	send := func(s pb.AgentService_ConnectClient, r *pb.Result) {
		if err := s.Send(&pb.AgentMessage{Msg: &pb.AgentMessage_Result{Result: r}}); err != nil {
			t.Fatal(err)
		}
	}
	acks := func(s pb.AgentService_ConnectClient, n int) []*pb.Ack {
		var out []*pb.Ack
		for len(out) < n {
			m, err := s.Recv()
			if err != nil {
				t.Fatalf("after %d of %d acks: %v", len(out), n, err)
			}
			if a := m.GetAck(); a != nil {
				out = append(out, a)
			}
		}
		return out
	}
	now := time.Now().UnixMilli()
	result := func(id string) *pb.Result {
		return &pb.Result{Id: id, Node: "gpu-d1", StartedUnixMs: now - 40, FinishedUnixMs: now, Status: "fail", Full: true,
			Checks: []*pb.CheckResult{
				{Name: "gpu.ecc", Status: "fail", DurationMs: 1.5, Metrics: wire.MetricsToProto(map[string]float64{"gpu3.ecc.dram_uncorrectable": 2}),
					Findings: []*pb.Finding{{Severity: "fail", Component: "GPU3", Code: "ECC_UNCORRECTABLE", Message: "2 uncorrectable", Action: "drain"}}},
				{Name: "ib.ports", Status: "pass", DurationMs: 0.4},
			}}
	}

	s1, _, cancel1 := open("gpu-d1")
	send(s1, result("dup-1"))
	first := acks(s1, 1)[0]
	if first.GetDuplicate() || first.GetRefused() != "" || first.GetStoredUnixMs() == 0 {
		t.Fatalf("first ack: %v", first)
	}
	send(s1, result("dup-1"))
	if again := acks(s1, 1)[0]; !again.GetDuplicate() || again.GetStoredUnixMs() != first.GetStoredUnixMs() {
		t.Errorf("resend on the same stream: %v, want the original ack (stored %d) marked duplicate", again, first.GetStoredUnixMs())
	}
	// Five copies back to back: stored concurrently, most likely in one
	// batch; exactly one is new, all carry the same stored time.
	for range 5 {
		send(s1, result("dup-2"))
	}
	burst := acks(s1, 5)
	fresh := 0
	for _, a := range burst {
		if !a.GetDuplicate() {
			fresh++
		}
		if a.GetResultId() != "dup-2" || a.GetStoredUnixMs() != burst[0].GetStoredUnixMs() {
			t.Errorf("burst ack %v differs from %v", a, burst[0])
		}
	}
	if fresh != 1 {
		t.Errorf("%d of 5 copies acked as new, want 1", fresh)
	}
	cancel1()

	// A reconnect: the welcome knows both; a resend anyway is a duplicate.
	s2, welcome, cancel2 := open("gpu-d1")
	defer cancel2()
	for _, id := range []string{"dup-1", "dup-2"} {
		if !slices.Contains(welcome.GetKnownResultIds(), id) {
			t.Errorf("welcome after reconnect does not list %s: %v", id, welcome.GetKnownResultIds())
		}
	}
	send(s2, result("dup-1"))
	if a := acks(s2, 1)[0]; !a.GetDuplicate() || a.GetStoredUnixMs() != first.GetStoredUnixMs() {
		t.Errorf("resend after reconnect: %v, want the original ack", a)
	}

	// Another node reusing the id is refused, not stored, not acked as its own.
	s3, _, cancel3 := open("gpu-d2")
	defer cancel3()
	stolen := result("dup-1")
	stolen.Node = "gpu-d2"
	send(s3, stolen)
	if a := acks(s3, 1)[0]; a.GetRefused() == "" {
		t.Errorf("another node's id: %v, want refused", a)
	}

	st := f.store()
	rows := checkRows(t, st, "gpu-d1")
	if len(rows) != 2 || rows["dup-1"] != 2 || rows["dup-2"] != 2 {
		t.Errorf("stored check rows per result: %v, want 2 each for dup-1 and dup-2", rows)
	}
	if n := summarized(t, st, "gpu-d1"); n != 4 {
		t.Errorf("summaries count %d check results, want 4", n)
	}
	if rows := checkRows(t, st, "gpu-d2"); len(rows) != 0 {
		t.Errorf("gpu-d2 has stored results %v", rows)
	}
	if r, err := st.Result(context.Background(), "dup-1"); err != nil || r.Node != "gpu-d1" {
		t.Errorf("dup-1: %+v %v", r, err)
	}
}

// (d, real agent) An agent restarted before the acks of results the
// coordinator stored reached it resends them (its welcome, here, does not
// list them as known): the coordinator answers each resend with the
// original ack marked duplicate, and each result is stored once.
func TestAgentRestartBeforeAcksStoresOnce(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	x := f.newNode("gpu-d3", nil)
	x.tap.dropAcks.Store(true) // the coordinator stores and acks; the acks are lost
	x.tap.forgetKnown.Store(true)
	x.start()
	testwait.Until(t, waitLong, "two results sent, their acks lost", func() bool {
		return len(x.tap.sentIDs()) >= 2
	})

	sent := x.tap.sentIDs()
	testwait.Until(t, waitLong, "the sent results stored", func() bool {
		rows := checkRows(t, f.store(), x.name)
		for id := range sent {
			if rows[id] == 0 {
				return false
			}
		}
		return true
	})

	x.stop()
	spooled := x.spooled()
	for id := range sent {
		if !slices.Contains(spooled, id) {
			t.Fatalf("result %s left the spool without an ack", id)
		}
	}

	x.tap.dropAcks.Store(false)
	x.start()
	testwait.Until(t, waitLong, "spool drained after the restart", func() bool {
		_, sp, up := x.m.read()
		return sp == 0 && up
	})

	x.stop()
	auditNode(t, f.store(), x, len(passiveChecks(t)))
	again := x.tap.sentIDs()
	for id, n := range sent {
		if again[id] <= n {
			t.Errorf("result %s was not resent after the restart", id)
		}
		if !x.tap.ackedAsDuplicate(id) {
			t.Errorf("resent result %s was not acked as a duplicate", id)
		}
	}
}

// (e) A fleet-wide RunCheck over 16 agents, three of them with a fault,
// reports fail on exactly those three (naming the check and the finding)
// and pass on the others, each with the result it stored for the work.
func TestFleetWideRunCheck(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	type fault struct {
		f           sim.Fault
		check, code string
	}
	faults := map[string]fault{
		"gpu-e03": {sim.ECCUncorrectable{GPU: 3, Count: 2}, "gpu.ecc", "ECC_UNCORRECTABLE"},
		"gpu-e07": {sim.IBPortDown{HCA: "mlx5_4"}, "ib.ports", "IB_PORT_DOWN"},
		"gpu-e11": {sim.GPUMissing{GPU: 5}, "gpu.inventory", "GPU_MISSING_FROM_DRIVER"},
	}
	shared := sim.NewShared()
	for i := range 16 {
		name := fmt.Sprintf("gpu-e%02d", i)
		opts := []nodeOpt{every(time.Hour)} // one scheduled pass; the rest is on request
		if ft, ok := faults[name]; ok {
			opts = append(opts, withFaults(ft.f))
		}
		f.newNode(name, withShared(shared), opts...).start()
	}
	op := f.operator()
	// One deadline for the whole test, not one wait's: the fleet coming up
	// may take most of waitLong on a loaded machine, and the runs below
	// (15 s each at most) must still have their time.
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitLong+time.Minute)
	defer cancel()
	testwait.Until(t, waitLong, "16 nodes connected, each with a first result", func() bool {
		resp, err := op.ListNodes(ctx, &pb.ListNodesRequest{})
		if err != nil || len(resp.GetNodes()) != 16 {
			return false
		}
		for _, n := range resp.GetNodes() {
			if !n.GetConnected() || n.GetState() == "initializing" {
				return false
			}
		}
		return true
	})

	stream, err := op.RunCheck(ctx, &pb.RunCheckRequest{Selector: "", Checks: passiveChecks(t), TimeoutMs: 15000})
	if err != nil {
		t.Fatal(err)
	}
	var final *pb.RunCheckProgress
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if p.GetFinal() {
			final = p
		}
	}
	if final == nil {
		t.Fatal("no final progress")
	}
	if final.GetTotal() != 16 || final.GetDone() != 16 || final.GetFailed() != 3 ||
		final.GetRefused() != 0 || final.GetUnreachable() != 0 || final.GetTimedOut() != 0 {
		t.Errorf("final progress: total %d done %d failed %d refused %d unreachable %d timed out %d; want 16/16/3/0/0/0",
			final.GetTotal(), final.GetDone(), final.GetFailed(), final.GetRefused(), final.GetUnreachable(), final.GetTimedOut())
	}
	if len(final.GetOutcomes()) != 16 {
		t.Fatalf("%d outcomes, want 16", len(final.GetOutcomes()))
	}
	for _, o := range final.GetOutcomes() {
		want := "pass"
		ft, faulty := faults[o.GetNode()]
		if faulty {
			want = "fail"
		}
		if o.GetStatus() != want {
			t.Errorf("%s: outcome %s (%s), want %s", o.GetNode(), o.GetStatus(), o.GetReason(), want)
		}
		if faulty && (!strings.Contains(o.GetReason(), ft.check+" fail") || !strings.Contains(o.GetReason(), ft.code)) {
			t.Errorf("%s: reason %q, want it to name %s and %s", o.GetNode(), o.GetReason(), ft.check, ft.code)
		}
		r, err := f.store().Result(ctx, o.GetResultId())
		if err != nil || r.WorkID != final.GetWorkId() || r.Node != o.GetNode() {
			t.Errorf("%s: outcome result %q: %+v %v; want it stored for work %s", o.GetNode(), o.GetResultId(), r, err, final.GetWorkId())
		}
	}

	// The fleet table agrees.
	resp, err := op.ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range resp.GetNodes() {
		ft, faulty := faults[n.GetName()]
		switch {
		case faulty && (n.GetState() != "failed" || !slices.Contains(n.GetFailingChecks(), ft.check)):
			t.Errorf("%s: state %s failing %v, want failed on %s", n.GetName(), n.GetState(), n.GetFailingChecks(), ft.check)
		case !faulty && n.GetState() != "healthy":
			t.Errorf("%s: state %s (%s), want healthy", n.GetName(), n.GetState(), n.GetStateReason())
		}
	}

	// A selector narrows the run.
	stream, err = op.RunCheck(ctx, &pb.RunCheckRequest{Selector: "name in (gpu-e03,gpu-e04)", Checks: []string{"gpu.ecc"}, TimeoutMs: 15000})
	if err != nil {
		t.Fatal(err)
	}
	final = nil
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		final = p
	}
	got := map[string]string{}
	for _, o := range final.GetOutcomes() {
		got[o.GetNode()] = o.GetStatus()
	}
	if len(got) != 2 || got["gpu-e03"] != "fail" || got["gpu-e04"] != "pass" {
		t.Errorf("selector run outcomes %v, want gpu-e03 fail and gpu-e04 pass", got)
	}
}
