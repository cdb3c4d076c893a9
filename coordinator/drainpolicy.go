package coordinator

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// DrainPolicyConfig says which findings take a node out of service when
// its results arrive (docs/coordinator-config.md). The policy is off while
// both lists are empty: a coordinator drains nothing on its own unless
// told to.
//
//	drain:
//	  adapter: slurm
//	  policy:
//	    actions: [drain, replace, reseat]   # a failing finding with one of these actions
//	    codes: [ECC_UNCORRECTABLE]          # a finding (warn or fail) with one of these codes
type DrainPolicyConfig struct {
	// Actions: a finding of severity fail whose action is one of these
	// takes the node out (drain, reset_gpu, reboot, replace, reseat).
	Actions []string `yaml:"actions"`
	// Codes: a finding with one of these codes, warn or fail, takes the
	// node out whatever its action.
	Codes []string `yaml:"codes"`
}

// policyActions are the actions the policy may name: the ones that need
// the node's work moved off it. restart_app, monitor and none are about
// the job or nothing, never about the node (docs/design.md: application Xids
// never drain a node on their own).
var policyActions = []report.Action{report.ActionDrain, report.ActionResetGPU, report.ActionReboot, report.ActionReplace, report.ActionReseat}

var findingCodeRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// Enabled reports whether the policy names anything.
func (p DrainPolicyConfig) Enabled() bool { return len(p.Actions)+len(p.Codes) > 0 }

func (p DrainPolicyConfig) validate() error {
	var errs []error
	for _, a := range p.Actions {
		if !slices.Contains(policyActions, report.Action(a)) {
			errs = append(errs, fmt.Errorf("drain.policy.actions: %q: must be one of drain, reset_gpu, reboot, replace, reseat", a))
		}
	}
	for _, c := range p.Codes {
		if !findingCodeRE.MatchString(c) {
			errs = append(errs, fmt.Errorf("drain.policy.codes: %q: a finding code such as ECC_UNCORRECTABLE (letters, digits, _ . -, at most 64)", c))
		}
	}
	return errors.Join(errs...)
}

// match returns the first finding of a check that the policy names, as
// "gpu.ecc: GPU3 ECC_UNCORRECTABLE (fail, action replace)".
func (p DrainPolicyConfig) match(c report.CheckResult) (string, bool) {
	for _, f := range c.Findings {
		byAction := f.Severity == report.SevFail && slices.Contains(p.Actions, string(f.Action))
		if byAction || slices.Contains(p.Codes, f.Code) {
			return fmt.Sprintf("%s: %s (%s, action %s)", c.Name, strings.TrimSpace(f.Component+" "+f.Code), f.Severity, f.Action), true
		}
	}
	return "", false
}

// Who the policy's drains are recorded as: the breaker's campaign name,
// the audit actor, and the start of the node's state reason (which is how
// `fleetcheck nodes` and campaigns tell a policy drain).
const (
	policyActor        = "drain-policy"
	policyReasonPrefix = "drain policy"
)

// policyDrainTimeout bounds one adapter call; a Kubernetes drain waits
// for evictions (drain.kubernetes.eviction_timeout, at most 1h) within it.
const policyDrainTimeout = 75 * time.Minute

// drainPolicy applies DrainPolicyConfig as results arrive: a node whose
// newest result for some check has a finding the policy names is taken
// out of service through the drain adapter, when the circuit breaker has
// room. The node shows as draining, then drained, with the reason; it
// comes back when its scheduler returns it to service (scontrol resume,
// kubectl uncordon), or, with the record-only adapter none, once no
// check's newest result matches the policy any more.
//
// Adapter calls run in their own goroutine, one per node at a time, so
// a slow scheduler never holds up result ingestion.
type drainPolicy struct {
	s       *Server
	cfg     DrainPolicyConfig
	adapter drain.Adapter
	via     string // the adapter's name, for reasons
	breaker *kit.Breaker
	log     zerolog.Logger
	ctx     context.Context
	wg      sync.WaitGroup

	mu      sync.Mutex
	hits    map[string]map[string]string // node -> check -> matching finding
	busy    map[string]bool              // an adapter call is running for the node
	again   map[string]bool              // a result came meanwhile: look again after it
	refused map[string]bool              // the breaker refused the node (logged once)
	foreign map[string]bool              // drained by someone else when last tried
}

func newDrainPolicy(ctx context.Context, s *Server, cfg DrainPolicyConfig, adapter drain.Adapter, via string, breaker *kit.Breaker, log zerolog.Logger) *drainPolicy {
	if via == "" {
		via = "none"
	}
	return &drainPolicy{s: s, cfg: cfg, adapter: adapter, via: via, breaker: breaker, ctx: ctx,
		log:  log.With().Str("subsystem", "drain_policy").Logger(),
		hits: map[string]map[string]string{}, busy: map[string]bool{}, again: map[string]bool{}, refused: map[string]bool{}, foreign: map[string]bool{}}
}

