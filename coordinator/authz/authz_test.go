package authz_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/ratelimit"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

const td = "fleet.test"

// logBuf collects log lines from concurrent handlers.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines are the logged JSON objects.
func (l *logBuf) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if s == "" {
			continue
		}
		m := map[string]any{}
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		out = append(out, m)
	}
	return out
}

// find is the first logged line whose message starts with msg and whose
// fields include want.
func (l *logBuf) find(t *testing.T, msg string, want map[string]string) map[string]any {
	t.Helper()
	for _, m := range l.lines(t) {
		if s, _ := m["message"].(string); !strings.HasPrefix(s, msg) {
			continue
		}
		ok := true
		for k, v := range want {
			if got, _ := m[k].(string); got != v {
				ok = false
			}
		}
		if ok {
			return m
		}
	}
	return nil
}

// stubs stand in for the coordinator: they report who called, and the
// agent stream calls CheckNode the way the coordinator will.
type agentStub struct {
	pb.UnimplementedAgentServiceServer
}

func (agentStub) Connect(stream pb.AgentService_ConnectServer) error {
	ctx := stream.Context()
	msg, err := stream.Recv()
	if err != nil {
		return err
	}
	if err := authz.CheckNode(ctx, msg.GetHello().GetNode()); err != nil {
		return err
	}
	id, _ := authz.IdentityFrom(ctx)
	if err := stream.Send(&pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_Welcome{Welcome: &pb.Welcome{CoordinatorVersion: id.Actor()}}}); err != nil {
		return err
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		r := msg.GetResult()
		ack := &pb.Ack{ResultId: r.GetId()}
		if err := authz.CheckNode(ctx, r.GetNode()); err != nil {
			ack.Refused = status.Convert(err).Message()
		}
		if err := stream.Send(&pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_Ack{Ack: ack}}); err != nil {
			return err
		}
	}
}

type operatorStub struct {
	pb.UnimplementedOperatorServiceServer
}

func (operatorStub) ListNodes(ctx context.Context, _ *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	id, ok := authz.IdentityFrom(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no identity")
	}
	return &pb.ListNodesResponse{Nodes: []*pb.NodeSummary{{Name: id.Actor()}}}, nil
}

func (operatorStub) RunCheck(_ *pb.RunCheckRequest, stream pb.OperatorService_RunCheckServer) error {
	id, _ := authz.IdentityFrom(stream.Context())
	return stream.Send(&pb.RunCheckProgress{Final: true, WorkId: id.Actor()})
}

type routingStub struct {
	pb.UnimplementedRoutingServiceServer
}

func (routingStub) RouteWork(ctx context.Context, _ *pb.RoutedWork) (*pb.RoutedOutcome, error) {
	id, ok := authz.IdentityFrom(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no identity")
	}
	return &pb.RoutedOutcome{Message: id.Actor()}, nil
}

func routeWork(t *testing.T, cc *grpc.ClientConn) (string, error) {
	t.Helper()
	r, err := pb.NewRoutingServiceClient(cc).RouteWork(ctx(t), &pb.RoutedWork{})
	return r.GetMessage(), err
}

