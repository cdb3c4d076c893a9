package coordinator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"testing"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/internal/pki"
)

func TestPeerIdentity(t *testing.T) {
	t.Parallel()
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4242}
	// verified puts a certificate with uris where TLS leaves a verified
	// client certificate; unverified only where the peer sent it.
	withCert := func(verified bool, uris ...string) context.Context {
		cert := &x509.Certificate{}
		for _, u := range uris {
			pu, err := url.Parse(u)
			if err != nil {
				t.Fatal(err)
			}
			cert.URIs = append(cert.URIs, pu)
		}
		st := tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
		if verified {
			st.VerifiedChains = [][]*x509.Certificate{{cert}}
		}
		return peer.NewContext(context.Background(), &peer.Peer{Addr: addr, AuthInfo: credentials.TLSInfo{State: st}})
	}
	withAuthz := func(id authz.Identity) context.Context {
		return authz.WithIdentity(context.Background(), id, zerolog.Nop())
	}
	node := pki.Identity{TrustDomain: "fleet.example", Kind: pki.KindNode, Name: "gpu-017"}
	tests := []struct {
		name string
		ctx  context.Context
		want Identity
	}{
		{"no peer", context.Background(), Identity{Kind: Anonymous}},
		{"plaintext", peer.NewContext(context.Background(), &peer.Peer{Addr: addr}), Identity{Kind: Anonymous, Addr: "127.0.0.1:4242"}},
		{"node", withCert(true, "spiffe://fleet.example/node/gpu-017"), Identity{Kind: NodeIdentity, Name: "gpu-017", TrustDomain: "fleet.example", Addr: "127.0.0.1:4242"}},
		{"admin", withCert(true, "https://x.example/", "spiffe://fleet.example/admin/alice"), Identity{Kind: AdminIdentity, Name: "alice", TrustDomain: "fleet.example", Addr: "127.0.0.1:4242"}},
		{"unverified certificate", withCert(false, "spiffe://fleet.example/node/gpu-017"), Identity{Kind: Anonymous, Addr: "127.0.0.1:4242"}},
		{"other spiffe path", withCert(true, "spiffe://fleet.example/workload/x"), Identity{Kind: Anonymous, Addr: "127.0.0.1:4242"}},
		{"nested name", withCert(true, "spiffe://fleet.example/node/a/b"), Identity{Kind: Anonymous, Addr: "127.0.0.1:4242"}},
		{"coordinator certificate", withCert(true, "spiffe://fleet.example/coordinator/c1"), Identity{Kind: Anonymous, Addr: "127.0.0.1:4242"}},
		{"authz node", withAuthz(authz.Identity{Identity: node, Peer: "127.0.0.1:1"}), Identity{Kind: NodeIdentity, Name: "gpu-017", TrustDomain: "fleet.example", Addr: "127.0.0.1:1"}},
		{"authz anonymous", withAuthz(authz.Identity{Anonymous: true, Peer: "127.0.0.1:2"}), Identity{Kind: Anonymous, Addr: "127.0.0.1:2"}},
	}
	for _, tt := range tests {
		if got := PeerIdentity(tt.ctx); got != tt.want {
			t.Errorf("%s: got %+v, want %+v", tt.name, got, tt.want)
		}
	}
	if a := (Identity{Kind: NodeIdentity, Name: "gpu-017"}).Actor(); a != "node:gpu-017" {
		t.Errorf("Actor() = %q", a)
	}
	for ctx, want := range map[context.Context]string{
		context.Background(): "coordinator",
		withAuthz(authz.Identity{Identity: pki.Identity{TrustDomain: "fleet.example", Kind: pki.KindAdmin, Name: "alice"}}): "admin:alice",
		withAuthz(authz.Identity{Anonymous: true}):                    "anonymous",
		peer.NewContext(context.Background(), &peer.Peer{Addr: addr}): "anonymous@127.0.0.1:4242",
	} {
		if got := ActorFrom(ctx); got != want {
			t.Errorf("ActorFrom = %q, want %q", got, want)
		}
	}
}
