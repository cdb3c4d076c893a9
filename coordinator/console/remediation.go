package console

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/escalate"
)

// remedStates are the remediation states as the list filters them: those
// waiting for an operator first, then the running ones, then the final.
var remedStates = []remediation.State{
	remediation.StateShadow, remediation.StateAwaiting, remediation.StateRMA,
	remediation.StateHeld, remediation.StateDraining, remediation.StateActing, remediation.StateVerifying,
	remediation.StateFailed, remediation.StateDone, remediation.StateCancelled, remediation.StateSuppressed,
}

// Bounds of the remediation pages.
const (
	maxNodeName     = 253 // a DNS name: the longest node name a filter can hold
	nodeRemediation = 5   // remediations the node page lists (newest first)
	listJobEvents   = 20  // job events the list reads, as the CLI's list
)

// errNoRemediation answers remediation pages of a coordinator without the ladder.
var errNoRemediation = &httpError{code: http.StatusNotFound, err: errors.New("this coordinator runs no remediation ladder (no fleet wired in)")}

// remedActions are the actions a remediation takes from the console, as
// from `fleetcheck remediation approve|cancel`.
var remedActions = []string{"approve", "cancel"}

// approvable says whether approve takes a remediation in st: a shadow one
// runs; one waiting for hands (reseat, a replaced part) is verified.
func approvable(st remediation.State) bool {
	return st == remediation.StateShadow || st == remediation.StateAwaiting || st == remediation.StateRMA
}

type remedListView struct {
	Off         bool
	Mode        remediation.Mode
	Node, State string
	States      []count // the state filters with how many of the node's remediations are in each
	Rows        []remediation.Remediation
	Total       int // of the node (or all), before the state filter
	Matched     int
	Page, Pages int
	From, To    int

	PrevURL, NextURL string
	// JobEvents are the newest job events (of the node, when filtered);
	// Flagged the ports the link rule holds flagged.
	JobEvents []remediation.JobEvent
	Flagged   []escalate.FlaggedPort
	Now       time.Time
}

// remediations lists the remediations, newest first, a page at a time:
// filtered by node and state, with the engine's mode on top.
func (s *Server) remediations(w http.ResponseWriter, r *http.Request, id who) error {
	q := r.URL.Query()
	v := remedListView{Node: strings.TrimSpace(q.Get("node")), State: q.Get("state"), Now: s.opts.Now()}
	if len(v.Node) > maxNodeName {
		return badRequest("node: at most %d bytes", maxNodeName)
	}
	if v.State != "" && !validRemedState(v.State) {
		return badRequest("state %q: want one of %s", v.State, remedStateList())
	}
	v.Page, _ = strconv.Atoi(q.Get("page"))
	v.Page = max(v.Page, 1)
	rs := s.opts.Source.Remediations()
	if rs == nil {
		v.Off = true
		s.render(w, r, "remediations", "Remediation", &v, id)
		return nil
	}
	v.Mode = rs.Mode()
	all, err := rs.List(r.Context(), v.Node, "")
	if err != nil {
		return err
	}
	v.Total = len(all)
	by := map[remediation.State]int{}
	var rows []remediation.Remediation
	for _, x := range all {
		by[x.State]++
		if v.State == "" || string(x.State) == v.State {
			rows = append(rows, x)
		}
	}
	v.States = append(v.States, count{Key: "", N: v.Total, URL: query("/remediations", "node", v.Node)})
	for _, st := range remedStates {
		if by[st] > 0 || string(st) == v.State {
			v.States = append(v.States, count{Key: string(st), N: by[st], URL: query("/remediations", "node", v.Node, "state", string(st))})
		}
	}
	v.Matched = len(rows)
	size := s.cfg.PageSize
	v.Pages = max(1, (len(rows)+size-1)/size)
	v.Page = min(v.Page, v.Pages)
	lo := (v.Page - 1) * size
	hi := min(lo+size, len(rows))
	v.Rows = rows[lo:hi]
	v.From, v.To = lo+1, hi
	jobs, err := rs.JobEvents(r.Context(), listJobEvents)
	if err != nil {
		return err
	}
	for _, j := range jobs {
		if v.Node == "" || contains(j.Nodes, v.Node) {
			v.JobEvents = append(v.JobEvents, j)
		}
	}
	v.Flagged = rs.Flagged(v.Node)
	if v.Page > 1 {
		v.PrevURL = query("/remediations", "node", v.Node, "state", v.State, "page", v.Page-1)
	}
	if v.Page < v.Pages {
		v.NextURL = query("/remediations", "node", v.Node, "state", v.State, "page", v.Page+1)
	}
	s.render(w, r, "remediations", "Remediation", &v, id)
	return nil
}

