// Package dcgm holds the dcgm.* checks: dcgm.diag judges a dcgmi diag run.
// It takes the node's GPUs for itself, so it only runs when asked for.
package dcgm

import "github.com/fleetcheck/fleetcheck/checks"

// maxQuote bounds how much of a tool's line a finding message quotes.
const maxQuote = 300

func quote(s string) string { return checks.Quote(s, maxQuote) }
