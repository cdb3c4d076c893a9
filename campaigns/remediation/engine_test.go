package remediation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The ladder runs the same on SQLite and PostgreSQL, and a restarted
// engine reads back what it wrote.
func TestLadderOnEachDatabase(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, open func(testing.TB) *sqldb.DB) {
		db := open(t)
		r := newRigDB(t, db, auto(), kit.BreakerConfig{})
		r.f.set("n01", func(n *fakeNode) { n.faults["GPU2"] = fault{"XID_48", StepResetGPU} })
		id := r.trigger(t, "n01", "GPU2", StepResetGPU)
		drive(t, r.e, r.c, time.Hour)
		again, err := New(r.ctx, auto(), Deps{DB: db, Fleet: r.f, Drain: r.d, Clock: r.c, Log: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		x, err := again.Get(r.ctx, id)
		if err != nil || x.State != StateDone || len(x.Events) < 4 {
			t.Fatalf("after a restart: %v %+v", err, x)
		}
		if id2, err := again.Trigger(r.ctx, Trigger{Node: "n02", Component: "GPU0", Step: StepResetGPU, Reason: "test"}); err != nil || id2 == id {
			t.Fatalf("restarted engine: %v, id %s after %s", err, id2, id)
		}
	})
}

type rig struct {
	e    *Engine
	f    *fakeFleet
	d    *drain.None
	c    *clock
	br   *kit.Breaker
	held map[string]string
	ctx  context.Context
	hmu  sync.Mutex
}

func (r *rig) Holding(_ context.Context, node string) (string, bool) {
	r.hmu.Lock()
	defer r.hmu.Unlock()
	why, ok := r.held[node]
	return why, ok
}

type baseline float64

func (b baseline) AllReduce(context.Context, string) (float64, bool, error) {
	return float64(b), b > 0, nil
}

func newRig(t *testing.T, cfg Config, br kit.BreakerConfig) *rig {
	t.Helper()
	return newRigDB(t, openDB(t), cfg, br)
}

