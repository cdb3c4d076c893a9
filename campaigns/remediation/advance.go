package remediation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// maxHeld bounds how often a drain that failed (not one the breaker
// refused: that waits as long as it takes) is tried.
const maxHeld = 5

// turn orders the breaker's answers within one round of steps, oldest
// remediation first, though the steps run at once: a drain asks after
// the one before it has been answered.
type turn struct {
	prev <-chan struct{} // nil: first
	done chan struct{}
	once sync.Once
}

func (t *turn) wait(ctx context.Context) {
	if t == nil || t.prev == nil {
		return
	}
	select {
	case <-t.prev:
	case <-ctx.Done():
	}
}

func (t *turn) pass() {
	if t != nil {
		t.once.Do(func() { close(t.done) })
	}
}

// advance moves r on by one transition; the new state is saved before
// the next one acts on it. tn is r's turn at the breaker (a drain).
func (e *Engine) advance(ctx context.Context, r *Remediation, tn *turn) error {
	defer tn.pass()
	switch r.State {
	case StateHeld, StateDraining:
		return e.drainStep(ctx, r, tn)
	case StateActing:
		return e.act(ctx, r)
	case StateVerifying:
		return e.verify(ctx, r)
	case StateRMA:
		return e.rma(ctx, r)
	}
	return nil
}

func (e *Engine) drainStep(ctx context.Context, r *Remediation, tn *turn) error {
	now := e.now()
	n, known, err := kit.LookupNode(ctx, e.d.Fleet, r.Node)
	if err != nil {
		return err
	}
	if !known {
		r.State, r.Reason, r.FinishedAt, r.DueAt = StateFailed, "node no longer known to the coordinator", now, time.Time{}
		return e.save(ctx, r, now, r.Reason)
	}
	if why := e.suppressed(ctx, n, now); why != "" {
		r.State, r.Reason, r.FinishedAt, r.DueAt = StateSuppressed, why, now, time.Time{}
		return e.save(ctx, r, now, "suppressed before the drain: "+why)
	}
	fleet, err := e.d.Fleet.Nodes(ctx, "")
	if err != nil {
		return err
	}
	tn.wait(ctx)
	err = e.d.Breaker.Allow(Actor, r.Node, len(fleet))
	tn.pass()
	if err != nil {
		first := r.State != StateHeld
		r.State, r.Reason, r.DueAt = StateHeld, err.Error(), now.Add(e.cfg.HeldRetry)
		what := ""
		if first {
			what = "held: " + err.Error()
		}
		return e.save(ctx, r, now, what)
	}
	derr := e.d.Drain.Drain(ctx, r.Node, fmt.Sprintf("%s %s: %s", Actor, r.ID, r.Trigger.Reason))
	switch {
	case errors.Is(derr, drain.ErrNotOurs):
		e.d.Breaker.Release(Actor, r.Node)
		r.State, r.Reason, r.FinishedAt, r.DueAt = StateSuppressed, "drained by someone else: left to them", now, time.Time{}
		return e.save(ctx, r, now, r.Reason)
	case derr != nil:
		e.d.Breaker.Release(Actor, r.Node)
		r.Attempts++
		if r.Attempts >= maxHeld {
			r.State, r.Reason, r.FinishedAt, r.DueAt = StateFailed, "drain failed: "+derr.Error(), now, time.Time{}
			return e.save(ctx, r, now, r.Reason)
		}
		r.State, r.Reason, r.DueAt = StateHeld, "drain failed: "+derr.Error(), now.Add(e.cfg.HeldRetry)
		return e.save(ctx, r, now, r.Reason)
	}
	r.Drained, r.Attempts = true, 0
	return e.enter(ctx, r, now, "drained")
}

// enter starts r's current step on a drained node.
func (e *Engine) enter(ctx context.Context, r *Remediation, now time.Time, what string) error {
	switch r.Step {
	case StepReseat:
		r.State, r.Reason, r.DueAt = StateAwaiting, "needs hands: reseat "+r.Component+", then approve", time.Time{}
	case StepReplace:
		r.State, r.Reason, r.DueAt, r.Attempts = StateRMA, "replace: collecting evidence for the RMA", now, 0
	default:
		r.State, r.Reason, r.DueAt = StateActing, "", now
	}
	return e.save(ctx, r, now, fmt.Sprintf("%s; step %s (%d of %d)", what, r.Step, r.Rung+1, len(r.Ladder)))
}

