package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/report"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/proto/version"
)

// Routing (docs/ha.md): several coordinators over one PostgreSQL each
// hold some agents' streams. The store records, per node, which
// coordinator holds its stream (its holder id and address, set at attach,
// cleared at detach only by that coordinator). Work for a node with no
// stream here goes to its owner over RoutingService, which sends it on
// its stream and answers with the outcome. When the owner is gone, or
// the stream moves mid-call, the caller waits like for a lost stream
// (three heartbeat intervals), reading the owner again, and sends the
// same request (same work or action id) to wherever the node is now: the
// agent never runs an id twice.

// errLeft is a wait that ended because the node's stream here did, with
// no other stream here: the node may be on another coordinator now.
var errLeft = errors.New("the node's stream here ended")

// Bounds of a routed request.
const (
	minRouteTimeout = time.Second
	maxRouteTimeout = 24 * time.Hour
	// routeMargin: the owner waits this much less than the caller, so
	// that its answer (a timeout too) arrives before the caller gives up.
	routeMargin = 500 * time.Millisecond
)

// routes holds the connections to the other coordinators, by address.
type routes struct {
	s     *Server
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	creds credentials.TransportCredentials
	err   error // why no credentials could be made
}

func newRoutes(s *Server) *routes {
	r := &routes{s: s, conns: map[string]*grpc.ClientConn{}}
	switch {
	case s.cfg.Insecure:
		r.creds = insecure.NewCredentials()
	case s.opts.Certs == nil:
		r.err = errors.New("no coordinator certificate to call other coordinators with (serve with tls:)")
	default:
		// The owner must hold a coordinator identity of this trust
		// domain; this coordinator's own certificate is the client's.
		r.creds, r.err = pki.ClientCredentials(pki.ClientOptions{Reloader: s.opts.Certs, TrustDomain: s.cfg.TLS.TrustDomain})
	}
	return r
}

// client is the RoutingService of the coordinator at addr.
func (r *routes) client(addr string) (pb.RoutingServiceClient, error) {
	if r.err != nil {
		return nil, r.err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		return nil, errShutdown
	}
	cc := r.conns[addr]
	if cc == nil {
		var err error
		cc, err = grpc.NewClient(addr, grpc.WithTransportCredentials(r.creds))
		if err != nil {
			return nil, fmt.Errorf("coordinator %s: %w", addr, err)
		}
		r.conns[addr] = cc
	}
	return pb.NewRoutingServiceClient(cc), nil
}

func (r *routes) close() {
	r.mu.Lock()
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()
	for _, cc := range conns {
		_ = cc.Close() // nothing is left to say to a coordinator we leave
	}
}

// token is the fencing token campaign work carries: the lease's while
// this coordinator leads, 0 without a lease (one coordinator) or while
// following (an operator's check relayed).
func (s *Server) token() int64 {
	if s.camp == nil || s.camp.lease == nil {
		return 0
	}
	t, _ := s.camp.lease.Token()
	return t
}

// remoteOwner is the address of the coordinator holding node's stream,
// when it is another one.
func (f *fleet) remoteOwner(ctx context.Context, node string) (string, bool) {
	owner, addr, err := f.s.store.NodeOwner(ctx, node)
	if err != nil || owner == "" || owner == f.s.holder || addr == "" {
		return "", false
	}
	return addr, true
}

// reachable says whether node has a stream here or on another coordinator.
func (f *fleet) reachable(ctx context.Context, node string) error {
	_, err := f.session(node)
	if err == nil {
		return nil
	}
	if _, ok := f.remoteOwner(ctx, node); ok {
		return nil
	}
	return err
}

// nodeWait is a call's wait for a node it lost: the grace (three
// heartbeat intervals, as for a lost stream) runs from the loss, and the
// wait ends early when a stream attaches here or when it is time to read
// the owner again.
type nodeWait struct {
	f     *fleet
	node  string
	grace time.Duration
	poll  time.Duration
	timer *time.Timer
	// over: the grace ran out and one last look was granted.
	over bool
}

func (f *fleet) newNodeWait(node string) *nodeWait {
	g := 3 * f.s.cfg.HeartbeatInterval
	return &nodeWait{f: f, node: node, grace: g, poll: min(max(g/10, 20*time.Millisecond), time.Second)}
}

// reached: the node was reached; a later loss has its own grace.
func (w *nodeWait) reached() {
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	w.over = false
}

