package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// actionItem is one RunAction the agent accepted, kept to answer a repeat
// without running it twice.
type actionItem struct {
	id, name string
	done     bool
	state    fleetcheckv1.ActionStatus_State
	message  string
	output   string
}

const (
	// maxRunningActions bounds the actions running at once.
	maxRunningActions = 4
	// maxRememberedActions bounds the finished action ids kept.
	maxRememberedActions = 256
	// maxActionOutput is the tail of an action's output sent back.
	maxActionOutput = 16 << 10
	// maxActionReason bounds the request's reason kept for logs.
	maxActionReason = 256
)

// requestIDRE is what action and multi-node run ids may hold. Compiled on
// first use: the counted repetition costs 200 KB at every start of the
// node binary, also for run and analyze, which never see a request.
var requestIDRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
})

func actionStatus(id string, st fleetcheckv1.ActionStatus_State, msg, out string) *fleetcheckv1.AgentMessage {
	return &fleetcheckv1.AgentMessage{Msg: &fleetcheckv1.AgentMessage_ActionStatus{ActionStatus: &fleetcheckv1.ActionStatus{
		ActionId: id, State: st, Message: msg, Output: out,
	}}}
}

// onRunAction answers a request at once (ACCEPTED or REFUSED, with the
// reason) and runs an accepted action on its own goroutine under the
// agent's context: a lost stream does not stop it. A revert timer, when
// the action has a revert, is armed and on disk before the action runs.
func (a *Agent) onRunAction(ctx context.Context, s *session, ra *fleetcheckv1.RunAction) {
	id, name := ra.GetActionId(), ra.GetAction()
	log := a.log.With().Str("action_id", clip(id)).Str("action", clip(name)).Logger()
	refuse := func(reason string) {
		a.o.metrics.Work("refused")
		log.Warn().Str("reason", reason).Msg("refused action")
		s.enqueue(actionStatus(id, fleetcheckv1.ActionStatus_STATE_REFUSED, reason, ""))
	}
	if !requestIDRE().MatchString(id) {
		refuse("missing or malformed action_id")
		return
	}
	a.mu.Lock()
	if it := a.acts[id]; it != nil {
		// A repeat: never run twice; answer with what is known.
		st, msg, out := it.state, it.message, it.output
		if !it.done {
			st, msg, out = fleetcheckv1.ActionStatus_STATE_ACCEPTED, "already running", ""
		}
		a.mu.Unlock()
		s.enqueue(actionStatus(id, st, msg, out))
		return
	}
	a.mu.Unlock()

	cfg, ok := a.cfg.Actions[name]
	if !ok {
		refuse(fmt.Sprintf("action %q is not configured on this agent", clip(name)))
		return
	}
	if a.actions == nil {
		refuse("this host cannot run actions")
		return
	}
	params := ra.GetParams()
	if err := cfg.checkParams(params); err != nil {
		refuse(fmt.Sprintf("action %s: %v", name, err))
		return
	}
	timeout := cfg.timeout()
	if d := requestedDuration(ra.GetTimeoutMs(), timeout); d > 0 {
		timeout = d // a request may ask for less, never more
	}
	var arm *armedRevert
	// Clamped to revert_after_max however large the number sent.
	switch after := requestedDuration(ra.GetRevertAfterMs(), cfg.revertMax()); {
	case cfg.Revert == "" && (ra.GetRevertAfterMs() != 0 || ra.GetRevertOnDisconnectMs() != 0):
		refuse(fmt.Sprintf("action %s has no revert configured, so no revert timer can be armed", name))
		return
	case ra.GetRevertAfterMs() < 0 || ra.GetRevertOnDisconnectMs() < 0:
		refuse("negative revert timer")
		return
	case cfg.Revert != "":
		if after == 0 {
			after = time.Duration(cfg.RevertAfterDefault)
		}
		if after <= 0 {
			refuse(fmt.Sprintf("action %s is reverted by %s: the request must carry revert_after (the config sets no revert_after_default)", name, cfg.Revert))
			return
		}
		after = min(after, cfg.revertMax())
		// The revert must be able to run with what it is given.
		if err := a.cfg.Actions[cfg.Revert].checkParams(a.cfg.Actions[cfg.Revert].only(params)); err != nil {
			refuse(fmt.Sprintf("action %s: its revert %s could not run: %v", name, cfg.Revert, err))
			return
		}
		now := time.Now()
		arm = &armedRevert{
			ID: id, Action: name, Revert: cfg.Revert, Params: a.cfg.Actions[cfg.Revert].only(params),
			ArmedAt: now, Due: now.Add(after),
			OnDisconnect: config.Duration(requestedDuration(ra.GetRevertOnDisconnectMs(), cfg.revertMax())),
			Reason:       clipN(ra.GetReason(), maxActionReason),
		}
	}

	holder := ""
	if cfg.Disruptive {
		if why := a.disruptiveRefusal(ctx, "action "+name); why != "" {
			refuse(why)
			return
		}
		holder = "action " + name + " (" + id + ")"
	}
	a.mu.Lock()
	if a.actRunning >= maxRunningActions {
		n := a.actRunning
		a.mu.Unlock()
		refuse(fmt.Sprintf("busy: %d actions running (max %d)", n, maxRunningActions))
		return
	}
	if holder != "" {
		if by := a.reserveLocked(holder); by != "" {
			a.mu.Unlock()
			refuse(fmt.Sprintf("action %s is disruptive and the node is reserved by %s", name, by))
			return
		}
	}
	it := &actionItem{id: id, name: name}
	a.rememberActionLocked(it)
	a.actRunning++
	a.mu.Unlock()

	msg := ""
	if arm != nil {
		// On disk before the action runs: a crash mid-action still reverts.
		if err := a.reverts.arm(arm); err != nil {
			a.mu.Lock()
			a.actRunning--
			delete(a.acts, id)
			a.releaseLocked(holder)
			a.mu.Unlock()
			refuse(fmt.Sprintf("cannot keep the revert timer: %v", err))
			return
		}
		msg = fmt.Sprintf("%s armed for %s", cfg.Revert, config.FormatDuration(arm.Due.Sub(arm.ArmedAt).Round(time.Millisecond)))
		if arm.OnDisconnect > 0 {
			msg += fmt.Sprintf(", or %s without the coordinator", arm.OnDisconnect)
		}
	}
	s.enqueue(actionStatus(id, fleetcheckv1.ActionStatus_STATE_ACCEPTED, msg, ""))
	a.o.metrics.Work("accepted")
	log.Info().Strs("params", paramList(params)).Dur("timeout_ms", timeout).Str("reason", clipN(ra.GetReason(), maxActionReason)).
		Str("revert", msg).Msg("running action")
	a.workWG.Go(func() { a.finishAction(it, cfg, params, timeout, holder) })
}

