package coordinator

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

func TestCheckProtocol(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ours, agent string
		ok          bool
		want        string
	}{
		{"1.0", "1.0", true, ""},
		{"1.0", "1.1", true, ""},
		{"1.1", "1.0", true, ""},
		{"1.1", "1.2", true, ""},
		{"1.1", "1.3", false, "agent protocol 1.3 too new; coordinator speaks 1.x (1.1), accepts 1.0–1.2"},
		{"1.2", "1.0", false, "agent protocol 1.0 too old; coordinator speaks 1.x (1.2), accepts 1.1–1.3"},
		{"1.0", "0.9", false, "agent protocol 0.9 too old; coordinator speaks 1.x (1.0), accepts 1.0–1.1"},
		{"1.0", "2.0", false, "too new"},
		{"1.0", "", false, "is not MAJOR.MINOR"},
		{"1.0", "1", false, "is not MAJOR.MINOR"},
		{"1.0", "1.x", false, "is not MAJOR.MINOR"},
	}
	for _, tt := range tests {
		err := checkProtocol(tt.ours, tt.agent)
		if (err == nil) != tt.ok {
			t.Errorf("checkProtocol(%q, %q) = %v, want ok=%v", tt.ours, tt.agent, err, tt.ok)
			continue
		}
		if err != nil && (!errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("checkProtocol(%q, %q) = %q, want it to say %q", tt.ours, tt.agent, err, tt.want)
		}
	}
}

func TestHello(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	tests := []struct {
		name, version string
		code          codes.Code
		says          string
	}{
		{"same version", ProtocolVersion, codes.OK, ""},
		{"one minor apart", "1.0", codes.OK, ""},
		{"too old", "0.9", codes.FailedPrecondition, "agent protocol 0.9 too old; coordinator speaks 1.x (1.1), accepts 1.0–1.2"},
		{"two minors apart", "1.3", codes.FailedPrecondition, "too new"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node := "hello-" + string(rune('a'+i))
			a, err := connect(t, s, node, withVersion(tt.version))
			if tt.code == codes.OK {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if a.welcome.GetProtocolVersion() != ProtocolVersion || a.welcome.GetHeartbeatIntervalMs() != 1000 {
					t.Fatalf("welcome = %v", a.welcome)
				}
				if n := nodeOf(t, s, node); n.State != StateInitializing || !n.Connected || len(n.Inventory.GPUs) != 2 {
					t.Fatalf("node after hello = %+v", n)
				}
				return
			}
			st := status.Convert(err)
			if st.Code() != tt.code || !strings.Contains(st.Message(), tt.says) {
				t.Fatalf("got %v %q, want %v saying %q", st.Code(), st.Message(), tt.code, tt.says)
			}
		})
	}
	t.Run("first message not hello", func(t *testing.T) {
		cc := dial(t, s)
		stream, err := pb.NewAgentServiceClient(cc).Connect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		stream.Send(&pb.AgentMessage{Msg: &pb.AgentMessage_Heartbeat{Heartbeat: &pb.Heartbeat{}}})
		_, err = stream.Recv()
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("got %v, want InvalidArgument", err)
		}
	})
}

func TestResultAckedAndStoredOnce(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	a := mustConnect(t, s, "gpu-001")
	r := result("gpu-001", false)
	a.sendResult(r)
	first := a.ack(5 * time.Second)
	if first.GetResultId() != r.Id || first.GetDuplicate() || first.GetStoredUnixMs() == 0 || first.GetRefused() != "" {
		t.Fatalf("first ack = %v", first)
	}
	// The ack means durable: the row is there when it arrives.
	if _, err := s.Store().Result(context.Background(), r.Id); err != nil {
		t.Fatalf("acked result not stored: %v", err)
	}
	a.sendResult(r)
	again := a.ack(5 * time.Second)
	if !again.GetDuplicate() || again.GetStoredUnixMs() != first.GetStoredUnixMs() {
		t.Fatalf("second ack = %v, want duplicate with the original stored time %d", again, first.GetStoredUnixMs())
	}
	c, _ := s.Store().Count(context.Background())
	if c.Results != 1 || c.CheckResults != 2 {
		t.Fatalf("stored %+v, want 1 result and 2 check rows", c)
	}
	testwait.Until(t, 5*time.Second, "healthy", stateIs(t, s, "gpu-001", StateHealthy))
	if st := s.Stats(); st.ResultsAcked != 1 || st.ResultsDuplicate != 1 || st.ConnectedAgents != 1 {
		t.Fatalf("stats = %+v", st)
	}
	// A reconnecting agent learns which results the coordinator holds.
	a.close()
	b := mustConnect(t, s, "gpu-001")
	if ids := b.welcome.GetKnownResultIds(); len(ids) != 1 || ids[0] != r.Id {
		t.Fatalf("known ids = %v", ids)
	}
}

