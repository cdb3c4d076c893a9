package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestLoadConfigPathsFromAnotherDir: every relative path of an agent
// config is the config file's directory's, read from another working
// directory through a relative config path.
func TestLoadConfigPathsFromAnotherDir(t *testing.T) {
	root := t.TempDir()
	conf := filepath.Join(root, "etc")
	other := filepath.Join(root, "cwd")
	for _, d := range []string{conf, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	body := `node: gpu-001
coordinator: 127.0.0.1:7443
tls: {ca_file: pki/ca.crt, cert_file: pki/node.crt, key_file: pki/node.key}
state_dir: state
activity_file: run/activity
actions:
  ib-port-down: {command: [sbin/ib-port-down, "{hca}"], params: {hca: 'mlx5_[0-9]'}}
  reboot: {command: [systemctl, reboot]}
multi_node: {launcher_command: [bin/mpirun, -H, "{hosts}"], allowed_peers: 'gpu-[0-9]+'}
checks:
  tools: {nvidia_smi: tools/nvidia-smi, dcgmi: dcgmi, launcher: [bin/mpirun, -np, "1"]}
`
	if err := os.WriteFile(filepath.Join(conf, "agent.yaml"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(other)
	c, err := LoadConfig("../etc/agent.yaml")
	if err != nil {
		t.Fatal(err)
	}
	in := func(p string) string { return filepath.Join(conf, p) }
	for _, tc := range []struct{ key, got, want string }{
		{"tls.ca_file", c.TLS.CAFile, in("pki/ca.crt")},
		{"tls.cert_file", c.TLS.CertFile, in("pki/node.crt")},
		{"tls.key_file", c.TLS.KeyFile, in("pki/node.key")},
		{"state_dir", c.StateDir, in("state")},
		{"activity_file", c.activityFile(), in("run/activity")},
		{"actions.ib-port-down.command[0]", c.Actions["ib-port-down"].Command[0], in("sbin/ib-port-down")},
		{"actions.reboot.command[0]", c.Actions["reboot"].Command[0], "systemctl"}, // a bare name: PATH
		{"multi_node.launcher_command[0]", c.MultiNode.LauncherCommand[0], in("bin/mpirun")},
		{"checks.tools.nvidia_smi", c.Checks.Tools.NvidiaSMI, in("tools/nvidia-smi")},
		{"checks.tools.dcgmi", c.Checks.Tools.DCGMI, "dcgmi"},
		{"checks.tools.launcher[0]", c.Checks.Tools.Launcher[0], in("bin/mpirun")},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %q, want %q", tc.key, tc.got, tc.want)
		}
	}
}
