package demo

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDemoCatchesEveryInjectedFault runs the whole scenario: a real
// coordinator, real agents over loopback gRPC, simulated nodes. Every
// injected fault must be caught by the check meant to catch it, and every
// other node must end healthy.
func TestDemoCatchesEveryInjectedFault(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// The log as the CLI writes it, at info level: a clean run logs no
	// error, and a log that is not a terminal gets no colour codes.
	var logs, progress syncBuffer
	type outcome struct {
		res *Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := Run(ctx, Options{Nodes: 8, Seed: 7, Logger: Logger(&logs, true), DataDir: t.TempDir(),
			Progress: &progress, Serve: true})
		done <- outcome{res, err}
	}()
	// --serve: the scenario ran, and the coordinator serves /metrics at
	// the address it printed.
	serving := regexp.MustCompile(`serving until interrupted: gRPC (\S+) .* metrics (http://\S+/metrics), gossip (\S+)`)
	var m []string
	for m == nil {
		select {
		case o := <-done:
			t.Fatalf("demo ended before serving: %v\n%s", o.err, progress.String())
		case <-ctx.Done():
			t.Fatalf("demo never served:\n%s", progress.String())
		case <-time.After(50 * time.Millisecond):
			m = serving.FindStringSubmatch(progress.String())
		}
	}
	for _, a := range []string{m[1], strings.TrimSuffix(strings.TrimPrefix(m[2], "http://"), "/metrics"), m[3]} {
		if !strings.HasPrefix(a, "127.0.0.1:") {
			t.Errorf("demo listens on %q, want 127.0.0.1 only", a)
		}
	}
	resp, err := http.Get(m[2])
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `fleetcheck_nodes{state="healthy"}`) {
		t.Errorf("GET %s: %d %v\n%.500s", m[2], resp.StatusCode, err, body)
	}
	// The console line, and the demo fleet explorable there.
	cm := regexp.MustCompile(`(?m)^console: (http://127\.0\.0\.1:[0-9]+/)$`).FindStringSubmatch(progress.String())
	if cm == nil {
		t.Errorf("no console line in:\n%s", progress.String())
	} else if resp, err := http.Get(cm[1] + "fleet"); err != nil {
		t.Error(err)
	} else {
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), "8 of 8 nodes") {
			t.Errorf("GET %sfleet: %d\n%.500s", cm[1], resp.StatusCode, page)
		}
	}
	cancel()
	o := <-done
	res, err := o.res, o.err
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Scenario.Faults) != len(faultPlan) {
		t.Fatalf("%d faults injected, want %d", len(res.Scenario.Faults), len(faultPlan))
	}
	if res.Caught != len(res.Scenario.Faults) {
		t.Errorf("caught %d of %d faults: %+v", res.Caught, len(res.Scenario.Faults), res.Nodes)
	}
	faulted := map[string]bool{}
	for _, f := range res.Scenario.Faults {
		faulted[f.Node] = true
	}
	if len(res.Nodes) != 8 {
		t.Fatalf("%d nodes in result", len(res.Nodes))
	}
	for _, n := range res.Nodes {
		switch {
		case faulted[n.Name] && n.State != "failed" && n.State != "degraded":
			t.Errorf("%s was faulted but is %s", n.Name, n.State)
		case !faulted[n.Name] && (n.State != "healthy" || len(n.FailingChecks) > 0):
			t.Errorf("%s is %s with %v, want healthy", n.Name, n.State, n.FailingChecks)
		}
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "injected faults caught") || !strings.Contains(buf.String(), "gossip partition of") {
		t.Errorf("table:\n%s", buf.String())
	}
	// The partition step: gossip alone saw it, and it was only a hint.
	g := res.Gossip
	if g == nil {
		t.Fatal("no gossip partition step with 8 nodes")
	}
	if faulted[g.Node] || !g.StreamUp || !strings.HasPrefix(g.Reason, "gossip:") {
		t.Errorf("gossip step = %+v, want a healthy node cut with its stream up and a gossip reason", g)
	}

	out := logs.String()
	if !strings.Contains(out, "INF") {
		t.Fatalf("no info lines logged: the log is not captured:\n%.2000s", out)
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("colour codes in a log that is not a terminal:\n%q", out[:min(len(out), 500)])
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 1 && (f[1] == "ERR" || f[1] == "FTL" || f[1] == "PNC") {
			t.Errorf("a clean run logged an error: %s", line)
		}
	}
}

// syncBuffer collects what several goroutines write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
