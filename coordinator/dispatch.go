package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/report"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Outcome statuses beyond a result's own pass|warn|fail|error.
const (
	// OutcomeSkip: every check the node ran skipped (nothing to measure):
	// not a pass.
	OutcomeSkip        = string(report.Skip)
	OutcomeRefused     = "refused"
	OutcomeTimeout     = "timeout"
	OutcomeUnreachable = "unreachable"
)

// workTable holds the RunCheck calls in progress, by work id, so that work
// status and results coming in on agent streams find their call.
type workTable struct {
	mu sync.RWMutex
	m  map[string]*work
	// routed holds the works other coordinators route here, by work id
	// and node: one work of theirs may reach several nodes here, each in
	// its own call (routing.go).
	routed map[routedKey]*work
}

type routedKey struct{ id, node string }

func newWorkTable() *workTable {
	return &workTable{m: make(map[string]*work), routed: make(map[routedKey]*work)}
}

// addRouted registers a routed call's work for one node.
func (t *workTable) addRouted(w *work, node string) {
	t.mu.Lock()
	t.routed[routedKey{w.id, node}] = w
	t.mu.Unlock()
}

// dropRouted removes it, unless another call took its place since.
func (t *workTable) dropRouted(w *work, node string) {
	t.mu.Lock()
	if k := (routedKey{w.id, node}); t.routed[k] == w {
		delete(t.routed, k)
	}
	t.mu.Unlock()
}

// lookup is the work node's message about work id belongs to: a routed
// call's for that node, else this coordinator's own.
func (t *workTable) lookup(id, node string) *work {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if w := t.routed[routedKey{id, node}]; w != nil {
		return w
	}
	return t.m[id]
}

func (t *workTable) add(w *work) {
	t.mu.Lock()
	t.m[w.id] = w
	t.mu.Unlock()
}

func (t *workTable) remove(id string) {
	t.mu.Lock()
	delete(t.m, id)
	t.mu.Unlock()
}

// drop removes w unless another call took its id over since (a routed
// work sent again here under the same id).
func (t *workTable) drop(w *work) {
	t.mu.Lock()
	if t.m[w.id] == w {
		delete(t.m, w.id)
	}
	t.mu.Unlock()
}

func (t *workTable) get(id string) *work {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.m[id]
}

// progress counts the works in progress, their nodes, and the nodes with
// an outcome.
func (t *workTable) progress() (works, nodes, done int) {
	t.mu.RLock()
	ws := make([]*work, 0, len(t.m))
	for _, w := range t.m {
		ws = append(ws, w)
	}
	t.mu.RUnlock()
	for _, w := range ws {
		w.mu.Lock()
		nodes += len(w.targets)
		done += w.done
		w.mu.Unlock()
	}
	return len(ws), nodes, done
}

// status applies an agent's WorkStatus.
func (t *workTable) status(node string, ws *pb.WorkStatus) {
	w := t.lookup(ws.GetWorkId(), node)
	if w == nil {
		return // finished or never ours: nothing waits for it
	}
	switch ws.GetState() {
	case pb.WorkStatus_STATE_ACCEPTED:
		w.accept(node)
	case pb.WorkStatus_STATE_REFUSED:
		reason := ws.GetReason()
		if reason == "" {
			reason = "refused by the agent"
		}
		w.finish(node, &pb.NodeOutcome{Node: node, Status: OutcomeRefused, Reason: reason})
	case pb.WorkStatus_STATE_DONE:
		if ws.GetResultId() == "" {
			reason := ws.GetReason()
			if reason == "" {
				reason = "agent reported done without a result"
			}
			w.finish(node, &pb.NodeOutcome{Node: node, Status: string(report.Error), Reason: reason})
		}
		// With a result id, the result itself (acked once stored) decides.
	}
}

// result records a stored result that carries a work id.
func (t *workTable) result(workID, node string, r *store.Result) {
	w := t.lookup(workID, node)
	if w == nil {
		return
	}
	w.keepResult(node, r)
	w.finish(node, &pb.NodeOutcome{Node: node, Status: outcomeStatus(r), Reason: resultReason(r), ResultId: r.ID})
}

// outcomeStatus is the result's status, except that a result whose checks
// all skipped is "skip": the node measured nothing, which is not a pass.
func outcomeStatus(r *store.Result) string {
	if len(r.Checks) > 0 && skippedChecks(r.Checks) == len(r.Checks) {
		return OutcomeSkip
	}
	return string(r.Status)
}

func skippedChecks(cs []report.CheckResult) int {
	n := 0
	for _, c := range cs {
		if c.Status == report.Skip {
			n++
		}
	}
	return n
}

// resultReason names a result's checks that did not pass, worst first,
// then the ones that skipped ("2 skipped: gpu.nvlink (no nvidia-smi-nvlink.txt), ...").
func resultReason(r *store.Result) string {
	var bad []store.CheckState
	var skipped []string
	for _, c := range r.Checks {
		switch c.Status {
		case report.Fail, report.Error, report.Warn:
			bad = append(bad, store.CheckState{Name: c.Name, Status: c.Status, Detail: store.CheckDetail(c)})
		case report.Skip:
			s := c.Name
			if c.Reason != "" {
				s += " (" + c.Reason + ")"
			}
			skipped = append(skipped, s)
		}
	}
	out := describe(bad)
	if len(skipped) > 0 {
		if len(skipped) > 3 {
			skipped = append(skipped[:3], fmt.Sprintf("and %d more", len(skipped)-3))
		}
		part := fmt.Sprintf("%d skipped: %s", skippedChecks(r.Checks), strings.Join(skipped, ", "))
		if out != "" {
			out += "; "
		}
		out += part
	}
	return out
}