// policyReason is a node's state reason for a policy drain.
func (p *drainPolicy) reason(why string) string {
	return fmt.Sprintf("%s through %s: %s", policyReasonPrefix, p.via, why)
}

// byPolicy reports whether a state reason is a policy drain's.
func byPolicy(reason string) bool { return strings.HasPrefix(reason, policyReasonPrefix+" ") }

// observe records which of the result's checks now match the policy
// (only checks this result is the newest for: e.merge ran first) and
// returns what the node's newest results hold that the policy names, ""
// for nothing. e.mu is held.
func (p *drainPolicy) observe(e *nodeEntry, r *store.Result) string {
	if p == nil {
		return ""
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.hits[e.name]
	for _, c := range r.Checks {
		if cur, ok := e.checks[c.Name]; !ok || cur.ResultID != r.ID {
			continue // an older result for this check
		}
		if why, ok := p.cfg.match(c); ok {
			if h == nil {
				h = map[string]string{}
				p.hits[e.name] = h
			}
			h[c.Name] = why
		} else {
			delete(h, c.Name)
		}
	}
	if len(h) == 0 {
		delete(p.hits, e.name)
		delete(p.refused, e.name)
		delete(p.foreign, e.name)
	}
	return p.whyLocked(e.name)
}

// why is what the node's newest results hold that the policy names.
func (p *drainPolicy) why(node string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.whyLocked(node)
}

func (p *drainPolicy) whyLocked(node string) string {
	h := p.hits[node]
	if len(h) == 0 {
		return ""
	}
	names := make([]string, 0, len(h))
	for n := range h {
		names = append(names, n)
	}
	sort.Strings(names)
	why := h[names[0]]
	if len(names) > 1 {
		why += fmt.Sprintf(" (+%d more checks)", len(names)-1)
	}
	return why
}

// apply acts on a node after a result: take it out when why is set and it
// is in service, or look again at a policy drain. e.mu is held.
func (p *drainPolicy) apply(e *nodeEntry, why string) {
	if p == nil || p.ctx.Err() != nil {
		return
	}
	if (campaignOwned(e.state) && byPolicy(e.reason)) || (!campaignOwned(e.state) && why != "") {
		p.start(e)
	}
}

// start looks at the node in a goroutine of its own; while one runs for
// the node, a later result makes it look once more when done.
func (p *drainPolicy) start(e *nodeEntry) {
	node := e.name
	p.mu.Lock()
	if p.busy[node] {
		p.again[node] = true
		p.mu.Unlock()
		return
	}
	p.busy[node] = true
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		for {
			ctx, cancel := context.WithTimeout(p.ctx, policyDrainTimeout)
			p.act(ctx, e)
			cancel()
			p.mu.Lock()
			if !p.again[node] || p.ctx.Err() != nil {
				delete(p.busy, node)
				delete(p.again, node)
				p.mu.Unlock()
				return
			}
			delete(p.again, node)
			p.mu.Unlock()
		}
	}()
}

// act takes the node out, or looks again at a policy drain, by what the
// node's state and newest results say now.
func (p *drainPolicy) act(ctx context.Context, e *nodeEntry) {
	e.mu.Lock()
	owned, mine := campaignOwned(e.state), byPolicy(e.reason)
	e.mu.Unlock()
	why := p.why(e.name)
	switch {
	case owned && mine:
		p.reconcile(ctx, e, why)
	case !owned && why != "":
		p.takeOut(ctx, e, why)
	}
}

// wait returns once no adapter call is running (after the context ended).
func (p *drainPolicy) wait() {
	if p != nil {
		p.wg.Wait()
	}
}

