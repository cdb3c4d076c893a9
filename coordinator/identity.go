package coordinator

import (
	"context"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/internal/pki"
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

// spiffeID is the identity as its certificate names it, for logs; an
// anonymous peer is its Actor.
func (id Identity) spiffeID() string {
	switch id.Kind {
	case NodeIdentity:
		return pki.Identity{TrustDomain: id.TrustDomain, Kind: pki.KindNode, Name: id.Name}.String()
	case AdminIdentity:
		return pki.Identity{TrustDomain: id.TrustDomain, Kind: pki.KindAdmin, Name: id.Name}.String()
	}
	return id.Actor()
}

// IdentifyFunc finds the identity of a call's peer.
type IdentifyFunc func(ctx context.Context) Identity

// PeerIdentity is the default IdentifyFunc. With the authz interceptors
// installed (Secure does) it is the identity they proved; without them it
// reads the verified client certificate itself, so a server given only
// transport credentials still tells nodes apart. A peer with neither is
// Anonymous.
func PeerIdentity(ctx context.Context) Identity {
	if id, ok := authz.IdentityFrom(ctx); ok {
		return fromAuthz(id)
	}
	id := Identity{Kind: Anonymous}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return id
	}
	if p.Addr != nil {
		id.Addr = p.Addr.String()
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return id
	}
	pid, err := pki.ChainIdentity(info.State.VerifiedChains)
	if err != nil {
		return id
	}
	return withKind(id, pid)
}

// fromAuthz maps authz's identity onto the coordinator's.
func fromAuthz(a authz.Identity) Identity {
	id := Identity{Kind: Anonymous, Addr: a.Peer}
	if a.Anonymous {
		return id
	}
	return withKind(id, a.Identity)
}

// withKind fills in a node or admin identity; any other kind (a
// coordinator's certificate) stays anonymous here, with no rights of a
// node or an operator.
func withKind(id Identity, p pki.Identity) Identity {
	switch p.Kind {
	case pki.KindNode:
		id.Kind = NodeIdentity
	case pki.KindAdmin:
		id.Kind = AdminIdentity
	default:
		return id
	}
	id.Name, id.TrustDomain = p.Name, p.TrustDomain
	return id
}

// ActorFrom names the caller of the RPC whose context ctx is, for the
// audit log: "admin:alice", "node:gpu-017", "anonymous@127.0.0.1:40000"
// in insecure mode, or "coordinator" when no call is behind ctx (a
// campaign acting on its own schedule).
func ActorFrom(ctx context.Context) string {
	if id, ok := authz.IdentityFrom(ctx); ok {
		return id.Actor()
	}
	if _, ok := peer.FromContext(ctx); ok {
		return PeerIdentity(ctx).Actor()
	}
	return "coordinator"
}
