//go:build !node

package main

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

// cutWriter takes n bytes, then fails like a pipe whose reader went away
// (`fleetcheck rollout status ID | head -1`).
type cutWriter struct {
	n   int
	got strings.Builder
}

func (w *cutWriter) Write(p []byte) (int, error) {
	if w.n <= 0 {
		return 0, syscall.EPIPE
	}
	if len(p) > w.n {
		n := w.n
		w.n = 0
		w.got.Write(p[:n])
		return n, syscall.EPIPE
	}
	w.n -= len(p)
	w.got.Write(p)
	return len(p), nil
}

// A table or document cut short is a failed command (exit 2, the write's
// error), never a success with half the output; nothing panics. On stdout
// itself the Go runtime ends the process with SIGPIPE first.
func TestCutOutputFailsTheCommand(t *testing.T) {
	conn := fakeCoordinator(t, &fakeCampaigns{t: t})
	cutShort(t, conn, campaignVerbs)
	// The operator verbs against a real coordinator: `fleetcheck nodes | head -1`.
	cutShort(t, campaignCoordinator(t), []struct {
		golden string
		args   []string
	}{{"", []string{"nodes"}}, {"", []string{"events"}}, {"", []string{"results", "gpu-001"}}})
}

func cutShort(t *testing.T, conn []string, verbs []struct {
	golden string
	args   []string
}) {
	t.Helper()
	for _, v := range verbs {
		for _, o := range []string{"table", "json"} {
			for _, n := range []int{0, 10} {
				root := newRoot()
				w := &cutWriter{n: n}
				root.SetOut(w)
				root.SetErr(&strings.Builder{})
				root.SetArgs(append(append(v.args, "-o", o), conn...))
				err := root.Execute()
				if !errors.Is(err, syscall.EPIPE) || exitCode(err) != exitCommand {
					t.Errorf("%s -o %s, output cut after %d bytes: error %v (exit %d), printed %q",
						strings.Join(v.args, " "), o, n, err, exitCode(err), w.got.String())
				}
			}
		}
	}
}
