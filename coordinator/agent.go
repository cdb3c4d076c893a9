package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Why a stream ended, as its session's cancel cause.
var (
	errReplaced    = errors.New("replaced by a newer stream from the same node")
	errShutdown    = errors.New("coordinator shutting down")
	errAgentClosed = errors.New("agent closed its stream")
)

// leftError is a stream that ended after the agent's Goodbye: a clean
// stop, shown as the node having left rather than being unreachable.
type leftError struct{ reason string }

func (e *leftError) Error() string {
	if e.reason == "" {
		return "agent stopped"
	}
	return "agent stopped: " + e.reason
}

type silenceError struct{ silent, interval time.Duration }

func (e *silenceError) Error() string {
	return fmt.Sprintf("no message for %s (3 heartbeat intervals of %s)", e.silent.Round(time.Millisecond), e.interval)
}

type storeError struct{ err error }

func (e *storeError) Error() string { return "store unavailable: " + e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

type streamError struct{ err error }

func (e *streamError) Error() string {
	if st, ok := status.FromError(e.err); ok {
		return "stream lost: " + st.Message()
	}
	return "stream lost: " + e.err.Error()
}
func (e *streamError) Unwrap() error { return e.err }

// Limits on one stream.
const (
	maxInFlight    = 64   // results being stored at once per stream
	maxIngesting   = 2048 // results being stored at once in all (4 full store batches)
	sendGrace      = 2 * time.Second
	knownIDsWindow = 24 * time.Hour
	knownIDsMax    = 1000
	maxNodeName    = 253
)

type agentService struct {
	pb.UnimplementedAgentServiceServer
	s *Server
}

// session is one agent stream.
type session struct {
	s      *Server
	node   string
	entry  *nodeEntry
	id     Identity
	log    zerolog.Logger
	ctx    context.Context
	cancel context.CancelCauseFunc
	sendq  chan *pb.CoordinatorMessage
	drain  chan struct{} // closed to flush the queue and stop sending

	last     atomic.Int64 // unix nanos of the last message received
	touched  atomic.Int64 // last value written to the store
	activity atomic.Int32
	// actStored is the activity last written to the store (+1; 0: none),
	// for coordinators that reach the node through this one.
	actStored atomic.Int32
	spool     atomic.Uint32
	enabled   []string
	// protocol is the agent's protocol version; actions and multiNode are
	// what its hello declares it can do (protocol 1.1).
	protocol  string
	actions   []string
	multiNode bool
	// gossip is the agent's gossip address, "" when its gossip is off
	// (protocol 1.2).
	gossip string
}

func (x *session) end(cause error) { x.cancel(cause) }

func (x *session) lastRecv() time.Time { return time.Unix(0, x.last.Load()) }

// trySend queues a message without waiting; false when the queue is full
// or the stream has ended.
func (x *session) trySend(m *pb.CoordinatorMessage) bool {
	if x.ctx.Err() != nil {
		return false
	}
	select {
	case x.sendq <- m:
		return true
	default:
		return false
	}
}

// send queues a message, waiting for room while the stream lives.
func (x *session) send(m *pb.CoordinatorMessage) bool {
	select {
	case x.sendq <- m:
		return true
	case <-x.ctx.Done():
		return false
	}
}

func (x *session) sendLoop(stream pb.AgentService_ConnectServer, done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case m := <-x.sendq:
			if err := stream.Send(m); err != nil {
				x.end(&streamError{err})
				return
			}
		case <-x.ctx.Done():
			return
		case <-x.drain:
			for {
				select {
				case m := <-x.sendq:
					if err := stream.Send(m); err != nil {
						return
					}
				default:
					return
				}
			}
		}
	}
}

func validNodeName(n string) error {
	if n == "" || len(n) > maxNodeName {
		return fmt.Errorf("node name must be 1..%d characters", maxNodeName)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("node name %q may hold only letters, digits, '-', '_' and '.'", n)
		}
	}
	return nil
}

