// Package runcmd is the one way fleetcheck runs an external tool.
//
// Every command runs in its own process group. On timeout or cancellation
// the whole group gets SIGTERM and, after a short grace, SIGKILL: mpirun and
// shell wrappers leave children behind that would otherwise keep GPUs busy
// and pipes open. Output is bounded, and Run never blocks much past the
// deadline, not even when a grandchild holds stdout open or the process is
// stuck in uninterruptible sleep (D state) where SIGKILL cannot reach it.
package runcmd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Defaults.
const (
	DefaultMaxOutput = 64 << 20 // bytes kept of each of stdout and stderr
	DefaultKillGrace = 2 * time.Second
	// stuckSlack is how long Run waits after SIGKILL before it stops
	// waiting: a process that has not exited by then is stuck in the kernel.
	stuckSlack = time.Second
)

// Sentinel errors, for errors.Is.
var (
	ErrNotFound = errors.New("not found")
	ErrTimeout  = errors.New("timed out")
	ErrStuck    = errors.New("stuck")
)

// Spec says what to run.
type Spec struct {
	// Path is the program: a name looked up on PATH, or a path.
	Path string
	Args []string
	// Env adds to (and overrides) the inherited environment: "KEY=value".
	Env []string
	Dir string
	// Timeout bounds the run; 0 leaves only the context's deadline.
	Timeout time.Duration
	// MaxOutput bounds the bytes kept of each of stdout and stderr;
	// 0 means DefaultMaxOutput. Output past it is read and dropped so the
	// tool never blocks on a full pipe.
	MaxOutput int64
	// KillGrace is the time between SIGTERM and SIGKILL; 0 means
	// DefaultKillGrace.
	KillGrace time.Duration
}

// Result is how a run went. Err is nil when the program ran and exited by
// itself, whatever its exit code: callers judge codes (dcgmi exits 226 when
// the diagnostic found a failure, and its JSON still counts).
type Result struct {
	Stdout []byte
	Stderr []byte
	// ExitCode is the program's exit status; -1 when it did not exit
	// normally (never started, killed by a signal, still stuck).
	ExitCode int
	// TimedOut is set when the deadline passed before the program exited,
	// or when a Guard refused to start it because the last run is stuck.
	TimedOut bool
	// NotFound is set when the program does not exist.
	NotFound  bool
	Truncated bool
	Duration  time.Duration
	Err       error
}

// Run runs one command. It returns no later than about Timeout +
// KillGrace + 1s after it starts, even if the process cannot be reaped.
func Run(ctx context.Context, s Spec) Result {
	res, _ := run(ctx, s)
	return res
}

