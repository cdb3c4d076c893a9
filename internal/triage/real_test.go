package triage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/drain/slurm/slurmtest"
	"github.com/fleetcheck/fleetcheck/internal/needs"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// TestRealSlurm runs jobs on a real slurmctld and slurmd (slurmtest, with
// the job completion log and no accounting database, as sacct --completion
// reads it) and triages them: what sacct and scontrol really print, not
// what a fake says they print.
func TestRealSlurm(t *testing.T) {
	needs.Tool(t, "sacct", "apt-get install slurm-client")
	c := slurmtest.Start(t, slurmtest.Config{JobCompletion: true})
	s := Slurm{Env: c.Env, Timeout: 20 * time.Second}
	ctx := context.Background()
	node := slurmtest.NodeName
	since := time.Now().Add(-time.Hour)

	ok := c.Submit("true")
	bad := c.Submit("exit 3")
	long := c.Submit("sleep 600")
	ended := func(id string) func() (bool, string) {
		return func() (bool, string) {
			jobs, notes, err := s.Jobs(ctx, node, id, since)
			if err != nil {
				return false, err.Error()
			}
			for _, j := range jobs {
				if j.ID == id && j.Ended() {
					return true, j.State
				}
			}
			return false, strings.Join(notes, "; ")
		}
	}
	testwait.For(t, 60*time.Second, "job "+bad+" ended", ended(bad))
	testwait.For(t, 60*time.Second, "job "+long+" running", func() (bool, string) {
		jobs, _, err := s.Jobs(ctx, node, long, since)
		if err != nil || len(jobs) != 1 {
			return false, "no job"
		}
		return jobs[0].BaseState() == "RUNNING", jobs[0].State
	})
	c.MustRun("scancel", long)
	testwait.For(t, 60*time.Second, "job "+long+" cancelled", ended(long))

	// Fixtures for the parser tests, refreshed with UPDATE_GOLDEN=1.
	if os.Getenv("UPDATE_GOLDEN") != "" {
		out := c.MustRun("sacct", "--completion", "--parsable2", "-X", "--format", strings.Join(SacctFields, ","), "-j", ok+","+bad+","+long)
		writeFixture(t, "sacct-completion.txt", out)
		writeFixture(t, "scontrol-show-job.txt", c.MustRun("scontrol", "show", "job", "-o"))
	}

	t.Run("the failed job is the application's", func(t *testing.T) {
		jobs, notes, err := s.Jobs(ctx, node, bad, since)
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs) != 1 || jobs[0].BaseState() != "FAILED" || jobs[0].ExitCode != "3:0" || !contains(jobs[0].Nodes, node) {
			t.Fatalf("job %s = %+v (notes %v)", bad, jobs, notes)
		}
		// A clean gpu.xid and gpu.ecc during the job.
		at := jobs[0].End
		rep := Build(Input{Node: node, Job: bad, Jobs: jobs, Results: []Result{
			{Node: node, At: at, Check: report.CheckResult{Name: "gpu.xid", Status: report.Pass}},
			{Node: node, At: at, Check: report.CheckResult{Name: "gpu.ecc", Status: report.Pass}},
		}})
		if rep.Bucket != Application || rep.Rule != "job state FAILED without a hardware fault" {
			t.Fatalf("bucket %s by %q: %s", rep.Bucket, rep.Rule, rep.Reason)
		}
		// slurmctld still holds the job, so its reason is there too.
		if !hasEntry(rep.Timeline, KindJobEnd, "job "+bad+" (wrap) ended FAILED, exit code 3:0, reason NonZeroExitCode") {
			t.Fatalf("timeline has no job end: %+v", rep.Timeline)
		}
	})

	t.Run("an Xid 79 during the failed job makes it hardware", func(t *testing.T) {
		jobs, _, err := s.Jobs(ctx, node, bad, since)
		if err != nil {
			t.Fatal(err)
		}
		rep := Build(Input{Node: node, Job: bad, Jobs: jobs, Results: []Result{{Node: node, At: jobs[0].End.Add(time.Minute),
			Check: report.CheckResult{Name: "gpu.xid", Status: report.Fail, Findings: []report.Finding{xid79(jobs[0].End)}}}}})
		if rep.Bucket != Hardware || rep.Rule != "xid 79: a hardware Xid in the catalog" {
			t.Fatalf("bucket %s by %q: %s", rep.Bucket, rep.Rule, rep.Reason)
		}
	})

	t.Run("the cancelled job is the scheduler's", func(t *testing.T) {
		jobs, _, err := s.Jobs(ctx, node, long, since)
		if err != nil {
			t.Fatal(err)
		}
		rep := Build(Input{Node: node, Job: long, Jobs: jobs})
		if rep.Bucket != Scheduling || rep.Rule != "job state CANCELLED without a hardware fault" {
			t.Fatalf("bucket %s by %q: %s (jobs %+v)", rep.Bucket, rep.Rule, rep.Reason, jobs)
		}
	})

	t.Run("the node's jobs since", func(t *testing.T) {
		jobs, notes, err := s.Jobs(ctx, node, "", since)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, j := range jobs {
			got[j.ID] = j.BaseState()
		}
		want := map[string]string{ok: "COMPLETED", bad: "FAILED", long: "CANCELLED"}
		for id, st := range want {
			if got[id] != st {
				t.Fatalf("node's jobs = %v, want %v (notes %v)", got, want, notes)
			}
		}
	})

	// only is a --slurm-bin directory holding only some of the tools.
	only := func(t *testing.T, tools ...string) string {
		bin := t.TempDir()
		for _, tool := range tools {
			path, err := exec.LookPath(tool)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(path, filepath.Join(bin, tool)); err != nil {
				t.Fatal(err)
			}
		}
		return bin
	}

	t.Run("sacct alone reads the job completion log", func(t *testing.T) {
		s := Slurm{Bin: only(t, "sacct"), Env: c.Env, Timeout: 20 * time.Second}
		jobs, notes, err := s.Jobs(ctx, node, bad, since)
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs) != 1 || jobs[0].BaseState() != "FAILED" || jobs[0].ExitCode != "3:0" || jobs[0].From != "sacct --completion" ||
			!strings.Contains(strings.Join(notes, ";"), "scontrol not found") {
			t.Fatalf("jobs %+v, notes %v", jobs, notes)
		}
	})

	t.Run("without sacct, slurmctld's jobs", func(t *testing.T) {
		s := Slurm{Bin: only(t, "scontrol", "squeue"), Env: c.Env, Timeout: 20 * time.Second}
		jobs, notes, err := s.Jobs(ctx, node, "", since)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, j := range jobs {
			got[j.ID] = j.BaseState() + " " + j.From
		}
		if got[bad] != "FAILED scontrol" || got[long] != "CANCELLED scontrol" || !strings.Contains(strings.Join(notes, ";"), "sacct not found") {
			t.Fatalf("jobs %v, notes %v", got, notes)
		}
	})

	t.Run("a drain shows with who set it", func(t *testing.T) {
		c.MustRun("scontrol", "update", "nodename="+node, "state=drain", "reason=fleetcheck: gpu.xid: Xid 79")
		defer c.MustRun("scontrol", "update", "nodename="+node, "state=resume")
		e, err := s.Node(ctx, node)
		if err != nil {
			t.Fatal(err)
		}
		if e == nil || e.At.IsZero() || !strings.Contains(e.Detail, `"fleetcheck: gpu.xid: Xid 79" (by root)`) {
			t.Fatalf("drain entry = %+v", e)
		}
	})
}

