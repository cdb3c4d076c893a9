package pki

import (
	"context"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"
)

// ServerCredentials are gRPC transport credentials over ServerConfig.
func ServerCredentials(opts ServerOptions) (credentials.TransportCredentials, error) {
	cfg, err := ServerConfig(opts)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

// ClientCredentials are gRPC transport credentials that build a fresh
// ClientConfig for every connection, so a reconnecting client uses the
// certificate and CA bundle on disk now, not those it started with.
func ClientCredentials(opts ClientOptions) (credentials.TransportCredentials, error) {
	if _, err := ClientConfig(opts); err != nil {
		return nil, err
	}
	return &clientCreds{opts: opts}, nil
}

type clientCreds struct {
	opts ClientOptions
}

var _ credentials.TransportCredentials = (*clientCreds)(nil)

func (c *clientCreds) tls() (credentials.TransportCredentials, error) {
	cfg, err := ClientConfig(c.opts)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(cfg), nil
}

func (c *clientCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc, err := c.tls()
	if err != nil {
		return nil, nil, err
	}
	return tc.ClientHandshake(ctx, authority, raw)
}

func (c *clientCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("pki: client credentials cannot accept connections")
}

func (c *clientCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.3", ServerName: c.opts.ServerName}
}

func (c *clientCreds) Clone() credentials.TransportCredentials {
	cp := *c
	return &cp
}

// OverrideServerName is part of gRPC's (deprecated) interface; it sets the
// name the server's certificate must hold.
func (c *clientCreds) OverrideServerName(name string) error {
	c.opts.ServerName = name
	return nil
}
