package console

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
)

// Event kinds the events page offers as filters.
var eventKinds = []string{store.EventAudit, store.EventOperatorAction, store.EventStateChange, store.EventRefused, store.EventConnection}

const (
	defaultEvents = 200
	maxEvents     = 2000
)

type eventsView struct {
	Node, Kind string
	Limit      int
	Kinds      []count
	Events     []store.Event
	Now        time.Time
}

func (s *Server) events(w http.ResponseWriter, r *http.Request, id who) error {
	q := r.URL.Query()
	v := eventsView{Node: q.Get("node"), Kind: q.Get("kind"), Limit: defaultEvents, Now: s.opts.Now()}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxEvents {
			return badRequest("limit %q: a number within 1..%d", l, maxEvents)
		}
		v.Limit = n
	}
	if v.Kind != "" && !contains(eventKinds, v.Kind) {
		return badRequest("kind %q: want one of %v", v.Kind, eventKinds)
	}
	for _, k := range append([]string{""}, eventKinds...) {
		v.Kinds = append(v.Kinds, count{Key: k, URL: query("/events", "node", v.Node, "kind", k)})
	}
	evs, err := s.opts.Source.Events(r.Context(), store.EventQuery{Node: v.Node, Kind: v.Kind, Limit: v.Limit})
	if err != nil {
		return err
	}
	slices.Reverse(evs) // newest first
	v.Events = evs
	s.render(w, r, "events", "Events", &v, id)
	return nil
}
