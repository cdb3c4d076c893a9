package escalate

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

var t0 = time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)

func xidEv(node, gpu string, code int, at time.Duration) Event {
	return Event{At: t0.Add(at), Node: node, Component: gpu, Kind: KindXid, Xid: code}
}

// feed observes events in order, then flushes at end, and returns every verdict.
func feed(r *Rules, end time.Duration, evs ...Event) []Verdict {
	var out []Verdict
	for _, e := range evs {
		out = append(out, r.Observe(e)...)
	}
	return append(out, r.Flush(t0.Add(end))...)
}

func kinds(vs []Verdict) string {
	var b []string
	for _, v := range vs {
		s := string(v.Kind)
		if v.Node != "" {
			s += ":" + v.Node + "/" + v.Component
		}
		if v.Action != "" {
			s += ":" + v.Action
		}
		if v.Kind == JobEvent {
			s += fmt.Sprintf(":%d", len(v.Nodes))
		}
		b = append(b, s)
	}
	return strings.Join(b, " ")
}

func TestXidRepeats(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		evs  []Event
		want string
	}{
		{"three in an hour on one GPU escalate",
			[]Event{xidEv("n1", "GPU3", 13, 0), xidEv("n1", "GPU3", 13, 20*time.Minute), xidEv("n1", "GPU3", 13, 50*time.Minute)},
			"escalate:n1/GPU3:reset_gpu"},
		{"two do not", []Event{xidEv("n1", "GPU3", 13, 0), xidEv("n1", "GPU3", 13, 20*time.Minute)}, ""},
		{"three spread over more than the window do not",
			[]Event{xidEv("n1", "GPU3", 13, 0), xidEv("n1", "GPU3", 13, 40*time.Minute), xidEv("n1", "GPU3", 13, 70*time.Minute)}, ""},
		{"three on three GPUs do not",
			[]Event{xidEv("n1", "GPU1", 13, 0), xidEv("n1", "GPU2", 13, time.Minute), xidEv("n1", "GPU3", 13, 2*time.Minute)}, ""},
		{"a code without a rule never escalates",
			[]Event{xidEv("n1", "GPU3", 45, 0), xidEv("n1", "GPU3", 45, time.Minute), xidEv("n1", "GPU3", 45, 2*time.Minute)}, ""},
		{"six escalate twice, not four times",
			[]Event{xidEv("n1", "GPU0", 13, 0), xidEv("n1", "GPU0", 13, 5*time.Minute), xidEv("n1", "GPU0", 13, 10*time.Minute),
				xidEv("n1", "GPU0", 13, 15*time.Minute), xidEv("n1", "GPU0", 13, 16*time.Minute), xidEv("n1", "GPU0", 13, 17*time.Minute)},
			"escalate:n1/GPU0:reset_gpu escalate:n1/GPU0:reset_gpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := kinds(feed(New(Config{}), 3*time.Hour, tc.evs...)); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// One job crashing on 8 nodes, three times within the hour (it restarts
// and crashes again), is three job events and no node escalates, though
// every GPU saw Xid 13 three times.
func TestApplicationXidsCorrelate(t *testing.T) {
	t.Parallel()
	r := New(Config{})
	var evs []Event
	for crash := range 3 {
		at := time.Duration(crash) * 20 * time.Minute
		for n := range 8 {
			e := xidEv(fmt.Sprintf("n%d", n), "GPU0", 13, at+time.Duration(n)*time.Second)
			e.Job = "4242"
			evs = append(evs, e)
		}
	}
	vs := feed(r, 2*time.Hour, evs...)
	if got := kinds(vs); got != "job_event:8 job_event:8 job_event:8" {
		t.Fatalf("got %q", got)
	}
	if vs[0].Job != "4242" || !strings.Contains(vs[0].Reason, "no node drained") {
		t.Errorf("job event %+v", vs[0])
	}
}

// Below min_nodes the application Xids count on their GPUs like any rule.
func TestFewApplicationXidsStillCount(t *testing.T) {
	t.Parallel()
	r := New(Config{Correlate: CorrelateRule{MinNodes: 4, Window: config.Duration(time.Minute)}})
	vs := feed(r, 2*time.Hour,
		xidEv("n1", "GPU3", 13, 0), xidEv("n2", "GPU1", 13, time.Second),
		xidEv("n1", "GPU3", 13, 10*time.Minute), xidEv("n1", "GPU3", 13, 30*time.Minute))
	if got := kinds(vs); got != "escalate:n1/GPU3:reset_gpu" {
		t.Fatalf("got %q", got)
	}
	// The verdict waits for the correlation window: decided at the Xid's time.
	if !vs[0].At.Equal(t0.Add(30 * time.Minute)) {
		t.Errorf("at %v", vs[0].At)
	}
}

func flap(node, port string, at time.Duration) Event {
	return Event{At: t0.Add(at), Node: node, Component: port, Kind: KindLinkFlap, Count: 1}
}

func TestLinkFlapsSticky(t *testing.T) {
	t.Parallel()
	r := New(Config{})
	m := time.Minute
	if got := kinds(feed(r, 30*m, flap("n1", "mlx5_0/1", 0), flap("n1", "mlx5_0/1", 10*m), flap("n1", "mlx5_0/1", 20*m))); got != "escalate:n1/mlx5_0/1:reset_ib_port" {
		t.Fatalf("third flap: %q", got)
	}
	// Flapping on within the stable period: still one episode, the clearing moves out.
	if got := kinds(feed(r, 2*time.Hour+20*m, flap("n1", "mlx5_0/1", 90*m))); got != "" {
		t.Fatalf("flap while flagged: %q", got)
	}
	if !r.IsFlagged("n1", "mlx5_0/1") {
		t.Fatal("cleared 50m after a flap; stable is 2h")
	}
	if got := kinds(r.Flush(t0.Add(90*m + 2*time.Hour))); got != "cleared:n1/mlx5_0/1" {
		t.Fatalf("after 2h stable: %q", got)
	}
	if r.IsFlagged("n1", "mlx5_0/1") || len(r.Flagged("")) != 0 {
		t.Fatal("still flagged")
	}
}

func TestLinkFlapRearm(t *testing.T) {
	t.Parallel()
	r := New(Config{Link: LinkRule{Flaps: 2, Window: config.Duration(time.Hour)}})
	feed(r, 0, flap("n1", "p", 0), flap("n1", "p", time.Minute))
	r.Rearm("n1", "p")
	if got := kinds(feed(r, 10*time.Minute, flap("n1", "p", 5*time.Minute))); got != "escalate:n1/p:reset_ib_port" {
		t.Fatalf("flap after rearm: %q", got)
	}
	if got := kinds(feed(r, 10*time.Minute, flap("n1", "p", 6*time.Minute))); got != "" {
		t.Fatalf("second flap after one rearm: %q", got)
	}
}

func TestECCRate(t *testing.T) {
	t.Parallel()
	r := New(Config{ECC: ECCRule{Count: 100, Window: config.Duration(time.Hour)}})
	ecc := func(total float64, at time.Duration) Event {
		return Event{At: t0.Add(at), Node: "n1", Component: "GPU2", Kind: KindECCCorrectable, Total: total}
	}
	// A high lifetime total on the first reading is no rate; a reset counter neither.
	got := kinds(feed(r, 5*time.Hour, ecc(5000, 0), ecc(5040, 10*time.Minute), ecc(10, 20*time.Minute),
		ecc(60, 30*time.Minute), ecc(120, 2*time.Hour), ecc(200, 2*time.Hour+10*time.Minute), ecc(230, 2*time.Hour+20*time.Minute)))
	if got != "escalate:n1/GPU2:reset_gpu" {
		t.Fatalf("got %q", got)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	if err := (Config{}).Validate("r"); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	if err := New(Config{}).Config().Validate("r"); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Xid: []XidRule{{Code: 13, Count: 5000}}}, "r.xid[].count"},
		{Config{Xid: []XidRule{{Code: 0}}}, "r.xid[].code"},
		{Config{Xid: []XidRule{{Code: 13, Window: config.Duration(time.Second)}}}, "r.xid[].window"},
		{Config{ECC: ECCRule{Count: -1}}, "r.ecc_correctable.count"},
		{Config{Link: LinkRule{Stable: config.Duration(30 * 24 * time.Hour)}}, "r.link_flaps.stable"},
		{Config{Correlate: CorrelateRule{MinNodes: 1}}, "r.correlate.min_nodes"},
		{Config{Correlate: CorrelateRule{Window: config.Duration(2 * time.Hour)}}, "r.correlate.window"},
	} {
		err := tc.cfg.Validate("r")
		if !errors.Is(err, config.ErrOutOfRange) || !strings.Contains(err.Error(), tc.want+" ") {
			t.Errorf("%+v: %v, want %s out of range", tc.cfg, err, tc.want)
		}
	}
	err := Config{Link: LinkRule{Action: "rm -rf"}, Xid: []XidRule{{Code: 13}, {Code: 13}}}.Validate("r")
	if err == nil || !strings.Contains(err.Error(), "r.link_flaps.action") || !strings.Contains(err.Error(), "two rules") {
		t.Errorf("bad action / duplicate: %v", err)
	}
}

