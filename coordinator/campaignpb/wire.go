// Package campaignpb converts the campaign engines' statuses, lists and
// plans, and the baselines, to the typed CampaignService answers and back.
//
// The coordinator sends what ...PB builds; the CLI turns the answer back
// into the engine's own type with ...From and prints it as the engine
// would, so `-o json` is the engine's JSON whichever way it travelled.
// Two things do not survive the trip, on purpose: times come back in UTC,
// and an empty list comes back [] (never null).
package campaignpb

import (
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
)

// ts is t on the wire; the zero time is absent.
func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// tsPtr is ts for an optional time.
func tsPtr(t *time.Time) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return ts(*t)
}

// tm is the time ts sent: absent is the zero time, anything else UTC.
func tm(p *timestamppb.Timestamp) time.Time {
	if p == nil {
		return time.Time{}
	}
	return p.AsTime()
}

// tmPtr is tm for an optional time: absent stays nil.
func tmPtr(p *timestamppb.Timestamp) *time.Time {
	if p == nil {
		return nil
	}
	t := p.AsTime()
	return &t
}

// counts converts a count map; nil stays nil on the wire.
func counts[K ~string](m map[K]int) map[string]int32 {
	if m == nil {
		return nil
	}
	out := make(map[string]int32, len(m))
	for k, v := range m {
		out[string(k)] = int32(v)
	}
	return out
}

// countsFrom is the inverse of counts, never nil.
func countsFrom[K ~string](m map[string]int32) map[K]int {
	out := make(map[K]int, len(m))
	for k, v := range m {
		out[K(k)] = int(v)
	}
	return out
}

// conv converts each element; the result is never nil.
func conv[A, B any](in []A, f func(A) B) []B {
	out := make([]B, 0, len(in))
	for _, a := range in {
		out = append(out, f(a))
	}
	return out
}

// orEmpty is s, or an empty list for nil (the engines' lists print []).
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// specJSON is a spec as the engine writes it; nil is empty.
func specJSON(what string, spec any, isNil bool) ([]byte, error) {
	if isNil {
		return nil, nil
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("%s spec: %w", what, err)
	}
	return b, nil
}

// specFrom reads a spec specJSON wrote; empty is nil.
func specFrom[T any](what string, b []byte) (*T, error) {
	if len(b) == 0 {
		return nil, nil
	}
	v := new(T)
	if err := json.Unmarshal(b, v); err != nil {
		return nil, fmt.Errorf("%s spec: %w", what, err)
	}
	return v, nil
}
