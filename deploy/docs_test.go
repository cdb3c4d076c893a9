package deploy

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/checks/registry"
)

// TestPrerequisitesNameEveryCheck: docs/deploy.md's prerequisites table
// has one row for each check in the registry, and none for a check that
// does not exist, so an operator learns what every check needs installed.
func TestPrerequisitesNameEveryCheck(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Node prerequisites: which check needs which tool\n")
	if !ok {
		t.Fatal("docs/deploy.md has no section \"Node prerequisites: which check needs which tool\"")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var rows []string
	for line := range strings.SplitSeq(sec, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "| "), " |")
		name := strings.Trim(first, "` ")
		if slices.Contains(rows, name) {
			t.Errorf("%s has two rows", name)
		}
		rows = append(rows, name)
	}
	if want := registry.Names(); !slices.Equal(rows, want) {
		t.Errorf("prerequisite rows %v\nwant the registry's checks, in report order: %v", rows, want)
	}
}
