// Package triage puts what is known about one node (and, optionally, one
// of its jobs) on one timeline and names the bucket a failure falls in:
// hardware, scheduling or application (DOMAIN.md "Triage in three
// minutes"). It is the operator's by-hand triage done the same way: the
// scheduler's job state (Slurm's sacct or scontrol), the kernel's Xid
// events with their catalog meaning, the GPU checks' state changes and the
// coordinator's drains, sorted by time.
//
// The package is pure: the caller gathers jobs, check results and events
// (cmd/fleetcheck from the coordinator and Slurm, or from a support
// bundle) and Build decides. What counts as a fault comes from the Xid
// catalog (internal/xid) and the escalation and correlation rules
// (internal/escalate): application Xids on many nodes of one job at once
// are the job's crash, the same verdict the remediation engine reaches.
package triage

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/escalate"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/xid"
)

// Bucket is where a failure lands.
type Bucket string

// Buckets.
const (
	Hardware    Bucket = "hardware"
	Scheduling  Bucket = "scheduling"
	Application Bucket = "application"
	Unknown     Bucket = "unknown"
)

// Timeline sources: who said it.
const (
	SourceSlurm       = "slurm"
	SourceKernel      = "kernel"
	SourceCheck       = "check"
	SourceCoordinator = "coordinator"
	SourceRule        = "rule"
	SourceRemediation = "remediation"
)

// Timeline entry kinds.
const (
	KindJobStart    = "job_start"
	KindJobEnd      = "job_end"
	KindJobState    = "job_state" // a live job: submitted, running, pending
	KindXid         = "xid"
	KindCheckChange = "check_change"
	KindNodeEvent   = "node_event"
	KindDrain       = "drain"
	KindVerdict     = "verdict"
	KindRemediation = "remediation"
)