// Connect is an agent's stream: Hello, then Welcome, then results, work
// status and heartbeats from the agent; acks, RunChecks and heartbeats
// from here.
func (a *agentService) Connect(stream pb.AgentService_ConnectServer) error {
	s := a.s
	if !s.ready.Load() {
		return status.Error(codes.Unavailable, "coordinator not serving yet")
	}
	ctx := stream.Context()
	id := s.opts.Identify(ctx)
	if id.Kind == AdminIdentity {
		return status.Error(codes.PermissionDenied, "an operator identity cannot connect as an agent")
	}

	// Recv runs in its own goroutine so that a silent or stuck agent never
	// keeps this handler from ending the stream.
	msgs := make(chan *pb.AgentMessage)
	recvErr := make(chan error, 1)
	quit := make(chan struct{})
	defer close(quit)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case msgs <- m:
			case <-quit:
				return
			}
		}
	}()

	hello, err := s.awaitHello(ctx, msgs, recvErr)
	if err != nil {
		return err
	}
	log := s.log.With().Str("node", hello.GetNode()).Str("peer", id.Addr).Logger()
	if err := validNodeName(hello.GetNode()); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	// Who may speak for the node comes before anything else the hello says.
	if err := s.checkNode(ctx, id, hello.GetNode()); err != nil {
		// Recorded under the node the certificate names when it names one:
		// that node's agent is the one misconfigured or misused.
		node := hello.GetNode()
		if id.Kind == NodeIdentity {
			node = id.Name
		}
		s.refusal(ctx, log, id, node, ReasonOtherNode, "hello\x00"+hello.GetNode(), "connection refused: "+status.Convert(err).Message())
		return err
	}
	if err := CheckProtocol(hello.GetProtocolVersion()); err != nil {
		log.Warn().Str("protocol", hello.GetProtocolVersion()).Msg("agent refused: protocol version")
		return status.Error(codes.FailedPrecondition, err.Error())
	}

	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sess := &session{
		s:       s,
		node:    hello.GetNode(),
		id:      id,
		log:     log,
		ctx:     sctx,
		cancel:  cancel,
		sendq:   make(chan *pb.CoordinatorMessage, s.cfg.SendQueue),
		drain:   make(chan struct{}),
		enabled: hello.GetEnabledChecks(),

		protocol:  hello.GetProtocolVersion(),
		actions:   hello.GetEnabledActions(),
		multiNode: hello.GetMultiNode(),
		gossip:    hello.GetGossipAddr(),
	}
	sess.last.Store(s.now().UnixNano())
	sess.activity.Store(int32(hello.GetActivity()))
	sess.actStored.Store(int32(hello.GetActivity()) + 1) // attach writes it
	welcome, err := s.attach(sctx, sess, hello)
	if err != nil {
		if ctx.Err() != nil {
			// The agent, or the coordinator stopping, ended the stream
			// first: nothing went wrong here.
			log.Debug().Err(err).Msg("agent join not recorded: the stream ended")
			return status.FromContextError(ctx.Err()).Err()
		}
		log.Error().Err(err).Msg("agent join not recorded")
		return status.Error(codes.Unavailable, "coordinator store unavailable; retry")
	}
	cause := error(errAgentClosed)
	defer func() { s.detach(sess, cause) }()
	if err := stream.Send(welcome); err != nil {
		cause = &streamError{err}
		return err
	}
	log.Info().Str("agent_version", hello.GetAgentVersion()).Str("protocol", hello.GetProtocolVersion()).Msg("agent connected")

	sendDone := make(chan struct{})
	go sess.sendLoop(stream, sendDone)
	var inflight sync.WaitGroup
	sem := make(chan struct{}, maxInFlight)
	for {
		select {
		case m := <-msgs:
			sess.last.Store(s.now().UnixNano())
			switch {
			case m.GetResult() != nil:
				select {
				case sem <- struct{}{}:
				case <-sctx.Done():
					continue
				}
				// And a slot of the whole coordinator's: a decoded result
				// waiting for the store holds tens of KB, and ten thousand
				// agents flushing their spools after an outage must wait in
				// gRPC flow control, not in memory.
				select {
				case s.ingesting <- struct{}{}:
				case <-sctx.Done():
					<-sem
					continue
				}
				inflight.Add(1)
				go func(r *pb.Result) {
					defer func() { <-s.ingesting; <-sem; inflight.Done() }()
					sess.handleResult(r)
				}(m.GetResult())
			case m.GetActionStatus() != nil:
				s.acts.status(sess.node, m.GetActionStatus())
			case m.GetGossipKeyStatus() != nil:
				s.keyOps.status(sess.node, m.GetGossipKeyStatus())
			case m.GetWorkStatus() != nil:
				s.works.status(sess.node, m.GetWorkStatus())
				s.doneElsewhere(sess, m.GetWorkStatus())
			case m.GetHeartbeat() != nil:
				sess.activity.Store(int32(m.GetHeartbeat().GetActivity()))
				sess.spool.Store(m.GetHeartbeat().GetSpoolDepth())
			case m.GetHello() != nil:
				log.Warn().Msg("second hello on one stream ignored")
			case m.GetGoodbye() != nil:
				// The agent closes its side next; what breaks after this
				// is its stop, not a failure.
				cause = &leftError{reason: clipID(m.GetGoodbye().GetReason())}
			}
		case err := <-recvErr:
			// The agent closed its side, or the transport broke: answer
			// what is in flight if the stream still takes it.
			var left *leftError
			if !errors.Is(err, io.EOF) && !errors.As(cause, &left) {
				cause = &streamError{err}
			}
			inflight.Wait()
			close(sess.drain)
			waitSend(sendDone)
			cancel(cause)
			if errors.Is(err, io.EOF) {
				return nil
			}
			return status.Error(codes.Unavailable, cause.Error())
		case <-sctx.Done():
			var left *leftError
			if ctx.Err() != nil && errors.As(cause, &left) {
				// The agent said goodbye and went before closing cleanly.
				waitSend(sendDone)
				return nil
			}
			cause = context.Cause(sctx)
			if ctx.Err() != nil {
				// The stream's own context ended: the agent or the network went away.
				cause = &streamError{errors.New("connection closed")}
			}
			waitSend(sendDone)
			return endStatus(cause)
		}
	}
}

