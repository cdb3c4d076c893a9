package metrics

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/promserve"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/inspect"
)

// scrape fetches h's exposition as Prometheus would and parses it with
// the reference text parser.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("content type %q", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, rec.Body)
	}
	return fams
}

// value finds the sample of family name whose labels are exactly want.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	for _, m := range f.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// on adds the node label every agent series carries to labels.
func on(node string, labels map[string]string) map[string]string {
	out := map[string]string{"node": node}
	for k, v := range labels {
		out[k] = v
	}
	return out
}

func mustValue(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string, want float64) {
	t.Helper()
	got, ok := value(t, fams, name, labels)
	if !ok {
		var have []string
		if f := fams[name]; f != nil {
			for _, m := range f.Metric {
				have = append(have, m.String())
			}
		}
		t.Errorf("%s%v missing; have %v", name, labels, have)
		return
	}
	if math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

func mustType(t *testing.T, fams map[string]*dto.MetricFamily, name string, typ dto.MetricType) {
	t.Helper()
	if f, ok := fams[name]; !ok || f.GetType() != typ {
		t.Errorf("%s: type %v, want %v", name, f.GetType(), typ)
	}
}

// bundleReport runs every check on an example bundle: the real parsers
// and checks make the report the exporter reads.
func bundleReport(t *testing.T, name string) *report.Report {
	t.Helper()
	b, err := bundle.Open("../../examples/bundles/" + name)
	if err != nil {
		t.Fatal(err)
	}
	res := inspect.Run(context.Background(), b, inspect.Options{Config: config.Defaults(), Checks: registry.All()})
	return &res.Report
}

func lint(t *testing.T, g prometheus.Gatherer) {
	t.Helper()
	problems, err := testutil.GatherAndLint(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestAgentExposition(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	a, err := NewAgent(reg, AgentInfo{Node: "gpu-017", Version: "1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1_700_000_000, 0)
	a.now = func() time.Time { return at }

	// Before any pass: the agent's own series, at zero, and its info.
	fams := scrape(t, promserve.Handler(reg))
	mustValue(t, fams, "fleetcheck_agent_info", on("gpu-017", map[string]string{"version": "1.2.3", "driver_version": ""}), 1)
	mustValue(t, fams, "fleetcheck_agent_work_requests_total", on("gpu-017", map[string]string{"outcome": "refused"}), 0)
	mustValue(t, fams, "fleetcheck_agent_last_report_timestamp_seconds", on("gpu-017", nil), 0)
	if _, ok := fams["fleetcheck_check_status"]; ok {
		t.Error("check status before any pass")
	}

	a.PassDone("", bundleReport(t, "h100-xid79-ecc"), 1500*time.Millisecond)
	a.Spool(3, 4096)
	a.Spool(2, 2048)
	a.SpoolDropped("limit", 1)
	a.SpoolDropped("no_space", 2)
	a.Connected(true)
	a.Acked(false)
	a.Acked(true)
	a.Refused()
	a.Work("accepted")
	a.Work("refused")

	fams = scrape(t, promserve.Handler(reg))
	mustValue(t, fams, "fleetcheck_agent_info", on("gpu-017", map[string]string{"version": "1.2.3", "driver_version": "535.161.08"}), 1)
	// Statuses: -1 skip, 0 pass, 1 warn, 2 fail, 3 error.
	mustValue(t, fams, "fleetcheck_check_status", on("gpu-017", map[string]string{"check": "gpu.ecc"}), 2)
	mustValue(t, fams, "fleetcheck_check_status", on("gpu-017", map[string]string{"check": "gpu.thermal"}), 0)
	mustValue(t, fams, "fleetcheck_check_status", on("gpu-017", map[string]string{"check": "dcgm.diag"}), -1)
	mustValue(t, fams, "fleetcheck_check_last_run_timestamp_seconds", on("gpu-017", map[string]string{"check": "gpu.ecc"}), 1_700_000_000)
	mustValue(t, fams, "fleetcheck_check_findings", on("gpu-017", map[string]string{"check": "gpu.xid", "code": "XID_79", "finding_severity": "fail", "component": "node"}), 1)
	mustValue(t, fams, "fleetcheck_check_findings", on("gpu-017", map[string]string{"check": "gpu.xid", "code": "XID_63", "finding_severity": "warn", "component": "GPU3"}), 1)
	mustValue(t, fams, "fleetcheck_check_findings", on("gpu-017", map[string]string{"check": "gpu.ecc", "code": "ROW_REMAP_PENDING", "finding_severity": "warn", "component": "GPU3"}), 1)
	mustValue(t, fams, "fleetcheck_gpu_ecc_errors", on("gpu-017", map[string]string{"gpu": "3", "scope": "volatile", "type": "uncorrectable"}), 2)
	mustValue(t, fams, "fleetcheck_gpu_ecc_errors", on("gpu-017", map[string]string{"gpu": "0", "scope": "aggregate", "type": "correctable"}), 0)
	mustValue(t, fams, "fleetcheck_gpu_row_remap_pending", on("gpu-017", map[string]string{"gpu": "3"}), 1)
	mustValue(t, fams, "fleetcheck_gpu_remapped_rows", on("gpu-017", map[string]string{"gpu": "3", "cause": "uncorrectable"}), 2)
	mustValue(t, fams, "fleetcheck_gpu_xid_events", on("gpu-017", map[string]string{"xid": "79"}), 1)
	mustValue(t, fams, "fleetcheck_gpu_temperature_celsius", on("gpu-017", map[string]string{"gpu": "0"}), 29)
	mustValue(t, fams, "fleetcheck_ib_port_rate_bytes_per_second", on("gpu-017", map[string]string{"hca": "mlx5_0", "port": "1"}), 50e9)
	mustValue(t, fams, "fleetcheck_ib_port_up", on("gpu-017", map[string]string{"hca": "mlx5_0", "port": "1", "link_layer": "InfiniBand"}), 1)
	mustValue(t, fams, "fleetcheck_ib_port_errors_total", on("gpu-017", map[string]string{"hca": "mlx5_0", "port": "1", "counter": "symbol_error"}), 0)
	mustValue(t, fams, "fleetcheck_nccl_busbw_bytes_per_second", on("gpu-017", nil), 479.02e9)
	mustValue(t, fams, "fleetcheck_nccl_wrong_results", on("gpu-017", nil), 0)
	mustValue(t, fams, "fleetcheck_check_duration_seconds", on("gpu-017", map[string]string{"check": "gpu.ecc"}), 1)
	mustValue(t, fams, "fleetcheck_agent_pass_duration_seconds", on("gpu-017", map[string]string{"kind": "scheduled"}), 1)
	mustValue(t, fams, "fleetcheck_agent_passes_total", on("gpu-017", map[string]string{"kind": "scheduled", "status": "fail"}), 1)
	mustValue(t, fams, "fleetcheck_agent_spool_results", on("gpu-017", nil), 2)
	mustValue(t, fams, "fleetcheck_agent_spool_bytes", on("gpu-017", nil), 2048)
	mustValue(t, fams, "fleetcheck_agent_spool_dropped_total", on("gpu-017", map[string]string{"reason": "limit"}), 1)
	mustValue(t, fams, "fleetcheck_agent_spool_dropped_total", on("gpu-017", map[string]string{"reason": "no_space"}), 2)
	mustValue(t, fams, "fleetcheck_agent_spool_dropped_total", on("gpu-017", map[string]string{"reason": "write_error"}), 0)
	mustValue(t, fams, "fleetcheck_agent_connected", on("gpu-017", nil), 1)
	mustValue(t, fams, "fleetcheck_agent_results_acked_total", on("gpu-017", map[string]string{"duplicate": "false"}), 1)
	mustValue(t, fams, "fleetcheck_agent_results_acked_total", on("gpu-017", map[string]string{"duplicate": "true"}), 1)
	mustValue(t, fams, "fleetcheck_agent_results_refused_total", on("gpu-017", nil), 1)
	mustValue(t, fams, "fleetcheck_agent_work_requests_total", on("gpu-017", map[string]string{"outcome": "refused"}), 1)
	mustValue(t, fams, "fleetcheck_agent_last_report_timestamp_seconds", on("gpu-017", nil), 1_700_000_000)
	mustValue(t, fams, "fleetcheck_agent_last_ack_timestamp_seconds", on("gpu-017", nil), 1_700_000_000)
	// Counters read from the node are counters; judged counts are gauges.
	mustType(t, fams, "fleetcheck_ib_port_errors_total", dto.MetricType_COUNTER)
	mustType(t, fams, "fleetcheck_ib_port_data_bytes_total", dto.MetricType_COUNTER)
	mustType(t, fams, "fleetcheck_gpu_nvlink_errors_total", dto.MetricType_COUNTER)
	mustType(t, fams, "fleetcheck_gpu_ecc_errors", dto.MetricType_GAUGE)
	mustType(t, fams, "fleetcheck_check_duration_seconds", dto.MetricType_HISTOGRAM)
	for name := range fams {
		if !strings.HasPrefix(name, "fleetcheck_") {
			t.Errorf("%s: every name starts with fleetcheck_", name)
		}
	}
	// Every series names its node, whatever the scrape's instance says.
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			if got := labelOf(m, "node"); got != "gpu-017" {
				t.Errorf("%s %v: node %q, want gpu-017", name, m.GetLabel(), got)
			}
		}
	}
	if f := fams["fleetcheck_build_info"]; f == nil || len(f.GetMetric()) != 1 ||
		labelOf(f.GetMetric()[0], "version") != "1.2.3" || !strings.HasPrefix(labelOf(f.GetMetric()[0], "goversion"), "go") ||
		labelOf(f.GetMetric()[0], "revision") == "" {
		t.Errorf("fleetcheck_build_info: %v", f.GetMetric())
	}
	// The check's own bookkeeping is not a port counter.
	for _, m := range fams["fleetcheck_ib_port_errors_total"].GetMetric() {
		for _, l := range m.Label {
			if l.GetName() == "counter" && (strings.HasSuffix(l.GetValue(), "_rise") || l.GetValue() == "saturated") {
				t.Errorf("derived value exported as a port counter: %v", m)
			}
		}
	}
	lint(t, reg)

	// A requested run of one check replaces only that check's view; a
	// port that went down shows.
	down := &report.Report{Status: report.Fail,
		Inventory: report.Inventory{DriverVersion: "535.129.03", HCAs: []report.HCA{{Name: "mlx5_0",
			Ports: []report.Port{{Port: 1, State: "DOWN", PhysState: "Polling", LinkLayer: "InfiniBand"}}}}},
		Checks: []report.CheckResult{{Name: "nccl.allreduce", Status: report.Fail, DurationMS: 60000,
			Findings: []report.Finding{{Severity: report.SevFail, Component: "node", Code: "NCCL_BELOW_BASELINE"}},
			Metrics: map[string]float64{"nccl.allreduce.busbw_gbps": 280, "nccl.allreduce.baseline_gbps": 400,
				"nccl.allreduce.deviation_ratio": 0.3, "ib.mlx5_0.port1.port_rcv_errors_count": 17,
				"ib.mlx5_0.port1.port_rcv_errors_rise_count": 5, "gpu1.nvlink.crc_count": 3}}},
	}
	at = at.Add(time.Minute)
	a.PassDone("w-1", down, time.Minute)
	fams = scrape(t, promserve.Handler(reg))
	mustValue(t, fams, "fleetcheck_nccl_busbw_bytes_per_second", on("gpu-017", nil), 280e9)
	mustValue(t, fams, "fleetcheck_nccl_busbw_baseline_bytes_per_second", on("gpu-017", nil), 400e9)
	mustValue(t, fams, "fleetcheck_nccl_busbw_deviation_ratio", on("gpu-017", nil), 0.3)
	mustValue(t, fams, "fleetcheck_check_status", on("gpu-017", map[string]string{"check": "nccl.allreduce"}), 2)
	mustValue(t, fams, "fleetcheck_check_status", on("gpu-017", map[string]string{"check": "gpu.ecc"}), 2)
	mustValue(t, fams, "fleetcheck_check_last_run_timestamp_seconds", on("gpu-017", map[string]string{"check": "nccl.allreduce"}), 1_700_000_060)
	mustValue(t, fams, "fleetcheck_check_last_run_timestamp_seconds", on("gpu-017", map[string]string{"check": "gpu.ecc"}), 1_700_000_000)
	mustValue(t, fams, "fleetcheck_ib_port_up", on("gpu-017", map[string]string{"hca": "mlx5_0", "port": "1", "link_layer": "InfiniBand"}), 0)
	// Two checks report the same port counter: one series, the first check's.
	mustValue(t, fams, "fleetcheck_ib_port_errors_total", on("gpu-017", map[string]string{"hca": "mlx5_0", "port": "1", "counter": "port_rcv_errors"}), 14)
	mustValue(t, fams, "fleetcheck_gpu_nvlink_errors_total", on("gpu-017", map[string]string{"gpu": "1", "counter": "crc"}), 0)
	mustValue(t, fams, "fleetcheck_agent_passes_total", on("gpu-017", map[string]string{"kind": "requested", "status": "fail"}), 1)
	lint(t, reg)
}

func TestAgentRegistersOnce(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := NewAgent(reg, AgentInfo{Node: "a"}); err != nil {
		t.Fatal(err)
	}
	// A second exporter for the node on the same registry is a wiring
	// mistake, said as an error. (One for another node is not: its series
	// carry its own node label.)
	if _, err := NewAgent(reg, AgentInfo{Node: "a"}); err == nil {
		t.Fatal("second agent exporter registered on one registry")
	}
}

func TestListen(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := NewAgent(reg, AgentInfo{Node: "gpu-001"}); err != nil {
		t.Fatal(err)
	}
	s, err := promserve.Listen("127.0.0.1:0", reg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + s.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fams["fleetcheck_agent_info"]; !ok {
		names := make([]string, 0, len(fams))
		for n := range fams {
			names = append(names, n)
		}
		sort.Strings(names)
		t.Fatalf("no agent info over HTTP: %v", names)
	}
	// The same port cannot be served twice: the error comes at once.
	if _, err := promserve.Listen(s.Addr().String(), reg, zerolog.Nop()); err == nil {
		t.Error("second listener on a taken port")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestAgentGossipMembers(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	a, err := NewAgent(reg, AgentInfo{Node: "gpu-001"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := scrape(t, promserve.Handler(reg))["fleetcheck_agent_gossip_members"]; ok {
		t.Error("gossip members exported before the pool reported (gossip off)")
	}
	a.GossipMembers(5, 1, 2)
	fams := scrape(t, promserve.Handler(reg))
	mustValue(t, fams, "fleetcheck_agent_gossip_members", on("gpu-001", map[string]string{"state": "alive"}), 5)
	mustValue(t, fams, "fleetcheck_agent_gossip_members", on("gpu-001", map[string]string{"state": "dead"}), 1)
	mustValue(t, fams, "fleetcheck_agent_gossip_members", on("gpu-001", map[string]string{"state": "left"}), 2)
}

// TestAgentNothingMeasuredExportsZeroGPUs: a node with nothing to read (no
// nvidia-smi, no PCI tree, no IB) exports fleetcheck_gpus 0, not nothing,
// so "GPUs < 8" alerts fire on it.
func TestAgentNothingMeasuredExportsZeroGPUs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	manifest := `{"format": 1, "hostname": "empty", "collected_at": "2026-11-28T12:00:00Z"}`
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := bundle.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	res := inspect.Run(context.Background(), b, inspect.Options{Config: config.Defaults(), Checks: registry.All()})
	reg := prometheus.NewRegistry()
	a, err := NewAgent(reg, AgentInfo{Node: "empty", Version: "1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	a.PassDone("", &res.Report, time.Second)
	fams := scrape(t, promserve.Handler(reg))
	mustValue(t, fams, "fleetcheck_gpus", on("empty", nil), 0)
	mustValue(t, fams, "fleetcheck_check_status", on("empty", map[string]string{"check": "gpu.inventory"}), -1)
}
