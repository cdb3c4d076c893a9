package pki

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"
)

// handshakeServer accepts connections on 127.0.0.1 and runs the gRPC
// server credentials' handshake on each; it reports every failure's
// reason on the channel.
func handshakeServer(t *testing.T, r *Reloader) (string, <-chan HandshakeReason) {
	t.Helper()
	reasons := make(chan HandshakeReason, 4)
	creds, err := ServerCredentials(ServerOptions{Reloader: r, OnHandshakeError: func(_ net.Addr, why HandshakeReason, _ error) {
		reasons <- why
	}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				conn, _, err := creds.ServerHandshake(c)
				if err != nil {
					c.Close()
					return
				}
				_, _ = conn.Write([]byte{1})
				_, _ = io.Copy(io.Discard, conn)
				conn.Close()
			}()
		}
	}()
	return ln.Addr().String(), reasons
}

// Every way a client is refused in the handshake has its reason at the
// server (for the log and the metric) and, where TLS carries one, the
// alert the client reads tells it which.
func TestHandshakeReasons(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "fleet.test")
	coord := newTestReloader(t, ca.files(t, Request{Kind: KindCoordinator, Name: "coord", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}), -1)
	client := func(f Files) *tls.Config {
		t.Helper()
		cfg, err := ClientConfig(ClientOptions{Reloader: newTestReloader(t, f, -1), ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		cfg.NextProtos = []string{"h2"}
		return cfg
	}
	good := ca.files(t, Request{Kind: KindNode, Name: "gpu01"})
	stranger := newTestCA(t, "fleet.test").files(t, Request{Kind: KindNode, Name: "gpu01"})
	stranger.CAFile = good.CAFile
	expired := ca.files(t, Request{Kind: KindNode, Name: "old", NotBefore: time.Now().Add(-48 * time.Hour), Validity: time.Hour})
	future := ca.files(t, Request{Kind: KindNode, Name: "new", NotBefore: time.Now().Add(24 * time.Hour), Validity: time.Hour})
	noCert := client(good)
	noCert.GetClientCertificate = nil
	tls12 := client(good)
	tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12

	cases := []struct {
		name  string
		cfg   *tls.Config // nil: a plaintext HTTP/2 client
		want  HandshakeReason
		alert uint8 // what the client reads after its side finished; 0: none
	}{
		{"plaintext", nil, HandshakePlaintext, 0},
		{"no certificate", noCert, HandshakeNoCertificate, AlertCertificateRequired},
		{"another CA's certificate", client(stranger), HandshakeUnknownCA, AlertUnknownCA},
		{"expired", client(expired), HandshakeExpired, AlertCertificateExpired},
		{"not yet valid", client(future), HandshakeNotYetValid, AlertCertificateExpired},
		{"TLS 1.2", tls12, HandshakeProtocolVersion, 0},
		{"accepted", client(good), "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr, reasons := handshakeServer(t, coord)
			raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
			var readErr error
			if tc.cfg == nil {
				_, _ = raw.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
				_, readErr = raw.Read(make([]byte, 1))
			} else {
				c := tls.Client(raw, tc.cfg)
				if readErr = c.Handshake(); readErr == nil {
					_, readErr = c.Read(make([]byte, 1))
				}
			}
			if tc.want == "" {
				if readErr != nil {
					t.Fatalf("accepted client: %v", readErr)
				}
				return
			}
			select {
			case got := <-reasons:
				if got != tc.want {
					t.Fatalf("server reason %q, want %q", got, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the server reported no failure")
			}
			if tc.alert != 0 {
				if code, ok := AlertCode(readErr); !ok || code != tc.alert {
					t.Fatalf("client read %v (alert %d, %v), want alert %d", readErr, code, ok, tc.alert)
				}
				if got := ClassifyHandshake(readErr, time.Now()); tc.want == HandshakeNoCertificate && got != HandshakeNoCertificate {
					t.Fatalf("client side reason %q, want %q", got, HandshakeNoCertificate)
				}
			}
		})
	}
}
