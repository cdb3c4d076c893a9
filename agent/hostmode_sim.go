//go:build !node

package agent

// The simulated host (host mode sim) lives in this file so that the slim
// node build (-tags node) leaves the simulator out; hostmode_nosim.go
// refuses the mode there.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
)

// validateSim checks what only the simulator can judge: the faults'
// text form and that every action is one of its built-in ones.
func (c *Config) validateSim() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrInvalid}, a...)...) }
	for i, f := range c.Host.Faults {
		if _, err := sim.ParseFault(strings.Fields(f)); err != nil {
			return bad("host.faults[%d]: %v", i, err)
		}
	}
	builtin := sim.Actions()
	for _, name := range c.actionNames() {
		if p := c.Actions[name].Command[0]; !slices.Contains(builtin, p) {
			return bad("actions.%s: command[0] %q is a program, but host mode sim runs the simulator's built-in actions only (%s)",
				name, p, strings.Join(builtin, ", "))
		}
	}
	return nil
}

// simHost is a simulated node whose state outlives the agent process: it
// is written to the state dir after every action (and at open), and read
// back when the agent starts again. The driver an upgrade installed and
// the faults a drill injected are still there after a restart, as on a
// real node whose agent restarts.
type simHost struct {
	*sim.Node
	path string
	log  zerolog.Logger
	long time.Duration // all_reduce_perf and dcgmi diag take this long
	mu   sync.Mutex    // one save at a time
}

// Capture renders a source; the long-running tools take their time
// first (a deadline cuts them short, as it would the real tool).
func (h *simHost) Capture(ctx context.Context, src snapshot.Source) host.Capture {
	if h.long > 0 && (src == snapshot.SrcAllReduce || src == snapshot.SrcDCGMDiag) {
		t := time.NewTimer(h.long)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	return h.Node.Capture(ctx, src)
}

// RunMultiNode takes as long as a single-node all_reduce_perf, then
// renders the multi-node run.
func (h *simHost) RunMultiNode(ctx context.Context, run host.MultiNodeRun) host.Capture {
	if h.long > 0 {
		t := time.NewTimer(h.long)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	return h.Node.RunMultiNode(ctx, run)
}

var (
	_ host.Host            = (*simHost)(nil)
	_ host.ActionRunner    = (*simHost)(nil)
	_ host.MultiNodeRunner = (*simHost)(nil)
)

func openSim(cfg *Config, log zerolog.Logger) (*simHost, error) {
	spec := sim.DefaultSpec(cfg.Node)
	if cfg.Host.SKU == "a100" {
		spec = sim.A100Spec(cfg.Node)
	}
	spec.Seed = cfg.Host.Seed
	spec.Labels = cfg.Labels
	spec.DCGMDiag = cfg.Host.DCGM == nil || *cfg.Host.DCGM
	spec.ActionDelay = time.Duration(cfg.Host.ActionDelay)
	n, err := sim.New(spec)
	if err != nil {
		return nil, fmt.Errorf("host mode sim: %w", err)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("host mode sim: state dir: %w", err)
	}
	h := &simHost{Node: n, path: filepath.Join(cfg.StateDir, SimStateFile), log: log, long: time.Duration(cfg.Host.LongToolTime)}
	st, err := ReadSimState(h.path)
	fresh := errors.Is(err, os.ErrNotExist)
	switch {
	case fresh:
		for _, f := range cfg.Host.Faults {
			x, err := sim.ParseFault(strings.Fields(f))
			if err == nil {
				err = n.AddFault(x)
			}
			if err != nil {
				return nil, fmt.Errorf("host mode sim: fault %q: %w", f, err)
			}
		}
	case err != nil:
		// Refuse rather than start over: a node that forgot its upgraded
		// driver or an injected fault would mislead every campaign.
		return nil, fmt.Errorf("host mode sim: %w (remove the file to start the node afresh)", err)
	default:
		if err := n.Restore(st); err != nil {
			return nil, fmt.Errorf("host mode sim: %s: %w (remove the file to start the node afresh)", h.path, err)
		}
	}
	// A new node is written at once; a restored one is left as it is
	// until an action changes it (a second agent refused by the state
	// dir's lock must not write over the first one's node).
	if fresh {
		if err := h.save(); err != nil {
			return nil, err
		}
	}
	st = n.State()
	sku := cfg.Host.SKU
	if sku == "" {
		sku = "h100"
	}
	log.Info().Str("sku", sku).Str("driver", st.Driver).Int("faults", len(st.Faults)).
		Str("state_file", h.path).Msg("host: simulated node")
	return h, nil
}

// ReadSimState reads a simulated node's state file (SimStateFile in an
// agent's state dir).
func ReadSimState(path string) (sim.State, error) {
	var st sim.State
	b, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("read %s: %w", path, err)
	}
	return st, nil
}

// RunAction runs the built-in action and keeps the node's new state.
func (h *simHost) RunAction(ctx context.Context, name string, args []string) (string, error) {
	out, err := h.Node.RunAction(ctx, name, args)
	if serr := h.save(); serr != nil {
		h.log.Error().Err(serr).Str("action", name).Msg("simulated node state not kept")
		if err == nil {
			err = serr
		}
	}
	return out, err
}

// save writes the state atomically: a crash leaves the old file or the new.
func (h *simHost) save() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, err := json.MarshalIndent(h.Node.State(), "", "  ")
	if err != nil {
		return fmt.Errorf("simulated node state: %w", err)
	}
	tmp := h.path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("simulated node state: %w", err)
	}
	if err := os.Rename(tmp, h.path); err != nil {
		return fmt.Errorf("simulated node state: %w", err)
	}
	return nil
}
