package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/config"
)

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := ParseConfig([]byte("coordinator: c.example:7443\ninsecure: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	if c.Node != host {
		t.Errorf("node %q, want the hostname %q", c.Node, host)
	}
	if time.Duration(c.Interval) != 60*time.Second || c.Spool.MaxResults != DefaultSpoolResults || c.Spool.MaxBytes != DefaultSpoolBytes {
		t.Errorf("defaults: %+v", c)
	}
	if len(c.DisruptiveAllowedWhen) != 2 || c.Activity != ActivityUnknown {
		t.Errorf("disruptive policy defaults: %v %q", c.DisruptiveAllowedWhen, c.Activity)
	}
	if c.Checks.Limits.GPUTempWarnC != config.Defaults().Limits.GPUTempWarnC {
		t.Errorf("checks defaults not kept")
	}
	a, err := New(c, &fakeHost{}, nopLogger())
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range a.passive {
		if ch.Disruptive() {
			t.Errorf("disruptive %s enabled by default", ch.Name())
		}
	}
	allPassive := 0
	for _, ch := range registry.All() {
		if !ch.Disruptive() {
			allPassive++
		}
	}
	if len(a.enabled) != len(a.passive) || len(a.passive) != allPassive {
		t.Errorf("default enabled = every passive check: %d enabled, %d passive of %d", len(a.enabled), len(a.passive), allPassive)
	}
}

func TestConfigInvalid(t *testing.T) {
	t.Parallel()
	base := "coordinator: c.example:7443\ninsecure: true\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"no coordinator", "insecure: true\n", "coordinator"},
		{"bad coordinator", "coordinator: nohostport\ninsecure: true\n", "want host:port"},
		{"tls and insecure", base + "tls: {ca_file: a, cert_file: b, key_file: c}\n", "choose one"},
		{"half tls", "coordinator: c:1\ntls: {ca_file: a}\n", "tls: ca_file, cert_file and key_file are required"},
		{"bad node", base + "node: 'gpu 17'\n", "node"},
		{"bad label key", base + "labels: {'bad key': x}\n", "bad key"},
		{"bad label value", base + "labels: {rack: 'r 12'}\n", "bad value"},
		{"interval too short", base + "interval: 10ms\n", "interval"},
		{"bad duration", base + "interval: soon\n", "bad duration"},
		{"unknown check", base + "enabled_checks: [gpu.nope]\n", `unknown check "gpu.nope"`},
		{"bad activity", base + "activity: sleeping\n", "activity must be"},
		{"timeouts reversed", base + "work: {default_timeout: 1h, max_timeout: 10m}\n", "exceeds"},
		{"no concurrency", base + "work: {max_concurrent: 0}\n", "max_concurrent"},
		{"tiny spool", base + "spool: {max_bytes: 10KiB}\n", "max_bytes"},
		{"bad size", base + "spool: {max_bytes: lots}\n", "bad size"},
		{"no spool", base + "spool: {max_results: 0}\n", "max_results"},
		{"reconnect", base + "reconnect: {initial: 10s, max: 1s}\n", "reconnect"},
		{"checks invalid", base + "checks: {nccl: {max_deviation: 2}}\n", "max_deviation"},
		{"checks unknown key", base + "checks: {expect: {gpus: 8}}\n", "field gpus not found"},
		{"two documents", base + "---\nnode: x\n", "more than one YAML document"},
		{"empty state dir", base + "state_dir: ''\n", "state_dir"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseConfig([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.yaml)
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want ErrInvalid mentioning %q", err, tc.want)
			}
		})
	}
}

func TestLoadConfigResolvesPaths(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "agent.yaml")
	body := "coordinator: c:1\ntls: {ca_file: ca.pem, cert_file: /abs/node.pem, key_file: key.pem}\nstate_dir: state\nactivity_file: act\n"
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.StateDir != filepath.Join(dir, "state") || c.TLS.CAFile != filepath.Join(dir, "ca.pem") ||
		c.TLS.CertFile != "/abs/node.pem" || c.activityFile() != filepath.Join(dir, "act") {
		t.Errorf("paths: %+v %+v", c, c.TLS)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestParseByteSize(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want ByteSize
		ok   bool
	}{
		{"1048576", 1 << 20, true},
		{"256MiB", 256 << 20, true},
		{"1GB", 1e9, true},
		{"1.5 GiB", 3 << 29, true},
		{"10kb", 10e3, true},
		{"", 0, false},
		{"MiB", 0, false},
		{"-1MiB", 0, false},
		{"12 parsecs", 0, false},
	}
	for _, tc := range tests {
		got, err := ParseByteSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%q: %d %v, want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestActivityFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := fileActivity{path: filepath.Join(dir, "activity"), fallback: ActivityBusy}
	check := func(want Activity, wantErr bool) {
		t.Helper()
		got, err := src.Activity(t.Context())
		if got != want || (err != nil) != wantErr {
			t.Errorf("activity %q %v, want %q err=%v", got, err, want, wantErr)
		}
	}
	check(ActivityBusy, false) // no file: the configured value
	if err := os.WriteFile(src.path, []byte("drained\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	check(ActivityDrained, false)
	if err := os.WriteFile(src.path, []byte("on fire\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	check(ActivityUnknown, true)
}
