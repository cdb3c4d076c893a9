package safefs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/needs"
)

func TestDirFSOpensOnlyRegularFilesWithinTheLimit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "small"), []byte("42\n"), 0o644))
	must(syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644))
	must(os.Symlink("pipe", filepath.Join(dir, "link-to-pipe")))
	must(os.Symlink("small", filepath.Join(dir, "link-to-small")))
	sparse, err := os.Create(filepath.Join(dir, "sparse"))
	must(err)
	must(sparse.Truncate(1 << 30))
	must(sparse.Close())
	fsys := NewDirFS(dir, 1<<20)
	cases := []struct {
		name string
		want error
		data string
	}{
		{"small", nil, "42\n"},
		{"link-to-small", nil, "42\n"},
		{"pipe", ErrNotRegular, ""},
		{"link-to-pipe", ErrNotRegular, ""},
		{"sparse", ErrTooLarge, ""},
		{"missing", fs.ErrNotExist, ""},
		{"../escape", fs.ErrInvalid, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := fs.ReadFile(fsys, tc.name)
			if !errors.Is(err, tc.want) || (tc.want == nil && string(got) != tc.data) {
				t.Fatalf("got %q, %v; want %q, %v", got, err, tc.data, tc.want)
			}
		})
	}
}

// /proc files say they are empty: the limit, not the stat, ends the read.
func TestReadAllOfZeroSizedProcFile(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/status"); err != nil {
		needs.Skip(t, "no /proc: %v", err)
	}
	got, err := fs.ReadFile(NewDirFS("/proc", 1<<20), "self/status")
	if err != nil || !strings.Contains(string(got), "Name:") {
		t.Fatalf("read %q, %v", got, err)
	}
	if _, err := fs.ReadFile(NewDirFS("/proc", 16), "self/status"); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a /proc file past a 16-byte limit: %v, want ErrTooLarge", err)
	}
}
