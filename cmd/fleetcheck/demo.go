//go:build !node

package main

import (
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/sim/demo"
)

func newDemoCmd() *cobra.Command {
	var opts demo.Options
	var output, scenario, html string
	var verbose bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a coordinator and a simulated fleet in one process, inject faults, check the fleet",
		Long: `demo starts a coordinator on a temporary data directory and N simulated
8x H100 nodes, each with a real agent connected over gRPC on 127.0.0.1. It
injects a few faults (uncorrectable ECC, a GPU off the bus, an IB port down,
a hung nvidia-smi, a down-trained PCIe link, thermal slowdown), runs every
passive check fleet-wide and prints the fleet table. --nodes goes up to
1000; the demo's timings grow with the fleet, and at most 64 agents join
the gossip pool, since every member shares this machine (docs/scale.md).
--serve keeps it running and prints every address it listens on (gRPC,
/metrics, gossip, and "console: http://127.0.0.1:PORT/", the web console). Logs are errors only (-v for more), in colour only on a
terminal.

--scenario picks what runs instead: the campaigns (sweep, rollout, burnin,
drill, remediation: 1,024 nodes, a month of faults) run the real campaign engines against a simulated fleet on a
virtual clock, so simulated hours take seconds; all runs the fleet
scenario, then every campaign.`,
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
			opts.Logger = demo.Logger(os.Stderr, verbose)
			opts.Version = version
			if output == "table" {
				opts.Progress = cmd.OutOrStdout()
			} else {
				opts.Progress = cmd.ErrOrStderr()
			}
			var campaigns []string
			switch scenario {
			case "fleet":
			case "all":
				campaigns = demo.CampaignScenarios()
			default:
				if !slices.Contains(demo.CampaignScenarios(), scenario) {
					return fmt.Errorf("--scenario must be fleet, %s or all, not %q", strings.Join(demo.CampaignScenarios(), ", "), scenario)
				}
				campaigns = []string{scenario}
			}
			if html != "" && !slices.Contains(campaigns, "burnin") {
				return fmt.Errorf("--html needs the burnin scenario (--scenario burnin or all)")
			}
			if opts.Serve && scenario != "fleet" {
				return fmt.Errorf("--serve applies to the fleet scenario only")
			}
			var res *demo.Result
			if scenario == "fleet" || scenario == "all" {
				r, err := demo.Run(ctx, opts)
				if err != nil {
					return err
				}
				res = r
				if output == "table" {
					if _, err := fmt.Fprintln(cmd.OutOrStdout()); err != nil {
						return err
					}
					if err := demo.WriteTable(cmd.OutOrStdout(), res); err != nil {
						return err
					}
				}
			}
			if len(campaigns) == 0 {
				if output == "json" {
					return report.WriteJSON(cmd.OutOrStdout(), res)
				}
				return nil
			}
			copts := demo.CampaignOptions{Progress: opts.Progress, Seed: uint64(opts.Seed), HTML: html}
			var c demo.Campaigns
			for _, name := range campaigns {
				if err := demo.RunCampaign(ctx, name, copts, &c); err != nil {
					return err
				}
			}
			if output == "json" {
				// The fleet result's fields stay at the top level, as
				// without --scenario; the campaigns sit beside them.
				return report.WriteJSON(cmd.OutOrStdout(), struct {
					*demo.Result
					Campaigns *demo.Campaigns `json:"campaigns"`
				}{res, &c})
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&opts.Nodes, "nodes", 16, "simulated nodes")
	cmd.Flags().Int64Var(&opts.Seed, "seed", 1, "chooses which nodes get which fault")
	cmd.Flags().BoolVar(&opts.Serve, "serve", false, "keep the coordinator and agents running after the scenario (Ctrl-C ends)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().StringVar(&scenario, "scenario", "fleet", "fleet (faults and a fleet check), sweep, rollout, burnin, drill, remediation, or all (fleet, then each campaign)")
	cmd.Flags().StringVar(&html, "html", "", "with the burnin scenario, write its HTML acceptance report to this file")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log coordinator and agent activity")
	return cmd
}
