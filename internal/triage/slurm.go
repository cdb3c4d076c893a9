package triage

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/runcmd"
)

// SacctFields are the fields Slurm.Jobs asks sacct for, in this order
// (ParseSacct reads them by the header, so any order parses).
var SacctFields = []string{"JobID", "JobName", "State", "ExitCode", "DerivedExitCode", "Submit", "Start", "End", "NodeList"}

// slurmTime is how Slurm prints times: local time, no zone.
const slurmTime = "2006-01-02T15:04:05"

// parseSlurmTime reads a Slurm time in loc; "Unknown", "None", "N/A" and
// empty are the zero time.
func parseSlurmTime(s string, loc *time.Location) time.Time {
	t, err := time.ParseInLocation(slurmTime, strings.TrimSpace(s), loc)
	if err != nil {
		return time.Time{}
	}
	return t
}

// ParseSacct reads `sacct --parsable2` output with its header line: one
// job per line, '|' between fields. Job steps (1234.batch, 1234.0) are
// left out: the allocation's line carries the job's state. Times are read
// in loc (Slurm prints local time).
func ParseSacct(out string, loc *time.Location, from string) ([]Job, error) {
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var col map[string]int
	var jobs []Job
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		fields := strings.Split(line, "|")
		if col == nil {
			col = map[string]int{}
			for i, f := range fields {
				col[strings.TrimSpace(f)] = i
			}
			if _, ok := col["JobID"]; !ok {
				return nil, fmt.Errorf("sacct: no JobID in the header %q", line)
			}
			continue
		}
		get := func(name string) string {
			if i, ok := col[name]; ok && i < len(fields) {
				return strings.TrimSpace(fields[i])
			}
			return ""
		}
		id := get("JobID")
		if id == "" || strings.Contains(id, ".") {
			continue
		}
		if len(jobs) == MaxJobs {
			break
		}
		j := Job{ID: id, Name: get("JobName"), State: get("State"), ExitCode: get("ExitCode"),
			Submit: parseSlurmTime(get("Submit"), loc), Start: parseSlurmTime(get("Start"), loc), End: parseSlurmTime(get("End"), loc), From: from}
		if nl := get("NodeList"); nl != "" && nl != "(null)" && nl != "None assigned" {
			j.Nodes = []string{nl} // a hostlist; Slurm.Jobs expands it
		}
		jobs = append(jobs, j)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("sacct: %w", err)
	}
	if col == nil && strings.TrimSpace(out) != "" {
		return nil, errors.New("sacct: no header line")
	}
	return jobs, nil
}

// scontrolKey starts one Key=Value of `scontrol show job -o`; a value
// runs to the next " Key=" (Command= and WorkDir= may hold spaces).
var scontrolKey = regexp.MustCompile(`(?:^| )([A-Za-z][A-Za-z0-9/:_]*)=`)

// parseKeyValues splits one `scontrol show ... -o` line.
func parseKeyValues(line string) map[string]string {
	out := map[string]string{}
	idx := scontrolKey.FindAllStringSubmatchIndex(line, -1)
	for i, m := range idx {
		key := line[m[2]:m[3]]
		end := len(line)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		if _, dup := out[key]; !dup {
			out[key] = strings.TrimSpace(line[m[1]:end])
		}
	}
	return out
}

// ParseScontrolJobs reads `scontrol show job -o` output: one job a line
// (the whole cluster's when no job is named: the output's size is the
// bound, and the caller picks the node's).
func ParseScontrolJobs(out string, loc *time.Location) []Job {
	var jobs []Job
	for _, line := range strings.Split(out, "\n") {
		kv := parseKeyValues(strings.TrimSpace(line))
		id := kv["JobId"]
		if id == "" {
			continue
		}
		j := Job{ID: id, Name: kv["JobName"], State: kv["JobState"], ExitCode: kv["ExitCode"], Reason: kv["Reason"],
			Submit: parseSlurmTime(kv["SubmitTime"], loc), Start: parseSlurmTime(kv["StartTime"], loc), End: parseSlurmTime(kv["EndTime"], loc), From: "scontrol"}
		if nl := kv["NodeList"]; nl != "" && nl != "(null)" {
			j.Nodes = []string{nl}
		}
		jobs = append(jobs, j)
	}
	return jobs
}

// reasonStamp is what Slurm appends to a node's reason: "[user@time]".
var reasonStamp = regexp.MustCompile(`\s*\[([^\]@]*)@([^\]]*)\]\s*$`)

