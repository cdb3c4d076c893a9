// Package needs is how a test asks for something outside the Go toolchain (a
// tool on PATH, root, a capability): without it the test skips loudly on a
// developer's machine and fails under CI=true, where .ci/run installs
// everything the suite needs. A skip in CI would be a pass that tested nothing.
package needs

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run in CI (CI=true, as CI services set it).
func InCI() bool { return os.Getenv("CI") == "true" }

// Skip ends the test because what it needs is missing: a loud skip locally,
// a failure in CI.
func Skip(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("CI=true and this test's requirement is missing (.ci/run must provide it): %s", why)
	}
	t.Skipf("SKIPPED (CI=true would fail): %s", why)
}

// Tool returns the path of name on PATH, or ends the test through Skip with
// how to install it.
func Tool(t testing.TB, name, install string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Skip(t, "%s not on PATH (%s)", name, install)
	}
	return path
}

// Root ends the test through Skip unless it runs as root.
func Root(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root: %s", why)
	}
}

// Partly records that one part of a test could not run: logged loudly
// locally, an error (the test goes on, and fails) in CI.
func Partly(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if InCI() {
		t.Errorf("CI=true and part of this test cannot run (.ci/run must provide it): %s", why)
		return
	}
	t.Logf("SKIPPED PART (CI=true would fail): %s", why)
}
