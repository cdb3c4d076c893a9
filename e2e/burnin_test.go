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

type burninStatus struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	Phase     string `json:"phase"`
	Reason    string `json:"reason"`
	Nodes     int    `json:"nodes"`
	Accepted  int    `json:"accepted"`
	Rejected  int    `json:"rejected"`
	RunsDone  int    `json:"runs_done"`
	RunsTotal int    `json:"runs_total"`
}

type burninReport struct {
	Campaign burninStatus `json:"campaign"`
	Nodes    []struct {
		Node     string `json:"node"`
		State    string `json:"state"`
		Verdict  string `json:"verdict"`
		Evidence struct {
			Reasons []struct {
				Code    string `json:"code"`
				Message string `json:"message"`
				Check   string `json:"check"`
			} `json:"reasons"`
		} `json:"evidence"`
		Runs []struct {
			Step  string `json:"step"`
			State string `json:"state"`
		} `json:"runs"`
	} `json:"nodes"`
}

func (r burninReport) summary() string {
	var b []string
	for _, n := range r.Nodes {
		why := ""
		if len(n.Evidence.Reasons) > 0 {
			x := n.Evidence.Reasons[0]
			why = fmt.Sprintf(" (%s: %s; %d reasons)", x.Code, x.Message, len(n.Evidence.Reasons))
		}
		b = append(b, fmt.Sprintf("%s=%s/%s%s", n.Node, n.State, n.Verdict, why))
	}
	return r.Campaign.State + "/" + r.Campaign.Phase + " [" + strings.Join(b, " ") + "]"
}

func (f *fleet) burninReport(id string) (burninReport, bool) {
	var r burninReport
	ok := tryJSON(f, &r, "burnin", "report", id)
	return r, ok
}

// waitBurnin polls a burn-in's report across restarts until done says so.
func (f *fleet) waitBurnin(id string, within time.Duration, what string, done func(burninReport) bool) burninReport {
	f.t.Helper()
	var last burninReport
	testwait.ForEvery(f.t, within, 200*time.Millisecond, what, func() (bool, string) {
		r, ok := f.burninReport(id)
		if !ok {
			return false, last.summary()
		}
		last = r
		return done(r), last.summary()
	})
	return last
}

// running returns a node with a step running, "" when none is.
func (r burninReport) running() string {
	for _, n := range r.Nodes {
		for _, x := range n.Runs {
			if x.State == "running" {
				return n.Node
			}
		}
	}
	return ""
}

// TestBurnin: a burn-in at every level (quick, standard, extended: the
// built-in suites, the stress at its shortest, 1m) over four simulated
// nodes. In each, the coordinator is SIGKILLed while the nodes' steps run
// and one agent is SIGKILLed in the middle of its step. Each campaign
// must finish (done) with a verdict for every node, and accept the
// healthy nodes: a restart is no reason to reject. -short leaves out the
// extended level (its minute of stress).
func TestBurnin(t *testing.T) {
	t.Parallel()
	f := newFleet(t, fleetOpts{nodes: 4, longTools: 2 * time.Second})
	levels := []string{"quick", "standard", "extended"}
	if testing.Short() {
		levels = levels[:2] // extended takes its minute of stress
	}
	for i, level := range levels {
		stress := ""
		if level == "extended" {
			stress = "stress_duration: 1m\n" // the shortest a spec may ask for
		}
		spec := f.specFile("burnin-"+level+".yaml", fmt.Sprintf(`
name: e2e-%s
selector: "sku=h100"
level: %s
repeats: 1
%soutlier: {min_peers: 4}
baseline: {missing: peers}
who: oncall@example.com
`, level, level, stress))
		id := startedID(t, "burnin", f.ok("burnin", "start", "-f", spec))
		f.waitBurnin(id, time.Minute, "a step running", func(r burninReport) bool {
			return r.running() != "" || r.Campaign.State != "running"
		})
		f.killCoordinator("while " + level + " burn-in steps run")
		victim := nodeName(1 + i%4)
		mid := false
		f.waitBurnin(id, time.Minute, victim+" running a step", func(r burninReport) bool {
			for _, n := range r.Nodes {
				if n.Node != victim {
					continue
				}
				for _, x := range n.Runs {
					if x.State == "running" {
						mid = true
						return true
					}
				}
				return n.State == "done" || n.Verdict != ""
			}
			return r.Campaign.State != "running"
		})
		when := "in the middle of its " + level + " burn-in step"
		if !mid {
			when = "after its " + level + " burn-in steps (none seen running)"
		}
		f.restartAgent(victim, syscall.SIGKILL, when)
		r := f.waitBurnin(id, 5*time.Minute, "the "+level+" burn-in to finish", func(r burninReport) bool {
			return r.Campaign.State != "running"
		})
		t.Logf("burn-in %s (%s) ended %s", id, level, r.summary())
		if r.Campaign.State != "done" {
			t.Errorf("%s burn-in ended %s: %s", level, r.Campaign.State, r.Campaign.Reason)
		}
		var bad []string
		for _, n := range r.Nodes {
			if n.Verdict != "accepted" {
				bad = append(bad, n.Node)
			}
		}
		if len(bad) > 0 || len(r.Nodes) != 4 {
			t.Errorf("%s burn-in: %d nodes, not accepted: %v (healthy nodes, only restarted)", level, len(r.Nodes), bad)
		}
		f.waitConnected(time.Minute, "the fleet settled after the "+level+" burn-in")
	}
	f.checkAckedStoredOnce()
}
