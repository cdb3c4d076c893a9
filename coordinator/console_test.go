package coordinator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/coordinator/console"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// TestConsoleServedWithTheCoordinatorsTLS: the console is on its own
// address, HTTPS with the coordinator's certificate; it shows the stored
// nodes with their live connection to an admin and refuses a node.
func TestConsoleServedWithTheCoordinatorsTLS(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	f := ca.files(pki.Request{Kind: pki.KindCoordinator, Name: "coord", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	cfg := Config{
		Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), HeartbeatInterval: time.Second,
		TLS:     TLSConfig{CertFile: f.CertFile, KeyFile: f.KeyFile, CAFile: f.CAFile, TrustDomain: testTD},
		Console: console.Config{Enabled: true, Listen: "127.0.0.1:0"},
	}
	opts, _, err := Secure(cfg, Options{Logger: zerolog.Nop(), Version: "test"})
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
	t.Cleanup(func() { stopServer(t, s) })
	url := s.ConsoleURL()
	if !strings.HasPrefix(url, "https://127.0.0.1:") || url == "https://"+s.GRPCAddr().String()+"/" {
		t.Fatalf("console at %q, want its own https address on 127.0.0.1", url)
	}
	a, err := connectCreds(t, s, ca.creds(pki.KindNode, "gpu-7"), "gpu-7")
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	testwait.Until(t, 10*time.Second, "gpu-7 stored", func() bool { return nodeOf(t, s, "gpu-7").Name != "" })

	pool := x509.NewCertPool()
	pool.AddCert(ca.ca.Cert)
	client := func(kind pki.Kind, name string) *http.Client {
		f := ca.files(pki.Request{Kind: kind, Name: name})
		pair, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS13}}}
	}
	for _, tc := range []struct {
		kind pki.Kind
		code int
		want string
	}{
		{pki.KindAdmin, http.StatusOK, `data-node="gpu-7"`},
		{pki.KindNode, http.StatusForbidden, "may not act as an operator"},
		{pki.KindCoordinator, http.StatusForbidden, ""},
	} {
		resp, err := client(tc.kind, "x").Get(url + "fleet")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s certificate: %d, want %d with %q\n%.400s", tc.kind, resp.StatusCode, tc.code, tc.want, body)
		}
	}
}

func TestConsoleNeedsTLSOrInsecure(t *testing.T) {
	t.Parallel()
	_, err := ParseConfig([]byte("data_dir: /x\nconsole: {enabled: true}\n"))
	if err == nil || !strings.Contains(err.Error(), "console: needs tls:") {
		t.Errorf("a console with neither tls nor insecure: %v", err)
	}
	if _, err := ParseConfig([]byte("data_dir: /x\ninsecure: true\nconsole: {enabled: true, listen: nowhere}\n")); err == nil || !strings.Contains(err.Error(), "console.listen") {
		t.Errorf("a bad console.listen: %v", err)
	}
}