// wait starts the grace if it is not running and waits for a reason to
// look again; errors once the grace is over or ctx is done.
func (w *nodeWait) wait(ctx context.Context, what string) error {
	gone := fmt.Errorf("node %s: stream lost during %s and not back on any coordinator within %s: %w", w.node, what, w.grace, kit.ErrUnreachable)
	if w.over {
		return gone
	}
	if w.timer == nil {
		w.timer = time.NewTimer(w.grace)
	}
	var back <-chan struct{}
	if e := w.f.s.reg.lookup(w.node); e != nil {
		e.mu.Lock()
		if e.sess == nil {
			back = e.backSignal()
		}
		e.mu.Unlock()
	}
	if back == nil && w.f.hasSession(w.node) {
		return nil
	}
	t := time.NewTimer(w.poll)
	defer t.Stop()
	select {
	case <-back:
	case <-t.C:
	case <-w.timer.C:
		w.timer = nil
		if w.f.hasSession(w.node) {
			return nil
		}
		if _, ok := w.f.remoteOwner(ctx, w.node); ok {
			w.over = true // one last try at the owner the store names
			return nil
		}
		return gone
	case <-ctx.Done():
		return ctx.Err()
	case <-w.f.s.stopping:
		return fmt.Errorf("node %s: coordinator stopping: %w", w.node, kit.ErrUnreachable)
	}
	return nil
}

func (w *nodeWait) stop() { w.reached() }

func (f *fleet) hasSession(node string) bool {
	_, err := f.session(node)
	return err == nil
}

// graceOver says whether a wait's error is the grace running out.
func graceOver(err error) bool { return errors.Is(err, kit.ErrUnreachable) }

// checkRun says whether sess's agent can take rc: parameters need
// protocol 1.1; a multi-node role needs 1.1 and a multi_node section.
func checkRun(sess *session, rc *pb.RunChecks) error {
	switch {
	case rc.GetRole() != pb.MultiRole_MULTI_ROLE_UNSPECIFIED && !speaksFeatures(sess.protocol):
		return fmt.Errorf("agent on %s speaks protocol %s; multi-node runs need %s: %w", sess.node, sess.protocol, version.Features1_1, kit.ErrRefused)
	case rc.GetRole() != pb.MultiRole_MULTI_ROLE_UNSPECIFIED && !sess.multiNode:
		return fmt.Errorf("agent on %s has no multi_node section in its config: %w", sess.node, kit.ErrRefused)
	case len(rc.GetParams()) > 0 && !speaksFeatures(sess.protocol):
		return fmt.Errorf("node %s: agent speaks protocol %s; run parameters need %s: %w", sess.node, sess.protocol, version.Features1_1, kit.ErrRefused)
	}
	return nil
}

// runOn sends rc (its work id is w's, recorded as dispatched to node) to
// node wherever its stream is, and waits for its outcome (or ACCEPTED).
// A stream lost here, or an owner that says the node left it or cannot
// be reached, starts the grace; within it the request goes again to
// wherever the node is then.
func (f *fleet) runOn(ctx context.Context, w *work, node string, rc *pb.RunChecks, timeout time.Duration, untilAccepted bool) (*pb.NodeOutcome, *store.Result, error) {
	msg := &pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_RunChecks{RunChecks: rc}}
	var resend *pb.CoordinatorMessage
	if rc.GetRole() == pb.MultiRole_MULTI_ROLE_UNSPECIFIED {
		resend = msg
	}
	nw := f.newNodeWait(node)
	defer nw.stop()
	what := "work " + w.id
	for first := true; ; first = false {
		if o, r, ok, err := w.verdict(node, untilAccepted); ok {
			return o, r, err
		}
		if sess, err := f.session(node); err == nil {
			if err := checkRun(sess, rc); err != nil {
				return nil, nil, err
			}
			if err := sendTo(sess, msg); err != nil {
				if first {
					return nil, nil, err
				}
			} else {
				nw.reached()
				o, r, err := f.await(ctx, w, node, sess, timeout, untilAccepted, resend, true)
				if !errors.Is(err, errLeft) {
					return o, r, err
				}
			}
		} else if addr, ok := f.remoteOwner(ctx, node); ok {
			o, r, final, err := f.routeWork(ctx, addr, node, rc, timeout, untilAccepted, nw)
			if final {
				return o, r, err
			}
		} else if first {
			return nil, nil, err
		}
		if err := nw.wait(ctx, what); err != nil {
			if graceOver(err) {
				return nil, nil, err
			}
			accepted, _, _ := w.state(node)
			return nil, nil, f.deadlineError(ctx, node, what, accepted, timeout)
		}
	}
}

