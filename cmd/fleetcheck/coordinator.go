//go:build !node

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

	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/coordinator/metrics"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/promserve"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

func newCoordinatorCmd() *cobra.Command {
	var configFile, logLevel, logFormat string
	var plaintext bool
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
  tls:                          # mutual TLS 1.3 for agents and operators (docs/security.md)
    cert_file: coordinator-fleet.crt   # fleetcheck certs issue coordinator fleet --ip ...
    key_file: coordinator-fleet.key
    ca_file: ca.crt
    trust_domain: fleet.example.net
  # insecure: true              # instead of tls: plaintext, no authorization (demos, tests)
  gossip:                       # optional: dead or partitioned nodes marked unreachable in seconds (docs/gossip.md)
    bind: 10.0.0.5:7946         # explicit address, UDP and TCP; agents join the address Welcome announces
    keyring_file: gossip.keys   # optional encryption; rotate with fleetcheck gossip keys

Relative paths are relative to the config file. Certificate files replaced on disk
are served from the next handshake on, without a restart. /metrics (Prometheus) is
served on http_listen next to /healthz (docs/metrics.md). The web console
(console: {enabled: true}) serves on its own address (docs/console.md); SIGHUP
rereads its token file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile == "" {
				return fmt.Errorf("--config is required")
			}
			cfg, err := coordinator.LoadConfig(configFile)
			if err != nil {
				return err
			}
			if plaintext {
				if cfg.TLS != (coordinator.TLSConfig{}) {
					return fmt.Errorf("--insecure and a tls: section in %s; choose one", configFile)
				}
				cfg.Insecure = true
			}
			log, err := coordinatorLogger(os.Stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			raiseFileLimit(log)
			srv, certs, err := newCoordinator(cfg, log)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if certs != nil {
				go certs.Run(ctx, 0)
			}
			go reloadOnHUP(ctx, srv, log)
			return srv.Serve(ctx)
		},
	}
	cmd.Flags().StringVar(&configFile, "config", "", "coordinator configuration (YAML)")
	cmd.Flags().BoolVar(&plaintext, "insecure", false, "serve plaintext gRPC with no authorization (as insecure: true; demos and tests only)")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().StringVar(&logFormat, "log-format", "auto", "json, console, or auto (console when stderr is a terminal)")
	cmd.AddCommand(newCoordinatorBackupCmd())
	cmd.AddCommand(newCoordinatorMigrateCmd())
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
DIR/fleetcheck.db-shm, copy the backup to DIR/fleetcheck.db, start it.

With --config, a store_url of sqlite:PATH backs up that file; a PostgreSQL
store_url is refused: back PostgreSQL up with pg_dump (docs/store.md).`,
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
				if cfg.StoreURL != "" {
					t, err := sqldb.Parse(cfg.StoreURL)
					if err != nil {
						return err
					}
					if t.Dialect == sqldb.Postgres {
						return store.ErrBackupPostgres
					}
					return backupFile(cmd, t.Path, args[0])
				}
			}
			if dir == "" {
				return fmt.Errorf("--data-dir or --config is required")
			}
			start := time.Now()
			if err := store.BackupDir(cmd.Context(), dir, args[0]); err != nil {
				return err
			}
			return backupDone(cmd, dir, args[0], start)
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "the coordinator's data directory")
	cmd.Flags().StringVar(&configFile, "config", "", "take the data directory from this coordinator config (a relative data_dir is the config file's directory's)")
	return cmd
}

// backupFile backs up a store_url's SQLite file.
func backupFile(cmd *cobra.Command, path, dest string) error {
	start := time.Now()
	if err := store.BackupPath(cmd.Context(), path, dest); err != nil {
		return err
	}
	return backupDone(cmd, path, dest, start)
}

func backupDone(cmd *cobra.Command, src, dest string, start time.Time) error {
	fi, err := os.Stat(dest)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "backup of %s written to %s (%d bytes, %s)\n",
		src, dest, fi.Size(), time.Since(start).Round(time.Millisecond))
	return wrote(err)
}

// reloadOnHUP rereads the console's token file on each SIGHUP (the
// certificates reload by themselves when their files change).
func reloadOnHUP(ctx context.Context, srv *coordinator.Server, log zerolog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if err := srv.ReloadConsole(); err != nil {
				log.Error().Err(err).Msg("SIGHUP: console tokens not reloaded; the previous ones stay")
			}
		}
	}
}

// newCoordinator wires a coordinator from its config: mutual TLS and
// authorization (or the explicit insecure mode), and Prometheus metrics
// on its HTTP mux from a registry of its own. The Reloader, nil when
// insecure, is the caller's to Run.
func newCoordinator(cfg coordinator.Config, log zerolog.Logger) (*coordinator.Server, *pki.Reloader, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, nil, err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, nil, err
	}
	cm, err := metrics.NewCoordinator(reg)
	if err != nil {
		return nil, nil, err
	}
	opts, certs, err := coordinator.Secure(cfg, coordinator.Options{Logger: log, Version: version, Metrics: cm})
	if err != nil {
		return nil, nil, err
	}
	srv, err := coordinator.New(cfg, opts)
	if err != nil {
		return nil, nil, err
	}
	cm.Watch(srv.Stats)
	cm.WatchCampaigns(srv.CampaignStats)
	srv.HTTPMux().Handle("/metrics", promserve.Handler(reg))
	return srv, certs, nil
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

// raiseFileLimit lifts the soft limit on open files to the hard limit and
// says what it is: every connected agent holds a socket, and the common
// soft limit of 1,024 would refuse the 1,000th agent. The hard limit is the
// operating system's to raise (systemd LimitNOFILE=, limits.conf); see
// docs/scale.md.
func raiseFileLimit(log zerolog.Logger) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn().Err(err).Msg("cannot read the open file limit")
		return
	}
	if lim.Cur < lim.Max {
		was := lim.Cur
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			log.Warn().Err(err).Uint64("soft", was).Uint64("hard", lim.Max).Msg("cannot raise the open file limit")
			return
		}
	}
	ev := log.Info()
	if lim.Cur < 16384 {
		ev = log.Warn() // fewer than ~16,000 agents fit: say so where it will be seen
	}
	ev.Uint64("open_files", lim.Cur).Msg("open file limit (about one file per connected agent)")
}
