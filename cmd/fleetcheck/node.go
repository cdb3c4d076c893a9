package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/node/collect"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/host/live"
	"github.com/fleetcheck/fleetcheck/node/inspect"
)

// nodeFlags are shared by run and analyze.
type nodeFlags struct {
	output     string
	checks     []string
	disruptive bool
	configFile string
	stateFile  string
	slurm      slurmFlags
}

func (f *nodeFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	cmd.Flags().StringSliceVar(&f.checks, "checks", nil, "run only these checks (comma separated; see `fleetcheck checks`)")
	cmd.Flags().StringVar(&f.configFile, "config", "", "expectations and limits (YAML, see docs/config.md)")
	cmd.Flags().StringVar(&f.stateFile, "state", "", "keep counter and Xid state in this file so the next run reports what is new")
	f.slurm.register(cmd)
}

func (f *nodeFlags) validate() error {
	if f.output != "table" && f.output != "json" {
		return fmt.Errorf("-o must be table or json, not %q", f.output)
	}
	return f.slurm.validate()
}

func (f *nodeFlags) loadConfig() (*config.Config, error) {
	if f.configFile == "" {
		return config.Defaults(), nil
	}
	return config.Load(f.configFile)
}

// oneShotProcs runs the one-shot commands (run, analyze) on one P
// (GOMAXPROCS=1) unless the operator set GOMAXPROCS. Their work is a
// few milliseconds of parsing plus waits on files and subprocesses
// (nvidia-smi, mpirun), which do not hold a P, so more Ps buy nothing;
// but every P the runtime uses keeps its own span cache and threads, so
// peak RSS grows with the core count: analyze of an 8-GPU bundle,
// started with GOMAXPROCS=1, 2 or 128, peaks at ~17.3, ~18.0 and
// ~22.2 MB (docs/scale.md, "The node binary"). Set here, after the
// runtime started, it saves about half of that on 2 CPUs. The agent
// is a daemon and keeps the runtime's default.
func oneShotProcs(lookupEnv func(string) (string, bool)) {
	if v, ok := lookupEnv("GOMAXPROCS"); ok && v != "" {
		return
	}
	runtime.GOMAXPROCS(1)
}

func newRunCmd() *cobra.Command {
	var f nodeFlags
	var root string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the passive checks on this host now and print the report",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			oneShotProcs(os.LookupEnv)
			if err := f.validate(); err != nil {
				return err
			}
			cfg, err := f.loadConfig()
			if err != nil {
				return err
			}
			h, err := live.New(root, cfg.Tools)
			if err != nil {
				return err
			}
			if cfg.Expect.GPUCount > 0 {
				h.SetGPUCount(cfg.Expect.GPUCount)
			}
			return inspectHost(cmd, h, cfg, &f, f.disruptive)
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&f.disruptive, "disruptive", false, "also run disruptive checks (nccl.allreduce, dcgm.diag): they take the GPUs")
	cmd.Flags().StringVar(&root, "root", "/", "read /proc and /sys under this directory (for testing)")
	return cmd
}

func newAnalyzeCmd() *cobra.Command {
	var f nodeFlags
	cmd := &cobra.Command{
		Use:   "analyze BUNDLE",
		Short: "Run the checks on a support bundle (directory or .tar.gz)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			oneShotProcs(os.LookupEnv)
			if err := f.validate(); err != nil {
				return err
			}
			cfg, err := f.loadConfig()
			if err != nil {
				return err
			}
			b, err := bundle.Open(args[0])
			if err != nil {
				return err
			}
			// A bundle's outputs are already captured: judging them
			// disrupts nothing, so every check whose data is there runs.
			return inspectHost(cmd, b, cfg, &f, true)
		},
	}
	f.register(cmd)
	return cmd
}

