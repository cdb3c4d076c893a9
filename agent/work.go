package agent

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/node/host"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// workItem is one RunChecks the agent accepted.
type workItem struct {
	id       string
	done     bool
	resultID string // empty until done, or when the result could not be kept
}

const (
	// maxRememberedWork bounds the finished work ids kept to answer a
	// repeated request without running it again.
	maxRememberedWork = 1024
	// maxRequestedChecks bounds one request: there are not that many checks.
	maxRequestedChecks = 64
)

// onRunChecks answers a request at once (ACCEPTED or REFUSED, with the
// reason) and runs accepted checks on their own goroutine, under the
// agent's context rather than the stream's: a reconnect does not lose
// them, and their result is spooled like any other.
func (a *Agent) onRunChecks(ctx context.Context, s *session, rc *fleetcheckv1.RunChecks) {
	id := rc.GetWorkId()
	log := a.log.With().Str("work_id", id).Strs("checks", clipAll(rc.GetChecks())).Logger()
	refuse := func(reason string) {
		a.o.metrics.Work("refused")
		log.Warn().Str("reason", reason).Msg("refused requested checks")
		s.enqueue(workStatus(id, fleetcheckv1.WorkStatus_STATE_REFUSED, reason, ""))
	}
	if id == "" {
		refuse("missing work_id")
		return
	}
	a.mu.Lock()
	w := a.work[id]
	a.mu.Unlock()
	if w != nil {
		// A repeat (the coordinator resends after a reconnect): never run twice.
		a.mu.Lock()
		done, resultID := w.done, w.resultID
		a.mu.Unlock()
		switch {
		case !done:
			s.enqueue(workStatus(id, fleetcheckv1.WorkStatus_STATE_ACCEPTED, "already running", ""))
		case resultID != "" && a.spool.Has(resultID):
			// The sender delivers it, DONE right after.
			s.enqueue(workStatus(id, fleetcheckv1.WorkStatus_STATE_ACCEPTED, "already done; result follows", ""))
		default:
			s.enqueue(workStatus(id, fleetcheckv1.WorkStatus_STATE_DONE, "already done", resultID))
		}
		return
	}
	multi := rc.GetRole() != fleetcheckv1.MultiRole_MULTI_ROLE_UNSPECIFIED
	var list []checks.Check
	var timeout time.Duration
	var reason string
	if multi {
		if reason = a.admitMulti(ctx, rc); reason == "" {
			timeout = a.requestTimeout(rc, a.cfg.MultiNode.Timeout.D(DefaultMultiNodeTimeout))
		}
	} else {
		list, timeout, reason = a.admit(ctx, rc)
	}
	if reason != "" {
		refuse(reason)
		return
	}
	// One disruptive run at a time: a multi-node run reserves the node
	// for its whole length, a disruptive check for its own.
	holder := ""
	switch {
	case multi:
		holder = "multi-node run " + rc.GetMultiId()
	case slices.ContainsFunc(list, checks.Check.Disruptive):
		holder = sharedDisruptive
	}
	a.mu.Lock()
	if a.running >= a.cfg.Work.MaxConcurrent {
		n := a.running
		a.mu.Unlock()
		refuse(fmt.Sprintf("busy: %d requested runs in progress (max %d)", n, a.cfg.Work.MaxConcurrent))
		return
	}
	if holder != "" {
		if by := a.reserveLocked(holder); by != "" {
			a.mu.Unlock()
			refuse("node reserved by " + by + ": no other disruptive check meanwhile")
			return
		}
	}
	a.running++
	w = &workItem{id: id}
	a.rememberLocked(w)
	a.mu.Unlock()

	s.enqueue(workStatus(id, fleetcheckv1.WorkStatus_STATE_ACCEPTED, "", ""))
	a.o.metrics.Work("accepted")
	if multi {
		log.Info().Dur("timeout_ms", timeout).Str("multi_id", rc.GetMultiId()).Str("role", rc.GetRole().String()).
			Strs("participants", rc.GetParticipants()).Msg("taking part in a multi-node run")
		a.startMulti(w, rc, timeout, holder)
		return
	}
	log.Info().Dur("timeout_ms", timeout).Strs("params", paramList(rc.GetParams())).Msg("running requested checks")
	params := host.RunParams(rc.GetParams())
	a.workWG.Go(func() { a.runWork(w, list, params, timeout, holder) })
}

