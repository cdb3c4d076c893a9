//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

type sweepReport struct {
	ID         string `json:"id"`
	State      string `json:"state"`
	Error      string `json:"error"`
	Incomplete string `json:"incomplete"`
	Tested     int    `json:"tested"`
	Passed     []string
	Verdicts   []struct {
		Subject string `json:"subject"`
		Verdict string `json:"verdict"`
		Reason  string `json:"reason"`
	} `json:"verdicts"`
	Skipped []struct {
		Node   string `json:"node"`
		Reason string `json:"reason"`
	} `json:"skipped"`
	Progress *struct {
		Phase   string `json:"phase"`
		Singles int    `json:"singles_done"`
	} `json:"progress"`
}

func (r sweepReport) summary() string {
	return fmt.Sprintf("%s tested=%d passed=%v verdicts=%+v skipped=%+v error=%q incomplete=%q", r.State, r.Tested, r.Passed, r.Verdicts, r.Skipped, r.Error, r.Incomplete)
}

func (f *fleet) waitSweep(id string, within time.Duration, what string, done func(sweepReport) bool) sweepReport {
	f.t.Helper()
	var last sweepReport
	testwait.ForEvery(f.t, within, 200*time.Millisecond, what, func() (bool, string) {
		var r sweepReport
		if !tryJSON(f, &r, "sweep", "report", id) {
			return false, last.summary()
		}
		last = r
		return done(r), last.summary()
	})
	return last
}

// TestSweep: a slow-node sweep over four simulated nodes, one of them
// built slow (host.faults: slow_node 0.6, its agent restarted on that
// simulated node). The coordinator
// is SIGKILLed in the middle (the sweep resumes on restart) and an agent
// is SIGKILLed while it runs its all_reduce. The sweep must finish done,
// test every node — none skipped for a reconnecting agent — and name the
// slow node, and only it. The resumed sweep waits (connect_grace) for the
// agents reconnecting after the restart before it runs their tests again.
//
// -short leaves out the coordinator's kill, to keep CI's run short.
func TestSweep(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetOpts{nodes: 4, longTools: 2 * time.Second})
	// The slow node: its all_reduce at 60 % of its peers'.
	slow := f.agent("gpu-003")
	f.restartAgentWith(slow, "host: {mode: sim, seed: 3, long_tool_time: 2s, faults: [slow_node 0.6]}")

	victim := f.agent("gpu-001")
	runs := len(victim.logLines("running requested checks"))
	spec := f.specFile("sweep.yaml", "selector: sku=h100\ntest_timeout: 45s\nnote: e2e\n")
	id := startedID(t, "sweep", f.ok("sweep", "start", "-f", spec))
	testwait.Until(t, time.Minute, "gpu-001 running its part of the sweep", func() bool {
		return len(victim.logLines("running requested checks")) > runs
	})
	f.restartAgent("gpu-001", syscall.SIGKILL, "while it runs its sweep all_reduce")
	if !testing.Short() {
		f.waitSweep(id, time.Minute, "the sweep testing", func(r sweepReport) bool {
			return r.State != "running" || r.Progress != nil && r.Progress.Phase != ""
		})
		f.killCoordinator("in the middle of the sweep")
	}

	r := f.waitSweep(id, 5*time.Minute, "the sweep to finish", func(r sweepReport) bool { return r.State != "running" })
	t.Logf("sweep %s ended %s", id, r.summary())
	if r.State != "done" || r.Tested != 4 || r.Incomplete != "" || len(r.Passed) != 3 {
		t.Errorf("sweep ended %s", r.summary())
	}
	if len(r.Skipped) != 0 {
		t.Errorf("nodes skipped: %+v", r.Skipped)
	}
	var flagged []string
	for _, v := range r.Verdicts {
		if v.Verdict != "pass" && v.Verdict != "ok" {
			flagged = append(flagged, v.Subject+":"+v.Verdict)
		}
	}
	if len(flagged) != 1 || !strings.Contains(flagged[0], "gpu-003") {
		t.Errorf("sweep flagged %v, want only gpu-003 (slowed to 60%%): %s", flagged, r.summary())
	}
	f.checkAckedStoredOnce()
}

// TestBaselineRecord: node baselines recorded with `baseline record --from
// SELECTOR` from the nodes' stored all_reduce results, after the
// coordinator was SIGKILLed between the measurement and the record and an
// agent restarted: every node gets exactly one new version, from its own
// measurement.
func TestBaselineRecord(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetOpts{nodes: 4})
	res := jsonOf[checkOut](f, "check", "sku=h100", "--checks", "nccl.allreduce", "--timeout", "1m")
	if res.Done != 4 || res.Failed != 0 {
		t.Fatalf("measurement: %+v", res)
	}
	f.killCoordinator("between the measurement and the record")
	f.restartAgent("gpu-004", syscall.SIGKILL, "before the record")
	f.waitConnected(time.Minute, "the fleet back")

	type baseline struct {
		Metric  string  `json:"metric"`
		Scope   string  `json:"scope"`
		Value   float64 `json:"value"`
		Version int     `json:"version"`
		FromRun string  `json:"from_run"`
		Stack   struct {
			Driver string `json:"driver"`
		} `json:"stack"`
	}
	out := f.ok("baseline", "record", "--from", "sku=h100", "--metric", "nccl.allreduce.busbw_gbps", "--note", "e2e")
	t.Logf("baseline record printed:\n%s", out)
	for _, n := range f.nodeNames() {
		bs := jsonOf[[]baseline](f, "baseline", "show", "--scope", "node:"+n, "--metric", "nccl.allreduce.busbw_gbps")
		if len(bs) != 1 || bs[0].Value < 400 || bs[0].Version != 1 || bs[0].Stack.Driver != fromDriver {
			t.Errorf("%s: node baselines %+v, want one version near 480 GB/s under driver %s", n, bs, fromDriver)
		}
	}
	f.checkAckedStoredOnce()
}
