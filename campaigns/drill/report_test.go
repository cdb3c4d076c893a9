package drill

import (
	"bytes"
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// drilled makes a finished drill with one target and the given timings
// (negative: not measured).
func drilled(id, fault string, start time.Time, ttd, ttr time.Duration, aborted bool, findings ...string) Drill {
	t := Target{Node: "n-" + id, State: TargetDone, InjectedAt: start.Add(10 * time.Second), Aborted: aborted, Findings: []Finding{}}
	if ttd >= 0 {
		t.DetectedAt, t.DetectedBy, t.ExpectedDetected = t.InjectedAt.Add(ttd), "gpu.xid", true
	}
	if ttr >= 0 {
		t.RecoveredAt = t.InjectedAt.Add(ttr)
	}
	for _, f := range findings {
		t.add(f, "fail", f, start)
	}
	st := StateDone
	if aborted {
		st = StateAborted
	}
	return Drill{ID: id, Name: id, Fault: fault, State: st, CreatedAt: start, Spec: &Spec{Expect: Expect{Check: "gpu.xid"}}, Targets: []Target{t}}
}

func TestMTTDMTTRArithmetic(t *testing.T) {
	t.Parallel()
	w1 := time.Date(2026, 6, 1, 9, 0, 0, 0, time.UTC) // a Monday
	w2 := w1.Add(7 * 24 * time.Hour)
	ds := []Drill{
		drilled("a", FaultXid, w1, 30*time.Second, 2*time.Minute, false),
		drilled("b", FaultXid, w1.Add(time.Hour), 60*time.Second, 3*time.Minute, false),
		// Aborted: detected (counts toward MTTD) but its recovery does not
		// count toward MTTR.
		drilled("c", FaultXid, w2, 90*time.Second, 20*time.Minute, true, FindingAborted),
		// A detection gap: no TTD, recovered after the revert.
		drilled("d", FaultKillWorkload, w2, -1, 5*time.Minute, true, FindingDetectionGap, FindingAborted),
		drilled("e", FaultIBPortDown, w2.Add(time.Hour), 0, 40*time.Second, false),
		{ID: "f", Fault: FaultXid, State: StateRefused, CreatedAt: w2, Spec: &Spec{}},
	}
	r := buildReport(ds, ReportOptions{})
	if r.Drills != 6 || r.Refused != 1 || len(r.Rows) != 5 {
		t.Fatalf("drills %d refused %d rows %d", r.Drills, r.Refused, len(r.Rows))
	}
	by := map[string]Stats{}
	for _, s := range r.ByFault {
		by[s.Fault] = s
	}
	xid := by[FaultXid]
	if xid.Targets != 3 || xid.Detected != 3 || xid.Recovered != 2 || xid.Aborted != 1 || xid.Gaps != 0 {
		t.Errorf("xid counts %+v", xid)
	}
	if *xid.MTTDSeconds != 60 || *xid.MaxTTD != 90 {
		t.Errorf("xid MTTD %v max %v, want 60 and 90", *xid.MTTDSeconds, *xid.MaxTTD)
	}
	if *xid.MTTRSeconds != 150 || *xid.MaxTTR != 180 {
		t.Errorf("xid MTTR %v max %v, want 150 and 180", *xid.MTTRSeconds, *xid.MaxTTR)
	}
	kill := by[FaultKillWorkload]
	if kill.Gaps != 1 || kill.Detected != 0 || kill.MTTDSeconds != nil || kill.MTTRSeconds != nil {
		t.Errorf("kill-workload %+v", kill)
	}
	ib := by[FaultIBPortDown]
	if *ib.MTTDSeconds != 0 || *ib.MTTRSeconds != 40 {
		t.Errorf("ib %+v", ib)
	}
	// Weekly trend: xid in week 1 (a, b) and week 2 (c).
	var trend []string
	for _, s := range r.Trend {
		mttd := "-"
		if s.MTTDSeconds != nil {
			mttd = time.Duration(*s.MTTDSeconds * 1e9).String()
		}
		trend = append(trend, s.Period.Format("01-02")+" "+s.Fault+" "+mttd)
	}
	want := []string{"06-01 xid-inject 45s", "06-08 ib-port-down 0s", "06-08 kill-workload -", "06-08 xid-inject 1m30s"}
	if strings.Join(trend, "|") != strings.Join(want, "|") {
		t.Errorf("trend %v", trend)
	}
	// Filters.
	if r := buildReport(ds, ReportOptions{Since: w2, Fault: FaultXid}); len(r.Rows) != 1 || r.Rows[0].Drill != "c" {
		t.Errorf("filtered rows %+v", r.Rows)
	}
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"MTTD", "detection_gap", "1m0s", "2m30s", "refused"} {
		if !strings.Contains(buf.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, buf.String())
		}
	}
}

