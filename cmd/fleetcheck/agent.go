package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/agent/metrics"
	"github.com/fleetcheck/fleetcheck/internal/promserve"
)

func newAgentCmd() *cobra.Command {
	var configFile, logLevel, logFormat string
	cmd := &cobra.Command{
		Use:   "agent --config FILE",
		Short: "Run the node agent: scheduled checks, requested checks, results kept until the coordinator acknowledges them",
		Long: "The node daemon (docs/agent.md): runs the enabled passive checks every interval, " +
			"runs the checks the coordinator asks for by name when its config enables them, and " +
			"keeps every result on local disk until the coordinator acknowledges it.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile == "" {
				return fmt.Errorf("--config is required (see docs/agent.md)")
			}
			logger, err := agentLogger(os.Stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			cfg, err := agent.LoadConfig(configFile)
			if err != nil {
				return err
			}
			h, err := agent.OpenHost(cfg, logger.With().Str("node", cfg.Node).Logger())
			if err != nil {
				return err
			}
			reg := prometheus.NewRegistry()
			for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
				if err := reg.Register(c); err != nil {
					return err
				}
			}
			am, err := metrics.NewAgent(reg, metrics.AgentInfo{Node: cfg.Node, Version: version})
			if err != nil {
				return err
			}
			a, err := agent.New(cfg, h, logger, agent.WithVersion(version), agent.WithMetrics(am))
			if err != nil {
				return err
			}
			if cfg.MetricsListen != "off" && cfg.MetricsListen != "" {
				ms, err := promserve.Listen(cfg.MetricsListen, reg, logger)
				if err != nil {
					return err
				}
				logger.Info().Str("addr", ms.Addr().String()).Msg("serving /metrics")
				defer func() {
					sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					if err := ms.Shutdown(sctx); err != nil {
						logger.Warn().Err(err).Msg("metrics server shutdown")
					}
				}()
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return a.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&configFile, "config", "", "agent configuration (YAML, see docs/agent.md)")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().StringVar(&logFormat, "log-format", "auto", "json, console, or auto (console when stderr is a terminal)")
	return cmd
}

// agentLogger builds the daemon's logger: JSON lines for log collectors,
// human-readable when a person watches the terminal.
func agentLogger(w *os.File, format, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	var out io.Writer = w
	switch format {
	case "json":
	case "console":
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	case "auto":
		if isatty.IsTerminal(w.Fd()) {
			out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
		}
	default:
		return zerolog.Logger{}, fmt.Errorf("--log-format %q: want json, console or auto", format)
	}
	return zerolog.New(out).Level(lvl).With().Timestamp().Logger(), nil
}