// takeOut drains a node through the adapter, behind the breaker. Every
// step is recorded before it is taken: the audit event, then the node's
// draining state, then the drain.
func (p *drainPolicy) takeOut(ctx context.Context, e *nodeEntry, why string) {
	node := e.name
	log := p.log.With().Str("node", node).Str("why", why).Logger()
	// A node someone else drained stays theirs: tried once, then only
	// looked at until they bring it back.
	p.mu.Lock()
	foreign := p.foreign[node]
	p.mu.Unlock()
	if foreign {
		if st, err := p.adapter.Status(ctx, node); err != nil || (st.Drained && !st.ByFleetcheck) {
			return
		}
		p.mu.Lock()
		delete(p.foreign, node)
		p.mu.Unlock()
	}
	if err := p.breaker.Allow(policyActor, node, p.fleetSize(ctx)); err != nil {
		p.mu.Lock()
		first := !p.refused[node]
		p.refused[node] = true
		p.mu.Unlock()
		if first {
			log.Warn().Err(err).Msg("drain policy: not taken out of service")
			if aerr := p.s.AuditNode(ctx, node, policyActor, "drain refused", fmt.Sprintf("%s: %v", why, err)); aerr != nil {
				log.Error().Err(aerr).Msg("audit")
			}
		}
		return
	}
	release := func() { p.breaker.Release(policyActor, node) }
	if err := p.s.AuditNode(ctx, node, policyActor, "drain", fmt.Sprintf("through %s: %s", p.via, why)); err != nil {
		release()
		log.Error().Err(err).Msg("drain policy: audit not written; node left in service")
		return
	}
	reason := p.reason(why)
	e.mu.Lock()
	if campaignOwned(e.state) {
		e.mu.Unlock()
		release()
		return
	}
	p.s.setState(ctx, e, StateDraining, reason, "", nil, p.s.now())
	e.mu.Unlock()

	err := p.adapter.Drain(ctx, node, "policy: "+why)

	e.mu.Lock()
	defer e.mu.Unlock()
	// The record outlives a stop: a drain a stop interrupted is looked at
	// again (reconcile) after the restart.
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch {
	case err == nil:
		p.s.setState(sctx, e, StateDrained, reason, "", nil, p.s.now())
		log.Info().Str("adapter", p.via).Msg("drain policy: node taken out of service")
	case ctx.Err() != nil && p.ctx.Err() != nil:
		return // stopping: the restart reconciles
	default:
		release()
		state, r := e.liveState()
		p.s.setState(sctx, e, state, r, "", nil, p.s.now())
		if errors.Is(err, drain.ErrNotOurs) {
			p.mu.Lock()
			p.foreign[node] = true
			p.mu.Unlock()
			log.Info().Err(err).Msg("drain policy: node already out of service for someone else")
			return
		}
		log.Error().Err(err).Msg("drain policy: drain failed; node left in service")
		if aerr := p.s.AuditNode(sctx, node, policyActor, "drain failed", fmt.Sprintf("through %s: %v", p.via, err)); aerr != nil {
			log.Error().Err(aerr).Msg("audit")
		}
	}
}

// reconcile looks at a node the policy took out: it comes back when its
// scheduler has returned it to service, or (adapter none, which records
// only) when nothing the policy names is left in its newest results; a
// drain a restart interrupted is completed or undone by what the
// scheduler says.
func (p *drainPolicy) reconcile(ctx context.Context, e *nodeEntry, why string) {
	node := e.name
	st, err := p.adapter.Status(ctx, node)
	if err != nil {
		p.log.Debug().Err(err).Str("node", node).Msg("drain policy: status")
		return
	}
	_, recordOnly := p.adapter.(*drain.None)
	cause := ""
	switch {
	case st.Drained && recordOnly && why == "":
		if err := p.adapter.Undrain(ctx, node); err != nil {
			p.log.Warn().Err(err).Str("node", node).Msg("drain policy: undrain")
			return
		}
		cause = "drain policy: nothing the policy names is left in the newest results"
	case st.Drained:
		e.mu.Lock()
		if e.state == StateDraining && byPolicy(e.reason) {
			p.s.setState(ctx, e, StateDrained, e.reason, "", nil, p.s.now())
		}
		e.mu.Unlock()
		return
	default:
		cause = "drain policy: returned to service through " + p.via
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !campaignOwned(e.state) || !byPolicy(e.reason) {
		return
	}
	// The breaker keeps counting the drain: it bounds the rate of drains.
	state, reason := e.liveState()
	p.s.setState(ctx, e, state, reason, cause, nil, p.s.now())
	p.log.Info().Str("node", node).Str("state", state).Msg(cause)
}

// breakerRecords are the policy drains the store holds, for the breaker
// after a restart.
func policyBreakerRecords(nodes []store.Node) []kit.DrainRecord {
	var out []kit.DrainRecord
	for _, n := range nodes {
		if campaignOwned(n.State) && byPolicy(n.StateReason) {
			out = append(out, kit.DrainRecord{Node: n.Name, Campaign: policyActor, At: n.StateSince})
		}
	}
	return out
}

// fleetSize is what the breaker's max_share is a share of: every stored
// node, not only those connected here (with several coordinators each
// holds a part of the fleet's streams). The registry's count stands in
// when the store cannot be read, and is never more than what is stored
// plus those joined here since.
func (p *drainPolicy) fleetSize(ctx context.Context) int {
	here := len(p.s.reg.all())
	n, err := p.s.store.NodeCount(ctx)
	if err != nil {
		p.log.Warn().Err(err).Msg("drain policy: fleet size from this coordinator's nodes")
		return here
	}
	return max(n, here)
}
