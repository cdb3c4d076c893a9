package membership

import (
	"fmt"
	"maps"
)

// State is a member's gossip state as this Pool last saw it.
//
// There is no "suspect": memberlist keeps suspicion internal (it is confirmed
// as dead or refuted within the suspicion timeout) and offers no race-free
// way to read it, so a suspect member is still StateAlive here.
type State int

// Member states.
const (
	StateAlive State = iota
	StateDead        // stopped answering probes: crashed, partitioned or network-isolated
	StateLeft        // left on purpose (Leave)
)

func (s State) String() string {
	switch s {
	case StateAlive:
		return "alive"
	case StateDead:
		return "dead"
	case StateLeft:
		return "left"
	default:
		return fmt.Sprintf("state(%d)", int(s))
	}
}

// Member is one node of the pool.
type Member struct {
	Name  string
	Addr  string // advertised "ip:port"
	Meta  Meta   // zero when the member's meta could not be decoded (logged)
	State State
}

// clone gives callers their own label map, so that none can change what
// the Pool or another caller holds.
func (m Member) clone() Member {
	m.Meta.Labels = maps.Clone(m.Meta.Labels)
	return m
}

// Events receives membership changes. A Pool calls it from one goroutine,
// one call at a time, in the order memberlist reported the changes, never
// while holding memberlist's locks: an implementation may call back into the
// Pool. A slow implementation delays later events but not gossip.
//
// Events are liveness hints only: see the package documentation.
type Events interface {
	// NodeJoined: a member is alive, for the first time or again after
	// being dead or left. The local member is reported too.
	NodeJoined(Member)
	// NodeLeft: a member is gone; Member.State says StateDead (failed
	// probes) or StateLeft (left on purpose).
	NodeLeft(Member)
	// NodeUpdated: an alive member changed its meta or address.
	NodeUpdated(Member)
}

// EventFuncs adapts plain functions to Events; nil fields are skipped.
type EventFuncs struct {
	Joined  func(Member)
	Left    func(Member)
	Updated func(Member)
}

var _ Events = EventFuncs{}

// NodeJoined implements Events.
func (f EventFuncs) NodeJoined(m Member) {
	if f.Joined != nil {
		f.Joined(m)
	}
}

// NodeLeft implements Events.
func (f EventFuncs) NodeLeft(m Member) {
	if f.Left != nil {
		f.Left(m)
	}
}

// NodeUpdated implements Events.
func (f EventFuncs) NodeUpdated(m Member) {
	if f.Updated != nil {
		f.Updated(m)
	}
}
