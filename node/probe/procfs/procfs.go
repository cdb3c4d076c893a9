// Package procfs parses the few /proc files fleetcheck reads, plus the
// bundle's versions.json. Each parser takes the file's bytes, so live hosts,
// bundles and the simulator share them; errors name the file.
package procfs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// maxModuleName is generous: the kernel's MODULE_NAME_LEN is 56.
const maxModuleName = 64

// ParseModules returns the names of the loaded modules in /proc/modules
// ("nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)"), in file order.
// An empty file gives an empty, non-nil list (nil means unknown in a
// snapshot). The header line of `lsmod` output is skipped, so a bundle that
// saved lsmod instead still parses.
func ParseModules(data []byte) ([]string, error) {
	mods := []string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		name := fields[0]
		if line == 1 && name == "Module" && len(fields) > 1 && fields[1] == "Size" {
			continue
		}
		if !validModuleName(name) {
			return nil, fmt.Errorf("parse /proc/modules: line %d: bad module name %q", line, clip(name))
		}
		mods = append(mods, name)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("parse /proc/modules: line %d: %w", line+1, err)
	}
	return mods, nil
}

func validModuleName(s string) bool {
	if s == "" || len(s) > maxModuleName {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ParseUptime reads the first field of /proc/uptime ("12345.67 54321.00"):
// seconds since boot.
func ParseUptime(data []byte) (time.Duration, error) {
	fields := strings.Fields(string(data))
	if len(fields) == 0 {
		return 0, errors.New("parse /proc/uptime: empty")
	}
	s := fields[0]
	// Digits with an optional fraction only: ParseFloat would take NaN,
	// Inf, exponents and hex.
	whole, frac, _ := strings.Cut(s, ".")
	if !allDigits(whole) || (frac != "" && !allDigits(frac)) || strings.HasSuffix(s, ".") {
		return 0, fmt.Errorf("parse /proc/uptime: bad seconds %q", clip(s))
	}
	secs, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc/uptime: %w", err)
	}
	if secs >= float64(math.MaxInt64)/float64(time.Second) {
		return 0, fmt.Errorf("parse /proc/uptime: %q seconds out of range", clip(s))
	}
	return time.Duration(math.Round(secs * float64(time.Second))), nil
}

// versionRE matches a driver version: 535.161.08, 550.54.15, 470.57.02.
var versionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+(\.[0-9]+)?$`)

// ParseDriverVersion returns the kernel module version from
// /proc/driver/nvidia/version. Both the proprietary and the open module
// print it on the "NVRM version:" line, after words that differ:
//
//	NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Wed Feb 14 ...
//	NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.161.08  Release Build  (...)  ...
//
// so the version is the first field there shaped like one.
func ParseDriverVersion(data []byte) (string, error) {
	for _, line := range strings.Split(string(data), "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "NVRM version:")
		if !ok {
			continue
		}
		for _, f := range strings.Fields(rest) {
			if versionRE.MatchString(f) {
				return f, nil
			}
		}
		return "", fmt.Errorf("parse /proc/driver/nvidia/version: no version on the NVRM line %q", clip(strings.TrimSpace(line)))
	}
	return "", errors.New("parse /proc/driver/nvidia/version: no \"NVRM version:\" line")
}

// ParseVersions reads a bundle's versions.json into snapshot.Versions. Keys
// are those of snapshot.Versions (driver, cuda, kernel, fabric_manager,
// rdma_stack, nccl, dcgm); unknown keys are ignored so newer collectors stay
// readable, and values are trimmed. A known key whose value is not a string
// or null is an error: "12.10" read as a number would turn into "12.1".
func ParseVersions(data []byte) (snapshot.Versions, error) {
	var v snapshot.Versions
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return v, errors.New("parse versions.json: want a JSON object")
	}
	if err := json.Unmarshal(trimmed, &v); err != nil {
		return snapshot.Versions{}, fmt.Errorf("parse versions.json: %w", err)
	}
	for _, p := range []*string{&v.Driver, &v.CUDA, &v.Kernel, &v.FabricManager, &v.RDMAStack, &v.NCCL, &v.DCGM} {
		*p = strings.TrimSpace(*p)
	}
	return v, nil
}

func allDigits(s string) bool {
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

func clip(s string) string {
	const n = 40
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
