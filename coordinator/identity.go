package coordinator

import (
	"context"
	"net/url"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// IdentityKind says what a peer is.
type IdentityKind string

const (
	// Anonymous peers have no certificate (the insecure mode): they are
	// trusted to be what they say.
	Anonymous     IdentityKind = "anonymous"
	NodeIdentity  IdentityKind = "node"
	AdminIdentity IdentityKind = "admin"
)

// Identity is who is on the other end of a call.
type Identity struct {
	Kind        IdentityKind
	Name        string // the node or admin name; empty when anonymous
	TrustDomain string
	Addr        string // the peer's address, for logs and events
}

// Actor is how events name this identity.
func (id Identity) Actor() string {
	switch id.Kind {
	case NodeIdentity, AdminIdentity:
		return string(id.Kind) + ":" + id.Name
	}
	if id.Addr != "" {
		return "anonymous@" + id.Addr
	}
	return "anonymous"
}

// IdentifyFunc finds the identity of a call's peer.
type IdentifyFunc func(ctx context.Context) Identity

// PeerIdentity reads the identity from the peer's TLS client certificate:
// its URI SAN spiffe://TRUST_DOMAIN/node/NAME or .../admin/NAME
// (DESIGN.md). A peer without a certificate is Anonymous. Verifying the
// chain is the transport credentials' job; this only reads the name.
func PeerIdentity(ctx context.Context) Identity {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{Kind: Anonymous}
	}
	id := Identity{Kind: Anonymous}
	if p.Addr != nil {
		id.Addr = p.Addr.String()
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return id
	}
	for _, u := range info.State.PeerCertificates[0].URIs {
		if kind, name, ok := parseSPIFFE(u); ok {
			id.Kind, id.Name, id.TrustDomain = kind, name, u.Host
			return id
		}
	}
	return id
}

func parseSPIFFE(u *url.URL) (IdentityKind, string, bool) {
	if u == nil || u.Scheme != "spiffe" || u.Host == "" {
		return "", "", false
	}
	kind, name, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", "", false
	}
	switch kind {
	case "node":
		return NodeIdentity, name, true
	case "admin":
		return AdminIdentity, name, true
	}
	return "", "", false
}
