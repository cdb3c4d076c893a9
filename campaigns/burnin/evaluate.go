package burnin

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// ---- phase: evaluate ----

// phaseEvaluate reads every run, decides every verdict and writes them
// all, with the parts seen, in one transaction.
func (e *Engine) phaseEvaluate(ctx context.Context, c campaignRow) (bool, error) {
	nodes, err := listNodes(ctx, e.db, c.ID)
	if err != nil {
		return false, err
	}
	runs, err := listRuns(ctx, e.db, c.ID, true, `AND state = ?`, RunDone)
	if err != nil {
		return false, err
	}
	byNode := map[string][]Run{}
	var pairs []Run
	for _, r := range runs {
		if r.Kind == StepPairs {
			pairs = append(pairs, r)
			continue
		}
		byNode[r.Node] = append(byNode[r.Node], r)
	}
	facts := make([]nodeFacts, 0, len(nodes))
	for _, n := range nodes {
		f := nodeFacts{Name: n.Node, SKU: nodeSKU(c.Spec, n), Inventory: n.Inventory, Runs: byNode[n.Node],
			Stack: baselines.Stack{Driver: n.Inventory.DriverVersion, RDMAStack: n.Inventory.RDMAStack}.Normalize()}
		if n.Evidence != nil {
			f.Early = n.Evidence.Reasons
		}
		facts = append(facts, f)
	}
	resolve, err := e.prefetch(ctx, c.Spec, facts)
	if err != nil {
		return false, err
	}
	var ids []string
	for _, f := range facts {
		for _, p := range nodeParts(f.Name, f.Inventory) {
			ids = append(ids, p.Identity)
		}
	}
	prior, err := e.priorOffences(ctx, c.ID, ids)
	if err != nil {
		return false, err
	}
	decisions := decide(c.Spec, facts, pairs, resolve, prior)

	now := e.clock.Now()
	accepted := 0
	err = e.setPhase(ctx, c, PhaseFinish, "verdicts written", func(tx *sqldb.Tx) error {
		for _, f := range facts {
			d := decisions[f.Name]
			if d.Verdict == Accepted {
				accepted++
			}
			if _, err := tx.ExecContext(ctx, `UPDATE burnin_nodes SET state = ?, verdict = ?, evidence = ?, sku = ?, note = '', updated_at = ?, since = ? WHERE campaign_id = ? AND node = ?`,
				string(NodeFinishing), string(d.Verdict), campaigndb.JSON(d.Evidence), f.SKU, campaigndb.Time(now), campaigndb.Time(now), c.ID, f.Name); err != nil {
				return fmt.Errorf("write verdict of %s: %w", f.Name, err)
			}
			reason := summarize(d.Evidence.Reasons)
			for _, p := range d.Evidence.Parts {
				if _, err := tx.ExecContext(ctx, `INSERT INTO burnin_parts (identity, campaign_id, node, kind, component, identity_kind, verdict, implicated, reason, at)
					VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
					ON CONFLICT (identity, campaign_id, node) DO UPDATE SET kind = excluded.kind, component = excluded.component,
					identity_kind = excluded.identity_kind, verdict = excluded.verdict, implicated = excluded.implicated,
					reason = excluded.reason, at = excluded.at`,
					p.Identity, c.ID, f.Name, p.Kind, p.Component, p.IdentityKind, string(d.Verdict), campaigndb.Bool(p.Implicated), reason, campaigndb.Time(now)); err != nil {
					return fmt.Errorf("record part %s: %w", p.Identity, err)
				}
			}
			what := string(d.Verdict)
			if reason != "" {
				what += ": " + reason
			}
			for _, o := range d.Evidence.RepeatOffenders {
				what += fmt.Sprintf("; repeat offender %s %s (%s) rejected in %s", o.Part.Component, o.Part.Identity, o.Part.IdentityKind, o.Campaign)
			}
			if err := events.Add(ctx, tx, c.ID, f.Name, now, what); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	e.log.Info().Str("campaign", c.ID).Int("accepted", accepted).Int("rejected", len(facts)-accepted).Msg("burn-in verdicts")
	return true, nil
}

// summarize joins the reasons into one line for events and part records.
func summarize(rs []Reason) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, r.Code+": "+r.Message)
	}
	s := strings.Join(parts, "; ")
	if len(s) > 2000 {
		s = s[:2000] + "…"
	}
	return s
}

