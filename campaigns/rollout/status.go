package rollout

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
)

// Status is a rollout as `rollout status -o json` shows it.
type Status struct {
	ID          string     `json:"id"`
	Name        string     `json:"name,omitempty"`
	Driver      string     `json:"driver"`
	Selector    string     `json:"selector"`
	Phase       Phase      `json:"phase"`
	Paused      bool       `json:"paused"`
	PauseReason string     `json:"pause_reason,omitempty"`
	Wave        int        `json:"wave"`
	SoakUntil   *time.Time `json:"soak_until,omitempty"`
	HaltReason  string     `json:"halt_reason,omitempty"`
	Evidence    []string   `json:"evidence,omitempty"`
	Blocked     string     `json:"blocked,omitempty"` // why no node started at the last step
	// Incomplete lists the nodes not upgraded (skipped or failed) with
	// their reasons; empty when every node so far was upgraded.
	Incomplete string        `json:"incomplete,omitempty"`
	Counts     map[State]int `json:"counts"`
	// Unavailable counts the nodes this rollout holds out of service;
	// MaxUnavailable is the limit over the scope, counting everyone's.
	Unavailable    int          `json:"unavailable"`
	MaxUnavailable string       `json:"max_unavailable"`
	Waves          []WaveStatus `json:"waves"`
	Nodes          []NodeStatus `json:"nodes"`
	Excluded       []Exclusion  `json:"excluded"`
	Created        time.Time    `json:"created"`
	Updated        time.Time    `json:"updated"`
	Finished       *time.Time   `json:"finished,omitempty"`
	Spec           *Spec        `json:"spec"`
}

// WaveStatus sums up one wave.
type WaveStatus struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	// State: pending, running, passed, incomplete (closed within its
	// budget with failed or skipped nodes), halted, soaking, stopped;
	// once rolled back, rolling-back/rolled-back (a wave that ran) or
	// skipped (one never reached).
	State  string `json:"state"`
	Size   int    `json:"size"`
	Budget int    `json:"budget"`
	// Counts per outcome.
	Done    int `json:"done"`
	Failed  int `json:"failed"`
	Skipped int `json:"skipped"`
	Active  int `json:"active"`
	Pending int `json:"pending"`
}

// NodeStatus is one node's place in the rollout.
type NodeStatus struct {
	Node       string     `json:"node"`
	Wave       int        `json:"wave"`
	State      State      `json:"state"`
	Op         string     `json:"op"`
	Since      time.Time  `json:"since"`
	Deadline   *time.Time `json:"deadline,omitempty"`
	FromDriver string     `json:"from_driver"`
	Reason     string     `json:"reason,omitempty"`
	Evidence   []string   `json:"evidence,omitempty"`
	Hold       string     `json:"hold,omitempty"`
	LastError  string     `json:"last_error,omitempty"`
	// Waiting says why a pending node whose turn came has not started.
	Waiting      string  `json:"waiting,omitempty"`
	Baseline     float64 `json:"baseline,omitempty"`
	BaselineFrom string  `json:"baseline_from,omitempty"`
	DrainedByUs  bool    `json:"drained_by_us"`
	Upgrades     int     `json:"upgrades"`
}