// admit decides whether a request may run: every name known and enabled
// here, disruptive ones only in an allowed activity, the timeout clamped
// to the agent's limit. A non-empty reason refuses the request.
func (a *Agent) admit(ctx context.Context, rc *fleetcheckv1.RunChecks) ([]checks.Check, time.Duration, string) {
	names := rc.GetChecks()
	if len(names) > maxRequestedChecks {
		return nil, 0, fmt.Sprintf("too many checks requested (%d)", len(names))
	}
	list := a.passive
	if len(names) > 0 {
		for _, n := range names {
			if _, ok := a.known[n]; !ok {
				return nil, 0, fmt.Sprintf("unknown check %q", clip(n))
			}
			if _, ok := a.enabled[n]; !ok {
				return nil, 0, fmt.Sprintf("check %q is not enabled on this agent", n)
			}
		}
		// In the agent's order, each once, whatever the request's order.
		list = nil
		for _, n := range a.enabledNames {
			if slices.Contains(names, n) {
				list = append(list, a.enabled[n])
			}
		}
	}
	if len(list) == 0 {
		return nil, 0, "no checks enabled on this agent"
	}
	names = make([]string, 0, len(list))
	for _, c := range list {
		names = append(names, c.Name())
	}
	if why := admitParams(rc.GetParams(), names); why != "" {
		return nil, 0, why
	}
	for _, c := range list {
		if !c.Disruptive() {
			continue
		}
		if why := a.disruptiveRefusal(ctx, fmt.Sprintf("check %q", c.Name())); why != "" {
			return nil, 0, why
		}
	}
	return list, a.requestTimeout(rc, time.Duration(a.cfg.Work.MaxTimeout)), ""
}

// requestTimeout is the request's timeout (the default when it names
// none) clamped to limit.
func (a *Agent) requestTimeout(rc *fleetcheckv1.RunChecks, limit time.Duration) time.Duration {
	timeout := min(time.Duration(a.cfg.Work.DefaultTimeout), limit)
	if d := requestedDuration(rc.GetTimeoutMs(), limit); d > 0 {
		timeout = d
	}
	if rc.GetTimeoutMs() > limit.Milliseconds() {
		a.log.Debug().Str("work_id", rc.GetWorkId()).Int64("requested_ms", rc.GetTimeoutMs()).Dur("max_ms", limit).Msg("clamping requested timeout")
	}
	return timeout
}

// runWork inspects with the request's own deadline and spools the result;
// the sender delivers it followed by DONE. Requested runs read the state of
// the last scheduled pass but do not advance it: only the schedule, which
// runs every enabled check, decides what counts as seen.
func (a *Agent) runWork(w *workItem, list []checks.Check, params host.RunParams, timeout time.Duration, holder string) {
	wctx, cancel := context.WithTimeout(host.WithParams(a.ctx, params), timeout)
	defer cancel()
	a.mu.Lock()
	prev := a.state
	a.mu.Unlock()
	r, _ := a.inspect(wctx, list, prev, w.id)
	a.finishWork(w, r, holder)
}

// finishWork spools a requested run's result, ends the run (its
// reservation too) and, if the result could not be kept, says so.
func (a *Agent) finishWork(w *workItem, r *Result, holder string) {
	if a.ctx.Err() != nil {
		a.mu.Lock()
		a.running--
		a.releaseLocked(holder)
		a.mu.Unlock()
		a.log.Info().Str("work_id", w.id).Msg("agent stopping: requested run abandoned")
		return
	}
	err := a.store(r)
	a.mu.Lock()
	a.running--
	a.releaseLocked(holder)
	w.done = true
	if err == nil {
		w.resultID = r.ID
	}
	s := a.sess
	a.mu.Unlock()
	a.o.metrics.Work("done")
	if err != nil {
		a.log.Error().Err(err).Str("work_id", w.id).Msg("requested run finished but its result could not be kept")
		if s != nil {
			s.enqueue(workStatus(w.id, fleetcheckv1.WorkStatus_STATE_DONE, "result lost: "+err.Error(), ""))
		}
	}
}

// rememberLocked records an accepted request, forgetting the oldest
// finished ones beyond the bound.
func (a *Agent) rememberLocked(w *workItem) {
	a.work[w.id] = w
	a.workOrder = append(a.workOrder, w.id)
	for i := 0; len(a.work) > maxRememberedWork && i < len(a.workOrder); {
		old := a.work[a.workOrder[i]]
		if old == nil || old.done {
			delete(a.work, a.workOrder[i])
			a.workOrder = slices.Delete(a.workOrder, i, i+1)
			continue
		}
		i++
	}
}

// clip keeps names from a request short in logs and refusals.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func clipAll(names []string) []string {
	if len(names) > 16 {
		names = names[:16]
	}
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = clip(n)
	}
	return out
}
