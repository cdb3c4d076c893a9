package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"
)

// Default lifetimes. A leaf lives a year because it is issued by hand;
// reloading lets an operator replace it without a restart.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultLeafValidity = 365 * 24 * time.Hour
	// backdate covers clocks a little behind the issuer's.
	backdate = 5 * time.Minute
)

// CA is a certificate authority that can sign leaves for one trust domain.
type CA struct {
	Cert        *x509.Certificate
	Key         crypto.Signer
	TrustDomain string
}

// CAOptions tune NewCA; the zero value is fine.
type CAOptions struct {
	Validity time.Duration    // default DefaultCAValidity
	Now      func() time.Time // default time.Now
}

// NewCA makes a self-signed ECDSA P-256 CA for trustDomain. Its URI SAN
// spiffe://TRUST_DOMAIN records the domain for later issuing, and name
// constraints keep it from vouching for SPIFFE IDs of other domains when
// its certificate is trusted next to other CAs: the domain is permitted
// and its subdomains (".DOMAIN", which Go's "DOMAIN" would also admit)
// excluded, since a subdomain is another trust domain. ChainIdentity
// holds CAs made before the exclusion to their exact domain as well.
func NewCA(trustDomain string, opts CAOptions) (*CA, error) {
	if err := ValidateTrustDomain(trustDomain); err != nil {
		return nil, err
	}
	validity := opts.Validity
	if validity <= 0 {
		validity = DefaultCAValidity
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ca key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	start := now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "fleetcheck CA " + trustDomain, Organization: []string{"fleetcheck"}},
		NotBefore:             start.Add(-backdate),
		NotAfter:              start.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		// Leaves only: no intermediate can be made under it.
		MaxPathLen:          0,
		MaxPathLenZero:      true,
		KeyUsage:            x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		URIs:                []*url.URL{{Scheme: "spiffe", Host: trustDomain}},
		PermittedURIDomains: []string{trustDomain},
		ExcludedURIDomains:  []string{"." + trustDomain},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create ca certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse ca certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key, TrustDomain: trustDomain}, nil
}

// CATrustDomain reads the trust domain a CA certificate records in its
// spiffe://TRUST_DOMAIN URI SAN. A CA from another PKI may have none.
func CATrustDomain(cert *x509.Certificate) (string, error) {
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" && (u.Path == "" || u.Path == "/") && u.RawQuery == "" && u.Fragment == "" {
			if err := ValidateTrustDomain(u.Host); err != nil {
				return "", fmt.Errorf("ca certificate: %w", err)
			}
			return u.Host, nil
		}
	}
	return "", errors.New("ca certificate names no trust domain (no spiffe://TRUST_DOMAIN URI SAN)")
}

// Request describes a leaf certificate to issue.
type Request struct {
	Kind Kind
	Name string
	// DNSNames and IPs are extra SANs: the addresses a coordinator is
	// reached at, or a node's host names.
	DNSNames []string
	IPs      []net.IP
	// NotBefore defaults to now; Validity to DefaultLeafValidity. Tests set
	// both to make expired certificates.
	NotBefore time.Time
	Validity  time.Duration
}

// Leaf is an issued certificate and its private key.
type Leaf struct {
	Identity Identity
	Cert     *x509.Certificate
	Key      crypto.Signer
}

// extKeyUsage says what a kind's certificate may do: an agent is a TLS
// client of the coordinator (server auth too, so the same certificate can
// serve a local endpoint); the coordinator serves agents and operators
// and may dial peers; an operator only calls.
func extKeyUsage(k Kind) []x509.ExtKeyUsage {
	if k == KindAdmin {
		return []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	return []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}
}

// Issue signs a new leaf for req with a fresh ECDSA P-256 key.
func (ca *CA) Issue(req Request) (*Leaf, error) {
	id := Identity{TrustDomain: ca.TrustDomain, Kind: req.Kind, Name: req.Name}
	if err := id.Validate(); err != nil {
		return nil, fmt.Errorf("issue certificate: %w", err)
	}
	for _, d := range req.DNSNames {
		if d == "" {
			return nil, errors.New("issue certificate: empty DNS name")
		}
	}
	validity := req.Validity
	if validity <= 0 {
		validity = DefaultLeafValidity
	}
	start := req.NotBefore
	if start.IsZero() {
		start = time.Now().Add(-backdate)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	end := start.Add(validity)
	// A leaf cannot outlive its CA's certificate: the chain would not
	// verify, and the validity shown would mislead.
	if end.After(ca.Cert.NotAfter) {
		end = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		// The common name is for people reading the certificate; identity
		// comes only from the URI SAN.
		Subject:               pkix.Name{CommonName: id.Name, Organization: []string{"fleetcheck " + string(id.Kind)}},
		NotBefore:             start,
		NotAfter:              end,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           extKeyUsage(id.Kind),
		URIs:                  []*url.URL{id.URL()},
		DNSNames:              req.DNSNames,
		IPAddresses:           req.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate for %s: %w", id, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse issued certificate: %w", err)
	}
	return &Leaf{Identity: id, Cert: cert, Key: key}, nil
}

// newSerial is a random 128-bit serial: unique without a counter to keep.
func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("certificate serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}
