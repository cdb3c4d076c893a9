package rollout

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/compat"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// applyFunc is an operation's outcome, applied under the engine's lock.
type applyFunc = func(r *run, n *nodeRec, now time.Time)

// opFunc is an operation: it talks to the fleet or the scheduler without
// the lock and returns the change to make.
type opFunc = func(ctx context.Context) applyFunc

// stepNode moves one idle node along: a deadline passed, or the next
// operation for its state is due.
func (e *Engine) stepNode(ctx context.Context, r *run, n *nodeRec, now time.Time) {
	due := !now.Before(n.nextTry)
	expired := !n.Deadline.IsZero() && !now.Before(n.Deadline)
	switch n.State {
	case DrainRequired:
		e.stepDrainRequired(ctx, r, n, now, due, expired)
	case Draining:
		e.stepDraining(ctx, r, n, now, due, expired)
	case UpgradeRequired:
		e.stepUpgradeRequired(ctx, r, n, now, due, expired)
	case Upgrading:
		e.stepUpgrading(ctx, r, n, now)
	case Rebooting:
		e.stepRebooting(ctx, r, n, now, due, expired)
	case Validating:
		e.stepValidating(ctx, r, n, now, due, expired)
	case UndrainRequired:
		e.stepUndrainRequired(ctx, r, n, now, due, expired)
	}
}

// stepDrainRequired asks for the node's drain until its deadline.
func (e *Engine) stepDrainRequired(ctx context.Context, r *run, n *nodeRec, now time.Time, due, expired bool) {
	d := r.Spec.Deadlines
	if expired {
		e.toUndrain(r, n, Skipped, now, fmt.Sprintf("could not take the node out of service within %v (%s): not upgraded", d.Draining.D(), orNone(n.lastErr)))
		return
	}
	if due {
		e.start(ctx, r, n, e.opDrain(r, n))
	}
}

// stepDraining waits for the running work to leave.
func (e *Engine) stepDraining(ctx context.Context, r *run, n *nodeRec, now time.Time, due, expired bool) {
	d := r.Spec.Deadlines
	if expired {
		e.toUndrain(r, n, Skipped, now, fmt.Sprintf("running work did not end within %v (%s): not upgraded", d.Draining.D(), orNone(n.lastErr)))
		return
	}
	if due {
		e.start(ctx, r, n, e.opDrainPoll(r, n))
	}
}

// stepUpgradeRequired inspects the node before the upgrade when the spec asks, then sends the action.
func (e *Engine) stepUpgradeRequired(ctx context.Context, r *run, n *nodeRec, now time.Time, due, expired bool) {
	d := r.Spec.Deadlines
	if e.needsPre(r, n) {
		if expired {
			e.hold(r, n, now, fmt.Sprintf("pre-upgrade inspection did not complete within %v (%s)", d.Validating.D(), orNone(n.lastErr)))
			return
		}
		if due {
			e.start(ctx, r, n, e.opPre(r, n, now))
		}
		return
	}
	action := r.Spec.Action
	if n.Op == opRollback {
		action = r.Spec.RollbackAction
	}
	n.Upgrades++
	e.transition(r, n, Upgrading, now, fmt.Sprintf("action %s sent: driver %s", action, r.targetDriver(n)))
	e.start(ctx, r, n, e.opUpgrade(r, n))
}

// stepUpgrading is a node found upgrading by a restarted coordinator.
func (e *Engine) stepUpgrading(ctx context.Context, r *run, n *nodeRec, now time.Time) {
	d := r.Spec.Deadlines
	// An upgrading node with no operation in flight was found by a
	// restarted coordinator: the action may have run, may be running
	// or may never have been sent. Sending it again could upgrade the
	// node twice, so wait for the agent to report the driver instead;
	// the deadline gives the action its full time plus a reboot.
	dl := n.Deadline
	if dl.Before(now) {
		dl = now
	}
	e.transition(r, n, Rebooting, now, "coordinator restarted during the upgrade action: checking the node's driver instead of sending the action again")
	n.Deadline = dl.Add(d.Rebooting.D())
}

