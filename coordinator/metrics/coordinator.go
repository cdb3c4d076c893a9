//go:build !node

// The coordinator's metrics are left out of the slim node build (-tags
// node): they import the coordinator, and through it client-go and SQLite.

// Package metrics exports the coordinator's measurements in the Prometheus
// format (NewCoordinator, read from coordinator.Stats when scraped). Every
// metric is registered on a Registerer the caller passes in, never on the
// global default one. docs/metrics.md lists them all.
package metrics

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/promserve"
)

// Coordinator is the coordinator's exporter: histograms fed as the store
// commits (it implements coordinator.Metrics), everything else read from
// coordinator.Stats at scrape time, so a scrape costs one pass over the
// node table and nothing on the ingest path.
type Coordinator struct {
	commit prometheus.Histogram
	batch  prometheus.Histogram
	stats  atomic.Pointer[func() coordinator.Stats]
}

var _ coordinator.Metrics = (*Coordinator)(nil)

var (
	descNodes = prometheus.NewDesc("fleetcheck_nodes",
		"Known nodes by state (healthy, degraded, failed, unreachable, left, initializing, draining, drained).",
		[]string{"state"}, nil)
	descConnected = prometheus.NewDesc("fleetcheck_agents_connected",
		"Agents with an open stream.", nil, nil)
	descIngested = prometheus.NewDesc("fleetcheck_results_ingested_total",
		"Results stored for the first time and acknowledged.", nil, nil)
	descDuplicates = prometheus.NewDesc("fleetcheck_results_duplicate_total",
		"Results already stored, answered with their original ack (resends after a reconnect).", nil, nil)
	descRefusedResults = prometheus.NewDesc("fleetcheck_results_refused_total",
		"Results refused for good: malformed, for another node, another node's id, work never sent to the node.", nil, nil)
	descWorks = prometheus.NewDesc("fleetcheck_runcheck_in_progress",
		"RunCheck calls (fleetcheck check) in progress.", nil, nil)
	descWorkNodes = prometheus.NewDesc("fleetcheck_runcheck_nodes",
		"Nodes of the RunCheck calls in progress, by whether they have an outcome yet (done) or not (pending).",
		[]string{"progress"}, nil)
	descWorkRatio = prometheus.NewDesc("fleetcheck_runcheck_progress_ratio",
		"Share of the nodes of the RunCheck calls in progress that have an outcome; absent when none runs.", nil, nil)

	descGossip = prometheus.NewDesc("fleetcheck_gossip_members",
		"Members of the gossip pool as the coordinator sees them, by state (alive, dead, left); absent when gossip is off.",
		[]string{"state"}, nil)

	descRefusalsSuppressed = prometheus.NewDesc("fleetcheck_refusals_suppressed_total",
		"Refusals past their identity's bound, counted instead of logged and recorded as refused events, by reason.",
		[]string{"reason"}, nil)
	descTLSFailures = prometheus.NewDesc("fleetcheck_tls_handshake_failures_total",
		"TLS handshakes on the gRPC port that failed, by reason (plaintext, no_certificate, unknown_ca, expired, ...).",
		[]string{"reason"}, nil)

	coordinatorDescs = []*prometheus.Desc{descNodes, descConnected, descIngested, descDuplicates,
		descRefusedResults, descWorks, descWorkNodes, descWorkRatio, descGossip, descRefusalsSuppressed, descTLSFailures}
)

// NewCoordinator builds the coordinator's exporter and registers it on
// reg. Pass it as coordinator.Options.Metrics, then hand it the server's
// Stats with Watch.
func NewCoordinator(reg prometheus.Registerer) (*Coordinator, error) {
	c := &Coordinator{
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fleetcheck_store_commit_duration_seconds",
			Help: "Time one store transaction of results took to commit (a result is acknowledged only after).",
			// SQLite in WAL mode commits in about a millisecond; seconds
			// mean the disk or a checkpoint is holding ingest up.
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fleetcheck_store_commit_batch_results",
			Help:    "Results committed together in one store transaction.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024},
		}),
	}
	for _, col := range []prometheus.Collector{c.commit, c.batch, c} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Watch makes scrapes read stats (the server's Stats method).
func (c *Coordinator) Watch(stats func() coordinator.Stats) { c.stats.Store(&stats) }

// StoreCommit observes one committed batch.
func (c *Coordinator) StoreCommit(results int, took time.Duration) {
	c.commit.Observe(took.Seconds())
	c.batch.Observe(float64(results))
}

// Describe sends the descriptions of the Stats metrics.
func (c *Coordinator) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range coordinatorDescs {
		ch <- d
	}
}

// Collect reads Stats once and sends what it says.
func (c *Coordinator) Collect(ch chan<- prometheus.Metric) {
	f := c.stats.Load()
	if f == nil {
		return
	}
	st := (*f)()
	out := promserve.NewSeries()
	// Every state appears, at 0 when empty, so ratios and alerts on a
	// state never see a missing series.
	for _, state := range coordinator.States() {
		out.Add(descNodes, prometheus.GaugeValue, float64(st.NodesByState[state]), state)
	}
	for state, n := range st.NodesByState {
		out.Add(descNodes, prometheus.GaugeValue, float64(n), state)
	}
	out.Add(descConnected, prometheus.GaugeValue, float64(st.ConnectedAgents))
	out.Add(descIngested, prometheus.CounterValue, float64(st.ResultsAcked))
	out.Add(descDuplicates, prometheus.CounterValue, float64(st.ResultsDuplicate))
	out.Add(descRefusedResults, prometheus.CounterValue, float64(st.ResultsRefused))
	out.Add(descWorks, prometheus.GaugeValue, float64(st.ActiveWork))
	out.Add(descWorkNodes, prometheus.GaugeValue, float64(st.WorkNodesDone), "done")
	out.Add(descWorkNodes, prometheus.GaugeValue, float64(st.WorkNodes-st.WorkNodesDone), "pending")
	if st.WorkNodes > 0 {
		out.Add(descWorkRatio, prometheus.GaugeValue, float64(st.WorkNodesDone)/float64(st.WorkNodes))
	}
	for _, r := range coordinator.RefusalReasons() {
		out.Add(descRefusalsSuppressed, prometheus.CounterValue, float64(st.RefusalsSuppressed[r]), r)
	}
	for r, n := range st.RefusalsSuppressed {
		out.Add(descRefusalsSuppressed, prometheus.CounterValue, float64(n), r)
	}
	for _, r := range pki.HandshakeReasons() {
		out.Add(descTLSFailures, prometheus.CounterValue, float64(st.TLSHandshakeFailures[string(r)]), string(r))
	}
	for r, n := range st.TLSHandshakeFailures {
		out.Add(descTLSFailures, prometheus.CounterValue, float64(n), r)
	}
	if st.GossipMembers != nil {
		for _, state := range []string{"alive", "dead", "left"} {
			out.Add(descGossip, prometheus.GaugeValue, float64(st.GossipMembers[state]), state)
		}
	}
	out.Emit(ch)
}
