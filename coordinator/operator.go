package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/selector"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// RunCheck bounds.
const (
	DefaultRunTimeout = 2 * time.Minute
	MinRunTimeout     = kit.MinRunTimeout
	MaxRunTimeout     = kit.MaxRunTimeout
	maxRunChecks      = 64
	maxReason         = 512
	// progressEvery coalesces progress messages for big fleets.
	progressEvery = 100 * time.Millisecond
)

type operatorService struct {
	pb.UnimplementedOperatorServiceServer
	s *Server
}

// authorize keeps agent identities off the operator API.
func (s *Server) authorize(ctx context.Context) (Identity, error) {
	if !s.ready.Load() {
		return Identity{}, status.Error(codes.Unavailable, "coordinator not serving yet")
	}
	id := s.opts.Identify(ctx)
	if id.Kind == NodeIdentity {
		return id, status.Errorf(codes.PermissionDenied, "node identity %s may not call operator RPCs", id.Name)
	}
	return id, nil
}

func storeStatus(err error) error {
	switch {
	case errors.Is(err, store.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, store.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Unavailable, err.Error())
}

func (o *operatorService) ListNodes(ctx context.Context, req *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	s := o.s
	if _, err := s.authorize(ctx); err != nil {
		return nil, err
	}
	sel, err := selector.Parse(req.GetSelector())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	nodes, err := s.store.Nodes(ctx)
	if err != nil {
		return nil, storeStatus(err)
	}
	resp := &pb.ListNodesResponse{}
	for _, n := range nodes {
		if !sel.Matches(n.Name, n.Labels) {
			continue
		}
		// The live view is fresher than the store for connection and last seen.
		if e := s.reg.lookup(n.Name); e != nil {
			e.mu.Lock()
			if e.sess != nil {
				n.Connected = true
				if t := e.sess.lastRecv(); t.After(n.LastSeen) {
					n.LastSeen = t
				}
			}
			e.mu.Unlock()
		}
		resp.Nodes = append(resp.Nodes, nodeToProto(n, failingChecks(n.Checks)))
	}
	return resp, nil
}

func (o *operatorService) ListResults(ctx context.Context, req *pb.ListResultsRequest) (*pb.ListResultsResponse, error) {
	s := o.s
	if _, err := s.authorize(ctx); err != nil {
		return nil, err
	}
	if req.GetNode() == "" {
		return nil, status.Error(codes.InvalidArgument, "node is required")
	}
	rows, err := s.store.Results(ctx, store.ResultQuery{Node: req.GetNode(), Check: req.GetCheck(), Limit: int(req.GetLimit())})
	if err != nil {
		return nil, storeStatus(err)
	}
	resp := &pb.ListResultsResponse{Results: make([]*pb.StoredCheckResult, 0, len(rows))}
	for _, r := range rows {
		resp.Results = append(resp.Results, storedCheckToProto(r))
	}
	return resp, nil
}

func (o *operatorService) ListEvents(ctx context.Context, req *pb.ListEventsRequest) (*pb.ListEventsResponse, error) {
	s := o.s
	if _, err := s.authorize(ctx); err != nil {
		return nil, err
	}
	evs, err := s.store.Events(ctx, store.EventQuery{Node: req.GetNode(), Kind: req.GetKind(), Limit: int(req.GetLimit())})
	if err != nil {
		return nil, storeStatus(err)
	}
	resp := &pb.ListEventsResponse{Events: make([]*pb.Event, 0, len(evs))}
	for _, e := range evs {
		resp.Events = append(resp.Events, eventToProto(e))
	}
	return resp, nil
}

func validCheckNames(names []string) error {
	if len(names) == 0 {
		return errors.New("no checks named")
	}
	if len(names) > maxRunChecks {
		return fmt.Errorf("%d checks named, at most %d", len(names), maxRunChecks)
	}
	for _, n := range names {
		if n == "" || len(n) > 64 {
			return fmt.Errorf("check name %q: must be 1..64 characters", n)
		}
		for i := 0; i < len(n); i++ {
			c := n[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return fmt.Errorf("check name %q: lowercase letters, digits, '.', '_' and '-' only", n)
			}
		}
	}
	return nil
}

// agentTimeout leaves the agent a margin to report its own timeout before
// the coordinator gives up on it.
func agentTimeout(d time.Duration) time.Duration {
	return d - min(d/10, 5*time.Second)
}

// RunCheck sends RunChecks to every connected node the selector picks and
// streams progress until every node has an outcome or the timeout passed.
func (o *operatorService) RunCheck(req *pb.RunCheckRequest, stream grpc.ServerStreamingServer[pb.RunCheckProgress]) error {
	s := o.s
	ctx := stream.Context()
	id, err := s.authorize(ctx)
	if err != nil {
		return err
	}
	sel, err := selector.Parse(req.GetSelector())
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if err := validCheckNames(req.GetChecks()); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	timeout := DefaultRunTimeout
	if ms := req.GetTimeoutMs(); ms != 0 {
		// Bounded in milliseconds first: a huge number must not wrap
		// into the range when multiplied.
		if ms < MinRunTimeout.Milliseconds() || ms > MaxRunTimeout.Milliseconds() {
			return status.Errorf(codes.InvalidArgument, "timeout_ms %d: must be between %s and %s", ms, MinRunTimeout, MaxRunTimeout)
		}
		timeout = time.Duration(ms) * time.Millisecond
	}
	if len(req.GetReason()) > maxReason {
		return status.Errorf(codes.InvalidArgument, "reason: at most %d bytes", maxReason)
	}

	now := s.now()
	w := newWork(newWorkID(now))
	log := s.log.With().Str("work_id", w.id).Logger()
	// Pick the targets under each node's own lock, then send with no lock
	// held: a send is a non-blocking write to that stream's queue.
	var sessions []*session
	var absent, remote []string
	// With several coordinators, a node whose stream is on another one is
	// reached through it (routing.go); the store says which.
	elsewhere, err := s.nodesElsewhere(ctx)
	if err != nil {
		return storeStatus(err)
	}
	for _, e := range s.reg.all() {
		e.mu.Lock()
		match := e.state != "" && sel.Matches(e.name, e.labels)
		sess := e.sess
		e.mu.Unlock()
		_, there := elsewhere[e.name]
		switch {
		case sess != nil && match:
			sessions = append(sessions, sess)
		case sess != nil || there:
			continue // here, not picked; or theirs, below
		case match:
			absent = append(absent, e.name)
		default:
			continue
		}
		w.addTarget(e.name, sess)
	}
	// The store's view of the others' nodes: one this coordinator never
	// saw has no entry here.
	for _, n := range elsewhere {
		if n.State != "" && sel.Matches(n.Name, n.Labels) && !w.has(n.Name) {
			if _, err := (&fleet{s: s}).session(n.Name); err == nil {
				continue // attached here meanwhile: not picked above, so not picked
			}
			remote = append(remote, n.Name)
			w.addTarget(n.Name, nil)
		}
	}
	checks := strings.Join(req.GetChecks(), ",")
	reason := req.GetReason()
	if reason == "" {
		reason = "no reason given"
	}
	// Who asked, what and why is recorded before anything is sent.
	total, reached := len(sessions)+len(remote)+len(absent), len(sessions)+len(remote)
	if err := s.record(ctx, "", store.EventOperatorAction, id.Actor(), fmt.Sprintf("run %s on %q: %d nodes (%d connected), timeout %s, work %s; reason: %s",
		checks, sel.String(), total, reached, timeout, w.id, reason)); err != nil {
		return storeStatus(err)
	}
	if err := s.recordDispatch(ctx, w, sessions, now); err != nil {
		log.Error().Err(err).Msg("work dispatch not recorded; nothing sent")
		return storeStatus(err)
	}
	if len(remote) > 0 {
		if err := s.store.RecordDispatch(ctx, w.id, remote, now); err != nil {
			log.Error().Err(err).Msg("work dispatch not recorded; nothing sent")
			return storeStatus(err)
		}
		for _, n := range remote {
			w.markSent(n, true)
		}
	}
	s.works.add(w)
	defer s.works.remove(w.id)
	log.Info().Str("checks", checks).Str("selector", sel.String()).Int("nodes", total).
		Int("connected", len(sessions)).Int("on_other_coordinators", len(remote)).Str("actor", id.Actor()).Str("reason", reason).Msg("dispatching checks")

	for _, node := range absent {
		w.finish(node, &pb.NodeOutcome{Node: node, Status: OutcomeUnreachable, Reason: "not connected"})
	}
	msg := &pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_RunChecks{RunChecks: &pb.RunChecks{
		WorkId: w.id, Checks: req.GetChecks(), TimeoutMs: agentTimeout(timeout).Milliseconds(),
	}}}
	// The relays end with the call (rcancel runs before the wait).
	var relays sync.WaitGroup
	defer relays.Wait()
	rctx, rcancel := context.WithTimeout(ctx, timeout)
	defer rcancel()
	for _, node := range remote {
		relays.Go(func() { (&fleet{s: s}).relay(rctx, w, node, msg.GetRunChecks(), timeout) })
	}
	for _, sess := range sessions {
		if !sess.trySend(msg) {
			w.markSent(sess.node, false)
			reason := "send queue full"
			if sess.ctx.Err() != nil {
				w.finish(sess.node, &pb.NodeOutcome{Node: sess.node, Status: OutcomeUnreachable, Reason: "stream lost before the work was sent"})
				continue
			}
			w.finish(sess.node, &pb.NodeOutcome{Node: sess.node, Status: "error", Reason: reason})
		}
	}

	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	throttle := time.NewTimer(progressEvery)
	defer throttle.Stop()
	if err := stream.Send(w.progress(false)); err != nil {
		return err
	}
	lastSent := time.Now()
	dirty := false
	for !w.complete() {
		select {
		case <-w.changed:
			if time.Since(lastSent) < progressEvery {
				dirty = true
				continue
			}
		case <-throttle.C:
			throttle.Reset(progressEvery)
			if !dirty {
				continue
			}
		case <-deadline.C:
			w.expire(timeout)
			continue
		case <-ctx.Done():
			log.Info().Msg("operator left before the work finished")
			return status.FromContextError(ctx.Err()).Err()
		case <-s.stopping:
			return status.Error(codes.Unavailable, errShutdown.Error())
		}
		if w.complete() {
			break
		}
		dirty = false
		lastSent = time.Now()
		if err := stream.Send(w.progress(false)); err != nil {
			return err
		}
	}
	final := w.progress(true)
	log.Info().Int32("total", final.Total).Int32("failed", final.Failed).Int32("refused", final.Refused).
		Int32("unreachable", final.Unreachable).Int32("timed_out", final.TimedOut).Msg("work finished")
	return stream.Send(final)
}
