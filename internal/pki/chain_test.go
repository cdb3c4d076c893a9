package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"testing"
	"time"
)

// rawCA is a CA certificate made by hand, as older fleetcheck versions
// and other PKIs make them.
type rawCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func mkCert(t *testing.T, tmpl *x509.Certificate, parent *rawCA) *rawCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	}
	signer, signCert := key, tmpl
	if parent != nil {
		signer, signCert = parent.key, parent.cert
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signCert, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &rawCA{cert: c, key: key}
}

func caTmpl(name string, uris []string, permitted, excluded []string) *x509.Certificate {
	tmpl := &x509.Certificate{
		Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:            x509.KeyUsageCertSign,
		PermittedURIDomains: permitted, ExcludedURIDomains: excluded,
	}
	for _, u := range uris {
		tmpl.URIs = append(tmpl.URIs, &url.URL{Scheme: "spiffe", Host: u})
	}
	return tmpl
}

func leafTmpl(id string) *x509.Certificate {
	u, _ := url.Parse(id)
	return &x509.Certificate{
		Subject: pkix.Name{CommonName: "leaf"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		KeyUsage: x509.KeyUsageDigitalSignature, URIs: []*url.URL{u},
	}
}

// The chain's CAs decide, not only x509: Go's URI name constraint "test"
// also admits "fleet.test", so a CA of a parent domain in the bundle next
// to the real one would otherwise vouch for its admins.
func TestChainIdentity(t *testing.T) {
	t.Parallel()
	fleet, err := NewCA("fleet.test", CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ours := &rawCA{cert: fleet.Cert, key: fleet.Key.(*ecdsa.PrivateKey)}
	parent := mkCert(t, caTmpl("parent CA", []string{"test"}, []string{"test"}, nil), nil)
	// A CA as fleetcheck made them before subdomains were excluded.
	older := mkCert(t, caTmpl("older CA", []string{"fleet.test"}, []string{"fleet.test"}, nil), nil)
	corp := mkCert(t, caTmpl("corp root", nil, nil, nil), nil)
	corpMid := mkCert(t, caTmpl("corp issuing", nil, nil, nil), corp)
	childUnderParent := mkCert(t, caTmpl("child under parent", []string{"fleet.test"}, nil, nil), parent)
	pool := x509.NewCertPool()
	for _, c := range []*rawCA{ours, parent, older, corp} {
		pool.AddCert(c.cert)
	}

	cases := []struct {
		name    string
		issuer  *rawCA
		chain   []*rawCA // intermediates sent with the leaf
		id      string
		x509Err bool  // x509 refuses it already
		want    error // nil: accepted
	}{
		{"our CA, our admin", ours, nil, "spiffe://fleet.test/admin/alice", false, nil},
		{"our CA, our node", ours, nil, "spiffe://fleet.test/node/gpu-001", false, nil},
		{"parent CA, admin of the child domain", parent, nil, "spiffe://fleet.test/admin/mallory", false, ErrCAOfOtherDomain},
		{"parent CA, node of the child domain", parent, nil, "spiffe://fleet.test/node/gpu-001", false, ErrCAOfOtherDomain},
		{"parent CA, its own admin", parent, nil, "spiffe://test/admin/root", false, nil},
		{"our CA, a subdomain's admin", ours, nil, "spiffe://a.fleet.test/admin/mallory", true, nil},
		{"older CA, its exact domain", older, nil, "spiffe://fleet.test/admin/alice", false, nil},
		{"older CA, a subdomain's admin", older, nil, "spiffe://a.fleet.test/admin/mallory", false, ErrCAOfOtherDomain},
		{"a PKI that names no domain", corpMid, []*rawCA{corpMid}, "spiffe://fleet.test/node/gpu-007", false, nil},
		{"child-domain intermediate under the parent's root", childUnderParent, []*rawCA{childUnderParent},
			"spiffe://fleet.test/admin/mallory", false, ErrCAOfOtherDomain},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			leaf := mkCert(t, leafTmpl(tc.id), tc.issuer)
			mids := x509.NewCertPool()
			for _, c := range tc.chain {
				mids.AddCert(c.cert)
			}
			chains, err := leaf.cert.Verify(x509.VerifyOptions{Roots: pool, Intermediates: mids,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
			if tc.x509Err {
				var cie x509.CertificateInvalidError
				if !errors.As(err, &cie) || cie.Reason != x509.CANotAuthorizedForThisName {
					t.Fatalf("x509 verify: %v, want CANotAuthorizedForThisName", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("x509 verify: %v", err)
			}
			id, err := ChainIdentity(chains)
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == nil && id.String() != tc.id:
				t.Fatalf("identity %s, want %s", id, tc.id)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("got %v (identity %s), want %v", err, id, tc.want)
			}
		})
	}
}

func TestNewCAExcludesSubdomains(t *testing.T) {
	t.Parallel()
	ca, err := NewCA("fleet.test", CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ca.Cert.PermittedURIDomains; len(got) != 1 || got[0] != "fleet.test" {
		t.Errorf("permitted URI domains %v, want [fleet.test]", got)
	}
	if got := ca.Cert.ExcludedURIDomains; len(got) != 1 || got[0] != ".fleet.test" {
		t.Errorf("excluded URI domains %v, want [.fleet.test]", got)
	}
}
