// Command fleetcheck is the node agent, the coordinator and the operator's
// CLI of a GPU-fleet health checker. Only this package wires real
// dependencies and decides exit codes.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Exit statuses (docs/design.md): 0 nothing failed or errored, 1 some check
// failed or errored, 2 the command itself could not run.
const (
	exitOK      = 0
	exitChecks  = 1
	exitCommand = 2
)

// checksFailed is returned by commands whose report has a failed or
// errored check: exit 1 without an error line (the report says it all).
var errChecksFailed = errors.New("checks failed")

func main() {
	root := newRoot()
	err := root.Execute()
	switch {
	case err == nil:
		os.Exit(exitOK)
	case errors.Is(err, errChecksFailed):
		os.Exit(exitChecks)
	default:
		fmt.Fprintf(os.Stderr, "%s: %v\n", programName, err)
		os.Exit(exitCommand)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           programName,
		Short:         "Health checks and burn-in for GPU fleets",
		Long:          "fleetcheck inspects GPU nodes (GPUs, NVLink, InfiniBand, NCCL) and says, with evidence, what is wrong.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.AddCommand(newRunCmd(), newAnalyzeCmd(), newCollectCmd(), newChecksCmd(), newAgentCmd())
	// The coordinator, operator and demo verbs are in the full build only
	// (commands_full.go); the slim node build (-tags node) has none.
	root.AddCommand(serverCommands()...)
	return root
}
