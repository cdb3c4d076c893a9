// Package slurm is the drain adapter for Slurm clusters. It drives the
// standard tools: `scontrol update nodename=N state=drain reason="fleetcheck:
// ..."` and `state=resume`, `sinfo` for a node's state and reason, `squeue`
// for the jobs still running on it.
//
// Slurm keeps one drain reason per node, so the reason is how ownership is
// told: fleetcheck resumes only nodes whose reason starts with
// "fleetcheck:". A node drained or downed by someone else is never resumed,
// and never re-drained (which would overwrite its reason).
//
// Status and the drain are two commands, not one transaction: a person who
// drains the node between them has their reason overwritten. The window is
// one command long and the reason we write names fleetcheck, so `sinfo -R`
// shows what happened.
package slurm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/runcmd"
)

// Options configure the adapter. Zero values take the defaults.
type Options struct {
	// Scontrol, Sinfo and Squeue are the tools: names looked up on PATH
	// (default) or paths.
	Scontrol string
	Sinfo    string
	Squeue   string
	// Timeout bounds each command (default 30s): slurmctld that does not
	// answer costs one attempt, never the campaign.
	Timeout time.Duration
	// Env is added to the tools' environment (SLURM_CONF=...).
	Env []string
}

// Adapter drains and resumes Slurm nodes.
type Adapter struct {
	opts Options
}

var (
	_ drain.Adapter = (*Adapter)(nil)
	_ drain.Lister  = (*Adapter)(nil)
)

// New returns a Slurm adapter.
func New(opts Options) *Adapter {
	if opts.Scontrol == "" {
		opts.Scontrol = "scontrol"
	}
	if opts.Sinfo == "" {
		opts.Sinfo = "sinfo"
	}
	if opts.Squeue == "" {
		opts.Squeue = "squeue"
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	return &Adapter{opts: opts}
}

// maxOutput bounds what is kept of a tool's output: sinfo over a large
// cluster prints a line per node and partition.
const maxOutput = 8 << 20

// sinfoFormat prints node, extended state and reason, split by '|' (a
// reason may hold spaces; it comes last so a '|' inside it survives).
const sinfoFormat = "%N|%T|%E"

func (a *Adapter) run(ctx context.Context, path string, args ...string) (string, error) {
	res := runcmd.Run(ctx, runcmd.Spec{Path: path, Args: args, Env: a.opts.Env, Timeout: a.opts.Timeout, MaxOutput: maxOutput})
	if res.Err != nil {
		return "", res.Err
	}
	if res.ExitCode != 0 {
		msg := strings.TrimSpace(string(res.Stderr))
		if msg == "" {
			msg = strings.TrimSpace(string(res.Stdout))
		}
		return "", fmt.Errorf("%s %s: exit status %d: %s", path, strings.Join(args, " "), res.ExitCode, firstLine(msg))
	}
	return string(res.Stdout), nil
}

// Status reads the node's state and reason with sinfo and counts its
// running jobs with squeue.
func (a *Adapter) Status(ctx context.Context, node string) (drain.Status, error) {
	if err := drain.CheckNode(node); err != nil {
		return drain.Status{}, err
	}
	st, err := a.state(ctx, node)
	if err != nil {
		return drain.Status{}, err
	}
	out, err := a.run(ctx, a.opts.Squeue, "-h", "-w", node, "-t", "RUNNING,COMPLETING", "-o", "%i")
	if err != nil {
		return drain.Status{}, fmt.Errorf("slurm status %s: squeue: %w", node, err)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) != "" {
			st.RunningJobs++
		}
	}
	return st, nil
}

// state reads one node's drain state from sinfo.
func (a *Adapter) state(ctx context.Context, node string) (drain.Status, error) {
	out, err := a.run(ctx, a.opts.Sinfo, "-h", "-N", "-n", node, "-o", sinfoFormat)
	if err != nil {
		return drain.Status{}, fmt.Errorf("slurm status %s: sinfo: %w", node, err)
	}
	nodes, err := parseSinfo(out)
	if err != nil {
		return drain.Status{}, fmt.Errorf("slurm status %s: %w", node, err)
	}
	st, ok := nodes[node]
	if !ok {
		return drain.Status{}, fmt.Errorf("slurm status %s: %w", node, drain.ErrUnknownNode)
	}
	return st, nil
}