// waitSend waits for the send loop to stop; a Send stuck on a peer that
// reads nothing is abandoned after a grace period (the stream ends with
// the handler, which unblocks it).
func waitSend(done <-chan struct{}) {
	t := time.NewTimer(sendGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

func endStatus(cause error) error {
	var silent *silenceError
	var se *storeError
	switch {
	case errors.Is(cause, errReplaced):
		return status.Error(codes.Aborted, cause.Error())
	case errors.Is(cause, errShutdown):
		return status.Error(codes.Unavailable, cause.Error())
	case errors.As(cause, &silent):
		return status.Error(codes.DeadlineExceeded, cause.Error())
	case errors.As(cause, &se):
		return status.Error(codes.Unavailable, cause.Error())
	case errors.Is(cause, context.Canceled), errors.Is(cause, context.DeadlineExceeded):
		return status.FromContextError(cause).Err()
	}
	return status.Error(codes.Unavailable, cause.Error())
}

func (s *Server) awaitHello(ctx context.Context, msgs <-chan *pb.AgentMessage, recvErr <-chan error) (*pb.Hello, error) {
	wait := max(3*s.cfg.HeartbeatInterval, 10*time.Second)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case m := <-msgs:
		if m.GetHello() == nil {
			return nil, status.Error(codes.InvalidArgument, "the first message on a stream must be Hello")
		}
		return m.GetHello(), nil
	case err := <-recvErr:
		if errors.Is(err, io.EOF) {
			return nil, status.Error(codes.InvalidArgument, "stream closed before Hello")
		}
		return nil, err
	case <-t.C:
		return nil, status.Errorf(codes.DeadlineExceeded, "no Hello within %s", wait)
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-s.stopping:
		return nil, status.Error(codes.Unavailable, errShutdown.Error())
	}
}

// attach records the hello, makes sess the node's stream (ending an older
// one), puts the node back in the state its newest results give, and
// builds the Welcome.
func (s *Server) attach(ctx context.Context, sess *session, hello *pb.Hello) (*pb.CoordinatorMessage, error) {
	now := s.now()
	var inv *report.Inventory
	if hello.GetInventory() != nil {
		i := wire.InventoryFromProto(hello.GetInventory())
		inv = &i
	}
	// A new node starts in the state its (no) results give, and its join
	// event is written with it: one transaction per join, not three, which
	// matters when a fleet of thousands reconnects at once.
	initState, initReason := deriveState(nil, false)
	node, existed, err := s.store.NodeJoined(ctx, store.Join{
		Node: sess.node, Labels: hello.GetLabels(), Inventory: inv,
		AgentVersion: hello.GetAgentVersion(), ProtocolVersion: hello.GetProtocolVersion(), At: now,
		InitialState: initState, InitialReason: initReason,
		Owner: s.holder, OwnerAddr: s.routeAddr, Activity: activityName(hello.GetActivity()),
		FirstEvent: &store.Event{Kind: store.EventConnection, Actor: sess.id.Actor(),
			Message: fmt.Sprintf("node joined (agent %s, protocol %s)", hello.GetAgentVersion(), hello.GetProtocolVersion())},
	})
	if err != nil {
		return nil, err
	}
	known, err := s.store.KnownResultIDs(ctx, sess.node, now.Add(-knownIDsWindow), knownIDsMax)
	if err != nil {
		return nil, err
	}

	e := s.reg.entry(sess.node)
	sess.entry = e
	e.mu.Lock()
	old := e.sess
	e.sess = sess
	e.attached()
	e.load(node)
	if old != nil {
		old.end(errReplaced)
	}
	state, reason := node.State, node.StateReason
	if !campaignOwned(state) {
		state, reason = e.liveState()
	}
	cause := ""
	if existed && state != node.State {
		cause = "agent reconnected; " + reason
	}
	s.setState(ctx, e, state, reason, cause, nil, now)
	e.mu.Unlock()

	if old != nil {
		s.event(ctx, sess.node, store.EventConnection, sess.id.Actor(), "stream replaced by a newer one")
		sess.log.Warn().Msg("a second stream for this node replaced the first")
	}
	return &pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_Welcome{Welcome: &pb.Welcome{
		CoordinatorVersion:  s.opts.Version,
		ProtocolVersion:     ProtocolVersion,
		KnownResultIds:      known,
		HeartbeatIntervalMs: s.cfg.HeartbeatInterval.Milliseconds(),
		GossipAddr:          s.GossipAddr(),
		MetricColumns:       true,
	}}}, nil
}