// routeWork asks the owner at addr to run rc; final is false when the
// caller should look for the node again (it moved, or the owner is gone).
func (f *fleet) routeWork(ctx context.Context, addr, node string, rc *pb.RunChecks, timeout time.Duration, untilAccepted bool,
	nw *nodeWait) (o *pb.NodeOutcome, r *store.Result, final bool, err error) {
	cl, err := f.s.routes.client(addr)
	if err != nil {
		return nil, nil, true, fmt.Errorf("node %s: its coordinator %s: %v: %w", node, addr, err, kit.ErrUnreachable)
	}
	left := timeout
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl) - routeMargin
	}
	if left < minRouteTimeout {
		left = minRouteTimeout
	}
	var res *pb.RoutedOutcome
	moved, err := f.whileOwner(ctx, node, addr, nw.poll, func(ctx context.Context) (err error) {
		res, err = cl.RouteWork(ctx, &pb.RoutedWork{FencingToken: f.s.token(), Node: node, Run: rc, UntilAccepted: untilAccepted,
			TimeoutMs: left.Milliseconds(), Actor: ActorFrom(ctx)})
		return err
	})
	if err != nil {
		if ctx.Err() != nil || moved {
			return nil, nil, false, nil // the wait that follows says why, or the node is elsewhere now
		}
		f.s.log.Warn().Err(err).Str("node", node).Str("owner", addr).Str("work_id", rc.GetWorkId()).Msg("routing: the node's coordinator did not answer; looking for the node again")
		return nil, nil, false, nil
	}
	switch res.GetError() {
	case pb.RouteError_ROUTE_ERROR_UNSPECIFIED:
		nw.reached()
		if untilAccepted {
			return nil, nil, true, nil
		}
		o := res.GetOutcome()
		if o.GetStatus() == OutcomeRefused {
			return nil, nil, true, fmt.Errorf("node %s refused: %s: %w", node, o.GetReason(), kit.ErrRefused)
		}
		r, err := resultOfReport(o, res.GetReportJson())
		if err != nil {
			return nil, nil, true, fmt.Errorf("node %s: report from coordinator %s: %w", node, addr, err)
		}
		return o, r, true, nil
	case pb.RouteError_ROUTE_ERROR_NOT_HERE, pb.RouteError_ROUTE_ERROR_STOPPING:
		return nil, nil, false, nil
	case pb.RouteError_ROUTE_ERROR_LOST:
		nw.reached() // it was there: the grace runs from this loss
		return nil, nil, false, nil
	}
	return nil, nil, true, routeErr(node, addr, res.GetError(), res.GetMessage())
}

// whileOwner runs call (a routed RPC to the owner at addr) with a
// context that also ends when the store names another owner for node, or
// the node attaches here: the agent left an owner that froze or that
// cannot be reached, whose answer may never come. moved says that is why
// the call ended.
func (f *fleet) whileOwner(ctx context.Context, node, addr string, poll time.Duration, call func(context.Context) error) (moved bool, err error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	done := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Go(func() {
		t := time.NewTicker(min(max(3*poll, 100*time.Millisecond), 2*time.Second))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-cctx.Done():
				return
			case <-t.C:
			}
			now, ok := f.remoteOwner(cctx, node)
			if f.hasSession(node) || ok && now != addr {
				mu.Lock()
				moved = true
				mu.Unlock()
				f.s.log.Info().Str("node", node).Str("from", addr).Str("to", now).Msg("routing: the node moved during the call; following it")
				cancel()
				return
			}
		}
	})
	err = call(cctx)
	close(done)
	watcher.Wait()
	mu.Lock()
	defer mu.Unlock()
	return moved, err
}

// routeErr is a final routing error as the Fleet's errors say it.
func routeErr(node, addr string, e pb.RouteError, msg string) error {
	switch e {
	case pb.RouteError_ROUTE_ERROR_REFUSED:
		return fmt.Errorf("node %s (on coordinator %s): %s: %w", node, addr, msg, kit.ErrRefused)
	case pb.RouteError_ROUTE_ERROR_TIMEOUT:
		return fmt.Errorf("node %s (on coordinator %s): %s: %w", node, addr, msg, kit.ErrTimeout)
	case pb.RouteError_ROUTE_ERROR_FENCED:
		return fmt.Errorf("node %s: coordinator %s refused the work: %s: %w", node, addr, msg, kit.ErrRefused)
	}
	return fmt.Errorf("node %s: coordinator %s: %s: %s", node, addr, strings.ToLower(strings.TrimPrefix(e.String(), "ROUTE_ERROR_")), msg)
}

