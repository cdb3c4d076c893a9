package collect

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/needs"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/host/live"
)

// collect on a live root whose /proc and /sys hold a pipe, a device node
// and a huge file copies what is regular and small, and skips the rest
// instead of hanging on the pipe or reading the device without end.
func TestCollectSkipsPipesDevicesAndHugeFiles(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	counters := filepath.Join(root, "sys/class/infiniband/mlx5_0/ports/1/counters")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(counters, 0o755))
	must(os.MkdirAll(filepath.Join(root, "proc"), 0o755))
	must(os.WriteFile(filepath.Join(root, "proc/uptime"), []byte("100.0 50.0\n"), 0o644))
	must(syscall.Mkfifo(filepath.Join(root, "proc/modules"), 0o644))
	must(os.WriteFile(filepath.Join(counters, "symbol_error"), []byte("0\n"), 0o644))
	must(syscall.Mkfifo(filepath.Join(counters, "link_downed"), 0o644))
	huge, err := os.Create(filepath.Join(counters, "port_rcv_data"))
	must(err)
	must(huge.Truncate(live.MaxFileBytes + 1))
	must(huge.Close())
	device := os.Geteuid() == 0 && syscall.Mknod(filepath.Join(counters, "port_xmit_data"), syscall.S_IFCHR|0o644, 1<<8|5) == nil
	if !device {
		needs.Partly(t, "no device node (needs root and CAP_MKNOD); pipe and huge file still tested")
	}

	none := "/nonexistent/fleetcheck-test-tool"
	h, err := live.New(root, config.Tools{NvidiaSMI: none, Dmesg: none, DCGMI: none, AllReducePerf: none, Timeout: config.Duration(5 * time.Second)})
	must(err)
	out := filepath.Join(t.TempDir(), "b")
	w, err := bundle.Create(out, time.Now())
	must(err)
	done := make(chan error, 1)
	go func() { _, err := Collect(context.Background(), h, w, Options{}); done <- err }()
	select {
	case err := <-done:
		must(err)
	case <-time.After(time.Minute):
		t.Fatal("collect hung on a pipe or device under /proc or /sys")
	}
	must(w.Close())

	for name, want := range map[string]bool{
		"fs/proc/uptime":  true,
		"fs/proc/modules": false,
		"fs/sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error":   true,
		"fs/sys/class/infiniband/mlx5_0/ports/1/counters/link_downed":    false,
		"fs/sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data":  false,
		"fs/sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data": false,
	} {
		_, err := os.Stat(filepath.Join(out, name))
		if got := err == nil; got != want {
			t.Errorf("%s in the bundle: %v, want %v (%v)", name, got, want, err)
		}
	}
	if _, err := bundle.Open(out); err != nil {
		t.Errorf("the collected bundle does not open: %v", err)
	}
}