// climb moves r to the next rung after its step did not hold.
func (e *Engine) climb(ctx context.Context, r *Remediation, now time.Time, why string) error {
	if r.Rung+1 >= len(r.Ladder) {
		r.State, r.Reason, r.FinishedAt, r.DueAt = StateFailed, "ladder exhausted: "+why+"; node left drained", now, time.Time{}
		return e.save(ctx, r, now, r.Reason)
	}
	from := r.Step
	r.Rung++
	r.Step = r.Ladder[r.Rung]
	r.Verify, r.Attempts = nil, 0
	return e.enter(ctx, r, now, fmt.Sprintf("%s did not hold (%s): climbing to %s", from, why, r.Step))
}

// maxWaitFor bounds how long a step waits for a node that is not ready
// for it (a job still running on the drained node, its agent away or
// refusing): then the remediation fails with the node left drained.
const maxWaitFor = 24 * time.Hour

// wait leaves r where it is, to try again after held_retry: what stops
// the step says nothing about the part, so it does not climb the ladder.
func (e *Engine) wait(ctx context.Context, r *Remediation, now time.Time, why string) error {
	r.Attempts++
	if limit := max(maxHeld, int(maxWaitFor/e.cfg.HeldRetry)); r.Attempts > limit {
		r.State, r.Reason, r.FinishedAt, r.DueAt = StateFailed, fmt.Sprintf("%s, %d tries: given up, node left drained", why, r.Attempts-1), now, time.Time{}
		return e.save(ctx, r, now, r.Reason)
	}
	what := ""
	if r.Reason != why {
		what = why + fmt.Sprintf("; trying again every %v", e.cfg.HeldRetry)
	}
	r.Reason, r.DueAt = why, now.Add(e.cfg.HeldRetry)
	return e.save(ctx, r, now, what)
}

func (e *Engine) act(ctx context.Context, r *Remediation) error {
	now := e.now()
	// A drain lets the running job end (Slurm's DRAINING): the action
	// waits for it rather than refusing (the wrappers refuse a busy GPU)
	// and climbing on that.
	if n, known, err := kit.LookupNode(ctx, e.d.Fleet, r.Node); err != nil {
		return err
	} else if known && n.Activity == "busy" {
		return e.wait(ctx, r, now, "waiting for the job on the drained node to end")
	}
	name, params := e.action(r)
	res, err := e.d.Fleet.RunAction(ctx, r.Node, name, params, kit.RunOptions{Timeout: e.cfg.ActionTimeout, ID: fmt.Sprintf("%s.%d", r.ID, r.Rung)})
	run := &ActionRun{Step: r.Step, Action: name, Params: params, OK: err == nil && res.OK, Message: res.Message, At: e.now()}
	// A reboot takes the agent with it: its answer may never come.
	if r.Step == StepReboot && (errors.Is(err, kit.ErrUnreachable) || errors.Is(err, kit.ErrTimeout)) {
		run.OK, run.Message = true, "agent went away with the reboot: "+err.Error()
	} else if errors.Is(err, kit.ErrUnreachable) || errors.Is(err, kit.ErrRefused) {
		// The agent is away or refused the request (the node is busy):
		// nothing ran.
		return e.wait(ctx, r, now, fmt.Sprintf("agent action %s not run: %v", name, err))
	} else if err != nil {
		run.Message = err.Error()
	}
	r.Action = run
	if !run.OK {
		return e.climb(ctx, r, now, fmt.Sprintf("agent action %s failed: %s", name, run.Message))
	}
	settle := e.cfg.Settle
	if r.Step == StepReboot {
		settle = e.cfg.RebootSettle
	}
	r.State, r.DueAt, r.Attempts = StateVerifying, run.At.Add(settle), 0
	return e.save(ctx, r, now, fmt.Sprintf("agent action %s %v done: %s; verifying after %v", name, params, run.Message, settle))
}

