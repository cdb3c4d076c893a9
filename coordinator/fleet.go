package coordinator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/selector"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/proto/version"
)

// Params a campaign may hand RunAction that are not the action's own: the
// coordinator lifts them into the request's fields (the drill engine's
// safety timers and its id).
const (
	ParamRevertAfter        = "revert_after"         // a Go duration
	ParamRevertOnDisconnect = "revert_on_disconnect" // a Go duration
	ParamDrillID            = "drill_id"
)

// Bounds on what a campaign sends; the agent validates the values.
const (
	maxFleetParams     = 16
	maxFleetParamValue = 256
	maxMultiNodes      = 64
)

var (
	fleetParamRE  = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)
	fleetActionRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$`)
)

// Fleet is the coordinator as campaigns see it (kit.Fleet), over the
// agent streams:
//
//   - Nodes lists the stored nodes a selector picks, with the live view's
//     connection and the activity the agent last reported.
//   - RunChecks sends one work to one node and waits for its stored
//     result; the report is rebuilt from it.
//   - RunMulti reserves the peers first (each must accept), then asks the
//     first node to launch, waits for its result and tells the peers the
//     run is over so each reports its side; any refusal calls the run off
//     cleanly.
//   - RunAction sends an action by name with its parameters, after an
//     audit event, and waits for DONE, FAILED or REFUSED.
//
// Errors wrap kit.ErrUnreachable (not connected, or the stream was
// lost and not back within three heartbeat intervals), ErrRefused (the
// agent's reason, or an agent too old for the request) and ErrTimeout (no
// answer within opts.Timeout). Every call is bounded by opts.Timeout
// (default 2m) and ctx.
func (s *Server) Fleet() kit.Fleet { return &fleet{s: s} }

type fleet struct{ s *Server }

var _ kit.Fleet = (*fleet)(nil)

// Nodes lists the nodes matching a label selector ("" = all).
func (f *fleet) Nodes(ctx context.Context, sel string) ([]kit.Node, error) {
	s := f.s
	parsed, err := selector.Parse(sel)
	if err != nil {
		return nil, fmt.Errorf("nodes: %w", err)
	}
	db := s.Store()
	if db == nil {
		return nil, errors.New("nodes: coordinator not started")
	}
	nodes, err := db.Nodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("nodes: %w", err)
	}
	out := make([]kit.Node, 0, len(nodes))
	for _, n := range nodes {
		if !parsed.Matches(n.Name, n.Labels) {
			continue
		}
		cn := kit.Node{Name: n.Name, Labels: n.Labels, State: n.State, Inventory: n.Inventory}
		reason := n.StateReason
		if n.Connected && n.Owner != "" && n.Owner != s.holder {
			// Another coordinator holds the stream: its writes are the
			// live view (work reaches the node through it, routing.go).
			cn.Connected, cn.Activity = true, n.Activity
		} else if e := s.reg.lookup(n.Name); e != nil {
			// The live view is fresher than the store for the state, the
			// connection and the activity.
			e.mu.Lock()
			if e.state != "" {
				cn.State = e.streamState() // campaigns never see the gossip hint
				reason = e.reason
			}
			if e.sess != nil {
				cn.Connected = true
				cn.Activity = activityName(pb.NodeActivity(e.sess.activity.Load()))
			}
			e.mu.Unlock()
		}
		if campaignOwned(cn.State) {
			cn.OutOfService, cn.OutOfServiceReason = true, reason
		}
		out = append(out, cn)
	}
	return out, nil
}

func activityName(a pb.NodeActivity) string {
	switch a {
	case pb.NodeActivity_NODE_ACTIVITY_BUSY:
		return "busy"
	case pb.NodeActivity_NODE_ACTIVITY_IDLE:
		return "idle"
	case pb.NodeActivity_NODE_ACTIVITY_DRAINED:
		return "drained"
	}
	return ""
}

// RunChecks runs named checks on one node and returns its report.
func (f *fleet) RunChecks(ctx context.Context, node string, names []string, opts kit.RunOptions) (*report.Report, error) {
	timeout, err := fleetTimeout(opts.Timeout)
	if err != nil {
		return nil, fmt.Errorf("run %s on %s: %w", strings.Join(names, ","), node, err)
	}
	if err := validCheckNames(names); err != nil {
		return nil, fmt.Errorf("run on %s: %w", node, err)
	}
	if err := validFleetParams(opts.Params); err != nil {
		return nil, fmt.Errorf("run %s on %s: %w", strings.Join(names, ","), node, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := f.reachable(ctx, node); err != nil {
		return nil, err
	}
	w, done, err := f.dispatch(ctx, []string{node})
	if err != nil {
		return nil, err
	}
	defer done()
	rc := &pb.RunChecks{WorkId: w.id, Checks: names, TimeoutMs: agentTimeout(timeout).Milliseconds(), Params: opts.Params}
	o, r, err := f.runOn(ctx, w, node, rc, timeout, false)
	if err != nil {
		return nil, err
	}
	return reportOf(node, o, r)
}

// RunMulti runs a multi-node check: nodes[0] launches, the others take
// part. It returns the launcher's report; each peer's side is stored as
// its own result under the same work id.
func (f *fleet) RunMulti(ctx context.Context, nodes []string, check string, opts kit.RunOptions) (*report.Report, error) {
	what := fmt.Sprintf("run %s across %s", check, strings.Join(nodes, ","))
	timeout, err := fleetTimeout(opts.Timeout)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := validCheckNames([]string{check}); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(nodes) < 2 || len(nodes) > maxMultiNodes {
		return nil, fmt.Errorf("%s: %d nodes; a multi-node run takes 2 to %d", what, len(nodes), maxMultiNodes)
	}
	seen := map[string]bool{}
	for _, n := range nodes {
		if err := validNodeName(n); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if seen[n] {
			return nil, fmt.Errorf("%s: node %s named twice", what, n)
		}
		seen[n] = true
	}
	if len(opts.Params) > 0 {
		return nil, fmt.Errorf("%s: a multi-node run takes no parameters (the agents' multi_node.launcher_command fixes them): %w", what, kit.ErrRefused)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// Every node is reachable (here or through its coordinator) before
	// anything is sent; what each agent can do is checked where its
	// stream is, as its part is sent.
	for _, n := range nodes {
		if err := f.reachable(ctx, n); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if sess, err := f.session(n); err == nil {
			if err := checkRun(sess, &pb.RunChecks{Role: pb.MultiRole_MULTI_ROLE_PEER}); err != nil {
				return nil, fmt.Errorf("%s: %w", what, err)
			}
		}
	}
	w, done, err := f.dispatch(ctx, nodes)
	if err != nil {
		return nil, err
	}
	defer done()
	w.mu.Lock()
	w.nudgeOnAccept = true
	w.mu.Unlock()
	run := func(role pb.MultiRole, d time.Duration) *pb.RunChecks {
		return &pb.RunChecks{
			WorkId: w.id, Checks: []string{check}, TimeoutMs: d.Milliseconds(),
			Role: role, Participants: nodes, MultiId: w.id,
		}
	}
	launcher, peers := nodes[0], nodes[1:]
	for _, n := range nodes {
		f.callOffStale(ctx, n)
	}
	// Peers first: the launcher starts only once every peer is reserved.
	var joined []string
	callOff := func(why string) {
		for _, p := range joined {
			f.endMultiOn(ctx, p, &pb.EndMulti{MultiId: w.id, Launcher: launcher, AbortReason: why})
		}
	}
	for _, p := range peers {
		// A peer holds its reservation past this call's end, so that the
		// EndMulti sent when the call gives up reaches it first.
		joined = append(joined, p)
		o, _, err := f.runOn(ctx, w, p, run(pb.MultiRole_MULTI_ROLE_PEER, timeout+peerMargin), timeout, true)
		if err == nil && o != nil {
			err = fmt.Errorf("node %s ended its part before the run: %s: %s", p, o.GetStatus(), o.GetReason())
		}
		if err != nil {
			callOff(fmt.Sprintf("peer %s did not join: %v", p, err))
			return nil, fmt.Errorf("%s: peer did not join: %w", what, err)
		}
	}
	// The launcher has what is left of the call, less the margin that lets
	// it report its own timeout first.
	left := timeout
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	if left <= 0 {
		callOff("the call's time ran out before the launch")
		return nil, fmt.Errorf("%s: no time left to launch within %s: %w", what, timeout, kit.ErrTimeout)
	}
	o, r, err := f.runOn(ctx, w, launcher, run(pb.MultiRole_MULTI_ROLE_LAUNCHER, agentTimeout(left)), timeout, false)
	if err == nil {
		var rep *report.Report
		if rep, err = reportOf(launcher, o, r); err == nil {
			end := &pb.EndMulti{MultiId: w.id, Launcher: launcher, LauncherResultId: r.ID}
			if c := rep.Check(check); c != nil {
				end.Check = wire.CheckToProto(*c)
			} else {
				end.AbortReason = "the launcher's result has no " + check
			}
			for _, p := range peers {
				f.endMultiOn(ctx, p, end)
			}
			return rep, nil
		}
	}
	callOff(fmt.Sprintf("launcher %s: %v", launcher, err))
	return nil, fmt.Errorf("%s: launcher: %w", what, err)
}

// RunAction runs an agent-configured action by name. The drill engine's
// revert_after and revert_on_disconnect parameters become the request's
// revert timers and drill_id its reason; every other parameter goes to
// the agent, which checks it against its config.
func (f *fleet) RunAction(ctx context.Context, node, action string, params map[string]string, opts kit.RunOptions) (kit.ActionResult, error) {
	s := f.s
	if params == nil {
		params = opts.Params
	}
	timeout, err := fleetTimeout(opts.Timeout)
	if err != nil {
		return kit.ActionResult{}, fmt.Errorf("action %s on %s: %w", action, node, err)
	}
	if !fleetActionRE.MatchString(action) {
		return kit.ActionResult{}, fmt.Errorf("action %q on %s: lowercase letters, digits, '.', '_', '-' (at most 64)", action, node)
	}
	req := &pb.RunAction{Action: action, TimeoutMs: agentTimeout(timeout).Milliseconds(), Params: map[string]string{}}
	for k, v := range params {
		switch k {
		case ParamRevertAfter, ParamRevertOnDisconnect:
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return kit.ActionResult{}, fmt.Errorf("action %s on %s: %s %q: want a positive duration", action, node, k, v)
			}
			if k == ParamRevertAfter {
				req.RevertAfterMs = d.Milliseconds()
			} else {
				req.RevertOnDisconnectMs = d.Milliseconds()
			}
		case ParamDrillID:
			req.Reason = "drill " + v
		default:
			req.Params[k] = v
		}
	}
	if err := validFleetParams(req.Params); err != nil {
		return kit.ActionResult{}, fmt.Errorf("action %s on %s: %w", action, node, err)
	}
	if len(req.Reason) > maxActionReasonBytes {
		req.Reason = req.Reason[:maxActionReasonBytes]
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := f.reachable(ctx, node); err != nil {
		return kit.ActionResult{}, err
	}
	if sess, err := f.session(node); err == nil {
		if err := checkAction(sess, action); err != nil {
			return kit.ActionResult{}, err
		}
	}
	req.ActionId = newActionID(s.now())
	if opts.ID != "" {
		if !actionIDRE.MatchString(opts.ID) {
			return kit.ActionResult{}, fmt.Errorf("action %s on %s: id %q: letters, digits, '.', '_', ':', '-' (at most 128)", action, node, opts.ID)
		}
		req.ActionId = opts.ID
	}
	// Recorded before it is sent: what, where, with what and on whose behalf.
	actor := ActorFrom(ctx)
	if !strings.HasPrefix(actor, "campaign") {
		actor = "campaign"
	}
	detail := fmt.Sprintf("%s on %s (%s)", action, node, req.ActionId)
	if ps := paramList(params); len(ps) > 0 {
		detail += " with " + strings.Join(ps, " ")
	}
	if err := s.AuditNode(ctx, node, actor, "action", detail); err != nil {
		return kit.ActionResult{}, fmt.Errorf("action %s on %s not sent: %w", action, node, err)
	}
	return f.actionOn(ctx, node, req, timeout)
}

// peerMargin is how much longer a multi-node peer stays reserved than the
// call that asked it.
const peerMargin = 30 * time.Second

// maxActionReasonBytes bounds RunAction's reason, as the proto says.
const maxActionReasonBytes = 256

// awaitAction waits for an action's final status. When the node comes
// back on a new stream the request is sent again, same id: an agent that
// still runs it answers (it never runs an id twice), and one that was
// restarted, which lost the action with its process, runs it now instead
// of leaving the call waiting for an answer that cannot come.
//
// With leave set, a lost stream with none back here ends the wait at once
// (errLeft): the caller looks for the node on the other coordinators.
func (f *fleet) awaitAction(ctx context.Context, pa *pendingAction, sess *session, timeout time.Duration, req *pb.RunAction,
	leave bool) (res kit.ActionResult, accepted bool, err error) {
	lost := f.watchStream(pa.node, sess)
	defer lost.stop()
	sentOn := sess
	resend := func() {
		if lost.cur == nil || lost.cur == sentOn {
			return
		}
		sentOn = lost.cur
		if err := sendTo(sentOn, &pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_RunAction{RunAction: req}}); err == nil {
			f.s.log.Info().Str("node", pa.node).Str("action_id", pa.id).Msg("action sent again on the node's new stream")
		}
	}
	for {
		select {
		case st := <-pa.updates:
			switch st.GetState() {
			case pb.ActionStatus_STATE_ACCEPTED:
				accepted = true
			case pb.ActionStatus_STATE_REFUSED:
				return kit.ActionResult{Message: st.GetMessage()}, accepted, fmt.Errorf("node %s refused %s: %s: %w", pa.node, pa.id, st.GetMessage(), kit.ErrRefused)
			case pb.ActionStatus_STATE_DONE, pb.ActionStatus_STATE_FAILED:
				return kit.ActionResult{OK: st.GetState() == pb.ActionStatus_STATE_DONE, Message: st.GetMessage(), Output: st.GetOutput()}, true, nil
			}
		case <-lost.gone():
			if lost.expired() {
				return kit.ActionResult{}, accepted, fmt.Errorf("node %s: stream lost during action %s and not back within %s: %w", pa.node, pa.id, lost.grace, kit.ErrUnreachable)
			}
			resend()
		case <-lost.changed():
			lost.check()
			if leave && lost.cur == nil {
				return kit.ActionResult{}, accepted, fmt.Errorf("node %s: action %s: %w", pa.node, pa.id, errLeft)
			}
			resend()
		case <-ctx.Done():
			return kit.ActionResult{}, accepted, f.deadlineError(ctx, pa.node, "action "+pa.id, accepted, timeout)
		case <-f.s.stopping:
			return kit.ActionResult{}, accepted, fmt.Errorf("node %s: coordinator stopping: %w", pa.node, kit.ErrUnreachable)
		}
	}
}

// session returns the node's current stream, or ErrUnreachable.
func (f *fleet) session(node string) (*session, error) {
	if e := f.s.reg.lookup(node); e != nil {
		e.mu.Lock()
		sess := e.sess
		e.mu.Unlock()
		if sess != nil && sess.ctx.Err() == nil {
			return sess, nil
		}
		return nil, fmt.Errorf("node %s: not connected: %w", node, kit.ErrUnreachable)
	}
	return nil, fmt.Errorf("node %s: unknown node: %w", node, kit.ErrUnreachable)
}

// dispatch registers a work for nodes, in the work table and in the
// store, before anything is sent (here or to the nodes' coordinators).
// done removes it from the table.
func (f *fleet) dispatch(ctx context.Context, nodes []string) (*work, func(), error) {
	s := f.s
	now := s.now()
	w := newWork(newWorkID(now))
	for _, n := range nodes {
		sess, _ := f.session(n)
		w.addTarget(n, sess)
		w.markSent(n, true)
	}
	if err := s.store.RecordDispatch(ctx, w.id, nodes, now); err != nil {
		return nil, nil, fmt.Errorf("record dispatch: %w", err)
	}
	s.works.add(w)
	return w, func() { s.works.drop(w) }, nil
}

// sendTo queues a message on a stream without waiting: a stream whose
// queue is full is not reading, as good as unreachable.
func sendTo(sess *session, m *pb.CoordinatorMessage) error {
	if sess.trySend(m) {
		return nil
	}
	if sess.ctx.Err() != nil {
		return fmt.Errorf("node %s: stream lost before the request was sent: %w", sess.node, kit.ErrUnreachable)
	}
	return fmt.Errorf("node %s: send queue full: %w", sess.node, kit.ErrUnreachable)
}

// await waits for node's outcome of w (or, with untilAccepted, for its
// ACCEPTED). A lost stream is given three heartbeat intervals to come
// back: the agent keeps running the work and delivers it on the new one.
// resend, when set, is the request, sent again on every new stream the
// node comes back on: an agent that restarted has forgotten the work,
// and one that did not answers a repeated work id without running it
// twice (ACCEPTED while it runs, DONE with the result it has).
//
// With leave set, a lost stream with none back here ends the wait at once
// (errLeft): the caller looks for the node on the other coordinators.
func (f *fleet) await(ctx context.Context, w *work, node string, sess *session, timeout time.Duration, untilAccepted bool,
	resend *pb.CoordinatorMessage, leave bool) (*pb.NodeOutcome, *store.Result, error) {
	lost := f.watchStream(node, sess)
	defer lost.stop()
	sentOn := sess
	again := func() {
		if resend == nil || lost.cur == nil || lost.cur == sentOn {
			return
		}
		sentOn = lost.cur
		if err := sendTo(lost.cur, resend); err != nil {
			f.s.log.Warn().Err(err).Str("node", node).Str("work_id", w.id).Msg("cannot send the work again on the node's new stream")
			return
		}
		f.s.log.Info().Str("node", node).Str("work_id", w.id).Msg("work sent again on the node's new stream")
	}
	for {
		accepted, o, r := w.state(node)
		switch {
		case o != nil && o.GetStatus() == OutcomeRefused:
			return nil, nil, fmt.Errorf("node %s refused: %s: %w", node, o.GetReason(), kit.ErrRefused)
		case o != nil:
			return o, r, nil
		case accepted && untilAccepted:
			return nil, nil, nil
		}
		select {
		case <-w.changed:
		case <-lost.gone():
			if lost.expired() {
				return nil, nil, fmt.Errorf("node %s: stream lost during the run and not back within %s: %w", node, lost.grace, kit.ErrUnreachable)
			}
			again()
		case <-lost.changed():
			lost.check()
			if leave && lost.cur == nil {
				return nil, nil, fmt.Errorf("node %s: work %s: %w", node, w.id, errLeft)
			}
			again()
		case <-ctx.Done():
			return nil, nil, f.deadlineError(ctx, node, "work "+w.id, accepted, timeout)
		case <-f.s.stopping:
			return nil, nil, fmt.Errorf("node %s: coordinator stopping: %w", node, kit.ErrUnreachable)
		}
	}
}

// deadlineError says why a wait ended with ctx: the caller gave up (its
// own error), or the timeout passed (unreachable when the node has no
// stream by then, else timed out).
func (f *fleet) deadlineError(ctx context.Context, node, what string, accepted bool, timeout time.Duration) error {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("node %s: %s: %w", node, what, ctx.Err())
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := f.reachable(rctx, node); err != nil {
		return fmt.Errorf("node %s: %s: not connected at the deadline (%s): %w", node, what, timeout, kit.ErrUnreachable)
	}
	if accepted {
		return fmt.Errorf("node %s: %s accepted, no answer within %s: %w", node, what, timeout, kit.ErrTimeout)
	}
	return fmt.Errorf("node %s: %s: no answer within %s: %w", node, what, timeout, kit.ErrTimeout)
}

// streamWatch follows a node's stream through a call: when it ends, the
// node has three heartbeat intervals to be back on a new one.
type streamWatch struct {
	f     *fleet
	node  string
	cur   *session
	grace time.Duration
	timer *time.Timer
	// lostC is nil while a stream is up.
	lostC <-chan time.Time
	// back, while no stream is up, is closed when one attaches.
	back <-chan struct{}
}

func (f *fleet) watchStream(node string, sess *session) *streamWatch {
	return &streamWatch{f: f, node: node, cur: sess, grace: 3 * f.s.cfg.HeartbeatInterval}
}

// changed fires when the followed stream ends or, while none is up,
// when a new one attaches.
func (w *streamWatch) changed() <-chan struct{} {
	if w.cur == nil {
		return w.back
	}
	return w.cur.ctx.Done()
}

// gone fires when the grace after a lost stream ran out.
func (w *streamWatch) gone() <-chan time.Time { return w.lostC }

// check follows a replacement stream, or starts the grace period.
func (w *streamWatch) check() {
	// The signal is taken before looking, so that a stream attaching in
	// between is not missed.
	w.back = nil
	if e := w.f.s.reg.lookup(w.node); e != nil {
		e.mu.Lock()
		w.back = e.backSignal()
		e.mu.Unlock()
	}
	if w.follow() {
		w.back = nil
		return
	}
	w.cur = nil
	if w.timer == nil {
		w.timer = time.NewTimer(w.grace)
		w.lostC = w.timer.C
	}
}

// expired is called when the grace ran out: true when the node is still
// without a stream; otherwise the new stream is followed.
func (w *streamWatch) expired() bool {
	w.timer, w.lostC = nil, nil
	return !w.follow()
}

// follow takes the node's current stream, if it has one.
func (w *streamWatch) follow() bool {
	sess, err := w.f.session(w.node)
	if err != nil {
		return false
	}
	w.cur = sess
	w.stop()
	return true
}

func (w *streamWatch) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
	w.timer, w.lostC = nil, nil
}

// reportOf turns a node's outcome and stored result into its report.
func reportOf(node string, o *pb.NodeOutcome, r *store.Result) (*report.Report, error) {
	if r == nil {
		return nil, fmt.Errorf("node %s: %s: %s", node, o.GetStatus(), o.GetReason())
	}
	rep := &report.Report{Node: r.Node, Status: r.Status, Checks: slices.Clone(r.Checks)}
	if r.Inventory != nil {
		rep.Inventory = *r.Inventory
	}
	if !r.Finished.IsZero() {
		rep.CollectedAt = r.Finished.UTC().Format(time.RFC3339)
	}
	return rep, nil
}

// fleetTimeout is a call's bound: opts.Timeout, 2m when unset.
func fleetTimeout(d time.Duration) (time.Duration, error) {
	if d == 0 {
		d = DefaultRunTimeout
	}
	if d < MinRunTimeout || d > MaxRunTimeout {
		return 0, fmt.Errorf("timeout %s: must be between %s and %s", d, MinRunTimeout, MaxRunTimeout)
	}
	return d, nil
}

// validFleetParams bounds parameters before they leave: names and sizes.
// What a value may be is the agent's call.
func validFleetParams(p map[string]string) error {
	if len(p) > maxFleetParams {
		return fmt.Errorf("%d parameters, at most %d", len(p), maxFleetParams)
	}
	for k, v := range p {
		if !fleetParamRE.MatchString(k) {
			return fmt.Errorf("parameter name %q: lowercase letters, digits and '_' (at most 32)", clipID(k))
		}
		if len(v) > maxFleetParamValue || strings.ContainsFunc(v, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return fmt.Errorf("parameter %s: at most %d bytes, no control characters", k, maxFleetParamValue)
		}
	}
	return nil
}

// paramList is "k=v" sorted, for the audit log.
func paramList(p map[string]string) []string {
	out := make([]string, 0, len(p))
	for _, k := range slices.Sorted(maps.Keys(p)) {
		out = append(out, k+"="+p[k])
	}
	return out
}

// speaksFeatures says whether an agent's protocol has params, multi-node
// roles and actions (1.1 and later of major 1).
func speaksFeatures(v string) bool {
	major, minor, ok := parseVersion(v)
	fm, fn, _ := parseVersion(version.Features1_1)
	return ok && (major > fm || major == fm && minor >= fn)
}