func TestReportFromEngine(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-001", "gpu-002")
	a := h.start("{fault: xid-inject, targets: name=gpu-001}")
	h.run(h.eng, nil)
	b := h.start("{fault: ib-port-down, targets: name=gpu-002}")
	h.run(h.eng, nil)
	r, err := h.eng.Report(context.Background(), ReportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Rows) != 2 || r.Rows[0].Drill != a || r.Rows[1].Drill != b || r.Rows[0].TTDSeconds == nil || r.Rows[1].TTRSeconds == nil {
		t.Fatalf("%+v", r.Rows)
	}
	if len(r.ByFault) != 2 || len(r.Trend) != 2 {
		t.Errorf("%+v %+v", r.ByFault, r.Trend)
	}
	ds, err := h.eng.List(context.Background())
	if err != nil || len(ds) != 2 {
		t.Fatalf("%d %v", len(ds), err)
	}
	if _, err := h.eng.Get(context.Background(), "d-nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("%v", err)
	}
}

func TestParseSpec(t *testing.T) {
	t.Parallel()
	s, err := ParseSpec([]byte("fault: ib-port-down\ntargets: name=gpu-001\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Revert != "ib-port-down-revert" || s.Expect.Check != "ib.ports" || s.Params["hca"] != "mlx5_0" || s.OptInLabel != DefaultOptIn ||
		s.BlastRadius.MaxNodes != 1 || time.Duration(s.Deadline) != 15*time.Minute || time.Duration(s.RevertAfter) != 20*time.Minute ||
		time.Duration(s.PollInterval) != 30*time.Second || !strings.Contains(strings.Join(s.Watch, ","), "gpu.xid") {
		t.Errorf("defaults %+v", s)
	}
	for _, c := range []struct{ name, yaml, want string }{
		{"unknown key", "fault: xid-inject\ntargets: a=b\nblast: 1\n", "blast"},
		{"no targets", "fault: xid-inject\n", "targets"},
		{"custom fault without check", "fault: pull-psu\nrevert: push-psu\ntargets: a=b\n", "expect.check"},
		{"custom fault without revert", "fault: pull-psu\nexpect: {check: gpu.inventory}\ntargets: a=b\n", "revert"},
		{"engine param", "fault: xid-inject\ntargets: a=b\nparams: {revert_after: 1h}\n", "set by the engine"},
		{"shell", "fault: xid-inject\ntargets: a=b\nparams: {xid: '79; reboot'}\n", "params"},
		{"agent timer inside deadline", "fault: xid-inject\ntargets: a=b\ndeadline: 10m\nrevert_after: 5m\n", "revert_after"},
		{"deadline shorter than two polls", "fault: xid-inject\ntargets: a=b\ndeadline: 1m\npoll_interval: 45s\n", "deadline"},
		{"opt-in label", "fault: xid-inject\ntargets: a=b\nopt_in_label: drill\n", "opt_in_label"},
		{"share", "fault: xid-inject\ntargets: a=b\nblast_radius: {max_share: 2}\n", "max_share"},
		{"code", "fault: xid-inject\ntargets: a=b\nexpect: {code: xid79}\n", "expect.code"},
	} {
		if _, err := ParseSpec([]byte(c.yaml)); !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// TestShippedSpecs loads examples/drill.yaml and the YAML blocks of
// docs/drill.md.
func TestShippedSpecs(t *testing.T) {
	t.Parallel()
	ex, err := os.ReadFile("../../examples/drill.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseSpec(ex); err != nil {
		t.Errorf("examples/drill.yaml: %v", err)
	}
	doc, err := os.ReadFile("../../docs/drill.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) == 0 {
		t.Fatal("docs/drill.md has no yaml blocks")
	}
	for i, b := range blocks {
		if _, err := ParseSpec(b[1]); err != nil {
			t.Errorf("docs/drill.md block %d: %v", i+1, err)
		}
	}
}
