package coordinator

import (
	"context"
	"fmt"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// testServer starts a coordinator on loopback ports chosen by the kernel.
func testServer(t testing.TB, dir string, mod func(*Config)) *Server {
	t.Helper()
	cfg := Config{
		Listen:            "127.0.0.1:0",
		HTTPListen:        "127.0.0.1:0",
		DataDir:           dir,
		HeartbeatInterval: time.Second,
		Insecure:          true,
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg, Options{Logger: zerolog.Nop(), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(t, s) })
	return s
}

func stopServer(t testing.TB, s *Server) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
}

func dial(t testing.TB, s *Server) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func operator(t testing.TB, s *Server) pb.OperatorServiceClient {
	return pb.NewOperatorServiceClient(dial(t, s))
}

// fakeAgent is a minimal agent built on the generated client.
type fakeAgent struct {
	t       testing.TB
	node    string
	cc      *grpc.ClientConn
	cancel  context.CancelFunc
	stream  grpc.BidiStreamingClient[pb.AgentMessage, pb.CoordinatorMessage]
	welcome *pb.Welcome

	sendMu sync.Mutex
	in     chan *pb.CoordinatorMessage
	ended  chan struct{}
	endErr error // valid once ended is closed
	// onRun, when set, answers RunChecks from the receive goroutine.
	onRun func(a *fakeAgent, rc *pb.RunChecks)
}

type agentOpt func(*pb.Hello, *fakeAgent)

func withVersion(v string) agentOpt { return func(h *pb.Hello, _ *fakeAgent) { h.ProtocolVersion = v } }
func withLabels(l map[string]string) agentOpt {
	return func(h *pb.Hello, _ *fakeAgent) { h.Labels = l }
}
func onRun(f func(a *fakeAgent, rc *pb.RunChecks)) agentOpt {
	return func(_ *pb.Hello, a *fakeAgent) { a.onRun = f }
}

// connect opens a stream, says hello and waits for Welcome; the error is
// the stream's status when the coordinator refuses.
func connect(t testing.TB, s *Server, node string, opts ...agentOpt) (*fakeAgent, error) {
	t.Helper()
	return connectCreds(t, s, insecure.NewCredentials(), node, opts...)
}

// connectCreds is connect over the given transport credentials.
func connectCreds(t testing.TB, s *Server, creds credentials.TransportCredentials, node string, opts ...agentOpt) (*fakeAgent, error) {
	t.Helper()
	return connectAddr(t, s.GRPCAddr().String(), creds, node, opts...)
}

// connectAddr is connect to the coordinator at addr (one in another process).
func connectAddr(t testing.TB, addr string, creds credentials.TransportCredentials, node string, opts ...agentOpt) (*fakeAgent, error) {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &fakeAgent{t: t, node: node, cc: cc, cancel: cancel, in: make(chan *pb.CoordinatorMessage, 1024), ended: make(chan struct{})}
	t.Cleanup(a.close)
	hello := &pb.Hello{Node: node, ProtocolVersion: ProtocolVersion, AgentVersion: "test",
		Labels:        map[string]string{"sku": "h100"},
		EnabledChecks: []string{"gpu.ecc", "ib.ports"},
		Inventory:     &pb.Inventory{DriverVersion: "550.54.15", Gpus: []*pb.GPU{{Index: 0, Serial: "S0"}, {Index: 1, Serial: "S1"}}},
	}
	for _, o := range opts {
		o(hello, a)
	}
	a.stream, err = pb.NewAgentServiceClient(cc).Connect(ctx)
	if err != nil {
		return nil, err
	}
	if err := a.stream.Send(&pb.AgentMessage{Msg: &pb.AgentMessage_Hello{Hello: hello}}); err != nil {
		// A stream refused at once (authorization) says why on Recv.
		if _, rerr := a.stream.Recv(); rerr != nil {
			return nil, rerr
		}
		return nil, err
	}
	first, err := a.stream.Recv()
	if err != nil {
		return nil, err
	}
	a.welcome = first.GetWelcome()
	if a.welcome == nil {
		t.Fatalf("first message is %v, want Welcome", first)
	}
	go a.recv()
	return a, nil
}

func mustConnect(t testing.TB, s *Server, node string, opts ...agentOpt) *fakeAgent {
	t.Helper()
	a, err := connect(t, s, node, opts...)
	if err != nil {
		t.Fatalf("connect %s: %v", node, err)
	}
	return a
}

func (a *fakeAgent) recv() {
	defer close(a.ended)
	for {
		m, err := a.stream.Recv()
		if err != nil {
			a.endErr = err
			return
		}
		if rc := m.GetRunChecks(); rc != nil && a.onRun != nil {
			go a.onRun(a, rc)
			continue
		}
		select {
		case a.in <- m:
		default:
			a.t.Errorf("%s: inbox full", a.node)
		}
	}
}

