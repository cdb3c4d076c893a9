// Command fleetcheck-package writes the fleetcheck .deb packages
// (`make package`): fleetcheck-node (the slim node binary, the agent and
// health-check units, the default agent.yaml, the action wrappers) and
// fleetcheck-coordinator (the full binary, the coordinator unit, its
// user and data dir). It is a build tool: nothing in the product imports
// it.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/deb"
)

const (
	maintainer = "fleetcheck maintainers <fleetcheck@localhost>"
	// unitDir is where Debian 12 packages put systemd units.
	unitDir = "/lib/systemd/system"
	// Installed layout; the units and the default configs name these.
	agentStateDir = "/var/lib/fleetcheck-agent"
	coordDataDir  = "/var/lib/fleetcheck"
	actionsDir    = "/usr/lib/fleetcheck/actions"
	slurmDir      = "/usr/lib/fleetcheck/slurm"
	certsDir      = "/usr/lib/fleetcheck/certs"
	nodeDocDir    = "/usr/share/doc/fleetcheck-node"
)

// inputs is what the packages are made of.
type inputs struct {
	src        string // the repository root (deploy/, docs/)
	version    string // Debian version, e.g. 0.1.0 or 0.0.0~git20261201.f1ade21
	arch       string
	nodeBinary string // fleetcheck-node, built with -tags node
	fullBinary string // fleetcheck
	mtime      time.Time
}

