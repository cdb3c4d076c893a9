package agent

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/inspect"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// checkAllReduce is the one check that runs across nodes.
const checkAllReduce = "nccl.allreduce"

// Metric names of a multi-node run: the check's own, and the same under
// the 2-node names baselines keep (baselines.MetricAllReduce2BusBW).
const (
	metricPrefix1 = "nccl.allreduce."
	metricPrefix2 = "nccl.allreduce2."
)

// peerRun is this node's part in a multi-node run another node launches:
// it holds the reservation until the coordinator ends the run or the
// request's timeout passes, then reports its side.
type peerRun struct {
	multiID, workID, launcher string
	holder                    string
	timer                     *time.Timer
}

// admitMulti decides whether this node takes part in a multi-node run in
// role. A non-empty reason refuses.
func (a *Agent) admitMulti(ctx context.Context, rc *fleetcheckv1.RunChecks) string {
	m := a.cfg.MultiNode
	if m == nil {
		return "multi-node runs are not configured on this agent (multi_node)"
	}
	if names := rc.GetChecks(); len(names) != 1 || names[0] != checkAllReduce {
		return fmt.Sprintf("only %s runs across nodes", checkAllReduce)
	}
	if _, ok := a.enabled[checkAllReduce]; !ok {
		return fmt.Sprintf("check %q is not enabled on this agent", checkAllReduce)
	}
	if len(rc.GetParams()) > 0 {
		return "a multi-node run takes no parameters: multi_node.launcher_command fixes them"
	}
	if !requestIDRE().MatchString(rc.GetMultiId()) {
		return "missing or malformed multi_id"
	}
	if why := a.validParticipants(rc.GetRole(), rc.GetParticipants()); why != "" {
		return why
	}
	if rc.GetRole() == fleetcheckv1.MultiRole_MULTI_ROLE_LAUNCHER && a.multi == nil {
		return "this host cannot launch multi-node runs"
	}
	return a.disruptiveRefusal(ctx, "check \""+checkAllReduce+"\"")
}

// validParticipants checks the node names the coordinator filled in
// before any reaches a command line: hostname syntax, the config's
// allowed_peers for every other node, this node present once, in its
// role's place.
func (a *Agent) validParticipants(role fleetcheckv1.MultiRole, names []string) string {
	m := a.cfg.MultiNode
	maxNodes := m.MaxNodes
	if maxNodes == 0 {
		maxNodes = DefaultMultiNodeMaxNodes
	}
	if len(names) < 2 || len(names) > maxNodes {
		return fmt.Sprintf("%d participants: a multi-node run here takes 2 to %d", len(names), maxNodes)
	}
	seen := map[string]bool{}
	for _, n := range names {
		switch {
		case !nodeNameRE().MatchString(n):
			return fmt.Sprintf("participant %q is not a host name", clip(n))
		case seen[n]:
			return fmt.Sprintf("participant %s named twice", n)
		case n != a.cfg.Node && !m.AllowedPeers.Match(n):
			return fmt.Sprintf("participant %s does not match multi_node.allowed_peers %s", n, m.AllowedPeers)
		}
		seen[n] = true
	}
	switch role {
	case fleetcheckv1.MultiRole_MULTI_ROLE_LAUNCHER:
		if names[0] != a.cfg.Node {
			return fmt.Sprintf("the launcher comes first in participants, and this node is %s, not %s", a.cfg.Node, names[0])
		}
	case fleetcheckv1.MultiRole_MULTI_ROLE_PEER:
		if !seen[a.cfg.Node] || names[0] == a.cfg.Node {
			return fmt.Sprintf("a peer must be among the participants after the launcher, and %s is not", a.cfg.Node)
		}
	default:
		return "unknown multi-node role"
	}
	return ""
}

