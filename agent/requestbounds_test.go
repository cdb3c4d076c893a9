package agent

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

func TestRequestedDuration(t *testing.T) {
	t.Parallel()
	const limit = 30 * time.Minute
	for _, tc := range []struct {
		ms   int64
		want time.Duration
	}{
		{0, 0},
		{-1, 0},
		{math.MinInt64, 0},
		{1, time.Millisecond},
		{1500, 1500 * time.Millisecond},
		{limit.Milliseconds(), limit},
		{limit.Milliseconds() + 1, limit},
		{9e15, limit},                      // wraps negative when multiplied
		{math.MaxInt64 / 1_000_000, limit}, // the largest that does not wrap
		{math.MaxInt64, limit},             // wraps to -1ms when multiplied
	} {
		if got := requestedDuration(tc.ms, limit); got != tc.want {
			t.Errorf("%d ms: got %v, want %v", tc.ms, got, tc.want)
		}
	}
}

// FuzzRequestedDuration: whatever a coordinator sends, a requested
// duration is never negative and never above its limit.
func FuzzRequestedDuration(f *testing.F) {
	for _, ms := range []int64{0, -1, 1, 9e15, math.MaxInt64, math.MinInt64, math.MaxInt64 / 1_000_000, 1800000, 1800001} {
		f.Add(ms, int64(30*time.Minute))
	}
	f.Fuzz(func(t *testing.T, ms, limit int64) {
		if limit <= 0 {
			return
		}
		got := requestedDuration(ms, time.Duration(limit))
		if got < 0 || got > time.Duration(limit) || (ms > 0 && got == 0 && limit >= int64(time.Millisecond)) {
			t.Fatalf("requestedDuration(%d, %d) = %d", ms, limit, got)
		}
	})
}

// A requested timeout of INT64_MAX ms is clamped to work.max_timeout
// instead of wrapping to -1ms (a run that times out before it starts).
func TestRequestTimeoutClamped(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	a := &Agent{cfg: cfg, log: zerolog.Nop()}
	limit := time.Duration(cfg.Work.MaxTimeout)
	for _, ms := range []int64{math.MaxInt64, 9e15, limit.Milliseconds() + 1} {
		if got := a.requestTimeout(&fleetcheckv1.RunChecks{TimeoutMs: ms}, limit); got != limit {
			t.Errorf("timeout_ms %d: got %v, want %v", ms, got, limit)
		}
	}
	if got := a.requestTimeout(&fleetcheckv1.RunChecks{TimeoutMs: 2000}, limit); got != 2*time.Second {
		t.Errorf("timeout_ms 2000: got %v", got)
	}
	if got := a.requestTimeout(&fleetcheckv1.RunChecks{}, limit); got != time.Duration(cfg.Work.DefaultTimeout) {
		t.Errorf("no timeout: got %v", got)
	}
}

// revert_after_ms = 9e15 is clamped to the action's revert_after_max (24h
// by default), not refused with a false reason; an action's timeout_ms of
// INT64_MAX runs with the action's own timeout.
func TestHugeRevertAfterClamped(t *testing.T) {
	t.Parallel()
	tn := &testNet{}
	c := newFakeCoord()
	tn.serve(t, c)
	n := simAgentHost(t, "gpu-001")
	startAgent(t, actionTestConfig(t, "gpu-001"), n, tn)
	testwait.Until(t, 10*time.Second, "connected", c.connected)
	c.send(t, &fleetcheckv1.CoordinatorMessage{Msg: &fleetcheckv1.CoordinatorMessage_RunAction{RunAction: &fleetcheckv1.RunAction{
		ActionId: "big1", Action: "ib-port-down", Params: map[string]string{"hca": "mlx5_0", "port": "1"},
		RevertAfterMs: 9e15, RevertOnDisconnectMs: math.MaxInt64, TimeoutMs: math.MaxInt64,
	}}})
	st := waitAction(t, c, "big1")
	if st.GetState() != fleetcheckv1.ActionStatus_STATE_DONE {
		t.Fatalf("got %s %q, want DONE", st.GetState(), st.GetMessage())
	}
	acc := c.actionState("big1", fleetcheckv1.ActionStatus_STATE_ACCEPTED)
	if acc == nil || !strings.Contains(acc.GetMessage(), "ib-port-up armed for 24h, or 24h without the coordinator") {
		t.Errorf("accepted with %q, want the timers clamped to 24h", acc.GetMessage())
	}
	// The revert still works: the fault is undone on request.
	c.send(t, runAction("big2", "ib-port-up", map[string]string{"hca": "mlx5_0", "port": "1"}, 0, 0))
	if st := waitAction(t, c, "big2"); st.GetState() != fleetcheckv1.ActionStatus_STATE_DONE {
		t.Fatalf("revert: %s %q", st.GetState(), st.GetMessage())
	}
}

// FuzzAdmitParams: a request's check parameters are accepted only when
// known, for a check the request runs, with a value matching in full.
func FuzzAdmitParams(f *testing.F) {
	for _, seed := range [][2]string{
		{"level", "2"}, {"level", "5"}, {"min_bytes", "8"}, {"max_bytes", "8G"},
		{"max_bytes", "9223372036854775807"}, {"max_bytes", "9000000000000G"}, {"step_factor", "16"},
		{"step_factor", "-1"}, {"min_bytes", "1 -e 8G"}, {"timeout_ms", "9223372036854775807"},
	} {
		f.Add(seed[0], seed[1])
	}
	known := checkParams()
	f.Fuzz(func(t *testing.T, k, v string) {
		why := admitParams(map[string]string{k: v}, []string{"dcgm.diag", "nccl.allreduce"})
		p, ok := known[k]
		if accepted := why == ""; accepted != (ok && p.re.MatchString(v)) {
			t.Fatalf("%q=%q: refusal %q", k, v, why)
		}
	})
}
