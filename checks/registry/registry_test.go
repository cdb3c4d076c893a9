package registry

import (
	"slices"
	"testing"
)

// TestCauseOrderNamesEveryCheck: a check missing from CauseOrder would
// sort last in every node's findings.
func TestCauseOrderNamesEveryCheck(t *testing.T) {
	t.Parallel()
	got, want := slices.Sorted(slices.Values(CauseOrder())), slices.Sorted(slices.Values(Names()))
	if !slices.Equal(got, want) {
		t.Errorf("CauseOrder %v\n   checks %v", got, want)
	}
}
