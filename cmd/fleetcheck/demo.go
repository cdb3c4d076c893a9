package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/fleetcheck/fleetcheck/demo"
	"github.com/fleetcheck/fleetcheck/report"
)

func newDemoCmd() *cobra.Command {
	var opts demo.Options
	var output string
	var verbose bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a coordinator and a simulated fleet in one process, inject faults, check the fleet",
		Long: `demo starts a coordinator on a temporary data directory and N simulated
8x H100 nodes, each with a real agent connected over gRPC on 127.0.0.1. It
injects a few faults (uncorrectable ECC, a GPU off the bus, an IB port down,
a hung nvidia-smi, a down-trained PCIe link, thermal slowdown), runs every
passive check fleet-wide and prints the fleet table.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o must be table or json, not %q", output)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// The scenario prints its own steps; logs only for errors
			// unless asked (the coordinator's insecure warning included:
			// the demo is plaintext on loopback by design, and says so).
			level := zerolog.ErrorLevel
			if verbose {
				level = zerolog.InfoLevel
			}
			opts.Logger = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(level).With().Timestamp().Logger()
			opts.Version = version
			if output == "table" {
				opts.Progress = cmd.OutOrStdout()
			} else {
				opts.Progress = cmd.ErrOrStderr()
			}
			res, err := demo.Run(ctx, opts)
			if err != nil {
				return err
			}
			if output == "json" {
				return report.WriteJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return demo.WriteTable(cmd.OutOrStdout(), res)
		},
	}
	cmd.Flags().IntVar(&opts.Nodes, "nodes", 16, "simulated nodes")
	cmd.Flags().Int64Var(&opts.Seed, "seed", 1, "chooses which nodes get which fault")
	cmd.Flags().BoolVar(&opts.Serve, "serve", false, "keep the coordinator and agents running after the scenario (Ctrl-C ends)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log coordinator and agent activity")
	return cmd
}
