package console

import (
	"context"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/selector"
)

// states in the order the fleet page lists them, worst first (the
// coordinator's node states, coordinator.States).
var states = []string{"failed", "degraded", "unreachable", "left", "initializing", "draining", "drained", "healthy"}

// severity ranks a state for sorting and the heat map; unknown states
// rank with initializing.
func severity(state string) int {
	for i, s := range states {
		if s == state {
			return i
		}
	}
	return 4
}

// bad says whether a state needs someone's attention.
func bad(state string) bool {
	return state == "failed" || state == "degraded" || state == "unreachable"
}

// fleetCache shares one read of the nodes between the pages and polls of
// every open console for one refresh: ten consoles polling cost one read.
type fleetCache struct {
	ttl time.Duration
	now func() time.Time

	mu    sync.Mutex
	at    time.Time
	nodes []store.Node
}

func (c *fleetCache) get(ctx context.Context, src Source) ([]store.Node, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nodes != nil && c.now().Sub(c.at) < c.ttl {
		return c.nodes, nil
	}
	nodes, err := src.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	if nodes == nil {
		nodes = []store.Node{}
	}
	c.nodes, c.at = nodes, c.now()
	return nodes, nil
}

type count struct {
	Key  string
	N    int
	URL  string
	Pct  int
	Rest int
}

type group struct {
	Key     string
	URL     string
	Total   int
	Bad     int
	ByState map[string]int
}

type rackTile struct {
	Rack  string
	URL   string
	Total int
	Bad   int
	Worst string
	Title string
}

type nodeRow struct {
	Name, State, Reason string
	Failing             []string
	SKU, Rack, Leaf     string
	LastSeen            time.Time
	Connected           bool
}

type fleetView struct {
	Sel, State, Check string
	SelErr            string
	Total, Matched    int
	States            []count
	Failing           []count
	SKUs, Leaves      []group
	Racks             []rackTile
	Nodes             []nodeRow
	Page, Pages       int
	PrevURL, NextURL  string
	From, To          int
	Now               time.Time
}

// failingOf lists a node's checks whose newest status is fail, error or warn.
func failingOf(n store.Node) []string {
	var out []string
	for _, c := range n.Checks {
		switch c.Status {
		case report.Fail, report.Error, report.Warn:
			out = append(out, c.Name)
		}
	}
	return out
}

func (s *Server) fleet(w http.ResponseWriter, r *http.Request, id who) error {
	q := r.URL.Query()
	v := fleetView{Sel: q.Get("sel"), State: q.Get("state"), Check: q.Get("check"), Now: s.opts.Now()}
	sel, err := selector.Parse(v.Sel)
	if err != nil {
		v.SelErr = err.Error()
		w.WriteHeader(http.StatusBadRequest)
		s.render(w, r, "fleet", "Fleet", &v, id)
		return nil
	}
	v.Page, _ = strconv.Atoi(q.Get("page"))
	v.Page = max(v.Page, 1)
	nodes, err := s.snap.get(r.Context(), s.opts.Source)
	if err != nil {
		return err
	}
	s.buildFleet(&v, nodes, sel)
	s.render(w, r, "fleet", "Fleet", &v, id)
	return nil
}

