// Package authz decides who may call the coordinator's gRPC services. The
// transport (package pki) proves a peer's certificate chains to a trusted
// CA; here the certificate's SPIFFE ID becomes an Identity, the method is
// checked against a fixed policy, and the Identity travels in the context
// to the handlers:
//
//   - /fleetcheck.v1.AgentService/* only for node identities, and an agent
//     speaks only for its own node (CheckNode);
//   - /fleetcheck.v1.OperatorService/* and /fleetcheck.v1.CampaignService/*
//     only for admin identities;
//   - /fleetcheck.v1.RoutingService/* only for coordinator identities
//     (one coordinator sending work to another's agents);
//   - anything else is refused;
//   - the identity's trust domain must be the configured one, and every CA
//     in its verified chain that names trust domains must name exactly
//     that one (pki.ChainIdentity): a parent domain's CA in the bundle
//     vouches for nothing.
//
// An explicit insecure mode (plaintext, for the demo) lets everyone call
// everything as "anonymous" and says so loudly (WarnInsecure).
package authz

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/ratelimit"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Identity is who is calling: a certificate's identity, or Anonymous in
// insecure mode.
type Identity struct {
	pki.Identity
	// Anonymous is set in insecure mode, where no certificate says who
	// the peer is; Identity is then empty.
	Anonymous bool
	// Peer is the remote address, for logs and events.
	Peer string
}

// Actor is how logs and events name the caller: "node:gpu01",
// "admin:alice", "anonymous@10.0.0.5:40000".
func (id Identity) Actor() string {
	if id.Anonymous {
		if id.Peer == "" {
			return "anonymous"
		}
		return "anonymous@" + id.Peer
	}
	return string(id.Kind) + ":" + id.Name
}

// Config configures an Authorizer.
type Config struct {
	// TrustDomain is the only trust domain whose identities are let in.
	// Required unless Insecure.
	TrustDomain string
	// Insecure lets every caller call everything as Anonymous. It is for
	// plaintext demos and tests; call WarnInsecure when serving so.
	Insecure bool
	Logger   zerolog.Logger
	// Limit bounds the refusals logged per identity (per peer host when
	// there is none), so one hostile client cannot fill the log; the rest
	// are counted there by reason. Default: a limiter of its own. The
	// coordinator shares one with its refused events.
	Limit *ratelimit.Keyed
}

// Reasons refusals are counted under when not logged.
const (
	ReasonUnauthenticated  = "unauthenticated"
	ReasonForeignDomain    = "foreign_trust_domain"
	ReasonMethodNotAllowed = "method_not_allowed"
)

// Authorizer holds the policy; its interceptors enforce it.
type Authorizer struct {
	td       string
	insecure bool
	log      zerolog.Logger
	limit    *ratelimit.Keyed
	rules    []rule
}

// rule lets the kinds listed call every method of one service.
type rule struct {
	prefix string // "/package.Service/"
	kind   pki.Kind
}

// New checks cfg and builds an Authorizer.
func New(cfg Config) (*Authorizer, error) {
	if !cfg.Insecure {
		if err := pki.ValidateTrustDomain(cfg.TrustDomain); err != nil {
			return nil, fmt.Errorf("authz: %w", err)
		}
	}
	limit := cfg.Limit
	if limit == nil {
		limit = ratelimit.New(ratelimit.Options{})
	}
	return &Authorizer{
		td:       cfg.TrustDomain,
		insecure: cfg.Insecure,
		log:      cfg.Logger,
		limit:    limit,
		rules: []rule{
			{prefix: "/" + pb.AgentService_ServiceDesc.ServiceName + "/", kind: pki.KindNode},
			{prefix: "/" + pb.OperatorService_ServiceDesc.ServiceName + "/", kind: pki.KindAdmin},
			{prefix: "/" + pb.CampaignService_ServiceDesc.ServiceName + "/", kind: pki.KindAdmin},
			{prefix: "/" + pb.RemediationService_ServiceDesc.ServiceName + "/", kind: pki.KindAdmin},
			// Coordinators route work to each other's agents (docs/ha.md).
			{prefix: "/" + pb.RoutingService_ServiceDesc.ServiceName + "/", kind: pki.KindCoordinator},
		},
	}, nil
}

// Insecure reports whether the Authorizer lets everyone in.
func (a *Authorizer) Insecure() bool { return a.insecure }

// WarnInsecure is the banner an insecure coordinator logs when it starts:
// anyone who reaches the port can act as any node or operator.
func WarnInsecure(log zerolog.Logger, addr string) {
	log.Warn().Bool("insecure", true).Str("addr", addr).Msg(
		"!!! INSECURE MODE !!! plaintext gRPC, no client certificates, no authorization: " +
			"anyone who reaches " + addr + " can report results for any node and run operator commands. " +
			"Use only for demos and tests; serve with mTLS (fleetcheck certs) otherwise")
}

type ctxKey struct{}

// call is what the interceptors leave in the context.
type call struct {
	id     Identity
	method string
	log    zerolog.Logger
}

// IdentityFrom is the caller's identity, set by the interceptors.
func IdentityFrom(ctx context.Context) (Identity, bool) {
	c, ok := ctx.Value(ctxKey{}).(*call)
	if !ok {
		return Identity{}, false
	}
	return c.id, true
}

// WithIdentity returns a context carrying id, as the interceptors leave it;
// for handler tests that do not run a server.
func WithIdentity(ctx context.Context, id Identity, log zerolog.Logger) context.Context {
	method, _ := grpc.Method(ctx)
	return context.WithValue(ctx, ctxKey{}, &call{id: id, method: method, log: log})
}

