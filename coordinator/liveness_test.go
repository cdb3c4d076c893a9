package coordinator

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// logBuf collects log lines from several goroutines.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func sessionOf(t *testing.T, s *Server, node string) *session {
	t.Helper()
	for _, sess := range s.reg.sessions() {
		if sess.node == node {
			return sess
		}
	}
	t.Fatalf("%s has no stream", node)
	return nil
}

func TestLivenessWake(t *testing.T) {
	t.Parallel()
	iv := 10 * time.Second // the watcher wakes every 1s; a pause is a gap over 11s
	t0 := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	s := time.Second
	tests := []struct {
		name   string
		wakes  []time.Duration // gaps between wake-ups
		away   time.Duration   // what the last wake-up says
		last   time.Duration   // a stream's last message, after t0
		silent time.Duration   // its silence at the last wake-up
	}{
		{"on time", slices.Repeat([]time.Duration{s}, 30), 0, 0, 30 * s},
		{"late by less than an interval", []time.Duration{s, 11 * s, s}, 0, 0, 13 * s},
		{"stopped 30s", []time.Duration{s, 30*s + 500*time.Millisecond}, 30*s + 500*time.Millisecond, 0, 0},
		{"a message after the resume", []time.Duration{s, 35 * s, 9 * s}, 0, 37 * s, 8 * s},
		{"silent since the resume", []time.Duration{s, 35 * s, 10 * s, 10 * s, 10 * s}, 0, 0, 30 * s},
		{"a sweep that read the clock before", []time.Duration{s, -s}, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := newLiveness(iv, t0)
			now := t0
			var away time.Duration
			for _, g := range tc.wakes {
				now = now.Add(g)
				away = l.wake(now)
			}
			if away != tc.away {
				t.Errorf("away = %s, want %s", away, tc.away)
			}
			if got := l.silence(t0.Add(tc.last), now); got != tc.silent {
				t.Errorf("silence = %s, want %s", got, tc.silent)
			}
		})
	}
}

// A coordinator stopped for longer than three heartbeat intervals (SIGSTOP,
// a frozen VM) must not close the streams of agents whose heartbeats wait
// in the sockets: silence counts from the resume. A stream that stays
// silent after it is still closed, three intervals later.
func TestPausedCoordinatorKeepsStreams(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{t: time.Now()}
	// The sweeps are the test's own: the background one, once per
	// interval of real time, never comes within the test.
	iv := 10 * time.Minute
	var logs logBuf
	s, err := New(Config{Listen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", DataDir: t.TempDir(),
		HeartbeatInterval: iv, Insecure: true},
		Options{Logger: zerolog.New(&logs), Version: "test", Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(t, s) })
	ctx := context.Background()

	talker := mustConnect(t, s, "talker")
	quiet := mustConnect(t, s, "quiet")
	speak := func() {
		t.Helper()
		talker.heartbeat()
		sess := sessionOf(t, s, "talker")
		testwait.Until(t, 5*time.Second, "the talker's heartbeat read", func() bool { return sess.lastRecv().Equal(clk.now()) })
	}
	clk.add(iv)
	speak()
	s.sweep(ctx, clk.now())

	// Stopped for three intervals and a half: on resume the clock has jumped.
	clk.add(3*iv + iv/2)
	s.sweep(ctx, clk.now())
	for _, node := range []string{"talker", "quiet"} {
		if err := sessionOf(t, s, node).ctx.Err(); err != nil {
			t.Fatalf("%s's stream closed on resume: %v", node, context.Cause(sessionOf(t, s, node).ctx))
		}
	}
	if !strings.Contains(logs.String(), "coordinator was not running") {
		t.Errorf("the pause is not logged: %s", logs.String())
	}
	// What waited in the socket arrives, and the agent goes on speaking.
	for range 3 {
		speak()
		s.sweep(ctx, clk.now())
		clk.add(iv)
	}
	clk.add(time.Second)
	speak()
	s.sweep(ctx, clk.now())
	st := quiet.waitEnd(5 * time.Second)
	if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "no message for 30m1s") {
		t.Errorf("the silent stream ended with %v, want closed after 3 intervals of silence since the resume", st)
	}
	if err := sessionOf(t, s, "talker").ctx.Err(); err != nil {
		t.Fatalf("the talker's stream closed: %v", context.Cause(sessionOf(t, s, "talker").ctx))
	}
	if hasEvent(eventsOf(t, s, "talker"), StateUnreachable) {
		t.Errorf("the talker was marked unreachable: %v", eventsOf(t, s, "talker"))
	}
}
