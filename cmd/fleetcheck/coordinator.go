package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/store"
)

func newCoordinatorCmd() *cobra.Command {
	var configFile, logLevel, logFormat string
	cmd := &cobra.Command{
		Use:   "coordinator --config FILE",
		Short: "Run the coordinator: agents stream results in, operators query and dispatch checks",
		Long: `Run the coordinator until SIGINT or SIGTERM, then stop gracefully: agent streams
are ended (agents keep their results and reconnect), queued results are committed,
the store is closed.

The config is YAML:

  listen: 127.0.0.1:7443        # gRPC for agents and operators
  http_listen: 127.0.0.1:7444   # /healthz: 503 "not serving" until the store is open
  data_dir: /var/lib/fleetcheck # the SQLite database lives here
  retention_days: 30            # raw results older than this are deleted; summaries and events stay
  heartbeat_interval: 10s       # a stream silent for 3 intervals is closed, its node unreachable
  insecure: true                # plaintext gRPC; required until TLS is configured`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile == "" {
				return fmt.Errorf("--config is required")
			}
			cfg, err := coordinator.LoadConfig(configFile)
			if err != nil {
				return err
			}
			log, err := coordinatorLogger(os.Stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			srv, err := coordinator.New(cfg, coordinator.Options{Logger: log, Version: version})
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return srv.Serve(ctx)
		},
	}
	cmd.Flags().StringVar(&configFile, "config", "", "coordinator configuration (YAML)")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().StringVar(&logFormat, "log-format", "auto", "json, console, or auto (console when stderr is a terminal)")
	cmd.AddCommand(newCoordinatorBackupCmd())
	return cmd
}

func newCoordinatorBackupCmd() *cobra.Command {
	var dataDir, configFile string
	cmd := &cobra.Command{
		Use:   "backup (--data-dir DIR | --config FILE) DEST",
		Short: "Write a consistent copy of the coordinator's database to DEST",
		Long: `Write a consistent copy of the coordinator's database to DEST, a file that must
not exist yet.

It reads the data directory directly, so run it on the coordinator's host. It is
safe while the coordinator runs: SQLite lets a second process read the live
database, and the copy (VACUUM INTO) is one snapshot, taken without stopping
ingest. It never creates or upgrades a database.

To restore: stop the coordinator, remove DIR/fleetcheck.db-wal and
DIR/fleetcheck.db-shm, copy the backup to DIR/fleetcheck.db, start it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := dataDir
			if configFile != "" {
				if dir != "" {
					return fmt.Errorf("give --data-dir or --config, not both")
				}
				cfg, err := coordinator.LoadConfig(configFile)
				if err != nil {
					return err
				}
				dir = cfg.DataDir
			}
			if dir == "" {
				return fmt.Errorf("--data-dir or --config is required")
			}
			start := time.Now()
			if err := store.BackupDir(cmd.Context(), dir, args[0]); err != nil {
				return err
			}
			fi, err := os.Stat(args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "backup of %s written to %s (%d bytes, %s)\n",
				dir, args[0], fi.Size(), time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "the coordinator's data directory")
	cmd.Flags().StringVar(&configFile, "config", "", "take the data directory from this coordinator config")
	return cmd
}

// coordinatorLogger logs JSON lines for collectors, or readable lines for
// a person at a terminal.
func coordinatorLogger(w *os.File, format, level string) (zerolog.Logger, error) {
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
	return zerolog.New(out).Level(lvl).With().Timestamp().Str("component", "coordinator").Logger(), nil
}
