package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/agent/spool"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/proto/version"
)

// Stream errors, tested with errors.Is.
var (
	// ErrRefused: the coordinator refused the hello (FailedPrecondition).
	ErrRefused = errors.New("coordinator refused the agent")
	// ErrNotAuthorized: the coordinator refused this agent's identity
	// (PermissionDenied, Unauthenticated): a certificate for another node
	// or domain. Retrying cannot help until someone fixes it.
	ErrNotAuthorized = errors.New("coordinator refused this agent's identity")
	// errHelloTimeout: no welcome within the hello timeout.
	errHelloTimeout = errors.New("no welcome from the coordinator in time")
	// errSilent: nothing heard for three heartbeat intervals (half-open connection).
	errSilent = errors.New("coordinator silent for three heartbeat intervals")
	// errAckTimeout: a sent result went unacknowledged too long.
	errAckTimeout = errors.New("result not acknowledged in time")
)

// defaultHeartbeat applies when the welcome names no interval.
const defaultHeartbeat = 10 * time.Second

// goodbyeGrace is how long a stopping agent waits for the coordinator to
// close the stream after its Goodbye.
const goodbyeGrace = 2 * time.Second

type agentStream = grpc.BidiStreamingClient[fleetcheckv1.AgentMessage, fleetcheckv1.CoordinatorMessage]

