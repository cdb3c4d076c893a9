package live

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/runcmd"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
)

var (
	_ host.ActionRunner    = (*Host)(nil)
	_ host.MultiNodeRunner = (*Host)(nil)
)

// maxActionOutput bounds what an action's output keeps: enough for the
// tail an operator reads, not a log file.
const maxActionOutput = 1 << 20

// RunAction runs an agent action's program with its arguments, in its own
// process group, bounded by ctx. A non-zero exit, a timeout or a missing
// program is an error; output is stdout then stderr either way.
func (h *Host) RunAction(ctx context.Context, name string, args []string) (string, error) {
	s := runcmd.Spec{Path: name, Args: slices.Clone(args), Env: []string{"LC_ALL=C"}, MaxOutput: maxActionOutput}
	r := runcmd.Run(ctx, s)
	out := string(r.Stdout)
	if len(r.Stderr) > 0 {
		out += string(r.Stderr)
	}
	switch {
	case r.NotFound:
		return out, fmt.Errorf("action %s: %w", name, r.Err)
	case r.Err != nil:
		return out, fmt.Errorf("action %s: %w", name, r.Err)
	case r.ExitCode != 0:
		msg := fmt.Sprintf("action %s exited %d", name, r.ExitCode)
		if tail := lastLine(r.Stderr); tail != "" {
			msg += ": " + tail
		}
		return out, fmt.Errorf("%s", msg)
	}
	return out, nil
}

// RunMultiNode runs the launcher command (mpirun, srun) the agent built,
// in its own process group: on timeout the whole group, remote launchers
// included, is killed. A failed run still returns what it printed: the
// NCCL failure lines are the evidence.
func (h *Host) RunMultiNode(ctx context.Context, run host.MultiNodeRun) host.Capture {
	if len(run.Argv) == 0 {
		return host.Capture{State: snapshot.StateFailed, Err: "multi-node launcher: empty command"}
	}
	timeout := run.Timeout
	if timeout <= 0 {
		timeout = h.tools.NCCLTimeout.D(10 * time.Minute)
	}
	s := runcmd.Spec{Path: run.Argv[0], Args: slices.Clone(run.Argv[1:]), Timeout: timeout,
		Env: []string{"LC_ALL=C", "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET"}}
	c := toCapture(s, h.guard.Run(ctx, string(snapshot.SrcAllReduce)+" multi "+strings.Join(run.Hosts, ","), s))
	if c.State == snapshot.StateFailed && len(c.Data) > 0 {
		c.State = snapshot.StateOK
		c.Err = ""
	}
	return c
}

// allReduceArgs applies a request's nccl.allreduce parameters to the
// all_reduce_perf arguments: the value after -b, -e or -f is replaced, or
// the flag appended when the arguments do not have it.
func allReduceArgs(args []string, p host.RunParams) []string {
	out := slices.Clone(args)
	for _, kv := range [][2]string{{"min_bytes", "-b"}, {"max_bytes", "-e"}, {"step_factor", "-f"}} {
		v, ok := p[kv[0]]
		if !ok {
			continue
		}
		if i := slices.Index(out, kv[1]); i >= 0 && i+1 < len(out) {
			out[i+1] = v
			continue
		}
		out = append(out, kv[1], v)
	}
	return out
}
