package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

const testTD = "fleet.test"

// testCA issues certificates into a test's temporary directories.
type testCA struct {
	t  testing.TB
	ca *pki.CA
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	ca, err := pki.NewCA(testTD, pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{t: t, ca: ca}
}

// files issues req and writes it with the CA certificate into a new
// directory.
func (c *testCA) files(req pki.Request) pki.Files {
	c.t.Helper()
	leaf, err := c.ca.Issue(req)
	if err != nil {
		c.t.Fatal(err)
	}
	dir := c.t.TempDir()
	certFile, keyFile, err := pki.WriteLeaf(dir, leaf, false)
	if err != nil {
		c.t.Fatal(err)
	}
	caFile, err := pki.WriteCACert(dir, c.ca.Cert, false)
	if err != nil {
		c.t.Fatal(err)
	}
	return pki.Files{CertFile: certFile, KeyFile: keyFile, CAFile: caFile}
}

// creds are client credentials for a certificate of kind and name.
func (c *testCA) creds(kind pki.Kind, name string) credentials.TransportCredentials {
	c.t.Helper()
	return clientCreds(c.t, c.files(pki.Request{Kind: kind, Name: name}))
}

func clientCreds(t testing.TB, f pki.Files) credentials.TransportCredentials {
	t.Helper()
	r, err := pki.NewReloader(f, pki.ReloaderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cr, err := pki.ClientCredentials(pki.ClientOptions{Reloader: r, TrustDomain: testTD})
	if err != nil {
		t.Fatal(err)
	}
	return cr
}

// syncBuf collects log lines written from many goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// text is everything logged so far.
func (l *syncBuf) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// has reports whether a logged line has message msg and the fields want.
func (l *syncBuf) has(msg string, want map[string]string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range strings.Split(l.b.String(), "\n") {
		m := map[string]any{}
		if json.Unmarshal([]byte(line), &m) != nil || m["message"] != msg {
			continue
		}
		ok := true
		for k, v := range want {
			if s, _ := m[k].(string); s != v {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// secureServer starts a coordinator serving mutual TLS with certificates
// from ca, wired the way `fleetcheck coordinator` wires it.
func secureServer(t testing.TB, ca *testCA, dir string, log zerolog.Logger) *Server {
	t.Helper()
	f := ca.files(pki.Request{Kind: pki.KindCoordinator, Name: "coord", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	cfg := Config{
		Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: dir, HeartbeatInterval: time.Second,
		TLS: TLSConfig{CertFile: f.CertFile, KeyFile: f.KeyFile, CAFile: f.CAFile, TrustDomain: testTD},
	}
	opts, r, err := Secure(cfg, Options{Logger: log, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if r == nil {
		t.Fatal("Secure gave no certificate reloader for a TLS config")
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(t, s) })
	return s
}

func operatorWith(t testing.TB, s *Server, creds credentials.TransportCredentials) pb.OperatorServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return pb.NewOperatorServiceClient(cc)
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	var logs syncBuf
	s := secureServer(t, ca, t.TempDir(), zerolog.New(&logs))
	ctx := context.Background()

	t.Run("node reports for itself", func(t *testing.T) {
		a, err := connectCreds(t, s, ca.creds(pki.KindNode, "gpu-001"), "gpu-001")
		if err != nil {
			t.Fatal(err)
		}
		r := result("gpu-001", false)
		a.sendResult(r)
		if ack := a.ack(5 * time.Second); ack.GetRefused() != "" || ack.GetResultId() != r.Id {
			t.Fatalf("ack = %v", ack)
		}
		// A result naming another node on its own stream is refused.
		other := result("gpu-002", false)
		a.sendResult(other)
		ack := a.ack(5 * time.Second)
		if !strings.Contains(ack.GetRefused(), `node:gpu-001 may not speak for node "gpu-002"`) {
			t.Fatalf("result for another node: ack %v", ack)
		}
		if _, err := s.Store().Result(ctx, other.Id); err == nil {
			t.Fatal("refused result stored")
		}
	})

	t.Run("certificate for another node", func(t *testing.T) {
		// The certificate says gpu-003, the agent's config gpu-004.
		_, err := connectCreds(t, s, ca.creds(pki.KindNode, "gpu-003"), "gpu-004")
		if st := status.Convert(err); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), `node:gpu-003 may not speak for node "gpu-004"`) {
			t.Fatalf("got %v, want PermissionDenied", err)
		}
		if !logs.has("refused: identity speaks for another node", map[string]string{"identity": "spiffe://fleet.test/node/gpu-003", "node": "gpu-004"}) {
			t.Errorf("refusal not logged:\n%s", logs.b.String())
		}
		if evs := eventsOf(t, s, "gpu-003"); !hasEvent(evs, "refused: connection refused: node:gpu-003 may not speak for node \"gpu-004\"") {
			t.Errorf("no refusal event under gpu-003: %v", evs)
		}
		if _, err := s.Store().Node(ctx, "gpu-004"); err == nil {
			t.Error("the impersonated node was recorded")
		}
		// An agent retrying does not fill the event log.
		for i := 0; i < 3; i++ {
			if _, err := connectCreds(t, s, ca.creds(pki.KindNode, "gpu-003"), "gpu-004"); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("retry %d: %v", i, err)
			}
		}
		if evs, _ := s.Store().Events(ctx, store.EventQuery{Node: "gpu-003", Kind: store.EventRefused}); len(evs) != 1 {
			t.Errorf("%d refusal events for one misconfigured agent, want 1", len(evs))
		}
	})

	t.Run("agent certificate on the operator API", func(t *testing.T) {
		_, err := operatorWith(t, s, ca.creds(pki.KindNode, "gpu-001")).ListNodes(ctx, &pb.ListNodesRequest{})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("got %v, want PermissionDenied", err)
		}
	})

	t.Run("operator certificate", func(t *testing.T) {
		admin := ca.creds(pki.KindAdmin, "alice")
		resp, err := operatorWith(t, s, admin).ListNodes(ctx, &pb.ListNodesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Nodes) != 1 || resp.Nodes[0].Name != "gpu-001" {
			t.Fatalf("nodes = %v", resp.Nodes)
		}
		// An operator is no agent.
		if _, err := connectCreds(t, s, admin, "gpu-001"); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("operator certificate on the agent API: %v, want PermissionDenied", err)
		}
	})

	t.Run("expired and untrusted certificates", func(t *testing.T) {
		expired := clientCreds(t, ca.files(pki.Request{Kind: pki.KindAdmin, Name: "old",
			NotBefore: time.Now().Add(-48 * time.Hour), Validity: time.Hour}))
		stranger := newTestCA(t) // same trust domain, another CA
		for name, cr := range map[string]credentials.TransportCredentials{
			"expired":   expired,
			"untrusted": stranger.creds(pki.KindAdmin, "mallory"),
		} {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := operatorWith(t, s, cr).ListNodes(cctx, &pb.ListNodesRequest{})
			cancel()
			if err == nil || status.Code(err) == codes.PermissionDenied {
				t.Errorf("%s certificate: %v, want the handshake refused", name, err)
			}
		}
		if _, err := connectCreds(t, s, stranger.creds(pki.KindNode, "gpu-009"), "gpu-009"); err == nil {
			t.Error("node certificate from an untrusted CA connected")
		}
	})

	t.Run("plaintext client", func(t *testing.T) {
		_, err := connect(t, s, "gpu-001")
		if err == nil {
			t.Fatal("plaintext agent connected to a TLS coordinator")
		}
	})
}

func TestResultForWorkNeverSent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := testServer(t, dir, nil)
	var workID string
	var wmu sync.Mutex
	n1 := mustConnect(t, s, "n1", onRun(func(a *fakeAgent, rc *pb.RunChecks) {
		wmu.Lock()
		workID = rc.WorkId
		wmu.Unlock()
		a.workStatus(rc.WorkId, pb.WorkStatus_STATE_ACCEPTED, "", "")
		// Answers later, after the call ended (a spooled result).
	}))
	n2 := mustConnect(t, s, "n2", withLabels(map[string]string{"sku": "a100"}))

	// A work id the coordinator never issued.
	r := result("n1", false)
	r.WorkId = "w-forged"
	n1.sendResult(r)
	if ack := n1.ack(5 * time.Second); !strings.Contains(ack.GetRefused(), `names work "w-forged", which was never sent to node n1`) {
		t.Fatalf("forged work id: ack %v", ack)
	}
	if evs := eventsOf(t, s, "n1"); !hasEvent(evs, "refused: result "+r.Id+` names work "w-forged"`) {
		t.Errorf("no refusal event: %v", evs)
	}

	stream, err := operator(t, s).RunCheck(context.Background(), &pb.RunCheckRequest{
		Selector: "sku=h100", Checks: []string{"gpu.ecc"}, TimeoutMs: 300, Reason: "ticket 42",
	})
	if err != nil {
		t.Fatal(err)
	}
	for {
		p, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if p.Final {
			break
		}
	}
	wmu.Lock()
	wid := workID
	wmu.Unlock()
	if wid == "" {
		t.Fatal("n1 never got the work")
	}
	// n2 was not picked: the work is not its to report.
	r2 := result("n2", false)
	r2.WorkId = wid
	n2.sendResult(r2)
	if ack := n2.ack(5 * time.Second); ack.GetRefused() == "" {
		t.Fatalf("n2 reported work it was never sent: ack %v", ack)
	}

	// n1's late result is accepted, also by a restarted coordinator:
	// where the work went is in the store.
	stopServer(t, s)
	s2 := testServer(t, dir, nil)
	b := mustConnect(t, s2, "n1")
	late := result("n1", false)
	late.WorkId, late.Full = wid, false
	b.sendResult(late)
	if ack := b.ack(5 * time.Second); ack.GetRefused() != "" {
		t.Fatalf("late result for work sent before the restart: ack %v", ack)
	}
	// The operator's request is in the audit log with who and why.
	evs, err := s2.Store().Events(context.Background(), store.EventQuery{Kind: store.EventOperatorAction})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || !strings.HasPrefix(evs[0].Actor, "anonymous@127.0.0.1:") ||
		!strings.Contains(evs[0].Message, "run gpu.ecc on \"sku=h100\"") || !strings.Contains(evs[0].Message, "reason: ticket 42") {
		t.Fatalf("operator_action events = %+v", evs)
	}
}

func TestAudit(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	ctx := context.Background()
	if err := s.Audit(ctx, "admin:alice", "campaign.start", "burnin-7 on sku=h100: acceptance of rack r12"); err != nil {
		t.Fatal(err)
	}
	if err := s.AuditNode(ctx, "gpu-001", "", "drain", "burnin-7: gpu.ecc failed"); err != nil {
		t.Fatal(err)
	}
	if err := s.Audit(ctx, "x", "", "no action"); err == nil {
		t.Error("audit without an action accepted")
	}
	evs, err := s.Store().Events(ctx, store.EventQuery{Kind: store.EventAudit})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 {
		t.Fatalf("audit events = %+v", evs)
	}
	if e := evs[0]; e.Actor != "admin:alice" || e.Node != "" || e.Message != "campaign.start: burnin-7 on sku=h100: acceptance of rack r12" {
		t.Errorf("first = %+v", e)
	}
	// No caller behind the context: the coordinator acted.
	if e := evs[1]; e.Actor != "coordinator" || e.Node != "gpu-001" || e.Message != "drain: burnin-7: gpu.ecc failed" {
		t.Errorf("second = %+v", e)
	}
	resp, err := operator(t, s).ListEvents(ctx, &pb.ListEventsRequest{Kind: store.EventAudit, Node: "gpu-001"})
	if err != nil || len(resp.Events) != 1 || resp.Events[0].Kind != store.EventAudit {
		t.Fatalf("ListEvents by kind and node: %v %v", resp, err)
	}
}

func TestSecureConfig(t *testing.T) {
	t.Parallel()
	if _, _, err := Secure(Config{DataDir: "x"}, Options{}); err == nil || !strings.Contains(err.Error(), "no transport credentials") {
		t.Errorf("neither tls nor insecure: %v", err)
	}
	if _, _, err := Secure(Config{Insecure: true, TLS: TLSConfig{CertFile: "a"}}, Options{}); err == nil {
		t.Error("insecure and tls both accepted")
	}
	opts, r, err := Secure(Config{Insecure: true}, Options{})
	if err != nil || r != nil || opts.Credentials != nil || len(opts.UnaryInterceptors) != 1 || len(opts.StreamInterceptors) != 1 {
		t.Errorf("insecure: %+v %v %v", opts, r, err)
	}
	if _, _, err := Secure(Config{TLS: TLSConfig{CertFile: "/nonexistent", KeyFile: "/nonexistent", CAFile: "/nonexistent", TrustDomain: testTD}}, Options{}); err == nil {
		t.Error("missing certificate files accepted")
	}
	for _, bad := range []string{
		"data_dir: x\ninsecure: true\ntls:\n  cert_file: a\n",
		"data_dir: x\ntls:\n  cert_file: a\n",
		"data_dir: x\ntls:\n  cert_file: a\n  key_file: b\n  ca_file: c\n  trust_domain: Not_Valid\n",
	} {
		if _, err := ParseConfig([]byte(bad)); err == nil {
			t.Errorf("config accepted:\n%s", bad)
		}
	}
	c, err := ParseConfig([]byte("data_dir: x\ntls:\n  cert_file: a\n  key_file: b\n  ca_file: c\n  trust_domain: fleet.test\n"))
	if err != nil || c.TLS.TrustDomain != testTD {
		t.Errorf("tls config: %+v %v", c.TLS, err)
	}
}

func TestInsecureSaysSoLoudly(t *testing.T) {
	t.Parallel()
	var logs syncBuf
	cfg := Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), Insecure: true}
	opts, _, err := Secure(cfg, Options{Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer stopServer(t, s)
	logs.mu.Lock()
	out := logs.b.String()
	logs.mu.Unlock()
	if !strings.Contains(out, `"level":"warn"`) || !strings.Contains(out, "INSECURE MODE") || !strings.Contains(out, s.GRPCAddr().String()) {
		t.Fatalf("no insecure banner naming the address:\n%s", out)
	}
	// Everyone is anonymous, and may act: the events say so.
	a := mustConnect(t, s, "gpu-001")
	a.sendResult(result("gpu-001", false))
	if ack := a.ack(5 * time.Second); ack.GetRefused() != "" {
		t.Fatal(ack)
	}
	evs := eventsOf(t, s, "gpu-001")
	if !hasEvent(evs, "connection: node joined") {
		t.Fatalf("events = %v", evs)
	}
	all, err := s.Store().Events(context.Background(), store.EventQuery{Node: "gpu-001", Kind: store.EventConnection})
	if err != nil || len(all) != 1 || !strings.HasPrefix(all[0].Actor, "anonymous@127.0.0.1:") {
		t.Fatalf("connection event actor: %+v %v", all, err)
	}
}

func TestWorkProgressInStats(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	w := newWork("w-a")
	for _, n := range []string{"a", "b", "c", "d"} {
		w.addTarget(n, nil)
	}
	w.finish("a", &pb.NodeOutcome{Node: "a", Status: "pass"})
	s.works.add(w)
	st := s.Stats()
	if st.ActiveWork != 1 || st.WorkNodes != 4 || st.WorkNodesDone != 1 {
		t.Fatalf("stats = %+v", st)
	}
	if w.sentTo("a") {
		t.Error("a work counts as sent before it was")
	}
	w.markSent("a", true)
	if !w.sentTo("a") || w.sentTo("zz") {
		t.Error("sentTo")
	}
	s.works.remove(w.id)
	if st := s.Stats(); st.ActiveWork != 0 || st.WorkNodes != 0 {
		t.Fatalf("stats after = %+v", st)
	}
}