// connectLoop keeps one stream to a coordinator, reconnecting with
// backoff, to the next configured coordinator after each stream or
// attempt (failover.go). The backoff resets only after a connection that
// was welcomed and lasted: a coordinator that accepts and drops at once
// must not be hammered.
func (a *Agent) connectLoop(ctx context.Context) {
	rot := &rotation{node: a.cfg.Node, addrs: a.cfg.coordinatorAddrs(), lookup: a.o.lookup}
	for {
		ep := rot.pick(ctx)
		start := time.Now()
		welcomed, err := a.session(ctx, ep)
		if ctx.Err() != nil {
			return
		}
		if why := a.certNotValid(time.Now()); why != "" && !welcomed {
			err = fmt.Errorf("%w: %s (%w)", ErrNotAuthorized, why, err)
		}
		attempt := rot.done(welcomed && time.Since(start) >= a.o.healthyAfter)
		wait := a.o.backoff.Next(attempt)
		ev := a.log.Warn()
		if errors.Is(err, ErrNotAuthorized) {
			// Not an outage: say so at error level, and knock rarely.
			wait, ev = longestWait(a.o.backoff), a.log.Error()
		}
		ev = ev.Err(err).Str("coordinator", ep.String()).Dur("retry_in_ms", wait).Int("attempt", rot.failed)
		if len(rot.eps) > 1 {
			ev = ev.Str("next", rot.eps[rot.next%len(rot.eps)].String())
		}
		switch {
		case errors.Is(err, ErrNotAuthorized):
			ev.Msg("coordinator refused this agent's certificate; check its node name and CA (retrying at the longest interval)")
		case errors.Is(err, ErrRefused):
			ev.Msg("coordinator refused this agent; backing off")
		case welcomed:
			ev.Msg("lost the coordinator; reconnecting")
		default:
			ev.Msg("cannot reach the coordinator; retrying")
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// longestWait is the backoff's ceiling (ExpBackoff.Max), or its wait for
// a late attempt when it has none.
func longestWait(b Backoff) time.Duration {
	if m, ok := b.(interface{ Longest() time.Duration }); ok {
		return m.Longest()
	}
	return b.Next(64)
}

// session is one stream: from the hello to the first error.
type session struct {
	a      *Agent
	stream agentStream
	log    zerolog.Logger
	every  time.Duration
	form   wire.Form // how results' metrics travel: columns to a coordinator that reads them (Welcome)

	mu       sync.Mutex
	queue    []*fleetcheckv1.AgentMessage // control messages, sent before results
	hbQueued bool
	inflight map[string]time.Time // results sent, not yet acknowledged
	lastRecv time.Time
	wake     chan struct{}
}

// session dials, says hello, waits for the welcome, then runs the sender,
// receiver and heartbeats until one fails. It reports whether the
// coordinator welcomed the agent.
func (a *Agent) session(ctx context.Context, ep endpoint) (welcomed bool, err error) {
	conn, err := grpc.NewClient(ep.target, dialOptions(a.creds, ep.authority, a.o.dial)...)
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", ep, err)
	}
	defer func() { _ = conn.Close() }() // the session's own error is what is returned

	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	helloTimer := time.AfterFunc(a.o.helloTimeout, func() { cancel(errHelloTimeout) })
	defer helloTimer.Stop()
	// The stream ends with sctx, except that a stopping agent first says
	// goodbye (endStream).
	streamCtx, streamCancel := context.WithCancel(context.WithoutCancel(sctx))
	defer streamCancel()
	unlink := context.AfterFunc(sctx, streamCancel)
	stream, err := fleetcheckv1.NewAgentServiceClient(conn).Connect(streamCtx)
	if err != nil {
		return false, streamErr(sctx, "open stream", err)
	}
	if err := stream.Send(&fleetcheckv1.AgentMessage{Msg: &fleetcheckv1.AgentMessage_Hello{Hello: a.hello(sctx)}}); err != nil {
		// The real reason comes with Recv.
		if _, rerr := stream.Recv(); rerr != nil {
			err = rerr
		}
		return false, streamErr(sctx, "send hello", err)
	}
	m, err := stream.Recv()
	if err != nil {
		return false, streamErr(sctx, "hello", err)
	}
	w := m.GetWelcome()
	if w == nil {
		return false, fmt.Errorf("hello: coordinator answered %T, not a welcome", m.GetMsg())
	}
	if !helloTimer.Stop() {
		return false, streamErr(sctx, "hello", context.Cause(sctx))
	}

	s := &session{
		a:        a,
		stream:   stream,
		log:      a.log,
		every:    time.Duration(w.GetHeartbeatIntervalMs()) * time.Millisecond,
		inflight: map[string]time.Time{},
		lastRecv: time.Now(),
		wake:     make(chan struct{}, 1),
	}
	if w.GetMetricColumns() {
		s.form = wire.Columns
	}
	if s.every <= 0 {
		s.every = defaultHeartbeat
	}
	// Results the coordinator already holds need no resend.
	known := 0
	for _, id := range w.GetKnownResultIds() {
		if ok, err := a.spool.Remove(id); err != nil {
			a.log.Warn().Err(err).Str("result_id", id).Msg("cannot remove known result from spool")
		} else if ok {
			known++
		}
	}
	a.log.Info().Str("coordinator", ep.String()).Str("coordinator_version", w.GetCoordinatorVersion()).Str("protocol_version", w.GetProtocolVersion()).
		Dur("heartbeat_ms", s.every).Int("spooled", a.spool.Len()).Int("already_stored", known).Msg("connected to coordinator")
	a.gossipWelcome(w.GetGossipAddr())
	a.o.metrics.Connected(true)
	defer a.o.metrics.Connected(false)
	a.o.metrics.Spool(a.spool.Len(), a.spool.Bytes())

	a.mu.Lock()
	a.sess = s
	a.mu.Unlock()
	a.reverts.connected(true)
	defer func() {
		a.mu.Lock()
		if a.sess == s {
			a.sess = nil
		}
		a.mu.Unlock()
		// Revert timers armed with revert_on_disconnect count from here.
		a.reverts.connected(false)
	}()

	var wg sync.WaitGroup
	sendDone := make(chan struct{})
	for i, loop := range []func(context.Context) error{s.sendLoop, s.recvLoop, s.heartbeatLoop} {
		wg.Go(func() {
			if i == 0 {
				defer close(sendDone)
			}
			if err := loop(sctx); err != nil {
				cancel(err)
			}
		})
	}
	if unlink() {
		go s.endStream(ctx, sctx, sendDone, streamCancel)
	}
	wg.Wait()
	return true, streamErr(sctx, "stream", context.Cause(sctx))
}

// endStream ends the stream when sctx ends. A stopping agent (ctx done)
// first says Goodbye and closes its side, once the sender is gone (a
// gRPC stream has one writer), so that the coordinator shows the node
// left; the coordinator then ends the stream, or goodbyeGrace does.
func (s *session) endStream(ctx, sctx context.Context, sendDone <-chan struct{}, streamCancel context.CancelFunc) {
	<-sctx.Done()
	if ctx.Err() == nil {
		streamCancel()
		return
	}
	<-sendDone
	t := time.AfterFunc(goodbyeGrace, streamCancel)
	err := s.stream.Send(&fleetcheckv1.AgentMessage{Msg: &fleetcheckv1.AgentMessage_Goodbye{Goodbye: &fleetcheckv1.Goodbye{Reason: "agent stopping"}}})
	if err == nil {
		err = s.stream.CloseSend()
	}
	if err != nil {
		t.Stop()
		streamCancel()
		return
	}
	s.log.Debug().Msg("said goodbye to the coordinator")
}

// streamErr names why a stream ended: a refusal, our own timers, or the
// transport.
func streamErr(sctx context.Context, what string, err error) error {
	if cause := context.Cause(sctx); cause != nil && !errors.Is(cause, context.Canceled) {
		if errors.Is(cause, errHelloTimeout) || errors.Is(cause, errSilent) || errors.Is(cause, errAckTimeout) {
			err = cause
		}
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.FailedPrecondition:
			return fmt.Errorf("%w: %s", ErrRefused, st.Message())
		case codes.PermissionDenied, codes.Unauthenticated:
			return fmt.Errorf("%w: %s", ErrNotAuthorized, st.Message())
		}
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: coordinator closed the stream", what)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (a *Agent) hello(ctx context.Context) *fleetcheckv1.Hello {
	a.mu.Lock()
	inv := a.inventory
	a.mu.Unlock()
	return &fleetcheckv1.Hello{
		Node:            a.cfg.Node,
		ProtocolVersion: version.Protocol,
		AgentVersion:    a.o.version,
		Labels:          a.cfg.Labels,
		Inventory:       wire.InventoryToProto(inv),
		EnabledChecks:   a.enabledNames,
		Activity:        activityToProto(a.activity(ctx)),
		EnabledActions:  a.cfg.actionNames(),
		MultiNode:       a.cfg.MultiNode != nil,
		GossipAddr:      a.gossipAddr(),
	}
}

// enqueue queues a control message. It never blocks: the receiver calls it,
// and a receiver waiting on the sender while the sender waits on flow
// control would stop the acks that free it.
func (s *session) enqueue(m *fleetcheckv1.AgentMessage) {
	s.mu.Lock()
	s.queue = append(s.queue, m)
	s.mu.Unlock()
	s.signal()
}

func (s *session) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *session) popControl() *fleetcheckv1.AgentMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return nil
	}
	m := s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	if m.GetHeartbeat() != nil {
		s.hbQueued = false
	}
	return m
}

