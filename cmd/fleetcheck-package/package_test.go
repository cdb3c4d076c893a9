package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/internal/needs"
)

const repoRoot = "../.."

// need finds a tool the test cannot do without: missing, it skips loudly
// on a developer's machine and fails under CI=true (.ci/run installs it).
func need(t *testing.T, tool string) string {
	t.Helper()
	return needs.Tool(t, tool, ".ci/run installs it")
}

func goBuild(t *testing.T, out string, args ...string) {
	t.Helper()
	// go test puts its own GOROOT/bin first on the test's PATH.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go tool on PATH: %v", err)
	}
	cmd := exec.Command(goTool, append(append([]string{"build", "-o", out}, args...), "./cmd/fleetcheck")...)
	cmd.Dir = repoRoot
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", strings.Join(args, " "), err, b)
	}
}

func runOut(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, b)
	}
	return string(b)
}

// fakeUserTools are useradd and chown that act on the throwaway root
// only: useradd adds the user to ROOT/etc/passwd, chown logs.
func fakeUserTools(t *testing.T, dir string) (pathDir, log string) {
	t.Helper()
	pathDir = filepath.Join(dir, "fakebin")
	log = filepath.Join(dir, "fake.log")
	if err := os.MkdirAll(pathDir, 0o755); err != nil {
		t.Fatal(err)
	}
	logLine := `echo "$(basename "$0") $*" >>` + log + "\n"
	tools := map[string]string{
		"useradd":   logLine + `[ "$1" = --root ] || exit 9` + "\n" + `mkdir -p "$2/etc" && echo 'fleetcheck:x:999:999::/var/lib/fleetcheck:/usr/sbin/nologin' >>"$2/etc/passwd"` + "\n",
		"adduser":   logLine + "exit 9\n", // must not be used under DPKG_ROOT
		"chown":     logLine,
		"systemctl": logLine + "exit 9\n", // must not be used under DPKG_ROOT
	}
	for name, body := range tools {
		if err := os.WriteFile(filepath.Join(pathDir, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return pathDir, log
}

// newRoot is an empty throwaway root with a dpkg database.
func newRoot(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// dpkgInstall installs debs into root as dpkg would on a host, maintainer
// scripts included (run outside a chroot, with DPKG_ROOT set; libc is
// the host's, so dependencies are not checked).
func dpkgInstall(t *testing.T, root, fakePath string, debs ...string) string {
	t.Helper()
	args := append([]string{"--root=" + root, "--force-script-chrootless", "--force-depends", "--force-not-root", "-i"}, debs...)
	return runOut(t, []string{"PATH=" + fakePath + ":" + os.Getenv("PATH")}, "dpkg", args...)
}

func buildPackages(t *testing.T, in inputs, dir string) (node, coord string) {
	t.Helper()
	p, err := nodePackage(in)
	if err != nil {
		t.Fatal(err)
	}
	if node, err = writePackage(p, dir, in.mtime); err != nil {
		t.Fatal(err)
	}
	p, err = coordinatorPackage(in)
	if err != nil {
		t.Fatal(err)
	}
	if coord, err = writePackage(p, dir, in.mtime); err != nil {
		t.Fatal(err)
	}
	return node, coord
}

// TestPackagesInstallAndUpgrade builds both binaries and packages,
// installs them into a throwaway root with dpkg, runs the node binary
// from there, verifies the installed units with systemd-analyze, and
// upgrades the node package over an edited agent.yaml.
func TestPackagesInstallAndUpgrade(t *testing.T) {
	need(t, "dpkg")
	need(t, "dpkg-deb")
	dir := t.TempDir()
	nodeBin, fullBin := filepath.Join(dir, "fleetcheck-node"), filepath.Join(dir, "fleetcheck")
	goBuild(t, nodeBin, "-tags", "node,grpcnotrace", "-trimpath", "-ldflags", "-s -w -X main.version=1.0.0")
	goBuild(t, fullBin, "-ldflags", "-X main.version=1.0.0")

	in := inputs{src: repoRoot, version: "1.0.0", arch: runtime.GOARCH, nodeBinary: nodeBin, fullBinary: fullBin,
		mtime: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	v1 := filepath.Join(dir, "v1")
	nodeDeb, coordDeb := buildPackages(t, in, v1)

	// The control data dpkg keeps across upgrades.
	if got := runOut(t, nil, "dpkg-deb", "-I", nodeDeb, "conffiles"); got != "/etc/fleetcheck/agent.yaml\n" {
		t.Errorf("node conffiles %q", got)
	}
	if got := runOut(t, nil, "dpkg-deb", "-I", coordDeb, "conffiles"); got != "/etc/fleetcheck/coordinator.yaml\n" {
		t.Errorf("coordinator conffiles %q", got)
	}

	root := newRoot(t)
	fakePath, fakeLog := fakeUserTools(t, dir)
	dpkgInstall(t, root, fakePath, nodeDeb, coordDeb)

	// The node binary runs from the root: the slim build, with its checks.
	nodeInRoot := filepath.Join(root, "usr/bin/fleetcheck-node")
	if out := runOut(t, nil, nodeInRoot, "checks"); !strings.Contains(out, "gpu.inventory") || !strings.Contains(out, "ib.ports") {
		t.Errorf("fleetcheck-node checks:\n%s", out)
	}
	if out, err := exec.Command(nodeInRoot, "coordinator", "--help").CombinedOutput(); err == nil {
		t.Errorf("the node binary has a coordinator command:\n%s", out)
	}
	// The slim build has no simulator: host mode sim is refused at start,
	// with the way out.
	simCfg := filepath.Join(dir, "sim-agent.yaml")
	if err := os.WriteFile(simCfg, []byte("node: n1\ncoordinator: 127.0.0.1:1\ninsecure: true\nstate_dir: "+filepath.Join(dir, "simstate")+"\nhost: {mode: sim}\nenabled_checks: [gpu.ecc]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(nodeInRoot, "agent", "--config", simCfg).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "this build has no simulator; use the full fleetcheck binary for staging agents") {
		t.Errorf("fleetcheck-node agent with host mode sim: %v\n%s", err, out)
	}
	// Its default config is valid as shipped, state dir and all.
	cfg, err := agent.LoadConfig(filepath.Join(root, "etc/fleetcheck/agent.yaml"))
	if err != nil {
		t.Fatalf("the packaged agent.yaml: %v", err)
	}
	if st, err := os.Stat(filepath.Join(root, cfg.StateDir)); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("state dir %s: %v %v, want 0700", cfg.StateDir, st, err)
	}
	for _, w := range []string{"actions/fleetcheck-driver", "actions/fleetcheck-kmsg-xid", "slurm/fleetcheck-prolog", "slurm/fleetcheck-epilog", "slurm/fleetcheck-healthcheck"} {
		if st, err := os.Stat(filepath.Join(root, "usr/lib/fleetcheck", w)); err != nil || st.Mode().Perm() != 0o755 {
			t.Errorf("wrapper %s: %v", w, err)
		}
	}
	// slurm.conf.example is documentation: beside the docs, not a program.
	if st, err := os.Stat(filepath.Join(root, "usr/share/doc/fleetcheck-node/slurm.conf.example")); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("slurm.conf.example in the doc dir: %v %v, want mode 0644", st, err)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/lib/fleetcheck/slurm/slurm.conf.example")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("slurm.conf.example under /usr/lib: %v, want none", err)
	}
	if st, err := os.Stat(filepath.Join(root, "usr/lib/fleetcheck/certs/fleetcheck-node-certs")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("fleetcheck-node-certs: %v %v, want mode 0755", st, err)
	}
	// The coordinator's: its config loads, its user was created in the
	// root (not on this host) and owns the data dir.
	ccfg, err := coordinator.LoadConfig(filepath.Join(root, "etc/fleetcheck/coordinator.yaml"))
	if err != nil {
		t.Fatalf("the packaged coordinator.yaml: %v", err)
	}
	if ccfg.DataDir != coordDataDir {
		t.Errorf("coordinator data_dir %q, want %q (the unit's StateDirectory)", ccfg.DataDir, coordDataDir)
	}
	calls, _ := os.ReadFile(fakeLog)
	wantCalls := "useradd --root " + root + " --system --user-group --home-dir /var/lib/fleetcheck --no-create-home --shell /usr/sbin/nologin fleetcheck\n" +
		"chown 999:999 " + root + "/var/lib/fleetcheck\n"
	if string(calls) != wantCalls {
		t.Errorf("maintainer scripts called:\n%s\nwant:\n%s", calls, wantCalls)
	}

	verifyUnits(t, root)

	// Upgrade: the admin's edit of agent.yaml survives v2, which ships the
	// same default; the binary is replaced.
	agentYAML := filepath.Join(root, "etc/fleetcheck/agent.yaml")
	edited := bytes.Replace(mustRead(t, agentYAML), []byte("coordinator: fleetcheck-coordinator:7443"), []byte("coordinator: coord.prod.example:7443"), 1)
	if err := os.WriteFile(agentYAML, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	in.version = "1.1.0"
	goBuild(t, nodeBin, "-tags", "node,grpcnotrace", "-trimpath", "-ldflags", "-s -w -X main.version=1.1.0")
	nodeDeb2, coordDeb2 := buildPackages(t, in, filepath.Join(dir, "v2"))
	out = []byte(dpkgInstall(t, root, fakePath, nodeDeb2, coordDeb2))
	if got := mustRead(t, agentYAML); !bytes.Equal(got, edited) {
		t.Errorf("the upgrade replaced the edited agent.yaml:\n%s\ndpkg said:\n%s", got, out)
	}
	if _, err := os.Stat(agentYAML + ".dpkg-dist"); err == nil {
		t.Errorf("the upgrade left agent.yaml.dpkg-dist beside an unchanged default")
	}
	if v := runOut(t, nil, nodeInRoot, "--version"); !strings.Contains(v, "1.1.0") {
		t.Errorf("after the upgrade: %s", v)
	}
	if q := runOut(t, nil, "dpkg-query", "--admindir="+filepath.Join(root, "var/lib/dpkg"), "-W", "-f", "${Package} ${Version} ${Status}\n"); !strings.Contains(q, "fleetcheck-node 1.1.0 install ok installed") ||
		!strings.Contains(q, "fleetcheck-coordinator 1.1.0 install ok installed") {
		t.Errorf("installed after the upgrade:\n%s", q)
	}
	// The user existed in the root: the upgrade did not add it again.
	if calls, _ := os.ReadFile(fakeLog); strings.Count(string(calls), "useradd") != 1 {
		t.Errorf("useradd calls over install and upgrade:\n%s", calls)
	}

	// Remove keeps the admin's config; purge takes it and the agent's
	// state; the coordinator's store outlives a purge.
	dpkg := func(args ...string) string {
		return runOut(t, []string{"PATH=" + fakePath + ":" + os.Getenv("PATH")}, "dpkg",
			append([]string{"--root=" + root, "--force-script-chrootless", "--force-not-root"}, args...)...)
	}
	dpkg("--remove", "fleetcheck-node")
	if _, err := os.Stat(agentYAML); err != nil {
		t.Errorf("remove took the edited agent.yaml: %v", err)
	}
	if _, err := os.Stat(nodeInRoot); err == nil {
		t.Errorf("remove left the binary")
	}
	store := filepath.Join(root, coordDataDir, "fleetcheck.db")
	if err := os.WriteFile(store, []byte("the fleet's history"), 0o600); err != nil {
		t.Fatal(err)
	}
	dpkg("--purge", "fleetcheck-node", "fleetcheck-coordinator")
	for _, gone := range []string{agentYAML, filepath.Join(root, agentStateDir)} {
		if _, err := os.Stat(gone); err == nil {
			t.Errorf("purge left %s", gone)
		}
	}
	if _, err := os.Stat(store); err != nil {
		t.Errorf("purge took the coordinator's store: %v", err)
	}
}

// verifyUnits runs systemd-analyze verify on the units as installed in
// root, against the binaries installed there (it checks ExecStart
// exists), with the system's own targets and /bin/sh copied in.
func verifyUnits(t *testing.T, root string) {
	t.Helper()
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		needs.Partly(t, "systemd-analyze verify: systemd-analyze is not installed (apt-get install systemd)")
		return
	}
	sys := "/usr/lib/systemd/system"
	dst := filepath.Join(root, sys)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, glob := range []string{"*.target", "*.slice", "*.socket"} {
		m, _ := filepath.Glob(filepath.Join(sys, glob))
		for _, f := range m {
			if real, err := filepath.EvalSymlinks(f); err == nil {
				if b, err := os.ReadFile(real); err == nil {
					_ = os.WriteFile(filepath.Join(dst, filepath.Base(f)), b, 0o644)
				}
			}
		}
	}
	// ExecCondition runs /bin/sh: the base system's, as on a real host.
	if sh, err := filepath.EvalSymlinks("/bin/sh"); err == nil {
		if b, err := os.ReadFile(sh); err == nil {
			_ = os.MkdirAll(filepath.Join(root, "bin"), 0o755)
			_ = os.WriteFile(filepath.Join(root, "bin/sh"), b, 0o755)
		}
	}
	units := []string{"fleetcheck-agent.service", "fleetcheck-healthcheck.service", "fleetcheck-healthcheck.timer", "fleetcheck-coordinator.service"}
	args := []string{"verify", "--root=" + root, "--man=no"}
	for _, u := range units {
		args = append(args, filepath.Join(unitDir, u))
	}
	cmd := exec.Command(sa, args...)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
