// Package perfchecks holds the disruptive checks that judge measured
// performance and diagnostics: nccl.allreduce (nccl-tests all_reduce_perf)
// and dcgm.diag (dcgmi diag). Both take the node's GPUs for themselves, so
// they only run when asked for.
package perfchecks

import (
	"math"
	"strings"
	"unicode/utf8"
)

// maxQuote bounds how much of a tool's line a finding message quotes.
const maxQuote = 300

// quote trims a tool's line for a message.
func quote(s string) string {
	s = strings.TrimSpace(s)
	if len(s) <= maxQuote {
		return s
	}
	cut := maxQuote
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