// detach runs when a stream ends: unless a newer stream took the node
// over, the node is disconnected and, unless the coordinator itself is
// stopping, unreachable.
func (s *Server) detach(sess *session, cause error) {
	sess.end(cause)
	e := sess.entry
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sess != sess {
		return
	}
	e.sess = nil
	off := false
	now := s.now()
	select {
	case <-s.stopping:
		s.setState(ctx, e, e.state, e.reason, "", &off, now)
		return
	default:
	}
	state, reason := StateUnreachable, cause.Error()
	var left *leftError
	if errors.As(cause, &left) {
		state = StateLeft
	}
	if campaignOwned(e.state) {
		state, reason = e.state, e.reason
	}
	if left != nil {
		sess.log.Info().Str("reason", cause.Error()).Msg("agent left")
	} else {
		sess.log.Warn().Str("reason", cause.Error()).Msg("agent stream ended")
	}
	if !s.setState(ctx, e, state, reason, "", &off, now) {
		return // the node is another coordinator's now, and reports there
	}
	// Stopped or gone, the agent no longer reports: its Kubernetes node
	// conditions go Unknown (not when the coordinator is the one stopping).
	s.conditions().notReporting(e, cause.Error())
}

// checkNode says whether id may speak for node; the caller records a
// refusal (refusal). Behind the authz interceptors authz decides; without
// them (a caller-supplied Identify) a node identity speaks only for
// itself and an operator for no node.
func (s *Server) checkNode(ctx context.Context, id Identity, node string) error {
	if _, ok := authz.IdentityFrom(ctx); ok {
		return authz.CheckNode(ctx, node)
	}
	var err error
	switch {
	case id.Kind == NodeIdentity && id.Name != node:
		err = status.Errorf(codes.PermissionDenied, "%s may not speak for node %q", id.Actor(), node)
	case id.Kind == AdminIdentity:
		err = status.Errorf(codes.PermissionDenied, "%s is an operator, not a node", id.Actor())
	default:
		return nil
	}
	return err
}