func (e *Engine) verify(ctx context.Context, r *Remediation) error {
	now := e.now()
	n, _, err := kit.LookupNode(ctx, e.d.Fleet, r.Node)
	if err != nil {
		return err
	}
	since := r.UpdatedAt
	if r.Action != nil {
		since = r.Action.At
	}
	if !n.Connected {
		if now.Sub(since) > e.cfg.VerifyTimeout {
			return e.climb(ctx, r, now, fmt.Sprintf("agent not back within %v", e.cfg.VerifyTimeout))
		}
		r.DueAt = now.Add(min(time.Minute, e.cfg.VerifyTimeout))
		return e.save(ctx, r, now, "")
	}
	v := &Verify{Passed: true}
	rep, err := e.d.Fleet.RunChecks(ctx, r.Node, e.cfg.VerifyChecks, kit.RunOptions{Timeout: e.cfg.ActionTimeout})
	if errors.Is(err, kit.ErrUnreachable) && now.Sub(since) <= e.cfg.VerifyTimeout {
		// Not connected here (yet): as an agent not back, wait.
		r.DueAt = now.Add(min(time.Minute, e.cfg.VerifyTimeout))
		return e.save(ctx, r, now, "")
	}
	if err != nil {
		v.Passed, v.Failed = false, append(v.Failed, "passive checks: "+err.Error())
	} else {
		v.Failed = append(v.Failed, failures(rep.Checks)...)
	}
	if e.cfg.VerifyAllReduce != "" && err == nil {
		e.allReduce(ctx, r.Node, v)
	}
	v.Passed = len(v.Failed) == 0
	v.At = e.now()
	r.Verify = v
	if !v.Passed {
		return e.climb(ctx, r, now, "verify: "+strings.Join(v.Failed, "; "))
	}
	if r.Drained {
		if err := e.d.Drain.Undrain(ctx, r.Node); err != nil && !errors.Is(err, drain.ErrNotOurs) {
			r.Attempts++
			r.DueAt = now.Add(e.cfg.HeldRetry)
			return e.save(ctx, r, now, "verified, but not returned to service: "+err.Error())
		}
		r.Drained = false
	}
	r.State, r.Reason, r.DoneAt, r.FinishedAt, r.DueAt = StateDone, "verified and returned to service", now, now, time.Time{}
	e.mu.Lock()
	e.rules.Rearm(r.Node, r.Component)
	e.mu.Unlock()
	return e.save(ctx, r, now, fmt.Sprintf("verified (%s), returned to service", verifySummary(v)))
}

func verifySummary(v *Verify) string {
	if v.BusBW == 0 {
		return "passive checks pass"
	}
	if v.Baseline == 0 {
		return fmt.Sprintf("passive checks pass, all_reduce %.1f GB/s", v.BusBW)
	}
	return fmt.Sprintf("passive checks pass, all_reduce %.1f GB/s against a baseline of %.1f", v.BusBW, v.Baseline)
}

// failures lists what failed in checks.
func failures(cs []report.CheckResult) []string {
	var out []string
	for _, c := range cs {
		if c.Status != report.Fail && c.Status != report.Error {
			continue
		}
		what := c.Name + ": " + string(c.Status)
		for _, f := range c.Findings {
			if f.Severity == report.SevFail {
				what = fmt.Sprintf("%s: %s %s", c.Name, f.Component, f.Code)
				break
			}
		}
		if c.Status == report.Error && c.Reason != "" {
			what += " (" + c.Reason + ")"
		}
		out = append(out, what)
	}
	return out
}

// allReduce runs the short single-node all_reduce and compares it with
// the node's baseline.
func (e *Engine) allReduce(ctx context.Context, node string, v *Verify) {
	rep, err := e.d.Fleet.RunChecks(ctx, node, []string{e.cfg.VerifyAllReduce}, kit.RunOptions{Timeout: e.cfg.ActionTimeout})
	if err != nil {
		v.Failed = append(v.Failed, e.cfg.VerifyAllReduce+": "+err.Error())
		return
	}
	v.Failed = append(v.Failed, failures(rep.Checks)...)
	for _, c := range rep.Checks {
		if bw, ok := c.Metrics["nccl.allreduce.busbw_gbps"]; ok {
			v.BusBW = bw
		}
	}
	if e.d.Baselines == nil {
		return
	}
	base, ok, err := e.d.Baselines.AllReduce(ctx, node)
	if err != nil || !ok || base <= 0 {
		return
	}
	v.Baseline = base
	if v.BusBW < base*(1-e.cfg.Tolerance) {
		v.Failed = append(v.Failed, fmt.Sprintf("%s: %.1f GB/s is more than %.0f%% below the node's baseline %.1f", e.cfg.VerifyAllReduce, v.BusBW, e.cfg.Tolerance*100, base))
	}
}
