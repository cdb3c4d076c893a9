package coordinator

import (
	"errors"
	"fmt"

	"google.golang.org/grpc"

	"github.com/fleetcheck/fleetcheck/authz"
	"github.com/fleetcheck/fleetcheck/pki"
)

// Secure wires transport security and authorization from cfg into opts:
//
//   - with cfg.TLS: a pki.Reloader over the certificate files (replaced
//     files are served without a restart), mutual-TLS server credentials
//     (TLS 1.3, a client certificate chaining to ca_file required), and
//     the authz interceptors, first in both chains so nothing runs for an
//     unauthorized caller;
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
	a, err := authz.New(authz.Config{TrustDomain: cfg.TLS.TrustDomain, Insecure: cfg.Insecure, Logger: opts.Logger})
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
		creds, err := pki.ServerCredentials(pki.ServerOptions{Reloader: r})
		if err != nil {
			return opts, nil, fmt.Errorf("coordinator: %w", err)
		}
		opts.Credentials = creds
	}
	opts.UnaryInterceptors = append([]grpc.UnaryServerInterceptor{a.UnaryInterceptor()}, opts.UnaryInterceptors...)
	opts.StreamInterceptors = append([]grpc.StreamServerInterceptor{a.StreamInterceptor()}, opts.StreamInterceptors...)
	opts.Identify = PeerIdentity
	return opts, r, nil
}
