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

// TestBackupFollowsStoreURL: with --config, backup copies the SQLite file
// store_url names, and refuses a PostgreSQL store_url with pg_dump's name.
func TestBackupFollowsStoreURL(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "elsewhere", "fc.db")
	st, err := store.Open(context.Background(), store.Options{URL: "sqlite:" + db, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "c.yaml")
	write := func(url string) {
		if err := os.WriteFile(conf, []byte("data_dir: data\ninsecure: true\nstore_url: '"+url+"'\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("sqlite:elsewhere/fc.db")
	dest := filepath.Join(dir, "copy.db")
	out, code := execute(t, "coordinator", "backup", "--config", conf, dest)
	if code != 0 || !strings.Contains(out, "backup of "+db) {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	write("postgres://fc@127.0.0.1:5432/fleet")
	out, code = execute(t, "coordinator", "backup", "--config", conf, filepath.Join(dir, "x.db"))
	if code == 0 || !strings.Contains(out, "pg_dump") {
		t.Fatalf("backup of a PostgreSQL store: exit %d:\n%s", code, out)
	}
}