// ParseScontrolNode reads `scontrol show node -o NODE`: its state and, if
// it is drained or down with a reason, a drain entry at the reason's time.
func ParseScontrolNode(out, node string, loc *time.Location) (state string, drain *Entry) {
	for _, line := range strings.Split(out, "\n") {
		kv := parseKeyValues(strings.TrimSpace(line))
		if kv["NodeName"] != node {
			continue
		}
		state = kv["State"]
		reason := kv["Reason"]
		if reason == "" || reason == "(null)" || reason == "None" {
			return state, nil
		}
		e := Entry{Source: SourceSlurm, Kind: KindDrain, Node: node}
		if m := reasonStamp.FindStringSubmatch(reason); m != nil {
			e.At = parseSlurmTime(m[2], loc)
			reason = strings.TrimSpace(reason[:len(reason)-len(m[0])])
			e.Detail = fmt.Sprintf("node %s: %q (by %s)", state, reason, m[1])
		} else {
			e.Detail = fmt.Sprintf("node %s: %q", state, reason)
		}
		return state, &e
	}
	return "", nil
}

// Slurm asks the scheduler where the CLI runs.
type Slurm struct {
	// Bin is the directory of sacct, scontrol and squeue ("": PATH).
	Bin string
	// Env is added to the tools' environment (SLURM_CONF=...).
	Env []string
	// Timeout bounds each command (default 30s).
	Timeout time.Duration
	// Loc is the time zone Slurm prints in (default time.Local).
	Loc *time.Location
}

// maxToolOutput bounds what is kept of a tool's output.
const maxToolOutput = 16 << 20

// MaxJobNodes bounds the nodes of one job whose Xids are fetched.
const MaxJobNodes = 512

func (s Slurm) tool(name string) string {
	if s.Bin == "" {
		return name
	}
	return filepath.Join(s.Bin, name)
}

func (s Slurm) loc() *time.Location {
	if s.Loc == nil {
		return time.Local
	}
	return s.Loc
}

// ErrNoSlurm is returned when none of Slurm's tools is there.
var ErrNoSlurm = errors.New("no Slurm tools (sacct, scontrol)")

func (s Slurm) run(ctx context.Context, name string, args ...string) (string, error) {
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	res := runcmd.Run(ctx, runcmd.Spec{Path: s.tool(name), Args: args, Env: s.Env, Timeout: timeout, MaxOutput: maxToolOutput})
	if res.NotFound {
		return "", fmt.Errorf("%s: %w", name, runcmd.ErrNotFound)
	}
	if res.Err != nil {
		return "", fmt.Errorf("%s: %w", name, res.Err)
	}
	if res.ExitCode != 0 {
		msg := strings.TrimSpace(string(res.Stderr) + " " + string(res.Stdout))
		return string(res.Stdout), fmt.Errorf("%s %s: exit %d: %s", name, strings.Join(args, " "), res.ExitCode, msg)
	}
	return string(res.Stdout), nil
}