// Refusal events are kept to one per identity and what it claimed per
// refusalEvery: a misconfigured agent retrying every few seconds, or
// resending a refused result, must not fill the event log. Across claims,
// an identity's refusals are bounded by Refusals' token bucket.
const (
	refusalEvery  = 10 * time.Minute
	refusalMemory = 4096
)

// refusal records a refusal: a warn line, and a refused event under node
// at most once per identity and key (what was claimed) every
// refusalEvery. Past the identity's bound (a certificate claiming a new
// node name each time) neither is written; the refusal is counted under
// reason (fleetcheck_refusals_suppressed_total).
func (s *Server) refusal(ctx context.Context, log zerolog.Logger, id Identity, node, reason, key, why string) {
	actor := id.Actor()
	ok, held := s.opts.Refusals.allow(actor, reason)
	if !ok {
		return
	}
	ev := log.Warn().Str("identity", id.spiffeID()).Str("reason", reason)
	if held > 0 {
		ev = ev.Uint64("suppressed", held)
	}
	ev.Msg("refused: " + refusalWords(reason))
	key = actor + "\x00" + key
	now := s.now()
	s.refusalMu.Lock()
	if last, ok := s.refusals[key]; ok && now.Sub(last) < refusalEvery {
		s.refusalMu.Unlock()
		return
	}
	if len(s.refusals) >= refusalMemory {
		clear(s.refusals)
	}
	s.refusals[key] = now
	s.refusalMu.Unlock()
	s.event(ctx, node, store.EventRefused, actor, why)
}

// workSent says whether work workID was sent to node: first the work
// still running, then the store's record, which outlives the call and a
// restart (a spooled result may arrive much later).
func (s *Server) workSent(ctx context.Context, workID, node string) (bool, error) {
	if w := s.works.lookup(workID, node); w != nil {
		return w.sentTo(node), nil
	}
	return s.store.Dispatched(ctx, workID, node)
}

// clipID keeps an id from an agent short in refusals.
func clipID(id string) string {
	if len(id) > 128 {
		return id[:128] + "..."
	}
	return id
}

func (s *Server) event(ctx context.Context, node, kind, actor, msg string) {
	if err := s.store.AddEvent(ctx, store.Event{Time: s.now(), Node: node, Kind: kind, Actor: actor, Message: msg}); err != nil {
		s.log.Error().Err(err).Str("node", node).Str("kind", kind).Msg("record event")
	}
}

func ackMsg(a *pb.Ack) *pb.CoordinatorMessage {
	return &pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_Ack{Ack: a}}
}

