package coordinator

import (
	"context"
	"errors"
	"fmt"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
)

// Audit records an action in the event log (kind "audit") with who took
// it and why: actor is ActorFrom(ctx) for an operator's request, or names
// the campaign acting on its own ("campaign:burnin-7"); action is a short
// verb ("drain", "campaign.start"); detail says what and why. Campaigns
// call it for every transition they make, before acting on it: an error
// means the record was not written and the action should not be taken.
func (s *Server) Audit(ctx context.Context, actor, action, detail string) error {
	return s.AuditNode(ctx, "", actor, action, detail)
}

// AuditNode is Audit for an action on one node: the event is listed with
// the node's (fleetcheck events --node NODE).
func (s *Server) AuditNode(ctx context.Context, node, actor, action, detail string) error {
	if action == "" {
		return errors.New("audit: no action")
	}
	if actor == "" {
		actor = ActorFrom(ctx)
	}
	msg := action
	if detail != "" {
		msg += ": " + detail
	}
	return s.record(ctx, node, store.EventAudit, actor, msg)
}

// record writes an event and returns the error, for callers that must not
// act on what they could not record.
func (s *Server) record(ctx context.Context, node, kind, actor, msg string) error {
	db := s.Store()
	if db == nil {
		return errors.New("audit: coordinator not started")
	}
	if err := db.AddEvent(ctx, store.Event{Time: s.now(), Node: node, Kind: kind, Actor: actor, Message: msg}); err != nil {
		return fmt.Errorf("audit %s: %w", kind, err)
	}
	return nil
}