// Drain drains the node with a fleetcheck reason. A node already drained
// by fleetcheck is left alone; one drained or down for someone else's
// reason gives ErrNotOurs and is not touched.
func (a *Adapter) Drain(ctx context.Context, node, reason string) error {
	if err := drain.CheckNode(node); err != nil {
		return err
	}
	st, err := a.state(ctx, node)
	if err != nil {
		return fmt.Errorf("drain %s: %w", node, err)
	}
	if st.Drained {
		if !st.ByFleetcheck {
			return fmt.Errorf("drain %s: %w (reason %q)", node, drain.ErrNotOurs, st.Reason)
		}
		return nil
	}
	if _, err := a.run(ctx, a.opts.Scontrol, "update", "nodename="+node, "state=drain", "reason="+cleanReason(reason)); err != nil {
		return fmt.Errorf("drain %s: %w", node, err)
	}
	return nil
}

// Undrain resumes a node that fleetcheck drained.
func (a *Adapter) Undrain(ctx context.Context, node string) error {
	if err := drain.CheckNode(node); err != nil {
		return err
	}
	st, err := a.state(ctx, node)
	if err != nil {
		return fmt.Errorf("undrain %s: %w", node, err)
	}
	if !st.Drained {
		return nil
	}
	if !st.ByFleetcheck {
		return fmt.Errorf("undrain %s: %w (reason %q)", node, drain.ErrNotOurs, st.Reason)
	}
	if _, err := a.run(ctx, a.opts.Scontrol, "update", "nodename="+node, "state=resume"); err != nil {
		return fmt.Errorf("undrain %s: %w", node, err)
	}
	return nil
}

// Unavailable lists every node that is drained, draining or down, with one
// sinfo call. RunningJobs is not filled in.
func (a *Adapter) Unavailable(ctx context.Context) (map[string]drain.Status, error) {
	out, err := a.run(ctx, a.opts.Sinfo, "-h", "-N", "-o", sinfoFormat)
	if err != nil {
		return nil, fmt.Errorf("slurm unavailable nodes: sinfo: %w", err)
	}
	nodes, err := parseSinfo(out)
	if err != nil {
		return nil, fmt.Errorf("slurm unavailable nodes: %w", err)
	}
	for n, st := range nodes {
		if !st.Drained {
			delete(nodes, n)
		}
	}
	return nodes, nil
}

var errSinfo = errors.New("unexpected sinfo output")

// parseSinfo reads `sinfo -h -N -o %N|%T|%E` lines. A node in several
// partitions appears once per partition, with the same state.
func parseSinfo(out string) (map[string]drain.Status, error) {
	nodes := make(map[string]drain.Status)
	for i, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		name, rest, ok1 := strings.Cut(line, "|")
		state, reason, ok2 := strings.Cut(rest, "|")
		if !ok1 || !ok2 || name == "" {
			return nil, fmt.Errorf("%w: line %d: %q", errSinfo, i+1, line)
		}
		reason = strings.TrimSpace(reason)
		if strings.EqualFold(reason, "none") || reason == "(null)" {
			reason = ""
		}
		st := drain.Status{Drained: outOfService(state), Reason: reason, State: stateWord(state)}
		st.ByFleetcheck = st.Drained && drain.Ours(reason)
		nodes[name] = st
	}
	return nodes, nil
}

// outOfService reads sinfo's extended state ("idle", "drained*",
// "mixed+drain", "down~"): drained, draining, down and failing nodes take no
// new work.
func outOfService(state string) bool {
	s := strings.ToLower(strings.TrimSpace(state))
	s = strings.TrimRight(s, "*~#!%$@^-")
	for _, tok := range strings.Split(s, "+") {
		switch strings.TrimRight(tok, "*~#!%$@^-") {
		case "drain", "drained", "draining", "down", "fail", "failing":
			return true
		}
	}
	return false
}

// stateWord is sinfo's extended state without its flag suffixes
// ("drained*" → "drained", "mixed+drain" stays).
func stateWord(state string) string {
	return strings.TrimRight(strings.ToLower(strings.TrimSpace(state)), "*~#!%$@^-")
}

// cleanReason keeps a reason on one line and within the length Slurm
// shows in full; it always starts with drain.ReasonPrefix.
func cleanReason(reason string) string {
	r := strings.Map(func(c rune) rune {
		if c < 0x20 || c == 0x7f || c == '|' {
			return ' '
		}
		return c
	}, drain.Reason(reason))
	const maxLen = 200
	if len(r) > maxLen {
		r = strings.ToValidUTF8(r[:maxLen], "")
	}
	return r
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	if len(l) > 300 {
		l = l[:300]
	}
	return l
}
