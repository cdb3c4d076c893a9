// Package nccl holds the nccl.* checks: nccl.allreduce judges an nccl-tests
// all_reduce_perf run. It takes the node's GPUs and network for itself, so
// it only runs when asked for.
package nccl

import (
	"math"

	"github.com/fleetcheck/fleetcheck/checks"
)

// maxQuote bounds how much of a tool's line a finding message quotes.
const maxQuote = 300

func quote(s string) string { return checks.Quote(s, maxQuote) }

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