func TestResultForAnotherNodeRefused(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	a := mustConnect(t, s, "gpu-001")
	mustConnect(t, s, "gpu-002")
	r := result("gpu-002", true)
	a.sendResult(r)
	ack := a.ack(5 * time.Second)
	if ack.GetRefused() == "" || ack.GetStoredUnixMs() != 0 || !strings.Contains(ack.GetRefused(), `claims node "gpu-002"`) {
		t.Fatalf("ack = %v, want a refusal", ack)
	}
	if _, err := s.Store().Result(context.Background(), r.Id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("refused result stored: %v", err)
	}
	if ev := eventsOf(t, s, "gpu-001"); !hasEvent(ev, "refused: result "+r.Id+` claims node "gpu-002"`) {
		t.Fatalf("events = %v", ev)
	}
	if n := nodeOf(t, s, "gpu-002"); n.State != StateInitializing {
		t.Fatalf("gpu-002 moved to %s on a result it did not send", n.State)
	}
	// A malformed result is refused too, and the stream goes on.
	bad := result("gpu-001", false)
	bad.Status = "green"
	a.sendResult(bad)
	if ack := a.ack(5 * time.Second); !strings.Contains(ack.GetRefused(), "invalid result") {
		t.Fatalf("ack = %v", ack)
	}
	a.sendResult(result("gpu-001", false))
	if ack := a.ack(5 * time.Second); ack.GetRefused() != "" {
		t.Fatalf("stream unusable after a refusal: %v", ack)
	}
}

// An agent of protocol 1.2 sends metrics as columns: they are stored as
// entries' are; columns that do not line up are refused, not half stored.
func TestResultMetricsAsColumns(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	a := mustConnect(t, s, "gpu-001")
	r := result("gpu-001", false)
	r.Checks[0] = wire.CheckToProtoColumns(report.CheckResult{Name: "gpu.ecc", Status: report.Pass,
		Metrics: map[string]float64{"gpu3.ecc.dram_uncorrectable": 0, "gpu3.ecc.sram_correctable": 7}})
	a.sendResult(r)
	if ack := a.ack(5 * time.Second); ack.GetRefused() != "" || ack.GetStoredUnixMs() == 0 {
		t.Fatalf("ack = %v", ack)
	}
	got, err := s.Store().LoadResult(context.Background(), r.Id)
	if err != nil {
		t.Fatal(err)
	}
	if m := got.Checks[0].Metrics; len(m) != 2 || m["gpu3.ecc.sram_correctable"] != 7 {
		t.Fatalf("stored metrics %v", m)
	}

	bad := result("gpu-001", false)
	bad.Checks[0].Metrics = nil
	bad.Checks[0].MetricNames, bad.Checks[0].MetricValues = "gpu3.ecc.dram_uncorrectable\n", []float64{0, 1}
	a.sendResult(bad)
	if ack := a.ack(5 * time.Second); !strings.Contains(ack.GetRefused(), `invalid result: check "gpu.ecc" sends 1 metric names and 2 values`) {
		t.Fatalf("ack = %v", ack)
	}
	if _, err := s.Store().Result(context.Background(), bad.Id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("refused result stored: %v", err)
	}
}

