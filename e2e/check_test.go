//go:build e2e

package e2e

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

type checkOut struct {
	WorkID      string `json:"work_id"`
	Total       int    `json:"total"`
	Done        int    `json:"done"`
	Refused     int    `json:"refused"`
	Failed      int    `json:"failed"`
	Unreachable int    `json:"unreachable"`
	TimedOut    int    `json:"timed_out"`
	Outcomes    []struct {
		Node     string `json:"node"`
		Status   string `json:"status"`
		Reason   string `json:"reason"`
		ResultID string `json:"result_id"`
	} `json:"outcomes"`
}

// TestCheck: `fleetcheck check` over the fleet while the coordinator is
// SIGKILLed in the middle (the CLI stops with a stated reason, the agents'
// results are stored once after they reconnect) and while an agent is
// SIGKILLed in the middle of its check (the call ends with that node's
// reason, never hangs); then a check of the whole fleet passes on every
// node, none skipped.
func TestCheck(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetOpts{nodes: 4, longTools: 3 * time.Second})
	all := "gpu.inventory,gpu.ecc,ib.ports,nccl.allreduce"

	// The coordinator killed while every node runs nccl.allreduce.
	bg := f.background("check", "", "--checks", all, "--timeout", "1m", "-o", "json")
	testwait.Until(t, 20*time.Second, "every agent running the requested checks", func() bool {
		for _, a := range f.agents {
			if len(a.logLines("running requested checks")) == 0 {
				return false
			}
		}
		return true
	})

	f.killCoordinator("while every node runs nccl.allreduce")
	out, errOut, code := bg.wait(t, time.Minute)
	if code == 0 || strings.TrimSpace(errOut) == "" {
		t.Errorf("check across a coordinator kill: exit %d, stdout %q, stderr %q: want a failure with a reason", code, out, errOut)
	}
	t.Logf("check cut by the coordinator's kill: exit %d: %s", code, strings.TrimSpace(errOut))
	f.waitConnected(30*time.Second, "the agents back after the coordinator's restart")

	// An agent killed in the middle of its check.
	bg = f.background("check", "", "--checks", all, "--timeout", "30s", "-o", "json")
	victim := f.agent("gpu-002")
	runs := len(victim.logLines("running requested checks"))
	testwait.Until(t, 20*time.Second, "gpu-002 running the requested checks", func() bool {
		return len(victim.logLines("running requested checks")) > runs
	})

	f.restartAgent("gpu-002", syscall.SIGKILL, "in the middle of its requested check")
	out, errOut, code = bg.wait(t, 2*time.Minute)
	var res checkOut
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("check with an agent killed: exit %d: %v\n%s%s", code, err, out, errOut)
	}
	t.Logf("check with gpu-002 killed mid-check: exit %d, %d/%d done, %d failed, %d unreachable, %d timed out",
		code, res.Done, res.Total, res.Failed, res.Unreachable, res.TimedOut)
	if res.Total != 4 || len(res.Outcomes) != 4 {
		t.Errorf("check covered %d nodes (%d outcomes), want 4", res.Total, len(res.Outcomes))
	}
	for _, o := range res.Outcomes {
		if o.Node != "gpu-002" && o.Status != "pass" {
			t.Errorf("%s: %s %q; only gpu-002 was disturbed", o.Node, o.Status, o.Reason)
		}
		if o.Node == "gpu-002" && o.Status != "pass" && o.Reason == "" {
			t.Errorf("gpu-002 not passed without a reason: %+v", o)
		}
	}
	f.waitConnected(30*time.Second, "gpu-002 back")

	// Settled: every node checked, none skipped.
	res = jsonOf[checkOut](f, "check", "", "--checks", all, "--timeout", "1m")
	if res.Total != 4 || res.Done != 4 || res.Unreachable != 0 || res.TimedOut != 0 || res.Failed != 0 {
		t.Errorf("check of the settled fleet: %+v", res)
	}
	f.checkAckedStoredOnce()
}
