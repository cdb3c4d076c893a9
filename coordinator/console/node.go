package console

import (
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// Bounds of the node page: what one page reads from the store.
const (
	nodeResults    = 600 // check results read for the timelines
	timelineCells  = 48  // squares per check, newest last
	nodeEvents     = 100
	measuredPrefix = "nccl. ib."
)

type cell struct {
	Status string
	Title  string
}

type timeline struct {
	Check  string
	Status string
	Reason string
	When   time.Time
	Cells  []cell
}

type findingRow struct {
	Check string
	report.Finding
}

type measurement struct {
	Check, Metric string
	Measured      float64
	Baseline      string // "" when none
	Verdict       string
	Reason        string
}

type label struct{ Key, Value, URL string }

type nodeView struct {
	Node         store.Node
	Labels       []label
	Failing      []string
	Timelines    []timeline
	Findings     []findingRow
	Measurements []measurement
	Events       []store.Event
	Drains       []store.Event
	// Remediations are the node's newest (RemedOn: the coordinator runs
	// the ladder); RemedMore counts those not listed.
	Remediations []remediation.Remediation
	RemedOn      bool
	RemedMore    int
	Now          time.Time
}

func (s *Server) node(w http.ResponseWriter, r *http.Request, id who) error {
	ctx := r.Context()
	src := s.opts.Source
	n, err := src.Node(ctx, r.PathValue("name"))
	if err != nil {
		return err
	}
	v := nodeView{Node: n, Failing: failingOf(n), Now: s.opts.Now()}
	for k, val := range n.Labels {
		v.Labels = append(v.Labels, label{Key: k, Value: val, URL: query("/fleet", "sel", k+"="+val)})
	}
	sort.Slice(v.Labels, func(i, j int) bool { return v.Labels[i].Key < v.Labels[j].Key })
	res, err := src.Results(ctx, store.ResultQuery{Node: n.Name, Limit: nodeResults})
	if err != nil {
		return err
	}
	byCheck := map[string][]store.StoredCheck{} // newest first, as read
	for _, rc := range res {
		byCheck[rc.Check.Name] = append(byCheck[rc.Check.Name], rc)
	}
	names := make([]string, 0, len(byCheck))
	for c := range byCheck {
		names = append(names, c)
	}
	sort.Strings(names)
	finder := src.Baselines()
	stack := baselines.Stack{Driver: n.Inventory.DriverVersion, RDMAStack: n.Inventory.RDMAStack}
	for _, c := range names {
		rs := byCheck[c]
		newest := rs[0]
		tl := timeline{Check: c, Status: string(newest.Check.Status), Reason: newest.Check.Reason, When: newest.Finished}
		for _, rc := range slices.Backward(rs[:min(len(rs), timelineCells)]) {
			title := stamp(rc.Finished) + " " + string(rc.Check.Status)
			if rc.Check.Reason != "" {
				title += ": " + rc.Check.Reason
			}
			tl.Cells = append(tl.Cells, cell{Status: string(rc.Check.Status), Title: title})
		}
		v.Timelines = append(v.Timelines, tl)
		for _, f := range newest.Check.Findings {
			v.Findings = append(v.Findings, findingRow{Check: c, Finding: f})
		}
		if !measured(c) {
			continue
		}
		metrics := make([]string, 0, len(newest.Check.Metrics))
		for m := range newest.Check.Metrics {
			metrics = append(metrics, m)
		}
		sort.Strings(metrics)
		for _, m := range metrics {
			val := newest.Check.Metrics[m]
			row := measurement{Check: c, Metric: m, Measured: val, Verdict: "no baseline"}
			if finder != nil {
				if res, err := baselines.Resolve(ctx, finder, m, n.Name, n.Labels["sku"], stack); err == nil && res.Baseline != nil {
					cmp := baselines.CompareResolved(res, val, stack, baselines.CompareOptions{})
					row.Baseline = num(cmp.Baseline)
					row.Verdict = string(cmp.Verdict)
					row.Reason = cmp.Reason
				}
			}
			v.Measurements = append(v.Measurements, row)
		}
	}
	evs, err := src.Events(ctx, store.EventQuery{Node: n.Name, Limit: nodeEvents})
	if err != nil {
		return err
	}
	slices.Reverse(evs) // newest first
	v.Events = evs
	for _, e := range evs {
		if e.Kind == store.EventAudit && strings.Contains(e.Message, "drain") ||
			e.Kind == store.EventStateChange && strings.Contains(e.Message, "drain") {
			v.Drains = append(v.Drains, e)
		}
	}
	if rs := src.Remediations(); rs != nil {
		all, err := rs.List(ctx, n.Name, "")
		if err != nil {
			return err
		}
		v.RemedOn = true
		v.Remediations = all[:min(len(all), nodeRemediation)]
		v.RemedMore = len(all) - len(v.Remediations)
	}
	s.render(w, r, "node", n.Name, &v, id)
	return nil
}

// measured says whether a check's metrics are compared with baselines on
// the node page (NCCL bandwidths, InfiniBand rates and counters).
func measured(check string) bool {
	for _, p := range strings.Fields(measuredPrefix) {
		if strings.HasPrefix(check, p) {
			return true
		}
	}
	return false
}
