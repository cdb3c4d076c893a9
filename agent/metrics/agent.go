// Package metrics exports the agent's measurements in the Prometheus
// format (NewAgent, fed through the agent.Metrics seam). Every metric is
// registered on a Registerer the caller passes in, never on the global
// default one. docs/metrics.md lists them all.
package metrics

import (
	"regexp"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/agent/spool"
	"github.com/fleetcheck/fleetcheck/internal/promserve"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// Check status values of fleetcheck_check_status: the worse, the higher,
// so max() over checks or nodes is the worst; skip is below pass because
// it says nothing.
var statusValue = map[report.Status]float64{
	report.Skip:  -1,
	report.Pass:  0,
	report.Warn:  1,
	report.Fail:  2,
	report.Error: 3,
}

// Buckets for check and pass durations: a sysfs read takes a millisecond,
// an nccl-tests run or a DCGM diag minutes.
var durationBuckets = []float64{0.001, 0.005, 0.025, 0.1, 0.5, 1, 2.5, 10, 30, 60, 180, 600, 1800}

// AgentInfo describes the agent for fleetcheck_agent_info.
type AgentInfo struct {
	Node    string
	Version string
}

// Agent is the agent's exporter. It implements agent.Metrics (counters,
// gauges and histograms updated as the agent works) and is itself a
// prometheus.Collector for what the latest report of each check says.
type Agent struct {
	info AgentInfo
	now  func() time.Time

	passes       *prometheus.CounterVec
	passDuration *prometheus.HistogramVec
	checkDur     *prometheus.HistogramVec
	spoolResults prometheus.Gauge
	spoolBytes   prometheus.Gauge
	spoolDropped *prometheus.CounterVec
	connected    prometheus.Gauge
	acked        *prometheus.CounterVec
	refused      prometheus.Counter
	work         *prometheus.CounterVec
	lastReport   prometheus.Gauge
	lastAck      prometheus.Gauge
	gossip       *prometheus.GaugeVec

	mu        sync.Mutex
	latest    map[string]checkSnap // by check name
	inventory *report.Inventory
}

var (
	_ agent.Metrics       = (*Agent)(nil)
	_ agent.GossipMetrics = (*Agent)(nil)
)

// checkSnap is the newest result of one check.
type checkSnap struct {
	status   report.Status
	at       time.Time
	metrics  map[string]float64
	findings []report.Finding
}

// NewAgent builds the agent's exporter and registers it on reg. Every
// series it exports carries node (info.Node), so series stay apart however
// they are scraped, relabelled or federated; collectors the caller
// registers on reg itself (go_*, process_*) do not.
func NewAgent(reg prometheus.Registerer, info AgentInfo) (*Agent, error) {
	reg = prometheus.WrapRegistererWith(prometheus.Labels{"node": info.Node}, reg)
	a := &Agent{
		info:   info,
		now:    time.Now,
		latest: make(map[string]checkSnap),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetcheck_agent_passes_total",
			Help: "Inspection passes finished, by kind (scheduled or requested) and the report's status.",
		}, []string{"kind", "status"}),
		passDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fleetcheck_agent_pass_duration_seconds",
			Help:    "Time one inspection pass took: probes read the host, then the checks ran.",
			Buckets: durationBuckets,
		}, []string{"kind"}),
		checkDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fleetcheck_check_duration_seconds",
			Help:    "Time one check took within a pass.",
			Buckets: durationBuckets,
		}, []string{"check"}),
		spoolResults: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetcheck_agent_spool_results",
			Help: "Results kept on disk until the coordinator acknowledges them.",
		}),
		spoolBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetcheck_agent_spool_bytes",
			Help: "Bytes of results kept on disk until the coordinator acknowledges them.",
		}),
		spoolDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetcheck_agent_spool_dropped_total",
			Help: "Results lost before the coordinator acknowledged them, by reason: limit (oldest dropped to stay within the spool's limits), too_large, no_space (filesystem full or quota), write_error, corrupt.",
		}, []string{"reason"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetcheck_agent_connected",
			Help: "1 while the stream to the coordinator is up, else 0.",
		}),
		acked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetcheck_agent_results_acked_total",
			Help: "Results the coordinator acknowledged as stored; duplicate=true when it already held them.",
		}, []string{"duplicate"}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleetcheck_agent_results_refused_total",
			Help: "Results the coordinator refused for good (malformed, another node's, work never sent); dropped.",
		}),
		work: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetcheck_agent_work_requests_total",
			Help: "Check requests from the coordinator by outcome: accepted, refused (not enabled, disruptive while busy, too many), done.",
		}, []string{"outcome"}),
		lastReport: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetcheck_agent_last_report_timestamp_seconds",
			Help: "Unix time the last inspection pass finished (0 before the first).",
		}),
		lastAck: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleetcheck_agent_last_ack_timestamp_seconds",
			Help: "Unix time the coordinator last acknowledged a result (0 before the first).",
		}),
		// No series until the gossip pool reports: absent when gossip is off.
		gossip: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fleetcheck_agent_gossip_members",
			Help: "Members of the gossip pool as this agent sees them, itself included, by state (alive, dead, left).",
		}, []string{"state"}),
	}
	// Label values known up front appear at 0, so rate() and absent()
	// work before the first event.
	for _, o := range []string{"accepted", "refused", "done"} {
		a.work.WithLabelValues(o)
	}
	for _, d := range []string{"false", "true"} {
		a.acked.WithLabelValues(d)
	}
	for _, r := range spool.DropReasons {
		a.spoolDropped.WithLabelValues(string(r))
	}
	for _, c := range []prometheus.Collector{
		a.passes, a.passDuration, a.checkDur, a.spoolResults, a.spoolBytes, a.spoolDropped,
		a.connected, a.acked, a.refused, a.work, a.lastReport, a.lastAck, a.gossip, a,
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// PassDone records a finished pass and keeps each check's newest result
// for the report metrics.
func (a *Agent) PassDone(workID string, r *report.Report, took time.Duration) {
	kind := "scheduled"
	if workID != "" {
		kind = "requested"
	}
	now := a.now()
	a.passes.WithLabelValues(kind, string(r.Status)).Inc()
	a.passDuration.WithLabelValues(kind).Observe(took.Seconds())
	a.lastReport.Set(float64(now.UnixNano()) / 1e9)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range r.Checks {
		if c.Status != report.Skip {
			a.checkDur.WithLabelValues(c.Name).Observe(c.DurationMS / 1000)
		}
		a.latest[c.Name] = checkSnap{status: c.Status, at: now, metrics: c.Metrics, findings: c.Findings}
	}
	if len(r.Inventory.GPUs) > 0 || len(r.Inventory.HCAs) > 0 || r.Inventory.DriverVersion != "" {
		inv := r.Inventory
		a.inventory = &inv
	}
}

// Spool records the spool's depth.
func (a *Agent) Spool(results int, bytes int64) {
	a.spoolResults.Set(float64(results))
	a.spoolBytes.Set(float64(bytes))
}

// SpoolDropped counts results lost unacknowledged.
func (a *Agent) SpoolDropped(reason string, n int) {
	if n > 0 {
		a.spoolDropped.WithLabelValues(reason).Add(float64(n))
	}
}

// Connected records the stream's state.
func (a *Agent) Connected(up bool) {
	if up {
		a.connected.Set(1)
	} else {
		a.connected.Set(0)
	}
}

// Acked counts an acknowledged result.
func (a *Agent) Acked(duplicate bool) {
	a.acked.WithLabelValues(strconv.FormatBool(duplicate)).Inc()
	a.lastAck.Set(float64(a.now().UnixNano()) / 1e9)
}

// GossipMembers records the agent's view of the gossip pool.
func (a *Agent) GossipMembers(alive, dead, left int) {
	a.gossip.WithLabelValues("alive").Set(float64(alive))
	a.gossip.WithLabelValues("dead").Set(float64(dead))
	a.gossip.WithLabelValues("left").Set(float64(left))
}

// Refused counts a refused result.
func (a *Agent) Refused() { a.refused.Inc() }

// Work counts a request by outcome.
func (a *Agent) Work(outcome string) { a.work.WithLabelValues(outcome).Inc() }

// Descriptions of the report metrics. Values read from the node's own
// cumulative counters (IB port counters, NVLink and PCIe replay counters)
// are counters named _total: they only rise until the hardware or driver
// resets them, which rate() and increase() handle. Counts that are judged
// as they stand (ECC errors, retired pages, Xids in the lookback window)
// are gauges.
var (
	// node comes from the label every series carries (NewAgent).
	descInfo = prometheus.NewDesc("fleetcheck_agent_info",
		"Always 1: the node this agent speaks for, its version and the GPU driver it saw last.",
		[]string{"version", "driver_version"}, nil)
	descCheckStatus = prometheus.NewDesc("fleetcheck_check_status",
		"Newest status of each check: -1 skip, 0 pass, 1 warn, 2 fail, 3 error.",
		[]string{"check"}, nil)
	descCheckLastRun = prometheus.NewDesc("fleetcheck_check_last_run_timestamp_seconds",
		"Unix time of the pass that gave each check's newest status.",
		[]string{"check"}, nil)
	// The finding's severity is finding_severity: alerting rules set
	// their own severity label, which would overwrite it.
	descFindings = prometheus.NewDesc("fleetcheck_check_findings",
		"Findings of each check's newest result, by code, finding severity (warn, fail) and component (GPU3, mlx5_4/1, node).",
		[]string{"check", "code", "finding_severity", "component"}, nil)
	descGPUs = prometheus.NewDesc("fleetcheck_gpus",
		"GPUs the driver shows (gpu.inventory).", nil, nil)
	descECC = prometheus.NewDesc("fleetcheck_gpu_ecc_errors",
		"ECC error counts per GPU as the driver reports them: scope volatile (since the driver loaded) or aggregate (lifetime), type correctable or uncorrectable.",
		[]string{"gpu", "scope", "type"}, nil)
	descRemapped = prometheus.NewDesc("fleetcheck_gpu_remapped_rows",
		"Rows remapped per GPU, by the kind of error that caused it.",
		[]string{"gpu", "cause"}, nil)
	descRemapPending = prometheus.NewDesc("fleetcheck_gpu_row_remap_pending",
		"1 when a row remap waits for a GPU reset.", []string{"gpu"}, nil)
	descRemapFailure = prometheus.NewDesc("fleetcheck_gpu_row_remap_failure",
		"1 when a row remap failed: the GPU needs replacing.", []string{"gpu"}, nil)
	descRetired = prometheus.NewDesc("fleetcheck_gpu_retired_pages",
		"Retired memory pages per GPU, by cause (single_bit, double_bit).", []string{"gpu", "cause"}, nil)
	descTemp = prometheus.NewDesc("fleetcheck_gpu_temperature_celsius",
		"GPU core temperature.", []string{"gpu"}, nil)
	descMemTemp = prometheus.NewDesc("fleetcheck_gpu_memory_temperature_celsius",
		"GPU memory (HBM) temperature.", []string{"gpu"}, nil)
	descPower = prometheus.NewDesc("fleetcheck_gpu_power_watts",
		"GPU power draw.", []string{"gpu"}, nil)
	descPCIeWidth = prometheus.NewDesc("fleetcheck_gpu_pcie_link_width",
		"Current PCIe link width (lanes) per GPU.", []string{"gpu"}, nil)
	descPCIeGen = prometheus.NewDesc("fleetcheck_gpu_pcie_link_generation",
		"Current PCIe link generation per GPU.", []string{"gpu"}, nil)
	descPCIeReplays = prometheus.NewDesc("fleetcheck_gpu_pcie_replays_total",
		"PCIe replay counter per GPU, as the driver counts it.", []string{"gpu"}, nil)
	descNVLinks = prometheus.NewDesc("fleetcheck_gpu_nvlink_links",
		"NVLink links per GPU by state (active, inactive).", []string{"gpu", "state"}, nil)
	descNVLinkErrors = prometheus.NewDesc("fleetcheck_gpu_nvlink_errors_total",
		"NVLink error counters per GPU summed over its links (crc, replay, recovery).", []string{"gpu", "counter"}, nil)
	descXid = prometheus.NewDesc("fleetcheck_gpu_xid_events",
		"Xid events in the kernel log within the lookback window, by Xid code.", []string{"xid"}, nil)
	descIBPortUp = prometheus.NewDesc("fleetcheck_ib_port_up",
		"1 when the HCA port is ACTIVE and LinkUp, else 0.", []string{"hca", "port", "link_layer"}, nil)
	descIBPorts = prometheus.NewDesc("fleetcheck_ib_ports",
		"InfiniBand HCA ports found (ib.ports).", nil, nil)
	descIBPortsActive = prometheus.NewDesc("fleetcheck_ib_ports_active",
		"InfiniBand HCA ports ACTIVE and LinkUp (ib.ports).", nil, nil)
	descIBRate = prometheus.NewDesc("fleetcheck_ib_port_rate_bytes_per_second",
		"Link rate of the HCA port in bytes per second (Prometheus' base unit: a 400 Gb/s NDR port is 5e10).", []string{"hca", "port"}, nil)
	descIBErrors = prometheus.NewDesc("fleetcheck_ib_port_errors_total",
		"HCA port error counters from sysfs (symbol_error, link_downed, port_rcv_errors, port_xmit_discards, port_xmit_wait, ...).",
		[]string{"hca", "port", "counter"}, nil)
	descIBData = prometheus.NewDesc("fleetcheck_ib_port_data_bytes_total",
		"Bytes through the HCA port, by direction (receive, transmit).", []string{"hca", "port", "direction"}, nil)
	descBusBW = prometheus.NewDesc("fleetcheck_nccl_busbw_bytes_per_second",
		"all_reduce_perf bus bandwidth at the largest message size of the newest run.", nil, nil)
	descBusBWBaseline = prometheus.NewDesc("fleetcheck_nccl_busbw_baseline_bytes_per_second",
		"The stored baseline the newest all_reduce_perf run was judged against.", nil, nil)
	descBusBWDeviation = prometheus.NewDesc("fleetcheck_nccl_busbw_deviation_ratio",
		"Shortfall of the newest busbw below its baseline as a fraction of it (0.3 = 30 % slower; negative = faster).", nil, nil)
	descNCCLWrong = prometheus.NewDesc("fleetcheck_nccl_wrong_results",
		"#wrong results of the newest all_reduce_perf run, summed over sizes.", nil, nil)

	reportDescs = []*prometheus.Desc{
		descInfo, promserve.BuildInfoDesc, descCheckStatus, descCheckLastRun, descFindings, descGPUs, descECC, descRemapped,
		descRemapPending, descRemapFailure, descRetired, descTemp, descMemTemp, descPower, descPCIeWidth,
		descPCIeGen, descPCIeReplays, descNVLinks, descNVLinkErrors, descXid, descIBPortUp, descIBPorts,
		descIBPortsActive, descIBRate, descIBErrors, descIBData, descBusBW, descBusBWBaseline,
		descBusBWDeviation, descNCCLWrong,
	}
)

// Describe sends the report metrics' descriptions.
func (a *Agent) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range reportDescs {
		ch <- d
	}
}