// resultOfReport rebuilds, from the owner's answer, what a local call has
// from its stored result.
func resultOfReport(o *pb.NodeOutcome, doc []byte) (*store.Result, error) {
	if len(doc) == 0 {
		return nil, nil
	}
	var rep report.Report
	if err := json.Unmarshal(doc, &rep); err != nil {
		return nil, err
	}
	r := &store.Result{ID: o.GetResultId(), Node: rep.Node, Status: rep.Status, Checks: rep.Checks, Inventory: &rep.Inventory}
	if rep.CollectedAt != "" {
		if t, err := time.Parse(time.RFC3339, rep.CollectedAt); err == nil {
			r.Finished = t
		}
	}
	return r, nil
}

// verdict is node's target as a call ends on it: refused (an error), an
// outcome, or ACCEPTED when that is all the call waits for; ok false
// while it is pending.
func (w *work) verdict(node string, untilAccepted bool) (o *pb.NodeOutcome, r *store.Result, ok bool, err error) {
	accepted, o, r := w.state(node)
	switch {
	case o != nil && o.GetStatus() == OutcomeRefused:
		return nil, nil, true, fmt.Errorf("node %s refused: %s: %w", node, o.GetReason(), kit.ErrRefused)
	case o != nil:
		return o, r, true, nil
	case accepted && untilAccepted:
		return nil, nil, true, nil
	}
	return nil, nil, false, nil
}

// actionOn sends req to node wherever its stream is and waits for its
// final status; like runOn, a lost node is looked for again within the
// grace and the request (same id) goes to wherever it is then.
func (f *fleet) actionOn(ctx context.Context, node string, req *pb.RunAction, timeout time.Duration) (kit.ActionResult, error) {
	s := f.s
	pa := s.acts.add(req.ActionId, node)
	defer s.acts.drop(pa)
	msg := &pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_RunAction{RunAction: req}}
	nw := f.newNodeWait(node)
	defer nw.stop()
	what := "action " + req.ActionId
	accepted := false
	for first := true; ; first = false {
		if sess, err := f.session(node); err == nil {
			if err := checkAction(sess, req.Action); err != nil {
				return kit.ActionResult{}, err
			}
			if err := sendTo(sess, msg); err != nil {
				if first {
					return kit.ActionResult{}, err
				}
			} else {
				nw.reached()
				res, acc, err := f.awaitAction(ctx, pa, sess, timeout, req, true)
				accepted = accepted || acc
				if !errors.Is(err, errLeft) {
					return res, err
				}
			}
		} else if addr, ok := f.remoteOwner(ctx, node); ok {
			res, final, err := f.routeAction(ctx, addr, node, req, timeout, nw)
			if final {
				return res, err
			}
		} else if first {
			return kit.ActionResult{}, err
		}
		if err := nw.wait(ctx, what); err != nil {
			if graceOver(err) {
				return kit.ActionResult{}, err
			}
			return kit.ActionResult{}, f.deadlineError(ctx, node, what, accepted, timeout)
		}
	}
}

func (f *fleet) routeAction(ctx context.Context, addr, node string, req *pb.RunAction, timeout time.Duration, nw *nodeWait) (res kit.ActionResult, final bool, err error) {
	cl, err := f.s.routes.client(addr)
	if err != nil {
		return kit.ActionResult{}, true, fmt.Errorf("node %s: its coordinator %s: %v: %w", node, addr, err, kit.ErrUnreachable)
	}
	left := timeout
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl) - routeMargin
	}
	left = max(left, minRouteTimeout)
	var out *pb.RoutedActionResult
	moved, err := f.whileOwner(ctx, node, addr, nw.poll, func(ctx context.Context) (err error) {
		out, err = cl.RouteAction(ctx, &pb.RoutedAction{FencingToken: f.s.token(), Node: node, Action: req, TimeoutMs: left.Milliseconds(), Actor: ActorFrom(ctx)})
		return err
	})
	if err != nil {
		if ctx.Err() == nil && !moved {
			f.s.log.Warn().Err(err).Str("node", node).Str("owner", addr).Str("action_id", req.ActionId).Msg("routing: the node's coordinator did not answer; looking for the node again")
		}
		return kit.ActionResult{}, false, nil
	}
	switch out.GetError() {
	case pb.RouteError_ROUTE_ERROR_UNSPECIFIED:
		return kit.ActionResult{OK: out.GetOk(), Message: out.GetResultMessage(), Output: out.GetOutput()}, true, nil
	case pb.RouteError_ROUTE_ERROR_NOT_HERE, pb.RouteError_ROUTE_ERROR_STOPPING:
		return kit.ActionResult{}, false, nil
	case pb.RouteError_ROUTE_ERROR_LOST:
		nw.reached()
		return kit.ActionResult{}, false, nil
	case pb.RouteError_ROUTE_ERROR_REFUSED:
		return kit.ActionResult{Message: out.GetResultMessage()}, true, fmt.Errorf("node %s refused %s: %s: %w", node, req.ActionId, out.GetMessage(), kit.ErrRefused)
	}
	return kit.ActionResult{}, true, routeErr(node, addr, out.GetError(), out.GetMessage())
}

