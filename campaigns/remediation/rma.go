package remediation

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
)

// CloudEvent is the RMA as the webhook receives it: CloudEvents 1.0 in
// structured mode (Content-Type application/cloudevents+json).
type CloudEvent struct {
	SpecVersion     string    `json:"specversion"`
	Type            string    `json:"type"`
	Source          string    `json:"source"`
	ID              string    `json:"id"`
	Time            time.Time `json:"time"`
	Subject         string    `json:"subject"`
	DataContentType string    `json:"datacontenttype"`
	Data            RMAData   `json:"data"`
}

// RMAData is the CloudEvent's data.
type RMAData struct {
	RMA         string   `json:"rma"`
	Remediation string   `json:"remediation"`
	Evidence    Evidence `json:"evidence"`
}

// EventTypeRMA is the CloudEvent type of an RMA record.
const EventTypeRMA = "io.fleetcheck.remediation.rma.opened"

// rma gathers a replace's evidence once, then sends it until the webhook
// takes it (or the retries are spent); the node stays drained.
func (e *Engine) rma(ctx context.Context, r *Remediation) error {
	now := e.now()
	if r.RMA == nil {
		r.RMA = &RMA{ID: "rma-" + strings.TrimPrefix(r.ID, "rem-"), Evidence: e.evidence(ctx, r, now)}
		r.Reason = "replace: RMA " + r.RMA.ID + " opened; node stays drained until the part is replaced (approve)"
		if e.cfg.RMA.Webhook == "" {
			r.DueAt = time.Time{}
		}
		return e.save(ctx, r, now, fmt.Sprintf("RMA %s opened for %s (bundle: %s)", r.RMA.ID, r.Component, r.RMA.Evidence.Bundle))
	}
	if r.RMA.Sent || e.cfg.RMA.Webhook == "" {
		r.DueAt = time.Time{}
		return e.save(ctx, r, now, "")
	}
	err := e.send(ctx, r)
	r.RMA.Attempts++
	switch {
	case err == nil:
		r.RMA.Sent, r.RMA.SentAt, r.RMA.LastErr, r.DueAt = true, now, "", time.Time{}
		return e.save(ctx, r, now, fmt.Sprintf("RMA %s sent to the webhook (try %d)", r.RMA.ID, r.RMA.Attempts))
	case r.RMA.Attempts >= e.cfg.RMA.Retries || isPermanent(err):
		r.RMA.LastErr, r.DueAt = err.Error(), time.Time{}
		return e.save(ctx, r, now, fmt.Sprintf("RMA %s not sent after %d tries: %v (kept in the store; node stays drained)", r.RMA.ID, r.RMA.Attempts, err))
	default:
		r.RMA.LastErr = err.Error()
		r.DueAt = now.Add(e.cfg.RMA.Backoff << min(r.RMA.Attempts-1, 10))
		return e.save(ctx, r, now, "")
	}
}

// evidence gathers what the RMA carries. Each part is best effort: an
// RMA without a bundle still goes out, saying why.
func (e *Engine) evidence(ctx context.Context, r *Remediation, now time.Time) Evidence {
	ev := Evidence{Node: r.Node, Component: r.Component, Opened: now, Findings: []string{r.Trigger.Reason}, Serials: []Part{}, BurnIn: []BurnInRecord{}}
	ev.Findings = append(ev.Findings, r.Notes...)
	if r.Verify != nil {
		ev.Findings = append(ev.Findings, r.Verify.Failed...)
	}
	hist, _ := loadItems(ctx, e.d.DB, `WHERE node = ? AND component = ?`, r.Node, r.Component)
	for i := len(hist) - 1; i >= 0; i-- {
		h := hist[i]
		ev.Ladder = append(ev.Ladder, fmt.Sprintf("%s %s %s: %s", h.CreatedAt.UTC().Format(time.RFC3339), h.ID, h.Step, h.State))
	}
	if name := e.cfg.Actions[ActionCollect]; name != "" {
		res, err := e.d.Fleet.RunAction(ctx, r.Node, name, nil, kit.RunOptions{Timeout: e.cfg.ActionTimeout, ID: r.ID + ".collect"})
		switch {
		case err != nil:
			ev.Bundle = "not collected: " + err.Error()
		case !res.OK:
			ev.Bundle = "not collected: " + res.Message
		default:
			ev.Bundle = bundlePath(r.Node, res)
		}
	}
	if n, ok, err := kit.LookupNode(ctx, e.d.Fleet, r.Node); err == nil && ok {
		ev.Serials = parts(n, r.Component)
	}
	if e.d.History != nil {
		if bs, err := e.d.History.BurnIns(ctx, r.Node); err == nil && bs != nil {
			ev.BurnIn = bs
		}
	}
	return ev
}

// bundlePath is where the collect action left the bundle: the "bundle
// PATH" line the shipped wrapper ends with (deploy/actions), on the node;
// else the action's message.
func bundlePath(node string, res kit.ActionResult) string {
	lines := strings.Split(strings.TrimSpace(res.Output), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if p, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "bundle "); ok && p != "" {
			return node + ":" + p
		}
	}
	return res.Message
}

// parts are the serial-numbered parts an RMA names: the GPU, the HCA, or
// for the node every GPU.
func parts(n kit.Node, comp string) []Part {
	out := []Part{}
	if i, err := strconv.Atoi(strings.TrimPrefix(comp, "GPU")); err == nil && strings.HasPrefix(comp, "GPU") {
		for _, g := range n.Inventory.GPUs {
			if g.Index == i {
				out = append(out, Part{Component: comp, Model: g.Name, Serial: g.Serial})
			}
		}
		return out
	}
	if hca, _, ok := strings.Cut(comp, "/"); ok {
		for _, h := range n.Inventory.HCAs {
			if h.Name == hca {
				out = append(out, Part{Component: hca, Model: h.Model})
			}
		}
		return out
	}
	for _, g := range n.Inventory.GPUs {
		out = append(out, Part{Component: fmt.Sprintf("GPU%d", g.Index), Model: g.Name, Serial: g.Serial})
	}
	return out
}

// permanentError is a webhook answer a retry will not change (a 4xx
// other than 408 and 429).
type permanentError struct{ error }

func isPermanent(err error) bool {
	_, ok := err.(permanentError)
	return ok
}

// send POSTs r's RMA as a structured-mode CloudEvent.
func (e *Engine) send(ctx context.Context, r *Remediation) error {
	ce := CloudEvent{SpecVersion: "1.0", Type: EventTypeRMA, Source: e.cfg.RMA.Source, ID: r.RMA.ID, Time: r.RMA.Evidence.Opened.UTC(),
		Subject: r.Node + "/" + r.Component, DataContentType: "application/json",
		Data: RMAData{RMA: r.RMA.ID, Remediation: r.ID, Evidence: r.RMA.Evidence}}
	body, err := json.Marshal(ce)
	if err != nil {
		return permanentError{err}
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.RMA.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.cfg.RMA.Webhook, bytes.NewReader(body))
	if err != nil {
		return permanentError{err}
	}
	req.Header.Set("Content-Type", "application/cloudevents+json; charset=utf-8")
	resp, err := e.http.Do(req)
	if err != nil {
		return fmt.Errorf("rma webhook: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()                      // the status below is the answer; a close error adds nothing
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return fmt.Errorf("rma webhook: %s", resp.Status)
	}
	return permanentError{fmt.Errorf("rma webhook: %s (not retried)", resp.Status)}
}
