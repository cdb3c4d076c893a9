package pki

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"
)

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "fleet.test")
	loopback := []net.IP{net.IPv4(127, 0, 0, 1)}
	coord := newTestReloader(t, ca.files(t, Request{Kind: KindCoordinator, Name: "coord", DNSNames: []string{"localhost"}, IPs: loopback}), -1)
	srvCfg, err := ServerConfig(ServerOptions{Reloader: coord})
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, srvCfg)

	node := newTestReloader(t, ca.files(t, Request{Kind: KindNode, Name: "gpu01"}), -1)
	foreign := newTestCA(t, "fleet.test")
	// A client trusting the right CA but holding a certificate of another.
	strangerFiles := foreign.files(t, Request{Kind: KindNode, Name: "gpu01"})
	strangerFiles.CAFile = node.Files().CAFile
	stranger := newTestReloader(t, strangerFiles, -1)

	expiredFiles := ca.files(t, Request{Kind: KindNode, Name: "old", NotBefore: time.Now().Add(-48 * time.Hour), Validity: time.Hour})
	expired := newTestReloader(t, expiredFiles, -1)

	client := func(r *Reloader, name, td string) *tls.Config {
		t.Helper()
		cfg, err := ClientConfig(ClientOptions{Reloader: r, ServerName: name, TrustDomain: td})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	tls12 := client(node, "127.0.0.1", "")
	tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	noCert := client(node, "127.0.0.1", "")
	noCert.GetClientCertificate = nil

	// A node certificate valid for server auth and for 127.0.0.1 poses as
	// the coordinator: only the trust-domain check tells it apart.
	impostorFiles := ca.files(t, Request{Kind: KindNode, Name: "evil", IPs: loopback})
	impostor := newTestReloader(t, impostorFiles, -1)
	impCfg, err := ServerConfig(ServerOptions{Reloader: impostor})
	if err != nil {
		t.Fatal(err)
	}
	impAddr := tlsServer(t, impCfg)

	cases := []struct {
		name   string
		addr   string
		cfg    *tls.Config
		reason string // "" when the handshake must succeed
	}{
		{"node by IP", addr, client(node, "127.0.0.1", ""), ""},
		{"node by DNS name", addr, client(node, "localhost", ""), ""},
		{"node checking the coordinator identity", addr, client(node, "localhost", "fleet.test"), ""},
		{"wrong server name", addr, client(node, "coord.example", ""), "not coord.example"},
		{"coordinator of another trust domain", addr, client(node, "localhost", "other.test"), "is not a coordinator of trust domain other.test"},
		{"TLS 1.2 client", addr, tls12, "protocol version not supported"},
		{"no client certificate", addr, noCert, "certificate required"},
		{"client certificate from an untrusted CA", addr, client(stranger, "localhost", ""), "unknown certificate authority"},
		{"expired client certificate", addr, client(expired, "localhost", ""), "expired certificate"},
		{"node posing as coordinator, no identity check", impAddr, client(node, "127.0.0.1", ""), ""},
		{"node posing as coordinator, identity checked", impAddr, client(node, "127.0.0.1", "fleet.test"), "node/evil is not a coordinator"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := dial(t, tc.addr, tc.cfg)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("dial: %v", err)
			case tc.reason != "" && err == nil:
				t.Fatalf("dial succeeded, want refusal %q", tc.reason)
			case tc.reason != "" && !strings.Contains(err.Error(), tc.reason):
				t.Fatalf("dial: %v, want refusal %q", err, tc.reason)
			}
		})
	}
}

func TestAdminCannotServe(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "fleet.test")
	admin := newTestReloader(t, ca.files(t, Request{Kind: KindAdmin, Name: "alice"}), -1)
	cfg, err := ServerConfig(ServerOptions{Reloader: admin})
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, cfg)
	node := newTestReloader(t, ca.files(t, Request{Kind: KindNode, Name: "gpu01"}), -1)
	ccfg, err := ClientConfig(ClientOptions{Reloader: node, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dial(t, addr, ccfg); err == nil {
		t.Fatal("a client-auth-only certificate served TLS")
	}
}

func TestConfigsNeedReloader(t *testing.T) {
	t.Parallel()
	if _, err := ServerConfig(ServerOptions{}); err == nil {
		t.Error("ServerConfig without a Reloader")
	}
	if _, err := ClientConfig(ClientOptions{}); err == nil {
		t.Error("ClientConfig without a Reloader")
	}
	if _, err := NewReloader(Files{CertFile: "a"}, ReloaderOptions{}); err == nil {
		t.Error("NewReloader with missing files")
	}
}