// checkAction says whether sess's agent can take the action.
func checkAction(sess *session, action string) error {
	switch {
	case !speaksFeatures(sess.protocol):
		return fmt.Errorf("node %s: agent speaks protocol %s; actions need %s: %w", sess.node, sess.protocol, version.Features1_1, kit.ErrRefused)
	case !slices.Contains(sess.actions, action):
		return fmt.Errorf("node %s: action %q is not in the agent's config (it has: %s): %w",
			sess.node, action, strings.Join(sess.actions, ", "), kit.ErrRefused)
	}
	return nil
}

// routingService is RoutingService: the other coordinators' requests for
// the agents whose streams are here.
type routingService struct {
	pb.UnimplementedRoutingServiceServer
	s *Server
}

// admit checks who calls (a coordinator: authz lets no other
// certificate through; without authz, no node or operator identity) and
// the fencing token: a campaign's must be the lease's now; 0 (an
// operator's check relayed) only where allowZero.
func (r *routingService) admit(ctx context.Context, token int64, allowZero bool) (pb.RouteError, string, error) {
	s := r.s
	if !s.ready.Load() {
		return pb.RouteError_ROUTE_ERROR_STOPPING, "coordinator not serving", nil
	}
	if a, ok := authz.IdentityFrom(ctx); ok {
		if !a.Anonymous && a.Kind != pki.KindCoordinator {
			return 0, "", status.Errorf(codes.PermissionDenied, "%s may not route work", a.Actor())
		}
	} else if id := s.opts.Identify(ctx); id.Kind == NodeIdentity || id.Kind == AdminIdentity {
		return 0, "", status.Errorf(codes.PermissionDenied, "%s may not route work", id.Actor())
	}
	if token == 0 && allowZero {
		return 0, "", nil
	}
	if token <= 0 {
		return pb.RouteError_ROUTE_ERROR_FENCED, "no fencing token: only the leader's campaigns send this", nil
	}
	if s.camp == nil || s.camp.lease == nil {
		return pb.RouteError_ROUTE_ERROR_FENCED, "this coordinator takes part in no leader election", nil
	}
	cur, err := s.camp.lease.Current(ctx)
	switch {
	case err != nil:
		return pb.RouteError_ROUTE_ERROR_FENCED, "the lease cannot be read: " + err.Error(), nil
	case cur.Token != token || !cur.Valid:
		return pb.RouteError_ROUTE_ERROR_FENCED, fmt.Sprintf("token %d is stale: %s leads with token %d (valid %v)", token, cur.Holder, cur.Token, cur.Valid), nil
	}
	return 0, "", nil
}

// validMulti bounds a multi-node request's participants and id.
func validMulti(participants []string, id string) error {
	if len(participants) > maxMultiNodes || len(id) > 128 {
		return fmt.Errorf("a multi-node run has at most %d participants and an id of at most 128 bytes", maxMultiNodes)
	}
	for _, p := range participants {
		if err := validNodeName(p); err != nil {
			return fmt.Errorf("participant: %w", err)
		}
	}
	return nil
}

