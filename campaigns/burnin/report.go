package burnin

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

// CampaignStatus is a campaign's progress, for status and list.
type CampaignStatus struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	State      State             `json:"state"`
	Phase      Phase             `json:"phase"`
	Level      Level             `json:"level"`
	Suite      string            `json:"suite"`
	Selector   string            `json:"selector"`
	Reason     string            `json:"reason,omitempty"`
	CreatedAt  time.Time         `json:"created_at"`
	UpdatedAt  time.Time         `json:"updated_at"`
	FinishedAt time.Time         `json:"finished_at,omitzero"`
	Nodes      int               `json:"nodes"`
	ByState    map[NodeState]int `json:"by_state"`
	Accepted   int               `json:"accepted"`
	Rejected   int               `json:"rejected"`
	RunsDone   int               `json:"runs_done"`
	RunsTotal  int               `json:"runs_total"`
	// Waiting lists nodes held up, with why (breaker, running jobs, an
	// agent not connected).
	Waiting map[string]string `json:"waiting,omitempty"`
	// NodeStates is every node: where it is, the step it runs, why it
	// waits, its verdict and why it was rejected.
	NodeStates []NodeProgress `json:"node_states"`
}

// NodeProgress is one node's line in a campaign's status.
type NodeProgress struct {
	Node  string    `json:"node"`
	State NodeState `json:"state"`
	// Step is the run in progress ("dcgm-r2, repeat 1"); Steps counts
	// the node's runs done and planned.
	Step      string `json:"step,omitempty"`
	StepsDone int    `json:"steps_done"`
	Steps     int    `json:"steps"`
	// Waiting says why the node does not move (drain breaker, running
	// jobs, its agent not connected).
	Waiting string  `json:"waiting,omitempty"`
	Verdict Verdict `json:"verdict,omitempty"`
	// Reason sums up why a rejected node was rejected.
	Reason string `json:"reason,omitempty"`
}

// waitingNote reports whether a node's note says why it waits.
func waitingNote(st NodeState, note string) bool {
	return note != "" && (st == NodePending || st == NodeDraining || strings.HasPrefix(note, "waiting for"))
}

// RejectSummary is one line saying why a node was rejected: its reasons'
// messages, the first three and a count of the rest.
func RejectSummary(ev *Evidence) string {
	if ev == nil {
		return ""
	}
	var msgs []string
	seen := map[string]bool{}
	for _, r := range ev.Reasons {
		m := r.Code + ": " + r.Message
		if !seen[m] {
			seen[m] = true
			msgs = append(msgs, m)
		}
	}
	if len(msgs) > 3 {
		msgs = append(msgs[:3], fmt.Sprintf("and %d more", len(msgs)-3))
	}
	return strings.Join(msgs, "; ")
}

// Status returns one campaign's progress.
func (e *Engine) Status(ctx context.Context, id string) (CampaignStatus, error) {
	c, err := getCampaign(ctx, e.db, id)
	if err != nil {
		return CampaignStatus{}, err
	}
	return e.status(ctx, c)
}

