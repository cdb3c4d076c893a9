package campaign_test

import (
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/campaign"
)

// TestConnectGraceCoversAgentBackoff: after a coordinator restart an agent
// may wait up to its maximum reconnect backoff before it knocks again; the
// default grace must outlast that, or a restart skips nodes.
func TestConnectGraceCoversAgentBackoff(t *testing.T) {
	t.Parallel()
	if campaign.DefaultConnectGrace < agent.DefaultReconnectMax {
		t.Fatalf("default connect grace %v is shorter than the agent's maximum reconnect backoff %v",
			campaign.DefaultConnectGrace, agent.DefaultReconnectMax)
	}
	for _, tc := range []struct {
		in   time.Duration
		want time.Duration
		ok   bool
	}{
		{0, campaign.DefaultConnectGrace, true},
		{time.Minute, time.Minute, true},
		{time.Second, time.Second, false},
		{-time.Minute, -time.Minute, false},
		{48 * time.Hour, 48 * time.Hour, false},
	} {
		d := tc.in
		err := campaign.CheckConnectGrace(&d)
		if (err == nil) != tc.ok || d != tc.want {
			t.Errorf("CheckConnectGrace(%v) = %v, %v", tc.in, d, err)
		}
	}
}

func TestConnectWaits(t *testing.T) {
	t.Parallel()
	var w campaign.ConnectWaits
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if since, over := w.Wait("c/n1", t0, time.Minute); !since.Equal(t0) || over {
		t.Fatalf("first wait: %v %v", since, over)
	}
	if since, over := w.Wait("c/n1", t0.Add(59*time.Second), time.Minute); !since.Equal(t0) || over {
		t.Fatalf("within grace: %v %v", since, over)
	}
	if _, over := w.Wait("c/n1", t0.Add(time.Minute), time.Minute); !over {
		t.Fatal("grace over not reported")
	}
	w.Done("c/n1")
	if !w.Since("c/n1").IsZero() {
		t.Fatal("Done kept the wait")
	}
}
