//go:build !node

package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/drain/slurm/slurmtest"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/internal/triage"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
)

// TestTriageEndToEnd: a job fails on a real Slurm node (slurmtest, with
// the job completion log sacct --completion reads) whose agent reports
// Xid 79 to a coordinator; `fleetcheck triage NODE --job ID` puts the
// job's end and the Xid on one timeline and calls it hardware, by the
// Xid 79 rule, with the coordinator's (shadow) remediation of GPU3 on the
// timeline. (The same failed job on a clean node is the application's:
// internal/triage's TestRealSlurm and TestBucket.)
func TestTriageEndToEnd(t *testing.T) {
	c := slurmtest.Start(t, slurmtest.Config{JobCompletion: true})
	t.Setenv("SLURM_CONF", c.Conf)

	node := e2eNode{name: slurmtest.NodeName, labels: map[string]string{"sku": "h100"}, interval: time.Second}
	node.faults = []sim.Fault{sim.Xid{GPU: 3, Code: 79}}
	f := newE2EFleet(t, newE2EClock(1), node)
	job := c.Submit("exit 3")
	testwait.For(t, 60*time.Second, "job "+job+" failed", func() (bool, string) {
		out, err := c.Run("scontrol", "show", "job", "-o", job)
		return err == nil && strings.Contains(out, "JobState=FAILED"), out
	})
	e2ePoll(f, 30*time.Second, "a gpu.xid result with Xid 79", func() string {
		return f.cli("results", slurmtest.NodeName, "--check", "gpu.xid")
	}, func(s string) bool { return strings.Contains(s, "XID_79") })

	// The coordinator's ladder (shadow mode) records what it would do.
	e2ePoll(f, 20*time.Second, "a shadow remediation for "+slurmtest.NodeName, func() remediationList {
		return e2eJSON[remediationList](f, "remediation", "list", "--node", slurmtest.NodeName)
	}, func(l remediationList) bool { return len(l.Remediations) > 0 })

	var rep triage.Report
	out := f.cli("triage", slurmtest.NodeName, "--job", job, "-o", "json")
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if rep.Bucket != triage.Hardware || rep.Rule != "xid 79: a hardware Xid in the catalog" {
		t.Fatalf("bucket %s by %q: %s\n%s", rep.Bucket, rep.Rule, rep.Reason, out)
	}
	var sawEnd, sawXid, sawRem bool
	for _, e := range rep.Timeline {
		sawRem = sawRem || (e.Kind == triage.KindRemediation && e.Component == "GPU3" && strings.Contains(e.Detail, "reboot"))
		sawEnd = sawEnd || (e.Kind == triage.KindJobEnd && e.Job == job && strings.Contains(e.Detail, "FAILED, exit code 3:0"))
		sawXid = sawXid || (e.Kind == triage.KindXid && e.Component == "GPU3" && strings.Contains(e.Detail, "Xid 79: GPU has fallen off the bus"))
	}
	if !sawEnd || !sawXid || !sawRem || len(rep.Jobs) != 1 || rep.Jobs[0].ID != job {
		t.Fatalf("timeline without the job's end, the Xid or the remediation (end %v, xid %v, remediation %v):\n%s", sawEnd, sawXid, sawRem, out)
	}

	// The table says the same to a person.
	table := f.cli("triage", slurmtest.NodeName, "--job", job)
	for _, want := range []string{"bucket:  hardware", "rule:    xid 79: a hardware Xid in the catalog", "ended FAILED, exit code 3:0", "Xid 79: GPU has fallen off the bus"} {
		if !strings.Contains(table, want) {
			t.Fatalf("table has no %q:\n%s", want, table)
		}
	}

	// No Slurm tools where the CLI runs: the timeline says so, and the
	// node's own evidence still decides.
	t.Setenv("PATH", t.TempDir())
	out = f.cli("triage", slurmtest.NodeName, "--slurm-bin", os.TempDir()+"/no-slurm-here", "-o", "json")
	rep = triage.Report{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if rep.Bucket != triage.Hardware || len(rep.Jobs) != 0 || !strings.Contains(strings.Join(rep.Notes, "\n"), "no Slurm tools answered") {
		t.Fatalf("without Slurm: bucket %s, %d jobs, notes %q", rep.Bucket, len(rep.Jobs), rep.Notes)
	}
}

func TestTriageFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"triage"}, "which node?"},
		{[]string{"triage", "n1", "--since", "10s", "--insecure"}, "--since 10s: want 1m0s..720h0m0s"},
		{[]string{"triage", "n1", "-o", "yaml", "--insecure"}, "-o must be table or json"},
		{[]string{"triage", "n1", "--job", strings.Repeat("9", 65), "--insecure"}, "at most 64 characters"},
	} {
		out, code := execute(t, tc.args...)
		if code != exitCommand || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d, want 2 with %q:\n%s", tc.args, code, tc.want, out)
		}
	}
}

// TestTriageBundle triages the shipped support bundles offline: the Xid 48
// (double-bit ECC) bundle is hardware by the catalog's Xid 48, the
// healthy one has nothing to say.
func TestTriageBundle(t *testing.T) {
	for _, tc := range []struct {
		bundle string
		bucket triage.Bucket
		rule   string
	}{
		{"h100-xid79-ecc", triage.Hardware, "xid 48: a hardware Xid in the catalog"},
		{"h100-healthy", triage.Unknown, "no fault"},
	} {
		out, code := execute(t, "triage", "--bundle", examples+"/bundles/"+tc.bundle, "--no-slurm", "-o", "json")
		var rep triage.Report
		if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil {
			t.Fatalf("%s: exit %d:\n%s", tc.bundle, code, out)
		}
		if rep.Node != tc.bundle || rep.Bucket != tc.bucket || rep.Rule != tc.rule {
			t.Errorf("%s: node %s, bucket %s by %q (%s)", tc.bundle, rep.Node, rep.Bucket, rep.Rule, rep.Reason)
		}
	}
	out, code := execute(t, "triage", "other-node", "--bundle", examples+"/bundles/h100-healthy", "--no-slurm")
	if code != exitCommand || !strings.Contains(out, `the bundle is of node "h100-healthy", not "other-node"`) {
		t.Fatalf("a bundle of another node: exit %d:\n%s", code, out)
	}
}
