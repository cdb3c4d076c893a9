package agent

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/inspect"
)

// streamHost is a bundle-like host whose kernel log only comes as a stream.
type streamHost struct{ stuckHost }

func (*streamHost) CaptureStream(_ context.Context, src snapshot.Source) (io.ReadCloser, host.Capture) {
	return io.NopCloser(strings.NewReader("[1.0] NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus.\n")), host.OK(nil)
}

func (*streamHost) Capture(_ context.Context, src snapshot.Source) host.Capture {
	if src == snapshot.SrcKernelLog {
		return host.Capture{State: snapshot.StateFailed, Err: "read whole: the guard must stream"}
	}
	return host.Absent("none")
}

// An agent replaying a bundle keeps its kernel log a stream through the
// guard, so a large dmesg.txt is never held whole.
func TestGuardKeepsKernelLogAStream(t *testing.T) {
	t.Parallel()
	s := inspect.Read(context.Background(), guard(&streamHost{}), inspect.Want{})
	if st := s.Source(snapshot.SrcKernelLog); st.State != snapshot.StateOK || s.Kernel == nil || len(s.Kernel.Events) != 1 {
		t.Fatalf("kernel log through the guard: %+v, kernel %+v", st, s.Kernel)
	}
	// A host without streams still gets its capture parsed.
	s = inspect.Read(context.Background(), guard(&stuckHost{release: make(chan struct{})}), inspect.Want{})
	if st := s.Source(snapshot.SrcKernelLog); st.State != snapshot.StateOK || s.Kernel == nil || s.Kernel.Lines != 1 {
		t.Fatalf("kernel log of a plain host: %+v, kernel %+v", st, s.Kernel)
	}
}
