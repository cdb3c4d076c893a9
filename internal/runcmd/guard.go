package runcmd

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Guard makes sure a probe never runs twice at once. A process stuck in
// the kernel (D state) survives SIGKILL; Run gives up waiting for it, but
// the Guard keeps its key until the process really exits, and every run
// for that key meanwhile is refused at once as stuck instead of piling up
// another hung nvidia-smi. The zero value is ready to use; a Guard must
// not be copied after first use.
type Guard struct {
	mu      sync.Mutex
	running map[string]time.Time
	// start runs the command; nil means run. Tests replace it to model a
	// process that never exits.
	start func(context.Context, Spec) (Result, <-chan struct{})
}

// Run runs s unless the previous run for key has not exited yet; then it
// returns at once with TimedOut set and an error matching ErrStuck:
// "<key> still running since <time> (stuck)".
func (g *Guard) Run(ctx context.Context, key string, s Spec) Result {
	now := time.Now()
	g.mu.Lock()
	if since, busy := g.running[key]; busy {
		g.mu.Unlock()
		return Result{
			ExitCode: -1,
			TimedOut: true,
			Err:      fmt.Errorf("%s still running since %s (%w)", key, since.Format(time.RFC3339), ErrStuck),
		}
	}
	if g.running == nil {
		g.running = make(map[string]time.Time)
	}
	g.running[key] = now
	start := g.start
	g.mu.Unlock()

	if start == nil {
		start = run
	}
	res, exited := start(ctx, s)
	release := func() {
		g.mu.Lock()
		delete(g.running, key)
		g.mu.Unlock()
	}
	select {
	case <-exited:
		release()
	default:
		// Stuck: hold the key until the kernel lets the process go.
		go func() {
			<-exited
			release()
		}()
	}
	return res
}

// Busy reports the keys whose last run has not exited, with their start
// times: what an agent shows as stuck probes.
func (g *Guard) Busy() map[string]time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]time.Time, len(g.running))
	for k, v := range g.running {
		out[k] = v
	}
	return out
}