// handleResult stores one result and acks it once durable.
func (x *session) handleResult(r *pb.Result) {
	s := x.s
	log := x.log.With().Str("result_id", r.GetId()).Str("work_id", r.GetWorkId()).Logger()
	// A node speaks only for itself: its certificate's node, and the node
	// this stream said hello as.
	why := ""
	if err := s.checkNode(x.ctx, x.id, r.GetNode()); err != nil {
		why = fmt.Sprintf("result %s refused: %s", r.GetId(), status.Convert(err).Message())
	} else if r.GetNode() != x.node {
		why = fmt.Sprintf("result %s claims node %q; this stream speaks for %q", r.GetId(), r.GetNode(), x.node)
	}
	if why != "" {
		s.refused.Add(1)
		s.refusal(x.ctx, log.With().Str("claimed", r.GetNode()).Logger(), x.id, x.node, ReasonOtherNode, "result\x00"+r.GetNode(), why)
		x.send(ackMsg(&pb.Ack{ResultId: r.GetId(), Refused: why}))
		return
	}
	// And only for work it was given, or its own schedule (no work id).
	if wid := r.GetWorkId(); wid != "" {
		sent, err := s.workSent(x.ctx, wid, x.node)
		switch {
		case err != nil:
			if x.ctx.Err() == nil {
				log.Error().Err(err).Msg("cannot tell whether the work was sent; result not stored")
				x.end(&storeError{err})
			}
			return
		case !sent:
			s.refused.Add(1)
			why := fmt.Sprintf("result %s names work %q, which was never sent to node %s", r.GetId(), clipID(wid), x.node)
			s.refusal(x.ctx, log, x.id, x.node, ReasonWorkNotSent, "work\x00"+wid, why)
			x.send(ackMsg(&pb.Ack{ResultId: r.GetId(), Refused: why}))
			return
		}
	}
	refuse := func(why string) {
		s.refused.Add(1)
		x.send(ackMsg(&pb.Ack{ResultId: r.GetId(), Refused: why}))
		if w := s.works.lookup(r.GetWorkId(), x.node); w != nil {
			w.finish(x.node, &pb.NodeOutcome{Node: x.node, Status: string(report.Error), Reason: "result refused: " + why, ResultId: r.GetId()})
		}
	}
	if err := wire.CheckMetricsValid(r); err != nil {
		log.Warn().Err(err).Msg("result refused")
		refuse(fmt.Sprintf("%s: %v", store.ErrInvalid, err))
		return
	}
	res := resultFromProto(r)
	ack, err := s.store.Ingest(x.ctx, res)
	switch {
	case errors.Is(err, store.ErrInvalid), errors.Is(err, store.ErrIDConflict):
		log.Warn().Err(err).Msg("result refused")
		refuse(err.Error())
		return
	case err != nil:
		if x.ctx.Err() != nil {
			return // the stream ended first; the agent still holds the result
		}
		log.Error().Err(err).Msg("result not stored")
		x.end(&storeError{err})
		return
	}
	x.send(ackMsg(&pb.Ack{ResultId: ack.ResultID, Duplicate: ack.Duplicate, StoredUnixMs: ack.Stored.UnixMilli()}))
	if ack.Duplicate {
		s.duplicates.Add(1)
	} else {
		s.acked.Add(1)
		s.applyResult(x, &res)
	}
	if res.WorkID != "" {
		s.works.result(res.WorkID, x.node, &res)
	}
}

// applyResult moves the node to the state its newest checks give.
func (s *Server) applyResult(x *session, r *store.Result) {
	e := x.entry
	e.mu.Lock()
	defer e.mu.Unlock()
	e.merge(r)
	policy := s.drainPolicy()
	why := policy.observe(e, r)
	s.conditions().observe(e, r)
	if e.sess == nil {
		return // the stream is gone: unreachable wins
	}
	if !campaignOwned(e.state) { // else a campaign or the drain policy owns the node
		state, reason := e.liveState()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.setState(ctx, e, state, reason, "", nil, s.now())
	}
	policy.apply(e, why)
}
