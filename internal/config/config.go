// Package config holds a node's expectations and limits: what the checks
// compare against. Every field is optional; without an expectation a check
// judges what it can (GPUs against each other, ports against their siblings)
// and does not invent limits.
package config

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/fleetcheck/fleetcheck/internal/compat"
)

// Config is the checks' configuration (`--config FILE` for run/analyze, the
// `checks:` section of an agent's config).
type Config struct {
	Expect     Expect         `yaml:"expect"`
	Limits     Limits         `yaml:"limits"`
	Xid        XidConfig      `yaml:"xid"`
	NCCL       NCCLConfig     `yaml:"nccl"`
	Processes  ProcessConfig  `yaml:"processes"`
	PeerMem    PeerMemConfig  `yaml:"peermem"`
	Matrix     *compat.Matrix `yaml:"matrix"`      // inline compatibility matrix
	MatrixFile string         `yaml:"matrix_file"` // or a path to one (relative to the config file)
	Tools      Tools          `yaml:"tools"`
}

// Expect is the node's expected shape. Zero values mean "no expectation".
type Expect struct {
	GPUCount   int     `yaml:"gpu_count"`
	GPUModel   string  `yaml:"gpu_model"` // substring of the product name, e.g. "H100"
	IBPorts    int     `yaml:"ib_ports"`  // InfiniBand ports expected ACTIVE
	IBRateGbps float64 `yaml:"ib_rate_gbps"`
	// NVSwitch says whether the node has an NVSwitch fabric (gpu.fabric then
	// requires Fabric Manager); nil means "judge from the GPUs".
	NVSwitch *bool `yaml:"nvswitch"`

	ECCEnabled      *bool  `yaml:"ecc_enabled"`
	PersistenceMode *bool  `yaml:"persistence_mode"`
	MIGEnabled      *bool  `yaml:"mig_enabled"`
	ComputeMode     string `yaml:"compute_mode"` // "Default", "Exclusive_Process"
}

// Limits are numeric thresholds. Defaults come from Defaults().
type Limits struct {
	// GPUTempWarnC warns above this core temperature (DOMAIN: sustained > 85 °C).
	GPUTempWarnC float64 `yaml:"gpu_temp_warn_c"`
	// GPUTempFailC fails above this; 0 means "the GPU's own slowdown threshold".
	GPUTempFailC float64 `yaml:"gpu_temp_fail_c"`
	// MemoryTempFailC fails above this HBM temperature; 0 means no limit.
	MemoryTempFailC float64 `yaml:"memory_temp_fail_c"`
	// RetiredPagesMax fails when retired pages (single + double bit) exceed it.
	RetiredPagesMax uint64 `yaml:"retired_pages_max"`
	// IBCounterRise maps an IB error counter to the largest rise allowed
	// between two runs; a larger rise fails. Counters not listed are not judged.
	IBCounterRise map[string]uint64 `yaml:"ib_counter_rise"`
	// IBCounterTotal maps a counter to the largest lifetime value allowed when
	// there is no previous run; absent means lifetime totals are not judged
	// (healthy long-running ports are rarely at zero).
	IBCounterTotal map[string]uint64 `yaml:"ib_counter_total"`
	// NVLinkErrorRise is the largest rise of an NVLink error counter between runs.
	NVLinkErrorRise uint64 `yaml:"nvlink_error_rise"`
}

// XidConfig tunes gpu.xid.
type XidConfig struct {
	Lookback Duration `yaml:"lookback"`
	// Overrides maps an Xid to an action (none, monitor, restart_app,
	// reset_gpu, reboot, drain, replace, reseat), replacing the catalog's.
	Overrides map[int]string `yaml:"overrides"`
	// Ignore lists Xids never reported.
	Ignore []int `yaml:"ignore"`
}

// NCCLConfig tunes nccl.allreduce.
type NCCLConfig struct {
	// MinBusBWGbps fails when busbw at the largest size is below it (GB/s).
	MinBusBWGBps float64 `yaml:"min_busbw_gbps"`
	// BaselineGBps is a reference busbw; deviation beyond MaxDeviation fails.
	BaselineGBps float64 `yaml:"baseline_gbps"`
	MaxDeviation float64 `yaml:"max_deviation"`
	// ExpectTransport is "IB" when multi-node runs must use InfiniBand; a
	// NET/Socket fallback then fails.
	ExpectTransport string `yaml:"expect_transport"`
}

// ProcessConfig tunes gpu.processes.
type ProcessConfig struct {
	// ExpectIdle says no workload should hold GPU memory (a drained or idle
	// node): any process holding memory is a ghost.
	ExpectIdle bool `yaml:"expect_idle"`
	// Allowed lists process names that may hold GPU memory on an idle node
	// (monitoring agents, the DCGM host engine).
	Allowed []string `yaml:"allowed"`
}