func newRigDB(t *testing.T, db *sqldb.DB, cfg Config, br kit.BreakerConfig) *rig {
	t.Helper()
	c := &clock{now: t0}
	r := &rig{f: newFakeFleet(16), d: drain.NewNone(nil), c: c, held: map[string]string{}, ctx: context.Background()}
	var err error
	if r.br, err = kit.NewBreaker(br, c); err != nil {
		t.Fatal(err)
	}
	r.e, err = New(r.ctx, cfg, Deps{DB: db, Fleet: r.f, Drain: r.d, Breaker: r.br, Clock: c, Log: zerolog.Nop(), Baselines: baseline(480), Campaigns: r})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) trigger(t *testing.T, node, comp, step string) string {
	t.Helper()
	id, err := r.e.Trigger(r.ctx, Trigger{Node: node, Component: comp, Step: step, Code: "XID_48", Source: "finding", Reason: "gpu.xid: " + comp + " XID_48"})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (r *rig) get(t *testing.T, id string) Remediation {
	t.Helper()
	x, err := r.e.Get(r.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func (r *rig) drained(t *testing.T, node string) bool {
	t.Helper()
	st, err := r.d.Status(r.ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	return st.Drained
}

func auto() Config { return Config{Mode: ModeAuto} }

// A new install records what it would do and touches nothing; approve runs it.
func TestShadowByDefault(t *testing.T) {
	t.Parallel()
	r := newRig(t, Config{}, kit.BreakerConfig{})
	r.f.set("n01", func(n *fakeNode) { n.faults["GPU3"] = fault{"XID_48", StepResetGPU} })
	id := r.trigger(t, "n01", "GPU3", StepResetGPU)
	drive(t, r.e, r.c, time.Hour)
	x := r.get(t, id)
	if x.State != StateShadow || x.Mode != ModeShadow || len(x.Would) == 0 || !strings.Contains(strings.Join(x.Would, "\n"), "gpu-reset map[gpu:3]") {
		t.Fatalf("shadow: %+v", x)
	}
	if r.drained(t, "n01") || len(r.f.ran()) != 0 || len(r.br.Records()) != 0 {
		t.Fatalf("shadow mode acted: drained %v, actions %v, breaker %v", r.drained(t, "n01"), r.f.ran(), r.br.Records())
	}
	// A second finding on the node is a note on the open record, not a second one.
	if again := r.trigger(t, "n01", "GPU3", StepResetGPU); again != id {
		t.Fatalf("second trigger opened %s", again)
	}
	if _, err := r.e.Approve(r.ctx, id, "alice"); err != nil {
		t.Fatal(err)
	}
	drive(t, r.e, r.c, time.Hour)
	x = r.get(t, id)
	if x.State != StateDone || r.drained(t, "n01") || !slices.Equal(r.f.ran(), []string{"n01 gpu-reset map[gpu:3]"}) {
		t.Fatalf("approved: %s %s, actions %v", x.State, x.Reason, r.f.ran())
	}
	if _, err := r.e.Approve(r.ctx, id, "alice"); !errors.Is(err, ErrState) {
		t.Fatalf("approve a done one: %v", err)
	}
}

// drain → reset → verify → back, then a recurrence climbs to reboot and
// then to replace, whose RMA reaches the webhook after a 503.
func TestLadderClimbsToRMA(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []CloudEvent
	var ctypes []string
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		b, _ := io.ReadAll(req.Body)
		var ce CloudEvent
		if err := json.Unmarshal(b, &ce); err != nil {
			t.Errorf("body: %v", err)
		}
		got, ctypes = append(got, ce), append(ctypes, req.Header.Get("Content-Type"))
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	if !strings.HasPrefix(srv.URL, "http://127.0.0.1:") {
		t.Fatalf("test server at %s", srv.URL)
	}
	cfg := auto()
	cfg.RMA = RMAConfig{Webhook: srv.URL, Source: "fleetcheck/test", Backoff: time.Second}
	r := newRig(t, cfg, kit.BreakerConfig{})
	broken := func() { r.f.set("n02", func(n *fakeNode) { n.faults["GPU5"] = fault{"XID_48", StepResetGPU} }) }

	broken()
	first := r.trigger(t, "n02", "GPU5", StepResetGPU)
	drive(t, r.e, r.c, time.Hour)
	if x := r.get(t, first); x.State != StateDone || x.Step != StepResetGPU || r.drained(t, "n02") || !x.Verify.Passed || x.Verify.Baseline != 480 {
		t.Fatalf("first: %s %s %+v", x.State, x.Reason, x.Verify)
	}

	r.c.Add(24 * time.Hour)
	broken()
	second := r.trigger(t, "n02", "GPU5", StepResetGPU)
	drive(t, r.e, r.c, time.Hour)
	if x := r.get(t, second); x.State != StateDone || x.Step != StepReboot || x.Recurs != first {
		t.Fatalf("second: %s step %s recurs %q (%s)", x.State, x.Step, x.Recurs, x.Reason)
	}

	r.c.Add(24 * time.Hour)
	broken()
	third := r.trigger(t, "n02", "GPU5", StepResetGPU)
	drive(t, r.e, r.c, time.Hour)
	x := r.get(t, third)
	if x.State != StateRMA || x.Step != StepReplace || !r.drained(t, "n02") || x.RMA == nil || !x.RMA.Sent || x.RMA.Attempts != 2 {
		t.Fatalf("third: %s step %s drained %v rma %+v", x.State, x.Step, r.drained(t, "n02"), x.RMA)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || ctypes[0] != "application/cloudevents+json; charset=utf-8" {
		t.Fatalf("webhook got %d events, %v", len(got), ctypes)
	}
	ce := got[0]
	ev := ce.Data.Evidence
	if ce.SpecVersion != "1.0" || ce.Type != EventTypeRMA || ce.Source != "fleetcheck/test" || ce.ID != x.RMA.ID || ce.Subject != "n02/GPU5" ||
		ce.DataContentType != "application/json" || ce.Time.IsZero() {
		t.Errorf("cloud event attributes %+v", ce)
	}
	if len(ev.Serials) != 1 || ev.Serials[0].Serial != "SN-n02-5" || ev.Bundle != "n02:/var/lib/fleetcheck-agent/bundles/n02.tar.gz" ||
		len(ev.Ladder) != 3 || len(ev.Findings) == 0 {
		t.Errorf("evidence %+v", ev)
	}
	// The part is swapped: approve verifies and returns the node.
	r.f.set("n02", func(n *fakeNode) { delete(n.faults, "GPU5") })
	if _, err := r.e.Approve(r.ctx, third, "tech"); err != nil {
		t.Fatal(err)
	}
	drive(t, r.e, r.c, time.Hour)
	if x := r.get(t, third); x.State != StateDone || r.drained(t, "n02") {
		t.Fatalf("after the swap: %s %s", x.State, x.Reason)
	}
}

// A reset that does not hold climbs within one remediation; a fault only
// a replace fixes ends at the RMA.
func TestVerifyFailureClimbs(t *testing.T) {
	t.Parallel()
	r := newRig(t, auto(), kit.BreakerConfig{})
	r.f.set("n03", func(n *fakeNode) { n.faults["GPU1"] = fault{"XID_79", ""} })
	id := r.trigger(t, "n03", "GPU1", StepResetGPU)
	drive(t, r.e, r.c, 2*time.Hour)
	x := r.get(t, id)
	if x.State != StateRMA || !r.drained(t, "n03") {
		t.Fatalf("%s %s", x.State, x.Reason)
	}
	want := []string{"n03 gpu-reset map[gpu:1]", "n03 reboot map[]", "n03 collect-bundle map[]"}
	if !slices.Equal(r.f.ran(), want) {
		t.Fatalf("actions %v, want %v", r.f.ran(), want)
	}
	var climbs int
	for _, ev := range x.Events {
		if strings.Contains(ev.What, "did not hold") {
			climbs++
		}
	}
	if climbs != 2 {
		t.Errorf("climbs %d in %+v", climbs, x.Events)
	}
}

func TestAllReduceBelowBaselineFailsVerify(t *testing.T) {
	t.Parallel()
	r := newRig(t, auto(), kit.BreakerConfig{})
	r.f.set("n04", func(n *fakeNode) { n.busbw = 300 }) // 37.5% below 480
	id := r.trigger(t, "n04", "GPU0", StepResetGPU)
	if _, err := r.e.Step(r.ctx); err != nil { // drain
		t.Fatal(err)
	}
	if _, err := r.e.Step(r.ctx); err != nil { // act
		t.Fatal(err)
	}
	r.c.Add(time.Minute)
	if _, err := r.e.Step(r.ctx); err != nil { // verify
		t.Fatal(err)
	}
	x := r.get(t, id)
	if x.Step != StepReboot || x.Verify != nil {
		t.Fatalf("%s step %s", x.State, x.Step)
	}
	var why string
	for _, ev := range x.Events {
		if strings.Contains(ev.What, "did not hold") {
			why = ev.What
		}
	}
	if !strings.Contains(why, "300.0 GB/s is more than 30% below the node's baseline 480.0") {
		t.Fatalf("climb reason %q", why)
	}
}

func TestSuppressed(t *testing.T) {
	t.Parallel()
	cfg := auto()
	cfg.Maintenance = []Window{{Nodes: "rack=r1", From: t0.Add(-time.Hour), Until: t0.Add(time.Hour)}}
	r := newRig(t, cfg, kit.BreakerConfig{})
	r.f.set("n00", func(n *fakeNode) { n.labels[DefaultOptOutLabel] = "off" })
	r.held["n08"] = "in burn-in bi-7"
	for _, tc := range []struct{ node, want string }{
		{"n00", "opted out (fleetcheck.io/remediation=off)"},
		{"n05", "maintenance window rack=r1"},
		{"n08", "in burn-in bi-7"},
	} {
		id := r.trigger(t, tc.node, "GPU0", StepResetGPU)
		x := r.get(t, id)
		if x.State != StateSuppressed || !strings.Contains(x.Reason, tc.want) {
			t.Errorf("%s: %s %q", tc.node, x.State, x.Reason)
		}
	}
	// A campaign that takes the node between the trigger and the drain wins too.
	id := r.trigger(t, "n12", "GPU0", StepResetGPU)
	r.hmu.Lock()
	r.held["n12"] = "in rollout ro-3"
	r.hmu.Unlock()
	drive(t, r.e, r.c, time.Hour)
	if x := r.get(t, id); x.State != StateSuppressed {
		t.Errorf("n12: %s", x.State)
	}
	if len(r.f.ran()) != 0 || len(r.br.Records()) != 0 {
		t.Fatalf("suppressed nodes acted on: %v %v", r.f.ran(), r.br.Records())
	}
}

// The breaker holds the second drain until its window has room.
func TestBreakerHolds(t *testing.T) {
	t.Parallel()
	r := newRig(t, auto(), kit.BreakerConfig{Window: time.Hour, MaxCount: 1})
	a := r.trigger(t, "n01", "GPU0", StepResetGPU)
	b := r.trigger(t, "n02", "GPU0", StepResetGPU)
	drive(t, r.e, r.c, 30*time.Minute)
	if x := r.get(t, a); x.State != StateDone {
		t.Fatalf("a: %s", x.State)
	}
	xb := r.get(t, b)
	if xb.State != StateHeld || !strings.Contains(xb.Reason, kit.ErrBreakerOpen.Error()) || r.drained(t, "n02") {
		t.Fatalf("b: %s %q", xb.State, xb.Reason)
	}
	drive(t, r.e, r.c, 2*time.Hour)
	if x := r.get(t, b); x.State != StateDone {
		t.Fatalf("b after the window: %s %q", x.State, x.Reason)
	}
}

// One job crashing on eight nodes, three times in an hour, drains nobody
// and is recorded as job events; a real Xid 79 finding in the same
// results still opens its remediation.
func TestApplicationXidsDrainNobody(t *testing.T) {
	t.Parallel()
	r := newRig(t, auto(), kit.BreakerConfig{})
	for crash := range 3 {
		for i := range 8 {
			node := fmt.Sprintf("n%02d", i)
			at := r.c.Now().Add(time.Duration(i) * time.Second)
			c := report.CheckResult{Name: "gpu.xid", Status: report.Warn, Findings: []report.Finding{
				{Severity: report.SevWarn, Component: "GPU0", Code: "XID_13", Action: report.ActionRestartApp}}}
			if crash == 2 && i == 7 {
				c.Findings = append(c.Findings, report.Finding{Severity: report.SevFail, Component: "GPU4", Code: "XID_79", Action: report.ActionReboot})
			}
			if err := r.e.Observe(r.ctx, node, []report.CheckResult{c}, at, "job-9"); err != nil {
				t.Fatal(err)
			}
		}
		r.c.Add(20 * time.Minute)
		if _, err := r.e.Step(r.ctx); err != nil {
			t.Fatal(err)
		}
	}
	drive(t, r.e, r.c, time.Hour)
	jobs, err := r.e.JobEvents(r.ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 3 || len(jobs[0].Nodes) != 8 || jobs[0].Job != "job-9" {
		t.Fatalf("job events %+v", jobs)
	}
	all, err := r.e.List(r.ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].Node != "n07" || all[0].Component != "GPU4" || all[0].Step != StepReboot {
		t.Fatalf("remediations %+v", all)
	}
}

func TestCancelReturnsTheNode(t *testing.T) {
	t.Parallel()
	r := newRig(t, auto(), kit.BreakerConfig{})
	id := r.trigger(t, "n06", "GPU0", StepReseat)
	drive(t, r.e, r.c, time.Hour)
	if x := r.get(t, id); x.State != StateAwaiting || !r.drained(t, "n06") {
		t.Fatalf("reseat: %s", x.State)
	}
	x, err := r.e.Cancel(r.ctx, id, "bob", "not now")
	if err != nil || x.State != StateCancelled || r.drained(t, "n06") {
		t.Fatalf("cancel: %v %+v", err, x)
	}
	if _, err := r.e.Cancel(r.ctx, id, "bob", "again"); !errors.Is(err, ErrState) {
		t.Fatalf("cancel twice: %v", err)
	}
	if _, err := r.e.Get(r.ctx, "rem-nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (Config{}).Validate(); err != nil {
		t.Fatal(err)
	}
	if c := (Config{}).WithDefaults(); c.Mode != ModeShadow || c.Actions[StepResetGPU] != "gpu-reset" {
		t.Fatalf("defaults %+v", c)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{RecurWindow: time.Minute}, "remediation.recur_window"},
		{Config{Tolerance: 2}, "remediation.tolerance"},
		{Config{RMA: RMAConfig{Retries: 1000}}, "remediation.rma.retries"},
		{Config{Settle: -time.Second}, "remediation.settle"},
	} {
		if err := tc.cfg.Validate(); !errors.Is(err, config.ErrOutOfRange) || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want+" ") {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Mode: "yolo"}, "remediation.mode"},
		{Config{Actions: map[string]string{StepReplace: "x"}}, "remediation.actions"},
		{Config{Actions: map[string]string{StepReboot: "reboot; rm -rf /"}}, "remediation.actions.reboot"},
		{Config{RMA: RMAConfig{Webhook: "ftp://x"}}, "remediation.rma.webhook"},
		{Config{Maintenance: []Window{{Nodes: "rack=r1", From: t0, Until: t0}}}, "remediation.maintenance[0]"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
}

// One slow agent action does not hold the others: in Run, a node whose
// reset hangs stays acting while another node's remediation is drained,
// reset, verified and returned; the slow node gets no second step while
// its first runs; once its action returns it completes too.
func TestSlowActionHoldsOnlyItsNode(t *testing.T) {
	t.Parallel()
	r := newRig(t, auto(), kit.BreakerConfig{})
	release := make(chan struct{})
	r.f.mu.Lock()
	r.f.hold = map[string]chan struct{}{"n01": release}
	r.f.entered = make(chan string, 4)
	r.f.mu.Unlock()
	slow := r.trigger(t, "n01", "GPU0", StepResetGPU) // the older: it goes first
	fast := r.trigger(t, "n02", "GPU1", StepResetGPU)
	ctx, cancel := context.WithCancel(r.ctx)
	ran := make(chan error, 1)
	go func() { ran <- r.e.Run(ctx, time.Hour) }()
	defer func() {
		cancel()
		if err := <-ran; !errors.Is(err, context.Canceled) {
			t.Errorf("run: %v", err)
		}
	}()
	select {
	case n := <-r.f.entered:
		if n != "n01" {
			t.Fatalf("%s's action held, want n01's", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("n01's action never started")
	}
	waitState := func(id string, st State) Remediation {
		t.Helper()
		var x Remediation
		testwait.For(t, 10*time.Second, id+" to be "+string(st), func() (bool, string) {
			x = r.get(t, id)
			return x.State == st, string(x.State) + ": " + x.Reason
		})
		return x
	}
	waitState(fast, StateVerifying)
	r.c.Add(2 * time.Minute) // past settle: n02 is due for its verification, n01 is due too
	r.e.wake()
	waitState(fast, StateDone)
	if x := r.get(t, slow); x.State != StateActing || !r.drained(t, "n01") {
		t.Fatalf("n01 while its action hangs: %s", x.State)
	}
	if got := r.f.ran(); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"n01 gpu-reset map[gpu:0]", "n02 gpu-reset map[gpu:1]"}) {
		t.Fatalf("actions %q: n01 got a second step while its first ran?", got)
	}
	close(release)
	waitState(slow, StateVerifying)
	r.c.Add(2 * time.Minute)
	r.e.wake()
	waitState(slow, StateDone)
}

// Shadow mode records what it would do, with the climb a part that
// fails again would take, and sends nothing to any agent: no action, no
// check run, no drain, nothing counted by the breaker.
func TestShadowRecordsTheClimb(t *testing.T) {
	t.Parallel()
	r := newRig(t, Config{}, kit.BreakerConfig{})
	r.f.set("n01", func(n *fakeNode) { n.faults["GPU3"] = fault{"XID_48", ""} })
	id := r.trigger(t, "n01", "GPU3", StepResetGPU)
	x := r.get(t, id)
	want := []string{
		"drain n01 (behind the breaker)",
		"run agent action gpu-reset map[gpu:3] (reset_gpu)",
		"verify: " + strings.Join(DefaultVerifyChecks, ", "),
		"verify: nccl.allreduce within 30% of the node's baseline",
		"return to service",
		"if GPU3 fails again (this step does not hold, or it recurs within 168h0m0s of its return): reboot, then replace",
	}
	if !slices.Equal(x.Would, want) {
		t.Fatalf("would:\n%s\nwant:\n%s", strings.Join(x.Would, "\n"), strings.Join(want, "\n"))
	}
	// The part fails again, twice: the climbs auto mode would take.
	for _, next := range []string{StepReboot, StepReplace} {
		r.c.Add(time.Hour)
		if again := r.trigger(t, "n01", "GPU3", StepResetGPU); again != id {
			t.Fatalf("a recurrence opened %s beside %s", again, id)
		}
		x = r.get(t, id)
		if last := x.Would[len(x.Would)-1]; !strings.HasSuffix(last, "in auto mode it would climb to "+next) {
			t.Fatalf("after a recurrence: %q, want a climb to %s", last, next)
		}
	}
	if x.ShadowRecurs != 2 || x.State != StateShadow || !strings.Contains(x.Events[len(x.Events)-1].What, "would climb to replace") {
		t.Fatalf("shadow after two recurrences: %+v", x)
	}
	// A replace would keep the node drained, with the RMA.
	rp := r.get(t, r.trigger(t, "n02", "GPU1", StepReplace))
	if w := strings.Join(rp.Would, "\n"); !strings.Contains(w, "open an RMA for GPU1") || !strings.HasSuffix(w, "keep the node drained until the part is replaced (approve)") {
		t.Fatalf("replace would:\n%s", w)
	}
	drive(t, r.e, r.c, 24*time.Hour)
	if sent := r.f.sent(); len(sent) != 0 || r.drained(t, "n01") || r.drained(t, "n02") || len(r.br.Records()) != 0 {
		t.Fatalf("shadow mode reached the agents: sent %q, drained %v/%v, breaker %v", sent, r.drained(t, "n01"), r.drained(t, "n02"), r.br.Records())
	}
}

// The ladder's drains come back into a restarted coordinator's breaker
// from the event log: the window's count holds across the restart.
func TestDrainRecordsRestoreTheBreaker(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	r := newRigDB(t, db, auto(), kit.BreakerConfig{Window: time.Hour, MaxCount: 1})
	r.trigger(t, "n01", "GPU0", StepResetGPU)
	drive(t, r.e, r.c, 30*time.Minute)
	recs, err := r.e.DrainRecords(r.ctx, r.c.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Node != "n01" || recs[0].Campaign != Actor {
		t.Fatalf("drain records %+v", recs)
	}
	if old, err := r.e.DrainRecords(r.ctx, r.c.Now().Add(time.Minute)); err != nil || len(old) != 0 {
		t.Fatalf("records after the window's start: %+v %v", old, err)
	}
	// A fresh breaker (the restarted coordinator's) restored from them
	// holds the next drain.
	br, err := kit.NewBreaker(kit.BreakerConfig{Window: time.Hour, MaxCount: 1}, r.c)
	if err != nil {
		t.Fatal(err)
	}
	br.Restore(recs)
	again, err := New(r.ctx, auto(), Deps{DB: db, Fleet: r.f, Drain: r.d, Breaker: br, Clock: r.c, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	id, err := again.Trigger(r.ctx, Trigger{Node: "n02", Component: "GPU0", Step: StepResetGPU, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := again.Step(r.ctx); err != nil {
		t.Fatal(err)
	}
	if x, err := again.Get(r.ctx, id); err != nil || x.State != StateHeld {
		t.Fatalf("after the restart: %s %v", x.State, err)
	}
}

// A new leader's engine recalls what the old one observed: two Xid 13s
// before the takeover and one after add up to the rule's three, and a
// port flagged and remediated before it is flagged still, armed, so its
// next flap escalates as a recurrence. An engine that does not recall
// sees one Xid and a port never flagged.
func TestRecallRebuildsTheWindows(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	old := newRigDB(t, db, auto(), kit.BreakerConfig{})
	var seen []Observed
	observe := func(r *rig, node string, c report.CheckResult) {
		t.Helper()
		at := r.c.Now()
		if err := r.e.Observe(r.ctx, node, []report.CheckResult{c}, at, ""); err != nil {
			t.Fatal(err)
		}
		if r == old {
			seen = append(seen, Observed{Node: node, Checks: []report.CheckResult{c}, At: at})
		}
		r.c.Add(time.Minute)
	}
	flap := report.CheckResult{Name: "ib.counters", Status: report.Warn, Metrics: map[string]float64{"ib.mlx5_0.port1.link_downed_rise_count": 1}}
	xid := report.CheckResult{Name: "gpu.xid", Status: report.Warn, Findings: []report.Finding{
		{Severity: report.SevWarn, Component: "GPU0", Code: "XID_13", Action: report.ActionRestartApp}}}
	for range 3 {
		observe(old, "n02", flap)
	}
	drive(t, old.e, old.c, time.Hour)
	ports, err := old.e.List(old.ctx, "n02", "")
	if err != nil || len(ports) != 1 || ports[0].Component != "mlx5_0/1" || ports[0].State != StateDone {
		t.Fatalf("the old leader's port remediation: %+v, %v", ports, err)
	}
	for range 2 {
		observe(old, "n01", xid)
	}
	count := func(r *rig, node string) int {
		t.Helper()
		rs, err := r.e.List(r.ctx, node, "")
		if err != nil {
			t.Fatal(err)
		}
		return len(rs)
	}

	// Without recalling: one Xid, no flagged port.
	forgetful := newRigDB(t, db, auto(), kit.BreakerConfig{})
	forgetful.c.Add(old.c.Now().Sub(forgetful.c.Now()))
	observe(forgetful, "n01", xid)
	forgetful.c.Add(3 * time.Minute) // past the correlation window: the Xid counts
	if _, err := forgetful.e.Step(forgetful.ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(forgetful, "n01"); n != 0 || len(forgetful.e.Flagged("")) != 0 {
		t.Fatalf("an engine that did not recall: %d remediations on n01, flagged %v", n, forgetful.e.Flagged(""))
	}

	next := newRigDB(t, db, auto(), kit.BreakerConfig{})
	next.c.Add(forgetful.c.Now().Sub(next.c.Now()))
	if h := next.e.RecallHorizon(); h != 24*time.Hour {
		t.Fatalf("horizon %s, want the ECC rule's 24h", h)
	}
	n, err := next.e.Recall(next.ctx, seen)
	if err != nil || n != 5 {
		t.Fatalf("recalled %d events (%v), want 5", n, err)
	}
	if f := next.e.Flagged(""); len(f) != 1 || f[0].Node != "n02" || f[0].Component != "mlx5_0/1" {
		t.Fatalf("flagged after recall: %+v", f)
	}
	observe(next, "n01", xid)
	next.c.Add(3 * time.Minute)
	if _, err := next.e.Step(next.ctx); err != nil {
		t.Fatal(err)
	}
	gpu, err := next.e.List(next.ctx, "n01", "")
	if err != nil || len(gpu) != 1 || gpu[0].Component != "GPU0" || gpu[0].Step != StepResetGPU {
		t.Fatalf("the third Xid 13 after recall: %+v, %v", gpu, err)
	}
	observe(next, "n02", flap)
	if n := count(next, "n02"); n != 2 {
		t.Fatalf("a flap of the remediated, flagged port after recall: %d remediations on n02, want 2", n)
	}
}