// CheckNode says whether the caller may speak for node claimed: a node
// identity only for its own name; anonymous callers (insecure mode) for
// any. The coordinator calls it on the Hello and on every Result. A
// refusal is returned as PermissionDenied, not logged: the caller records
// it (the coordinator logs it and writes a refused event, both bounded
// per identity).
func CheckNode(ctx context.Context, claimed string) error {
	c, ok := ctx.Value(ctxKey{}).(*call)
	if !ok {
		// A wiring mistake, not the peer's: fail closed.
		return status.Error(codes.Internal, "authz: no identity in context (interceptor not installed)")
	}
	if c.id.Anonymous {
		return nil
	}
	if c.id.Kind == pki.KindNode && c.id.Name == claimed {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "%s may not speak for node %q", c.id.Actor(), claimed)
}

// UnaryInterceptor authorizes unary calls.
func (a *Authorizer) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := a.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor authorizes streaming calls.
func (a *Authorizer) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := a.authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &stream{ServerStream: ss, ctx: ctx})
	}
}

// stream hands the handler a context that carries the identity.
type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }

// authorize finds the caller, checks the policy and returns the context
// the handler gets.
func (a *Authorizer) authorize(ctx context.Context, method string) (context.Context, error) {
	var addr string
	p, ok := peer.FromContext(ctx)
	if ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	log := a.log.With().Str("peer", addr).Str("method", method).Logger()
	if a.insecure {
		id := Identity{Anonymous: true, Peer: addr}
		return context.WithValue(ctx, ctxKey{}, &call{id: id, method: method, log: log}), nil
	}

	id, err := a.identify(p)
	if err != nil {
		if ev := a.refusal(log, peerHost(addr), ReasonUnauthenticated); ev != nil {
			ev.Err(err).Msg("refused: no valid identity")
		}
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	id.Peer = addr
	log = log.With().Str("identity", id.String()).Logger()
	if id.TrustDomain != a.td {
		if ev := a.refusal(log, id.String(), ReasonForeignDomain); ev != nil {
			ev.Str("trust_domain", id.TrustDomain).Msg("refused: foreign trust domain")
		}
		return nil, status.Errorf(codes.PermissionDenied, "identity %s is not of trust domain %s", id, a.td)
	}
	if !a.allowed(id.Kind, method) {
		if ev := a.refusal(log, id.String(), ReasonMethodNotAllowed); ev != nil {
			ev.Msg("refused: identity may not call this method")
		}
		return nil, status.Errorf(codes.PermissionDenied, "%s may not call %s", id.Actor(), method)
	}
	return context.WithValue(ctx, ctxKey{}, &call{id: id, method: method, log: log}), nil
}

// refusal is the warn line for a refusal of key's, or nil when key's
// refusals are past their bound (counted under reason instead). A line
// after suppressed ones says how many were not logged.
func (a *Authorizer) refusal(log zerolog.Logger, key, reason string) *zerolog.Event {
	ok, held := a.limit.Allow(key, reason)
	if !ok {
		return nil
	}
	ev := log.Warn()
	if held > 0 {
		ev = ev.Uint64("suppressed", held)
	}
	return ev
}

// peerHost is the host of a peer address: unauthenticated clients are
// bounded per host, not per source port.
func peerHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// identify reads the verified client certificate. A certificate there
// without a verified chain means the transport was not set up to verify
// (not pki.ServerConfig), and is not trusted.
func (a *Authorizer) identify(p *peer.Peer) (Identity, error) {
	if p == nil {
		return Identity{}, errors.New("no peer information")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Identity{}, errors.New("connection is not TLS")
	}
	if len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return Identity{}, errors.New("no verified client certificate")
	}
	// The CAs that vouch for it must be of its own trust domain exactly.
	id, err := pki.ChainIdentity(info.State.VerifiedChains)
	if err != nil {
		return Identity{}, err
	}
	return Identity{Identity: id}, nil
}

func (a *Authorizer) allowed(kind pki.Kind, method string) bool {
	for _, r := range a.rules {
		if strings.HasPrefix(method, r.prefix) {
			return kind == r.kind
		}
	}
	return false
}

// Errors of AuthorizeOperator, for HTTP callers to map onto 401 and 403.
var (
	ErrUnauthenticated = errors.New("no valid client certificate")
	ErrForbidden       = errors.New("identity may not act as an operator")
)

// AuthorizeOperator applies the operator services' rule to a connection
// that is not gRPC (the web console): the verified client certificate in
// cs must name an admin of the trust domain, exactly as for
// OperatorService. Refusals are logged within the same bounds. In
// insecure mode everyone is Anonymous.
func (a *Authorizer) AuthorizeOperator(cs *tls.ConnectionState, addr net.Addr) (Identity, error) {
	p := &peer.Peer{Addr: addr}
	if cs != nil {
		p.AuthInfo = credentials.TLSInfo{State: *cs}
	}
	peerAddr := ""
	if addr != nil {
		peerAddr = addr.String()
	}
	if a.insecure {
		return Identity{Anonymous: true, Peer: peerAddr}, nil
	}
	log := a.log.With().Str("peer", peerAddr).Str("method", "console").Logger()
	id, err := a.identify(p)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	id.Peer = peerAddr
	if id.TrustDomain != a.td {
		if ev := a.refusal(log, id.String(), ReasonForeignDomain); ev != nil {
			ev.Str("trust_domain", id.TrustDomain).Msg("refused: foreign trust domain")
		}
		return Identity{}, fmt.Errorf("%w: %s is not of trust domain %s", ErrForbidden, id, a.td)
	}
	if id.Kind != pki.KindAdmin {
		if ev := a.refusal(log, id.String(), ReasonMethodNotAllowed); ev != nil {
			ev.Msg("refused: identity may not use the console")
		}
		return Identity{}, fmt.Errorf("%w: %s", ErrForbidden, id.Actor())
	}
	return id, nil
}