// PeerMemConfig tunes gpu.peermem.
type PeerMemConfig struct {
	// Required: nil = required when the node has IB HCAs; false turns the check off.
	Required *bool `yaml:"required"`
}

// Tools says how a live host runs its tools.
type Tools struct {
	NvidiaSMI     string   `yaml:"nvidia_smi"`      // path, default "nvidia-smi"
	Dmesg         string   `yaml:"dmesg"`           // default "dmesg"
	DCGMI         string   `yaml:"dcgmi"`           // default "dcgmi"
	DCGMLevel     int      `yaml:"dcgm_level"`      // default 1
	AllReducePerf string   `yaml:"all_reduce_perf"` // default "all_reduce_perf"
	AllReduceArgs []string `yaml:"all_reduce_args"` // default -b 8 -e 8G -f 2 -g <gpus>
	// Launcher is an optional prefix such as ["mpirun", "-np", "8"].
	Launcher    []string `yaml:"launcher"`
	Timeout     Duration `yaml:"timeout"`      // per passive tool, default 30s
	NCCLTimeout Duration `yaml:"nccl_timeout"` // default 10m
	DCGMTimeout Duration `yaml:"dcgm_timeout"` // default 15m
	// UseNVML prefers NVML over nvidia-smi when the library loads (default true).
	UseNVML *bool `yaml:"use_nvml"`
}

