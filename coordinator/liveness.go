package coordinator

import (
	"context"
	"sync"
	"time"
)

// liveness judges an agent stream's silence by what arrives while this
// process runs. A coordinator that was stopped (SIGSTOP, a frozen VM, a
// long GC or swap stall) reads a clock that jumped on resume, while the
// heartbeats its agents sent meanwhile still wait unread in the sockets:
// measured from the clock alone, every stream would look silent and be
// closed, flapping the whole fleet unreachable. So a goroutine that does
// nothing but wake up often notes when the process ran; a wake-up that
// comes more than a heartbeat interval late means the process was away,
// and silence is then counted from the moment it came back: every stream
// gets the same three intervals to speak that it gets when it connects.
type liveness struct {
	interval time.Duration
	every    time.Duration // how often the watcher wakes

	mu      sync.Mutex
	woke    time.Time // the last wake-up
	resumed time.Time // silence counts from no earlier than this
}

func newLiveness(interval time.Duration, now time.Time) *liveness {
	return &liveness{interval: interval, every: min(max(interval/4, 10*time.Millisecond), time.Second), woke: now}
}

// wake records that the process ran at now. When it had not run for more
// than a heartbeat interval beyond the watcher's period, it returns how
// long it was away and counts silence from now on.
func (l *liveness) wake(now time.Time) (away time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !now.After(l.woke) {
		return 0 // a sweep that read the clock before the watcher did
	}
	if gap := now.Sub(l.woke); gap > l.every+l.interval {
		l.resumed = now
		away = gap
	}
	l.woke = now
	return away
}

// silence is how long a stream whose last message came at last counts as
// silent at now.
func (l *liveness) silence(last, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.resumed.After(last) {
		last = l.resumed
	}
	return now.Sub(last)
}

// watchPauses wakes every l.every until ctx ends. It does no other work,
// so that only time the process did not run makes it late.
func (s *Server) watchPauses(ctx context.Context) {
	defer s.bg.Done()
	t := time.NewTicker(s.live.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.noteWake(s.now())
		}
	}
}

func (s *Server) noteWake(now time.Time) {
	if away := s.live.wake(now); away > 0 {
		s.log.Warn().Int64("away_ms", away.Milliseconds()).Int64("heartbeat_interval_ms", s.cfg.HeartbeatInterval.Milliseconds()).
			Msg("coordinator was not running (stopped, frozen or stalled): agents' silence counts from now")
	}
}
