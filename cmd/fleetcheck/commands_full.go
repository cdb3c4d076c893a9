//go:build !node

package main

import "github.com/spf13/cobra"

// programName is what the binary calls itself in usage and errors.
const programName = "fleetcheck"

// serverCommands are the verbs the slim node build leaves out: the
// coordinator, the operator's verbs against it, certificates, gossip and
// the demo (they bring client-go, SQLite, the campaign engines and the
// simulator).
func serverCommands() []*cobra.Command {
	return []*cobra.Command{
		newCoordinatorCmd(), newNodesCmd(), newResultsCmd(), newCheckCmd(), newEventsCmd(), newCertsCmd(), newDemoCmd(),
		newBaselineCmd(), newSweepCmd(), newRolloutCmd(), newBurninCmd(), newDrillCmd(), newRemediationCmd(), newGossipCmd(), newTriageCmd(),
	}
}
