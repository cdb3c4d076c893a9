//go:build !node

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/triage"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/inspect"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Bounds of triage's flags and of what it asks the coordinator for.
const (
	triageMinSince     = time.Minute
	triageMaxSince     = 30 * 24 * time.Hour
	triageResultLimit  = 10000 // the store's most rows per call
	triageEventLimit   = 1000
	triagePeerLimit    = 200 // gpu.xid results per other node of the job
	triagePeerParallel = 8
	// triageRemediationEvents bounds the event log lines per remediation.
	triageRemediationEvents = 100
)

type triageFlags struct {
	op       opFlags
	job      string
	since    time.Duration
	slurmBin string
	noSlurm  bool
	bundle   string
}

func newTriageCmd() *cobra.Command {
	var f triageFlags
	cmd := &cobra.Command{
		Use:   "triage NODE [--job ID] [--since DUR] [-o table|json]",
		Short: "One timeline of a node's jobs, Xids, GPU state and drains, and the bucket: hardware, scheduling or application",
		Long: `Triage a node the way operators do by hand, in one view: the scheduler's job
state (Slurm: sacct, or sacct --completion where there is no accounting
database, and scontrol for live jobs), the kernel's Xid events with their
catalog meaning, the GPU and network checks' state changes, and the drains
(the coordinator's events and Slurm's node reason), on one timeline sorted by
time. Then the bucket, with the rule that named it:

  hardware     an Xid the catalog calls hardware or that fails the node (79,
               48, 94, 95, ...), a failed GPU/IB check finding (uncorrectable
               ECC, ...), or an escalation rule (Xid 13 three times in an hour
               on one GPU, a correctable ECC rate, a flapping IB port)
  application  application Xids (13, 31, 43, 45) at the same moment on many
               nodes of the job (the correlation rule), a job that FAILED or
               ran OUT_OF_MEMORY on a node without a fault, or an application
               Xid on this node alone
  scheduling   TIMEOUT, PREEMPTED, CANCELLED, NODE_FAIL, ... without a fault
  unknown      nothing above

The node's results and events come from the coordinator (--coordinator, as for
'results'), or from a support bundle with --bundle PATH (offline: the checks
run on the bundle). Slurm's tools are run where the CLI runs (--slurm-bin DIR,
else PATH; SLURM_CONF is passed on); without them the timeline has no jobs and
says so. The exit status is 0 whatever the bucket; 2 when it could not run.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			node := ""
			if len(args) == 1 {
				node = args[0]
			}
			return f.run(cmd, node)
		},
	}
	f.op.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&f.job, "job", "", "the Slurm job to triage (default: the node's newest job that did not complete)")
	fl.DurationVar(&f.since, "since", 24*time.Hour, "how far back the timeline goes (1m..720h; widened to the job's start)")
	fl.StringVar(&f.slurmBin, "slurm-bin", "", "directory of sacct, scontrol (default: PATH)")
	fl.BoolVar(&f.noSlurm, "no-slurm", false, "do not ask Slurm")
	fl.StringVar(&f.bundle, "bundle", "", "triage a support bundle (directory or .tar.gz) instead of the coordinator's records")
	return cmd
}

func (f *triageFlags) run(cmd *cobra.Command, node string) error {
	if f.since < triageMinSince || f.since > triageMaxSince {
		return fmt.Errorf("--since %s: want %s..%s", f.since, triageMinSince, triageMaxSince)
	}
	if f.op.output != "table" && f.op.output != "json" {
		return fmt.Errorf("-o must be table or json, not %q", f.op.output)
	}
	if len(f.job) > 64 {
		return fmt.Errorf("--job %.20q...: at most 64 characters", f.job)
	}
	if node == "" && f.bundle == "" {
		return errors.New("which node? fleetcheck triage NODE (or --bundle PATH)")
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	now := time.Now()
	in := triage.Input{Node: node, Job: f.job, Since: now.Add(-f.since), Until: now}

	var pc pb.OperatorServiceClient
	if f.bundle != "" {
		if err := f.fromBundle(ctx, &in); err != nil {
			return err
		}
	} else {
		if err := f.op.validate(); err != nil {
			return err
		}
		cc, err := f.op.conn()
		if err != nil {
			return err
		}
		defer cc.Close()
		pc = pb.NewOperatorServiceClient(cc)
		if err := f.fromCoordinator(ctx, pc, &in); err != nil {
			return err
		}
		f.remediations(ctx, pb.NewRemediationServiceClient(cc), &in)
	}

	if !f.noSlurm {
		s := triage.Slurm{Bin: f.slurmBin, Timeout: callTimeout}
		jobs, notes, err := s.Jobs(ctx, in.Node, f.job, in.Since)
		in.Notes = append(in.Notes, notes...)
		switch {
		case errors.Is(err, triage.ErrNoSlurm):
			in.Notes = append(in.Notes, "no Slurm tools answered: the timeline has no jobs")
		case err != nil:
			in.Notes = append(in.Notes, "slurm: "+err.Error())
		default:
			in.Jobs = jobs
			if d, err := s.Node(ctx, in.Node); err == nil && d != nil {
				in.Entries = append(in.Entries, *d)
			}
		}
	}
	if pc != nil {
		in.Peers, in.Notes = f.peers(ctx, pc, in)
	}

	rep := triage.Build(in)
	out := cmd.OutOrStdout()
	if f.op.output == "json" {
		return writeJSON(out, rep)
	}
	return wrote(triage.WriteTable(out, rep, time.Local))
}

// fromCoordinator reads the node's results and events.
func (f *triageFlags) fromCoordinator(ctx context.Context, c pb.OperatorServiceClient, in *triage.Input) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	res, err := c.ListResults(cctx, &pb.ListResultsRequest{Node: in.Node, Limit: triageResultLimit})
	if err != nil {
		return f.op.rpcError(err)
	}
	for _, r := range res.Results {
		at := time.UnixMilli(r.FinishedUnixMs)
		if at.Before(in.Since) && f.job == "" {
			continue
		}
		in.Results = append(in.Results, triage.Result{Node: r.Node, At: at, Check: wire.CheckFromProto(r.Check)})
	}
	if len(res.Results) == triageResultLimit {
		in.Notes = append(in.Notes, fmt.Sprintf("the coordinator gave its newest %d results; older ones are not on the timeline", triageResultLimit))
	}
	if len(res.Results) == 0 {
		in.Notes = append(in.Notes, "the coordinator holds no results of "+in.Node)
	}
	evs, err := c.ListEvents(cctx, &pb.ListEventsRequest{Node: in.Node, Limit: triageEventLimit})
	if err != nil {
		return f.op.rpcError(err)
	}
	for _, e := range evs.Events {
		in.Events = append(in.Events, triage.Event{At: time.UnixMilli(e.UnixMs), Kind: e.Kind, Actor: e.Actor, Message: e.Message})
	}
	return nil
}

// remediations puts the coordinator's remediations of the node on the
// timeline (created, each step of its event log) and passes on its job
// events, the remediation engine's own correlation verdicts. An older
// coordinator, or one that refuses, costs a note.
func (f *triageFlags) remediations(ctx context.Context, c pb.RemediationServiceClient, in *triage.Input) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	d, err := c.RemediationList(cctx, &pb.RemediationListRequest{Node: in.Node})
	if err != nil {
		in.Notes = append(in.Notes, "remediations not read: "+f.op.rpcError(err).Error())
		return
	}
	var l remediationList
	if err := json.Unmarshal(d.GetBody(), &l); err != nil {
		in.Notes = append(in.Notes, "remediations not read: coordinator sent bad JSON: "+err.Error())
		return
	}
	for _, r := range l.Remediations {
		what := fmt.Sprintf("%s %s on %s (%s): %s", r.ID, r.Step, orDash(r.Component), r.Mode, orDash(r.Trigger.Reason))
		in.Entries = append(in.Entries, triage.Entry{At: r.CreatedAt, Source: triage.SourceRemediation, Kind: triage.KindRemediation,
			Node: r.Node, Component: r.Component, Detail: what})
		evs := r.Events
		if len(evs) > triageRemediationEvents {
			evs = evs[len(evs)-triageRemediationEvents:]
		}
		for _, e := range evs {
			in.Entries = append(in.Entries, triage.Entry{At: e.At, Source: triage.SourceRemediation, Kind: triage.KindRemediation,
				Node: r.Node, Component: r.Component, Detail: r.ID + ": " + e.What})
		}
	}
	for _, j := range l.JobEvents {
		in.JobEvents = append(in.JobEvents, triage.JobEvent{At: j.At, Job: j.Job, Xid: j.Xid, Nodes: j.Nodes, Reason: j.Reason})
	}
}

// peers reads the gpu.xid results of the job's other nodes, for the
// correlation rule; a node the coordinator does not know is left out.
func (f *triageFlags) peers(ctx context.Context, c pb.OperatorServiceClient, in triage.Input) ([]triage.Result, []string) {
	notes := in.Notes
	var nodes []string
	seen := map[string]bool{in.Node: true}
	for _, j := range in.Jobs {
		if f.job != "" && j.ID != f.job {
			continue
		}
		for _, n := range j.Nodes {
			if !seen[n] && len(nodes) < triage.MaxJobNodes {
				seen[n] = true
				nodes = append(nodes, n)
			}
		}
	}
	if len(nodes) == 0 {
		return nil, notes
	}
	var mu sync.Mutex
	var out []triage.Result
	failed := 0
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(triagePeerParallel, len(nodes)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range work {
				cctx, cancel := context.WithTimeout(ctx, callTimeout)
				res, err := c.ListResults(cctx, &pb.ListResultsRequest{Node: n, Check: "gpu.xid", Limit: triagePeerLimit})
				cancel()
				mu.Lock()
				if err != nil {
					failed++
				} else {
					for _, r := range res.Results {
						out = append(out, triage.Result{Node: r.Node, At: time.UnixMilli(r.FinishedUnixMs), Check: wire.CheckFromProto(r.Check)})
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, n := range nodes {
		work <- n
	}
	close(work)
	wg.Wait()
	if failed > 0 {
		notes = append(notes, fmt.Sprintf("the Xids of %d of the job's %d other nodes could not be read", failed, len(nodes)))
	}
	return out, notes
}

// fromBundle runs every check whose data the bundle holds and takes the
// report as one result per check at the bundle's collection time.
func (f *triageFlags) fromBundle(ctx context.Context, in *triage.Input) error {
	b, err := bundle.Open(f.bundle)
	if err != nil {
		return err
	}
	list, err := checks.Select(registry.All(), nil, true)
	if err != nil {
		return err
	}
	res := inspect.Run(ctx, b, inspect.Options{Checks: list})
	rep := res.Report
	if in.Node == "" {
		in.Node = rep.Node
	} else if rep.Node != "" && rep.Node != in.Node {
		return fmt.Errorf("the bundle is of node %q, not %q", rep.Node, in.Node)
	}
	at := in.Until
	if t, err := time.Parse(time.RFC3339, rep.CollectedAt); err == nil {
		at = t
	}
	// A bundle is one moment: the window reaches back from it.
	in.Until = at
	in.Since = at.Add(-f.since)
	for _, c := range rep.Checks {
		in.Results = append(in.Results, triage.Result{Node: in.Node, At: at, Check: c})
	}
	in.Notes = append(in.Notes, "from the support bundle "+f.bundle+" (collected "+at.UTC().Format(time.RFC3339)+"): one result per check, Xids at their kernel time")
	return nil
}
