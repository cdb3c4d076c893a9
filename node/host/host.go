// Package host is the one door to a machine: its files under a root, and the
// raw output of the tools that probes read. The live machine, a captured
// support bundle and the simulator all implement Host, so the same parsers
// run against each.
package host

import (
	"context"
	"io"
	"io/fs"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Host is a machine that probes can read.
type Host interface {
	// Name is the node's name (hostname, or the bundle's recorded hostname).
	Name() string
	// Now is the host's clock: the collection time for a bundle.
	Now() time.Time
	// FS is the host's file tree rooted at "/", addressed with io/fs paths
	// ("sys/class/infiniband", "proc/modules").
	FS() fs.FS
	// Capture returns the raw output of a command source (nvidia-smi XML,
	// NVLink text, kernel log, all_reduce_perf, dcgmi diag, versions).
	// It never blocks past ctx's deadline.
	Capture(ctx context.Context, src snapshot.Source) Capture
}

// Streamer is a host that can hand a source's output as a stream: a
// bundle's dmesg.txt, which may be hundreds of megabytes, is parsed line
// by line instead of held whole. The stream is nil unless there is data;
// the caller closes it.
type Streamer interface {
	CaptureStream(ctx context.Context, src snapshot.Source) (io.ReadCloser, Capture)
}

// Capture is the raw output of one source and how getting it went.
type Capture struct {
	Data     []byte
	State    snapshot.State
	ExitCode int
	// Err says why State is not ok ("nvidia-smi not found", "timed out after 30s").
	Err string
}

// OK builds a successful capture.
func OK(data []byte) Capture { return Capture{Data: data, State: snapshot.StateOK} }

// Absent builds a capture for a source the host does not have.
func Absent(why string) Capture { return Capture{State: snapshot.StateAbsent, Err: why} }