// stepRebooting waits for the agent to come back with the target driver.
func (e *Engine) stepRebooting(ctx context.Context, r *run, n *nodeRec, now time.Time, due, expired bool) {
	target := r.targetDriver(n)
	// A listing taken since the node entered this state may already show
	// it back; an older one (before the reboot) proves nothing.
	if nv, ok := e.view.nodes[n.Name]; ok && e.view.ok && e.view.at.After(n.Since) && nv.connected && sameVersion(nv.driver, target) {
		e.transition(r, n, Validating, now, "agent back with driver "+nv.driver)
		e.start(ctx, r, n, e.opValidate(r, n, now))
		return
	}
	if expired {
		e.transition(r, n, Failed, now, fmt.Sprintf("agent did not return with driver %s in time (%s)", target, e.lastSeen(n)))
		return
	}
	if due {
		e.start(ctx, r, n, e.opProbe(r, n))
	}
}

// stepValidating inspects the upgraded node until its deadline.
func (e *Engine) stepValidating(ctx context.Context, r *run, n *nodeRec, now time.Time, due, expired bool) {
	d := r.Spec.Deadlines
	if expired {
		e.hold(r, n, now, fmt.Sprintf("inspection did not complete within %v (%s)", d.Validating.D(), orNone(n.lastErr)))
		return
	}
	if due {
		e.start(ctx, r, n, e.opValidate(r, n, now))
	}
}

// stepUndrainRequired returns the node to service.
func (e *Engine) stepUndrainRequired(ctx context.Context, r *run, n *nodeRec, now time.Time, due, expired bool) {
	d := r.Spec.Deadlines
	if expired {
		e.transition(r, n, Failed, now, fmt.Sprintf("could not return the node to service within %v (%s)", d.Undraining.D(), orNone(n.lastErr)))
		return
	}
	if due {
		e.start(ctx, r, n, e.opUndrain(r, n))
	}
}

func orNone(s string) string {
	if s == "" {
		return "no error reported"
	}
	return s
}

