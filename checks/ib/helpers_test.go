package ib

import (
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// ok builds a snapshot whose named sources read fine.
func ok(hcas []snapshot.HCA, srcs ...snapshot.Source) *snapshot.Snapshot {
	s := &snapshot.Snapshot{HCAs: hcas}
	for _, src := range srcs {
		s.SetSource(src, snapshot.SourceState{State: snapshot.StateOK})
	}
	return s
}

func ibPort(n int, rate float64) snapshot.IBPort {
	return snapshot.IBPort{Port: n, State: "ACTIVE", PhysState: "LinkUp", RateGbps: rate, RateText: rateText(rate), LinkLayer: "InfiniBand"}
}

func ethPort(n int, rate float64) snapshot.IBPort {
	p := ibPort(n, rate)
	p.LinkLayer = "Ethernet"
	return p
}

func rateText(r float64) string {
	switch r {
	case 400:
		return "400 Gb/sec (4X NDR)"
	case 200:
		return "200 Gb/sec (2X NDR)"
	case 100:
		return "100 Gb/sec (4X EDR)"
	}
	return ""
}

// h100HCAs is the fixture node's shape: eight 400G ConnectX-7 InfiniBand
// ports and a 200G BlueField-3 Ethernet bond.
func h100HCAs() []snapshot.HCA {
	var hs []snapshot.HCA
	for _, n := range []string{"mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"} {
		hs = append(hs, snapshot.HCA{Name: n, Model: "MT4129", FWVersion: "28.41.1000", Ports: []snapshot.IBPort{ibPort(1, 400)}})
	}
	hs = append(hs, snapshot.HCA{Name: "mlx5_bond_0", Model: "MT41692", Ports: []snapshot.IBPort{ethPort(1, 200)}})
	return hs
}

// want describes a check result loosely: status, and for each expected
// finding its component, code, severity, action and a message fragment.
type want struct {
	status   report.Status
	reason   string // substring
	findings []wantFinding
	metrics  map[string]float64
	absent   []string // metric names that must not appear
}

type wantFinding struct {
	comp, code string
	sev        report.Severity
	action     report.Action
	msg        string
}

func check(t *testing.T, c checks.Check, in checks.Input, w want) {
	t.Helper()
	res := checks.Run([]checks.Check{c}, in)[0]
	if res.Status != w.status {
		t.Errorf("status = %s (%s), want %s; findings %+v", res.Status, res.Reason, w.status, res.Findings)
	}
	if w.reason != "" && !strings.Contains(res.Reason, w.reason) {
		t.Errorf("reason = %q, want it to contain %q", res.Reason, w.reason)
	}
	if len(res.Findings) != len(w.findings) {
		t.Errorf("got %d findings, want %d: %+v", len(res.Findings), len(w.findings), res.Findings)
	}
	for _, wf := range w.findings {
		found := false
		for _, f := range res.Findings {
			if f.Component == wf.comp && f.Code == wf.code && f.Severity == wf.sev && f.Action == wf.action && strings.Contains(f.Message, wf.msg) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("no finding %+v among %+v", wf, res.Findings)
		}
	}
	for k, v := range w.metrics {
		if got, ok := res.Metrics[k]; !ok || got != v {
			t.Errorf("metric %s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	for _, k := range w.absent {
		if v, ok := res.Metrics[k]; ok {
			t.Errorf("metric %s = %v should be absent", k, v)
		}
	}
	for k := range res.Metrics {
		if k != strings.ToLower(k) || strings.Contains(k, "/") {
			t.Errorf("metric name %q is not dotted lowercase", k)
		}
	}
}
