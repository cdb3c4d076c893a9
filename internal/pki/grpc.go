package pki

import (
	"context"
	"errors"
	"net"
	"time"

	"google.golang.org/grpc/credentials"
)

// ServerCredentials are gRPC transport credentials over ServerConfig.
// A failed handshake is passed to opts.OnHandshakeError, with its reason:
// gRPC itself only tells its own logger.
func ServerCredentials(opts ServerOptions) (credentials.TransportCredentials, error) {
	cfg, err := ServerConfig(opts)
	if err != nil {
		return nil, err
	}
	tc := credentials.NewTLS(cfg)
	if opts.OnHandshakeError == nil {
		return tc, nil
	}
	return &serverCreds{TransportCredentials: tc, onErr: opts.OnHandshakeError}, nil
}

// serverCreds reports failed handshakes.
type serverCreds struct {
	credentials.TransportCredentials
	onErr func(peer net.Addr, reason HandshakeReason, err error)
}

func (c *serverCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.onErr(raw.RemoteAddr(), ClassifyHandshake(err, time.Now()), err)
	}
	return conn, info, err
}

func (c *serverCreds) Clone() credentials.TransportCredentials {
	return &serverCreds{TransportCredentials: c.TransportCredentials.Clone(), onErr: c.onErr}
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
	// grpc-go still takes the channel's authority from ServerName.
	return credentials.ProtocolInfo{SecurityProtocol: "tls", ServerName: c.opts.ServerName} //nolint:staticcheck // SA1019: see above
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
