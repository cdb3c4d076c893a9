package sweep

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
)

// Coverage says how much of the selected fleet this sweep tests and how
// far the rotation is from covering every node.
type Coverage struct {
	Selected int `json:"selected"` // nodes the selector matched
	Eligible int `json:"eligible"` // connected, idle or drained
	Tested   int `json:"tested"`   // taken by this sweep
	Deferred int `json:"deferred"` // eligible, left for a later sweep by the budget
	// Cap is the budget's node limit per sweep (0: none) and CapBy what set it.
	Cap   int    `json:"cap,omitempty"`
	CapBy string `json:"cap_by,omitempty"`
	// NightsToCover is how many sweeps at this budget test every selected
	// node once; CoverWithinNights the target.
	NightsToCover     int `json:"nights_to_cover"`
	CoverWithinNights int `json:"cover_within_nights"`
	// NeverCovered lists selected nodes no finished sweep has tested;
	// Overdue those whose last test is older than CoverWithinNights.
	NeverCovered []string `json:"never_covered,omitempty"`
	Overdue      []string `json:"overdue,omitempty"`
	// Gap is set when the budget cannot meet the rotation target or a
	// node is overdue.
	Gap  bool   `json:"gap"`
	Note string `json:"note,omitempty"`
}

// selection is what a sweep takes from the nodes a selector matched.
type selection struct {
	take        []kit.Node
	unreachable []string
	skipped     []Skip
	deferred    []string
	cov         Coverage
}

// selectNodes applies the activity rule (disruptive tests only on idle or
// drained nodes) and the budget, taking the nodes covered longest ago (or
// never) first, so a budget rotates through the fleet night by night.
func selectNodes(all []kit.Node, spec Spec, last map[string]time.Time) selection {
	var sel selection
	var eligible []kit.Node
	for _, n := range all {
		switch {
		case !n.Connected:
			sel.unreachable = append(sel.unreachable, n.Name)
		case n.Activity == "idle" || n.Activity == "drained":
			eligible = append(eligible, n)
		case n.Activity == "busy":
			sel.skipped = append(sel.skipped, Skip{Node: n.Name, Reason: "busy: disruptive tests run only on idle or drained nodes"})
		default:
			sel.skipped = append(sel.skipped, Skip{Node: n.Name, Reason: fmt.Sprintf("activity %q unknown: disruptive tests run only on idle or drained nodes", n.Activity)})
		}
	}
	sort.SliceStable(eligible, func(i, j int) bool {
		ti, tj := last[eligible[i].Name], last[eligible[j].Name]
		if !ti.Equal(tj) {
			return ti.Before(tj)
		}
		return eligible[i].Name < eligible[j].Name
	})
	limit, by := budgetCap(len(all), eligible, spec.Budget)
	take := len(eligible)
	if limit > 0 && limit < take {
		take = limit
	}
	sel.take = eligible[:take]
	for _, n := range eligible[take:] {
		sel.deferred = append(sel.deferred, n.Name)
	}
	sort.Slice(sel.take, func(i, j int) bool { return sel.take[i].Name < sel.take[j].Name })
	sort.Strings(sel.deferred)
	perNight := len(all)
	if limit > 0 && limit < perNight {
		perNight = limit
	}
	sel.cov = Coverage{
		Selected: len(all), Eligible: len(eligible), Tested: take, Deferred: len(sel.deferred),
		Cap: limit, CapBy: by, CoverWithinNights: spec.Budget.CoverWithinNights,
	}
	if perNight > 0 {
		sel.cov.NightsToCover = (len(all) + perNight - 1) / perNight
	}
	return sel
}

// budgetCap is the node limit the budget sets (0: none) and which part
// of the budget set it.
func budgetCap(fleet int, eligible []kit.Node, b Budget) (int, string) {
	limit, by := 0, ""
	tighten := func(n int, why string) {
		if limit == 0 || n < limit {
			limit, by = n, why
		}
	}
	if b.MaxShare > 0 {
		tighten(max(1, int(math.Ceil(b.MaxShare*float64(fleet)-1e-9))), fmt.Sprintf("max_share %.0f%%", b.MaxShare*100))
	}
	if b.MaxNodes > 0 {
		tighten(b.MaxNodes, fmt.Sprintf("max_nodes %d", b.MaxNodes))
	}
	if b.MaxGPUHours > 0 {
		hours, n := 0.0, 0
		for _, nd := range eligible {
			g := len(nd.Inventory.GPUs)
			if g == 0 {
				g = DefaultGPUsPerNode
			}
			h := float64(g) * time.Duration(b.NodeTestTime).Hours()
			if hours+h > b.MaxGPUHours+1e-9 {
				break
			}
			hours += h
			n++
		}
		if n == len(eligible) {
			// The budget fits every eligible node tonight; size the cap as
			// if every node had the default GPU count, for the rotation.
			per := float64(DefaultGPUsPerNode) * time.Duration(b.NodeTestTime).Hours()
			if per > 0 {
				n = max(n, int(b.MaxGPUHours/per))
			}
		}
		tighten(max(n, 1), fmt.Sprintf("max_gpu_hours %g", b.MaxGPUHours))
	}
	return limit, by
}

// finishCoverage fills the rotation lists once this sweep's nodes count
// as covered.
func finishCoverage(cov Coverage, selected []string, last map[string]time.Time, now time.Time) Coverage {
	window := time.Duration(cov.CoverWithinNights) * 24 * time.Hour
	cov.NeverCovered, cov.Overdue = nil, nil
	for _, n := range selected {
		t, ok := last[n]
		switch {
		case !ok:
			cov.NeverCovered = append(cov.NeverCovered, n)
		case now.Sub(t) > window:
			cov.Overdue = append(cov.Overdue, n)
		}
	}
	sort.Strings(cov.NeverCovered)
	sort.Strings(cov.Overdue)
	cov.Gap = cov.NightsToCover > cov.CoverWithinNights || len(cov.Overdue) > 0
	switch {
	case cov.NightsToCover > cov.CoverWithinNights:
		cov.Note = fmt.Sprintf("the budget (%s) covers the %d selected nodes in %d nights, more than the %d-night target",
			cov.CapBy, cov.Selected, cov.NightsToCover, cov.CoverWithinNights)
	case len(cov.Overdue) > 0:
		cov.Note = fmt.Sprintf("%d selected nodes last covered more than %d nights ago (busy, unreachable or deferred since)",
			len(cov.Overdue), cov.CoverWithinNights)
	case len(cov.NeverCovered) > 0:
		cov.Note = fmt.Sprintf("%d selected nodes not covered yet; at this budget every node is covered within %d nights",
			len(cov.NeverCovered), cov.NightsToCover)
	}
	return cov
}