// nodeSKU is the spec's SKU, else the one the inventory implies.
func nodeSKU(spec *Spec, n nodeRow) string {
	if spec.Baseline.SKU != "" {
		return spec.Baseline.SKU
	}
	if s := baselines.SKUFromInventory(n.Inventory, n.Labels); s != "" {
		return s
	}
	return n.SKU
}

// skuScopes are where a SKU baseline is looked for: the SKU, then the
// SKU without its network part (where intra-node references live).
// Node-scope baselines are left out on purpose: a repaired node is judged
// against its SKU, not against its own possibly degraded past.
func skuScopes(sku string) []baselines.Scope {
	if sku == "" || baselines.ValidSKU(sku) != nil {
		return nil
	}
	out := []baselines.Scope{baselines.SKUScope(sku)}
	if b := baselines.SKUBase(sku); b != sku {
		out = append(out, baselines.SKUScope(b))
	}
	return out
}

// prefetch resolves every (metric, SKU, stack) the verdicts need, so the
// verdict itself reads no database.
func (e *Engine) prefetch(ctx context.Context, spec *Spec, facts []nodeFacts) (resolver, error) {
	type key struct {
		metric, sku string
		stack       baselines.Stack
	}
	cache := map[key]baselines.Resolution{}
	for _, f := range facts {
		for _, m := range spec.Metrics {
			k := key{m.Name, f.SKU, f.Stack}
			if _, ok := cache[k]; ok {
				continue
			}
			scopes := skuScopes(f.SKU)
			switch {
			case e.base == nil:
				cache[k] = baselines.Resolution{Reason: "no baseline store"}
			case len(scopes) == 0:
				cache[k] = baselines.Resolution{Reason: "the node's SKU is unknown (no GPUs in the inventory and no baseline-sku label)"}
			default:
				res, err := baselines.ResolveScopes(ctx, e.base, m.Name, f.Stack, scopes...)
				if err != nil {
					return nil, fmt.Errorf("resolve baseline: %w", err)
				}
				cache[k] = res
			}
		}
	}
	return func(metric, sku string, stack baselines.Stack) baselines.Resolution {
		if r, ok := cache[key{metric, sku, stack}]; ok {
			return r
		}
		return baselines.Resolution{Reason: "not looked up"}
	}, nil
}

// priorOffences finds earlier rejections that implicated these parts.
func (e *Engine) priorOffences(ctx context.Context, id string, identities []string) (map[string][]Offence, error) {
	out := map[string][]Offence{}
	const chunk = 400
	for i := 0; i < len(identities); i += chunk {
		part := identities[i:min(i+chunk, len(identities))]
		args := []any{id, string(Rejected)}
		for _, v := range part {
			args = append(args, v)
		}
		q := `SELECT identity, campaign_id, node, component, identity_kind, reason, at FROM burnin_parts
			WHERE campaign_id != ? AND verdict = ? AND implicated = 1 AND identity IN (?` + strings.Repeat(", ?", len(part)-1) + `)
			ORDER BY at`
		rows, err := e.db.QueryContext(ctx, q, args...)
		if err != nil {
			return nil, fmt.Errorf("earlier rejections: %w", err)
		}
		for rows.Next() {
			var o Offence
			var ident, at string
			if err := rows.Scan(&ident, &o.Campaign, &o.Node, &o.Component, &o.IdentityKind, &o.Reason, &at); err != nil {
				rows.Close()
				return nil, fmt.Errorf("earlier rejections: %w", err)
			}
			o.At = campaigndb.ParseTime(at)
			out[ident] = append(out[ident], o)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("earlier rejections: %w", err)
		}
	}
	return out, nil
}

