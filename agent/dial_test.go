package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// serveLoopback runs c on 127.0.0.1 (never another address) with opts.
func serveLoopback(t *testing.T, c *fakeCoord, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	fleetcheckv1.RegisterAgentServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func TestLoopbackPlaintext(t *testing.T) {
	t.Parallel()
	c := newFakeCoord()
	cfg := testConfig(t)
	cfg.Coordinator = serveLoopback(t, c)
	// No test dialer: the agent's own dial path, over real TCP.
	startAgent(t, cfg, &fakeHost{}, nil)
	testwait.Until(t, 5*time.Second, "a result over TCP", func() bool { return c.stored() >= 1 })
}

// testPKI is a throwaway CA with a server and a node certificate on disk.
type testPKI struct {
	dir        string
	pool       *x509.CertPool
	serverCert tls.Certificate
}

func newPKI(t *testing.T, node string) *testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	issue := func(serial int64, tmpl *x509.Certificate) ([]byte, []byte) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalPKCS8PrivateKey(key)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
	}
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}))
	sc, sk := issue(2, &x509.Certificate{
		Subject: pkix.Name{CommonName: "coordinator"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	u, _ := url.Parse("spiffe://test.example/node/" + node)
	nc, nk := issue(3, &x509.Certificate{
		Subject: pkix.Name{CommonName: node}, URIs: []*url.URL{u},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	write("node.pem", nc)
	write("node-key.pem", nk)
	serverCert, err := tls.X509KeyPair(sc, sk)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &testPKI{dir: dir, pool: pool, serverCert: serverCert}
}

// spiffeCoord records the client certificate's identity of each stream.
type spiffeCoord struct {
	*fakeCoord
	ids chan string
}

func (s *spiffeCoord) Connect(st grpc.BidiStreamingServer[fleetcheckv1.AgentMessage, fleetcheckv1.CoordinatorMessage]) error {
	if p, ok := peer.FromContext(st.Context()); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			for _, u := range ti.State.PeerCertificates[0].URIs {
				select {
				case s.ids <- u.String():
				default:
				}
			}
			if ti.State.Version != tls.VersionTLS13 {
				select {
				case s.ids <- "not TLS 1.3":
				default:
				}
			}
		}
	}
	return s.fakeCoord.Connect(st)
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	p := newPKI(t, "gpu-001")
	sc := &spiffeCoord{fakeCoord: newFakeCoord(), ids: make(chan string, 16)}
	creds := credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{p.serverCert},
		ClientCAs: p.pool, ClientAuth: tls.RequireAndVerifyClientCert,
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	fleetcheckv1.RegisterAgentServiceServer(srv, sc)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	cfg := testConfig(t)
	cfg.Coordinator = lis.Addr().String()
	cfg.Insecure = false
	cfg.TLS = TLSConfig{
		CAFile:   filepath.Join(p.dir, "ca.pem"),
		CertFile: filepath.Join(p.dir, "node.pem"),
		KeyFile:  filepath.Join(p.dir, "node-key.pem"),
	}
	startAgent(t, cfg, &fakeHost{}, nil)
	testwait.Until(t, 5*time.Second, "a result over mTLS", func() bool { return sc.stored() >= 1 })
	select {
	case id := <-sc.ids:
		if id != "spiffe://test.example/node/gpu-001" {
			t.Errorf("coordinator saw %q", id)
		}
	case <-time.After(time.Second):
		t.Error("coordinator saw no client certificate")
	}

	// A broken identity is the agent's own error, named, not a hang.
	bad := *cfg
	bad.TLS.CAFile = filepath.Join(p.dir, "node-key.pem")
	if _, _, err := transport(&bad, nopLogger()); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("bad ca_file: %v", err)
	}
	bad.TLS.CertFile = filepath.Join(p.dir, "missing.pem")
	if _, _, err := transport(&bad, nopLogger()); err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Errorf("missing cert: %v", err)
	}
	// Run refuses to start with it, naming it.
	a, err := New(&bad, &fakeHost{}, nopLogger())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "agent tls identity") {
		t.Errorf("Run with a missing certificate: %v", err)
	}
}

// Issue 10: an agent whose certificate names another node used to start
// and retry for ever; now it refuses to start and says what to fix.
func TestStartRefusesCertificateOfAnotherNode(t *testing.T) {
	t.Parallel()
	p := newPKI(t, "gpu-002")
	files := TLSConfig{
		CAFile:   filepath.Join(p.dir, "ca.pem"),
		CertFile: filepath.Join(p.dir, "node.pem"),
		KeyFile:  filepath.Join(p.dir, "node-key.pem"),
	}
	for _, tc := range []struct {
		name, node, td, want string
	}{
		{"another node's certificate", "gpu-003", "", `spiffe://test.example/node/gpu-002, and this agent is node "gpu-003"`},
		{"another trust domain", "gpu-002", "fleet.example", "of trust domain test.example, not tls.trust_domain fleet.example"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t)
			cfg.Node, cfg.Insecure = tc.node, false
			cfg.TLS = files
			cfg.TLS.TrustDomain = tc.td
			a, err := New(cfg, &fakeHost{}, nopLogger())
			if err != nil {
				t.Fatal(err)
			}
			err = a.Run(context.Background())
			if !errors.Is(err, ErrWrongIdentity) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v, want %v naming %q", err, ErrWrongIdentity, tc.want)
			}
		})
	}
	// Its own node's certificate starts.
	cfg := testConfig(t)
	cfg.Node, cfg.Insecure, cfg.TLS = "gpu-002", false, files
	if _, _, err := transport(cfg, nopLogger()); err != nil {
		t.Fatalf("the right certificate: %v", err)
	}
}