// Job is one scheduler job as sacct or scontrol shows it.
type Job struct {
	ID    string `json:"id"`
	Name  string `json:"name,omitempty"`
	State string `json:"state"` // COMPLETED, FAILED, TIMEOUT, CANCELLED by 0, ...
	// ExitCode is Slurm's "exit:signal" of the batch script.
	ExitCode string    `json:"exit_code,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Submit   time.Time `json:"submit,omitzero"`
	Start    time.Time `json:"start,omitzero"`
	End      time.Time `json:"end,omitzero"`
	// Nodes are the job's nodes, expanded ("gpu[1-2]" → gpu1, gpu2).
	Nodes []string `json:"nodes,omitempty"`
	// From says which tool reported it: sacct, "sacct --completion"
	// (the job completion log, no accounting database), scontrol.
	From string `json:"from"`
}

// BaseState is State without Slurm's qualifier ("CANCELLED by 0" →
// CANCELLED) and without a trailing "+" (sacct's truncation mark).
func (j Job) BaseState() string {
	s, _, _ := strings.Cut(strings.TrimSpace(j.State), " ")
	return strings.TrimRight(strings.ToUpper(s), "+")
}

// Ended reports whether the job is over: a final state, not running,
// pending, suspended or still completing.
func (j Job) Ended() bool {
	switch j.BaseState() {
	case "", "RUNNING", "PENDING", "COMPLETING", "CONFIGURING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "RESV_DEL_HOLD", "REVOKED":
		return false
	}
	return true
}

// Result is one stored check result of a node.
type Result struct {
	Node  string             `json:"node"`
	At    time.Time          `json:"at"`
	Check report.CheckResult `json:"check"`
}

// Event is one coordinator event of the node (state changes with their
// reasons, drains, operator actions).
type Event struct {
	At      time.Time `json:"at"`
	Kind    string    `json:"kind"`
	Actor   string    `json:"actor,omitempty"`
	Message string    `json:"message"`
}

// Input is everything known, gathered by the caller.
type Input struct {
	Node string
	// Job is the job asked about ("" when none was named).
	Job string
	// Since and Until bound the timeline (Until zero: no bound).
	Since, Until time.Time
	// Jobs are the scheduler's jobs on the node (and the named one).
	Jobs []Job
	// Results are the node's check results.
	Results []Result
	// Peers are gpu.xid results of the other nodes of the job, for the
	// correlation rule (one crash prints application Xids everywhere).
	Peers []Result
	// Events are the coordinator's events of the node.
	Events []Event
	// Entries are more timeline lines the caller gathered: the drain the
	// scheduler holds (scontrol's node Reason), the coordinator's
	// remediations of the node.
	Entries []Entry
	// JobEvents are the coordinator's own correlation verdicts (its
	// remediation engine, with its configured rules): application Xids on
	// many nodes at once, one job's crash.
	JobEvents []JobEvent
	// Rules are the escalation and correlation rules (the coordinator's
	// remediation.rules); zero takes their defaults.
	Rules escalate.Config
	// Notes say what could not be read (no sacct, no coordinator ...).
	Notes []string
}

// JobEvent is the remediation engine's verdict that application Xids on
// many nodes at once were one job's crash.
type JobEvent struct {
	At     time.Time
	Job    string
	Xid    int
	Nodes  []string
	Reason string
}

// Entry is one line of the timeline.
type Entry struct {
	At        time.Time `json:"at"`
	Source    string    `json:"source"`
	Kind      string    `json:"kind"`
	Node      string    `json:"node,omitempty"`
	Component string    `json:"component,omitempty"`
	Job       string    `json:"job,omitempty"`
	Detail    string    `json:"detail"`
}

// Report is the triage of a node.
type Report struct {
	Node  string    `json:"node"`
	Job   string    `json:"job,omitempty"`
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	// Bucket is the verdict; Rule names the rule that decided it and
	// Reason says it in words, with the evidence.
	Bucket   Bucket   `json:"bucket"`
	Rule     string   `json:"rule"`
	Reason   string   `json:"reason"`
	Jobs     []Job    `json:"jobs"`
	Timeline []Entry  `json:"timeline"`
	Notes    []string `json:"notes,omitempty"`
}

// Bounds of what Build reads: a node's history over days can be long.
const (
	MaxJobs     = 1000
	MaxResults  = 20000
	MaxTimeline = 5000
)

// jobSlack widens a job's window: the kernel logs a GPU's fault a moment
// before the job's end is recorded, and the agent's next result comes up
// to one check interval later.
const jobSlack = 10 * time.Minute

// fault is a hardware finding on the node.
type fault struct {
	at   time.Time
	rule string
	why  string
}

// Build puts the input on one timeline and names the bucket.
func Build(in Input) Report {
	rules := in.Rules.WithDefaults()
	rep := Report{Node: in.Node, Job: in.Job, Since: in.Since, Until: in.Until, Notes: append([]string(nil), in.Notes...)}
	jobs := in.Jobs
	if len(jobs) > MaxJobs {
		jobs = jobs[:MaxJobs]
		rep.Notes = append(rep.Notes, fmt.Sprintf("only the first %d jobs are read", MaxJobs))
	}
	rep.Jobs = append([]Job{}, jobs...)
	sort.SliceStable(rep.Jobs, func(i, j int) bool { return jobTime(rep.Jobs[i]).Before(jobTime(rep.Jobs[j])) })

	// The job the verdict is about: the named one, else the newest that
	// did not complete, else the newest.
	job, haveJob := pickJob(rep.Jobs, in.Job)
	if in.Job != "" && !haveJob {
		rep.Notes = append(rep.Notes, fmt.Sprintf("job %s: the scheduler did not report it", in.Job))
	}
	// A job older than the window widens it: its start belongs on the
	// timeline.
	if haveJob {
		if from, _ := jobWindow(job); !from.IsZero() && !rep.Since.IsZero() && from.Before(rep.Since) {
			rep.Since = from
		}
	}
	results := bound(in.Results, &rep)
	peers := bound(in.Peers, &rep)
	in.Since, in.Until = rep.Since, rep.Until

	var tl []Entry
	for _, j := range rep.Jobs {
		tl = append(tl, jobEntries(j, in.Node)...)
	}
	xids := xidEntries(in.Node, results, in)
	tl = append(tl, xids...)
	tl = append(tl, checkChanges(in.Node, results, in)...)
	for _, e := range in.Events {
		if in.inWindow(e.At) {
			tl = append(tl, Entry{At: e.At, Source: SourceCoordinator, Kind: nodeEventKind(e), Node: in.Node, Detail: eventDetail(e)})
		}
	}
	for _, d := range in.Entries {
		if d.At.IsZero() || in.inWindow(d.At) {
			tl = append(tl, d)
		}
	}

	// A named job narrows the evidence to its own time; without one the
	// question is the node's, and a fault anywhere in the window counts
	// (the job rules still read the job picked).
	from, to := in.Since, in.Until
	if haveJob && in.Job != "" {
		from, to = jobWindow(job)
	}
	during := func(t time.Time) bool {
		return (from.IsZero() || !t.Before(from)) && (to.IsZero() || !t.After(to))
	}

	verdicts := escalateVerdicts(in.Node, results, peers, job, haveJob, rules)
	for _, je := range in.JobEvents {
		verdicts = append(verdicts, escalate.Verdict{Kind: escalate.JobEvent, At: je.At, Nodes: je.Nodes, Job: je.Job, Xid: je.Xid,
			Rule: "correlate: the coordinator's job event", Reason: je.Reason})
	}
	for _, v := range verdicts {
		if v.Node == in.Node || contains(v.Nodes, in.Node) {
			if in.inWindow(v.At) {
				tl = append(tl, Entry{At: v.At, Source: SourceRule, Kind: KindVerdict, Node: in.Node, Component: v.Component, Job: v.Job, Detail: v.Rule + ": " + v.Reason})
			}
		}
	}

	rep.Bucket, rep.Rule, rep.Reason = decide(in.Node, results, verdicts, job, haveJob, during)

	sortTimeline(tl)
	if len(tl) > MaxTimeline {
		rep.Notes = append(rep.Notes, fmt.Sprintf("timeline cut to its newest %d entries", MaxTimeline))
		tl = tl[len(tl)-MaxTimeline:]
	}
	rep.Timeline = append([]Entry{}, tl...)
	return rep
}

func bound(rs []Result, rep *Report) []Result {
	if len(rs) > MaxResults {
		rep.Notes = append(rep.Notes, fmt.Sprintf("only the newest %d check results are read", MaxResults))
		rs = append([]Result(nil), rs...)
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].At.After(rs[j].At) })
		rs = rs[:MaxResults]
	}
	out := append([]Result(nil), rs...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

func (in Input) inWindow(t time.Time) bool {
	return (in.Since.IsZero() || !t.Before(in.Since)) && (in.Until.IsZero() || !t.After(in.Until))
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func jobTime(j Job) time.Time {
	switch {
	case !j.Start.IsZero():
		return j.Start
	case !j.Submit.IsZero():
		return j.Submit
	}
	return j.End
}

func jobWindow(j Job) (from, to time.Time) {
	from = jobTime(j)
	if !from.IsZero() {
		from = from.Add(-jobSlack)
	}
	if !j.End.IsZero() {
		to = j.End.Add(jobSlack)
	}
	return from, to
}

func pickJob(jobs []Job, id string) (Job, bool) {
	if id != "" {
		for _, j := range jobs {
			if j.ID == id {
				return j, true
			}
		}
		return Job{}, false
	}
	for i := len(jobs) - 1; i >= 0; i-- {
		if jobs[i].Ended() && jobs[i].BaseState() != "COMPLETED" {
			return jobs[i], true
		}
	}
	if len(jobs) > 0 {
		return jobs[len(jobs)-1], true
	}
	return Job{}, false
}

func jobEntries(j Job, node string) []Entry {
	var out []Entry
	what := "job " + j.ID
	if j.Name != "" {
		what += " (" + j.Name + ")"
	}
	nodes := ""
	if len(j.Nodes) > 0 {
		nodes = fmt.Sprintf(" on %d node(s)", len(j.Nodes))
	}
	if !j.Start.IsZero() {
		out = append(out, Entry{At: j.Start, Source: SourceSlurm, Kind: KindJobStart, Node: node, Job: j.ID, Detail: what + " started" + nodes})
	}
	switch {
	case !j.End.IsZero():
		d := fmt.Sprintf("%s ended %s", what, j.State)
		if j.ExitCode != "" {
			d += ", exit code " + j.ExitCode
		}
		if j.Reason != "" && j.Reason != "None" {
			d += ", reason " + j.Reason
		}
		out = append(out, Entry{At: j.End, Source: SourceSlurm, Kind: KindJobEnd, Node: node, Job: j.ID, Detail: d})
	case j.Start.IsZero() && !j.Submit.IsZero():
		out = append(out, Entry{At: j.Submit, Source: SourceSlurm, Kind: KindJobState, Node: node, Job: j.ID, Detail: fmt.Sprintf("%s submitted, %s (%s)", what, j.State, orNone(j.Reason))})
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}

// xidTime is the kernel's time of an Xid in a gpu.xid finding's message
// ("... 1 time at 2026-12-02T05:13:32Z: ..." or "from A to B"): the last
// one, which the rules count at.
var xidTime = regexp.MustCompile(`\b(?:at|to) (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z)`)

// xidAt is when an Xid of a finding happened: its kernel time, else when
// the result that reported it finished.
func xidAt(f report.Finding, resultAt time.Time) time.Time {
	if m := xidTime.FindStringSubmatch(f.Message); m != nil {
		if t, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
			return t
		}
	}
	return resultAt
}

func xidCode(f report.Finding) (int, bool) {
	s, ok := strings.CutPrefix(f.Code, "XID_")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// xidMeaning is the catalog's word for an Xid, and what it points at.
func xidMeaning(code int) string {
	e, _ := xid.Lookup(code)
	what := e.Description
	if what == "" || what == "Unused" {
		what = e.Mnemonic
	}
	var tags []string
	switch {
	case e.Application:
		tags = append(tags, "usually the application")
	case e.Hardware:
		tags = append(tags, "hardware")
	}
	if e.NVIDIAAction != "" {
		tags = append(tags, "NVIDIA: "+e.NVIDIAAction)
	}
	if len(tags) == 0 {
		return what
	}
	return what + " (" + strings.Join(tags, "; ") + ")"
}

// xidEntries are the node's Xids, once each (a finding is repeated only
// if a later run saw the line as new again, e.g. after a restart).
func xidEntries(node string, results []Result, in Input) []Entry {
	var out []Entry
	seen := map[string]bool{}
	for _, r := range results {
		if r.Check.Name != "gpu.xid" {
			continue
		}
		for _, f := range r.Check.Findings {
			at := r.At
			var detail string
			if code, ok := xidCode(f); ok {
				at = xidAt(f, r.At)
				detail = fmt.Sprintf("Xid %d: %s; action %s", code, xidMeaning(code), orDash(string(f.Action)))
			} else {
				detail = fmt.Sprintf("%s: %s; action %s", f.Code, f.Message, orDash(string(f.Action)))
			}
			k := f.Component + "|" + f.Code + "|" + at.String()
			if seen[k] || !in.inWindow(at) {
				continue
			}
			seen[k] = true
			out = append(out, Entry{At: at, Source: SourceKernel, Kind: KindXid, Node: node, Component: f.Component, Detail: detail})
		}
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// checkChanges are the GPU and network checks' status changes: the first
// result of a check that did not pass, and every change after it.
func checkChanges(node string, results []Result, in Input) []Entry {
	var out []Entry
	last := map[string]report.Status{}
	for _, r := range results {
		c := r.Check
		if c.Name == "gpu.xid" || !hasPrefix(c.Name, "gpu.", "ib.", "nccl.", "dcgm.") {
			continue
		}
		prev, seen := last[c.Name]
		last[c.Name] = c.Status
		if c.Status == prev || (!seen && (c.Status == report.Pass || c.Status == report.Skip)) {
			continue
		}
		if !in.inWindow(r.At) {
			continue
		}
		change := fmt.Sprintf("%s -> %s", prev, c.Status)
		if !seen {
			change = string(c.Status) // the first result in the window
		}
		out = append(out, Entry{At: r.At, Source: SourceCheck, Kind: KindCheckChange, Node: node, Component: c.Name,
			Detail: fmt.Sprintf("%s %s%s", c.Name, change, checkDetail(c))})
	}
	return out
}

// hasPrefix reports whether s starts with one of prefixes.
func hasPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func checkDetail(c report.CheckResult) string {
	if len(c.Findings) == 0 {
		if c.Reason != "" {
			return ": " + c.Reason
		}
		return ""
	}
	fs := append([]report.Finding(nil), c.Findings...)
	report.SortFindings(fs)
	parts := make([]string, 0, 3)
	for i, f := range fs {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("+%d more", len(fs)-3))
			break
		}
		parts = append(parts, strings.TrimSpace(f.Component+" "+f.Code))
	}
	return ": " + strings.Join(parts, ", ")
}

func nodeEventKind(e Event) string {
	m := strings.ToLower(e.Message)
	if strings.Contains(m, "drain") || strings.Contains(m, "resume") || strings.Contains(m, "undrain") {
		return KindDrain
	}
	return KindNodeEvent
}

func eventDetail(e Event) string {
	d := e.Kind + ": " + e.Message
	if e.Actor != "" {
		d += " (by " + e.Actor + ")"
	}
	return d
}

// escalateVerdicts runs the escalation and correlation rules over the
// node's events and the job's other nodes' Xids, in time order.
func escalateVerdicts(node string, results, peers []Result, job Job, haveJob bool, cfg escalate.Config) []escalate.Verdict {
	var evs []escalate.Event
	add := func(rs []Result, onlyXid bool) {
		for _, r := range rs {
			if onlyXid && r.Check.Name != "gpu.xid" {
				continue
			}
			jobID := ""
			if haveJob {
				jobID = job.ID
			}
			es := escalate.FromCheck(r.Node, r.Check, r.At, jobID)
			// An Xid counts at its kernel time, not at the result's.
			if r.Check.Name == "gpu.xid" {
				byKey := map[string]time.Time{}
				for _, f := range r.Check.Findings {
					if code, ok := xidCode(f); ok {
						byKey[f.Component+"|"+strconv.Itoa(code)] = xidAt(f, r.At)
					}
				}
				for i := range es {
					if at, ok := byKey[es[i].Component+"|"+strconv.Itoa(es[i].Xid)]; ok {
						es[i].At = at
					}
				}
			}
			evs = append(evs, es...)
		}
	}
	for i := range results {
		if results[i].Node == "" {
			results[i].Node = node
		}
	}
	add(results, false)
	add(peers, true)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].At.Before(evs[j].At) })
	r := escalate.New(cfg)
	var out []escalate.Verdict
	var lastAt time.Time
	for _, e := range evs {
		out = append(out, r.Observe(e)...)
		lastAt = e.At
	}
	if !lastAt.IsZero() {
		// Close every open correlation window.
		out = append(out, r.Flush(lastAt.Add(time.Duration(r.Config().Correlate.Window)+time.Second))...)
	}
	return out
}

// hardwareFaults are the node's hardware evidence within the window: Xids
// the catalog calls hardware or that fail the node (never the application
// Xids), and failed findings of the GPU and network checks.
func hardwareFaults(results []Result, during func(time.Time) bool) []fault {
	var out []fault
	for _, r := range results {
		c := r.Check
		for _, f := range c.Findings {
			if c.Name == "gpu.xid" {
				code, ok := xidCode(f)
				if !ok {
					if f.Severity == report.SevFail && during(r.At) {
						out = append(out, fault{at: r.At, rule: "gpu.xid " + f.Code, why: f.Component + " " + f.Message})
					}
					continue
				}
				at := xidAt(f, r.At)
				e, _ := xid.Lookup(code)
				if e.Application || !during(at) || !(e.Hardware || f.Severity == report.SevFail) {
					continue
				}
				kind := "fails the node"
				if e.Hardware {
					kind = "a hardware Xid in the catalog"
				}
				out = append(out, fault{at: at, rule: fmt.Sprintf("xid %d: %s", code, kind),
					why: fmt.Sprintf("Xid %d on %s: %s", code, orDash(f.Component), xidMeaning(code))})
				continue
			}
			if f.Severity != report.SevFail || !during(r.At) {
				continue
			}
			if !hasPrefix(c.Name, "gpu.", "ib.", "dcgm.") {
				continue
			}
			out = append(out, fault{at: r.At, rule: fmt.Sprintf("%s %s: fail", c.Name, f.Code),
				why: strings.TrimSpace(f.Component + " " + f.Message)})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// schedulingStates are the job ends that are the scheduler's doing when
// no hardware fault explains them.
var schedulingStates = map[string]string{
	"TIMEOUT":   "the job ran past its time limit",
	"DEADLINE":  "the job reached its deadline",
	"PREEMPTED": "the scheduler preempted the job",
	"CANCELLED": "the job was cancelled (by its owner, an admin or the scheduler)",
	"NODE_FAIL": "the scheduler lost a node of the job, and no hardware fault was recorded on this one",
	"BOOT_FAIL": "a node of the job failed to boot, and no hardware fault was recorded on this one",
	"REQUEUED":  "the scheduler requeued the job",
}

// decide names the bucket, in this order: a hardware fault on the node
// (nothing else explains a GPU off the bus); application Xids the
// correlation rule made one job event; a job the scheduler ended
// (timeout, preemption, cancel, node fail); a job that failed by itself
// (non-zero exit, out of memory) or an application Xid on this node
// alone; else unknown.
func decide(node string, results []Result, verdicts []escalate.Verdict, job Job, haveJob bool, during func(time.Time) bool) (Bucket, string, string) {
	jobWords := ""
	if haveJob {
		jobWords = fmt.Sprintf("job %s %s", job.ID, job.State)
		if job.ExitCode != "" {
			jobWords += " (exit code " + job.ExitCode + ")"
		}
	}
	if fs := hardwareFaults(results, during); len(fs) > 0 {
		f := fs[0]
		why := fmt.Sprintf("%s at %s", f.why, f.at.UTC().Format(time.RFC3339))
		if len(fs) > 1 {
			why += fmt.Sprintf(" (+%d more hardware findings)", len(fs)-1)
		}
		if jobWords != "" {
			why += "; " + jobWords
		}
		return Hardware, f.rule, why
	}
	for _, v := range verdicts {
		if v.Kind == escalate.Escalate && v.Node == node && during(v.At) {
			why := v.Reason
			if jobWords != "" {
				why += "; " + jobWords
			}
			return Hardware, v.Rule, why
		}
	}
	for _, v := range verdicts {
		if v.Kind == escalate.JobEvent && contains(v.Nodes, node) && during(v.At) {
			why := v.Reason
			if jobWords != "" {
				why += "; " + jobWords
			}
			return Application, v.Rule, why
		}
	}
	if haveJob {
		st := job.BaseState()
		if why, ok := schedulingStates[st]; ok {
			return Scheduling, "job state " + st + " without a hardware fault", jobWords + ": " + why
		}
		switch st {
		case "OUT_OF_MEMORY":
			return Application, "job state OUT_OF_MEMORY", jobWords + ": the job ran out of memory (never retried)"
		case "FAILED":
			return Application, "job state FAILED without a hardware fault", jobWords + ": the job exited non-zero by itself; the node's GPU checks and kernel log show no fault"
		}
	}
	for _, r := range results {
		if r.Check.Name != "gpu.xid" {
			continue
		}
		for _, f := range r.Check.Findings {
			if code, ok := xidCode(f); ok && xid.IsApplication(code) && during(xidAt(f, r.At)) {
				why := fmt.Sprintf("Xid %d on %s alone: %s", code, orDash(f.Component), xidMeaning(code))
				if jobWords != "" {
					why += "; " + jobWords
				}
				return Application, fmt.Sprintf("xid %d: application Xid without a hardware fault", code), why
			}
		}
	}
	if haveJob {
		return Unknown, "no fault", jobWords + ": no hardware fault, no scheduler action, no application error"
	}
	return Unknown, "no fault", "no job, no hardware fault and no application Xid in the window"
}

func sortTimeline(tl []Entry) {
	order := map[string]int{KindJobStart: 0, KindJobState: 1, KindXid: 2, KindCheckChange: 3, KindVerdict: 4, KindNodeEvent: 5, KindDrain: 6, KindRemediation: 7, KindJobEnd: 8}
	sort.SliceStable(tl, func(i, j int) bool {
		a, b := tl[i], tl[j]
		if !a.At.Equal(b.At) {
			return a.At.Before(b.At)
		}
		if order[a.Kind] != order[b.Kind] {
			return order[a.Kind] < order[b.Kind]
		}
		if a.Component != b.Component {
			return a.Component < b.Component
		}
		return a.Detail < b.Detail
	})
}