func (a *fakeAgent) send(m *pb.AgentMessage) {
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	if err := a.stream.Send(m); err != nil && err != io.EOF {
		a.t.Errorf("%s: send: %v", a.node, err)
	}
}

func (a *fakeAgent) sendResult(r *pb.Result) {
	a.send(&pb.AgentMessage{Msg: &pb.AgentMessage_Result{Result: r}})
}

func (a *fakeAgent) heartbeat() {
	a.send(&pb.AgentMessage{Msg: &pb.AgentMessage_Heartbeat{Heartbeat: &pb.Heartbeat{UnixMs: time.Now().UnixMilli()}}})
}

func (a *fakeAgent) workStatus(work string, st pb.WorkStatus_State, reason, resultID string) {
	a.send(&pb.AgentMessage{Msg: &pb.AgentMessage_WorkStatus{WorkStatus: &pb.WorkStatus{WorkId: work, State: st, Reason: reason, ResultId: resultID}}})
}

// next returns the next message that is not a heartbeat.
func (a *fakeAgent) next(within time.Duration) *pb.CoordinatorMessage {
	a.t.Helper()
	t := time.NewTimer(within)
	defer t.Stop()
	for {
		select {
		case m := <-a.in:
			if m.GetHeartbeat() != nil {
				continue
			}
			return m
		case <-a.ended:
			a.t.Fatalf("%s: stream ended: %v", a.node, a.endErr)
		case <-t.C:
			a.t.Fatalf("%s: nothing within %s", a.node, within)
		}
	}
}

func (a *fakeAgent) ack(within time.Duration) *pb.Ack {
	a.t.Helper()
	m := a.next(within)
	if m.GetAck() == nil {
		a.t.Fatalf("%s: got %v, want an Ack", a.node, m)
	}
	return m.GetAck()
}

// waitEnd waits for the coordinator to end the stream and returns its status.
func (a *fakeAgent) waitEnd(within time.Duration) *status.Status {
	a.t.Helper()
	select {
	case <-a.ended:
		return status.Convert(a.endErr)
	case <-time.After(within):
		a.t.Fatalf("%s: stream still open after %s", a.node, within)
		return nil
	}
}

// close drops the connection the way a dying agent does.
func (a *fakeAgent) close() {
	a.cancel()
	a.cc.Close()
}

var resultSeq struct {
	sync.Mutex
	n int
}

// nextID numbers results; the number also spaces their finish times, so
// that "newest" is well defined however fast a test sends.
func nextID(prefix string) (string, int) {
	resultSeq.Lock()
	defer resultSeq.Unlock()
	resultSeq.n++
	return fmt.Sprintf("%s-%d", prefix, resultSeq.n), resultSeq.n
}

// result builds a full result; eccFail makes gpu.ecc fail on GPU3.
func result(node string, eccFail bool) *pb.Result {
	id, seq := nextID(node)
	now := time.Now().UnixMilli() + int64(seq)
	ecc := &pb.CheckResult{Name: "gpu.ecc", Status: "pass", DurationMs: 1.2, Metrics: wire.MetricsToProto(map[string]float64{"gpu3.ecc.dram_uncorrectable": 0})}
	st := "pass"
	if eccFail {
		st = "fail"
		ecc.Status = "fail"
		ecc.Findings = []*pb.Finding{{Severity: "fail", Component: "GPU3", Code: "ECC_UNCORRECTABLE", Message: "2 uncorrectable DRAM errors", Action: "replace"}}
		ecc.Metrics[0].Value = 2 // gpu3.ecc.dram_uncorrectable
	}
	return &pb.Result{Id: id, Node: node, StartedUnixMs: now - 100, FinishedUnixMs: now, Status: st, Full: true,
		Checks: []*pb.CheckResult{ecc, {Name: "ib.ports", Status: "pass"}}}
}

func nodeOf(t testing.TB, s *Server, name string) store.Node {
	t.Helper()
	n, err := s.Store().Node(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func stateIs(t testing.TB, s *Server, name, state string) func() bool {
	return func() bool {
		n, err := s.Store().Node(context.Background(), name)
		return err == nil && n.State == state
	}
}

func eventsOf(t testing.TB, s *Server, node string) []string {
	t.Helper()
	evs, err := s.Store().Events(context.Background(), store.EventQuery{Node: node, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		out = append(out, e.Kind+": "+e.Message)
	}
	return out
}

func hasEvent(events []string, part string) bool {
	for _, e := range events {
		if strings.Contains(e, part) {
			return true
		}
	}
	return false
}