func TestFromCheck(t *testing.T) {
	t.Parallel()
	evs := FromCheck("n1", report.CheckResult{Name: "gpu.xid", Findings: []report.Finding{
		{Component: "GPU3", Code: "XID_79"}, {Component: "GPU1", Code: "XID_13"}, {Component: "GPU1", Code: "GPU_FELL_OFF_BUS"}}}, t0, "77")
	if len(evs) != 2 || evs[0].Component != "GPU1" || evs[0].Xid != 13 || evs[0].Job != "77" || evs[1].Xid != 79 {
		t.Errorf("gpu.xid: %+v", evs)
	}
	evs = FromCheck("n1", report.CheckResult{Name: "gpu.ecc", Metrics: map[string]float64{
		"gpu2.ecc.volatile_correctable_count": 12, "gpu2.ecc.aggregate_correctable_count": 99}}, t0, "")
	if len(evs) != 1 || evs[0].Component != "GPU2" || evs[0].Total != 12 {
		t.Errorf("gpu.ecc: %+v", evs)
	}
	evs = FromCheck("n1", report.CheckResult{Name: "ib.counters", Metrics: map[string]float64{
		"ib.mlx5_0.port1.link_downed_rise_count": 2, "ib.mlx5_1.port1.link_downed_rise_count": 0, "ib.mlx5_0.port1.symbol_error_rise_count": 9}}, t0, "")
	if len(evs) != 1 || evs[0].Component != "mlx5_0/1" || evs[0].Count != 2 || evs[0].Kind != KindLinkFlap {
		t.Errorf("ib.counters: %+v", evs)
	}
}

