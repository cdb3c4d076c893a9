package authz

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"testing"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/pki"
)

// TestAuthorizeOperator holds the web console's door to the operator
// services' rule: an admin of the trust domain, nobody else.
func TestAuthorizeOperator(t *testing.T) {
	t.Parallel()
	const td = "fleet.test"
	ca, err := pki.NewCA(td, pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("other.test", pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// state is what a TLS server that verified the leaf against its CA
	// leaves for the handler.
	state := func(issuer *pki.CA, kind pki.Kind, name string) *tls.ConnectionState {
		leaf, err := issuer.Issue(pki.Request{Kind: kind, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf.Cert},
			VerifiedChains: [][]*x509.Certificate{{leaf.Cert, issuer.Cert}}}
	}
	a, err := New(Config{TrustDomain: td, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4000}
	for _, tc := range []struct {
		name  string
		cs    *tls.ConnectionState
		actor string
		err   error
	}{
		{"admin", state(ca, pki.KindAdmin, "alice"), "admin:alice", nil},
		{"node", state(ca, pki.KindNode, "gpu-1"), "", ErrForbidden},
		{"coordinator", state(ca, pki.KindCoordinator, "c"), "", ErrForbidden},
		{"other trust domain", state(other, pki.KindAdmin, "mallory"), "", ErrForbidden},
		{"no certificate", nil, "", ErrUnauthenticated},
		{"not verified", &tls.ConnectionState{PeerCertificates: state(ca, pki.KindAdmin, "x").PeerCertificates}, "", ErrUnauthenticated},
	} {
		id, err := a.AuthorizeOperator(tc.cs, addr)
		if !errors.Is(err, tc.err) || err == nil && id.Actor() != tc.actor {
			t.Errorf("%s: %v %q, want %v %q", tc.name, err, id.Actor(), tc.err, tc.actor)
		}
	}
	ins, err := New(Config{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	if id, err := ins.AuthorizeOperator(nil, addr); err != nil || id.Actor() != "anonymous@127.0.0.1:4000" {
		t.Errorf("insecure: %v %q", err, id.Actor())
	}
}
