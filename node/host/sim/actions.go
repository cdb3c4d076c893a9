package sim

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/node/host"
)

var _ host.ActionRunner = (*Node)(nil)

// ErrUnknownAction is returned (wrapped) for an action name the simulator
// does not model.
var ErrUnknownAction = errors.New("sim: unknown action")

// Built-in actions a simulated node runs in place of the programs a live
// node's agent config names. Each takes its arguments as the agent passes
// them, one validated parameter per argument.
const (
	ActionDriverUpgrade    = "driver-upgrade"     // VERSION [FABRIC_MANAGER]
	ActionDriverRollback   = "driver-rollback"    // VERSION [FABRIC_MANAGER]
	ActionXidInject        = "xid-inject"         // XID [GPU]
	ActionXidClear         = "xid-clear"          // (none)
	ActionIBPortDown       = "ib-port-down"       // HCA
	ActionIBPortUp         = "ib-port-up"         // [HCA]
	ActionGPUSlowdown      = "gpu-slowdown"       // FACTOR (0 < f <= 1) or LOAD% (1 < l < 100)
	ActionGPUSlowdownClear = "gpu-slowdown-clear" // (none)
	ActionGPUBurn          = "gpu-burn"           // SECONDS or a Go duration
	ActionPCIeBandwidth    = "pcie-bandwidth"     // (none)
	ActionReboot           = "reboot"             // (none)
	ActionFault            = "sim-fault"          // KIND [TARGET] [VALUE...] (ParseFault)
	ActionClear            = "sim-clear"          // [KIND [TARGET]]
)

// Actions lists the built-in action names.
func Actions() []string {
	return []string{ActionDriverUpgrade, ActionDriverRollback, ActionXidInject, ActionXidClear,
		ActionIBPortDown, ActionIBPortUp, ActionGPUSlowdown, ActionGPUSlowdownClear, ActionGPUBurn,
		ActionPCIeBandwidth, ActionReboot, ActionFault, ActionClear}
}

// driverVersionRE is what nvidia-smi prints as driver_version.
var driverVersionRE = regexp.MustCompile(`^[0-9]{3}\.[0-9]{1,3}(\.[0-9]{1,3})?$`)

// maxBurn bounds a simulated stress run.
const maxBurn = 24 * time.Hour

// RunAction runs a built-in action. The output reads like the real tool's
// last lines; err says why an action did not succeed.
// Every run that succeeds is counted (ActionCount, State).
func (n *Node) RunAction(ctx context.Context, name string, args []string) (string, error) {
	out, err := n.runAction(ctx, name, args)
	if err == nil {
		n.mu.Lock()
		if n.actions == nil {
			n.actions = map[string]int{}
		}
		n.actions[name]++
		n.mu.Unlock()
	}
	return out, err
}

func (n *Node) runAction(ctx context.Context, name string, args []string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	arg := func(i int) string {
		if i < len(args) {
			return args[i]
		}
		return ""
	}
	switch name {
	case ActionDriverUpgrade, ActionDriverRollback:
		return n.changeDriver(ctx, name, arg(0), arg(1))
	case ActionXidInject:
		code, err := strconv.Atoi(arg(0))
		if err != nil || code <= 0 || code > 1000 {
			return "", fmt.Errorf("%s: xid %q: want a number 1..1000", name, arg(0))
		}
		gpu := 0
		if g := arg(1); g != "" {
			if gpu, err = strconv.Atoi(g); err != nil {
				return "", fmt.Errorf("%s: gpu %q: want an index", name, g)
			}
		}
		if err := n.AddFault(Xid{GPU: gpu, Code: code}); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return fmt.Sprintf("wrote Xid %d for GPU%d to /dev/kmsg\n", code, gpu), nil
	case ActionXidClear:
		n.ClearFault(KindXid, "")
		return "Xid events cleared\n", nil
	case ActionIBPortDown:
		if err := n.AddFault(IBPortDown{HCA: arg(0)}); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return fmt.Sprintf("%s port 1: state DOWN\n", arg(0)), nil
	case ActionIBPortUp:
		if h := arg(0); h != "" && n.spec.hcaIndex(h) < 0 {
			return "", fmt.Errorf("%s: no HCA %q", name, h)
		}
		n.ClearFault(KindIBPortDown, arg(0))
		return "port state ACTIVE\n", nil
	case ActionGPUSlowdown:
		f, err := slowFactor(arg(0))
		if err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		if err := n.AddFault(SlowNode{Factor: f}); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return fmt.Sprintf("background GPU load started: bandwidth x%.2f\n", f), nil
	case ActionGPUSlowdownClear:
		n.ClearFault(KindSlowNode, "")
		return "background GPU load stopped\n", nil
	case ActionGPUBurn:
		return n.burn(ctx, arg(0))
	case ActionPCIeBandwidth:
		return n.pcieBandwidth(), nil
	case ActionReboot:
		n.Reboot()
		return "rebooting\n", nil
	case ActionFault:
		f, err := ParseFault(args)
		if err == nil {
			err = n.AddFault(f)
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return fmt.Sprintf("fault %s on %s in place\n", f.Kind(), f.Target()), nil
	case ActionClear:
		kind := FaultKind(arg(0))
		if kind != "" && !slices.Contains(FaultKinds(), kind) {
			return "", fmt.Errorf("%s: %w: unknown fault kind %q (known: %s)", name, ErrBadFault, kind, kindList())
		}
		target := arg(1)
		if g, err := strconv.Atoi(target); err == nil {
			target = gpuTarget(g)
		}
		if n.ClearFault(kind, target) {
			return "faults cleared\n", nil
		}
		return "no such fault in place\n", nil
	}
	return "", fmt.Errorf("%w %q (built-in: %s)", ErrUnknownAction, name, strings.Join(Actions(), ", "))
}

// pcieBandwidth prints what a host-to-device / device-to-host copy test
// measures, as the metric lines burn-in reads: full bandwidth for a
// healthy link, less for a GPU whose link trained narrower.
func (n *Node) pcieBandwidth() string {
	f := n.frame()
	var b strings.Builder
	worst := 1.0
	for i, g := range n.spec.GPUs {
		share := 1.0
		if w := n.gpuWidth(i, f.v); w > 0 && g.Model.PCIeWidth > 0 {
			share = float64(w) / float64(g.Model.PCIeWidth)
		}
		worst = min(worst, share)
	}
	gen := 5
	if len(n.spec.GPUs) > 0 {
		gen = n.spec.GPUs[0].Model.PCIeGen
	}
	// About 55 GB/s on a Gen5 x16 link, half that per generation down.
	full := 55.2 / float64(int(1)<<max(0, 5-gen))
	fmt.Fprintf(&b, "metric pcie.h2d_bandwidth_gbps %.1f\n", full*worst)
	fmt.Fprintf(&b, "metric pcie.d2h_bandwidth_gbps %.1f\n", 0.995*full*worst)
	return b.String()
}

// Driver returns the installed driver version.
func (n *Node) Driver() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.driver
}