// launcherArgv fills the launcher command's placeholders.
func (m *MultiNodeConfig) launcherArgv(hosts []string) ([]string, int) {
	procs := max(m.ProcsPerNode, 1)
	np := procs * len(hosts)
	list := slices.Clone(hosts)
	if m.SlotsPerNode > 0 {
		for i := range list {
			list[i] += ":" + strconv.Itoa(m.SlotsPerNode)
		}
	}
	out := make([]string, len(m.LauncherCommand))
	for i, arg := range m.LauncherCommand {
		switch p, _ := paramPlaceholder(arg); p {
		case "hosts":
			out[i] = strings.Join(list, ",")
		case "np":
			out[i] = strconv.Itoa(np)
		case "nodes":
			out[i] = strconv.Itoa(len(hosts))
		default:
			out[i] = arg
		}
	}
	return out, np
}

// startMulti runs the accepted multi-node part: the launcher launches, a
// peer waits for the end of the run.
func (a *Agent) startMulti(w *workItem, rc *fleetcheckv1.RunChecks, timeout time.Duration, holder string) {
	if rc.GetRole() == fleetcheckv1.MultiRole_MULTI_ROLE_LAUNCHER {
		a.workWG.Go(func() { a.runLauncher(w, rc.GetMultiId(), rc.GetParticipants(), timeout, holder) })
		return
	}
	p := &peerRun{multiID: rc.GetMultiId(), workID: w.id, launcher: rc.GetParticipants()[0], holder: holder}
	// The timer is set under the lock that publishes p: takePeer (from
	// the timer itself or an EndMulti) reads it under the same lock.
	a.mu.Lock()
	a.peers[p.multiID] = p
	p.timer = time.AfterFunc(timeout, func() {
		if e := a.takePeer(p.multiID); e != nil {
			a.reportPeer(e, nil, report.Error, fmt.Sprintf("no end of multi-node run %s from the coordinator within %s", p.multiID, timeout))
		}
	})
	a.mu.Unlock()
}

// runLauncher launches the run through the host, judges its output with
// the nccl.allreduce check (the 2-node thresholds of multi_node), and
// spools the result; the sender delivers it followed by DONE.
func (a *Agent) runLauncher(w *workItem, multiID string, hosts []string, timeout time.Duration, holder string) {
	m := a.cfg.MultiNode
	argv, np := m.launcherArgv(hosts)
	ctx := a.ctx
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	a.log.Info().Str("work_id", w.id).Str("multi_id", multiID).Strs("hosts", hosts).Msg("launching multi-node all_reduce")
	c := a.multi.RunMultiNode(wctx, host.MultiNodeRun{Argv: argv, Hosts: hosts, Ranks: np, Timeout: timeout})

	cfg := a.cfg.Checks
	cfg.NCCL.MinBusBWGBps, cfg.NCCL.BaselineGBps = m.MinBusBWGBps, m.BaselineGBps
	a.mu.Lock()
	prev := a.state
	a.mu.Unlock()
	r, _ := a.inspectOn(wctx, withAllReduce(a.host, c), &cfg, []checks.Check{a.enabled[checkAllReduce]}, prev, w.id)
	if cr := r.Report.Check(checkAllReduce); cr != nil {
		markMulti(cr, multiID, hosts)
	}
	a.finishWork(w, r, holder)
}

// markMulti adds the 2-node names of the run's metrics beside the check's
// own, and says in the reason which nodes ran.
func markMulti(cr *report.CheckResult, multiID string, hosts []string) {
	for _, k := range slices.Sorted(maps.Keys(cr.Metrics)) {
		if rest, ok := strings.CutPrefix(k, metricPrefix1); ok {
			cr.Metrics[metricPrefix2+rest] = cr.Metrics[k]
		}
	}
	note := fmt.Sprintf("%d-node run %s across %s", len(hosts), multiID, strings.Join(hosts, ","))
	if cr.Reason == "" {
		cr.Reason = note
	} else {
		cr.Reason = note + ": " + cr.Reason
	}
}