// finishAction runs an accepted action, reports how it went, and after a
// revert that worked disarms the timers it answers. A pass follows every
// action: what it changed (a driver, a fault) shows in the next result.
func (a *Agent) finishAction(it *actionItem, cfg ActionConfig, params map[string]string, timeout time.Duration, holder string) {
	out, err := a.execAction(a.ctx, it.name, cfg, params, timeout)
	st, msg := fleetcheckv1.ActionStatus_STATE_DONE, "done"
	if err != nil {
		st, msg = fleetcheckv1.ActionStatus_STATE_FAILED, err.Error()
	}
	if err != nil && a.ctx.Err() != nil {
		// Cut short by our own stop, not failed: leave it unanswered, as a
		// requested run is, so the coordinator sends it again (same id) to
		// the restarted agent instead of judging the node on it.
		a.mu.Lock()
		a.actRunning--
		a.releaseLocked(holder)
		a.mu.Unlock()
		a.log.Info().Str("action_id", it.id).Str("action", it.name).Err(err).Msg("agent stopping: action cut short, left for the coordinator to send again")
		return
	}
	if st == fleetcheckv1.ActionStatus_STATE_DONE {
		if n := a.reverts.disarm(it.name, cfg.only(params)); n > 0 {
			msg = fmt.Sprintf("done; disarmed %d revert timer(s)", n)
		}
	}
	tail := tailString(out, maxActionOutput)
	a.mu.Lock()
	a.actRunning--
	a.releaseLocked(holder)
	it.done, it.state, it.message, it.output = true, st, msg, tail
	s := a.sess
	a.mu.Unlock()
	a.o.metrics.Work("done")
	ev := a.log.Info()
	if err != nil {
		ev = a.log.Warn().Err(err)
	}
	ev.Str("action_id", it.id).Str("action", it.name).Msg("action finished")
	if s != nil {
		s.enqueue(actionStatus(it.id, st, msg, tail))
	}
	a.kickPass()
}

