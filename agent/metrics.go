package agent

import (
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

// Metrics receives what the agent measures. The Prometheus exporter
// (/metrics) implements it; the agent itself knows nothing of Prometheus.
// Methods are called from several goroutines and must not block.
type Metrics interface {
	// PassDone is called after each inspection, scheduled (workID "") or
	// requested, with its report and duration.
	PassDone(workID string, r *report.Report, took time.Duration)
	// Spool reports the spool's depth after it changed.
	Spool(results int, bytes int64)
	// SpoolDropped counts results lost before the coordinator acknowledged
	// them, by reason (spool.DropReason: limit, too_large, no_space,
	// write_error, corrupt).
	SpoolDropped(reason string, n int)
	// Connected reports whether the stream to the coordinator is up.
	Connected(up bool)
	// Acked counts acknowledged results; duplicate is the coordinator's flag.
	Acked(duplicate bool)
	// Refused counts results the coordinator will never store (dropped).
	Refused()
	// Work counts requests by outcome: accepted, refused, done.
	Work(outcome string)
}

// GossipMetrics is optional for a Metrics: one that implements it is told
// how many members the agent's gossip pool holds in each state, itself
// included (fleetcheck_agent_gossip_members{state}). Called from the pool's
// event goroutine, one call at a time.
type GossipMetrics interface {
	GossipMembers(alive, dead, left int)
}

type nopMetrics struct{}

func (nopMetrics) PassDone(string, *report.Report, time.Duration) {}
func (nopMetrics) Spool(int, int64)                               {}
func (nopMetrics) SpoolDropped(string, int)                       {}
func (nopMetrics) Connected(bool)                                 {}
func (nopMetrics) Acked(bool)                                     {}
func (nopMetrics) Refused()                                       {}
func (nopMetrics) Work(string)                                    {}
