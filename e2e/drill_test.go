//go:build e2e

package e2e

import (
	"fmt"
	"math"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

type drillDoc struct {
	ID      string `json:"id"`
	State   string `json:"state"`
	Reason  string `json:"reason"`
	Targets []struct {
		Node             string    `json:"node"`
		State            string    `json:"state"`
		InjectedAt       time.Time `json:"injected_at"`
		DetectedAt       time.Time `json:"detected_at"`
		DetectedBy       string    `json:"detected_by"`
		ExpectedDetected bool      `json:"expected_detected"`
		RevertedAt       time.Time `json:"reverted_at"`
		RevertedBy       string    `json:"reverted_by"`
		RecoveredAt      time.Time `json:"recovered_at"`
		Aborted          bool      `json:"aborted"`
		Polls            int       `json:"polls"`
		CheckInterval    string    `json:"check_interval"`
		Findings         []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"findings"`
	} `json:"targets"`
}

func (d drillDoc) summary() string {
	var b []string
	for _, t := range d.Targets {
		b = append(b, fmt.Sprintf("%s=%s detected_by=%q reverted_by=%q findings=%v", t.Node, t.State, t.DetectedBy, t.RevertedBy, t.Findings))
	}
	return d.State + " " + d.Reason + " [" + strings.Join(b, "; ") + "]"
}

func (f *fleet) waitDrill(id string, within time.Duration, what string, done func(drillDoc) bool) drillDoc {
	f.t.Helper()
	var last drillDoc
	testwait.ForEvery(f.t, within, 200*time.Millisecond, what, func() (bool, string) {
		var d drillDoc
		if !tryJSON(f, &d, "drill", "status", id) {
			return false, last.summary()
		}
		last = d
		return done(d), last.summary()
	})
	return last
}

// TestDrill: a drill takes an IB port of the opted-in node down through
// its agent (the simulated node's port goes down), ib.ports detects it,
// the drill waits for a drain that no policy makes (a finding), the
// coordinator reverts the fault and the node recovers. The coordinator is
// SIGKILLed while the drill watches the fault, and the target's agent is
// SIGKILLed after the inject (its simulated fault and its revert timer
// outlive it). The drill must finish done, detected by ib.ports, with the
// fault reverted on the node.
func TestDrill(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetOpts{nodes: 4, labels: func(i int) map[string]string {
		l := map[string]string{"sku": "h100", "rack": "r1"}
		if i == 2 {
			l["fleetcheck.io/drill"] = "allowed"
		}
		return l
	}})
	target := f.agent("gpu-002")
	spec := f.specFile("drill.yaml", `
name: e2e-ib-loss
fault: ib-port-down
params: {hca: mlx5_4, port: "1"}
expect: {check: ib.ports, code: IB_PORT_DOWN, out_of_service: true, out_of_service_within: 15s}
targets: "rack=r1,name=gpu-002"
blast_radius: {max_nodes: 1}
deadline: 2m
poll_interval: 1s
watch: [gpu.inventory, gpu.ecc, gpu.xid, ib.ports]
revert_after: 3m
revert_on_disconnect: 1m
recover_grace: 1m
who: oncall@example.com
`)
	id := startedID(t, "drill", f.ok("drill", "start", "-f", spec))
	// No drain policy takes the node out of service: the drill waits for
	// it (out_of_service_within) with the fault in place, then reverts.
	f.waitDrill(id, time.Minute, "the fault detected", func(d drillDoc) bool {
		return d.State != "running" || len(d.Targets) == 1 && d.Targets[0].State == "awaiting_out_of_service"
	})
	testwait.Until(t, 30*time.Second, "gpu-002's simulated port down", func() bool {
		st := target.simState(t)
		return len(st.Faults) == 1 && st.Faults[0].Kind == "ib_port_down" && st.Faults[0].HCA == "mlx5_4"
	})
	f.killCoordinator("while the drill watches the injected fault")
	f.restartAgent("gpu-002", syscall.SIGKILL, "with the drill's fault in place")

	d := f.waitDrill(id, 3*time.Minute, "the drill to finish", func(d drillDoc) bool { return d.State != "running" })
	t.Logf("drill %s ended %s", id, d.summary())
	if d.State != "done" || len(d.Targets) != 1 {
		t.Fatalf("drill ended %s", d.summary())
	}
	tg := d.Targets[0]
	if tg.DetectedBy != "ib.ports" || !tg.ExpectedDetected || tg.DetectedAt.Before(tg.InjectedAt) || tg.RevertedAt.IsZero() ||
		tg.RecoveredAt.Before(tg.RevertedAt) || tg.Aborted {
		t.Errorf("drill target: %s", d.summary())
	}
	checkDetectionTimedBySchedule(f, "gpu-002", tg.InjectedAt, tg.DetectedAt, tg.CheckInterval)
	for _, x := range tg.Findings {
		if x.Code != "not_out_of_service" { // no drain policy in this fleet: expected
			t.Errorf("drill finding %s: %s", x.Code, x.Message)
		}
	}
	st := target.simState(t)
	if len(st.Faults) != 0 {
		t.Errorf("gpu-002 still has faults after the drill: %+v", st.Faults)
	}
	if st.Actions["ib-port-down"] != 1 {
		t.Errorf("the fault was injected %d times, want once", st.Actions["ib-port-down"])
	}
	if n := st.Actions["ib-port-up"]; n < 1 {
		t.Errorf("the fault was reverted %d times", n)
	}
	for _, a := range f.agents {
		if a.node != "gpu-002" && len(a.simState(t).Actions) != 0 {
			t.Errorf("%s, not a target, ran actions: %v", a.node, a.simState(t).Actions)
		}
	}
	f.waitConnected(time.Minute, "the fleet settled after the drill")
	f.checkAckedStoredOnce()
}

// checkDetectionTimedBySchedule: the agent runs a quick pass right after
// the injection (every action is followed by one); a real fault triggers
// no pass, so the drill must time detection by the agent's next scheduled
// pass. The time to detect is then above 0 and within one interval (5s,
// agentYAML), and the detecting result is on the schedule's beat: a whole
// number of intervals after the agent's scheduled passes before the
// injection (the pass after the action falls anywhere in between).
func checkDetectionTimedBySchedule(f *fleet, node string, injected, detected time.Time, interval string) {
	f.t.Helper()
	const every = 5 * time.Second
	if interval != "5s" {
		f.t.Errorf("drill check_interval %q, want the agent's 5s", interval)
	}
	ttd := detected.Sub(injected)
	f.t.Logf("time to detect %v, check interval %s", ttd, interval)
	if ttd <= 0 || ttd > every+2*time.Second {
		f.t.Errorf("time to detect %v, want above 0 and within one %v interval", ttd, every)
	}
	type stored struct {
		WorkID   string    `json:"work_id"`
		Finished time.Time `json:"finished"`
	}
	res := jsonOf[struct {
		Results []stored `json:"results"`
	}](f, "results", node, "--check", "ib.ports", "--limit", "500")
	beats, worst := 0, 0.0
	defer func() {
		f.t.Logf("%d scheduled passes before the injection, the detection at most %.3fs off their beat", beats, worst)
	}()
	for _, r := range res.Results {
		if r.WorkID != "" || !r.Finished.Before(injected) {
			continue
		}
		beats++
		off := detected.Sub(r.Finished).Seconds() / every.Seconds()
		d := math.Abs(off-math.Round(off)) * every.Seconds()
		worst = max(worst, d)
		if d > 0.6 {
			f.t.Errorf("detection at %v is %.2fs off the schedule of the pass at %v: not a scheduled pass",
				detected.Format(time.RFC3339Nano), d, r.Finished.Format(time.RFC3339Nano))
			return
		}
	}
	if beats == 0 {
		f.t.Errorf("no scheduled %s result on %s before the injection at %v", "ib.ports", node, injected)
	}
}
