package host

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"
)

// ActionRunner is a host that can run an agent action: the live machine
// runs name as a program with args (no shell), the simulator runs its
// built-in action of that name. The agent decides what may run; the host
// only runs it. err is non-nil when the action did not succeed; output is
// what it printed either way (bounded by the host).
type ActionRunner interface {
	RunAction(ctx context.Context, name string, args []string) (output string, err error)
}

// MultiNodeRun is one multi-node all_reduce_perf launch: the command the
// agent's config defines with its placeholders already filled, and what
// the agent filled them with.
type MultiNodeRun struct {
	// Argv is the launcher command, argv[0] the program.
	Argv []string
	// Hosts are the participating nodes, the launcher first.
	Hosts []string
	// Ranks is the process count the command asks for ({np}).
	Ranks int
	// Timeout bounds the run; 0 leaves ctx's deadline.
	Timeout time.Duration
}

// MultiNodeRunner is a host that can launch a multi-node all_reduce_perf
// and return its raw output, judged like the single-node one.
type MultiNodeRunner interface {
	RunMultiNode(ctx context.Context, run MultiNodeRun) Capture
}

// RunParams are a requested run's validated parameters (dcgm.diag
// "level", nccl.allreduce "min_bytes", "max_bytes", "step_factor"). They
// travel in the context from the agent to the host's Capture, which
// applies the ones it knows to the command it runs.
type RunParams map[string]string

type paramsKey struct{}

// WithParams returns ctx carrying p; an empty p leaves ctx as it is.
func WithParams(ctx context.Context, p RunParams) context.Context {
	if len(p) == 0 {
		return ctx
	}
	return context.WithValue(ctx, paramsKey{}, maps.Clone(p))
}

// ParamsFrom returns the run parameters in ctx, nil when none.
func ParamsFrom(ctx context.Context) RunParams {
	p, _ := ctx.Value(paramsKey{}).(RunParams)
	return p
}

// Key is a stable text form of p ("k=v,k=v" sorted), "" for none: reads
// with different parameters are different reads.
func (p RunParams) Key() string {
	if len(p) == 0 {
		return ""
	}
	keys := slices.Sorted(maps.Keys(p))
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(p[k])
	}
	return b.String()
}
