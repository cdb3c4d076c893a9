package agent

import (
	"fmt"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetcheck/fleetcheck/pki"
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
	creds, err := pki.ClientCredentials(pki.ClientOptions{Reloader: r, ServerName: cfg.TLS.ServerName, TrustDomain: cfg.TLS.TrustDomain})
	if err != nil {
		return nil, nil, fmt.Errorf("agent tls identity: %w", err)
	}
	return creds, r, nil
}

// dialOptions is the one place that decides how the agent reaches the
// coordinator. extra (tests: an in-memory dialer) comes last.
func dialOptions(creds credentials.TransportCredentials, extra []grpc.DialOption) []grpc.DialOption {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Results can be large (many GPUs, many findings); the coordinator
		// bounds what it accepts.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16 << 20)),
	}
	return append(opts, extra...)
}