// buildFleet aggregates the nodes the selector picks: counts by state, by
// failing check, by SKU and leaf, a tile per rack; and one page of the
// nodes that also match the state and check filters, worst first.
func (s *Server) buildFleet(v *fleetView, nodes []store.Node, sel selector.Selector) {
	v.Total = len(nodes)
	byState := map[string]int{}
	failing := map[string]int{}
	skus, leaves := map[string]*group{}, map[string]*group{}
	racks := map[string]*rackTile{}
	var rows []nodeRow
	for i := range nodes {
		n := &nodes[i]
		if !sel.Matches(n.Name, n.Labels) {
			continue
		}
		v.Matched++
		byState[n.State]++
		f := failingOf(*n)
		for _, c := range f {
			failing[c]++
		}
		isBad := bad(n.State)
		for _, g := range []struct {
			m     map[string]*group
			label string
		}{{skus, "sku"}, {leaves, "leaf"}} {
			k := n.Labels[g.label]
			e := g.m[k]
			if e == nil {
				e = &group{Key: k, ByState: map[string]int{}}
				g.m[k] = e
			}
			e.Total++
			e.ByState[n.State]++
			if isBad {
				e.Bad++
			}
		}
		rk := n.Labels["rack"]
		t := racks[rk]
		if t == nil {
			t = &rackTile{Rack: rk, Worst: "healthy"}
			racks[rk] = t
		}
		t.Total++
		if isBad {
			t.Bad++
		}
		if severity(n.State) < severity(t.Worst) {
			t.Worst = n.State
		}
		if v.State != "" && n.State != v.State {
			continue
		}
		if v.Check != "" && !contains(f, v.Check) {
			continue
		}
		rows = append(rows, nodeRow{Name: n.Name, State: n.State, Reason: n.StateReason, Failing: f,
			SKU: n.Labels["sku"], Rack: rk, Leaf: n.Labels["leaf"], LastSeen: n.LastSeen, Connected: n.Connected})
	}
	off := 0 // Rest: where the state's part of the bar starts
	for _, st := range states {
		if c := byState[st]; c > 0 {
			v.States = append(v.States, count{Key: st, N: c, Pct: c * 100 / max(v.Matched, 1), Rest: off,
				URL: query("/fleet", "sel", v.Sel, "state", st)})
			off += c
		}
	}
	for c, n := range failing {
		v.Failing = append(v.Failing, count{Key: c, N: n, URL: query("/fleet", "sel", v.Sel, "check", c)})
	}
	sort.Slice(v.Failing, func(i, j int) bool {
		a, b := v.Failing[i], v.Failing[j]
		return a.N > b.N || a.N == b.N && a.Key < b.Key
	})
	v.SKUs = groups(skus, "sku", v.Sel)
	v.Leaves = groups(leaves, "leaf", v.Sel)
	for _, t := range racks {
		t.URL = query("/fleet", "sel", withTerm(v.Sel, "rack", t.Rack))
		t.Title = t.Rack + ": " + strconv.Itoa(t.Total) + " nodes, " + strconv.Itoa(t.Bad) + " unhealthy, worst " + t.Worst
		v.Racks = append(v.Racks, *t)
	}
	sort.Slice(v.Racks, func(i, j int) bool { return v.Racks[i].Rack < v.Racks[j].Rack })
	sort.Slice(rows, func(i, j int) bool {
		a, b := severity(rows[i].State), severity(rows[j].State)
		return a < b || a == b && rows[i].Name < rows[j].Name
	})
	size := s.cfg.PageSize
	v.Pages = max(1, (len(rows)+size-1)/size)
	v.Page = min(v.Page, v.Pages)
	lo := (v.Page - 1) * size
	hi := min(lo+size, len(rows))
	v.Nodes = rows[lo:hi]
	v.From, v.To = lo+1, hi
	if len(rows) == 0 {
		v.From = 0
	}
	if v.Page > 1 {
		v.PrevURL = query("/fleet", "sel", v.Sel, "state", v.State, "check", v.Check, "page", v.Page-1)
	}
	if v.Page < v.Pages {
		v.NextURL = query("/fleet", "sel", v.Sel, "state", v.State, "check", v.Check, "page", v.Page+1)
	}
}

func groups(m map[string]*group, label, sel string) []group {
	out := make([]group, 0, len(m))
	for _, g := range m {
		if g.Key != "" {
			g.URL = query("/fleet", "sel", withTerm(sel, label, g.Key))
		}
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// withTerm narrows a selector by label=value.
func withTerm(sel, label, value string) string {
	if value == "" {
		return sel
	}
	term := label + "=" + value
	if sel == "" {
		return term
	}
	return sel + "," + term
}