// Collect sends the report metrics from each check's newest result.
func (a *Agent) Collect(ch chan<- prometheus.Metric) {
	a.mu.Lock()
	names := make([]string, 0, len(a.latest))
	for n := range a.latest {
		names = append(names, n)
	}
	sort.Strings(names)
	snaps := make([]checkSnap, len(names))
	for i, n := range names {
		snaps[i] = a.latest[n]
	}
	inv := a.inventory
	a.mu.Unlock()

	out := promserve.NewSeries()
	driver := ""
	if inv != nil {
		driver = inv.DriverVersion
	}
	out.Add(descInfo, prometheus.GaugeValue, 1, a.info.Version, driver)
	promserve.AddBuildInfo(out, a.info.Version)
	for i, name := range names {
		s := snaps[i]
		out.Add(descCheckStatus, prometheus.GaugeValue, statusValue[s.status], name)
		out.Add(descCheckLastRun, prometheus.GaugeValue, float64(s.at.UnixNano())/1e9, name)
		for _, f := range s.findings {
			out.Inc(descFindings, name, f.Code, string(f.Severity), f.Component)
		}
		for k, v := range s.metrics {
			reportMetric(out, k, v)
		}
	}
	if inv != nil {
		for _, h := range inv.HCAs {
			for _, p := range h.Ports {
				up := 0.0
				if p.State == "ACTIVE" && p.PhysState == "LinkUp" {
					up = 1
				}
				out.Add(descIBPortUp, prometheus.GaugeValue, up, h.Name, strconv.Itoa(p.Port), p.LinkLayer)
			}
		}
	}
	out.Emit(ch)
}