// changeDriver installs another driver: it takes ActionDelay, then the
// node reboots with it (Fabric Manager follows the driver when the node
// runs one, or takes the version given).
func (n *Node) changeDriver(ctx context.Context, name, version, fm string) (string, error) {
	if !driverVersionRE.MatchString(version) {
		return "", fmt.Errorf("%s: version %q: want a driver version such as 550.54.15", name, version)
	}
	if fm != "" && !driverVersionRE.MatchString(fm) {
		return "", fmt.Errorf("%s: fabric manager version %q: want a version such as 550.54.15", name, fm)
	}
	n.mu.Lock()
	if n.upgrading {
		n.mu.Unlock()
		return "", fmt.Errorf("%s: another driver change is in progress", name)
	}
	n.upgrading = true
	from := n.driver
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.upgrading = false
		n.mu.Unlock()
	}()
	if d := n.spec.ActionDelay; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Sprintf("installing NVIDIA driver %s: interrupted\n", version), fmt.Errorf("%s: %w", name, ctx.Err())
		}
	}
	n.mu.Lock()
	n.driver = version
	switch {
	case fm != "":
		n.fabricManager = fm
	case n.fabricManager != "":
		n.fabricManager = version
	}
	sp := n.spec
	sp.Driver = version
	n.base = bootLog(&sp)
	n.mu.Unlock()
	n.Reboot()
	return fmt.Sprintf("installed NVIDIA driver %s (was %s); rebooting\n", version, from), nil
}

// slowFactor reads gpu-slowdown's argument: a bandwidth factor in (0, 1],
// or a background load in percent (1 < load < 100) leaving 1 - load/100.
func slowFactor(s string) (float64, error) {
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	switch {
	case err != nil:
		return 0, fmt.Errorf("factor %q: want a number", s)
	case v > 0 && v <= 1 && !strings.HasSuffix(s, "%"):
		return v, nil
	case v > 1 && v < 100:
		return 1 - v/100, nil
	}
	return 0, fmt.Errorf("factor %q: want 0 < factor <= 1, or a load 1 < percent < 100", s)
}

// burn runs a stress load for the given time: the GPUs run warm and at
// full power meanwhile, nothing else changes.
func (n *Node) burn(ctx context.Context, arg string) (string, error) {
	d, err := time.ParseDuration(arg)
	if err != nil {
		secs, serr := strconv.Atoi(arg)
		if serr != nil {
			return "", fmt.Errorf("%s: duration %q: want seconds or a Go duration", ActionGPUBurn, arg)
		}
		d = time.Duration(secs) * time.Second
	}
	if d <= 0 || d > maxBurn {
		return "", fmt.Errorf("%s: duration %s: want more than 0, at most %s", ActionGPUBurn, d, maxBurn)
	}
	n.mu.Lock()
	n.burns++
	n.rebuild()
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.burns--
		n.rebuild()
		n.mu.Unlock()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return "gpu_burn: interrupted\n", fmt.Errorf("%s: %w", ActionGPUBurn, ctx.Err())
	}
	var b strings.Builder
	for i := range n.spec.GPUs {
		fmt.Fprintf(&b, "GPU %d: OK\n", i)
	}
	fmt.Fprintf(&b, "gpu_burn ran %s: no errors\n", d)
	return b.String(), nil
}