func routeTimeout(ms int64) (time.Duration, error) {
	if ms < minRouteTimeout.Milliseconds() || ms > maxRouteTimeout.Milliseconds() {
		return 0, fmt.Errorf("timeout_ms %d: must be within %s..%s", ms, minRouteTimeout, maxRouteTimeout)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// routeKind maps a local call's error onto the RouteError the caller
// reads.
func routeKind(err error) pb.RouteError {
	switch {
	case errors.Is(err, errLeft):
		return pb.RouteError_ROUTE_ERROR_LOST
	case errors.Is(err, kit.ErrRefused):
		return pb.RouteError_ROUTE_ERROR_REFUSED
	case errors.Is(err, kit.ErrTimeout):
		return pb.RouteError_ROUTE_ERROR_TIMEOUT
	case errors.Is(err, kit.ErrUnreachable):
		return pb.RouteError_ROUTE_ERROR_LOST
	}
	return pb.RouteError_ROUTE_ERROR_INVALID
}

func (r *routingService) RouteWork(ctx context.Context, req *pb.RoutedWork) (*pb.RoutedOutcome, error) {
	s := r.s
	if kind, msg, err := r.admit(ctx, req.GetFencingToken(), true); err != nil || kind != 0 {
		return &pb.RoutedOutcome{Error: kind, Message: msg}, err
	}
	rc := req.GetRun()
	node := req.GetNode()
	invalid := func(err error) (*pb.RoutedOutcome, error) {
		return &pb.RoutedOutcome{Error: pb.RouteError_ROUTE_ERROR_INVALID, Message: err.Error()}, nil
	}
	if err := validNodeName(node); err != nil {
		return invalid(err)
	}
	if rc == nil || rc.GetWorkId() == "" || len(rc.GetWorkId()) > 128 {
		return invalid(errors.New("a RunChecks with a work id (at most 128 bytes) is required"))
	}
	if err := validCheckNames(rc.GetChecks()); err != nil {
		return invalid(err)
	}
	if err := validFleetParams(rc.GetParams()); err != nil {
		return invalid(err)
	}
	if err := validMulti(rc.GetParticipants(), rc.GetMultiId()); err != nil {
		return invalid(err)
	}
	timeout, err := routeTimeout(req.GetTimeoutMs())
	if err != nil {
		return invalid(err)
	}
	f := &fleet{s: s}
	sess, err := f.session(node)
	if err != nil {
		return &pb.RoutedOutcome{Error: pb.RouteError_ROUTE_ERROR_NOT_HERE, Message: err.Error()}, nil
	}
	if err := checkRun(sess, rc); err != nil {
		return &pb.RoutedOutcome{Error: pb.RouteError_ROUTE_ERROR_REFUSED, Message: err.Error()}, nil
	}
	// The caller recorded the dispatch; a result naming the work is
	// accepted from the node only if it did.
	if sent, err := s.store.Dispatched(ctx, rc.GetWorkId(), node); err != nil || !sent {
		if err == nil {
			err = fmt.Errorf("work %s was never recorded as dispatched to %s", rc.GetWorkId(), node)
		}
		return invalid(err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	w := newWork(rc.GetWorkId())
	w.addTarget(node, sess)
	w.markSent(node, true)
	w.nudgeOnAccept = req.GetUntilAccepted()
	s.works.addRouted(w, node)
	defer s.works.dropRouted(w, node)
	s.log.Debug().Str("node", node).Str("work_id", w.id).Str("for", req.GetActor()).Msg("routing: work from another coordinator")
	msg := &pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_RunChecks{RunChecks: rc}}
	if err := sendTo(sess, msg); err != nil {
		return &pb.RoutedOutcome{Error: pb.RouteError_ROUTE_ERROR_LOST, Message: err.Error()}, nil
	}
	var resend *pb.CoordinatorMessage
	if rc.GetRole() == pb.MultiRole_MULTI_ROLE_UNSPECIFIED {
		resend = msg
	}
	o, res, err := f.await(ctx, w, node, sess, timeout, req.GetUntilAccepted(), resend, true)
	if err != nil {
		var rerr pb.RouteError
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			rerr = pb.RouteError_ROUTE_ERROR_TIMEOUT
		} else {
			rerr = routeKind(err)
		}
		if strings.Contains(err.Error(), "coordinator stopping") {
			rerr = pb.RouteError_ROUTE_ERROR_STOPPING
		}
		return &pb.RoutedOutcome{Error: rerr, Message: err.Error()}, nil
	}
	out := &pb.RoutedOutcome{Accepted: true, Outcome: o}
	if o != nil && res != nil {
		rep, err := reportOf(node, o, res)
		if err != nil {
			return invalid(err)
		}
		if out.ReportJson, err = json.Marshal(rep); err != nil {
			return invalid(err)
		}
	}
	return out, nil
}

func (r *routingService) RouteAction(ctx context.Context, req *pb.RoutedAction) (*pb.RoutedActionResult, error) {
	s := r.s
	if kind, msg, err := r.admit(ctx, req.GetFencingToken(), false); err != nil || kind != 0 {
		return &pb.RoutedActionResult{Error: kind, Message: msg}, err
	}
	a := req.GetAction()
	node := req.GetNode()
	invalid := func(err error) (*pb.RoutedActionResult, error) {
		return &pb.RoutedActionResult{Error: pb.RouteError_ROUTE_ERROR_INVALID, Message: err.Error()}, nil
	}
	switch {
	case validNodeName(node) != nil:
		return invalid(validNodeName(node))
	case a == nil || !actionIDRE.MatchString(a.GetActionId()) || !fleetActionRE.MatchString(a.GetAction()):
		return invalid(errors.New("a RunAction with a valid action id and name is required"))
	case len(a.GetReason()) > maxActionReasonBytes:
		return invalid(fmt.Errorf("reason: at most %d bytes", maxActionReasonBytes))
	}
	if err := validFleetParams(a.GetParams()); err != nil {
		return invalid(err)
	}
	timeout, err := routeTimeout(req.GetTimeoutMs())
	if err != nil {
		return invalid(err)
	}
	f := &fleet{s: s}
	sess, err := f.session(node)
	if err != nil {
		return &pb.RoutedActionResult{Error: pb.RouteError_ROUTE_ERROR_NOT_HERE, Message: err.Error()}, nil
	}
	if err := checkAction(sess, a.GetAction()); err != nil {
		return &pb.RoutedActionResult{Error: pb.RouteError_ROUTE_ERROR_REFUSED, Message: err.Error()}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pa := s.acts.add(a.GetActionId(), node)
	defer s.acts.drop(pa)
	s.log.Info().Str("node", node).Str("action_id", a.GetActionId()).Str("action", a.GetAction()).Str("for", req.GetActor()).
		Int64("token", req.GetFencingToken()).Msg("routing: action from the leader")
	if err := sendTo(sess, &pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_RunAction{RunAction: a}}); err != nil {
		return &pb.RoutedActionResult{Error: pb.RouteError_ROUTE_ERROR_LOST, Message: err.Error()}, nil
	}
	res, _, err := f.awaitAction(ctx, pa, sess, timeout, a, true)
	if err != nil {
		rerr := routeKind(err)
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			rerr = pb.RouteError_ROUTE_ERROR_TIMEOUT
		}
		return &pb.RoutedActionResult{Error: rerr, Message: err.Error(), ResultMessage: res.Message}, nil
	}
	return &pb.RoutedActionResult{Ok: res.OK, ResultMessage: res.Message, Output: res.Output}, nil
}

// RouteEndMulti is not fenced: ending a run only releases a peer's
// reservation (or has it report its side), and a deposed leader calling
// off the runs of its ended term must reach its peers, or they stay
// reserved until their own timeout and the next leader's runs on them
// are refused.
func (r *routingService) RouteEndMulti(ctx context.Context, req *pb.RoutedEndMulti) (*pb.RouteAck, error) {
	if kind, msg, err := r.admit(ctx, 0, true); err != nil || kind != 0 {
		return &pb.RouteAck{Error: kind, Message: msg}, err
	}
	end := req.GetEnd()
	if err := validNodeName(req.GetNode()); err != nil || end == nil {
		return &pb.RouteAck{Error: pb.RouteError_ROUTE_ERROR_INVALID, Message: "a node and an EndMulti are required"}, nil
	}
	if err := validMulti([]string{end.GetLauncher()}, end.GetMultiId()); err != nil || end.GetMultiId() == "" ||
		len(end.GetLauncherResultId()) > 128 || len(end.GetAbortReason()) > maxReason {
		return &pb.RouteAck{Error: pb.RouteError_ROUTE_ERROR_INVALID, Message: fmt.Sprintf("EndMulti: a multi id and launcher, ids of at most 128 bytes, a reason of at most %d", maxReason)}, nil
	}
	sess, err := (&fleet{s: r.s}).session(req.GetNode())
	if err != nil {
		return &pb.RouteAck{Error: pb.RouteError_ROUTE_ERROR_NOT_HERE, Message: err.Error()}, nil
	}
	if !sess.trySend(&pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_EndMulti{EndMulti: req.GetEnd()}}) {
		return &pb.RouteAck{Error: pb.RouteError_ROUTE_ERROR_LOST, Message: "the node's stream is not taking messages"}, nil
	}
	return &pb.RouteAck{}, nil
}