func validRemedState(st string) bool {
	for _, x := range remedStates {
		if string(x) == st {
			return true
		}
	}
	return false
}

func remedStateList() string {
	out := make([]string, len(remedStates))
	for i, x := range remedStates {
		out[i] = string(x)
	}
	return strings.Join(out, ", ")
}

// rungView is one step of a remediation's ladder.
type rungView struct {
	Step string
	// Where is passed (climbed from), current or ahead.
	Where string
}

type remedView struct {
	R          remediation.Remediation
	EngineMode remediation.Mode
	Rungs      []rungView
	Actions    []string // those its state takes
	Flash      string
	// CloudEventType is what the RMA's webhook receives.
	CloudEventType string
	Now            time.Time
}

// remediationPage is one remediation: its ladder, its transitions with
// their times, what it would do (shadow), its action, verification and
// RMA record.
func (s *Server) remediationPage(w http.ResponseWriter, r *http.Request, id who) error {
	rs := s.opts.Source.Remediations()
	if rs == nil {
		return errNoRemediation
	}
	x, err := rs.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	v := remedView{R: x, EngineMode: rs.Mode(), Flash: r.URL.Query().Get("done"), CloudEventType: remediation.EventTypeRMA, Now: s.opts.Now()}
	if !contains(remedActions, v.Flash) {
		v.Flash = ""
	}
	for i, st := range x.Ladder {
		where := "ahead"
		switch {
		case i < x.Rung:
			where = "passed"
		case i == x.Rung:
			where = "current"
		}
		v.Rungs = append(v.Rungs, rungView{Step: st, Where: where})
	}
	if approvable(x.State) {
		v.Actions = append(v.Actions, "approve")
	}
	if !x.State.Final() {
		v.Actions = append(v.Actions, "cancel")
	}
	s.render(w, r, "remediation", "remediation "+x.ID, &v, id)
	return nil
}

// remediationControl approves or cancels a remediation: as a campaign
// action, enabled by config and same-origin with the session's CSRF
// token; then through RemediationService, which audits it under the
// operator's name, exactly as the CLI's call.
func (s *Server) remediationControl(w http.ResponseWriter, r *http.Request, id who) error {
	if !s.cfg.Actions {
		return &httpError{code: http.StatusForbidden, err: errors.New("the console is read-only (console.actions: false): use fleetcheck remediation approve|cancel")}
	}
	if !checkCSRF(r, id) {
		return &httpError{code: http.StatusForbidden, err: errors.New("missing or wrong CSRF token, or a request from another site")}
	}
	rs := s.opts.Source.Remediations()
	if rs == nil {
		return errNoRemediation
	}
	rid, action := r.PathValue("id"), r.PathValue("action")
	if !contains(remedActions, action) {
		return badRequest("remediation action %q: want approve or cancel", action)
	}
	ctx := withIdentity(r.Context(), id, s)
	var err error
	switch action {
	case "approve":
		err = rs.Approve(ctx, rid)
	case "cancel":
		reason := strings.TrimSpace(r.PostFormValue("reason"))
		if len(reason) > maxReason {
			return badRequest("reason: at most %d bytes", maxReason)
		}
		if reason == "" {
			reason = "from the console"
		} else {
			reason += " (from the console)"
		}
		err = rs.Cancel(ctx, rid, reason)
	}
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return err
		}
		return &httpError{code: http.StatusConflict, err: err}
	}
	s.log.Info().Str("actor", id.Actor()).Str("remediation", rid).Str("action", action).Msg("console action")
	http.Redirect(w, r, query("/remediations/"+rid, "done", action), http.StatusSeeOther)
	return nil
}
