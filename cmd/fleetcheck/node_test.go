package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

// exitCode mirrors main's mapping from a command error to an exit status.
func exitCode(err error) int {
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errChecksFailed):
		return exitChecks
	default:
		return exitCommand
	}
}

func execute(t *testing.T, args ...string) (string, int) {
	t.Helper()
	// run and analyze drop to one P (oneShotProcs); the other tests in
	// this process keep theirs.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	if err != nil && !errors.Is(err, errChecksFailed) {
		out.WriteString("error: " + err.Error())
	}
	return out.String(), exitCode(err)
}

const examples = "../../examples"

func TestAnalyzeExitCodes(t *testing.T) {
	cfg := filepath.Join(examples, "node-config.yaml")
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"healthy", []string{"analyze", "--config", cfg, filepath.Join(examples, "bundles/h100-healthy")}, 0, "node h100-healthy: PASS"},
		{"broken", []string{"analyze", "--config", cfg, filepath.Join(examples, "bundles/h100-xid79-ecc")}, 1, "GPU_MISSING_FROM_DRIVER"},
		{"missing bundle", []string{"analyze", "/nonexistent/bundle"}, 2, "no such file"},
		{"bad output flag", []string{"analyze", "-o", "yaml", filepath.Join(examples, "bundles/h100-healthy")}, 2, "-o must be table or json"},
		{"unknown check", []string{"analyze", "--checks", "gpu.nope", filepath.Join(examples, "bundles/h100-healthy")}, 2, `unknown check "gpu.nope"`},
		{"bad config", []string{"analyze", "--config", "/nonexistent.yaml", filepath.Join(examples, "bundles/h100-healthy")}, 2, "read config"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, code := execute(t, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; output:\n%s", code, tc.code, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output lacks %q:\n%s", tc.want, out)
			}
		})
	}
}

func TestAnalyzeHostileBundleExits2(t *testing.T) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Name: "../../etc/evil", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte("x"))
	tw.Close()
	gz.Close()
	p := filepath.Join(t.TempDir(), "evil.tar.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := execute(t, "analyze", p)
	if code != 2 || !strings.Contains(out, "hostile bundle") {
		t.Fatalf("exit %d, output %q; want 2 and a hostile-bundle reason", code, out)
	}
}

// A directory bundle whose dmesg.txt is a named pipe used to hang analyze
// for ever; it exits 2 with one line naming the file.
func TestAnalyzeDirectoryBundleWithPipeExits2(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(`{"format":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "dmesg.txt"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := execute(t, "analyze", dir)
	if code != 2 || !strings.Contains(out, "hostile bundle") || !strings.Contains(out, "dmesg.txt") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("exit %d, output %q; want 2 and one line naming dmesg.txt", code, out)
	}
}

func TestAnalyzeJSONShape(t *testing.T) {
	out, code := execute(t, "analyze", "-o", "json", "--checks", "gpu.ecc,ib.ports", filepath.Join(examples, "bundles/h100-ibdown-pcie"))
	if code != 1 {
		t.Fatalf("exit %d", code)
	}
	var r report.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if r.Status != report.Fail || len(r.Checks) != 2 || r.Checks[1].Name != "ib.ports" {
		t.Fatalf("report %+v", r)
	}
	if len(r.Inventory.GPUs) != 8 || len(r.Inventory.HCAs) == 0 {
		t.Errorf("inventory: %d GPUs, %d HCAs", len(r.Inventory.GPUs), len(r.Inventory.HCAs))
	}
}

// TestRunWithoutHardware is CI's situation: no GPU, no HCA. Every GPU and
// IB check skips with its reason; nothing crashes or hangs.
func TestRunWithoutHardware(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	// Point the tools at names that cannot exist, so the test does not
	// depend on what this machine has installed.
	os.WriteFile(cfg, []byte("tools:\n  nvidia_smi: /nonexistent/nvidia-smi\n  dmesg: /nonexistent/dmesg\n  use_nvml: false\n"), 0o644)
	out, code := execute(t, "run", "--root", dir, "--config", cfg, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	var r report.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	for _, c := range r.Checks {
		if strings.HasPrefix(c.Name, "gpu.") || strings.HasPrefix(c.Name, "ib.") {
			if c.Status != report.Skip || c.Reason == "" {
				t.Errorf("%s: %s %q, want skip with a reason", c.Name, c.Status, c.Reason)
			}
		}
		if c.Name == "nccl.allreduce" || c.Name == "dcgm.diag" {
			t.Errorf("disruptive check %s ran without --disruptive", c.Name)
		}
	}
	ib := r.Check("ib.ports")
	if ib == nil || ib.Reason != "no /sys/class/infiniband" {
		t.Errorf("ib.ports reason: %+v", ib)
	}
	inv := r.Check("gpu.inventory")
	if inv == nil || !strings.Contains(inv.Reason, "nvidia-smi not found") {
		t.Errorf("gpu.inventory reason: %+v", inv)
	}
}

// TestOneShotProcs: run and analyze drop to one P unless the operator
// set GOMAXPROCS, and analyze's report is the same either way.
func TestOneShotProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct {
		name string
		env  map[string]string
		want int
	}{
		{"unset", nil, 1},
		{"empty", map[string]string{"GOMAXPROCS": ""}, 1},
		{"set by the operator", map[string]string{"GOMAXPROCS": "3"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runtime.GOMAXPROCS(3)
			oneShotProcs(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if got := runtime.GOMAXPROCS(0); got != tc.want {
				t.Fatalf("GOMAXPROCS = %d, want %d", got, tc.want)
			}
		})
	}
	if os.Getenv("GOMAXPROCS") != "" {
		t.Skip("GOMAXPROCS is set in this environment: analyze keeps it")
	}
	runtime.GOMAXPROCS(3)
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"analyze", "-o", "json", filepath.Join(examples, "bundles", "h100-healthy")})
	if err := root.Execute(); err != nil && !errors.Is(err, errChecksFailed) {
		t.Fatal(err)
	}
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("after analyze GOMAXPROCS = %d, want 1", got)
	}
	runtime.GOMAXPROCS(3)
	t.Setenv("GOMAXPROCS", "3")
	again, _ := execute(t, "analyze", "-o", "json", filepath.Join(examples, "bundles", "h100-healthy"))
	if a, b := withoutDurations(t, again), withoutDurations(t, out.String()); a != b {
		t.Fatalf("analyze with 3 Ps reported differently from 1 P:\n%s\n---\n%s", a, b)
	}
}

// withoutDurations is analyze's JSON report less each check's
// duration_ms, the one field that differs between two runs.
func withoutDurations(t *testing.T, s string) string {
	t.Helper()
	var r map[string]any
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		t.Fatalf("%v in %q", err, s)
	}
	list, _ := r["checks"].([]any)
	if len(list) == 0 {
		t.Fatalf("no checks in %s", s)
	}
	for _, c := range list {
		delete(c.(map[string]any), "duration_ms")
	}
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
