//go:build node

package main

import "github.com/spf13/cobra"

// programName is what the binary calls itself in usage and errors:
// `make build-node` writes bin/fleetcheck-node from this package with
// -tags node.
const programName = "fleetcheck-node"

// serverCommands is empty in the slim node build: run, collect, analyze,
// checks and agent only (docs/design.md, fleetcheck-node).
func serverCommands() []*cobra.Command { return nil }
