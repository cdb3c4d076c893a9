package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
)

// TestBackupConfigFromAnotherDir: `coordinator backup --config
// coord/coordinator.yaml` finds the data directory the coordinator uses,
// relative to the config file, from any working directory.
func TestBackupConfigFromAnotherDir(t *testing.T) {
	root := t.TempDir()
	conf := filepath.Join(root, "coord")
	other := filepath.Join(root, "ops")
	for _, d := range []string{conf, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(conf, "coordinator.yaml"), []byte("data_dir: data\ninsecure: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), store.Options{Dir: filepath.Join(conf, "data"), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	t.Chdir(other)
	out, code := execute(t, "coordinator", "backup", "--config", "../coord/coordinator.yaml", "copy.db")
	if code != 0 || !strings.Contains(out, "backup of "+filepath.Join(conf, "data")+" written to copy.db") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if fi, err := os.Stat(filepath.Join(other, "copy.db")); err != nil || fi.Size() == 0 {
		t.Fatalf("backup file: %v %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(other, "data")); !os.IsNotExist(err) {
		t.Errorf("a data directory appeared in the working directory: %v", err)
	}
}