// deniedCoord refuses every stream the way the coordinator refuses an
// identity, and notes when each came.
type deniedCoord struct {
	fleetcheckv1.UnimplementedAgentServiceServer
	code codes.Code
	mu   sync.Mutex
	at   []time.Time
}

func (d *deniedCoord) Connect(st grpc.BidiStreamingServer[fleetcheckv1.AgentMessage, fleetcheckv1.CoordinatorMessage]) error {
	d.mu.Lock()
	d.at = append(d.at, time.Now())
	d.mu.Unlock()
	if _, err := st.Recv(); err != nil {
		return err
	}
	return status.Error(d.code, `node:gpu-001 may not speak for node "gpu-009"`)
}

func (d *deniedCoord) attempts() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Time(nil), d.at...)
}

// longBackoff retries at once, except after a refusal of the identity.
type longBackoff struct{ longest time.Duration }

func (longBackoff) Next(int) time.Duration   { return time.Millisecond }
func (b longBackoff) Longest() time.Duration { return b.longest }

// Refused for who it is, the agent says so at error level and knocks at
// the longest interval, not as if the coordinator were down.
func TestIdentityRefusedBacksOffLongest(t *testing.T) {
	t.Parallel()
	for _, code := range []codes.Code{codes.PermissionDenied, codes.Unauthenticated} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			d := &deniedCoord{code: code}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer()
			fleetcheckv1.RegisterAgentServiceServer(srv, d)
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)
			cfg := testConfig(t)
			cfg.Coordinator = lis.Addr().String()
			const longest = 150 * time.Millisecond
			ta := startAgent(t, cfg, &fakeHost{}, nil, WithBackoff(longBackoff{longest: longest}))
			testwait.Until(t, 5*time.Second, "three attempts", func() bool { return len(d.attempts()) >= 3 })
			at := d.attempts()
			for i := 1; i < len(at); i++ {
				if gap := at[i].Sub(at[i-1]); gap < longest {
					t.Fatalf("attempt %d came %s after the last, want at least %s", i, gap, longest)
				}
			}
			logs := ta.logs.String()
			if !strings.Contains(logs, `"level":"error"`) || !strings.Contains(logs, "coordinator refused this agent's certificate") ||
				!strings.Contains(logs, `may not speak for node \"gpu-009\"`) {
				t.Fatalf("refusal not logged at error level with the reason:\n%s", logs)
			}
			if strings.Contains(logs, "cannot reach the coordinator") {
				t.Fatalf("a refusal logged as unreachable:\n%s", logs)
			}
		})
	}
}

// An agent whose own certificate expired is refused in the handshake,
// which gRPC reports as a broken connection: the agent says what it is
// and waits the longest interval, as for any refusal of its identity.
func TestExpiredCertificateSaysSo(t *testing.T) {
	t.Parallel()
	ca, err := pki.NewCA("fleet.test", pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	write := func(req pki.Request) pki.Files {
		leaf, err := ca.Issue(req)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		cert, key, err := pki.WriteLeaf(dir, leaf, false)
		if err != nil {
			t.Fatal(err)
		}
		caFile, err := pki.WriteCACert(dir, ca.Cert, false)
		if err != nil {
			t.Fatal(err)
		}
		return pki.Files{CertFile: cert, KeyFile: key, CAFile: caFile}
	}
	server := write(pki.Request{Kind: pki.KindCoordinator, Name: "coord", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	r, err := pki.NewReloader(server, pki.ReloaderOptions{CheckInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := pki.ServerCredentials(pki.ServerOptions{Reloader: r})
	if err != nil {
		t.Fatal(err)
	}
	d := &deniedCoord{code: codes.OK}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	fleetcheckv1.RegisterAgentServiceServer(srv, d)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	old := write(pki.Request{Kind: pki.KindNode, Name: "gpu-001", NotBefore: time.Now().Add(-48 * time.Hour), Validity: time.Hour})
	cfg := testConfig(t)
	cfg.Coordinator, cfg.Insecure = lis.Addr().String(), false
	cfg.TLS = TLSConfig{CAFile: old.CAFile, CertFile: old.CertFile, KeyFile: old.KeyFile}
	ta := startAgent(t, cfg, &fakeHost{}, nil, WithBackoff(longBackoff{longest: time.Hour}))
	testwait.Until(t, 5*time.Second, "the refusal logged", func() bool {
		return strings.Contains(ta.logs.String(), "expired at")
	})

	logs := ta.logs.String()
	if !strings.Contains(logs, `"level":"error"`) || !strings.Contains(logs, `"retry_in_ms":3600000`) ||
		strings.Contains(logs, "cannot reach the coordinator") {
		t.Fatalf("an expired certificate not reported as such:\n%s", logs)
	}
}
