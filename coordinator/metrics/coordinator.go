//go:build !node

// The coordinator's metrics are left out of the slim node build (-tags
// node): they import the coordinator, and through it client-go and SQLite.

// Package metrics exports the coordinator's measurements in the Prometheus
// format (NewCoordinator, read from coordinator.Stats when scraped). Every
// metric is registered on a Registerer the caller passes in, never on the
// global default one. docs/metrics.md lists them all.
package metrics

import (
	"context"
	"sync"
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
	commit    prometheus.Histogram
	batch     prometheus.Histogram
	stats     atomic.Pointer[func() coordinator.Stats]
	campaigns atomic.Pointer[func(context.Context) ([]coordinator.KindStats, error)]

	// The campaign engines' status is read from the database: kept for
	// campaignTTL so that two Prometheus servers scraping (an HA pair) do
	// not read it twice, and each read is cut short after campaignTimeout.
	campaignTTL     time.Duration
	campaignTimeout time.Duration
	now             func() time.Time
	campMu          sync.Mutex
	campAt          time.Time
	campLast        []coordinator.KindStats
	campErrors      uint64
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

	// One series per node, its state's: a node that changes state moves
	// to another series (the old one goes stale), one that is no longer
	// known has none.
	descNodeState = prometheus.NewDesc("fleetcheck_node_state",
		"Always 1: each known node, labelled with its state (as fleetcheck_nodes counts them).",
		[]string{"node", "state"}, nil)

	descCampaigns = prometheus.NewDesc("fleetcheck_campaigns",
		"Stored campaigns by kind (sweep, rollout, burnin, drill) and state (a rollout's phase); every state present; absent when campaigns are off.",
		[]string{"kind", "state"}, nil)
	descCampaignNodes = prometheus.NewDesc("fleetcheck_campaign_nodes",
		"Nodes of each unfinished rollout, burn-in and drill by progress (pending, active, done, failed, skipped).",
		[]string{"kind", "campaign", "progress"}, nil)
	descCampaignTests = prometheus.NewDesc("fleetcheck_campaign_tests",
		"Tests of each unfinished sweep and runs of each unfinished burn-in, by progress (done, pending).",
		[]string{"kind", "campaign", "progress"}, nil)
	descCampaignRound = prometheus.NewDesc("fleetcheck_campaign_round",
		"Round of each unfinished sweep (1-3) and wave of each unfinished rollout (1 is the first).",
		[]string{"kind", "campaign"}, nil)
	descCampaignHalted = prometheus.NewDesc("fleetcheck_campaign_halted",
		"1 while an unfinished campaign stands until an operator acts (a rollout halted at a gate, or paused), else 0.",
		[]string{"kind", "campaign"}, nil)
	descCampaignErrors = prometheus.NewDesc("fleetcheck_campaign_read_errors_total",
		"Reads of the campaign engines' status for /metrics that failed (the kind's series are left out of that scrape).",
		nil, nil)

	coordinatorDescs = []*prometheus.Desc{descNodes, descConnected, descIngested, descDuplicates,
		descRefusedResults, descWorks, descWorkNodes, descWorkRatio, descGossip, descRefusalsSuppressed, descTLSFailures,
		descNodeState, promserve.BuildInfoDesc, descCampaigns, descCampaignNodes, descCampaignTests, descCampaignRound,
		descCampaignHalted, descCampaignErrors}
)

// NewCoordinator builds the coordinator's exporter and registers it on
// reg. Pass it as coordinator.Options.Metrics, then hand it the server's
// Stats with Watch.
func NewCoordinator(reg prometheus.Registerer) (*Coordinator, error) {
	c := &Coordinator{
		campaignTTL: 5 * time.Second, campaignTimeout: 10 * time.Second, now: time.Now,
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

// WatchCampaigns makes scrapes read the campaigns' progress with read
// (the server's CampaignStats method).
func (c *Coordinator) WatchCampaigns(read func(context.Context) ([]coordinator.KindStats, error)) {
	c.campaigns.Store(&read)
}

// campaignStats returns the campaigns' progress, read at most once per
// campaignTTL, and the count of failed reads.
func (c *Coordinator) campaignStats() ([]coordinator.KindStats, uint64, bool) {
	f := c.campaigns.Load()
	if f == nil {
		return nil, 0, false
	}
	c.campMu.Lock()
	defer c.campMu.Unlock()
	if now := c.now(); c.campAt.IsZero() || now.Sub(c.campAt) >= c.campaignTTL {
		ctx, cancel := context.WithTimeout(context.Background(), c.campaignTimeout)
		ks, err := (*f)(ctx)
		cancel()
		if err != nil {
			c.campErrors++
		}
		c.campAt, c.campLast = now, ks
	}
	return c.campLast, c.campErrors, true
}

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
	out := promserve.NewSeries()
	defer out.Emit(ch)
	if ks, errs, ok := c.campaignStats(); ok {
		addCampaigns(out, ks, errs)
	}
	f := c.stats.Load()
	if f == nil {
		return
	}
	st := (*f)()
	promserve.AddBuildInfo(out, st.Version)
	// Sent as they are, not through Series: node names are unique, and
	// at 10,000 nodes its bookkeeping would double the scrape's cost.
	for _, n := range st.Nodes {
		if m, err := prometheus.NewConstMetric(descNodeState, prometheus.GaugeValue, 1, n.Node, n.State); err == nil {
			ch <- m
		}
	}
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
}

func addCampaigns(out *promserve.Series, ks []coordinator.KindStats, errs uint64) {
	out.Add(descCampaignErrors, prometheus.CounterValue, float64(errs))
	for _, k := range ks {
		for state, n := range k.States {
			out.Add(descCampaigns, prometheus.GaugeValue, float64(n), k.Kind, state)
		}
		for _, r := range k.Running {
			for p, n := range r.Nodes {
				out.Add(descCampaignNodes, prometheus.GaugeValue, float64(n), k.Kind, r.ID, p)
			}
			if r.Tests > 0 {
				out.Add(descCampaignTests, prometheus.GaugeValue, float64(r.TestsDone), k.Kind, r.ID, "done")
				out.Add(descCampaignTests, prometheus.GaugeValue, float64(r.Tests-r.TestsDone), k.Kind, r.ID, "pending")
			}
			if r.Round > 0 {
				out.Add(descCampaignRound, prometheus.GaugeValue, float64(r.Round), k.Kind, r.ID)
			}
			halted := 0.0
			if r.Halted {
				halted = 1
			}
			out.Add(descCampaignHalted, prometheus.GaugeValue, halted, k.Kind, r.ID)
		}
	}
}
