package agent

import (
	"fmt"
	"reflect"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/host/live"
)

// Host modes: what the agent reads and acts on.
const (
	// HostLive is the real machine (the default).
	HostLive = "live"
	// HostSim is a simulated node (package sim): the same model the demo
	// runs, rendered in the real tools' formats, its faults set and
	// cleared through the agent's configured actions. For trials and
	// staging fleets on machines without GPUs.
	HostSim = "sim"
	// HostBundle replays a captured support bundle on every pass.
	HostBundle = "bundle"
)

// HostConfig is the config's `host:` section.
type HostConfig struct {
	// Mode is live (default), sim or bundle.
	Mode string `yaml:"mode"`
	// SKU is the simulated node's shape: h100 (8×H100 SXM, 8×CX-7 NDR
	// 400; the default) or a100 (8×A100 SXM4, 8×CX-6 HDR 200).
	SKU string `yaml:"sku"`
	// Seed varies serials, UUIDs and measurement noise between nodes.
	Seed uint64 `yaml:"seed"`
	// DCGM makes `dcgmi diag` available on the simulated node (default true).
	DCGM *bool `yaml:"dcgm"`
	// ActionDelay is how long a simulated driver change takes before the
	// node reboots with it (default 0, at most 10m).
	ActionDelay config.Duration `yaml:"action_delay"`
	// LongToolTime is how long all_reduce_perf and dcgmi diag take on the
	// simulated node (default 0, at most 10m): the disruptive checks then
	// last long enough to be interrupted, as on real hardware.
	LongToolTime config.Duration `yaml:"long_tool_time"`
	// Faults are in place when the simulated node is first built, each in
	// sim's text form ("ib_port_down mlx5_4", "ecc_uncorrectable GPU3 2").
	// A restarted agent finds the node as it left it instead.
	Faults []string `yaml:"faults"`
	// Path is the bundle to replay (a directory or .tar.gz).
	Path string `yaml:"path"`
}

// Bounds of the host section.
const (
	maxSimFaults      = 64
	maxSimActionDelay = 10 * time.Minute
	// SimStateFile, in the state dir, is the simulated node's state.
	SimStateFile = "sim-node.json"
)

// mode is the host mode with the default filled in.
func (h HostConfig) mode() string {
	if h.Mode == "" {
		return HostLive
	}
	return h.Mode
}

// validateHost checks the host section, and that nothing else in the
// config needs the real machine when the host is not live.
func (c *Config) validateHost() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrInvalid}, a...)...) }
	h := c.Host
	simOnly := h.SKU != "" || h.Seed != 0 || h.DCGM != nil || h.ActionDelay != 0 || h.LongToolTime != 0 || len(h.Faults) > 0
	switch h.mode() {
	case HostLive:
		if simOnly || h.Path != "" {
			return bad("host: sku, seed, dcgm, action_delay, long_tool_time, faults and path apply to mode sim or bundle, not live")
		}
		return nil
	case HostSim:
		if h.Path != "" {
			return bad("host.path applies to mode bundle, not sim")
		}
		if h.SKU != "" && h.SKU != "h100" && h.SKU != "a100" {
			return bad("host.sku %q: h100 or a100", h.SKU)
		}
		if d := time.Duration(h.ActionDelay); d < 0 || d > maxSimActionDelay {
			return bad("host.action_delay %s: between 0 and %s", d, maxSimActionDelay)
		}
		if d := time.Duration(h.LongToolTime); d < 0 || d > maxSimActionDelay {
			return bad("host.long_tool_time %s: between 0 and %s", d, maxSimActionDelay)
		}
		if len(h.Faults) > maxSimFaults {
			return bad("host.faults: at most %d", maxSimFaults)
		}
		if err := c.validateSim(); err != nil {
			return err
		}
	case HostBundle:
		if simOnly {
			return bad("host: sku, seed, dcgm, action_delay, long_tool_time and faults apply to mode sim, not bundle")
		}
		if h.Path == "" {
			return bad("host.path: the bundle to replay is required with mode bundle")
		}
		if len(c.Actions) > 0 {
			return bad("actions: a replayed bundle cannot run actions (host mode bundle); remove the actions section")
		}
		if c.MultiNode != nil {
			return bad("multi_node: a replayed bundle cannot run multi-node tests (host mode bundle)")
		}
	default:
		return bad("host.mode %q: live, sim or bundle", h.Mode)
	}
	// Sim and bundle hosts read no machine: keys that point at one would
	// be silently ignored.
	if c.HostRoot != "/" {
		return bad("host_root %q reads the real machine; host mode %s reads none (remove host_root)", c.HostRoot, h.Mode)
	}
	def := config.Defaults().Tools
	got := c.Checks.Tools
	if got.NvidiaSMI != def.NvidiaSMI || got.Dmesg != def.Dmesg || got.DCGMI != def.DCGMI || got.AllReducePerf != def.AllReducePerf ||
		!reflect.DeepEqual(got.AllReduceArgs, def.AllReduceArgs) || !reflect.DeepEqual(got.Launcher, def.Launcher) ||
		!reflect.DeepEqual(got.UseNVML, def.UseNVML) {
		return bad("checks.tools: tool paths, arguments, launcher and use_nvml run the real machine's tools; host mode %s runs none (only the timeouts apply)", h.Mode)
	}
	return nil
}

// OpenHost opens the host the config names: the live machine (host_root,
// checks.tools), a simulated node kept in the state dir, or a replayed
// bundle. The caller runs the agent on it.
func OpenHost(cfg *Config, log zerolog.Logger) (host.Host, error) {
	switch cfg.Host.mode() {
	case HostSim:
		return openSim(cfg, log)
	case HostBundle:
		b, err := bundle.Open(cfg.Host.Path)
		if err != nil {
			return nil, fmt.Errorf("host mode bundle: %w", err)
		}
		log.Info().Str("bundle", cfg.Host.Path).Str("hostname", b.Name()).Msg("host: replaying a support bundle")
		return b, nil
	}
	h, err := live.New(cfg.HostRoot, cfg.Checks.Tools)
	if err != nil {
		return nil, err
	}
	if cfg.Checks.Expect.GPUCount > 0 {
		h.SetGPUCount(cfg.Checks.Expect.GPUCount)
	}
	return h, nil
}