// endMultiOn tells a peer the run is over, on its stream here or through
// its owner. A peer that misses it reports its side when its own timeout
// passes.
func (f *fleet) endMultiOn(ctx context.Context, node string, end *pb.EndMulti) {
	if sess, err := f.session(node); err == nil {
		sess.trySend(&pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_EndMulti{EndMulti: end}})
		return
	}
	// Also when the call's own context has ended (the usual reason to
	// call a run off).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	addr, ok := f.remoteOwner(ctx, node)
	if !ok {
		return
	}
	cl, err := f.s.routes.client(addr)
	if err != nil {
		return
	}
	if res, err := cl.RouteEndMulti(ctx, &pb.RoutedEndMulti{FencingToken: f.s.token(), Node: node, End: end}); err != nil || res.GetError() != 0 {
		f.s.log.Warn().Err(err).Str("node", node).Str("owner", addr).Str("refused", res.GetMessage()).Msg("routing: end of a multi-node run not delivered; the peer reports at its own timeout")
	}
}

// doneElsewhere handles an agent's DONE for a work whose result it
// already delivered, to another coordinator or to this one's previous
// stream: the result is in the store, and the call waiting here (a
// request sent again after the node moved) takes it from there.
func (s *Server) doneElsewhere(sess *session, ws *pb.WorkStatus) {
	if ws.GetState() != pb.WorkStatus_STATE_DONE || ws.GetResultId() == "" {
		return
	}
	w := s.works.lookup(ws.GetWorkId(), sess.node)
	if w == nil {
		return
	}
	if _, o, _ := w.state(sess.node); o != nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(sess.ctx, 10*time.Second)
		defer cancel()
		r, err := s.store.LoadResult(ctx, ws.GetResultId())
		switch {
		case err != nil:
			s.log.Warn().Err(err).Str("node", sess.node).Str("work_id", ws.GetWorkId()).Msg("work done, but its result cannot be read")
			return
		case r.Node != sess.node || r.WorkID != ws.GetWorkId():
			s.log.Warn().Str("node", sess.node).Str("work_id", ws.GetWorkId()).Str("result_id", r.ID).Msg("work done with a result of another node or work; ignored")
			return
		}
		s.works.result(r.WorkID, sess.node, &r)
	}()
}

