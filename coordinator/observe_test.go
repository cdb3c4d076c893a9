package coordinator

import (
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// TestObservedReadsTheAgentsOwnResults: drills time detection by what an
// agent reported on its own schedule. Observed returns each check's latest
// scheduled result since a time (a campaign's requested run does not
// count), and CheckInterval the agent's own cadence.
func TestObservedReadsTheAgentsOwnResults(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	a := mustConnect(t, s, "gpu-001")
	base := time.Now().Add(-10 * time.Minute).Truncate(time.Second)
	send := func(at time.Time, work, xid string) {
		id, _ := nextID("gpu-001")
		st := "pass"
		c := &pb.CheckResult{Name: "gpu.xid", Status: "pass"}
		if xid != "" {
			st, c.Status = "fail", "fail"
			c.Findings = []*pb.Finding{{Severity: "fail", Component: "GPU3", Code: xid, Message: "fell off the bus", Action: "replace"}}
		}
		a.sendResult(&pb.Result{Id: id, Node: "gpu-001", WorkId: work, StartedUnixMs: at.UnixMilli() - 50, FinishedUnixMs: at.UnixMilli(),
			Status: st, Checks: []*pb.CheckResult{c}})
		if ack := a.ack(5 * time.Second); ack.GetRefused() != "" {
			t.Fatalf("refused: %s", ack.GetRefused())
		}
	}
	for i := range 4 { // the agent's own passes, every 60s
		send(base.Add(time.Duration(i)*time.Minute), "", "")
	}
	inject := base.Add(3*time.Minute + 10*time.Second)
	send(base.Add(4*time.Minute), "", "XID_79")
	// A later run a campaign asked for: not the fleet's own view.
	if err := s.Store().RecordDispatch(tctx(t), "w-drill-poll", []string{"gpu-001"}, inject); err != nil {
		t.Fatal(err)
	}
	send(base.Add(4*time.Minute+5*time.Second), "w-drill-poll", "XID_79")

	obs, ok := s.Fleet().(kit.Observer)
	if !ok {
		t.Fatal("the coordinator's fleet is no campaign.Observer")
	}
	ctx := tctx(t)
	got, err := obs.Observed(ctx, "gpu-001", []string{"gpu.xid", "ib.ports"}, inject)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Check.Name != "gpu.xid" || got[0].Check.Status != "fail" || !got[0].At.Equal(base.Add(4*time.Minute)) {
		t.Fatalf("observed %+v", got)
	}
	if got, err := obs.Observed(ctx, "gpu-001", []string{"gpu.xid"}, base.Add(5*time.Minute)); err != nil || len(got) != 0 {
		t.Fatalf("nothing since: %+v %v", got, err)
	}
	if iv, err := obs.CheckInterval(ctx, "gpu-001"); err != nil || iv != time.Minute {
		t.Fatalf("interval %v %v", iv, err)
	}
}

// TestObservedSkipsThePassAfterAnAction: the agent runs a quick pass right
// after every action; a drill's injection is an action, and a real fault
// triggers no pass, so detection is timed by the next scheduled result.
// An old agent's results (no trigger) count as scheduled: no better signal.
func TestObservedSkipsThePassAfterAnAction(t *testing.T) {
	t.Parallel()
	base := time.Now().Add(-10 * time.Minute).Truncate(time.Second)
	inject := base.Add(3*time.Minute + 10*time.Second)
	for _, tc := range []struct {
		name      string
		trigger   string // of every pass
		afterPass string // the pass a second after the injection
		counts    bool   // whether a drill polling then sees the fault
	}{
		{"after_action pass is no evidence", wire.TriggerSchedule, wire.TriggerAfterAction, false},
		{"a requested pass is no evidence", wire.TriggerSchedule, wire.TriggerRequest, false},
		{"old agent: no trigger counts as scheduled", "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := testServer(t, t.TempDir(), nil)
			a := mustConnect(t, s, "gpu-001")
			send := func(at time.Time, trigger, xid string) {
				id, _ := nextID("gpu-001")
				st := "pass"
				c := &pb.CheckResult{Name: "gpu.xid", Status: "pass"}
				if xid != "" {
					st, c.Status = "fail", "fail"
					c.Findings = []*pb.Finding{{Severity: "fail", Component: "GPU3", Code: xid, Message: "fell off the bus", Action: "replace"}}
				}
				a.sendResult(&pb.Result{Id: id, Node: "gpu-001", StartedUnixMs: at.UnixMilli() - 50, FinishedUnixMs: at.UnixMilli(),
					Status: st, Checks: []*pb.CheckResult{c}, Trigger: trigger})
				if ack := a.ack(5 * time.Second); ack.GetRefused() != "" {
					t.Fatalf("refused: %s", ack.GetRefused())
				}
			}
			for i := range 4 { // the agent's own passes, every 60s
				send(base.Add(time.Duration(i)*time.Minute), tc.trigger, "")
			}
			obs := s.Fleet().(kit.Observer)
			ctx := tctx(t)
			send(inject.Add(time.Second), tc.afterPass, "XID_79")
			// The drill polls between the pass and the next scheduled one.
			got, err := obs.Observed(ctx, "gpu-001", []string{"gpu.xid"}, inject)
			if err != nil {
				t.Fatal(err)
			}
			if tc.counts != (len(got) == 1) || (tc.counts && !got[0].At.Equal(inject.Add(time.Second))) {
				t.Fatalf("observed %+v right after the injection, want counted=%v", got, tc.counts)
			}
			send(base.Add(4*time.Minute), tc.trigger, "XID_79")
			got, err = obs.Observed(ctx, "gpu-001", []string{"gpu.xid"}, inject)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Check.Status != "fail" || !got[0].At.Equal(base.Add(4*time.Minute)) {
				t.Fatalf("observed %+v, want the scheduled failing result", got)
			}
			if iv, err := obs.CheckInterval(ctx, "gpu-001"); err != nil || iv != time.Minute {
				t.Fatalf("interval %v %v", iv, err)
			}
		})
	}
}
