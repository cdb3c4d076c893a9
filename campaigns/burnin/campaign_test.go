package burnin

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestEveryBuiltinLevelAcceptsAHealthyNode runs each built-in level with
// its defaults end to end on a healthy fleet whose coordinator refuses
// what the real one refuses (a run timeout above its cap). A built-in
// suite that cannot pass (extended's dcgm-r3 once asked for 1h30m) makes
// every node inconclusive and fails here.
func TestEveryBuiltinLevelAcceptsAHealthyNode(t *testing.T) {
	t.Parallel()
	for _, level := range []Level{Quick, Standard, Extended} {
		t.Run(string(level), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, 4)
			h.setSKUBaselines()
			id := h.start("selector: batch=new\nlevel: " + string(level) + "\n")
			h.finish(h.eng)
			r := h.report(id)
			if r.Campaign.Accepted != 4 {
				for _, n := range r.Nodes {
					t.Errorf("%s: %s %s", n.Node, n.Verdict, n.Reason)
				}
				t.Fatalf("level %s: %d of 4 accepted", level, r.Campaign.Accepted)
			}
			for _, n := range r.Nodes {
				for _, run := range n.Runs {
					if run.Outcome != OutcomeOK {
						t.Errorf("%s step %s: %s %s", n.Node, run.Step, run.Outcome, run.Error)
					}
				}
			}
		})
	}
}

// TestNothingMeasuredIsNotAccepted: a node whose agent sees no GPU and
// whose every GPU and IB check skips has shown nothing: inconclusive,
// rejected with the reason, and no part is implicated by it.
func TestNothingMeasuredIsNotAccepted(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 2)
	h.fleet.node("gpu-002").blank = true
	id := h.start("selector: batch=new\nlevel: quick\n")
	h.finish(h.eng)
	r := h.report(id)
	if n := nodeOf(t, r, "gpu-001"); n.Verdict != Accepted {
		t.Fatalf("healthy gpu-001: %s %s", n.Verdict, n.Reason)
	}
	n := nodeOf(t, r, "gpu-002")
	var all []string
	for _, rs := range n.Evidence.Reasons {
		all = append(all, rs.Message)
	}
	if n.Verdict != Rejected || !hasReason(n, ReasonInconclusive) ||
		!strings.Contains(n.Reason, "gpu.inventory skipped where data was expected") ||
		!strings.Contains(strings.Join(all, "\n"), "the report shows no GPU") {
		t.Fatalf("blank gpu-002: %s %q", n.Verdict, all)
	}
	for _, p := range n.Evidence.Parts {
		if p.Implicated {
			t.Errorf("part %s %s implicated by missing data", p.Kind, p.Component)
		}
	}
	var buf bytes.Buffer
	if err := h.eng.WriteHTML(&buf, r); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), `class="bad">yes`) {
		t.Fatal("HTML report marks a part implicated for an inconclusive node")
	}
	st, err := h.eng.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, np := range st.NodeStates {
		if np.Node == "gpu-002" && !strings.Contains(np.Reason, "inconclusive: step passive, repeat 1: gpu.inventory skipped") {
			t.Fatalf("status reason %q", np.Reason)
		}
	}
}

// TestInconclusiveStepImplicatesNoPart: a dcgm step that never came back
// (unreachable mid-campaign) rejects the node but names no part; a
// failing check on GPU1 implicates GPU1 only.
func TestInconclusiveStepImplicatesNoPart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4)
	h.setSKUBaselines()
	h.fleet.block = func(_ context.Context, node, what string) error {
		if node == "gpu-002" && what == "dcgm.diag:2" {
			h.fleet.mu.Lock()
			h.fleet.nodes[node].unreachable = true
			h.fleet.mu.Unlock()
		}
		return nil
	}
	id := h.start(standardSpec + "connect_grace: 5s\n")
	h.finish(h.eng)
	r := h.report(id)
	n := nodeOf(t, r, "gpu-002")
	if n.Verdict != Rejected || !hasReason(n, ReasonInconclusive) {
		t.Fatalf("gpu-002: %s %q", n.Verdict, n.Reason)
	}
	for _, p := range n.Evidence.Parts {
		if p.Implicated {
			t.Errorf("gpu-002 part %s implicated by an inconclusive step", p.Component)
		}
	}
}