func inspectHost(cmd *cobra.Command, h host.Host, cfg *config.Config, f *nodeFlags, disruptive bool) error {
	list, err := checks.Select(registry.All(), f.checks, disruptive)
	if err != nil {
		return err
	}
	prev, err := loadState(f.stateFile)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	checksCtx := ctx
	if f.slurm.enabled {
		var end func()
		checksCtx, end = f.slurm.start(ctx, cmd.ErrOrStderr())
		defer end()
	}
	res := inspect.Run(checksCtx, h, inspect.Options{Config: cfg, Checks: list, Prev: prev})
	if f.stateFile != "" {
		if err := saveState(f.stateFile, res.State); err != nil {
			return err
		}
	}
	if err := writeReport(cmd.OutOrStdout(), f.output, &res.Report); err != nil {
		return err
	}
	if f.slurm.enabled {
		if err := f.slurm.apply(ctx, cmd.ErrOrStderr(), &res.Report); err != nil {
			return err
		}
	}
	if res.Report.Failed() {
		return errChecksFailed
	}
	return nil
}

func writeReport(w io.Writer, format string, r *report.Report) error {
	if format == "json" {
		return report.WriteJSON(w, r)
	}
	return report.WriteTable(w, r)
}

func loadState(p string) (*checks.State, error) {
	if p == "" {
		return nil, nil
	}
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	var st checks.State
	if err := json.Unmarshal(data, &st); err != nil {
		// A corrupt state file costs one run of deltas, not the run.
		fmt.Fprintf(os.Stderr, "fleetcheck: ignoring unreadable state file %s: %v\n", p, err)
		return nil, nil
	}
	return &st, nil
}

// saveState writes atomically: a crash mid-write must not leave half a file.
func saveState(p string, st *checks.State) error {
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return os.Rename(tmp, p)
}

func newCollectCmd() *cobra.Command {
	var opts collect.Options
	var root, configFile string
	cmd := &cobra.Command{
		Use:   "collect [PATH]",
		Short: "Capture a support bundle of this host (a directory, or .tar.gz by the name's ending)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg := config.Defaults()
			if configFile != "" {
				c, err := config.Load(configFile)
				if err != nil {
					return err
				}
				cfg = c
			}
			h, err := live.New(root, cfg.Tools)
			if err != nil {
				return err
			}
			out := collect.DefaultPath(h.Name(), time.Now())
			if len(args) == 1 {
				out = args[0]
			}
			w, err := bundle.Create(out, time.Now())
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			opts.Version = version
			sum, err := collect.Collect(ctx, h, w, opts)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("collect: %w", err)
			}
			abs, _ := filepath.Abs(out)
			var notes []string
			for src, st := range sum.Sources {
				if st.State != "ok" {
					notes = append(notes, fmt.Sprintf("%s %s (%s)", src, st.State, st.Error))
				}
			}
			pr := newPrinter(cmd.OutOrStdout())
			pr.printf("wrote %s: %d files, %d bytes\n", abs, sum.Files, sum.Bytes)
			for _, n := range notes {
				pr.printf("  %s\n", n)
			}
			return pr.err
		},
	}
	cmd.Flags().BoolVar(&opts.AllReduce, "nccl", false, "also run all_reduce_perf (disruptive)")
	cmd.Flags().BoolVar(&opts.DCGM, "dcgm", false, "also run dcgmi diag (disruptive at level 2 and above)")
	cmd.Flags().StringVar(&root, "root", "/", "read /proc and /sys under this directory (for testing)")
	cmd.Flags().StringVar(&configFile, "config", "", "config file (tools section: paths, timeouts, nccl arguments)")
	return cmd
}

func newChecksCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "checks",
		Short: "List the checks fleetcheck knows",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pr := newPrinter(cmd.OutOrStdout())
			for _, c := range registry.All() {
				kind := "passive"
				if c.Disruptive() {
					kind = "disruptive"
				}
				pr.printf("%-16s %s\n", c.Name(), kind)
			}
			return pr.err
		},
	}
}