// Jobs returns the job (id != "") or the node's jobs since since: finished
// ones from sacct (the accounting database, else the job completion log
// with --completion), live and recently ended ones from scontrol. Notes
// say which sources were missing. ErrNoSlurm when no tool is there.
func (s Slurm) Jobs(ctx context.Context, node, id string, since time.Time) ([]Job, []string, error) {
	var notes []string
	byID := map[string]Job{}
	var order []string
	// slurmctld's view (scontrol) is the live one and carries the
	// reason; sacct's fills in the jobs slurmctld no longer holds.
	put := func(j Job) {
		old, ok := byID[j.ID]
		if !ok {
			order = append(order, j.ID)
		} else if j.From != "scontrol" && old.From == "scontrol" {
			return
		}
		byID[j.ID] = j
	}
	found := 0

	args := []string{"--parsable2", "-X", "--format", strings.Join(SacctFields, ",")}
	if id != "" {
		args = append(args, "-j", id)
	} else {
		args = append(args, "-N", node, "-S", since.In(s.loc()).Format(slurmTime), "-E", "now")
	}
	out, err := s.run(ctx, "sacct", args...)
	from := "sacct"
	if err != nil && strings.Contains(err.Error(), "accounting storage is disabled") {
		// No slurmdbd: the job completion log (jobcomp/filetxt) is
		// what sacct can still read.
		from = "sacct --completion"
		out, err = s.run(ctx, "sacct", append([]string{"--completion"}, args...)...)
	}
	switch {
	case errors.Is(err, runcmd.ErrNotFound):
		notes = append(notes, "sacct not found: finished jobs only as long as slurmctld keeps them (MinJobAge)")
	case err != nil:
		notes = append(notes, "sacct: "+firstLine(err.Error()))
	default:
		found++
		jobs, perr := ParseSacct(out, s.loc(), from)
		if perr != nil {
			notes = append(notes, perr.Error())
		}
		for _, j := range jobs {
			put(j)
		}
	}

	var live string
	if id != "" {
		live, err = s.run(ctx, "scontrol", "show", "job", "-o", id)
		if err != nil && strings.Contains(err.Error(), "Invalid job id") {
			err = nil // finished and purged: sacct's answer stands
		}
	} else {
		live, err = s.run(ctx, "scontrol", "show", "job", "-o")
	}
	// slurmctld says which of its jobs ran on the node (squeue -w matches
	// hostlists itself); without squeue the job's hostlist is expanded here.
	var onNode map[string]bool
	if id == "" && err == nil {
		if ids, qerr := s.run(ctx, "squeue", "--noheader", "--states=all", "-w", node, "--format=%i"); qerr == nil {
			onNode = map[string]bool{}
			for _, f := range strings.Fields(ids) {
				onNode[f] = true
			}
		}
	}
	switch {
	case errors.Is(err, runcmd.ErrNotFound):
		notes = append(notes, "scontrol not found: no live jobs")
	case err != nil:
		notes = append(notes, "scontrol: "+firstLine(err.Error()))
	default:
		found++
		for _, j := range ParseScontrolJobs(live, s.loc()) {
			switch {
			case id != "":
			case onNode != nil && !onNode[j.ID]:
				continue
			case onNode == nil && (len(j.Nodes) != 1 || !contains(ExpandHostlist(j.Nodes[0]), node)):
				continue
			}
			put(j)
			if len(order) >= MaxJobs {
				notes = append(notes, fmt.Sprintf("only the first %d jobs are read", MaxJobs))
				break
			}
		}
	}
	if found == 0 {
		return nil, notes, ErrNoSlurm
	}

	var jobs []Job
	for _, k := range order {
		j := byID[k]
		if len(j.Nodes) == 1 {
			j.Nodes = s.hostnames(ctx, j.Nodes[0])
		}
		if id == "" && !j.End.IsZero() && j.End.Before(since) {
			continue
		}
		jobs = append(jobs, j)
	}
	sort.SliceStable(jobs, func(a, b int) bool { return jobTime(jobs[a]).Before(jobTime(jobs[b])) })
	return jobs, notes, nil
}

// hostnames expands a hostlist with `scontrol show hostnames`; a list
// without brackets needs no tool.
func (s Slurm) hostnames(ctx context.Context, list string) []string {
	if strings.Count(list, "[") <= 1 {
		return ExpandHostlist(list)
	}
	out, err := s.run(ctx, "scontrol", "show", "hostnames", list)
	if err != nil {
		return ExpandHostlist(list)
	}
	names := strings.Fields(out)
	if len(names) > MaxJobNodes {
		names = names[:MaxJobNodes]
	}
	return names
}

// Node returns the scheduler's drain of node, if any.
func (s Slurm) Node(ctx context.Context, node string) (*Entry, error) {
	out, err := s.run(ctx, "scontrol", "show", "node", "-o", node)
	if err != nil {
		return nil, err
	}
	_, e := ParseScontrolNode(out, node, s.loc())
	return e, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// ExpandHostlist expands a Slurm hostlist ("gpu-[01-03,07],login1") the
// way `scontrol show hostnames` does for one bracket group per name, at
// most MaxJobNodes names. It is the fallback when scontrol is not there.
func ExpandHostlist(list string) []string {
	var out []string
	for _, part := range splitTop(list) {
		open := strings.IndexByte(part, '[')
		closeAt := strings.LastIndexByte(part, ']')
		if open < 0 || closeAt < open || strings.Count(part, "[") > 1 {
			// No range, or several (rack[1-2]-n[1-4]): left as it is;
			// Slurm.hostnames asks scontrol for those.
			if part != "" {
				out = append(out, part)
			}
			continue
		}
		prefix, suffix := part[:open], part[closeAt+1:]
		for _, r := range strings.Split(part[open+1:closeAt], ",") {
			lo, hi, isRange := strings.Cut(r, "-")
			if !isRange {
				hi = lo
			}
			a, errA := strconv.Atoi(lo)
			b, errB := strconv.Atoi(hi)
			if errA != nil || errB != nil || b < a {
				out = append(out, prefix+r+suffix)
				continue
			}
			for n := a; n <= b && len(out) < MaxJobNodes; n++ {
				out = append(out, fmt.Sprintf("%s%0*d%s", prefix, len(lo), n, suffix))
			}
		}
		if len(out) >= MaxJobNodes {
			return out[:MaxJobNodes]
		}
	}
	return out
}

// splitTop splits at the commas outside brackets.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}
