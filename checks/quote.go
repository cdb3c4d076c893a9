package checks

import (
	"strings"
	"unicode/utf8"
)

// Quote trims a tool's line for a finding message: surrounding space off,
// at most max bytes, cut on a rune boundary with "…" marking the cut.
func Quote(s string, max int) string {
	s = strings.TrimSpace(s)
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
