package compat

import "strings"

// CompareVersions orders two dotted version strings: -1, 0 or +1.
//
// A version is split into segments at '.', '-', '_', '+' and '~'. Segments of
// digits compare as numbers of any length ("08" == "8", so 535.161.08 is
// newer than 535.161.7); other segments compare as text, and a number sorts
// before text. A missing segment counts as 0, so "535.104" == "535.104.0" and
// "6.5.0-1007" < "6.5.0-1007-nvidia". The order is total on every string, so
// values read from a node never make a comparison fail.
func CompareVersions(a, b string) int {
	sa, sb := segments(a), segments(b)
	n := max(len(sa), len(sb))
	for i := 0; i < n; i++ {
		x, y := "0", "0"
		if i < len(sa) {
			x = sa[i]
		}
		if i < len(sb) {
			y = sb[i]
		}
		if c := compareSegment(x, y); c != 0 {
			return c
		}
	}
	return 0
}

func isSep(r rune) bool {
	switch r {
	case '.', '-', '_', '+', '~':
		return true
	}
	return false
}

// segments splits a version; empty segments (from "1..2") are dropped.
func segments(v string) []string {
	return strings.FieldsFunc(strings.TrimSpace(v), isSep)
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func compareSegment(x, y string) int {
	nx, ny := isDigits(x), isDigits(y)
	switch {
	case nx && ny:
		// Compare as numbers without converting: segments can be any length.
		x, y = strings.TrimLeft(x, "0"), strings.TrimLeft(y, "0")
		if len(x) != len(y) {
			if len(x) < len(y) {
				return -1
			}
			return 1
		}
		return strings.Compare(x, y)
	case nx:
		return -1
	case ny:
		return 1
	default:
		return strings.Compare(x, y)
	}
}

// hasPrefixVersion reports whether v starts with the segments of prefix,
// compared segment by segment ("535.129.03" is in branch "535", "5350.1" is not).
func hasPrefixVersion(v, prefix string) bool {
	sv, sp := segments(v), segments(prefix)
	if len(sv) < len(sp) {
		return false
	}
	for i := range sp {
		if compareSegment(sv[i], sp[i]) != 0 {
			return false
		}
	}
	return true
}
