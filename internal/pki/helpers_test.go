package pki

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// testCA is a CA whose files live in a test's temporary directory.
type testCA struct {
	*CA
	dir string
}

func newTestCA(t *testing.T, td string) *testCA {
	t.Helper()
	ca, err := NewCA(td, CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, _, err := WriteCA(dir, ca, false); err != nil {
		t.Fatal(err)
	}
	return &testCA{CA: ca, dir: dir}
}

// files issues req and writes it, with the CA bundle, into a new directory.
func (c *testCA) files(t *testing.T, req Request) Files {
	t.Helper()
	leaf, err := c.Issue(req)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile, err := WriteLeaf(dir, leaf, false)
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := WriteCACert(dir, c.Cert, false)
	if err != nil {
		t.Fatal(err)
	}
	return Files{CertFile: certFile, KeyFile: keyFile, CAFile: caFile}
}

func newTestReloader(t *testing.T, f Files, interval time.Duration) *Reloader {
	t.Helper()
	r, err := NewReloader(f, ReloaderOptions{CheckInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// tlsServer serves TLS with cfg on 127.0.0.1 and completes each handshake
// (a client only learns of a refused certificate once the server reads).
func tlsServer(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
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
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if err := c.(*tls.Conn).Handshake(); err != nil {
					return
				}
				// One byte proves the client was let in.
				_, _ = c.Write([]byte{1})
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// dial connects with cfg and reads the server's byte: it fails if either
// side refused the handshake. It returns the server's leaf serial.
func dial(t *testing.T, addr string, cfg *tls.Config) (string, error) {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return "", err
	}
	cs := c.ConnectionState()
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("no server certificate")
	}
	return cs.PeerCertificates[0].SerialNumber.Text(16), nil
}

// replaceFiles copies src's files over dst's by atomic rename, as a
// deployment tool would.
func replaceFiles(t *testing.T, src, dst Files) {
	t.Helper()
	for _, p := range [][2]string{{src.KeyFile, dst.KeyFile}, {src.CertFile, dst.CertFile}, {src.CAFile, dst.CAFile}} {
		data, err := os.ReadFile(p[0])
		if err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(filepath.Dir(p[1]), ".incoming")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, p[1]); err != nil {
			t.Fatal(err)
		}
	}
}
