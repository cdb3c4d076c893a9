package agent

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// dialOptions is the one place that decides how the agent reaches the
// coordinator: transport security now, certificate reloading and
// interceptors later. extra (tests: an in-memory dialer) comes last.
func dialOptions(cfg *Config, extra []grpc.DialOption) ([]grpc.DialOption, error) {
	var creds credentials.TransportCredentials
	if cfg.Insecure {
		creds = insecure.NewCredentials()
	} else {
		tc, err := clientTLS(&cfg.TLS)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Results can be large (many GPUs, many findings); the coordinator
		// bounds what it accepts.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16 << 20)),
	}
	return append(opts, extra...), nil
}

// clientTLS builds the agent's mutual TLS: its node certificate, the
// coordinator's CA, TLS 1.3 only.
func clientTLS(c *TLSConfig) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: load certificate: %w", err)
	}
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, fmt.Errorf("tls: read ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls: ca_file %s holds no PEM certificate", c.CAFile)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   c.ServerName,
	}, nil
}
