package pki

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
)

// ServerOptions configure ServerConfig.
type ServerOptions struct {
	// Reloader supplies the server's certificate and the CAs its clients'
	// certificates must chain to.
	Reloader *Reloader
	// NextProtos are the ALPN protocols offered. gRPC adds "h2" itself;
	// set this for other servers.
	NextProtos []string
	// OnHandshakeError, when set, hears of every failed handshake of
	// ServerCredentials, with why (a refused certificate, plaintext);
	// it must not block.
	OnHandshakeError func(peer net.Addr, reason HandshakeReason, err error)
}

// ServerConfig is a mutual-TLS server configuration: TLS 1.3 only, a
// client certificate required and verified against the current CA pool,
// the current certificate served. Every handshake reads the Reloader, so
// replaced files take effect without a restart.
//
// Who the client is, and what it may do, is authorization's business
// (package authz): this only proves the certificate chains to a trusted CA
// and is valid for client authentication.
func ServerConfig(opts ServerOptions) (*tls.Config, error) {
	r := opts.Reloader
	if r == nil {
		return nil, errors.New("tls server: no certificate source")
	}
	protos := append([]string(nil), opts.NextProtos...)
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAndVerifyClientCert,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			r.maybeCheck()
			m := r.cur.Load()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    m.pool,
				Certificates: []tls.Certificate{*m.cert},
				NextProtos:   protos,
				// A resumed session skips chain verification, so a CA
				// dropped from the bundle would still be let in; agents
				// reconnect rarely enough to afford full handshakes.
				SessionTicketsDisabled: true,
			}, nil
		},
	}, nil
}

// ClientOptions configure ClientConfig and ClientCredentials.
type ClientOptions struct {
	// Reloader supplies the client's certificate and the CAs the server's
	// certificate must chain to.
	Reloader *Reloader
	// ServerName is the name the server's certificate must hold (DNS or IP
	// SAN). Empty: gRPC uses the host of the dial target; a plain
	// tls.Dial needs it set.
	ServerName string
	// TrustDomain, when set, also requires the server to hold the SPIFFE
	// ID spiffe://TRUST_DOMAIN/coordinator/NAME: a node's certificate,
	// valid for server auth too, then cannot pose as the coordinator even
	// if it carries the coordinator's address. Leave it empty for a
	// server certificate without a SPIFFE ID (another PKI's).
	TrustDomain string
}

// ClientConfig is a mutual-TLS client configuration as of now: TLS 1.3
// only, the server's chain verified against the current CA pool and its
// name checked, the client certificate read from the Reloader at each
// handshake. The CA pool is fixed when it is built: use ClientCredentials
// with gRPC, which builds one per connection.
func ClientConfig(opts ClientOptions) (*tls.Config, error) {
	r := opts.Reloader
	if r == nil {
		return nil, errors.New("tls client: no certificate source")
	}
	if opts.TrustDomain != "" {
		if err := ValidateTrustDomain(opts.TrustDomain); err != nil {
			return nil, fmt.Errorf("tls client: %w", err)
		}
	}
	r.maybeCheck()
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    r.CAPool(),
		ServerName: opts.ServerName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.Certificate(), nil
		},
	}
	if td := opts.TrustDomain; td != "" {
		// Runs after the standard chain and name verification.
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("server sent no certificate")
			}
			// The chain's CAs must be of the coordinator's own domain
			// too: a parent domain's CA in the bundle vouches for nothing.
			id, err := ChainIdentity(cs.VerifiedChains)
			if err != nil {
				return fmt.Errorf("server identity: %w", err)
			}
			if id.TrustDomain != td || id.Kind != KindCoordinator {
				return fmt.Errorf("server identity %s is not a coordinator of trust domain %s", id, td)
			}
			return nil
		}
	}
	return cfg, nil
}
