package checks

import (
	"strconv"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// State is what one run leaves for the next, so that counters can be judged
// by their rise and kernel events by whether they are new. The agent keeps it
// in its state directory; `run --state FILE` keeps it in a file.
type State struct {
	At time.Time `json:"at"`
	// IBCounters maps "mlx5_0/1" to counter name to value (counters/ and hw_counters/).
	IBCounters map[string]map[string]uint64 `json:"ib_counters,omitempty"`
	// NVLinkErrors maps "GPU0/3" (GPU index / link) to counter name to value.
	NVLinkErrors map[string]map[string]uint64 `json:"nvlink_errors,omitempty"`
	// KernelEvents holds the keys of kernel events already reported.
	KernelEvents map[string]bool `json:"kernel_events,omitempty"`
}

// NextState derives the state to keep after a run over snap. Kernel event
// keys are carried over from prev so an event is reported once even after
// the lines scroll out of the ring buffer and back in via a persistent log.
func NextState(snap *snapshot.Snapshot, prev *State, now time.Time) *State {
	st := &State{At: now}
	if snap == nil {
		return st
	}
	if len(snap.HCAs) > 0 {
		st.IBCounters = make(map[string]map[string]uint64)
		for _, h := range snap.HCAs {
			for _, p := range h.Ports {
				m := make(map[string]uint64, len(p.Counters)+len(p.HWCounters))
				for k, v := range p.Counters {
					m[k] = v
				}
				for k, v := range p.HWCounters {
					m["hw."+k] = v
				}
				st.IBCounters[PortComponent(h.Name, p.Port)] = m
			}
		}
	}
	if snap.NVLink != nil {
		st.NVLinkErrors = make(map[string]map[string]uint64)
		for _, g := range snap.NVLink.GPUs {
			for _, l := range g.Links {
				if len(l.Errors) == 0 {
					continue
				}
				m := make(map[string]uint64, len(l.Errors))
				for k, v := range l.Errors {
					m[k] = v
				}
				st.NVLinkErrors[NVLinkKey(g.Index, l.Link)] = m
			}
		}
	}
	st.KernelEvents = make(map[string]bool)
	if prev != nil {
		for k := range prev.KernelEvents {
			st.KernelEvents[k] = true
		}
	}
	if snap.Kernel != nil {
		for _, e := range snap.Kernel.Events {
			st.KernelEvents[EventKey(e)] = true
		}
	}
	// Bound the remembered set: a log that rotates keeps its newest events.
	if len(st.KernelEvents) > maxRememberedEvents {
		st.KernelEvents = make(map[string]bool)
		if snap.Kernel != nil {
			for _, e := range snap.Kernel.Events {
				st.KernelEvents[EventKey(e)] = true
			}
		}
	}
	return st
}

const maxRememberedEvents = 10000

// NVLinkKey names a link in State.NVLinkErrors.
func NVLinkKey(gpu, link int) string { return GPUComponent(gpu) + "/" + strconv.Itoa(link) }

// EventKey identifies a kernel event across runs: its raw line, which holds
// the timestamp where the log has one.
func EventKey(e snapshot.KernelEvent) string { return e.Raw }
