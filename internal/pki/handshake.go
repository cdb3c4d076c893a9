package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"reflect"
	"strings"
	"syscall"
	"time"
)

// HandshakeReason says why a TLS handshake failed, in words stable
// enough for a metric label (fleetcheck_tls_handshake_failures_total).
type HandshakeReason string

const (
	HandshakePlaintext       HandshakeReason = "plaintext"        // the client does not speak TLS
	HandshakeNoCertificate   HandshakeReason = "no_certificate"   // the client sent none
	HandshakeUnknownCA       HandshakeReason = "unknown_ca"       // not signed by a CA in the bundle
	HandshakeExpired         HandshakeReason = "expired"          // past its not-after
	HandshakeNotYetValid     HandshakeReason = "not_yet_valid"    // before its not-before
	HandshakeNameNotAllowed  HandshakeReason = "name_not_allowed" // outside its CA's name constraints
	HandshakeWrongUsage      HandshakeReason = "wrong_usage"      // not valid for client (or server) auth
	HandshakeBadCertificate  HandshakeReason = "bad_certificate"  // refused for another reason
	HandshakeProtocolVersion HandshakeReason = "protocol_version" // older than TLS 1.3
	HandshakePeerRefused     HandshakeReason = "peer_refused"     // the other side refused ours (sent an alert)
	HandshakeClosed          HandshakeReason = "closed"           // the connection ended mid-handshake
	HandshakeTimeout         HandshakeReason = "timeout"
	HandshakeOther           HandshakeReason = "other"
)

// HandshakeReasons lists every reason, for metrics that show each at 0.
func HandshakeReasons() []HandshakeReason {
	return []HandshakeReason{HandshakePlaintext, HandshakeNoCertificate, HandshakeUnknownCA, HandshakeExpired,
		HandshakeNotYetValid, HandshakeNameNotAllowed, HandshakeWrongUsage, HandshakeBadCertificate,
		HandshakeProtocolVersion, HandshakePeerRefused, HandshakeClosed, HandshakeTimeout, HandshakeOther}
}

// Words says what a reason means to a person.
func (r HandshakeReason) Words() string {
	switch r {
	case HandshakePlaintext:
		return "client does not speak TLS (plaintext)"
	case HandshakeNoCertificate:
		return "client sent no certificate"
	case HandshakeUnknownCA:
		return "certificate not signed by a trusted CA"
	case HandshakeExpired:
		return "certificate expired"
	case HandshakeNotYetValid:
		return "certificate not yet valid"
	case HandshakeNameNotAllowed:
		return "certificate names an identity its CA may not vouch for"
	case HandshakeWrongUsage:
		return "certificate not valid for this use"
	case HandshakeBadCertificate:
		return "certificate refused"
	case HandshakeProtocolVersion:
		return "TLS version older than 1.3"
	case HandshakePeerRefused:
		return "the peer refused our certificate (its own error says why)"
	case HandshakeClosed:
		return "connection closed during the handshake"
	case HandshakeTimeout:
		return "handshake timed out"
	}
	return "handshake failed"
}

// ClassifyHandshake says why a handshake failed, on either side; now
// tells an expired certificate from one not valid yet (x509 calls both
// Expired).
func ClassifyHandshake(err error, now time.Time) HandshakeReason {
	if err == nil {
		return ""
	}
	if code, ok := AlertCode(err); ok {
		switch code {
		case AlertCertificateRequired:
			return HandshakeNoCertificate
		case AlertProtocolVersion:
			return HandshakeProtocolVersion
		}
		return HandshakePeerRefused
	}
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		return HandshakePlaintext
	}
	if cie, ok := errors.AsType[x509.CertificateInvalidError](err); ok {
		switch cie.Reason {
		case x509.Expired:
			if cie.Cert != nil && now.Before(cie.Cert.NotBefore) {
				return HandshakeNotYetValid
			}
			return HandshakeExpired
		case x509.CANotAuthorizedForThisName:
			return HandshakeNameNotAllowed
		case x509.IncompatibleUsage:
			return HandshakeWrongUsage
		}
		return HandshakeBadCertificate
	}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return HandshakeUnknownCA
	}
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return HandshakeBadCertificate
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return HandshakeTimeout
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return HandshakeTimeout
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) {
		return HandshakeClosed
	}
	// crypto/tls has no typed error for these two.
	msg := err.Error()
	switch {
	case strings.Contains(msg, "didn't provide a certificate"):
		return HandshakeNoCertificate
	case strings.Contains(msg, "unsupported versions"), strings.Contains(msg, "protocol version not supported"):
		return HandshakeProtocolVersion
	}
	return HandshakeOther
}

// TLS alert numbers (RFC 8446 §6) that ClassifyHandshake and callers
// telling refusals apart need.
const (
	AlertBadCertificate      uint8 = 42
	AlertCertificateExpired  uint8 = 45 // also sent for one not valid yet
	AlertUnknownCA           uint8 = 48
	AlertProtocolVersion     uint8 = 70
	AlertCertificateRequired uint8 = 116 // a TLS 1.3 client gave none
)

// AlertCode is the TLS alert the peer sent, when err carries one. In the
// handshake crypto/tls wraps it as tls.AlertError; after it (where a TLS
// 1.3 client learns that the server refused its certificate) as a
// net.OpError "remote error" around an unexported alert type, whose
// number is read here.
func AlertCode(err error) (uint8, bool) {
	if a, ok := errors.AsType[tls.AlertError](err); ok {
		return uint8(a), true
	}
	if oe, ok := errors.AsType[*net.OpError](err); ok && oe.Op == "remote error" && oe.Err != nil {
		if v := reflect.ValueOf(oe.Err); v.Kind() == reflect.Uint8 {
			return uint8(v.Uint()), true
		}
	}
	return 0, false
}
