package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/inspect"
)

// guardedHost lets scheduled passes and requested checks run at the same
// time without two of them reading one source at once: a capture of a
// source already being read joins that read instead of starting another.
// A joiner whose deadline passes first gets a timeout naming the read it
// waited for, so a stuck nvidia-smi is reported stuck by every pass rather
// than piled up, and a host whose Capture ignores its context still cannot
// hold a pass past its deadline.
type guardedHost struct {
	h  host.Host
	mu sync.Mutex
	// inflight holds the read under way for each source (and, for the
	// sources run parameters apply to, each set of parameters).
	inflight map[string]*flight
}

type flight struct {
	done    chan struct{}
	started time.Time
	c       host.Capture
}

// nvmlGuardedHost keeps a host's NVML reader visible to inspect through
// the wrapper; NVML calls are in-process and need no guard.
type nvmlGuardedHost struct {
	*guardedHost
	r inspect.NVMLReader
}

func (g nvmlGuardedHost) GPUStateNVML() (*snapshot.GPUState, error) { return g.r.GPUStateNVML() }

func guard(h host.Host) host.Host {
	g := &guardedHost{h: h, inflight: map[string]*flight{}}
	if r, ok := h.(inspect.NVMLReader); ok {
		return nvmlGuardedHost{guardedHost: g, r: r}
	}
	return g
}

func (g *guardedHost) Name() string   { return g.h.Name() }
func (g *guardedHost) Now() time.Time { return g.h.Now() }
func (g *guardedHost) FS() fs.FS      { return g.h.FS() }

// CaptureStream keeps a bundle's kernel log a stream through the guard
// (host.Streamer: a 256 MiB dmesg.txt is parsed, never held); a bundle's
// files need no guard. Other hosts' captures go through Capture.
func (g *guardedHost) CaptureStream(ctx context.Context, src snapshot.Source) (io.ReadCloser, host.Capture) {
	if s, ok := g.h.(host.Streamer); ok {
		return s.CaptureStream(ctx, src)
	}
	c := g.Capture(ctx, src)
	if c.State != snapshot.StateOK && len(c.Data) == 0 {
		return nil, c
	}
	return io.NopCloser(bytes.NewReader(c.Data)), c
}

func (g *guardedHost) Capture(ctx context.Context, src snapshot.Source) host.Capture {
	key := string(src)
	if src == snapshot.SrcAllReduce || src == snapshot.SrcDCGMDiag {
		// The sources run parameters apply to: other parameters, another run.
		if p := host.ParamsFrom(ctx); len(p) > 0 {
			key += "?" + p.Key()
		}
	}
	g.mu.Lock()
	f := g.inflight[key]
	if f == nil {
		f = &flight{done: make(chan struct{}), started: time.Now()}
		g.inflight[key] = f
		// The read runs on its own goroutine so the caller can leave at its
		// deadline even if the host does not; it uses the first caller's
		// context, which bounds well-behaved hosts.
		go func() {
			c := g.h.Capture(ctx, src)
			g.mu.Lock()
			f.c = c
			delete(g.inflight, key)
			g.mu.Unlock()
			close(f.done)
		}()
	}
	g.mu.Unlock()
	select {
	case <-f.done:
		return f.c
	case <-ctx.Done():
		return host.Capture{
			State: snapshot.StateTimeout,
			Err:   fmt.Sprintf("%s: still running after %s", src, time.Since(f.started).Round(time.Millisecond)),
		}
	}
}