// List returns every campaign, oldest first.
func (e *Engine) List(ctx context.Context) ([]CampaignStatus, error) {
	cs, err := listCampaigns(ctx, e.db, "")
	if err != nil {
		return nil, err
	}
	out := make([]CampaignStatus, 0, len(cs))
	for _, c := range cs {
		st, err := e.status(ctx, c)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

func (e *Engine) status(ctx context.Context, c campaignRow) (CampaignStatus, error) {
	st := CampaignStatus{ID: c.ID, Name: c.Name, State: c.State, Phase: c.Phase, Level: c.Spec.Level,
		Suite: c.Spec.Suite.Name, Selector: c.Spec.Selector, Reason: c.Reason,
		CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt, FinishedAt: c.FinishedAt, ByState: map[NodeState]int{}}
	nodes, err := listNodes(ctx, e.db, c.ID)
	if err != nil {
		return st, fmt.Errorf("status %s: %w", c.ID, err)
	}
	progress, err := e.runProgress(ctx, c.ID)
	if err != nil {
		return st, fmt.Errorf("status %s: %w", c.ID, err)
	}
	st.NodeStates = make([]NodeProgress, 0, len(nodes))
	for _, n := range nodes {
		st.Nodes++
		st.ByState[n.State]++
		np := NodeProgress{Node: n.Node, State: n.State, Verdict: n.Verdict}
		p := progress[n.Node]
		np.Step, np.StepsDone, np.Steps = p.step, p.done, p.total
		switch n.Verdict {
		case Accepted:
			st.Accepted++
		case Rejected:
			st.Rejected++
			np.Reason = RejectSummary(n.Evidence)
		}
		if waitingNote(n.State, n.Note) {
			if st.Waiting == nil {
				st.Waiting = map[string]string{}
			}
			st.Waiting[n.Node] = n.Note
			np.Waiting = n.Note
		}
		st.NodeStates = append(st.NodeStates, np)
	}
	if err := e.db.QueryRowContext(ctx, `SELECT COUNT(*), CAST(COALESCE(SUM(CASE WHEN state = ? THEN 1 ELSE 0 END), 0) AS BIGINT) FROM burnin_runs WHERE campaign_id = ?`, RunDone, c.ID).
		Scan(&st.RunsTotal, &st.RunsDone); err != nil {
		return st, fmt.Errorf("status %s: %w", c.ID, err)
	}
	return st, nil
}

type runCount struct {
	step        string
	done, total int
}

// runProgress counts each node's runs and names the one in progress.
func (e *Engine) runProgress(ctx context.Context, id string) (map[string]runCount, error) {
	rows, err := e.db.QueryContext(ctx, `SELECT node, step, rep, state FROM burnin_runs WHERE campaign_id = ? ORDER BY seq`, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]runCount{}
	for rows.Next() {
		var node, step, state string
		var rep int
		if err := rows.Scan(&node, &step, &rep, &state); err != nil {
			return nil, err
		}
		p := out[node]
		p.total++
		switch state {
		case RunDone:
			p.done++
		case RunRunning:
			p.step = fmt.Sprintf("%s, repeat %d", step, rep)
		}
		out[node] = p
	}
	return out, rows.Err()
}

// Report is a campaign's acceptance report: every node with its verdict
// and evidence. It is what `burnin report ID -o json` prints and what
// WriteHTML renders.
type Report struct {
	Campaign    CampaignStatus  `json:"campaign"`
	Spec        *Spec           `json:"spec"`
	GeneratedAt time.Time       `json:"generated_at"`
	Metrics     []MetricSummary `json:"metrics"`
	Nodes       []NodeReport    `json:"nodes"`
	Events      []Event         `json:"events"`
}

// MetricSummary is one compared metric over one SKU's nodes.
type MetricSummary struct {
	Metric    string  `json:"metric"`
	SKU       string  `json:"sku"`
	Direction string  `json:"direction"`
	Baseline  float64 `json:"baseline,omitempty"`
	Scope     string  `json:"baseline_scope,omitempty"`
	Version   int     `json:"baseline_version,omitempty"`
	Median    float64 `json:"campaign_median"`
	MAD       float64 `json:"mad"`
	Nodes     int     `json:"nodes"`
	Min       float64 `json:"min"`
	Max       float64 `json:"max"`
}

// FindingRef is one finding with where it came from.
type FindingRef struct {
	Step    string         `json:"step"`
	Repeat  int            `json:"repeat"`
	Check   string         `json:"check"`
	Peers   []string       `json:"peers,omitempty"`
	Finding report.Finding `json:"finding"`
}

// TempPoint is the hottest GPU at one sample during an action.
type TempPoint struct {
	At   time.Time `json:"at"`
	Step string    `json:"step"`
	MaxC float64   `json:"max_c"`
}

// NodeReport is one node's part of the report.
type NodeReport struct {
	Node        string    `json:"node"`
	SKU         string    `json:"sku"`
	State       NodeState `json:"state"`
	Verdict     Verdict   `json:"verdict,omitempty"`
	DrainedByUs bool      `json:"drained_by_campaign"`
	Note        string    `json:"note,omitempty"`
	// Reason sums up why a rejected node was rejected (RejectSummary).
	Reason    string            `json:"reason,omitempty"`
	Labels    map[string]string `json:"labels"`
	Inventory report.Inventory  `json:"inventory"`
	Evidence  Evidence          `json:"evidence"`
	Findings  []FindingRef      `json:"findings"`
	Runs      []Run             `json:"runs"`
	// Temperatures during the sampled actions (stress), hottest GPU.
	Temperatures []TempPoint `json:"temperatures,omitempty"`
}

// Report builds the acceptance report. It works at any phase: nodes not
// decided yet show their state and no verdict.
func (e *Engine) Report(ctx context.Context, id string) (*Report, error) {
	c, err := getCampaign(ctx, e.db, id)
	if err != nil {
		return nil, err
	}
	st, err := e.status(ctx, c)
	if err != nil {
		return nil, err
	}
	nodes, err := listNodes(ctx, e.db, id)
	if err != nil {
		return nil, err
	}
	runs, err := listRuns(ctx, e.db, id, true, "")
	if err != nil {
		return nil, err
	}
	events, err := events.List(ctx, e.db, id)
	if err != nil {
		return nil, err
	}
	r := &Report{Campaign: st, Spec: c.Spec, GeneratedAt: e.clock.Now().UTC(), Events: events}
	byNode := map[string][]Run{}
	for _, run := range runs {
		for _, m := range run.Members() {
			byNode[m] = append(byNode[m], run)
		}
	}
	for _, n := range nodes {
		nr := NodeReport{Node: n.Node, SKU: n.SKU, State: n.State, Verdict: n.Verdict, DrainedByUs: n.DrainedByUs,
			Note: n.Note, Labels: n.Labels, Inventory: n.Inventory, Runs: byNode[n.Node], Findings: []FindingRef{}}
		if nr.Runs == nil {
			nr.Runs = []Run{}
		}
		if n.Evidence != nil {
			nr.Evidence = *n.Evidence
		}
		if n.Verdict == Rejected {
			nr.Reason = RejectSummary(n.Evidence)
		}
		if nr.Evidence.Reasons == nil {
			nr.Evidence.Reasons = []Reason{}
		}
		if nr.Evidence.Numbers == nil {
			nr.Evidence.Numbers = []Number{}
		}
		if nr.Evidence.Parts == nil {
			nr.Evidence.Parts = nodeParts(n.Node, n.Inventory)
		}
		for _, run := range nr.Runs {
			if rep := run.Result.Report; rep != nil {
				for _, cr := range rep.Checks {
					for _, f := range cr.Findings {
						nr.Findings = append(nr.Findings, FindingRef{Step: run.Step, Repeat: run.Repeat, Check: cr.Name, Peers: others(run.Members(), n.Node), Finding: f})
					}
				}
			}
			for _, s := range run.Result.Samples {
				for _, f := range s.Findings {
					nr.Findings = append(nr.Findings, FindingRef{Step: run.Step, Repeat: run.Repeat, Check: "sampled", Finding: f})
				}
				if t, ok := maxTemp(s.Metrics); ok {
					nr.Temperatures = append(nr.Temperatures, TempPoint{At: s.At, Step: run.Step, MaxC: t})
				}
			}
		}
		r.Nodes = append(r.Nodes, nr)
	}
	r.Metrics = summarizeMetrics(r.Nodes)
	return r, nil
}

var tempMetric = regexp.MustCompile(`^gpu\d+\.temperature_c$`)

// maxTemp is the hottest GPU core temperature among a sample's metrics.
func maxTemp(m map[string]float64) (float64, bool) {
	best, ok := math.Inf(-1), false
	for k, v := range m {
		if tempMetric.MatchString(k) && finite(v) && v > best {
			best, ok = v, true
		}
	}
	return best, ok
}

// summarizeMetrics gathers each compared metric per SKU from the nodes'
// numbers (pair numbers once per pair).
func summarizeMetrics(nodes []NodeReport) []MetricSummary {
	type key struct{ metric, sku string }
	acc := map[key]*MetricSummary{}
	vals := map[key][]float64{}
	seenPair := map[string]bool{}
	for _, n := range nodes {
		for _, num := range n.Evidence.Numbers {
			k := key{num.Metric, n.SKU}
			if num.Pair != "" {
				id := num.Metric + "|" + num.Pair
				if seenPair[id] {
					continue
				}
				seenPair[id] = true
			}
			s, ok := acc[k]
			if !ok {
				s = &MetricSummary{Metric: num.Metric, SKU: n.SKU, Direction: num.Direction}
				acc[k] = s
			}
			if num.Baseline > 0 {
				s.Baseline, s.Scope, s.Version = num.Baseline, num.BaselineScope, num.BaselineVersion
			}
			vals[k] = append(vals[k], num.Value)
		}
	}
	out := make([]MetricSummary, 0, len(acc))
	for k, s := range acc {
		v := vals[k]
		s.Nodes = len(v)
		s.Median = median(v)
		s.MAD = mad(v, s.Median)
		s.Min, s.Max = v[0], v[0]
		for _, x := range v {
			s.Min, s.Max = math.Min(s.Min, x), math.Max(s.Max, x)
		}
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Metric != out[j].Metric {
			return out[i].Metric < out[j].Metric
		}
		return out[i].SKU < out[j].SKU
	})
	return out
}

// Events returns a campaign's history.
func (e *Engine) Events(ctx context.Context, id string) ([]Event, error) {
	if _, err := getCampaign(ctx, e.db, id); err != nil {
		return nil, err
	}
	return events.List(ctx, e.db, id)
}
