package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/proto/version"
)

// sim is one simulated agent: one stream, the protocol's obligations, and
// nothing else.
type sim struct {
	fleet  *Fleet
	name   string
	stream grpc.BidiStreamingClient[pb.AgentMessage, pb.CoordinatorMessage]
	cancel context.CancelFunc
	every  time.Duration
	form   wire.Form // how results' metrics travel, columns when the welcome says the coordinator reads them

	sendMu sync.Mutex // a gRPC stream takes one writer at a time

	mu      sync.Mutex
	pending map[string]pending // sent, not acked yet
	window  chan struct{}      // one token per unacked result in sustained mode
}

// pending is what an ack settles.
type pending struct {
	workID  string
	checks  int
	sent    time.Time
	sustain bool
}

// hello builds the agent's hello: a node of the fixture's shape.
func (f *Fleet) hello(name string, i int) *pb.Hello {
	return &pb.Hello{
		Node:            name,
		ProtocolVersion: version.Protocol,
		AgentVersion:    "loadgen",
		Labels:          map[string]string{"sku": "h100", "rack": fmt.Sprintf("r%03d", i/32)},
		Inventory:       f.fx.inventory,
		EnabledChecks:   f.fx.names,
		Activity:        pb.NodeActivity_NODE_ACTIVITY_IDLE,
	}
}

// connect opens the stream, says hello and waits for the welcome.
func (f *Fleet) connect(ctx context.Context, cc *grpc.ClientConn, name string, i int) (*sim, error) {
	sctx, cancel := context.WithCancel(f.ctx)
	stream, err := pb.NewAgentServiceClient(cc).Connect(sctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("%s: open stream: %w", name, err)
	}
	if err := stream.Send(&pb.AgentMessage{Msg: &pb.AgentMessage_Hello{Hello: f.hello(name, i)}}); err != nil {
		cancel()
		return nil, fmt.Errorf("%s: hello: %w", name, err)
	}
	// The welcome must come while ctx (the connect phase's deadline) lives.
	type recv struct {
		m   *pb.CoordinatorMessage
		err error
	}
	got := make(chan recv, 1)
	go func() {
		m, err := stream.Recv()
		got <- recv{m, err}
	}()
	var r recv
	select {
	case r = <-got:
	case <-ctx.Done():
		cancel()
		return nil, fmt.Errorf("%s: no welcome: %w", name, ctx.Err())
	}
	if r.err != nil {
		cancel()
		return nil, fmt.Errorf("%s: welcome: %w", name, r.err)
	}
	w := r.m.GetWelcome()
	if w == nil {
		cancel()
		return nil, fmt.Errorf("%s: first message %T, want a welcome", name, r.m.GetMsg())
	}
	s := &sim{
		fleet:   f,
		name:    name,
		stream:  stream,
		cancel:  cancel,
		every:   time.Duration(w.GetHeartbeatIntervalMs()) * time.Millisecond,
		pending: map[string]pending{},
		window:  make(chan struct{}, f.cfg.Window),
	}
	if w.GetMetricColumns() {
		s.form = wire.Columns
	}
	if s.every <= 0 {
		s.every = 10 * time.Second
	}
	f.wg.Add(2)
	go s.recvLoop(sctx)
	go s.heartbeats(sctx)
	return s, nil
}

func (s *sim) send(m *pb.AgentMessage) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.stream.Send(m)
}

// sendResult sends one result built from the fixture and remembers it
// until its ack comes.
func (s *sim) sendResult(sub subset, workID string, sustain bool) (string, error) {
	now := time.Now()
	id := agent.NewResultID(now)
	r := s.fleet.fx.result(sub, s.form, id, s.name, workID, now)
	s.mu.Lock()
	s.pending[id] = pending{workID: workID, checks: len(sub.checks), sent: now, sustain: sustain}
	s.mu.Unlock()
	s.fleet.sent.Add(1)
	if err := s.send(&pb.AgentMessage{Msg: &pb.AgentMessage_Result{Result: r}}); err != nil {
		return id, err
	}
	return id, nil
}

// recvLoop reads the coordinator's messages until the stream ends.
func (s *sim) recvLoop(ctx context.Context) {
	defer s.fleet.wg.Done()
	for {
		m, err := s.stream.Recv()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, io.EOF) {
				s.fleet.lost(s.name, err)
			}
			return
		}
		switch x := m.GetMsg().(type) {
		case *pb.CoordinatorMessage_Ack:
			s.onAck(x.Ack)
		case *pb.CoordinatorMessage_RunChecks:
			// Answered on its own goroutine, as an agent runs requested
			// checks: the receiver never waits on the sender.
			go s.onRunChecks(x.RunChecks)
		}
	}
}

func (s *sim) onAck(a *pb.Ack) {
	now := time.Now()
	s.mu.Lock()
	p, ok := s.pending[a.GetResultId()]
	delete(s.pending, a.GetResultId())
	s.mu.Unlock()
	if !ok {
		return
	}
	if p.sustain {
		<-s.window
	}
	s.fleet.acked(p, a, now)
}

// onRunChecks answers like an agent: ACCEPTED at once, then the result
// carrying the work id, then DONE naming it. Unknown checks are refused.
func (s *sim) onRunChecks(rc *pb.RunChecks) {
	workID := rc.GetWorkId()
	sub, err := s.fleet.fx.pick(rc.GetChecks())
	if err != nil {
		_ = s.send(workStatus(workID, pb.WorkStatus_STATE_REFUSED, err.Error(), ""))
		return
	}
	if err := s.send(workStatus(workID, pb.WorkStatus_STATE_ACCEPTED, "", "")); err != nil {
		return
	}
	id, err := s.sendResult(sub, workID, false)
	if err != nil {
		return
	}
	_ = s.send(workStatus(workID, pb.WorkStatus_STATE_DONE, "", id))
}

func workStatus(workID string, st pb.WorkStatus_State, reason, resultID string) *pb.AgentMessage {
	return &pb.AgentMessage{Msg: &pb.AgentMessage_WorkStatus{WorkStatus: &pb.WorkStatus{
		WorkId: workID, State: st, Reason: reason, ResultId: resultID,
	}}}
}

// heartbeats sends one heartbeat per welcome interval, starting at a random
// point of the first interval so that a fleet that connected together does
// not beat together.
func (s *sim) heartbeats(ctx context.Context) {
	defer s.fleet.wg.Done()
	t := time.NewTimer(rand.N(s.every))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(s.every)
		s.mu.Lock()
		depth := len(s.pending)
		s.mu.Unlock()
		hb := &pb.Heartbeat{UnixMs: time.Now().UnixMilli(), Activity: pb.NodeActivity_NODE_ACTIVITY_IDLE, SpoolDepth: uint32(depth)}
		if err := s.send(&pb.AgentMessage{Msg: &pb.AgentMessage_Heartbeat{Heartbeat: hb}}); err != nil {
			return
		}
	}
}

// sustain sends full results as fast as the window of unacked ones allows,
// until ctx ends.
func (s *sim) sustain(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case s.window <- struct{}{}:
		}
		if _, err := s.sendResult(s.fleet.fx.all, "", true); err != nil {
			return
		}
	}
}
