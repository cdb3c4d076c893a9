// Package systemd holds the systemd units the .deb packages install
// (cmd/fleetcheck-package). systemd-analyze verifies them there, as
// installed; this test pins the settings the agent's job and the
// hardening depend on.
package systemd

import (
	"bufio"
	"os"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// unit is a unit file's settings: "Section.Key" -> every value in order.
type unit map[string][]string

func readUnit(t *testing.T, name string) unit {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("%s: not a setting: %q", name, line)
			}
			u[section+"."+k] = append(u[section+"."+k], v)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

func (u unit) get(key string) string {
	v := u[key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

func TestUnitSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		file string
		want map[string]string
	}{
		{"fleetcheck-agent.service", map[string]string{
			"Service.ExecStart":       "/usr/bin/fleetcheck-node agent --config /etc/fleetcheck/agent.yaml --log-format json",
			"Service.Restart":         "on-failure",
			"Service.User":            "root",
			"Service.ProtectSystem":   "strict",
			"Service.ReadWritePaths":  "/var/lib/fleetcheck-agent",
			"Service.CPUQuota":        "100%",
			"Service.MemoryMax":       "1G",
			"Service.NoNewPrivileges": "yes",
			"Install.WantedBy":        "multi-user.target",
		}},
		{"fleetcheck-healthcheck.service", map[string]string{
			"Service.Type":          "oneshot",
			"Service.ProtectSystem": "strict",
			"Service.CPUQuota":      "100%",
			"Service.MemoryMax":     "1G",
		}},
		{"fleetcheck-healthcheck.timer", map[string]string{
			"Timer.OnUnitActiveSec": "5min",
			"Install.WantedBy":      "timers.target",
		}},
		{"fleetcheck-coordinator.service", map[string]string{
			"Service.ExecStart":              "/usr/bin/fleetcheck coordinator --config /etc/fleetcheck/coordinator.yaml",
			"Service.Restart":                "on-failure",
			"Service.User":                   "fleetcheck",
			"Service.CapabilityBoundingSet":  "",
			"Service.ProtectSystem":          "strict",
			"Service.StateDirectory":         "fleetcheck",
			"Service.PrivateDevices":         "yes",
			"Service.MemoryDenyWriteExecute": "yes",
		}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			u := readUnit(t, tc.file)
			for k, want := range tc.want {
				if _, ok := u[k]; !ok {
					t.Errorf("%s is not set", k)
				} else if got := u.get(k); got != want {
					t.Errorf("%s=%s, want %s", k, got, want)
				}
			}
		})
	}
}

// TestAgentCanDoItsJob: the sandbox must leave what the checks and
// actions use, and bound the rest.
func TestAgentCanDoItsJob(t *testing.T) {
	t.Parallel()
	u := readUnit(t, "fleetcheck-agent.service")
	caps := strings.Fields(u.get("Service.CapabilityBoundingSet"))
	for _, c := range []string{"CAP_SYSLOG", "CAP_SYS_ADMIN", "CAP_SYS_RAWIO", "CAP_IPC_LOCK"} {
		if !slices.Contains(caps, c) {
			t.Errorf("CapabilityBoundingSet lacks %s", c)
		}
	}
	for _, c := range []string{"CAP_SYS_MODULE", "CAP_SYS_BOOT", "CAP_SYS_PTRACE", "CAP_SETUID", "CAP_DAC_OVERRIDE"} {
		if slices.Contains(caps, c) {
			t.Errorf("CapabilityBoundingSet keeps %s, which no default check or action needs", c)
		}
	}
	// Each of these would hide a device or file the checks read.
	for _, k := range []string{"PrivateDevices", "ProtectKernelLogs", "ProtectKernelTunables", "MemoryDenyWriteExecute", "DynamicUser"} {
		if v := u.get("Service." + k); v == "yes" || v == "true" {
			t.Errorf("%s=%s would break the checks", k, v)
		}
	}
	if u.get("Service.LimitMEMLOCK") != "infinity" {
		t.Errorf("LimitMEMLOCK=%s: IB verbs need to pin memory", u.get("Service.LimitMEMLOCK"))
	}

	// The unit's writable state dir is the one the packaged config uses.
	b, err := os.ReadFile("../deb/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		StateDir string `yaml:"state_dir"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if want := "/var/lib/" + u.get("Service.StateDirectory"); cfg.StateDir != want || !slices.Contains(u["Service.ReadWritePaths"], want) {
		t.Errorf("agent.yaml state_dir %q; the unit writes %q (ReadWritePaths %q)", cfg.StateDir, want, u["Service.ReadWritePaths"])
	}
	hc := readUnit(t, "fleetcheck-healthcheck.service")
	if !strings.Contains(hc.get("Service.ExecStart"), "--state "+cfg.StateDir+"/") {
		t.Errorf("the health check keeps its state outside the writable dir: %s", hc.get("Service.ExecStart"))
	}
	if !strings.Contains(hc.get("Service.ExecCondition"), "is-active fleetcheck-agent.service") {
		t.Errorf("the health check runs beside the agent daemon: ExecCondition=%s", hc.get("Service.ExecCondition"))
	}
}