func main() {
	var in inputs
	var out, epoch string
	flag.StringVar(&in.src, "src", ".", "repository root")
	flag.StringVar(&in.version, "version", "", "package version (Debian form: starts with a digit)")
	flag.StringVar(&in.arch, "arch", runtime.GOARCH, "Debian architecture")
	flag.StringVar(&in.nodeBinary, "node-binary", "bin/fleetcheck-node", "the slim node binary (make build-node)")
	flag.StringVar(&in.fullBinary, "full-binary", "bin/fleetcheck", "the full binary (make build)")
	flag.StringVar(&out, "out", "dist", "directory for the .deb files")
	flag.StringVar(&epoch, "source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "timestamp of every file (Unix seconds; default now)")
	flag.Parse()
	if err := run(in, out, epoch); err != nil {
		fmt.Fprintf(os.Stderr, "fleetcheck-package: %v\n", err)
		os.Exit(2)
	}
}

func run(in inputs, out, epoch string) error {
	in.mtime = time.Now().UTC().Truncate(time.Second)
	if epoch != "" {
		s, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil || s < 0 {
			return fmt.Errorf("source date epoch %q: Unix seconds", epoch)
		}
		in.mtime = time.Unix(s, 0).UTC()
	}
	if in.version == "" {
		return errors.New("-version is required")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, build := range []func(inputs) (*deb.Package, error){nodePackage, coordinatorPackage} {
		p, err := build(in)
		if err != nil {
			return err
		}
		file, err := writePackage(p, out, in.mtime)
		if err != nil {
			return err
		}
		fmt.Println(file)
	}
	return nil
}

// writePackage writes p into dir and returns the file's path.
func writePackage(p *deb.Package, dir string, mtime time.Time) (string, error) {
	var buf bytes.Buffer
	if err := p.Write(&buf, mtime); err != nil {
		return "", fmt.Errorf("%s: %w", p.Name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	file := filepath.Join(dir, p.FileName())
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return "", err
	}
	return file, os.Rename(tmp, file)
}

// files reads src/rel (one file, or every file in a directory that is not
// Go code or a *.example, which is documentation) and installs each into
// dir with mode.
func (in inputs) files(rel, dir string, mode int64) ([]deb.File, error) {
	p := filepath.Join(in.src, rel)
	st, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		return []deb.File{{Path: path.Join(dir, filepath.Base(p)), Body: b, Mode: mode}}, nil
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		return nil, err
	}
	var out []deb.File
	for _, e := range ents {
		if e.IsDir() || filepath.Ext(e.Name()) == ".go" || filepath.Ext(e.Name()) == ".example" {
			continue
		}
		f, err := in.files(filepath.Join(rel, e.Name()), dir, mode)
		if err != nil {
			return nil, err
		}
		out = append(out, f...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no files", p)
	}
	return out, nil
}

// gather reads every listed input, stopping at the first error.
func gather(parts ...func() ([]deb.File, error)) ([]deb.File, error) {
	var all []deb.File
	for _, part := range parts {
		f, err := part()
		if err != nil {
			return nil, err
		}
		all = append(all, f...)
	}
	return all, nil
}

func (in inputs) part(rel, dir string, mode int64) func() ([]deb.File, error) {
	return func() ([]deb.File, error) { return in.files(rel, dir, mode) }
}

func (in inputs) conffile(rel, dst string) func() ([]deb.File, error) {
	return func() ([]deb.File, error) {
		b, err := os.ReadFile(filepath.Join(in.src, rel))
		if err != nil {
			return nil, err
		}
		return []deb.File{{Path: dst, Body: b, Mode: 0o644, Conffile: true}}, nil
	}
}

func binary(src, dst string) func() ([]deb.File, error) {
	return func() ([]deb.File, error) {
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("binary: %w", err)
		}
		return []deb.File{{Path: dst, Body: b, Mode: 0o755}}, nil
	}
}

// libc is what a cgo build (go-nvml) links against: Debian 12's glibc.
const libc = "libc6 (>= 2.34)"

func nodePackage(in inputs) (*deb.Package, error) {
	files, err := gather(
		binary(in.nodeBinary, "/usr/bin/fleetcheck-node"),
		in.part("deploy/systemd/fleetcheck-agent.service", unitDir, 0o644),
		in.part("deploy/systemd/fleetcheck-healthcheck.service", unitDir, 0o644),
		in.part("deploy/systemd/fleetcheck-healthcheck.timer", unitDir, 0o644),
		in.conffile("deploy/deb/agent.yaml", "/etc/fleetcheck/agent.yaml"),
		in.part("deploy/actions", actionsDir, 0o755),
		in.part("deploy/slurm", slurmDir, 0o755),
		// An example to copy into slurm.conf, not a program: with the docs.
		in.part("deploy/slurm/slurm.conf.example", nodeDocDir, 0o644),
		in.part("deploy/certs", certsDir, 0o755),
		in.part("docs/deploy.md", nodeDocDir, 0o644),
		in.part("docs/agent.md", nodeDocDir, 0o644),
	)
	if err != nil {
		return nil, fmt.Errorf("fleetcheck-node: %w", err)
	}
	return &deb.Package{
		Name: "fleetcheck-node", Version: in.version, Architecture: in.arch, Maintainer: maintainer,
		Description: `GPU fleet health checks: the node agent
 fleetcheck-node runs fleetcheck's checks on a GPU node (GPUs, NVLink,
 InfiniBand, NCCL, DCGM) as a daemon reporting to a coordinator, or on a
 systemd timer. It carries no Kubernetes, SQLite or campaign code.`,
		Depends:    []string{libc},
		Recommends: []string{"nvidia-smi | nvidia-utils", "infiniband-diags"},
		Files:      files,
		Dirs:       []deb.Dir{{Path: agentStateDir, Mode: 0o700}},
		Scripts: map[string]string{
			"postinst": nodePostinst,
			"prerm":    nodePrerm,
			"postrm":   nodePostrm,
		},
	}, nil
}

func coordinatorPackage(in inputs) (*deb.Package, error) {
	files, err := gather(
		binary(in.fullBinary, "/usr/bin/fleetcheck"),
		in.part("deploy/systemd/fleetcheck-coordinator.service", unitDir, 0o644),
		in.conffile("deploy/deb/coordinator.yaml", "/etc/fleetcheck/coordinator.yaml"),
		in.part("docs/deploy.md", "/usr/share/doc/fleetcheck-coordinator", 0o644),
		in.part("docs/coordinator-config.md", "/usr/share/doc/fleetcheck-coordinator", 0o644),
	)
	if err != nil {
		return nil, fmt.Errorf("fleetcheck-coordinator: %w", err)
	}
	return &deb.Package{
		Name: "fleetcheck-coordinator", Version: in.version, Architecture: in.arch, Maintainer: maintainer,
		Description: `GPU fleet health checks: the coordinator and the operator's CLI
 The fleetcheck coordinator keeps the fleet's inventory, results and
 baselines, and runs campaigns (sweep, rollout, burn-in, drill). The same
 binary is the operator's CLI.`,
		Depends: []string{libc, "adduser | passwd"},
		Files:   files,
		Dirs:    []deb.Dir{{Path: coordDataDir, Mode: 0o750}},
		Scripts: map[string]string{
			"postinst": coordPostinst,
			"prerm":    coordPrerm,
			"postrm":   coordPostrm,
		},
	}, nil
}

// Maintainer scripts. None enables or starts a service on install: the
// config must name the coordinator and certificates first. DPKG_ROOT is
// set when dpkg installs into another root (dpkg --root with
// --force-script-chrootless): then every path and the user database are
// that root's, and the running system's systemd is left alone. The paths
// are agentStateDir and coordDataDir; the package test checks them as
// installed.

const nodePostinst = `#!/bin/sh
set -e
if [ "$1" = configure ]; then
	mkdir -p "${DPKG_ROOT:-}/var/lib/fleetcheck-agent"
	chmod 0700 "${DPKG_ROOT:-}/var/lib/fleetcheck-agent"
	if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
		systemctl daemon-reload || true
		# An upgrade restarts what was running, with the new binary.
		if [ -n "$2" ]; then
			systemctl try-restart fleetcheck-agent.service || true
		fi
	fi
fi
exit 0
`

const nodePrerm = `#!/bin/sh
set -e
if [ "$1" = remove ] && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl disable --now fleetcheck-agent.service fleetcheck-healthcheck.timer || true
fi
exit 0
`

// Purge removes the spool and counter state only: nothing the
// coordinator has not seen or cannot ask for again.
const nodePostrm = `#!/bin/sh
set -e
if [ "$1" = purge ]; then
	rm -rf "${DPKG_ROOT:-}/var/lib/fleetcheck-agent"
fi
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
exit 0
`

const coordPostinst = `#!/bin/sh
set -e
if [ "$1" = configure ]; then
	if [ -n "${DPKG_ROOT:-}" ]; then
		# Another root: its user database, by uid:gid.
		if ! grep -q '^fleetcheck:' "$DPKG_ROOT/etc/passwd" 2>/dev/null; then
			useradd --root "$DPKG_ROOT" --system --user-group --home-dir /var/lib/fleetcheck --no-create-home --shell /usr/sbin/nologin fleetcheck
		fi
		owner=$(awk -F: '$1 == "fleetcheck" { print $3 ":" $4 }' "$DPKG_ROOT/etc/passwd")
	else
		if ! getent passwd fleetcheck >/dev/null; then
			if command -v adduser >/dev/null; then
				adduser --quiet --system --group --home /var/lib/fleetcheck --no-create-home --shell /usr/sbin/nologin fleetcheck
			else
				useradd --system --user-group --home-dir /var/lib/fleetcheck --no-create-home --shell /usr/sbin/nologin fleetcheck
			fi
		fi
		owner=fleetcheck:fleetcheck
	fi
	mkdir -p "${DPKG_ROOT:-}/var/lib/fleetcheck"
	chown "$owner" "${DPKG_ROOT:-}/var/lib/fleetcheck"
	chmod 0750 "${DPKG_ROOT:-}/var/lib/fleetcheck"
	if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
		systemctl daemon-reload || true
		if [ -n "$2" ]; then
			systemctl try-restart fleetcheck-coordinator.service || true
		fi
	fi
fi
exit 0
`

const coordPrerm = `#!/bin/sh
set -e
if [ "$1" = remove ] && [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl disable --now fleetcheck-coordinator.service || true
fi
exit 0
`

// The store is kept on purge too: it holds the fleet's history and
// baselines. The user stays (Debian policy: system users are not removed).
const coordPostrm = `#!/bin/sh
set -e
if [ "$1" = purge ]; then
	echo "fleetcheck-coordinator: /var/lib/fleetcheck (the store) is kept; remove it by hand if it is no longer wanted" >&2
fi
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
exit 0
`
