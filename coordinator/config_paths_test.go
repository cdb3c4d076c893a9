package coordinator

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadConfigPathsRelativeToFile: relative paths in a coordinator
// config are the config file's directory's, whatever the working
// directory (a data_dir taken against the working directory would open a
// second, empty database elsewhere).
func TestLoadConfigPathsRelativeToFile(t *testing.T) {
	root := t.TempDir()
	conf := filepath.Join(root, "coord")
	other := filepath.Join(root, "elsewhere")
	for _, d := range []string{conf, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	yaml := `data_dir: data
tls: {cert_file: pki/coordinator.crt, key_file: pki/coordinator.key, ca_file: /etc/fleetcheck/ca.crt, trust_domain: fleet.example.net}
compat_matrix: matrix.yaml
drain:
  adapter: slurm
  slurm: {scontrol: bin/scontrol, sinfo: sinfo}
  kubernetes: {kubeconfig: kube/config}
gossip: {bind: 127.0.0.1, keyring_file: gossip.keys}
`
	if err := os.WriteFile(filepath.Join(conf, "coordinator.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(other)
	c, err := LoadConfig("../coord/coordinator.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ key, got, want string }{
		{"data_dir", c.DataDir, filepath.Join(conf, "data")},
		{"tls.cert_file", c.TLS.CertFile, filepath.Join(conf, "pki/coordinator.crt")},
		{"tls.key_file", c.TLS.KeyFile, filepath.Join(conf, "pki/coordinator.key")},
		{"tls.ca_file", c.TLS.CAFile, "/etc/fleetcheck/ca.crt"},
		{"compat_matrix", c.CompatMatrix, filepath.Join(conf, "matrix.yaml")},
		{"drain.slurm.scontrol", c.Drain.Slurm.Scontrol, filepath.Join(conf, "bin/scontrol")},
		{"drain.slurm.sinfo", c.Drain.Slurm.Sinfo, "sinfo"}, // a bare name: PATH
		{"drain.kubernetes.kubeconfig", c.Drain.Kubernetes.Kubeconfig, filepath.Join(conf, "kube/config")},
		{"gossip.keyring_file", c.Gossip.KeyringFile, filepath.Join(conf, "gossip.keys")},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %q, want %q", tc.key, tc.got, tc.want)
		}
	}
}

// TestStoreURL: store_url takes SQLite paths relative to the config file
// and PostgreSQL URLs as they are; a URL that is neither is refused with
// its password hidden.
func TestStoreURL(t *testing.T) {
	dir := t.TempDir()
	write := func(v string) string {
		p := filepath.Join(dir, "c.yaml")
		if err := os.WriteFile(p, []byte("data_dir: data\ninsecure: true\nstore_url: "+v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct{ in, want string }{
		{`""`, ""},
		{"sqlite:db/fc.db", "sqlite:" + filepath.Join(dir, "db/fc.db")},
		{"sqlite:/srv/fc.db", "sqlite:/srv/fc.db"},
		{"'postgres://fc@127.0.0.1:5432/fleet?sslmode=disable'", "postgres://fc@127.0.0.1:5432/fleet?sslmode=disable"},
	} {
		c, err := LoadConfig(write(tc.in))
		if err != nil {
			t.Errorf("store_url %s: %v", tc.in, err)
			continue
		}
		if c.StoreURL != tc.want {
			t.Errorf("store_url %s = %q, want %q", tc.in, c.StoreURL, tc.want)
		}
	}
	for _, bad := range []string{"mysql://u:hunter2@h/db", "'sqlite:'", "'postgres://u:hunter2@h:notaport/db'"} {
		_, err := LoadConfig(write(bad))
		if err == nil || !strings.Contains(err.Error(), "store_url") {
			t.Errorf("store_url %s: %v, want a store_url error", bad, err)
		} else if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("store_url %s: the error shows the password: %v", bad, err)
		}
	}
}
