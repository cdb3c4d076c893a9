package live

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
)

func TestRunAction(t *testing.T) {
	t.Parallel()
	h, err := New(t.TempDir(), config.Tools{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Arguments stay arguments: no shell sees them.
	out, err := h.RunAction(ctx, "echo", []string{"550.54.15", "$(reboot);", "a b"})
	if err != nil || out != "550.54.15 $(reboot); a b\n" {
		t.Errorf("echo: %q %v", out, err)
	}
	if _, err := h.RunAction(ctx, "false", nil); err == nil || !strings.Contains(err.Error(), "exited 1") {
		t.Errorf("false: %v", err)
	}
	if _, err := h.RunAction(ctx, "/nonexistent/fleetcheck-action", nil); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("missing program: %v", err)
	}
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := h.RunAction(tctx, "sleep", []string{"30"}); err == nil || time.Since(start) > 5*time.Second {
		t.Errorf("sleep past the deadline: %v after %s", err, time.Since(start))
	}
}

func TestRunMultiNodeKeepsFailureOutput(t *testing.T) {
	t.Parallel()
	h, err := New(t.TempDir(), config.Tools{})
	if err != nil {
		t.Fatal(err)
	}
	c := h.RunMultiNode(context.Background(), host.MultiNodeRun{Argv: []string{"sh", "-c", "echo 'x: Test NCCL failure common.cu:958'; exit 3"}, Hosts: []string{"a", "b"}, Timeout: 5 * time.Second})
	if c.State != snapshot.StateOK || !strings.Contains(string(c.Data), "Test NCCL failure") {
		t.Errorf("failed run: %s %q", c.State, c.Data)
	}
}

func TestAllReduceArgs(t *testing.T) {
	t.Parallel()
	base := []string{"-b", "8", "-e", "8G", "-f", "2", "-g", "8"}
	got := allReduceArgs(base, host.RunParams{"max_bytes": "1G", "step_factor": "4"})
	if want := []string{"-b", "8", "-e", "1G", "-f", "4", "-g", "8"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := allReduceArgs([]string{"-g", "8"}, host.RunParams{"min_bytes": "1M"}); !slices.Equal(got, []string{"-g", "8", "-b", "1M"}) {
		t.Errorf("appended: %q", got)
	}
	if base[3] != "8G" {
		t.Error("the configured arguments were modified")
	}
}
