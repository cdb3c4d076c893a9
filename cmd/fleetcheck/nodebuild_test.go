package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/fleetcheck/fleetcheck/"

// serverOnly are this module's packages the slim node build must not
// contain, matched as any element of the package path (so they are still
// caught after a move into another folder): the campaign engines and
// their kit, the coordinator and its store, the Kubernetes drain adapter,
// the simulator, the demo and the load generator.
var serverOnly = []string{
	"sweep", "rollout", "burnin", "drill", "campaign", "campaigns", "campaigndb",
	"coordinator", "store", "kubernetes", "sim", "simfleet", "demo", "loadgen",
}

// forbiddenInNode says why pkg may not be in the node build ("" when it may).
func forbiddenInNode(pkg string) string {
	switch {
	case strings.HasPrefix(pkg, "k8s.io/") || strings.HasPrefix(pkg, "sigs.k8s.io/"):
		return "Kubernetes client libraries"
	case strings.Contains(strings.ToLower(pkg), "sqlite"):
		return "SQLite"
	case strings.HasPrefix(pkg, "github.com/jackc/pgx") || pkg == module+"internal/sqldb":
		return "PostgreSQL driver or the SQL layer over it"
	case strings.HasPrefix(pkg, module):
		for _, part := range strings.Split(strings.TrimPrefix(pkg, module), "/") {
			if slices.Contains(serverOnly, part) {
				return "server-side package " + part
			}
		}
	}
	return ""
}

// goTool finds the go command; the test fails without it (a guard that
// skips itself guards nothing).
func goTool(t *testing.T) string {
	t.Helper()
	// go test puts its own GOROOT/bin first on the test's PATH.
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go tool on PATH (%v): the node build's dependencies cannot be listed", err)
	}
	return p
}

func goListDeps(t *testing.T, tags string) []string {
	t.Helper()
	args := []string{"list", "-deps"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command(goTool(t), append(args, ".")...)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go %s .: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return strings.Fields(string(out))
}

// nodeTags are the tags `make build-node` builds bin/fleetcheck-node with
// (NODE_TAGS in the Makefile), so the guard lists what is shipped.
func nodeTags(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NODE_TAGS := "); ok {
			if tags := strings.TrimSpace(v); slices.Contains(strings.Split(tags, ","), "node") {
				return tags
			}
			t.Fatalf("Makefile: NODE_TAGS %q lacks node", v)
		}
	}
	t.Fatal("Makefile: no NODE_TAGS := line (make build-node's tags)")
	return ""
}

// TestNodeBuildDependencies lists what the node build (make build-node,
// bin/fleetcheck-node) links and fails on anything server-side: this is
// the import guard for the node side, with no way to skip. The full
// build is listed too, so a matcher that stopped matching would show.
func TestNodeBuildDependencies(t *testing.T) {
	t.Parallel()
	node := goListDeps(t, nodeTags(t))
	for _, must := range []string{module + "agent", module + "checks/registry", module + "node/inspect", module + "node/collect", module + "agent/metrics"} {
		if !slices.Contains(node, must) {
			t.Errorf("the node build lacks %s: not the node side?", must)
		}
	}
	for _, pkg := range node {
		if why := forbiddenInNode(pkg); why != "" {
			t.Errorf("the node build links %s (%s)", pkg, why)
		}
	}

	full := goListDeps(t, "")
	found := map[string]bool{}
	for _, pkg := range full {
		if why := forbiddenInNode(pkg); why != "" {
			found[strings.Fields(why)[0]] = true
		}
	}
	for _, want := range []string{"Kubernetes", "SQLite", "PostgreSQL", "server-side"} {
		if !found[want] {
			t.Errorf("the full build shows no %s package: the guard's matcher is broken", want)
		}
	}
}

func TestForbiddenInNode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pkg    string
		banned bool
	}{
		{"k8s.io/client-go/kubernetes", true},
		{"sigs.k8s.io/yaml", true},
		{"github.com/mattn/go-sqlite3", true},
		{module + "coordinator", true},
		{module + "campaigns/kit/campaigndb", true},
		{module + "campaigns/sweep", true},
		{module + "internal/sim", true},
		{module + "sim/simfleet", true},
		{module + "sim/loadgen", true},
		{module + "sim/demo", true},
		{module + "internal/drain/kubernetes", true},
		{"github.com/jackc/pgx/v5/pgconn", true},
		{module + "internal/sqldb", true},
		{module + "baselines/reference", false},
		{module + "agent", false},
		{module + "agent/spool", false},
		{module + "checks/gpu", false},
		{module + "simple", false},
		{"github.com/hashicorp/memberlist", false},
	} {
		if got := forbiddenInNode(tc.pkg) != ""; got != tc.banned {
			t.Errorf("%s: banned %v, want %v", tc.pkg, got, tc.banned)
		}
	}
}