// Duration is a time.Duration that reads "30s" / "24h" in YAML.
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			// 600 is not 600 ns, nor 600 s: say so rather than guess.
			return fmt.Errorf("line %d: bad duration %q: a bare number has no unit; write it with one, e.g. %ss", n.Line, s, s)
		}
		return fmt.Errorf("line %d: bad duration %q: %w", n.Line, s, err)
	}
	if v < 0 {
		return fmt.Errorf("line %d: negative duration %q", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns the duration, or def when unset.
func (d Duration) D(def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return time.Duration(d)
}

// Defaults returns a Config with the default limits and no expectations.
func Defaults() *Config {
	return &Config{
		Limits: Limits{
			GPUTempWarnC:    85,
			RetiredPagesMax: 60,
			IBCounterRise: map[string]uint64{
				"symbol_error":                    10,
				"link_downed":                     0,
				"link_error_recovery":             0,
				"port_rcv_errors":                 10,
				"port_rcv_remote_physical_errors": 10,
				"local_link_integrity_errors":     0,
				"excessive_buffer_overrun_errors": 10,
			},
		},
		Xid:  XidConfig{Lookback: Duration(24 * time.Hour)},
		NCCL: NCCLConfig{MaxDeviation: 0.30},
	}
}

// ErrInvalid wraps every validation error.
var ErrInvalid = errors.New("invalid config")

// Parse reads a YAML config over the defaults and validates it. Unknown keys
// are errors: a misspelled limit must not silently fall back to a default.
func Parse(data []byte) (*Config, error) {
	c := Defaults()
	// An empty file (io.EOF) is a valid config: all defaults.
	if err := DecodeStrict(data, c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	// Checked here, not in Validate: Load fills Matrix from MatrixFile.
	if c.Matrix != nil && c.MatrixFile != "" {
		return nil, fmt.Errorf("%w: set matrix or matrix_file, not both", ErrInvalid)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Load reads a config file; a matrix_file is resolved relative to it.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c.ResolvePaths(ConfigDir(path))
	if c.MatrixFile != "" && c.Matrix == nil {
		m, err := compat.Load(c.MatrixFile)
		if err != nil {
			return nil, fmt.Errorf("%s: matrix_file: %w", path, err)
		}
		c.Matrix = m
	}
	return c, nil
}

// Ranges of the node config's numeric values (docs/config.md, "Ranges").
var (
	rangeGPUCount     = R(0, 64)
	rangeIBPorts      = R(0, 64)
	rangeIBRate       = R(0.0, 3200) // Gb/s per port: XDR is 800
	rangeTempC        = R(0.0, 150)
	rangeRetiredPages = R[uint64](0, 100_000)
	rangeCounter      = R[uint64](0, math.MaxUint32) // IB and NVLink error counters are at most 32 bits
	rangeLookback     = R(Duration(time.Minute), Duration(30*24*time.Hour))
	rangeXid          = R(1, 9999)
	rangeBusBW        = R(0.0, 10_000) // GB/s
	rangeDeviation    = R(0.0, 0.99)
	rangeDCGMLevel    = R(1, 4)
	rangeToolTimeout  = R(Duration(time.Second), Duration(10*time.Minute))
	rangeLongTimeout  = R(Duration(time.Second), Duration(12*time.Hour)) // nccl and dcgm level 4 run long
)

// ConfigDir is the directory relative paths in the config file at path
// are taken against: the file's own, made absolute (so a later change of
// working directory cannot move them).
func ConfigDir(path string) string {
	dir := filepath.Dir(path)
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

// ResolvePath makes a relative path absolute against base, the config
// file's directory (ConfigDir); "" and absolute paths stay as they are.
func ResolvePath(base string, p *string) {
	if *p != "" && !filepath.IsAbs(*p) {
		*p = filepath.Join(base, *p)
	}
}

// ResolveProgram is ResolvePath for a program: a bare name ("nvidia-smi")
// is looked up in PATH when run and stays as it is; a relative path with
// a directory in it ("bin/nvidia-smi") is taken against base.
func ResolveProgram(base string, p *string) {
	if strings.ContainsRune(*p, filepath.Separator) {
		ResolvePath(base, p)
	}
}

// ResolvePaths takes the config's relative paths against base, the config
// file's directory: matrix_file and the tools' programs.
func (c *Config) ResolvePaths(base string) {
	ResolvePath(base, &c.MatrixFile)
	for _, p := range []*string{&c.Tools.NvidiaSMI, &c.Tools.Dmesg, &c.Tools.DCGMI, &c.Tools.AllReducePerf} {
		ResolveProgram(base, p)
	}
	if len(c.Tools.Launcher) > 0 {
		ResolveProgram(base, &c.Tools.Launcher[0])
	}
}

// Validate checks what YAML types cannot: every numeric value against its
// range (reported all at once), actions and transports. Every error wraps
// ErrInvalid.
func (c *Config) Validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrInvalid}, a...)...) }
	l := c.Limits
	errs := []error{
		rangeGPUCount.Check("expect.gpu_count", c.Expect.GPUCount),
		rangeIBPorts.Check("expect.ib_ports", c.Expect.IBPorts),
		rangeIBRate.Check("expect.ib_rate_gbps", c.Expect.IBRateGbps),
		rangeTempC.Check("limits.gpu_temp_warn_c", l.GPUTempWarnC),
		rangeTempC.Check("limits.gpu_temp_fail_c", l.GPUTempFailC),
		rangeTempC.Check("limits.memory_temp_fail_c", l.MemoryTempFailC),
		rangeRetiredPages.Check("limits.retired_pages_max", l.RetiredPagesMax),
		rangeCounter.Check("limits.nvlink_error_rise", l.NVLinkErrorRise),
		rangeLookback.CheckOrZero("xid.lookback", c.Xid.Lookback),
		rangeBusBW.Check("nccl.min_busbw_gbps", c.NCCL.MinBusBWGBps),
		rangeBusBW.Check("nccl.baseline_gbps", c.NCCL.BaselineGBps),
		rangeDeviation.Check("nccl.max_deviation", c.NCCL.MaxDeviation),
		rangeDCGMLevel.CheckOrZero("tools.dcgm_level", c.Tools.DCGMLevel),
		rangeToolTimeout.CheckOrZero("tools.timeout", c.Tools.Timeout),
		rangeLongTimeout.CheckOrZero("tools.nccl_timeout", c.Tools.NCCLTimeout),
		rangeLongTimeout.CheckOrZero("tools.dcgm_timeout", c.Tools.DCGMTimeout),
	}
	for _, m := range []struct {
		key string
		m   map[string]uint64
	}{{"limits.ib_counter_rise", l.IBCounterRise}, {"limits.ib_counter_total", l.IBCounterTotal}} {
		for _, k := range slices.Sorted(maps.Keys(m.m)) {
			errs = append(errs, rangeCounter.Check(m.key+"."+k, m.m[k]))
		}
	}
	for _, x := range slices.Sorted(maps.Keys(c.Xid.Overrides)) {
		errs = append(errs, rangeXid.Check("xid.overrides key", x))
		if a := c.Xid.Overrides[x]; !validAction(a) {
			errs = append(errs, fmt.Errorf("xid.overrides[%d]: unknown action %q", x, a))
		}
	}
	for _, x := range c.Xid.Ignore {
		errs = append(errs, rangeXid.Check("xid.ignore item", x))
	}
	switch c.NCCL.ExpectTransport {
	case "", "IB", "Socket":
	default:
		errs = append(errs, fmt.Errorf("nccl.expect_transport must be IB or Socket, not %q", c.NCCL.ExpectTransport))
	}
	if err := errors.Join(errs...); err != nil {
		return bad("%w", err)
	}
	return nil
}

func validAction(a string) bool {
	switch a {
	case "none", "monitor", "restart_app", "reset_gpu", "reboot", "drain", "replace", "reseat":
		return true
	}
	return false
}
