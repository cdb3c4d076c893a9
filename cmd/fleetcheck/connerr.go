//go:build !node

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/pki"
)

// diagnoseTimeout bounds the second look diagnose takes.
const diagnoseTimeout = 5 * time.Second

// diagnose says why the coordinator could not be reached, when a TLS
// handshake of our own can tell: gRPC reports a refused certificate as
// "broken pipe" or "connection reset by peer" (in TLS 1.3 the client
// finishes before the server has judged its certificate, and the alert
// races the first write), and plaintext against TLS as "error reading
// server preface: EOF". It returns "" when it cannot tell more than gRPC.
func (f *opFlags) diagnose(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, diagnoseTimeout)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", f.addr)
	if err != nil {
		return ""
	}
	defer func() { _ = raw.Close() }() // a probe for the error message only
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	if f.insecure {
		return diagnosePlaintext(ctx, raw)
	}
	r, err := pki.NewReloader(pki.Files{CertFile: f.cert, KeyFile: f.key, CAFile: f.ca}, pki.ReloaderOptions{CheckInterval: -1})
	if err != nil {
		return ""
	}
	name := f.serverName
	if name == "" || f.atLeader {
		if host, _, err := net.SplitHostPort(f.addr); err == nil {
			name = host
		}
	}
	cfg, err := pki.ClientConfig(pki.ClientOptions{Reloader: r, ServerName: name, TrustDomain: f.trustDomain})
	if err != nil {
		return ""
	}
	cfg.NextProtos = []string{"h2"} // as gRPC offers; its server insists
	c := tls.Client(raw, cfg)
	if err := c.HandshakeContext(ctx); err != nil {
		return f.ourVerdict(err, name)
	}
	// Our side is done. The server's verdict on our certificate comes as
	// an alert; a server that let us in sends its HTTP/2 settings.
	_, err = c.Read(make([]byte, 1))
	return theirVerdict(err, r.Leaf(), time.Now())
}

// diagnosePlaintext tells a coordinator that expects TLS: it answers a
// TLS ClientHello with a TLS record. The probe hangs up at the first byte
// of the answer, so the coordinator sees a closed connection (logged at
// debug), not a client without a certificate.
func diagnosePlaintext(ctx context.Context, raw net.Conn) string {
	peek := &firstByte{Conn: raw}
	c := tls.Client(peek, &tls.Config{
		InsecureSkipVerify: true, //nolint:gosec // a probe: it ends before any certificate is read
		NextProtos:         []string{"h2"},
		MinVersion:         tls.VersionTLS12,
	})
	_ = c.HandshakeContext(ctx) // ends with errProbeDone, or the connection's error
	// 0x16: a handshake record (ServerHello); 0x15: an alert. Both are TLS.
	if peek.got && (peek.b == 0x16 || peek.b == 0x15) {
		return "the coordinator expects TLS; drop --insecure and give --cert, --key and --ca (an admin certificate: fleetcheck certs issue admin NAME)"
	}
	return ""
}

var errProbeDone = errors.New("probe done")

// firstByte lets a TLS client write its ClientHello and keeps the first
// byte the server answers, then ends the handshake.
type firstByte struct {
	net.Conn
	b   byte
	got bool
}

func (f *firstByte) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if n, err := f.Conn.Read(p[:1]); n == 1 {
		f.b, f.got = p[0], true
	} else if err != nil {
		return 0, err
	}
	return 0, errProbeDone
}

// ourVerdict words why we refused the coordinator's certificate, or why
// the handshake failed before either side judged one.
func (f *opFlags) ourVerdict(err error, name string) string {
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		return "the coordinator does not speak TLS (it runs with insecure: true); use --insecure only if that is intended"
	}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return fmt.Sprintf("the coordinator's certificate is not signed by --ca (%s)", f.ca)
	}
	if he, ok := errors.AsType[x509.HostnameError](err); ok {
		return fmt.Sprintf("the coordinator's certificate is not valid for %q (%v); give --server-name with a name it holds", name, he)
	}
	if cie, ok := errors.AsType[x509.CertificateInvalidError](err); ok && cie.Reason == x509.Expired {
		return "the coordinator's certificate is not valid now: " + cie.Detail
	}
	if code, ok := pki.AlertCode(err); ok && code == pki.AlertProtocolVersion {
		return "the coordinator refused our TLS version (it wants TLS 1.3)"
	}
	if errors.Is(err, pki.ErrCAOfOtherDomain) || errors.Is(err, pki.ErrNoIdentity) {
		return "the coordinator's certificate: " + err.Error()
	}
	return ""
}

// theirVerdict words the coordinator's refusal of our certificate, read
// from its alert; leaf is our certificate.
func theirVerdict(err error, leaf *x509.Certificate, now time.Time) string {
	code, ok := pki.AlertCode(err)
	if !ok {
		return ""
	}
	switch code {
	case pki.AlertCertificateExpired:
		switch {
		case leaf != nil && now.After(leaf.NotAfter):
			return fmt.Sprintf("coordinator refused our certificate: expired (not after %s)", leaf.NotAfter.UTC().Format(time.RFC3339))
		case leaf != nil && now.Before(leaf.NotBefore):
			return fmt.Sprintf("coordinator refused our certificate: not yet valid (not before %s)", leaf.NotBefore.UTC().Format(time.RFC3339))
		}
		return "coordinator refused our certificate as expired or not yet valid; compare its clock with ours"
	case pki.AlertUnknownCA:
		return "coordinator refused our certificate: not signed by a CA in its ca_file"
	case pki.AlertCertificateRequired:
		return "coordinator refused us: no certificate sent"
	case pki.AlertBadCertificate:
		return "coordinator refused our certificate (its log says why: tls handshake failed)"
	}
	return "coordinator refused the TLS handshake: " + err.Error()
}