// TestAgentAwayAtItsTurnIsWaitedFor: after a coordinator restart agents
// reconnect with backoff. A node whose agent is back within the grace is
// tested and accepted; one that stays away is shown waiting, then
// rejected as inconclusive with the reason, never accepted.
func TestAgentAwayAtItsTurnIsWaitedFor(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3)
	h.setSKUBaselines()
	id := h.start("selector: batch=new\nlevel: quick\nconnect_grace: 2m\n")
	h.fleet.node("gpu-002").awayUntil = h.fleet.clock.Now().Add(90 * time.Second)
	h.fleet.node("gpu-003").unreachable = true
	ctx := context.Background()
	if _, err := h.eng.Step(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := h.eng.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"gpu-002", "gpu-003"} {
		if w := st.Waiting[name]; !strings.Contains(w, "waiting for the agent to reconnect") || !strings.Contains(w, "waits up to 2m0s") {
			t.Errorf("%s waiting %q", name, w)
		}
	}
	h.finish(h.eng)
	r := h.report(id)
	if n := nodeOf(t, r, "gpu-002"); n.Verdict != Accepted {
		t.Errorf("gpu-002 back after 90s: %s %q", n.Verdict, n.Reason)
	}
	n := nodeOf(t, r, "gpu-003")
	if n.Verdict != Rejected || !strings.Contains(n.Reason, "inconclusive: not tested: agent not connected: waited 2m0s after its turn came") {
		t.Errorf("gpu-003 away: %s %q", n.Verdict, n.Reason)
	}
	if h.fleet.count("gpu-003", "passive") != 0 {
		t.Error("gpu-003 was sent work while away")
	}
}

// TestStatusShowsEachNodesStep: while a node runs a step, status names it.
func TestStatusShowsEachNodesStep(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1)
	h.setSKUBaselines()
	var id string
	var seen []string
	h.fleet.block = func(ctx context.Context, node, what string) error {
		st, err := h.eng.Status(ctx, id)
		if err != nil {
			return err
		}
		for _, np := range st.NodeStates {
			seen = append(seen, np.Node+" "+string(np.State)+" "+np.Step)
		}
		return nil
	}
	id = h.start(standardSpec)
	h.finish(h.eng)
	want := []string{"gpu-001 testing passive, repeat 1", "gpu-001 testing dcgm-r2, repeat 1"}
	for i, w := range want {
		if i >= len(seen) || seen[i] != w {
			t.Fatalf("status during runs %q, want it to start %q", seen, want)
		}
	}
}

// TestConnectGraceBounds: connect_grace is a duration within 5s..24h;
// anything else is refused with the key named.
func TestConnectGraceBounds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v  string
		ok bool
	}{{"2m", true}, {"5s", true}, {"24h", true}, {"1s", false}, {"25h", false}, {"-1m", false}, {"abc", false}, {"1e400h", false}, {"9223372036854775807", false}} {
		spec, err := ParseSpec([]byte("selector: a=b\nlevel: quick\nconnect_grace: " + tc.v + "\n"))
		if (err == nil) != tc.ok {
			t.Errorf("connect_grace %s: %v", tc.v, err)
		}
		if err != nil && !strings.Contains(err.Error(), "connect_grace") && !strings.Contains(err.Error(), "line 3") {
			t.Errorf("connect_grace %s: error names neither key nor line: %v", tc.v, err)
		}
		if err == nil && spec.connectGrace() <= 0 {
			t.Errorf("connect_grace %s: %v", tc.v, spec.connectGrace())
		}
	}
}