func (s *session) inflightLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inflight)
}

// sendLoop is the stream's only writer (gRPC streams allow one). Control
// messages go first; results follow in spool order, at most window of them
// unacknowledged so a heartbeat never queues behind a whole backlog.
func (s *session) sendLoop(ctx context.Context) error {
	var cursor uint64 // last spool sequence sent on this stream
	for {
		if m := s.popControl(); m != nil {
			if err := s.send(m); err != nil {
				return err
			}
			continue
		}
		if s.inflightLen() < s.a.o.window {
			if next := s.a.spool.After(cursor, 1); len(next) == 1 {
				cursor = next[0].Seq
				if err := s.sendResult(next[0].ID); err != nil {
					return err
				}
				continue
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		case <-s.a.spool.Changed():
		}
	}
}

// send writes one message. io.EOF means the coordinator ended the stream;
// its status comes with Recv, so the receiver reports it.
func (s *session) send(m *fleetcheckv1.AgentMessage) error {
	err := s.stream.Send(m)
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// sendResult sends one spooled result, then, for requested work, its DONE:
// the status always follows the result it names.
func (s *session) sendResult(id string) error {
	data, err := s.a.spool.Get(id)
	switch {
	case errors.Is(err, spool.ErrNotFound):
		return nil // acknowledged or dropped meanwhile
	case err != nil:
		s.log.Error().Err(err).Str("result_id", id).Msg("cannot read spooled result; skipping it")
		return nil
	}
	var r Result
	if err := json.Unmarshal(data, &r); err != nil {
		// Verified by checksum yet unreadable: never sendable, so never keep it.
		s.log.Error().Err(err).Str("result_id", id).Msg("dropping undecodable spooled result")
		if removed, rerr := s.a.spool.Remove(id); rerr != nil {
			s.log.Warn().Err(rerr).Str("result_id", id).Msg("cannot remove result")
		} else if removed {
			s.a.o.metrics.SpoolDropped(string(spool.DropCorrupt), 1)
		}
		return nil
	}
	s.mu.Lock()
	s.inflight[id] = time.Now()
	s.mu.Unlock()
	if err := s.send(&fleetcheckv1.AgentMessage{Msg: &fleetcheckv1.AgentMessage_Result{Result: r.toProto(s.form)}}); err != nil {
		return err
	}
	s.log.Debug().Str("result_id", id).Str("work_id", r.WorkID).Msg("result sent")
	if r.WorkID == "" {
		return nil
	}
	return s.send(workStatus(r.WorkID, fleetcheckv1.WorkStatus_STATE_DONE, "", r.ID))
}

// recvLoop reads the coordinator's messages. Nothing here may block on
// the sender or on a check.
func (s *session) recvLoop(ctx context.Context) error {
	for {
		m, err := s.stream.Recv()
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.lastRecv = time.Now()
		s.mu.Unlock()
		switch x := m.GetMsg().(type) {
		case *fleetcheckv1.CoordinatorMessage_Ack:
			s.onAck(x.Ack)
		case *fleetcheckv1.CoordinatorMessage_RunChecks:
			s.a.onRunChecks(ctx, s, x.RunChecks)
		case *fleetcheckv1.CoordinatorMessage_RunAction:
			s.a.onRunAction(ctx, s, x.RunAction)
		case *fleetcheckv1.CoordinatorMessage_EndMulti:
			s.a.onEndMulti(x.EndMulti)
		case *fleetcheckv1.CoordinatorMessage_GossipKey:
			s.enqueue(s.a.onGossipKey(x.GossipKey))
		case *fleetcheckv1.CoordinatorMessage_Heartbeat:
		case *fleetcheckv1.CoordinatorMessage_Welcome:
			s.log.Warn().Msg("ignoring a second welcome")
		default:
			// A newer coordinator's message: ignore, stay compatible.
			s.log.Debug().Msgf("ignoring unknown coordinator message %T", x)
		}
	}
}

// onAck deletes an acknowledged result from the spool: only now is it
// safe. A refusal deletes it too, loudly.
func (s *session) onAck(ack *fleetcheckv1.Ack) {
	id := ack.GetResultId()
	if _, err := s.a.spool.Remove(id); err != nil {
		s.log.Warn().Err(err).Str("result_id", id).Msg("cannot remove acknowledged result")
	}
	s.mu.Lock()
	delete(s.inflight, id)
	s.mu.Unlock()
	s.signal()
	if why := ack.GetRefused(); why != "" {
		// Never storable (malformed, or claims another node): sending it
		// again would only be refused again.
		s.log.Error().Str("result_id", id).Str("reason", why).Msg("coordinator refused a result; dropped it")
		s.a.o.metrics.Refused()
	} else {
		s.log.Debug().Str("result_id", id).Bool("duplicate", ack.GetDuplicate()).Msg("result acknowledged")
		s.a.o.metrics.Acked(ack.GetDuplicate())
	}
	s.a.o.metrics.Spool(s.a.spool.Len(), s.a.spool.Bytes())
}

// heartbeatLoop sends heartbeats and notices a dead stream that the
// transport has not: silence from the coordinator, or an ack that never
// comes. Either way a fresh stream resends what is unacknowledged.
func (s *session) heartbeatLoop(ctx context.Context) error {
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := time.Now()
		s.mu.Lock()
		silent := now.Sub(s.lastRecv)
		var oldest time.Time
		for _, at := range s.inflight {
			if oldest.IsZero() || at.Before(oldest) {
				oldest = at
			}
		}
		queued := s.hbQueued
		s.mu.Unlock()
		if silent > 3*s.every {
			return fmt.Errorf("%w (%s)", errSilent, silent.Round(time.Millisecond))
		}
		if !oldest.IsZero() && now.Sub(oldest) > s.a.o.ackTimeout {
			return fmt.Errorf("%w (%s)", errAckTimeout, s.a.o.ackTimeout)
		}
		if queued {
			continue // the last one has not gone out yet: do not pile up
		}
		hb := &fleetcheckv1.Heartbeat{
			UnixMs:     now.UnixMilli(),
			Activity:   activityToProto(s.a.activity(ctx)),
			SpoolDepth: uint32(s.a.spool.Len()),
		}
		s.mu.Lock()
		s.hbQueued = true
		s.queue = append(s.queue, &fleetcheckv1.AgentMessage{Msg: &fleetcheckv1.AgentMessage_Heartbeat{Heartbeat: hb}})
		s.mu.Unlock()
		s.signal()
	}
}

func workStatus(workID string, st fleetcheckv1.WorkStatus_State, reason, resultID string) *fleetcheckv1.AgentMessage {
	return &fleetcheckv1.AgentMessage{Msg: &fleetcheckv1.AgentMessage_WorkStatus{WorkStatus: &fleetcheckv1.WorkStatus{
		WorkId: workID, State: st, Reason: reason, ResultId: resultID,
	}}}
}