var (
	reGPU    = regexp.MustCompile(`^gpu(\d+)\.(.+)$`)
	reECC    = regexp.MustCompile(`^ecc\.(volatile|aggregate)_(correctable|uncorrectable)_count$`)
	reXid    = regexp.MustCompile(`^xid\.(\d+)\.count$`)
	reIBPort = regexp.MustCompile(`^ib\.([^.]+)\.port(\d+)\.(.+)$`)
	// Port counters of ib.counters that are hardware error counters;
	// the check's own derived values (_rise_count, saturated_count,
	// counter_reset_count, ratios) are not exported.
	reIBCounter = regexp.MustCompile(`^([a-z0-9_]+)_count$`)
)

// ibDerived are ib.counters metrics ending in _count that are the check's
// own bookkeeping, not a sysfs counter.
func ibDerived(name string) bool {
	switch name {
	case "saturated", "counter_reset":
		return true
	}
	return len(name) > 5 && name[len(name)-5:] == "_rise"
}

// reportMetric maps one dotted report metric onto its Prometheus series;
// names it does not know are left out (the report and the coordinator
// keep them).
func reportMetric(out *promserve.Series, key string, v float64) {
	switch key {
	case "gpu.count":
		out.Add(descGPUs, prometheus.GaugeValue, v)
		return
	case "ib.ports.total_count":
		out.Add(descIBPorts, prometheus.GaugeValue, v)
		return
	case "ib.ports.active_count":
		out.Add(descIBPortsActive, prometheus.GaugeValue, v)
		return
	case "nccl.allreduce.busbw_gbps":
		out.Add(descBusBW, prometheus.GaugeValue, v*1e9) // nccl-tests' GB/s are 10^9 bytes
		return
	case "nccl.allreduce.baseline_gbps":
		out.Add(descBusBWBaseline, prometheus.GaugeValue, v*1e9)
		return
	case "nccl.allreduce.deviation_ratio":
		out.Add(descBusBWDeviation, prometheus.GaugeValue, v)
		return
	case "nccl.allreduce.wrong_count":
		out.Add(descNCCLWrong, prometheus.GaugeValue, v)
		return
	}
	if m := reXid.FindStringSubmatch(key); m != nil {
		out.Add(descXid, prometheus.GaugeValue, v, m[1])
		return
	}
	if m := reGPU.FindStringSubmatch(key); m != nil {
		gpuMetric(out, m[1], m[2], v)
		return
	}
	if m := reIBPort.FindStringSubmatch(key); m != nil {
		hca, port, rest := m[1], m[2], m[3]
		switch rest {
		case "rate_gbps":
			out.Add(descIBRate, prometheus.GaugeValue, v*1e9/8, hca, port) // Gb/s to bytes/s
		case "rcv_bytes":
			out.Add(descIBData, prometheus.CounterValue, v, hca, port, "receive")
		case "xmit_bytes":
			out.Add(descIBData, prometheus.CounterValue, v, hca, port, "transmit")
		default:
			if c := reIBCounter.FindStringSubmatch(rest); c != nil && !ibDerived(c[1]) {
				out.Add(descIBErrors, prometheus.CounterValue, v, hca, port, c[1])
			}
		}
	}
}

