package agent

import (
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetcheck/fleetcheck/internal/pki"
)

// transport builds the agent's transport credentials, once per agent:
// plaintext when the config says insecure, else mutual TLS 1.3 with the
// node's certificate. The certificate, key and CA bundle are read through
// one pki.Reloader, so a renewed certificate or CA bundle is used from the
// next connection on without a restart; the Reloader is nil when
// insecure.
func transport(cfg *Config, log zerolog.Logger) (credentials.TransportCredentials, *pki.Reloader, error) {
	if cfg.Insecure {
		return insecure.NewCredentials(), nil, nil
	}
	r, err := pki.NewReloader(pki.Files{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, CAFile: cfg.TLS.CAFile},
		pki.ReloaderOptions{Logger: log})
	if err != nil {
		return nil, nil, fmt.Errorf("agent tls identity: %w", err)
	}
	if err := checkIdentity(cfg, r.Leaf()); err != nil {
		return nil, nil, err
	}
	creds, err := pki.ClientCredentials(pki.ClientOptions{Reloader: r, ServerName: cfg.TLS.ServerName, TrustDomain: cfg.TLS.TrustDomain})
	if err != nil {
		return nil, nil, fmt.Errorf("agent tls identity: %w", err)
	}
	return creds, r, nil
}

// ErrWrongIdentity is returned at start when the agent's certificate does
// not name its node: the coordinator would refuse every connection.
var ErrWrongIdentity = errors.New("agent certificate does not name this node")

// checkIdentity says whether the certificate speaks for cfg.Node: its
// SPIFFE ID must be spiffe://TRUST_DOMAIN/node/NODE, of tls.trust_domain
// when that is set.
func checkIdentity(cfg *Config, leaf *x509.Certificate) error {
	want := "spiffe://" + orWord(cfg.TLS.TrustDomain, "TRUST_DOMAIN") + "/node/" + cfg.Node
	id, err := pki.ParseIdentity(leaf)
	if err != nil {
		return fmt.Errorf("%w: %s holds no node identity (%w); want %s (fleetcheck certs issue node %s)",
			ErrWrongIdentity, cfg.TLS.CertFile, err, want, cfg.Node)
	}
	switch {
	case id.Kind != pki.KindNode || id.Name != cfg.Node:
		return fmt.Errorf("%w: %s is %s, and this agent is node %q (want %s): the coordinator would refuse it; "+
			"issue one with fleetcheck certs issue node %s, or fix node: in the config",
			ErrWrongIdentity, cfg.TLS.CertFile, id, cfg.Node, want, cfg.Node)
	case cfg.TLS.TrustDomain != "" && id.TrustDomain != cfg.TLS.TrustDomain:
		return fmt.Errorf("%w: %s is %s, of trust domain %s, not tls.trust_domain %s",
			ErrWrongIdentity, cfg.TLS.CertFile, id, id.TrustDomain, cfg.TLS.TrustDomain)
	}
	return nil
}

// certNotValid says why the agent's own certificate cannot be let in now
// (expired, not yet valid), or "": the coordinator refuses such a
// certificate in the handshake, which gRPC reports as a broken connection.
func (a *Agent) certNotValid(now time.Time) string {
	if a.certs == nil {
		return ""
	}
	leaf := a.certs.Leaf()
	switch {
	case now.After(leaf.NotAfter):
		return fmt.Sprintf("this agent's certificate %s expired at %s; the coordinator refuses it (renew it: the file is reread at the next attempt)",
			a.cfg.TLS.CertFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return fmt.Sprintf("this agent's certificate %s is not valid before %s; the coordinator refuses it (check this host's clock)",
			a.cfg.TLS.CertFile, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return ""
}

func orWord(s, word string) string {
	if s == "" {
		return word
	}
	return s
}

// dialOptions is the one place that decides how the agent reaches the
// coordinator. authority, when set, is the name the coordinator's
// certificate must hold while the target is one of its addresses. extra
// (tests: an in-memory dialer) comes last.
func dialOptions(creds credentials.TransportCredentials, authority string, extra []grpc.DialOption) []grpc.DialOption {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Results can be large (many GPUs, many findings); the coordinator
		// bounds what it accepts.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16 << 20)),
	}
	if authority != "" {
		opts = append(opts, grpc.WithAuthority(authority))
	}
	return append(opts, extra...)
}