// execAction substitutes the validated parameters and runs the action on
// the host, bounded by timeout.
func (a *Agent) execAction(ctx context.Context, name string, cfg ActionConfig, params map[string]string, timeout time.Duration) (string, error) {
	argv := cfg.argv(params)
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := a.actions.RunAction(actx, argv[0], argv[1:])
	if err != nil {
		if errors.Is(actx.Err(), context.DeadlineExceeded) && ctx.Err() == nil {
			return out, fmt.Errorf("action %s timed out after %s: %w", name, timeout, err)
		}
		return out, fmt.Errorf("action %s: %w", name, err)
	}
	return out, nil
}

// disruptiveRefusal says why a disruptive run may not start in the node's
// current activity, "" when it may.
func (a *Agent) disruptiveRefusal(ctx context.Context, what string) string {
	act := a.activity(ctx)
	if slices.Contains(a.cfg.DisruptiveAllowedWhen, act) {
		return ""
	}
	allowed := "never"
	if len(a.cfg.DisruptiveAllowedWhen) > 0 {
		var words []string
		for _, w := range a.cfg.DisruptiveAllowedWhen {
			words = append(words, w.String())
		}
		allowed = "when " + strings.Join(words, " or ")
	}
	return fmt.Sprintf("%s is disruptive and the node is %s (allowed %s)", what, act, allowed)
}

// sharedDisruptive is the holder of single-node disruptive checks: they
// may overlap one another (a second read of a stuck source joins the
// first), never a reservation.
const sharedDisruptive = "\x00disruptive checks"

// reserveLocked takes the node's disruptive reservation for holder, or
// returns who holds it. A multi-node run or a disruptive action has the
// node to itself: anything else disruptive would measure against it.
// With holder sharedDisruptive it counts one more disruptive check,
// refused only while the node is reserved.
func (a *Agent) reserveLocked(holder string) string {
	switch {
	case a.reserved != "":
		return a.reserved
	case holder == sharedDisruptive:
		a.disruptiveRuns++
		return ""
	case a.disruptiveRuns > 0:
		return fmt.Sprintf("%d disruptive check(s) running", a.disruptiveRuns)
	}
	a.reserved = holder
	return ""
}

func (a *Agent) releaseLocked(holder string) {
	switch {
	case holder == sharedDisruptive:
		a.disruptiveRuns--
	case holder != "" && a.reserved == holder:
		a.reserved = ""
	}
}

// rememberActionLocked keeps an accepted action, forgetting the oldest
// finished ones beyond the bound.
func (a *Agent) rememberActionLocked(it *actionItem) {
	a.acts[it.id] = it
	a.actOrder = append(a.actOrder, it.id)
	for i := 0; len(a.acts) > maxRememberedActions && i < len(a.actOrder); {
		old := a.acts[a.actOrder[i]]
		if old == nil || old.done {
			delete(a.acts, a.actOrder[i])
			a.actOrder = slices.Delete(a.actOrder, i, i+1)
			continue
		}
		i++
	}
}

// kickPass asks the schedule for a quick pass now.
func (a *Agent) kickPass() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// paramList is "k=v" for logs, sorted.
func paramList(p map[string]string) []string {
	out := make([]string, 0, len(p))
	for _, k := range slices.Sorted(maps.Keys(p)) {
		out = append(out, k+"="+clip(p[k]))
	}
	return out
}

func clipN(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// tailString keeps the last n bytes of s, as valid UTF-8 (protobuf
// strings must be; a tool's output need not be).
func tailString(s string, n int) string {
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
