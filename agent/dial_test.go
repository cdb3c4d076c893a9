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
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

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
	waitFor(t, "a result over TCP", 5*time.Second, func() bool { return c.stored() >= 1 })
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
	waitFor(t, "a result over mTLS", 5*time.Second, func() bool { return sc.stored() >= 1 })
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