func TestStatesFromResults(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	a := mustConnect(t, s, "gpu-001")
	// A partial pass is not evidence of health.
	partial := result("gpu-001", false)
	partial.Full = false
	a.sendResult(partial)
	a.ack(5 * time.Second)
	if n := nodeOf(t, s, "gpu-001"); n.State != StateInitializing {
		t.Fatalf("after a partial pass: %s", n.State)
	}
	a.sendResult(result("gpu-001", true))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "failed", stateIs(t, s, "gpu-001", StateFailed))
	n := nodeOf(t, s, "gpu-001")
	if n.StateReason != "gpu.ecc fail: GPU3 ECC_UNCORRECTABLE" {
		t.Fatalf("reason = %q", n.StateReason)
	}
	warn := result("gpu-001", false)
	warn.Checks[1].Status = "warn"
	warn.Checks[1].Findings = []*pb.Finding{{Severity: "warn", Component: "mlx5_4/1", Code: "RATE_LOW"}}
	warn.Status = "warn"
	a.sendResult(warn)
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "degraded", stateIs(t, s, "gpu-001", StateDegraded))
	ev := eventsOf(t, s, "gpu-001")
	for _, want := range []string{
		"connection: node joined",
		"state_change: initializing -> failed: gpu.ecc fail: GPU3 ECC_UNCORRECTABLE",
		"state_change: failed -> degraded: ib.ports warn: mlx5_4/1 RATE_LOW",
	} {
		if !hasEvent(ev, want) {
			t.Errorf("no event %q in %v", want, ev)
		}
	}
	resp, err := operator(t, s).ListNodes(context.Background(), &pb.ListNodesRequest{Selector: "sku=h100"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Nodes) != 1 || resp.Nodes[0].State != StateDegraded || resp.Nodes[0].Gpus != 2 ||
		strings.Join(resp.Nodes[0].FailingChecks, ",") != "ib.ports" || !resp.Nodes[0].Connected {
		t.Fatalf("ListNodes = %v", resp.Nodes)
	}
}

func TestStreamDropAndReconnect(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	a := mustConnect(t, s, "gpu-001")
	a.sendResult(result("gpu-001", true))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "failed", stateIs(t, s, "gpu-001", StateFailed))

	a.close() // the agent dies
	testwait.Until(t, 5*time.Second, "unreachable", stateIs(t, s, "gpu-001", StateUnreachable))
	n := nodeOf(t, s, "gpu-001")
	if n.Connected || !strings.HasPrefix(n.StateReason, "stream lost") {
		t.Fatalf("after the drop: connected=%v reason=%q", n.Connected, n.StateReason)
	}
	if ev := eventsOf(t, s, "gpu-001"); !hasEvent(ev, "failed -> unreachable: stream lost") {
		t.Fatalf("events = %v", ev)
	}

	mustConnect(t, s, "gpu-001")
	testwait.Until(t, 5*time.Second, "failed again", stateIs(t, s, "gpu-001", StateFailed))
	if ev := eventsOf(t, s, "gpu-001"); !hasEvent(ev, "unreachable -> failed: agent reconnected; gpu.ecc fail: GPU3 ECC_UNCORRECTABLE") {
		t.Fatalf("events = %v", ev)
	}
}

func TestSecondStreamReplacesFirst(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	a := mustConnect(t, s, "gpu-001")
	b := mustConnect(t, s, "gpu-001")
	if st := a.waitEnd(5 * time.Second); st.Code() != codes.Aborted {
		t.Fatalf("first stream ended with %v, want Aborted", st)
	}
	b.sendResult(result("gpu-001", false))
	b.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "healthy", stateIs(t, s, "gpu-001", StateHealthy))
	if n := nodeOf(t, s, "gpu-001"); !n.Connected {
		t.Fatal("the replaced stream's end disconnected the node")
	}
	if ev := eventsOf(t, s, "gpu-001"); hasEvent(ev, "unreachable") || !hasEvent(ev, "stream replaced") {
		t.Fatalf("events = %v", ev)
	}
}

func TestHeartbeatTimeout(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), func(c *Config) { c.HeartbeatInterval = 50 * time.Millisecond })
	live := mustConnect(t, s, "talker")
	stop := make(chan struct{})
	defer close(stop)
	go func() { // this one heartbeats like a healthy agent
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				live.heartbeat()
			}
		}
	}()
	silent := mustConnect(t, s, "silent")
	// The coordinator heartbeats too.
	select {
	case m := <-silent.in:
		if m.GetHeartbeat() == nil {
			t.Fatalf("got %v, want a heartbeat", m)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no heartbeat from the coordinator")
	}
	st := silent.waitEnd(5 * time.Second)
	if st.Code() != codes.DeadlineExceeded || !strings.Contains(st.Message(), "3 heartbeat intervals") {
		t.Fatalf("silent stream ended with %v", st)
	}
	testwait.Until(t, 5*time.Second, "unreachable", stateIs(t, s, "silent", StateUnreachable))
	if n := nodeOf(t, s, "silent"); !strings.Contains(n.StateReason, "3 heartbeat intervals") {
		t.Fatalf("reason = %q", n.StateReason)
	}
	if n := nodeOf(t, s, "talker"); n.State != StateInitializing || !n.Connected {
		t.Fatalf("the heartbeating agent was dropped: %+v", n)
	}
}