// onEndMulti ends this node's part in a run it joined as a peer, off the
// receiver: the side it reports is written to the spool first.
func (a *Agent) onEndMulti(em *fleetcheckv1.EndMulti) {
	// The reservation is released here, on the stream's goroutine, before
	// the next message is read: the coordinator's next multi-node run may
	// follow this EndMulti at once, and must not find the node reserved.
	p := a.takePeer(em.GetMultiId())
	if p == nil {
		return
	}
	if em.GetAbortReason() != "" || em.GetCheck() == nil {
		why := em.GetAbortReason()
		if why == "" {
			why = "ended without a result"
		}
		a.workWG.Go(func() { a.reportPeer(p, nil, report.Skip, "called off: "+clipN(why, 512)) })
		return
	}
	a.workWG.Go(func() { a.reportPeer(p, em, "", "") })
}

// endedPeer is a peer's part taken out of the running ones, its
// reservation released, waiting to be reported.
type endedPeer struct {
	*peerRun
	w   *workItem
	inv report.Inventory
}

// takePeer ends a peer's part once: it forgets the run, stops its timer
// and releases the node's reservation. nil when the run already ended.
func (a *Agent) takePeer(multiID string) *endedPeer {
	a.mu.Lock()
	p := a.peers[multiID]
	if p == nil {
		a.mu.Unlock()
		return nil
	}
	delete(a.peers, multiID)
	a.releaseLocked(p.holder)
	e := &endedPeer{peerRun: p, w: a.work[p.workID]}
	if a.inventory != nil {
		e.inv = *a.inventory
	}
	a.mu.Unlock()
	p.timer.Stop()
	return e
}

// reportPeer reports the peer's side: the launcher's check result when
// the run ended with one, else status with why (a skip when the run was
// called off, an error when no word came).
func (a *Agent) reportPeer(p *endedPeer, em *fleetcheckv1.EndMulti, status report.Status, why string) {
	multiID, inv, w := p.multiID, p.inv, p.w
	now := time.Now()
	var cr report.CheckResult
	switch {
	case em != nil:
		cr = wire.CheckFromProto(em.GetCheck())
		cr.Name = checkAllReduce
		launcher := em.GetLauncher()
		if launcher == "" {
			launcher = p.launcher
		}
		note := fmt.Sprintf("peer in multi-node run %s, measured by launcher %s", multiID, launcher)
		if id := em.GetLauncherResultId(); id != "" {
			note += " (result " + id + ")"
		}
		if cr.Reason != "" {
			note += ": " + cr.Reason
		}
		cr.Reason = note
	default:
		cr = report.CheckResult{Name: checkAllReduce, Status: status, Findings: []report.Finding{},
			Reason: fmt.Sprintf("peer in multi-node run %s launched by %s, %s", multiID, p.launcher, why)}
	}
	rep := report.Report{Node: a.cfg.Node, Inventory: inv, Checks: []report.CheckResult{cr}}
	rep.Summarize()
	r := &Result{ID: NewResultID(now), Node: a.cfg.Node, WorkID: p.workID, Trigger: wire.TriggerRequest, Started: now, Finished: now, Report: rep}
	if w == nil {
		w = &workItem{id: p.workID}
	}
	a.log.Info().Str("multi_id", multiID).Str("status", string(cr.Status)).Msg("multi-node run ended for this peer")
	a.finishWork(w, r, "") // the reservation went with takePeer
}

// allReduceHost hands inspect a multi-node run's output as the node's
// all_reduce_perf source; every other source reads the node.
type allReduceHost struct {
	host.Host
	c host.Capture
}

func (h allReduceHost) Capture(ctx context.Context, src snapshot.Source) host.Capture {
	if src == snapshot.SrcAllReduce {
		return h.c
	}
	return h.Host.Capture(ctx, src)
}

type nvmlAllReduceHost struct {
	allReduceHost
	r inspect.NVMLReader
}

func (h nvmlAllReduceHost) GPUStateNVML() (*snapshot.GPUState, error) { return h.r.GPUStateNVML() }

func withAllReduce(h host.Host, c host.Capture) host.Host {
	ah := allReduceHost{Host: h, c: c}
	if r, ok := h.(inspect.NVMLReader); ok {
		return nvmlAllReduceHost{allReduceHost: ah, r: r}
	}
	return ah
}