// run also returns a channel closed when the process has really exited
// (immediately for a process that never started): Guard holds its key
// until then.
func run(ctx context.Context, s Spec) (Result, <-chan struct{}) {
	start := time.Now()
	exited := make(chan struct{})
	name := filepath.Base(s.Path)
	fail := func(r Result) (Result, <-chan struct{}) {
		r.ExitCode = -1
		r.Duration = time.Since(start)
		close(exited)
		return r, exited
	}
	if s.Path == "" {
		return fail(Result{Err: errors.New("runcmd: empty program path")})
	}
	path, err := exec.LookPath(s.Path)
	if err != nil {
		if isNotFound(err) {
			return fail(Result{NotFound: true, Err: notFound(name, err)})
		}
		return fail(Result{Err: fmt.Errorf("%s: %w", name, err)})
	}

	grace := s.KillGrace
	if grace <= 0 {
		grace = DefaultKillGrace
	}
	limit := s.MaxOutput
	if limit <= 0 {
		limit = DefaultMaxOutput
	}
	if s.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.Timeout)
		defer cancel()
	}

	stdout := &boundedBuffer{max: limit}
	stderr := &boundedBuffer{max: limit}
	cmd := exec.CommandContext(ctx, path, s.Args...)
	cmd.Dir = s.Dir
	if len(s.Env) > 0 {
		cmd.Env = append(os.Environ(), s.Env...)
	}
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	setProcessGroup(cmd)

	// terminate signals the group once, whether exec's context watcher or
	// our own select sees the deadline first (after the leader exits exec
	// no longer calls Cancel, but its group may live on).
	var (
		once     sync.Once
		mu       sync.Mutex
		killer   *time.Timer
		canceled bool
	)
	terminate := func() {
		once.Do(func() {
			pid := cmd.Process.Pid
			signalGroup(pid, syscall.SIGTERM)
			mu.Lock()
			canceled = true
			killer = time.AfterFunc(grace, func() { signalGroup(pid, syscall.SIGKILL) })
			mu.Unlock()
		})
	}
	cmd.Cancel = func() error { terminate(); return nil }
	// After WaitDelay exec stops waiting for the pipes: a grandchild that
	// left the group with our stdout cannot hold Wait forever.
	cmd.WaitDelay = grace + stuckSlack/2

	if err := cmd.Start(); err != nil {
		if isNotFound(err) {
			return fail(Result{NotFound: true, Err: notFound(name, err)})
		}
		return fail(Result{Err: fmt.Errorf("%s: start: %w", name, err)})
	}

	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()

	stuck := false
	select {
	case <-exited:
	case <-ctx.Done():
		select {
		case <-exited: // it finished as the deadline came: not a timeout
		default:
			terminate()
			select {
			case <-exited:
			case <-time.After(grace + stuckSlack):
				stuck = true
			}
		}
	}

	res := Result{ExitCode: -1, Duration: time.Since(start)}
	res.Stdout, res.Truncated = stdout.snapshot()
	var errTrunc bool
	res.Stderr, errTrunc = stderr.snapshot()
	res.Truncated = res.Truncated || errTrunc

	if stuck {
		res.TimedOut = true
		res.Err = fmt.Errorf("%s %w after %v and did not exit after SIGKILL (%w)", name, ErrTimeout, limitText(s, start), ErrStuck)
		return res, exited
	}

	// The process exited: kill whatever of its group survived SIGTERM now
	// instead of waiting out the grace.
	mu.Lock()
	wasCanceled := canceled
	if killer != nil && killer.Stop() {
		signalGroup(cmd.Process.Pid, syscall.SIGKILL)
	}
	mu.Unlock()

	if ps := cmd.ProcessState; ps != nil {
		res.ExitCode = ps.ExitCode()
	}
	switch ctxErr := ctx.Err(); {
	case wasCanceled && errors.Is(ctxErr, context.DeadlineExceeded):
		res.TimedOut = true
		res.Err = fmt.Errorf("%s %w after %v", name, ErrTimeout, limitText(s, start))
	case wasCanceled:
		res.Err = fmt.Errorf("%s: %w", name, ctxErr)
	case waitErr != nil:
		var ee *exec.ExitError
		if errors.As(waitErr, &ee) && ee.Exited() {
			break // a plain non-zero exit: ExitCode says it
		}
		if errors.Is(waitErr, exec.ErrWaitDelay) {
			// The program exited but something kept its output open.
			res.Err = fmt.Errorf("%s: output left open by a child: %w", name, waitErr)
			break
		}
		res.Err = fmt.Errorf("%s: %w", name, waitErr)
	}
	return res, exited
}

// limitText is the deadline a timeout message names: the configured
// timeout ("timed out after 30s"), or the time spent when the caller's
// context set the deadline.
func limitText(s Spec, start time.Time) time.Duration {
	if s.Timeout > 0 {
		return s.Timeout
	}
	return time.Since(start).Round(time.Millisecond)
}

func isNotFound(err error) bool {
	return errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOENT)
}

// notFoundError reads "<name> not found" and matches ErrNotFound and the
// underlying error.
type notFoundError struct {
	name string
	err  error
}

func notFound(name string, err error) error { return &notFoundError{name: name, err: err} }

func (e *notFoundError) Error() string { return e.name + " not found" }

func (e *notFoundError) Unwrap() []error { return []error{ErrNotFound, e.err} }

// boundedBuffer keeps the first max bytes written and drops the rest. It
// is locked because a stuck run returns while exec may still be copying.
type boundedBuffer struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	max       int64
	truncated bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	room := b.max - int64(b.buf.Len())
	if room <= 0 {
		if len(p) > 0 {
			b.truncated = true
		}
		return len(p), nil
	}
	if int64(len(p)) > room {
		b.buf.Write(p[:room])
		b.truncated = true
		return len(p), nil
	}
	b.buf.Write(p)
	return len(p), nil
}

// snapshot returns a copy of what was kept.
func (b *boundedBuffer) snapshot() ([]byte, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes()), b.truncated
}