func TestRunCheck(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	runResult := func(node string, fail bool) func(a *fakeAgent, rc *pb.RunChecks) {
		return func(a *fakeAgent, rc *pb.RunChecks) {
			a.workStatus(rc.WorkId, pb.WorkStatus_STATE_ACCEPTED, "", "")
			r := result(node, fail)
			r.WorkId, r.Full = rc.WorkId, false
			a.sendResult(r)
			a.workStatus(rc.WorkId, pb.WorkStatus_STATE_DONE, "", r.Id)
		}
	}
	mustConnect(t, s, "n1", onRun(runResult("n1", false)))
	mustConnect(t, s, "n2", onRun(runResult("n2", true)))
	mustConnect(t, s, "n3", onRun(func(a *fakeAgent, rc *pb.RunChecks) {
		a.workStatus(rc.WorkId, pb.WorkStatus_STATE_REFUSED, "nccl.allreduce is disruptive; node is busy", "")
	}))
	mustConnect(t, s, "n4", onRun(func(a *fakeAgent, rc *pb.RunChecks) {
		if rc.TimeoutMs <= 0 || rc.TimeoutMs >= 1500 {
			t.Errorf("agent timeout %dms, want below the operator's 1.5s", rc.TimeoutMs)
		}
		a.workStatus(rc.WorkId, pb.WorkStatus_STATE_ACCEPTED, "", "") // and then nothing
	}))
	gone := mustConnect(t, s, "n5")
	gone.close()
	testwait.Until(t, 5*time.Second, "n5 unreachable", stateIs(t, s, "n5", StateUnreachable))
	mustConnect(t, s, "other", withLabels(map[string]string{"sku": "a100"}))

	stream, err := operator(t, s).RunCheck(context.Background(), &pb.RunCheckRequest{
		Selector: "sku=h100", Checks: []string{"gpu.ecc", "ib.ports"}, TimeoutMs: 1500,
	})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*pb.RunCheckProgress
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, p)
	}
	if len(msgs) < 2 {
		t.Fatalf("%d progress messages, want progress then final", len(msgs))
	}
	first, final := msgs[0], msgs[len(msgs)-1]
	if first.Total != 5 || first.Final || first.WorkId == "" {
		t.Fatalf("first progress = %v", first)
	}
	if !final.Final || final.Total != 5 || final.Done != 5 || final.Refused != 1 || final.Failed != 1 ||
		final.Unreachable != 1 || final.TimedOut != 1 {
		t.Fatalf("final = %v", final)
	}
	for i := 1; i < len(msgs); i++ {
		if msgs[i].Done < msgs[i-1].Done {
			t.Fatalf("progress went back: %v then %v", msgs[i-1], msgs[i])
		}
	}
	got := map[string]string{}
	for _, o := range final.Outcomes {
		got[o.Node] = o.Status + " " + o.Reason
	}
	want := map[string]string{
		"n1": "pass ",
		"n2": "fail gpu.ecc fail: GPU3 ECC_UNCORRECTABLE",
		"n3": "refused nccl.allreduce is disruptive; node is busy",
		"n4": "timeout accepted, no result within 1.5s",
		"n5": "unreachable not connected",
	}
	for node, w := range want {
		if got[node] != w {
			t.Errorf("%s: outcome %q, want %q", node, got[node], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("outcomes %v", got)
	}
	// Work results are stored with their work id.
	rows, err := operator(t, s).ListResults(context.Background(), &pb.ListResultsRequest{Node: "n2", Check: "gpu.ecc"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows.Results) != 1 || rows.Results[0].WorkId != final.WorkId || rows.Results[0].Check.Status != "fail" {
		t.Fatalf("results = %v", rows.Results)
	}
	evs, err := operator(t, s).ListEvents(context.Background(), &pb.ListEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs.Events {
		if e.Kind == store.EventOperatorAction && strings.Contains(e.Message, final.WorkId) {
			found = true
		}
	}
	if !found {
		t.Fatalf("no operator_action event for %s in %v", final.WorkId, evs.Events)
	}
}

func TestRunCheckInvalid(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	op := operator(t, s)
	for _, req := range []*pb.RunCheckRequest{
		{Selector: "sku in (", Checks: []string{"gpu.ecc"}},
		{Selector: "", Checks: nil},
		{Selector: "", Checks: []string{"rm -rf /"}},
		{Selector: "", Checks: []string{"gpu.ecc"}, TimeoutMs: 2 * time.Hour.Milliseconds()},
	} {
		stream, err := op.RunCheck(context.Background(), req)
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: got %v, want InvalidArgument", req, err)
		}
	}
	if _, err := op.ListResults(context.Background(), &pb.ListResultsRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ListResults without a node: %v", err)
	}
}

func TestRestartKeepsAcknowledged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mod := func(c *Config) { c.HeartbeatInterval = 100 * time.Millisecond }
	s1 := testServer(t, dir, mod)
	a := mustConnect(t, s1, "gpu-001")
	var ids []string
	for i := 0; i < 20; i++ {
		r := result("gpu-001", i == 19)
		ids = append(ids, r.Id)
		a.sendResult(r)
	}
	for range ids {
		if ack := a.ack(5 * time.Second); ack.GetRefused() != "" {
			t.Fatal(ack)
		}
	}
	testwait.Until(t, 5*time.Second, "failed", stateIs(t, s1, "gpu-001", StateFailed))
	stopServer(t, s1)
	if st := a.waitEnd(5 * time.Second); st.Code() != codes.Unavailable {
		t.Fatalf("agent stream at shutdown: %v", st)
	}

	s2 := testServer(t, dir, mod)
	for _, id := range ids {
		if _, err := s2.Store().Result(context.Background(), id); err != nil {
			t.Fatalf("acknowledged %s lost over the restart: %v", id, err)
		}
	}
	n := nodeOf(t, s2, "gpu-001")
	if n.State != StateFailed || n.Connected {
		t.Fatalf("after restart: state %s connected %v; want failed, disconnected until the agent is back", n.State, n.Connected)
	}
	// The agent does not come back: after the grace it is unreachable.
	testwait.Until(t, 5*time.Second, "unreachable after grace", stateIs(t, s2, "gpu-001", StateUnreachable))
	b := mustConnect(t, s2, "gpu-001")
	testwait.Until(t, 5*time.Second, "failed after return", stateIs(t, s2, "gpu-001", StateFailed))
	b.sendResult(&pb.Result{Id: ids[0], Node: "gpu-001", Status: "pass", Full: true, FinishedUnixMs: time.Now().UnixMilli()})
	if ack := b.ack(5 * time.Second); !ack.GetDuplicate() {
		t.Fatalf("resent result after restart: %v, want duplicate", ack)
	}
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	s, err := New(Config{Listen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", DataDir: t.TempDir(), Insecure: true},
		Options{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "not serving") {
		t.Fatalf("before start: %d %q", rec.Code, rec.Body)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + s.HTTPAddr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "ok" {
		t.Fatalf("after start: %d %q", resp.StatusCode, body)
	}
	stopServer(t, s)
	rec = httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("after stop: %d", rec.Code)
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	c, err := ParseConfig([]byte("data_dir: /tmp/x\nheartbeat_interval: 5s\nretention_days: 7\ninsecure: true\nbatch:\n  delay: 1ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.HeartbeatInterval != 5*time.Second || c.RetentionDays != 7 || c.Listen != DefaultListen || c.Batch.Delay != time.Millisecond || !c.Insecure {
		t.Fatalf("config = %+v", c)
	}
	if _, err := ParseConfig([]byte("data_dir: /tmp/x\nlisten_addr: :1\n")); err == nil || !strings.Contains(err.Error(), "listen_addr") {
		t.Fatalf("unknown key: %v", err)
	}
	if _, err := ParseConfig([]byte("heartbeat_interval: 1ms\n")); err == nil ||
		!strings.Contains(err.Error(), "data_dir is required") || !strings.Contains(err.Error(), "heartbeat_interval") {
		t.Fatalf("invalid config: %v", err)
	}
	if _, err := New(Config{DataDir: "/tmp/x"}, Options{}); !errors.Is(err, ErrNoTransportSecurity) {
		t.Fatalf("New without insecure or credentials: %v", err)
	}
}

func TestIdentitySeam(t *testing.T) {
	t.Parallel()
	// Stand in for mTLS: every caller is the node gpu-001.
	s, err := New(Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), Insecure: true},
		Options{Logger: zerolog.Nop(), Identify: func(context.Context) Identity {
			return Identity{Kind: NodeIdentity, Name: "gpu-001"}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer stopServer(t, s)
	if _, err := connect(t, s, "gpu-002"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("speaking for another node: %v, want PermissionDenied", err)
	}
	mustConnect(t, s, "gpu-001")
	if _, err := operator(t, s).ListNodes(context.Background(), &pb.ListNodesRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("node identity on an operator RPC: %v, want PermissionDenied", err)
	}
}