// recordActivities writes the activities agents changed since the last
// sweep, so that a coordinator reaching a node through this one (the
// leader's sweep picks idle nodes) sees it.
func (s *Server) recordActivities(ctx context.Context) {
	changed := map[string]string{}
	seen := map[*session]int32{}
	for _, sess := range s.reg.sessions() {
		a := sess.activity.Load()
		if sess.actStored.Load() != a+1 {
			changed[sess.node] = activityName(pb.NodeActivity(a))
			seen[sess] = a
		}
	}
	if len(changed) == 0 {
		return
	}
	if err := s.store.SetActivities(ctx, s.holder, changed); err != nil {
		if ctx.Err() == nil {
			s.log.Warn().Err(err).Msg("record agent activities")
		}
		return
	}
	for sess, a := range seen {
		sess.actStored.Store(a + 1)
	}
}

// nodesElsewhere names the nodes whose streams other coordinators hold;
// none without ha: (one coordinator).
func (s *Server) nodesElsewhere(ctx context.Context) (map[string]store.Node, error) {
	out := map[string]store.Node{}
	if !s.cfg.HA.Enabled {
		return out, nil
	}
	nodes, err := s.store.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if n.Connected && n.Owner != "" && n.Owner != s.holder {
			out[n.Name] = n
		}
	}
	return out, nil
}

// relay runs an operator's check on a node another coordinator holds,
// for RunCheck: the outcome lands in w like a local one. A node that
// moved here gets the request on its stream, and its result comes in as
// for the others.
func (f *fleet) relay(ctx context.Context, w *work, node string, rc *pb.RunChecks, timeout time.Duration) {
	nw := f.newNodeWait(node)
	defer nw.stop()
	finish := func(status, reason string) {
		w.finish(node, &pb.NodeOutcome{Node: node, Status: status, Reason: reason})
	}
	for {
		if _, o, _ := w.state(node); o != nil {
			return
		}
		if sess, err := f.session(node); err == nil {
			if !sess.trySend(&pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_RunChecks{RunChecks: rc}}) {
				finish(OutcomeUnreachable, "stream lost before the work was sent")
			}
			return
		}
		if addr, ok := f.remoteOwner(ctx, node); ok {
			o, r, final, err := f.routeWork(ctx, addr, node, rc, timeout, false, nw)
			if final {
				switch {
				case err == nil:
					if r != nil {
						w.keepResult(node, r)
					}
					w.finish(node, o)
				case errors.Is(err, kit.ErrRefused):
					finish(OutcomeRefused, err.Error())
				case errors.Is(err, kit.ErrTimeout):
					finish(OutcomeTimeout, err.Error())
				case errors.Is(err, kit.ErrUnreachable):
					finish(OutcomeUnreachable, err.Error())
				default:
					finish(string(report.Error), err.Error())
				}
				return
			}
		}
		if err := nw.wait(ctx, "work "+w.id); err != nil {
			if graceOver(err) {
				finish(OutcomeUnreachable, err.Error())
			}
			return // the call's deadline: RunCheck gives the node its outcome
		}
	}
}