// serve runs the stubs behind the interceptors on 127.0.0.1.
func serve(t *testing.T, a *authz.Authorizer, creds credentials.TransportCredentials) string {
	t.Helper()
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(a.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(a.StreamInterceptor()),
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	s := grpc.NewServer(opts...)
	pb.RegisterAgentServiceServer(s, agentStub{})
	pb.RegisterOperatorServiceServer(s, operatorStub{})
	pb.RegisterRoutingServiceServer(s, routingStub{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func reloader(t *testing.T, f pki.Files) *pki.Reloader {
	t.Helper()
	r, err := pki.NewReloader(f, pki.ReloaderOptions{CheckInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func clientCreds(t *testing.T, f pki.Files) credentials.TransportCredentials {
	t.Helper()
	c, err := pki.ClientCredentials(pki.ClientOptions{Reloader: reloader(t, f), TrustDomain: td})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// issue writes a leaf of ca into a new directory; the CA file there is
// the bundle given.
func issue(t *testing.T, ca *pki.CA, req pki.Request, bundle string) pki.Files {
	t.Helper()
	leaf, err := ca.Issue(req)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := pki.WriteLeaf(t.TempDir(), leaf, false)
	if err != nil {
		t.Fatal(err)
	}
	return pki.Files{CertFile: certFile, KeyFile: keyFile, CAFile: bundle}
}

func newCA(t *testing.T, domain string) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA(domain, pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func writeFile(t *testing.T, name string, chunks ...[]byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, bytes.Join(chunks, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// foreignPKI is another organisation's PKI, built without package pki:
// an ECDSA P-384 root, an intermediate, and an RSA leaf for spiffe://fleet.test/node/NAME
// with an extra URI SAN of its own. Its files hold the leaf then the
// intermediate, and a PKCS #1 key.
func foreignPKI(t *testing.T, node string, bundle string) (root *x509.Certificate, files pki.Files) {
	t.Helper()
	mk := func(tmpl, parent *x509.Certificate, pub any, signer any) *x509.Certificate {
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	caKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	rootKey, midKey := caKey(), caKey()
	leafKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rootT := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Corp Root"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	root = mk(rootT, rootT, &rootKey.PublicKey, rootKey)
	midT := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "Corp Issuing CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	mid := mk(midT, root, &midKey.PublicKey, rootKey)
	leafT := &x509.Certificate{
		SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: node + ".corp.example"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{node + ".corp.example"},
		URIs: []*url.URL{
			{Scheme: "https", Host: "idp.corp.example", Path: "/hosts/" + node},
			{Scheme: "spiffe", Host: td, Path: "/node/" + node},
		},
	}
	leaf := mk(leafT, mid, &leafKey.PublicKey, midKey)
	certFile := writeFile(t, "leaf.pem", pki.EncodeCert(leaf), pki.EncodeCert(mid))
	keyFile := writeFile(t, "leaf.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(leafKey)}))
	return root, pki.Files{CertFile: certFile, KeyFile: keyFile, CAFile: bundle}
}

// fixture is one coordinator under mTLS and the certificates of its
// callers.
type fixture struct {
	addr  string
	logs  *logBuf
	coord *pki.Reloader
	ours  *pki.CA
	files map[string]pki.Files
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ours, other, untrusted := newCA(t, td), newCA(t, "other.test"), newCA(t, td)
	clientBundle := writeFile(t, "client-ca.crt", pki.EncodeCert(ours.Cert))
	foreignRoot, foreign := foreignPKI(t, "gpu07", clientBundle)
	// The coordinator trusts our CA, a partner domain's and the corporate
	// root: chains from all three verify; trust domains tell them apart.
	serverBundle := writeFile(t, "server-ca.crt", pki.EncodeCert(ours.Cert), pki.EncodeCert(other.Cert), pki.EncodeCert(foreignRoot))

	f := &fixture{logs: &logBuf{}, ours: ours, files: map[string]pki.Files{
		"node":        issue(t, ours, pki.Request{Kind: pki.KindNode, Name: "gpu01"}, clientBundle),
		"admin":       issue(t, ours, pki.Request{Kind: pki.KindAdmin, Name: "alice"}, clientBundle),
		"coordinator": issue(t, ours, pki.Request{Kind: pki.KindCoordinator, Name: "peer", DNSNames: []string{"peer.example"}}, clientBundle),
		"expired": issue(t, ours, pki.Request{Kind: pki.KindNode, Name: "gpu01",
			NotBefore: time.Now().Add(-72 * time.Hour), Validity: time.Hour}, clientBundle),
		"untrusted":    issue(t, untrusted, pki.Request{Kind: pki.KindNode, Name: "gpu01"}, clientBundle),
		"other domain": issue(t, other, pki.Request{Kind: pki.KindAdmin, Name: "alice"}, clientBundle),
		"foreign":      foreign,
	}}
	f.files["server"] = issue(t, ours, pki.Request{Kind: pki.KindCoordinator, Name: "coord",
		DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}, serverBundle)
	f.coord = reloader(t, f.files["server"])
	creds, err := pki.ServerCredentials(pki.ServerOptions{Reloader: f.coord})
	if err != nil {
		t.Fatal(err)
	}
	a, err := authz.New(authz.Config{TrustDomain: td, Logger: zerolog.New(f.logs)})
	if err != nil {
		t.Fatal(err)
	}
	f.addr = serve(t, a, creds)
	return f
}

func (f *fixture) conn(t *testing.T, who string) *grpc.ClientConn {
	t.Helper()
	files, ok := f.files[who]
	if !ok {
		t.Fatalf("no certificate %q", who)
	}
	return dial(t, f.addr, clientCreds(t, files))
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func hello(node string) *pb.AgentMessage {
	return &pb.AgentMessage{Msg: &pb.AgentMessage_Hello{Hello: &pb.Hello{Node: node}}}
}

func result(id, node string) *pb.AgentMessage {
	return &pb.AgentMessage{Msg: &pb.AgentMessage_Result{Result: &pb.Result{Id: id, Node: node}}}
}

// connect opens an agent stream, says hello as node and returns the
// stream and the first answer's error.
func connect(t *testing.T, cc *grpc.ClientConn, node string) (pb.AgentService_ConnectClient, error) {
	t.Helper()
	s, err := pb.NewAgentServiceClient(cc).Connect(ctx(t))
	if err != nil {
		return nil, err
	}
	if err := s.Send(hello(node)); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	m, err := s.Recv()
	if err != nil {
		return nil, err
	}
	if m.GetWelcome() == nil {
		t.Fatalf("first answer %v, want Welcome", m)
	}
	return s, nil
}

func listNodes(t *testing.T, cc *grpc.ClientConn) (string, error) {
	t.Helper()
	r, err := pb.NewOperatorServiceClient(cc).ListNodes(ctx(t), &pb.ListNodesRequest{})
	if err != nil {
		return "", err
	}
	return r.GetNodes()[0].GetName(), nil
}

func runCheck(t *testing.T, cc *grpc.ClientConn) (string, error) {
	t.Helper()
	s, err := pb.NewOperatorServiceClient(cc).RunCheck(ctx(t), &pb.RunCheckRequest{})
	if err != nil {
		return "", err
	}
	m, err := s.Recv()
	if err != nil {
		return "", err
	}
	return m.GetWorkId(), nil
}

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: %v (code %v), want %v", what, err, got, want)
	}
}

func TestPolicy(t *testing.T) {
	t.Parallel()
	f := newFixture(t)

	t.Run("node calls AgentService", func(t *testing.T) {
		t.Parallel()
		if _, err := connect(t, f.conn(t, "node"), "gpu01"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("node cannot call OperatorService", func(t *testing.T) {
		t.Parallel()
		cc := f.conn(t, "node")
		_, err := listNodes(t, cc)
		wantCode(t, "ListNodes", err, codes.PermissionDenied)
		_, err = runCheck(t, cc)
		wantCode(t, "RunCheck", err, codes.PermissionDenied)
		if f.logs.find(t, "refused", map[string]string{"method": "/fleetcheck.v1.OperatorService/ListNodes", "identity": "spiffe://fleet.test/node/gpu01"}) == nil {
			t.Fatal("refusal not logged with method and identity")
		}
		m := f.logs.find(t, "refused", map[string]string{"method": "/fleetcheck.v1.OperatorService/RunCheck"})
		if m == nil || m["level"] != "warn" || !strings.HasPrefix(m["peer"].(string), "127.0.0.1:") {
			t.Fatalf("refusal log %v, want a warn line with peer", m)
		}
	})
	t.Run("admin calls OperatorService", func(t *testing.T) {
		t.Parallel()
		cc := f.conn(t, "admin")
		if who, err := listNodes(t, cc); err != nil || who != "admin:alice" {
			t.Fatalf("ListNodes: %q, %v", who, err)
		}
		if who, err := runCheck(t, cc); err != nil || who != "admin:alice" {
			t.Fatalf("RunCheck: %q, %v", who, err)
		}
	})
	t.Run("admin cannot call AgentService", func(t *testing.T) {
		t.Parallel()
		_, err := connect(t, f.conn(t, "admin"), "gpu01")
		wantCode(t, "Connect", err, codes.PermissionDenied)
	})
	t.Run("coordinator identity calls RoutingService only", func(t *testing.T) {
		t.Parallel()
		cc := f.conn(t, "coordinator")
		_, err := connect(t, cc, "peer")
		wantCode(t, "Connect", err, codes.PermissionDenied)
		_, err = listNodes(t, cc)
		wantCode(t, "ListNodes", err, codes.PermissionDenied)
		if who, err := routeWork(t, cc); err != nil || who != "coordinator:peer" {
			t.Fatalf("RouteWork: %q, %v", who, err)
		}
	})
	t.Run("node and admin cannot call RoutingService", func(t *testing.T) {
		t.Parallel()
		for _, who := range []string{"node", "admin"} {
			_, err := routeWork(t, f.conn(t, who))
			wantCode(t, who+" RouteWork", err, codes.PermissionDenied)
		}
		_, err := routeWork(t, f.conn(t, "other domain"))
		wantCode(t, "other domain RouteWork", err, codes.PermissionDenied)
	})
	t.Run("wrong trust domain", func(t *testing.T) {
		t.Parallel()
		_, err := listNodes(t, f.conn(t, "other domain"))
		wantCode(t, "ListNodes", err, codes.PermissionDenied)
		if f.logs.find(t, "refused: foreign trust domain", map[string]string{"trust_domain": "other.test"}) == nil {
			t.Fatal("refusal not logged")
		}
	})
	t.Run("foreign PKI with the right SAN", func(t *testing.T) {
		t.Parallel()
		s, err := connect(t, f.conn(t, "foreign"), "gpu07")
		if err != nil {
			t.Fatal(err)
		}
		_ = s.CloseSend()
	})
	// Refused in the handshake: the call never reaches the interceptor.
	for who, reason := range map[string]string{"expired": "expired certificate", "untrusted": "unknown certificate authority"} {
		t.Run(who+" certificate", func(t *testing.T) {
			t.Parallel()
			_, err := listNodes(t, f.conn(t, who))
			wantCode(t, "ListNodes", err, codes.Unavailable)
			// In TLS 1.3 the client may finish first and write into a
			// closed socket before it reads the server's alert; when the
			// alert is there, it must give the expected reason (package
			// pki's tests check the reasons without that race).
			if strings.Contains(err.Error(), "remote error") && !strings.Contains(err.Error(), reason) {
				t.Fatalf("refused for another reason than %q: %v", reason, err)
			}
		})
	}
	t.Run("TLS 1.2 client", func(t *testing.T) {
		t.Parallel()
		r := reloader(t, f.files["admin"])
		cfg := &tls.Config{
			MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12,
			RootCAs: r.CAPool(), Certificates: []tls.Certificate{*r.Certificate()},
		}
		_, err := listNodes(t, dial(t, f.addr, credentials.NewTLS(cfg)))
		wantCode(t, "ListNodes", err, codes.Unavailable)
		if !strings.Contains(err.Error(), "protocol version") {
			t.Fatalf("refused for another reason: %v", err)
		}
	})
	t.Run("plaintext client", func(t *testing.T) {
		t.Parallel()
		_, err := listNodes(t, dial(t, f.addr, insecure.NewCredentials()))
		wantCode(t, "ListNodes", err, codes.Unavailable)
	})
}

func TestCheckNode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cc := f.conn(t, "node")

	t.Run("hello for another node", func(t *testing.T) {
		t.Parallel()
		_, err := connect(t, cc, "gpu02")
		wantCode(t, "Connect", err, codes.PermissionDenied)
	})
	t.Run("results", func(t *testing.T) {
		t.Parallel()
		s, err := connect(t, cc, "gpu01")
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct{ id, node, refused string }{
			{"r1", "gpu01", ""},
			{"r2", "gpu02", `node:gpu01 may not speak for node "gpu02"`},
			{"r3", "", `node:gpu01 may not speak for node ""`},
		} {
			if err := s.Send(result(tc.id, tc.node)); err != nil {
				t.Fatal(err)
			}
			m, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if got := m.GetAck(); got.GetResultId() != tc.id || got.GetRefused() != tc.refused {
				t.Fatalf("result %s for %q: ack %v, want refused %q", tc.id, tc.node, got, tc.refused)
			}
		}
		_ = s.CloseSend()
		// The caller records these (the coordinator, bounded per
		// identity): authz writes nothing per claim.
		if m := f.logs.find(t, "refused: identity speaks for another node", nil); m != nil {
			t.Fatalf("CheckNode logged a refusal itself: %v", m)
		}
	})
	t.Run("without the interceptor", func(t *testing.T) {
		t.Parallel()
		wantCode(t, "CheckNode", authz.CheckNode(context.Background(), "gpu01"), codes.Internal)
	})
}

// Replacing the coordinator's files switches the certificate new
// connections see, without restarting the server.
func TestServerCertificateReload(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	served := func() string {
		t.Helper()
		var p peer.Peer
		cc := f.conn(t, "admin")
		if _, err := pb.NewOperatorServiceClient(cc).ListNodes(ctx(t), &pb.ListNodesRequest{}, grpc.Peer(&p)); err != nil {
			t.Fatal(err)
		}
		_ = cc.Close()
		return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber.Text(16)
	}
	before := served()

	leaf, err := f.ours.Issue(pki.Request{Kind: pki.KindCoordinator, Name: "coord", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	dst := f.files["server"]
	keyPEM, err := pki.EncodeKey(leaf.Key)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		path string
		data []byte
	}{{dst.KeyFile, keyPEM}, {dst.CertFile, pki.EncodeCert(leaf.Cert)}} {
		tmp := w.path + ".new"
		if err := os.WriteFile(tmp, w.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, w.path); err != nil {
			t.Fatal(err)
		}
	}
	if changed, err := f.coord.Check(); err != nil || !changed {
		t.Fatalf("Check: changed=%v, %v", changed, err)
	}
	after := served()
	if after == before || after != leaf.Cert.SerialNumber.Text(16) {
		t.Fatalf("served %s before and %s after; issued %s", before, after, leaf.Cert.SerialNumber.Text(16))
	}
}

func TestInsecure(t *testing.T) {
	t.Parallel()
	logs := &logBuf{}
	a, err := authz.New(authz.Config{Insecure: true, Logger: zerolog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	if !a.Insecure() {
		t.Fatal("Insecure() = false")
	}
	addr := serve(t, a, nil)
	authz.WarnInsecure(zerolog.New(logs), addr)
	cc := dial(t, addr, insecure.NewCredentials())

	who, err := listNodes(t, cc)
	if err != nil || !strings.HasPrefix(who, "anonymous@127.0.0.1:") {
		t.Fatalf("ListNodes: %q, %v", who, err)
	}
	s, err := connect(t, cc, "gpu01")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(result("r1", "gpu02")); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil || m.GetAck().GetRefused() != "" {
		t.Fatalf("anonymous result: %v, %v", m, err)
	}
	_ = s.CloseSend()

	banner := logs.find(t, "!!! INSECURE MODE !!!", map[string]string{"level": "warn", "addr": addr})
	if banner == nil || banner["insecure"] != true {
		t.Fatalf("no insecure banner in %v", logs.lines(t))
	}
}

func TestNewNeedsTrustDomain(t *testing.T) {
	t.Parallel()
	for _, cfg := range []authz.Config{{}, {TrustDomain: "Upper.Case"}} {
		if _, err := authz.New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

// A server whose transport does not verify client certificates (a
// misconfiguration) lets nobody in.
func TestUnverifiedTransportRefused(t *testing.T) {
	t.Parallel()
	a, err := authz.New(authz.Config{TrustDomain: td, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	cc := dial(t, serve(t, a, nil), insecure.NewCredentials())
	_, err = listNodes(t, cc)
	wantCode(t, "ListNodes", err, codes.Unauthenticated)
}

// oldStyleCA is a CA as fleetcheck made them before subdomains were
// excluded: permitted URI domain "DOMAIN" only, which Go reads as DOMAIN
// and everything below it.
func oldStyleCA(t *testing.T, domain string) *pki.CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "fleetcheck CA " + domain},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, MaxPathLen: 0, MaxPathLenZero: true,
		KeyUsage:            x509.KeyUsageCertSign,
		URIs:                []*url.URL{{Scheme: "spiffe", Host: domain}},
		PermittedURIDomains: []string{domain},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &pki.CA{Cert: cert, Key: key, TrustDomain: domain}
}

// speaksFor is ca signing a leaf for another trust domain's identity, as
// anyone holding ca's key can.
func speaksFor(ca *pki.CA, domain string) *pki.CA {
	return &pki.CA{Cert: ca.Cert, Key: ca.Key, TrustDomain: domain}
}

// Issue 16: the coordinator's ca_file holds a CA of fleet.test and one of
// its parent domain, test. Go's name constraint "test" admits fleet.test,
// so a leaf the test CA signed for spiffe://fleet.test/admin/mallory used
// to be a full operator. Only a CA of exactly fleet.test vouches for
// fleet.test now, whether it was made before or after subdomains were
// excluded; a parent CA made by today's `certs init` is refused by x509
// itself.
func TestParentDomainCA(t *testing.T) {
	t.Parallel()
	ours, older := newCA(t, td), oldStyleCA(t, td)
	parentOld, parentNew := oldStyleCA(t, "test"), newCA(t, "test")
	clientBundle := writeFile(t, "client-ca.crt", pki.EncodeCert(ours.Cert))
	serverBundle := writeFile(t, "server-ca.crt", pki.EncodeCert(ours.Cert), pki.EncodeCert(older.Cert),
		pki.EncodeCert(parentOld.Cert), pki.EncodeCert(parentNew.Cert))
	server := issue(t, ours, pki.Request{Kind: pki.KindCoordinator, Name: "coord", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}, serverBundle)
	creds, err := pki.ServerCredentials(pki.ServerOptions{Reloader: reloader(t, server)})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuf{}
	a, err := authz.New(authz.Config{TrustDomain: td, Logger: zerolog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, a, creds)
	conn := func(ca *pki.CA, kind pki.Kind, name string) *grpc.ClientConn {
		return dial(t, addr, clientCreds(t, issue(t, ca, pki.Request{Kind: kind, Name: name}, clientBundle)))
	}

	t.Run("parent CA signs an admin of the child domain", func(t *testing.T) {
		t.Parallel()
		cc := conn(speaksFor(parentOld, td), pki.KindAdmin, "mallory")
		_, err := listNodes(t, cc)
		wantCode(t, "ListNodes", err, codes.Unauthenticated)
		if !strings.Contains(status.Convert(err).Message(), "not a CA of trust domain fleet.test") {
			t.Fatalf("refused for another reason: %v", err)
		}
		_, err = runCheck(t, cc)
		wantCode(t, "RunCheck", err, codes.Unauthenticated)
		if logs.find(t, "refused: no valid identity", map[string]string{"level": "warn"}) == nil {
			t.Fatal("refusal not logged")
		}
	})
	t.Run("parent CA signs a node of the child domain", func(t *testing.T) {
		t.Parallel()
		_, err := connect(t, conn(speaksFor(parentOld, td), pki.KindNode, "gpu01"), "gpu01")
		wantCode(t, "Connect", err, codes.Unauthenticated)
	})
	t.Run("today's parent CA is refused in the handshake", func(t *testing.T) {
		t.Parallel()
		_, err := listNodes(t, conn(speaksFor(parentNew, td), pki.KindAdmin, "mallory"))
		wantCode(t, "ListNodes", err, codes.Unavailable)
	})
	t.Run("the parent CA's own admin is of another domain", func(t *testing.T) {
		t.Parallel()
		_, err := listNodes(t, conn(parentOld, pki.KindAdmin, "root"))
		wantCode(t, "ListNodes", err, codes.PermissionDenied)
	})
	t.Run("our CA", func(t *testing.T) {
		t.Parallel()
		if who, err := listNodes(t, conn(ours, pki.KindAdmin, "alice")); err != nil || who != "admin:alice" {
			t.Fatalf("ListNodes: %q, %v", who, err)
		}
		if _, err := connect(t, conn(ours, pki.KindNode, "gpu01"), "gpu01"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("an older CA of exactly our domain", func(t *testing.T) {
		t.Parallel()
		if who, err := listNodes(t, conn(older, pki.KindAdmin, "bob")); err != nil || who != "admin:bob" {
			t.Fatalf("ListNodes: %q, %v", who, err)
		}
		if _, err := connect(t, conn(older, pki.KindNode, "gpu02"), "gpu02"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("an older CA signs a subdomain's admin", func(t *testing.T) {
		t.Parallel()
		// x509 admits it (permitted fleet.test covers a.fleet.test); the
		// identity is refused as a foreign domain's either way.
		_, err := listNodes(t, conn(speaksFor(older, "a."+td), pki.KindAdmin, "mallory"))
		if c := status.Code(err); c != codes.Unauthenticated && c != codes.PermissionDenied {
			t.Fatalf("ListNodes: %v, want refused", err)
		}
	})
}

// One hostile identity's refusals are logged up to a bound, then only
// counted.
func TestRefusalLogsBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cc := f.conn(t, "node")
	for range 50 {
		_, err := listNodes(t, cc)
		wantCode(t, "ListNodes", err, codes.PermissionDenied)
	}
	n := 0
	for _, m := range f.logs.lines(t) {
		if m["message"] == "refused: identity may not call this method" && m["identity"] == "spiffe://fleet.test/node/gpu01" {
			n++
		}
	}
	if n == 0 || n > 10 {
		t.Fatalf("%d refusal lines for 50 refusals, want 1..10", n)
	}
}

// What is not logged is counted, by reason, in the limiter the caller
// shares (the coordinator exports it as a metric).
func TestRefusalsCountedWhenNotLogged(t *testing.T) {
	t.Parallel()
	limit := ratelimit.New(ratelimit.Options{Burst: 3, Every: time.Hour})
	a, err := authz.New(authz.Config{Insecure: false, TrustDomain: td, Logger: zerolog.Nop(), Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	cc := dial(t, serve(t, a, nil), insecure.NewCredentials())
	for range 20 {
		_, err := listNodes(t, cc)
		wantCode(t, "ListNodes", err, codes.Unauthenticated)
	}
	if got := limit.Suppressed()[authz.ReasonUnauthenticated]; got != 17 {
		t.Fatalf("suppressed %d, want 17 (20 refusals, 3 logged)", got)
	}
}
