package checks

import (
	"strings"
	"testing"
)

func TestQuote(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		max      int
		want     string
	}{
		{"short, trimmed", "  NCCL WARN x \n", 300, "NCCL WARN x"},
		{"exactly max", "abcd", 4, "abcd"},
		{"cut", "abcdef", 4, "abcd…"},
		{"cut on a rune boundary", "abcé", 4, "abc…"},
		{"nothing fits", "éé", 1, "…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Quote(tc.in, tc.max); got != tc.want {
				t.Errorf("Quote(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
			}
			if got := Quote(strings.Repeat("x", 1000), tc.max); len(got) > tc.max+len("…") {
				t.Errorf("Quote kept %d bytes, max %d", len(got), tc.max)
			}
		})
	}
}