// A check with only the metrics MetricWanted accepts (of MetricChecks)
// gives the events the whole check does: the remediation feed reads back
// no others.
func TestMetricWantedIsWhatFromCheckReads(t *testing.T) {
	t.Parallel()
	names := []string{"gpu0.ecc.volatile_correctable_count", "gpu7.ecc.volatile_correctable_count", "gpu0.ecc.aggregate_correctable_count",
		"gpu0.ecc.volatile_uncorrectable_count", "xgpu0.ecc.volatile_correctable_count", "gpu0.temperature_c",
		"ib.mlx5_0.port1.link_downed_rise_count", "ib.mlx5_11.port2.link_downed_rise_count", "ib.mlx5_0.port1.link_downed_count",
		"ib.mlx5_0.port1.symbol_error_rise_count", "ib.mlx5_0.1.link_downed_rise_count", "ib.a.b.port1.link_downed_rise_count",
		"mlx5_0.port1.link_downed_rise_count"}
	for _, check := range []string{"gpu.ecc", "ib.counters", "gpu.xid", "gpu.health"} {
		all, wanted := map[string]float64{}, map[string]float64{}
		for i, n := range names {
			all[n] = float64(i + 1)
			if MetricWanted(check, n) {
				wanted[n] = float64(i + 1)
			}
		}
		read := slices.Contains(MetricChecks, check)
		if !read && len(wanted) > 0 {
			t.Errorf("%s: not in MetricChecks, yet metrics wanted: %v", check, wanted)
		}
		if read && len(wanted) == 0 {
			t.Errorf("%s: in MetricChecks, no metric wanted", check)
		}
		full := FromCheck("n1", report.CheckResult{Name: check, Metrics: all}, t0, "")
		part := FromCheck("n1", report.CheckResult{Name: check, Metrics: wanted}, t0, "")
		if fmt.Sprint(full) != fmt.Sprint(part) {
			t.Errorf("%s: all metrics give %+v, the wanted ones %+v", check, full, part)
		}
		if read && len(full) != 2 {
			t.Errorf("%s: %d events from %v, want 2", check, len(full), all)
		}
	}
}