// Summary is one line of List.
type Summary struct {
	ID      string        `json:"id"`
	Name    string        `json:"name,omitempty"`
	Driver  string        `json:"driver"`
	Phase   Phase         `json:"phase"`
	Paused  bool          `json:"paused"`
	Wave    int           `json:"wave"`
	Waves   int           `json:"waves"`
	Nodes   int           `json:"nodes"`
	Counts  map[State]int `json:"counts"`
	Created time.Time     `json:"created"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Status returns a rollout's state with its waves and nodes.
func (e *Engine) Status(id string) (*Status, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.byID[id]
	if r == nil {
		return nil, fmt.Errorf("status %s: %w", id, ErrNotFound)
	}
	s := &Status{
		ID: r.ID, Name: r.Spec.Name, Driver: r.Spec.Target.Driver, Selector: r.Spec.Selector,
		Phase: r.Phase, Paused: r.Paused, PauseReason: r.PauseReason, Wave: r.Wave,
		SoakUntil: timePtr(r.SoakUntil), HaltReason: r.HaltReason, Evidence: r.Evidence,
		Blocked: r.blocked, Incomplete: r.incomplete(), Counts: map[State]int{}, MaxUnavailable: r.Spec.MaxUnavailable.String() + " of " + r.Spec.MaxUnavailableScope,
		Excluded: r.Plan.Excluded, Created: r.Created, Updated: r.Updated, Finished: timePtr(r.Finished), Spec: r.Spec,
	}
	for _, w := range r.Plan.Waves {
		s.Waves = append(s.Waves, WaveStatus{Index: w.Index, Name: w.Name, Budget: w.Budget, State: "pending"})
	}
	for _, n := range r.nodes {
		s.Counts[n.State]++
		if n.holdsSlot() {
			s.Unavailable++
		}
		waiting := ""
		if n.State == Pending && !n.waitSince.IsZero() {
			waiting = kit.WaitingNote(n.waitSince, r.Spec.connectGrace())
		}
		s.Nodes = append(s.Nodes, NodeStatus{Waiting: waiting,
			Node: n.Name, Wave: n.Wave, State: n.State, Op: n.Op, Since: n.Since, Deadline: timePtr(n.Deadline),
			FromDriver: n.FromDriver, Reason: n.Reason, Evidence: n.Evidence, Hold: n.Hold, LastError: n.lastErr,
			Baseline: n.Baseline, BaselineFrom: n.BaselineFrom, DrainedByUs: n.DrainedByUs, Upgrades: n.Upgrades,
		})
		// A wave keeps its nodes whatever they do: a rollback turns the
		// op to rollback, and the node is still the canary it was.
		if n.Wave >= len(s.Waves) {
			continue
		}
		w := &s.Waves[n.Wave]
		w.Size++
		switch n.State {
		case Done, RolledBack:
			w.Done++
		case Failed:
			w.Failed++
		case Skipped:
			w.Skipped++
		case Pending:
			w.Pending++
		default:
			w.Active++
		}
	}
	for i := range s.Waves {
		w := &s.Waves[i]
		switch {
		case (i < r.Wave || (i == r.Wave && (r.Phase == PhaseCompleted || r.Phase == PhaseSoaking || r.Phase == PhaseAwaitingApproval))) &&
			w.Failed+w.Skipped > 0:
			w.State = "incomplete" // never "passed" with nodes left un-upgraded
		case i < r.Wave || (i == r.Wave && (r.Phase == PhaseCompleted || r.Phase == PhaseSoaking || r.Phase == PhaseAwaitingApproval)):
			w.State = "passed"
		case i == r.Wave && r.Phase == PhaseHalted:
			w.State = "halted"
		case i == r.Wave && (r.Phase == PhaseRunning || r.Phase == PhaseAborting):
			w.State = "running"
		case w.Active > 0 || w.Done+w.Failed > 0:
			w.State = "stopped"
		}
		if i == r.Wave && r.Phase == PhaseSoaking {
			w.State = "soaking"
		}
		// A rollback undoes every wave that ran, not only the last: each
		// says so (a last wave "stopped" beside earlier "passed" ones read
		// as if only it had been undone). A wave never reached was skipped.
		if r.Phase == PhaseRollingBack || r.Phase == PhaseRolledBack {
			switch {
			case w.Active+w.Done+w.Failed > 0:
				w.State = string(r.Phase)
			case r.Phase == PhaseRolledBack:
				w.State = "skipped"
			}
		}
	}
	return s, nil
}

// List sums up every rollout, oldest first.
func (e *Engine) List() []Summary {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Summary, 0, len(e.runs))
	for _, r := range e.runs {
		s := Summary{ID: r.ID, Name: r.Spec.Name, Driver: r.Spec.Target.Driver, Phase: r.Phase, Paused: r.Paused,
			Wave: r.Wave, Waves: len(r.Plan.Waves), Nodes: len(r.nodes), Counts: map[State]int{}, Created: r.Created}
		for _, n := range r.nodes {
			s.Counts[n.State]++
		}
		out = append(out, s)
	}
	return out
}

// History returns up to limit of a rollout's latest events, oldest first;
// node narrows them to one node.
func (e *Engine) History(ctx context.Context, id, node string, limit int) ([]Event, error) {
	e.mu.Lock()
	_, ok := e.byID[id]
	e.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("history %s: %w", id, ErrNotFound)
	}
	if limit <= 0 || limit > 100000 {
		limit = 1000
	}
	return e.st.events(ctx, id, node, limit)
}
