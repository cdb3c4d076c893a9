package coordinator

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
	k8sdrain "github.com/fleetcheck/fleetcheck/internal/drain/kubernetes"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// conditionRefresh rewrites unchanged node conditions this often, so their
// heartbeat time says the coordinator still watches the node; changes are
// written at once.
const conditionRefresh = 5 * time.Minute

// ReasonNotReporting is the reason of every Fleetcheck*Healthy condition
// of a node whose agent stopped reporting: its last results no longer say
// anything about the node now, so the conditions are Unknown (as
// node-problem-detector's consumers read a problem detector gone silent).
const ReasonNotReporting = "AgentNotReporting"

// maxConditionMessage bounds a condition message (the adapter's limit).
const maxConditionMessage = 1024

// conditionSetter writes node conditions: the Kubernetes drain adapter.
type conditionSetter interface {
	SetConditions(ctx context.Context, node string, conds []k8sdrain.Condition) error
}

// conditionWriter puts each node's results on its Kubernetes node as the
// Fleetcheck*Healthy conditions, off the result path: one goroutine
// writes, and a node's newer conditions replace ones not yet written.
type conditionWriter struct {
	set  conditionSetter
	log  zerolog.Logger
	kick chan struct{}
	done chan struct{}

	mu      sync.Mutex
	pending map[string][]k8sdrain.Condition
	written map[string]writtenConds
}

type writtenConds struct {
	conds []k8sdrain.Condition
	at    time.Time
}

// newConditionWriter starts a writer over the adapter when it can write
// conditions; nil (a no-op) otherwise.
func newConditionWriter(ctx context.Context, adapter any, log zerolog.Logger) *conditionWriter {
	set, ok := adapter.(conditionSetter)
	if !ok {
		return nil
	}
	w := &conditionWriter{set: set, log: log.With().Str("subsystem", "node_conditions").Logger(),
		kick: make(chan struct{}, 1), done: make(chan struct{}),
		pending: map[string][]k8sdrain.Condition{}, written: map[string]writtenConds{}}
	go w.run(ctx)
	return w
}

// observe queues the conditions of the areas the result touched, from
// the node's newest check states (e.merge ran first). e.mu is held.
func (w *conditionWriter) observe(e *nodeEntry, r *store.Result) {
	if w == nil {
		return
	}
	var fresh []report.CheckResult
	for _, c := range r.Checks {
		if cur, ok := e.checks[c.Name]; ok && cur.ResultID == r.ID {
			fresh = append(fresh, c)
		}
	}
	touched := k8sdrain.AreaConditions(fresh)
	if len(touched) == 0 {
		return
	}
	// The area's other checks count with their newest status: a passing
	// gpu.ecc does not make GPUs healthy while gpu.xid still fails.
	all := slices.Clone(fresh)
	for name, c := range e.checks {
		if c.ResultID != r.ID {
			all = append(all, report.CheckResult{Name: name, Status: c.Status, Reason: c.Detail})
		}
	}
	slices.SortStableFunc(all, func(a, b report.CheckResult) int { return strings.Compare(a.Name, b.Name) })
	var conds []k8sdrain.Condition
	for _, c := range k8sdrain.AreaConditions(all) {
		if slices.ContainsFunc(touched, func(t k8sdrain.Condition) bool { return t.Type == c.Type }) {
			conds = append(conds, c)
		}
	}
	w.queue(e.name, conds)
}

// notReporting turns every area condition the node has Unknown, with
// why (the stream's end, or no reconnect after a coordinator restart) and
// the last known state in the message. The node's next result writes its
// areas anew. e.mu is held.
func (w *conditionWriter) notReporting(e *nodeEntry, why string) {
	if w == nil {
		return
	}
	all := make([]report.CheckResult, 0, len(e.checks))
	for name, c := range e.checks {
		all = append(all, report.CheckResult{Name: name, Status: c.Status, Reason: c.Detail})
	}
	slices.SortStableFunc(all, func(a, b report.CheckResult) int { return strings.Compare(a.Name, b.Name) })
	conds := k8sdrain.AreaConditions(all)
	if len(conds) == 0 {
		return // no area was ever written: nothing to make Unknown
	}
	if len(why) > 200 {
		why = why[:200]
	}
	for i, c := range conds {
		msg := "fleetcheck: the agent stopped reporting (" + why + "); last: " + strings.TrimPrefix(c.Message, "fleetcheck: ")
		if len(msg) > maxConditionMessage {
			msg = msg[:maxConditionMessage]
		}
		conds[i] = k8sdrain.Condition{Type: c.Type, Status: corev1.ConditionUnknown, Reason: ReasonNotReporting, Message: msg}
	}
	w.queue(e.name, conds)
}

// queue hands a node's conditions to the writer unless they are what it
// wrote last, less than conditionRefresh ago.
func (w *conditionWriter) queue(node string, conds []k8sdrain.Condition) {
	w.mu.Lock()
	defer w.mu.Unlock()
	last, ok := w.written[node]
	if ok && slices.Equal(last.conds, conds) && time.Since(last.at) < conditionRefresh {
		return
	}
	w.pending[node] = conds
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *conditionWriter) run(ctx context.Context) {
	defer close(w.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		}
		w.mu.Lock()
		batch := w.pending
		w.pending = map[string][]k8sdrain.Condition{}
		w.mu.Unlock()
		for node, conds := range batch {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := w.set.SetConditions(wctx, node, conds)
			cancel()
			if err != nil {
				w.log.Warn().Err(err).Str("node", node).Msg("node conditions not written")
				continue
			}
			w.mu.Lock()
			w.written[node] = writtenConds{conds: conds, at: time.Now()}
			w.mu.Unlock()
		}
	}
}

// wait returns once the writer stopped (its context ended).
func (w *conditionWriter) wait() {
	if w != nil {
		<-w.done
	}
}
