package console

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
)

// errNoCampaigns answers campaign pages of a coordinator without a fleet.
var errNoCampaigns = &httpError{code: http.StatusNotFound, err: errors.New("this coordinator runs no campaigns")}

type campaignsView struct {
	Off      bool
	Sweeps   []sweep.Summary
	Rollouts []rollout.Summary
	Burnins  []burnin.CampaignStatus
	Drills   []drill.Drill
	Now      time.Time
}

func (s *Server) campaigns(w http.ResponseWriter, r *http.Request, id who) error {
	v := campaignsView{Now: s.opts.Now()}
	c := s.opts.Source.Campaigns()
	if c == nil {
		v.Off = true
		s.render(w, r, "campaigns", "Campaigns", &v, id)
		return nil
	}
	ctx := r.Context()
	var err error
	if v.Sweeps, err = c.Sweeps(ctx); err != nil {
		return err
	}
	if v.Rollouts, err = c.Rollouts(ctx); err != nil {
		return err
	}
	if v.Burnins, err = c.Burnins(ctx); err != nil {
		return err
	}
	if v.Drills, err = c.Drills(ctx); err != nil {
		return err
	}
	slices.Reverse(v.Burnins) // newest first, as sweeps and rollouts list
	slices.Reverse(v.Drills)
	s.render(w, r, "campaigns", "Campaigns", &v, id)
	return nil
}

type campaignView struct {
	Kind, ID string
	Actions  []string
	Flash    string

	SweepProgress *sweep.Progress
	Sweep         *sweep.Report
	Rollout       *rollout.Status
	Burnin        *burnin.CampaignStatus
	Drill         *drill.Drill
	DrillRows     []drill.Row
	Now           time.Time
}

func (s *Server) campaign(w http.ResponseWriter, r *http.Request, id who) error {
	c := s.opts.Source.Campaigns()
	if c == nil {
		return errNoCampaigns
	}
	ctx := r.Context()
	v := campaignView{Kind: r.PathValue("kind"), ID: r.PathValue("id"), Flash: r.URL.Query().Get("done"), Now: s.opts.Now()}
	v.Actions = Actions(v.Kind)
	switch v.Kind {
	case "sweep":
		p, rep, err := c.Sweep(ctx, v.ID)
		if err != nil {
			return err
		}
		v.SweepProgress, v.Sweep = &p, rep
	case "rollout":
		st, err := c.Rollout(ctx, v.ID)
		if err != nil {
			return err
		}
		v.Rollout = st
	case "burnin":
		st, err := c.Burnin(ctx, v.ID)
		if err != nil {
			return err
		}
		v.Burnin = &st
	case "drill":
		ds, err := c.Drills(ctx)
		if err != nil {
			return err
		}
		for i := range ds {
			if ds[i].ID == v.ID {
				v.Drill = &ds[i]
			}
		}
		if v.Drill == nil {
			return &httpError{code: http.StatusNotFound, err: fmt.Errorf("drill %s not found", v.ID)}
		}
		rows, err := c.DrillRows(ctx)
		if err != nil {
			return err
		}
		for _, row := range rows {
			if row.Drill == v.ID {
				v.DrillRows = append(v.DrillRows, row)
			}
		}
	default:
		return &httpError{code: http.StatusNotFound, err: fmt.Errorf("campaign kind %q: want sweep, rollout, burnin or drill", v.Kind)}
	}
	// A finished campaign takes no more actions.
	if v.Rollout != nil && v.Rollout.Finished != nil || v.Burnin != nil && !v.Burnin.FinishedAt.IsZero() ||
		v.Drill != nil && !v.Drill.FinishedAt.IsZero() {
		v.Actions = nil
	}
	s.render(w, r, "campaign", v.Kind+" "+v.ID, &v, id)
	return nil
}

func (s *Server) burninReport(w http.ResponseWriter, r *http.Request, _ who) error {
	c := s.opts.Source.Campaigns()
	if c == nil {
		return errNoCampaigns
	}
	b, err := c.BurninHTML(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	// The report is self-contained; it runs no script of ours.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'")
	_, _ = w.Write(b) // a client gone away is not an error here
	return nil
}

// maxReason bounds an operator's reason, as the RPCs do.
const maxReason = 512

// control takes an action on a campaign: enabled by config, same-origin
// with the session's CSRF token, through the campaign service (which
// audits it under the operator's name).
func (s *Server) control(w http.ResponseWriter, r *http.Request, id who) error {
	if !s.cfg.Actions {
		return &httpError{code: http.StatusForbidden, err: errors.New("the console is read-only (console.actions: false)")}
	}
	if !checkCSRF(r, id) {
		return &httpError{code: http.StatusForbidden, err: errors.New("missing or wrong CSRF token, or a request from another site")}
	}
	c := s.opts.Source.Campaigns()
	if c == nil {
		return errNoCampaigns
	}
	kind, cid, action := r.PathValue("kind"), r.PathValue("id"), r.PathValue("action")
	if !contains(Actions(kind), action) {
		return badRequest("%s: %s %q: want one of %s", ErrUnknownAction, kind, action, strings.Join(Actions(kind), ", "))
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if len(reason) > maxReason {
		return badRequest("reason: at most %d bytes", maxReason)
	}
	if reason == "" {
		reason = "from the console"
	} else {
		reason += " (from the console)"
	}
	ctx := withIdentity(r.Context(), id, s)
	if err := c.Control(ctx, kind, cid, action, reason); err != nil {
		return &httpError{code: http.StatusConflict, err: err}
	}
	s.log.Info().Str("actor", id.Actor()).Str("campaign", cid).Str("action", action).Msg("console action")
	http.Redirect(w, r, query("/campaigns/"+kind+"/"+cid, "done", action), http.StatusSeeOther)
	return nil
}