// ---- phase: finish ----

// phaseFinish records node baselines and returns accepted nodes to
// service, node by node; then the SKU baselines; then the campaign is done.
func (e *Engine) phaseFinish(ctx context.Context, c campaignRow) (bool, error) {
	nodes, err := listNodes(ctx, e.db, c.ID)
	if err != nil {
		return false, err
	}
	var todo []nodeRow
	for _, n := range nodes {
		if n.State == NodeFinishing {
			todo = append(todo, n)
		}
	}
	if len(todo) > 0 {
		var mu sync.Mutex
		var errs []error
		e.pool(len(todo), c.Spec.Concurrency, func(i int) {
			if err := e.finishNode(ctx, c, todo[i]); err != nil && ctx.Err() == nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
		return true, errors.Join(errs...)
	}
	if c.Spec.Baseline.UpdateSKU && !c.SKUDone {
		if err := e.recordSKU(ctx, c, nodes); err != nil {
			return false, err
		}
	}
	acc := 0
	for _, n := range nodes {
		if n.Verdict == Accepted {
			acc++
		}
	}
	return true, e.setPhase(ctx, c, PhaseDone, fmt.Sprintf("done: %d accepted, %d rejected", acc, len(nodes)-acc), nil)
}

func (e *Engine) finishNode(ctx context.Context, c campaignRow, n nodeRow) error {
	log := e.log.With().Str("campaign", c.ID).Str("node", n.Node).Logger()
	if n.Verdict == Accepted && *c.Spec.Baseline.RecordNode && !n.BaselineDone && e.base != nil && n.Evidence != nil {
		stack := baselines.Stack{Driver: n.Inventory.DriverVersion, RDMAStack: n.Inventory.RDMAStack}
		for _, num := range n.Evidence.Numbers {
			if isPairMetric(num.Metric) || len(num.Samples) == 0 {
				continue
			}
			key := baselines.Key{Metric: num.Metric, Scope: baselines.NodeScope(n.Node), Stack: stack}
			note := fmt.Sprintf("burn-in %s: median of %d repeat(s)", c.ID, len(num.Samples))
			if _, err := e.record(ctx, key, num.Samples, who(c.Spec), c.ID, note); err != nil {
				return fmt.Errorf("node %s: %w", n.Node, err)
			}
		}
		if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_nodes SET baseline_done = 1 WHERE campaign_id = ? AND node = ?`, c.ID, n.Node); err != nil {
			return fmt.Errorf("node %s: %w", n.Node, err)
		}
		log.Debug().Msg("node baselines recorded")
	}
	if n.Verdict == Accepted && n.DrainedByUs && *c.Spec.UndrainAccepted {
		st, err := e.drain.Status(ctx, n.Node)
		if err != nil {
			return fmt.Errorf("node %s: drain status: %w", n.Node, err)
		}
		// Only a drain this campaign wrote is undone; if someone else
		// drained the node meanwhile, it stays out.
		if drain.Owns(st, tag(c.ID)) {
			if err := e.drain.Undrain(ctx, n.Node); err != nil {
				return fmt.Errorf("node %s: undrain: %w", n.Node, err)
			}
			if err := events.Record(ctx, e.db, c.ID, n.Node, e.clock.Now(), "returned to service"); err != nil {
				return err
			}
		}
	}
	return e.setNodeState(ctx, c.ID, n.Node, NodeDone, "", "")
}

// record stores a new baseline version unless the latest one already
// came from this campaign: a restart between the write and the flag that
// says it happened must not add a second version.
func (e *Engine) record(ctx context.Context, key baselines.Key, samples []float64, who, fromRun, note string) (baselines.Baseline, error) {
	prev, err := e.base.Get(ctx, key)
	switch {
	case err == nil && prev.FromRun == fromRun:
		return prev, nil
	case err != nil && !errors.Is(err, baselines.ErrNotFound):
		return baselines.Baseline{}, err
	}
	return e.base.Record(ctx, key, samples, who, fromRun, note)
}

func who(s *Spec) string {
	if s.Who != "" {
		return s.Who
	}
	return "burnin"
}

// recordSKU sets each SKU's baseline from the accepted nodes' values
// (its median is the campaign median of the accepted nodes). A SKU with
// fewer accepted nodes than outlier.min_peers is left alone: a median of
// too few nodes is no reference.
func (e *Engine) recordSKU(ctx context.Context, c campaignRow, nodes []nodeRow) error {
	if e.base == nil {
		return e.markSKUDone(ctx, c, "SKU baselines not recorded: no baseline store")
	}
	type key struct{ sku, metric string }
	vals := map[key][]float64{}
	stacks := map[key]baselines.Stack{}
	accepted := map[string]bool{}
	for _, n := range nodes {
		if n.Verdict == Accepted {
			accepted[n.Node] = true
		}
	}
	pairSeen := map[string]bool{}
	for _, n := range nodes {
		if n.Verdict != Accepted || n.Evidence == nil || n.SKU == "" {
			continue
		}
		for _, num := range n.Evidence.Numbers {
			k := key{n.SKU, num.Metric}
			if num.Pair != "" {
				// Each pair's number sits on both members: count it once,
				// and only when both members were accepted.
				id := num.Metric + "|" + num.Pair
				if pairSeen[id] || !bothAccepted(num.Pair, accepted) {
					continue
				}
				pairSeen[id] = true
			}
			vals[k] = append(vals[k], num.Value)
			if _, ok := stacks[k]; !ok {
				stacks[k] = baselines.Stack{Driver: n.Inventory.DriverVersion, RDMAStack: n.Inventory.RDMAStack}
			}
		}
	}
	keys := make([]key, 0, len(vals))
	for k := range vals {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].sku != keys[j].sku {
			return keys[i].sku < keys[j].sku
		}
		return keys[i].metric < keys[j].metric
	})
	var done []string
	for _, k := range keys {
		v := vals[k]
		if len(v) < c.Spec.Outlier.MinPeers {
			done = append(done, fmt.Sprintf("%s at sku:%s not recorded: %d accepted values, need %d", k.metric, k.sku, len(v), c.Spec.Outlier.MinPeers))
			continue
		}
		bk := baselines.Key{Metric: k.metric, Scope: baselines.SKUScope(k.sku), Stack: stacks[k]}
		b, err := e.record(ctx, bk, v, who(c.Spec), c.ID, fmt.Sprintf("burn-in %s: campaign median of %d accepted nodes", c.ID, len(v)))
		if err != nil {
			return fmt.Errorf("record SKU baseline: %w", err)
		}
		done = append(done, fmt.Sprintf("%s at %s v%d = %s", k.metric, b.Scope, b.Version, fnum(b.Value)))
	}
	return e.markSKUDone(ctx, c, "SKU baselines: "+strings.Join(done, "; "))
}

// bothAccepted reads the members out of a pair id.
func bothAccepted(pair string, accepted map[string]bool) bool {
	members, _, _ := strings.Cut(pair, " ")
	for _, m := range strings.Split(members, "+") {
		if !accepted[m] {
			return false
		}
	}
	return true
}

func (e *Engine) markSKUDone(ctx context.Context, c campaignRow, what string) error {
	if _, err := campaigndb.Exec(ctx, e.db, `UPDATE burnin_campaigns SET sku_done = 1 WHERE id = ?`, c.ID); err != nil {
		return fmt.Errorf("SKU baselines: %w", err)
	}
	return events.Record(ctx, e.db, c.ID, "", e.clock.Now(), what)
}
