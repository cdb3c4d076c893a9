package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestIssueAndVerify(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "fleet.test")
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)

	if !ca.Cert.IsCA || ca.Cert.MaxPathLen != 0 || !ca.Cert.MaxPathLenZero {
		t.Fatalf("CA: IsCA=%v MaxPathLen=%d", ca.Cert.IsCA, ca.Cert.MaxPathLen)
	}
	if td, err := CATrustDomain(ca.Cert); err != nil || td != "fleet.test" {
		t.Fatalf("CATrustDomain = %q, %v", td, err)
	}

	cases := []struct {
		req        Request
		clientAuth bool
		serverAuth bool
	}{
		{Request{Kind: KindNode, Name: "gpu01", DNSNames: []string{"gpu01.example"}}, true, true},
		{Request{Kind: KindAdmin, Name: "alice"}, true, false},
		{Request{Kind: KindCoordinator, Name: "coord", DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}, true, true},
	}
	for _, tc := range cases {
		t.Run(string(tc.req.Kind), func(t *testing.T) {
			t.Parallel()
			leaf, err := ca.Issue(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			id, err := ParseIdentity(leaf.Cert)
			if err != nil {
				t.Fatal(err)
			}
			want := Identity{TrustDomain: "fleet.test", Kind: tc.req.Kind, Name: tc.req.Name}
			if id != want || leaf.Identity != want {
				t.Fatalf("identity %+v, leaf says %+v, want %+v", id, leaf.Identity, want)
			}
			verify := func(u x509.ExtKeyUsage) error {
				_, err := leaf.Cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{u}})
				return err
			}
			if err := verify(x509.ExtKeyUsageClientAuth); (err == nil) != tc.clientAuth {
				t.Errorf("client auth: %v, want ok=%v", err, tc.clientAuth)
			}
			if err := verify(x509.ExtKeyUsageServerAuth); (err == nil) != tc.serverAuth {
				t.Errorf("server auth: %v, want ok=%v", err, tc.serverAuth)
			}
			if leaf.Cert.IsCA {
				t.Error("leaf is a CA")
			}
		})
	}
}

func TestIssueRefusesBadRequests(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "fleet.test")
	for _, req := range []Request{
		{Kind: KindNode, Name: ".."},
		{Kind: KindNode, Name: "a/b"},
		{Kind: KindNode, Name: ""},
		{Kind: "root", Name: "x"},
		{Kind: KindCoordinator, Name: "c", DNSNames: []string{""}},
	} {
		if _, err := ca.Issue(req); err == nil {
			t.Errorf("Issue(%+v) succeeded", req)
		}
	}
}

func TestLeafNeverOutlivesCA(t *testing.T) {
	t.Parallel()
	ca, err := NewCA("fleet.test", CAOptions{Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(Request{Kind: KindNode, Name: "n", Validity: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if leaf.Cert.NotAfter.After(ca.Cert.NotAfter) {
		t.Fatalf("leaf ends %v, after its CA (%v)", leaf.Cert.NotAfter, ca.Cert.NotAfter)
	}
}

// The CA's name constraint stops its key from vouching for another trust
// domain's identities, should a bundle trust it next to other CAs.
func TestCANameConstraint(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "fleet.test")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7),
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{{Scheme: "spiffe", Host: "other.test", Path: "/admin/root"}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	_, err = cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	var cie x509.CertificateInvalidError
	if !errors.As(err, &cie) || cie.Reason != x509.CANotAuthorizedForThisName {
		t.Fatalf("verify of a foreign-domain leaf: %v, want CANotAuthorizedForThisName", err)
	}
}

func TestWriteAndLoad(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "fleet.test")
	for name, want := range map[string]os.FileMode{CACertFile: 0o644, CAKeyFile: 0o600} {
		fi, err := os.Stat(filepath.Join(ca.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode %v, want %v", name, fi.Mode().Perm(), want)
		}
	}

	loaded, err := LoadCA(ca.dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Cert.Equal(ca.Cert) || loaded.TrustDomain != "fleet.test" {
		t.Fatalf("loaded CA differs: %s", loaded.TrustDomain)
	}
	if _, err := LoadCA(ca.dir, "other.test"); err == nil {
		t.Error("LoadCA accepted a trust domain the certificate contradicts")
	}

	// Never replace keys without force.
	other, err := NewCA("fleet.test", CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := WriteCA(ca.dir, other, false); !errors.Is(err, ErrExists) {
		t.Fatalf("WriteCA over an existing CA: %v, want ErrExists", err)
	}
	if _, err := LoadCA(ca.dir, ""); err != nil {
		t.Fatalf("the refused write damaged the CA: %v", err)
	}

	leaf, err := loaded.Issue(Request{Kind: KindNode, Name: "gpu01"})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "gpu01")
	certFile, keyFile, err := WriteLeaf(out, leaf, false)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(certFile) != "node-gpu01.crt" || filepath.Base(keyFile) != "node-gpu01.key" {
		t.Errorf("files %s, %s", certFile, keyFile)
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v, %v", fi, err)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("out dir: %v, %v", fi, err)
	}
	if _, _, err := WriteLeaf(out, leaf, false); !errors.Is(err, ErrExists) {
		t.Errorf("second WriteLeaf: %v, want ErrExists", err)
	}
	if _, _, err := WriteLeaf(out, leaf, true); err != nil {
		t.Errorf("WriteLeaf with force: %v", err)
	}
	if _, err := WriteCACert(out, ca.Cert, false); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteCACert(out, ca.Cert, false); err != nil {
		t.Errorf("writing the same CA certificate again: %v", err)
	}
	if _, err := WriteCACert(out, other.Cert, false); !errors.Is(err, ErrExists) {
		t.Errorf("replacing the CA certificate without force: %v, want ErrExists", err)
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 {
		t.Errorf("%d files in %s, want 3 (no temporary files left)", len(entries), out)
	}
}

func TestLoadCARefusesMismatchedKey(t *testing.T) {
	t.Parallel()
	a := newTestCA(t, "fleet.test")
	b := newTestCA(t, "fleet.test")
	data, err := os.ReadFile(filepath.Join(b.dir, CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.dir, CAKeyFile), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(a.dir, ""); err == nil {
		t.Fatal("LoadCA accepted a key of another CA")
	}
}

func TestParseKeyPEMFormats(t *testing.T) {
	t.Parallel()
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sec1, err := x509.MarshalECPrivateKey(ec)
	if err != nil {
		t.Fatal(err)
	}
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := EncodeKey(ec)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"pkcs8": pkcs8,
		"sec1":  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}),
		"pkcs1": pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rk)}),
	} {
		if _, err := ParseKeyPEM(data); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := ParseKeyPEM([]byte("not pem")); err == nil {
		t.Error("ParseKeyPEM accepted garbage")
	}
}