func writeFixture(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join("testdata", name), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func hasEntry(tl []Entry, kind, detail string) bool {
	for _, e := range tl {
		if e.Kind == kind && e.Detail == detail {
			return true
		}
	}
	return false
}

func xid79(at time.Time) report.Finding {
	return report.Finding{Severity: report.SevFail, Component: "GPU3", PCIBusID: "0000:9B:00.0", Code: "XID_79", Action: report.ActionReboot,
		Message: "Xid 79 (GPU has fallen off the bus) 1 time at " + at.UTC().Format(time.RFC3339) + ": GPU has fallen off the bus.; NVIDIA: RESTART_BM"}
}

// TestRealSlurmAccounting: the same with slurmdbd over a real MariaDB, so
// plain sacct answers from the accounting database, job steps and all.
func TestRealSlurmAccounting(t *testing.T) {
	c := slurmtest.Start(t, slurmtest.Config{Accounting: true})
	ctx := context.Background()
	node := slurmtest.NodeName
	since := time.Now().Add(-time.Hour)
	bad := c.Submit("exit 3")
	bin := t.TempDir()
	path, err := exec.LookPath("sacct")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(path, filepath.Join(bin, "sacct")); err != nil {
		t.Fatal(err)
	}
	// sacct alone: what the database says, not slurmctld.
	s := Slurm{Bin: bin, Env: c.Env, Timeout: 20 * time.Second}
	var jobs []Job
	testwait.For(t, 60*time.Second, "job "+bad+" FAILED in the accounting database", func() (bool, string) {
		var notes []string
		jobs, notes, err = s.Jobs(ctx, node, bad, since)
		if err != nil {
			return false, err.Error()
		}
		return len(jobs) == 1 && jobs[0].Ended(), fmt.Sprintf("%+v %v", jobs, notes)
	})
	if j := jobs[0]; j.BaseState() != "FAILED" || j.ExitCode != "3:0" || j.From != "sacct" || !contains(j.Nodes, node) || j.Start.IsZero() {
		t.Fatalf("job = %+v", j)
	}
	if os.Getenv("UPDATE_GOLDEN") != "" {
		writeFixture(t, "sacct-slurmdbd.txt", c.MustRun("sacct", "--parsable2", "--format", strings.Join(SacctFields, ","), "-j", bad))
	}
	rep := Build(Input{Node: node, Job: bad, Jobs: jobs})
	if rep.Bucket != Application || rep.Rule != "job state FAILED without a hardware fault" {
		t.Fatalf("bucket %s by %q: %s", rep.Bucket, rep.Rule, rep.Reason)
	}
}
