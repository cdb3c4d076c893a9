package coordinator

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Issue 16: one node certificate claiming a new node name on every hello
// and every result used to write a refused event each time (the dedupe
// was per claimed name), about 2,000 rows a second for ever. Now the
// identity's first refusals are recorded and the rest counted.
func TestRefusalsBoundedPerIdentity(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	var logs syncBuf
	s := secureServer(t, ca, t.TempDir(), zerolog.New(&logs))
	ctx := context.Background()
	creds := ca.creds(pki.KindNode, "gpu-003")

	const hellos, results = 60, 60
	cc, err := grpc.NewClient(s.GRPCAddr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	for i := range hellos {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := pb.NewAgentServiceClient(cc).Connect(cctx)
		if err != nil {
			t.Fatal(err)
		}
		hello := &pb.Hello{Node: fmt.Sprintf("victim-%d", i), ProtocolVersion: ProtocolVersion}
		_ = st.Send(&pb.AgentMessage{Msg: &pb.AgentMessage_Hello{Hello: hello}})
		_, err = st.Recv()
		cancel()
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("hello %d as victim-%d: %v, want PermissionDenied", i, i, err)
		}
	}
	// On its own stream, results claiming other nodes: each still answered.
	a, err := connectCreds(t, s, creds, "gpu-003")
	if err != nil {
		t.Fatal(err)
	}
	for i := range results {
		a.sendResult(result(fmt.Sprintf("other-%d", i), false))
		if ack := a.ack(5 * time.Second); !strings.Contains(ack.GetRefused(), "may not speak for node") {
			t.Fatalf("result %d: ack %v, want refused", i, ack)
		}
	}

	evs, err := s.Store().Events(ctx, store.EventQuery{Node: "gpu-003", Kind: store.EventRefused, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	suppressed := s.Stats().RefusalsSuppressed[ReasonOtherNode]
	// One token may refill if the test is slow (one per refusalRefill).
	if len(evs) < refusalBurst || len(evs) > refusalBurst+1 {
		t.Fatalf("%d refused events for %d refusals, want the burst of %d", len(evs), hellos+results, refusalBurst)
	}
	if got := uint64(len(evs)) + suppressed; got != hellos+results {
		t.Fatalf("%d recorded + %d suppressed = %d, want every refusal (%d) accounted for", len(evs), suppressed, got, hellos+results)
	}
	lines := 0
	for _, line := range strings.Split(logs.text(), "\n") {
		if strings.Contains(line, `"refused: identity speaks for another node"`) {
			lines++
		}
	}
	if lines > refusalBurst+1 {
		t.Fatalf("%d refusal log lines, want at most %d", lines, refusalBurst+1)
	}
	if evs, _ := s.Store().Events(ctx, store.EventQuery{Node: "victim-7"}); len(evs) != 0 {
		t.Fatalf("events under a node the attacker named: %v", evs)
	}
}

// TLS refusals used to leave no trace at the coordinator: now each is
// counted by reason and logged (bounded) with the peer.
func TestTLSRefusalsLoggedAndCounted(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	var logs syncBuf
	s := secureServer(t, ca, t.TempDir(), zerolog.New(&logs))
	addr := s.GRPCAddr().String()

	// Plaintext gRPC, as `fleetcheck nodes --insecure` sends.
	if _, err := connect(t, s, "gpu-001"); err == nil {
		t.Fatal("plaintext agent connected")
	}
	tlsDial := func(f pki.Files, noCert bool) {
		t.Helper()
		r, err := pki.NewReloader(f, pki.ReloaderOptions{CheckInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := pki.ClientConfig(pki.ClientOptions{Reloader: r, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		cfg.NextProtos = []string{"h2"}
		if noCert {
			cfg.GetClientCertificate = nil
		}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Read(make([]byte, 1)) // the server's alert
	}
	tlsDial(ca.files(pki.Request{Kind: pki.KindAdmin, Name: "old", NotBefore: time.Now().Add(-48 * time.Hour), Validity: time.Hour}), false)
	stranger := newTestCA(t).files(pki.Request{Kind: pki.KindAdmin, Name: "mallory"})
	stranger.CAFile = ca.files(pki.Request{Kind: pki.KindAdmin, Name: "x"}).CAFile
	tlsDial(stranger, false)
	tlsDial(ca.files(pki.Request{Kind: pki.KindAdmin, Name: "y"}), true)

	want := map[pki.HandshakeReason]string{
		pki.HandshakePlaintext:     "client does not speak TLS",
		pki.HandshakeExpired:       "certificate expired",
		pki.HandshakeUnknownCA:     "not signed by a trusted CA",
		pki.HandshakeNoCertificate: "client sent no certificate",
	}
	testwait.Until(t, 10*time.Second, "every refusal counted", func() bool {
		got := s.Stats().TLSHandshakeFailures
		for r := range want {
			if got[string(r)] == 0 {
				return false
			}
		}
		return true
	})

	for r, words := range want {
		testwait.Until(t, 10*time.Second, "a warn line for "+string(r), func() bool {
			for _, line := range strings.Split(logs.text(), "\n") {
				if strings.Contains(line, `"reason":"`+string(r)+`"`) && strings.Contains(line, words) &&
					strings.Contains(line, `"peer":"127.0.0.1:`) && strings.Contains(line, `"level":"warn"`) {
					return true
				}
			}
			return false
		})
	}
}

// Issue 10: an agent stopped cleanly said nothing, so its node showed
// "unreachable: stream lost". Now its Goodbye makes the node "left"; a
// stream that breaks without one is still unreachable.
func TestGoodbyeLeaves(t *testing.T) {
	t.Parallel()
	s := testServer(t, t.TempDir(), nil)
	a := mustConnect(t, s, "gpu-001")
	a.sendResult(result("gpu-001", false))
	a.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "healthy", stateIs(t, s, "gpu-001", StateHealthy))

	a.send(&pb.AgentMessage{Msg: &pb.AgentMessage_Goodbye{Goodbye: &pb.Goodbye{Reason: "agent stopping"}}})
	if err := a.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, 5*time.Second, "left", stateIs(t, s, "gpu-001", StateLeft))
	if n := nodeOf(t, s, "gpu-001"); n.Connected || n.StateReason != "agent stopped: agent stopping" {
		t.Fatalf("after goodbye: connected=%v reason=%q", n.Connected, n.StateReason)
	}
	if ev := eventsOf(t, s, "gpu-001"); !hasEvent(ev, "healthy -> left: agent stopped") {
		t.Fatalf("events %v", ev)
	}
	// Back again: its results decide once more.
	b := mustConnect(t, s, "gpu-001")
	b.sendResult(result("gpu-001", false))
	b.ack(5 * time.Second)
	testwait.Until(t, 5*time.Second, "healthy again", stateIs(t, s, "gpu-001", StateHealthy))
}