// lastSeen describes what the coordinator last knew of a node: the last
// probe's answer, and the fleet listing when it is newer than the state.
func (e *Engine) lastSeen(n *nodeRec) string {
	var parts []string
	if nv, ok := e.view.nodes[n.Name]; ok && e.view.at.After(n.Since) {
		if nv.connected {
			parts = append(parts, "agent connected with driver "+orUnknown(nv.driver))
		} else {
			parts = append(parts, "agent not connected")
		}
	}
	if n.lastErr != "" {
		parts = append(parts, "last probe: "+n.lastErr)
	}
	if len(parts) == 0 {
		return "no answer since the action"
	}
	return strings.Join(parts, "; ")
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func sameVersion(have, want string) bool {
	return have != "" && compat.CompareVersions(have, want) == 0
}

// retry records a transient error; the node is looked at again after the
// poll interval, until its state's deadline.
func (e *Engine) retry(err error) applyFunc {
	msg := err.Error()
	return func(_ *run, n *nodeRec, now time.Time) {
		n.lastErr = msg
		n.nextTry = now.Add(e.poll)
	}
}

// opDrain takes the node out of service. A node already out of service
// for someone else is left as it is and skipped: draining it again would
// overwrite their reason, and the rollout could later resume it.
func (e *Engine) opDrain(r *run, n *nodeRec) opFunc {
	tag, reason, name := r.tag(), r.drainReason(n), n.Name
	foreign := func(why string) applyFunc {
		return func(r *run, n *nodeRec, now time.Time) {
			e.breaker.Release(tag, name)
			n.DrainedAt, n.DrainedByUs = time.Time{}, false
			e.transition(r, n, Skipped, now, "already out of service ("+why+"): left as it is")
		}
	}
	return func(ctx context.Context) applyFunc {
		st, err := e.drainer.Status(ctx, name)
		if err != nil {
			return e.retry(err)
		}
		if st.Drained && !drain.Owns(st, tag) {
			return foreign(st.Reason)
		}
		var derr error
		if !st.Drained {
			derr = e.drainer.Drain(ctx, name, reason)
			if errors.Is(derr, drain.ErrNotOurs) {
				return foreign(derr.Error())
			}
			if st, err = e.drainer.Status(ctx, name); err != nil {
				return e.retry(errors.Join(derr, err))
			}
		}
		if !drain.Owns(st, tag) {
			if derr == nil {
				derr = errors.New("drain did not take effect")
			}
			return e.retry(derr)
		}
		return func(r *run, n *nodeRec, now time.Time) {
			n.DrainedByUs = true
			msg := "out of service"
			if derr != nil {
				msg += " (" + derr.Error() + ")"
			}
			e.transition(r, n, Draining, now, msg)
			e.afterDrainStatus(r, n, st, now)
		}
	}
}

// afterDrainStatus moves a drained node on once its work has ended.
func (e *Engine) afterDrainStatus(r *run, n *nodeRec, st drain.Status, now time.Time) {
	if st.RunningJobs == 0 {
		e.transition(r, n, UpgradeRequired, now, "no running work")
		return
	}
	n.lastErr = fmt.Sprintf("%d jobs still running", st.RunningJobs)
	n.nextTry = now.Add(e.poll)
}

// opDrainPoll waits for the node's work to end. Drain is asked again so
// that evictions a disruption budget refused are retried (a no-op for
// Slurm, which lets jobs finish).
func (e *Engine) opDrainPoll(r *run, n *nodeRec) opFunc {
	tag, reason, name := r.tag(), r.drainReason(n), n.Name
	return func(ctx context.Context) applyFunc {
		st, err := e.drainer.Status(ctx, name)
		if err != nil {
			return e.retry(err)
		}
		if !drain.Owns(st, tag) {
			why := "returned to service by someone else while its work ended"
			if st.Drained {
				why = "drained by someone else (" + st.Reason + ") while its work ended"
			}
			return func(r *run, n *nodeRec, now time.Time) {
				n.DrainedByUs = false
				e.transition(r, n, Skipped, now, why+": not upgraded, left as it is")
			}
		}
		if st.RunningJobs > 0 {
			derr := e.drainer.Drain(ctx, name, reason)
			if st2, err := e.drainer.Status(ctx, name); err == nil && drain.Owns(st2, tag) {
				st = st2
			}
			if derr != nil && st.RunningJobs > 0 {
				return func(r *run, n *nodeRec, now time.Time) {
					n.lastErr = fmt.Sprintf("%d jobs still running (%v)", st.RunningJobs, derr)
					n.nextTry = now.Add(e.poll)
				}
			}
		}
		return func(r *run, n *nodeRec, now time.Time) { e.afterDrainStatus(r, n, st, now) }
	}
}

// needsPre reports whether the pre-upgrade inspection (or the stored
// baseline lookup) is still to be done.
func (e *Engine) needsPre(r *run, n *nodeRec) bool {
	v := &r.Spec.Validation
	if *v.PreCheck && !n.PreDone {
		return true
	}
	return v.compares() && n.BaselineFrom == ""
}

// opPre runs the pre-upgrade inspection on the drained node: the
// reference for the post-upgrade one, and the NCCL baseline when no stored
// baseline is used. A node failing it was unhealthy before the upgrade: it
// is not upgraded and goes back to service as it was found.
func (e *Engine) opPre(r *run, n *nodeRec, now time.Time) opFunc {
	v := r.Spec.Validation
	name, from := n.Name, n.FromDriver
	needBaseline := v.compares() && n.BaselineFrom == ""
	runPre := *v.PreCheck && !n.PreDone
	timeout := n.Deadline.Sub(now)
	var inv report.Inventory
	var labels map[string]string
	if nv, ok := e.view.nodes[name]; ok {
		inv, labels = nv.inv, nv.labels
	}
	return func(ctx context.Context) applyFunc {
		var (
			stored     float64
			storedFrom string
			lookupErr  error
		)
		if needBaseline && v.Baseline != BaselineMeasured && e.finder != nil {
			sku := baselines.SKUFromInventory(inv, labels)
			res, err := baselines.Resolve(ctx, e.finder, v.Metric, name, sku, baselines.Stack{Driver: from})
			switch {
			case err != nil:
				lookupErr = err
			case res.Baseline != nil && finite(res.Baseline.Value) && res.Baseline.Value > 0:
				stored = res.Baseline.Value
				storedFrom = fmt.Sprintf("stored %s v%d (%s)", res.Scope, res.Baseline.Version, res.Baseline.Stack)
			default:
				lookupErr = errors.New(res.Reason)
			}
		}
		if needBaseline && v.Baseline == BaselineStored && storedFrom == "" {
			why := "no stored baseline"
			if lookupErr != nil {
				why += ": " + lookupErr.Error()
			}
			if e.finder == nil {
				why = "no stored baselines configured"
			}
			return func(r *run, n *nodeRec, now time.Time) { e.hold(r, n, now, why) }
		}
		checks := v.Checks
		if !runPre {
			checks = []string{v.NCCLCheck}
		}
		var rep *report.Report
		if runPre || storedFrom == "" && needBaseline {
			var err error
			rep, err = e.fleet.RunChecks(ctx, name, checks, kit.RunOptions{Timeout: timeout})
			if err != nil {
				if errors.Is(err, kit.ErrTimeout) || errors.Is(err, kit.ErrRefused) {
					msg := "pre-upgrade inspection: " + err.Error()
					return func(r *run, n *nodeRec, now time.Time) { e.hold(r, n, now, msg) }
				}
				return e.retry(fmt.Errorf("pre-upgrade inspection: %w", err))
			}
		}
		return func(r *run, n *nodeRec, now time.Time) {
			n.dirty = true
			if storedFrom != "" {
				n.Baseline, n.BaselineFrom = stored, storedFrom
			}
			if rep == nil {
				return
			}
			if runPre {
				if bad := failedChecks(rep); len(bad) > 0 {
					n.Evidence = bad
					e.toUndrain(r, n, Skipped, now, "failed its pre-upgrade inspection: not upgraded, returned to service as found")
					return
				}
				n.Pre = map[string]report.Status{}
				for _, c := range rep.Checks {
					n.Pre[c.Name] = c.Status
				}
				n.PreDone = true
			}
			if needBaseline && n.BaselineFrom == "" {
				val, why := metricValue(rep, v.NCCLCheck, v.Metric)
				if why != "" {
					e.hold(r, n, now, "no pre-upgrade baseline: "+why)
					return
				}
				n.Baseline, n.BaselineFrom = val, "measured before the upgrade (driver "+orUnknown(from)+")"
			}
		}
	}
}

// opUpgrade sends the upgrade (or rollback) action. Only a clear answer
// decides: the agent said it worked (wait for the reboot), failed or
// refused (the node fails). No answer (timeout, lost stream) may still be
// an upgrade in progress: wait for the agent to report the driver.
func (e *Engine) opUpgrade(r *run, n *nodeRec) opFunc {
	action, params := r.Spec.Action, r.Spec.actionParams()
	if n.Op == opRollback {
		action, params = r.Spec.RollbackAction, map[string]string{"version": n.FromDriver}
	}
	name, target := n.Name, r.targetDriver(n)
	timeout := r.Spec.Deadlines.Upgrading.D()
	return func(ctx context.Context) applyFunc {
		res, err := e.fleet.RunAction(ctx, name, action, params, kit.RunOptions{Timeout: timeout, Params: params})
		return func(r *run, n *nodeRec, now time.Time) {
			switch {
			case err == nil && res.OK:
				e.transition(r, n, Rebooting, now, "action finished"+suffix(res.Message)+": waiting for the agent with driver "+target)
				n.nextTry = now.Add(e.poll)
			case err == nil:
				if res.Output != "" {
					n.Evidence = []string{clip(res.Output, 2000)}
				}
				e.transition(r, n, Failed, now, "action "+action+" failed"+suffix(res.Message))
			case errors.Is(err, kit.ErrRefused):
				e.transition(r, n, Failed, now, "agent refused action "+action+": "+err.Error())
			default:
				e.transition(r, n, Rebooting, now, "no answer from the action ("+err.Error()+"): waiting for the agent to report driver "+target)
				n.nextTry = now.Add(e.poll)
			}
		}
	}
}

func suffix(s string) string {
	if s = strings.TrimSpace(s); s == "" {
		return ""
	}
	return ": " + clip(s, 300)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// opProbe asks a rebooting node's agent for its driver.
func (e *Engine) opProbe(r *run, n *nodeRec) opFunc {
	name, target := n.Name, r.targetDriver(n)
	return func(ctx context.Context) applyFunc {
		rep, err := e.fleet.RunChecks(ctx, name, []string{"gpu.inventory"}, kit.RunOptions{Timeout: probeTimeout})
		return func(r *run, n *nodeRec, now time.Time) {
			switch {
			case err != nil:
				n.lastErr, n.nextTry = err.Error(), now.Add(e.poll)
			case sameVersion(rep.Inventory.DriverVersion, target):
				e.transition(r, n, Validating, now, "agent back with driver "+rep.Inventory.DriverVersion)
			default:
				n.lastErr, n.nextTry = "driver is "+orUnknown(rep.Inventory.DriverVersion), now.Add(e.poll)
			}
		}
	}
}

// opValidate runs the post-upgrade inspection and judges it.
func (e *Engine) opValidate(r *run, n *nodeRec, now time.Time) opFunc {
	name, checks := n.Name, r.Spec.Validation.Checks
	timeout := n.Deadline.Sub(now)
	return func(ctx context.Context) applyFunc {
		rep, err := e.fleet.RunChecks(ctx, name, checks, kit.RunOptions{Timeout: timeout})
		return func(r *run, n *nodeRec, now time.Time) {
			if err != nil {
				if errors.Is(err, kit.ErrTimeout) || errors.Is(err, kit.ErrRefused) {
					e.hold(r, n, now, "inspection: "+err.Error())
					return
				}
				n.lastErr, n.nextTry = err.Error(), now.Add(e.poll)
				return
			}
			v := judgeReport(r, n, rep)
			n.Evidence, n.dirty = v.evidence, true
			switch v.outcome {
			case outcomePass:
				after := Done
				if n.Op == opRollback {
					after = RolledBack
				}
				e.toUndrain(r, n, after, now, "inspection passed: "+v.summary)
			case outcomeFail:
				e.transition(r, n, Failed, now, "inspection failed: "+v.summary)
			default:
				e.hold(r, n, now, v.summary)
			}
		}
	}
}

// opUndrain returns the node to service, only when the drain on it is
// still this rollout's.
func (e *Engine) opUndrain(r *run, n *nodeRec) opFunc {
	tag, name := r.tag(), n.Name
	return func(ctx context.Context) applyFunc {
		st, err := e.drainer.Status(ctx, name)
		if err != nil {
			return e.retry(err)
		}
		note := ""
		switch {
		case drain.Owns(st, tag):
			err := e.drainer.Undrain(ctx, name)
			if errors.Is(err, drain.ErrNotOurs) {
				note = "; left out of service: " + err.Error()
			} else if err != nil {
				return e.retry(err)
			}
		case st.Drained:
			note = "; left out of service: drained by someone else (" + st.Reason + ")"
		}
		return func(r *run, n *nodeRec, now time.Time) {
			after := n.After
			if after == "" {
				after = Done
			}
			n.DrainedByUs = false
			msg := n.Reason
			if after == Done || after == RolledBack {
				msg = "back in service"
			}
			e.transition(r, n, after, now, msg+note)
		}
	}
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