// recordDispatch records, in the work and in the store, that w goes to
// the nodes of sessions. Whatever sends RunChecks calls it first: a result
// naming a work id is accepted only from a node the work went to
// (workSent), also long after the call and across a restart.
func (s *Server) recordDispatch(ctx context.Context, w *work, sessions []*session, now time.Time) error {
	nodes := make([]string, 0, len(sessions))
	for _, sess := range sessions {
		nodes = append(nodes, sess.node)
		w.markSent(sess.node, true)
	}
	return s.store.RecordDispatch(ctx, w.id, nodes, now)
}

// target is one node a work was sent to.
type target struct {
	sess     *session // nil when the node was not connected
	sent     bool     // the RunChecks went (or is going) to its stream
	accepted bool
	outcome  *pb.NodeOutcome
	// result is the stored result that completed the target (a Fleet
	// call rebuilds its report from it).
	result *store.Result
}

// work tracks one RunCheck call.
type work struct {
	id      string
	changed chan struct{} // a non-blocking nudge: progress moved

	mu                                   sync.Mutex
	targets                              map[string]*target
	pending                              int
	done, refused, failed, unreach, tout int
	// nudgeOnAccept: an ACCEPTED moves progress too (a multi-node run
	// waits for its peers to accept before it launches).
	nudgeOnAccept bool
}

func newWork(id string) *work {
	return &work{id: id, changed: make(chan struct{}, 1), targets: make(map[string]*target)}
}

// newWorkID makes an id an operator can read and nobody can guess twice.
func newWorkID(now time.Time) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on supported platforms; the clock alone
		// still makes a usable id.
		return fmt.Sprintf("w-%s", now.UTC().Format("20060102T150405.000000000"))
	}
	return fmt.Sprintf("w-%s-%s", now.UTC().Format("20060102T150405"), hex.EncodeToString(b[:]))
}

func (w *work) addTarget(node string, sess *session) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.targets[node]; ok {
		return
	}
	w.targets[node] = &target{sess: sess}
	w.pending++
}

// has says whether node is one of the work's targets.
func (w *work) has(node string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.targets[node]
	return ok
}

// markSent records that the work goes to node, or, with sent false, that
// it could not be queued after all.
func (w *work) markSent(node string, sent bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t := w.targets[node]; t != nil {
		t.sent = sent
	}
}

// sentTo says whether the work went to node.
func (w *work) sentTo(node string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := w.targets[node]
	return t != nil && t.sent
}

func (w *work) nudge() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *work) accept(node string) {
	w.mu.Lock()
	t := w.targets[node]
	if t != nil {
		t.accepted = true
	}
	nudge := t != nil && w.nudgeOnAccept
	w.mu.Unlock()
	if nudge {
		w.nudge()
	}
}

// keepResult keeps the stored result that completes node's target.
func (w *work) keepResult(node string, r *store.Result) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t := w.targets[node]; t != nil && t.outcome == nil {
		t.result = r
	}
}

// state returns node's target as it stands: accepted, its outcome (nil
// while pending) and the result that completed it.
func (w *work) state(node string) (accepted bool, o *pb.NodeOutcome, r *store.Result) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := w.targets[node]
	if t == nil {
		return false, nil, nil
	}
	return t.accepted, t.outcome, t.result
}

// finish sets a node's outcome once; later ones are ignored.
func (w *work) finish(node string, o *pb.NodeOutcome) {
	w.mu.Lock()
	t := w.targets[node]
	if t == nil || t.outcome != nil {
		w.mu.Unlock()
		return
	}
	t.outcome = o
	w.pending--
	w.done++
	switch o.Status {
	case OutcomeRefused:
		w.refused++
	case string(report.Fail), string(report.Error):
		w.failed++
	case OutcomeUnreachable:
		w.unreach++
	case OutcomeTimeout:
		w.tout++
	}
	w.mu.Unlock()
	w.nudge()
}

func (w *work) complete() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pending == 0
}

// expire gives every node still pending its outcome at the deadline: a
// node whose stream is gone is unreachable, one still connected timed out.
func (w *work) expire(timeout time.Duration) {
	w.mu.Lock()
	var late []string
	for node, t := range w.targets {
		if t.outcome == nil {
			late = append(late, node)
		}
	}
	w.mu.Unlock()
	for _, node := range late {
		w.mu.Lock()
		t := w.targets[node]
		sess, accepted := t.sess, t.accepted
		w.mu.Unlock()
		o := &pb.NodeOutcome{Node: node}
		switch {
		case sess == nil || sess.ctx.Err() != nil:
			o.Status, o.Reason = OutcomeUnreachable, "stream lost during the run"
		case accepted:
			o.Status, o.Reason = OutcomeTimeout, fmt.Sprintf("accepted, no result within %s", timeout)
		default:
			o.Status, o.Reason = OutcomeTimeout, fmt.Sprintf("no answer within %s", timeout)
		}
		w.finish(node, o)
	}
}

// progress is the message an operator sees; outcomes only when final.
func (w *work) progress(final bool) *pb.RunCheckProgress {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := &pb.RunCheckProgress{
		Total: int32(len(w.targets)), Done: int32(w.done), Refused: int32(w.refused), Failed: int32(w.failed),
		Unreachable: int32(w.unreach), TimedOut: int32(w.tout), Final: final, WorkId: w.id,
	}
	if final {
		for _, t := range w.targets {
			if t.outcome != nil {
				p.Outcomes = append(p.Outcomes, t.outcome)
			}
		}
		sort.Slice(p.Outcomes, func(i, j int) bool { return p.Outcomes[i].Node < p.Outcomes[j].Node })
	}
	return p
}
