package kubernetes

import (
	"os/exec"
	"strings"
	"testing"
)

// TestAgentDoesNotImport keeps client-go out of the node agent: this
// adapter is the coordinator's.
func TestAgentDoesNotImport(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go tool not on PATH")
	}
	out, err := exec.Command(goTool, "list", "-deps", "github.com/fleetcheck/fleetcheck/agent/...").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v: %s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "github.com/fleetcheck/fleetcheck/drain/kubernetes" || strings.HasPrefix(pkg, "k8s.io/") {
			t.Errorf("the agent imports %s", pkg)
		}
	}
}
