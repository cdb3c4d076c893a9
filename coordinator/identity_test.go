package coordinator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

func TestPeerIdentity(t *testing.T) {
	t.Parallel()
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4242}
	withCert := func(uris ...string) context.Context {
		cert := &x509.Certificate{}
		for _, u := range uris {
			pu, err := url.Parse(u)
			if err != nil {
				t.Fatal(err)
			}
			cert.URIs = append(cert.URIs, pu)
		}
		info := credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}}
		return peer.NewContext(context.Background(), &peer.Peer{Addr: addr, AuthInfo: info})
	}
	tests := []struct {
		name string
		ctx  context.Context
		want Identity
	}{
		{"no peer", context.Background(), Identity{Kind: Anonymous}},
		{"plaintext", peer.NewContext(context.Background(), &peer.Peer{Addr: addr}), Identity{Kind: Anonymous, Addr: "127.0.0.1:4242"}},
		{"node", withCert("spiffe://fleet.example/node/gpu-017"), Identity{Kind: NodeIdentity, Name: "gpu-017", TrustDomain: "fleet.example", Addr: "127.0.0.1:4242"}},
		{"admin", withCert("https://x.example/", "spiffe://fleet.example/admin/alice"), Identity{Kind: AdminIdentity, Name: "alice", TrustDomain: "fleet.example", Addr: "127.0.0.1:4242"}},
		{"other spiffe path", withCert("spiffe://fleet.example/workload/x"), Identity{Kind: Anonymous, Addr: "127.0.0.1:4242"}},
		{"nested name", withCert("spiffe://fleet.example/node/a/b"), Identity{Kind: Anonymous, Addr: "127.0.0.1:4242"}},
	}
	for _, tt := range tests {
		if got := PeerIdentity(tt.ctx); got != tt.want {
			t.Errorf("%s: got %+v, want %+v", tt.name, got, tt.want)
		}
	}
	if a := (Identity{Kind: NodeIdentity, Name: "gpu-017"}).Actor(); a != "node:gpu-017" {
		t.Errorf("Actor() = %q", a)
	}
}
