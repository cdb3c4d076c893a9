package coordinator

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/ratelimit"
)

// Secure wires transport security and authorization from cfg into opts:
//
//   - with cfg.TLS: a pki.Reloader over the certificate files (replaced
//     files are served without a restart), mutual-TLS server credentials
//     (TLS 1.3, a client certificate chaining to ca_file required; failed
//     handshakes counted and logged through opts.Refusals), and the authz
//     interceptors, first in both chains so nothing runs for an
//     unauthorized caller, their refusal logs bounded by opts.Refusals;
//   - with cfg.Insecure: plaintext, and the authz interceptors in their
//     insecure mode, which let everyone in as "anonymous" (Start says so
//     loudly).
//
// Identify becomes PeerIdentity, which reads what authz proved. The
// Reloader is nil when insecure; run its Run to log reloads while no one
// connects.
func Secure(cfg Config, opts Options) (Options, *pki.Reloader, error) {
	switch {
	case cfg.Insecure && cfg.TLS.set():
		return opts, nil, errors.New("coordinator: insecure and tls both set; choose one")
	case !cfg.Insecure && !cfg.TLS.set():
		return opts, nil, fmt.Errorf("coordinator: %w", ErrNoTransportSecurity)
	}
	if opts.Refusals == nil {
		opts.Refusals = NewRefusals(opts.Logger, opts.Now)
	}
	a, err := authz.New(authz.Config{TrustDomain: cfg.TLS.TrustDomain, Insecure: cfg.Insecure, Logger: opts.Logger,
		Limit: opts.Refusals.Limit()})
	if err != nil {
		return opts, nil, fmt.Errorf("coordinator: %w", err)
	}
	var r *pki.Reloader
	if !cfg.Insecure {
		r, err = pki.NewReloader(pki.Files{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, CAFile: cfg.TLS.CAFile},
			pki.ReloaderOptions{Logger: opts.Logger})
		if err != nil {
			return opts, nil, fmt.Errorf("coordinator: %w", err)
		}
		creds, err := pki.ServerCredentials(pki.ServerOptions{Reloader: r, OnHandshakeError: opts.Refusals.HandshakeFailed})
		if err != nil {
			return opts, nil, fmt.Errorf("coordinator: %w", err)
		}
		opts.Credentials = creds
		opts.Certs = r
	}
	opts.UnaryInterceptors = append([]grpc.UnaryServerInterceptor{a.UnaryInterceptor()}, opts.UnaryInterceptors...)
	opts.StreamInterceptors = append([]grpc.StreamServerInterceptor{a.StreamInterceptor()}, opts.StreamInterceptors...)
	opts.Identify = PeerIdentity
	return opts, r, nil
}

// Reasons refusals are counted under (fleetcheck_refusals_suppressed_total)
// when past an identity's bound; authz adds its own (authz.Reason*).
const (
	ReasonOtherNode   = "other_node"    // a hello or result for a node the identity is not
	ReasonWorkNotSent = "work_not_sent" // a result for work never sent to the node
)

// RefusalReasons lists the reasons refusals are counted under, the
// coordinator's and authz's, for metrics that show each at 0.
func RefusalReasons() []string {
	return []string{ReasonOtherNode, ReasonWorkNotSent, authz.ReasonUnauthenticated, authz.ReasonForeignDomain,
		authz.ReasonMethodNotAllowed}
}

func refusalWords(reason string) string {
	switch reason {
	case ReasonOtherNode:
		return "identity speaks for another node"
	case ReasonWorkNotSent:
		return "result for work never sent to this node"
	}
	return reason
}

// Refusals bounds what refusals cost: per identity (or peer host, for
// callers without one) a token bucket of refusalBurst, refilled one per
// refusalRefill, pays for the log lines and refused events; the rest are
// only counted. One certificate claiming a new node name 2,000 times a
// second then writes refusalBurst rows, then one every refusalRefill.
// Refusals in the TLS handshake (plaintext, no or a refused certificate)
// are counted by reason and logged at most tlsLogBurst per reason, then
// one per tlsLogEvery with how many were not.
type Refusals struct {
	log   zerolog.Logger
	limit *ratelimit.Keyed // per identity, shared with authz
	tls   *ratelimit.Keyed // TLS failure logs, per reason

	mu         sync.Mutex
	handshakes map[string]uint64 // TLS handshake failures by reason
}

// Bounds of Refusals (docs/security.md).
const (
	refusalBurst  = 20
	refusalRefill = 30 * time.Second
	tlsLogBurst   = 10
	tlsLogEvery   = time.Minute
)

// NewRefusals builds the bounds; now is the clock (nil: time.Now).
func NewRefusals(log zerolog.Logger, now func() time.Time) *Refusals {
	return &Refusals{
		log:        log,
		limit:      ratelimit.New(ratelimit.Options{Burst: refusalBurst, Every: refusalRefill, Now: now}),
		tls:        ratelimit.New(ratelimit.Options{Burst: tlsLogBurst, Every: tlsLogEvery, Now: now}),
		handshakes: map[string]uint64{},
	}
}

// Limit is the per-identity bound, for authz.Config.Limit.
func (r *Refusals) Limit() *ratelimit.Keyed { return r.limit }

func (r *Refusals) allow(key, reason string) (bool, uint64) { return r.limit.Allow(key, reason) }

// HandshakeFailed counts a TLS handshake the coordinator refused or that
// broke, and logs it within bounds (pki.ServerOptions.OnHandshakeError).
func (r *Refusals) HandshakeFailed(peer net.Addr, reason pki.HandshakeReason, err error) {
	r.mu.Lock()
	r.handshakes[string(reason)]++
	r.mu.Unlock()
	ok, held := r.tls.Allow(string(reason), "tls_"+string(reason))
	if !ok {
		return
	}
	addr := ""
	if peer != nil {
		addr = peer.String()
	}
	ev := r.log.Warn()
	if reason == pki.HandshakeClosed {
		ev = r.log.Debug() // a port probe or a client giving up: no refusal
	}
	if held > 0 {
		ev = ev.Uint64("suppressed", held)
	}
	ev.Str("peer", addr).Str("reason", string(reason)).Err(err).Msg("tls handshake failed: " + reason.Words())
}

// Suppressed counts the refusals not logged or recorded, by reason.
func (r *Refusals) Suppressed() map[string]uint64 { return r.limit.Suppressed() }

// Handshakes counts failed TLS handshakes by reason.
func (r *Refusals) Handshakes() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]uint64, len(r.handshakes))
	for k, v := range r.handshakes {
		out[k] = v
	}
	return out
}