func gpuMetric(out *promserve.Series, gpu, rest string, v float64) {
	if m := reECC.FindStringSubmatch(rest); m != nil {
		out.Add(descECC, prometheus.GaugeValue, v, gpu, m[1], m[2])
		return
	}
	switch rest {
	case "remapped_rows.correctable_count":
		out.Add(descRemapped, prometheus.GaugeValue, v, gpu, "correctable")
	case "remapped_rows.uncorrectable_count":
		out.Add(descRemapped, prometheus.GaugeValue, v, gpu, "uncorrectable")
	case "remapped_rows.pending_flag":
		out.Add(descRemapPending, prometheus.GaugeValue, v, gpu)
	case "remapped_rows.failure_flag":
		out.Add(descRemapFailure, prometheus.GaugeValue, v, gpu)
	case "retired_pages.single_bit_count":
		out.Add(descRetired, prometheus.GaugeValue, v, gpu, "single_bit")
	case "retired_pages.double_bit_count":
		out.Add(descRetired, prometheus.GaugeValue, v, gpu, "double_bit")
	case "temperature_c":
		out.Add(descTemp, prometheus.GaugeValue, v, gpu)
	case "memory_temperature_c":
		out.Add(descMemTemp, prometheus.GaugeValue, v, gpu)
	case "power_w":
		out.Add(descPower, prometheus.GaugeValue, v, gpu)
	case "pcie.width_lanes":
		out.Add(descPCIeWidth, prometheus.GaugeValue, v, gpu)
	case "pcie.link_gen":
		out.Add(descPCIeGen, prometheus.GaugeValue, v, gpu)
	case "pcie.replay_count":
		out.Add(descPCIeReplays, prometheus.CounterValue, v, gpu)
	case "nvlink.active_link_count":
		out.Add(descNVLinks, prometheus.GaugeValue, v, gpu, "active")
	case "nvlink.inactive_link_count":
		out.Add(descNVLinks, prometheus.GaugeValue, v, gpu, "inactive")
	case "nvlink.crc_count":
		out.Add(descNVLinkErrors, prometheus.CounterValue, v, gpu, "crc")
	case "nvlink.replay_count":
		out.Add(descNVLinkErrors, prometheus.CounterValue, v, gpu, "replay")
	case "nvlink.recovery_count":
		out.Add(descNVLinkErrors, prometheus.CounterValue, v, gpu, "recovery")
	}
}
