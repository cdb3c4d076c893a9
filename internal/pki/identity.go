// Package pki issues and reads fleetcheck's certificates and builds the
// mutual-TLS configurations that carry them. An identity is a SPIFFE ID in
// a URI SAN (docs/design.md "Identities"): spiffe://TRUST_DOMAIN/node/NODE for an
// agent, .../admin/NAME for an operator, .../coordinator/NAME for the
// coordinator. Nothing else in a certificate names its holder, so
// certificates from any PKI that writes the same SANs work alike.
package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Kind says what holds an identity.
type Kind string

const (
	KindNode        Kind = "node"
	KindAdmin       Kind = "admin"
	KindCoordinator Kind = "coordinator"
)

// Kinds lists every kind, in the order help texts show them.
func Kinds() []Kind { return []Kind{KindNode, KindAdmin, KindCoordinator} }

// Valid reports whether k is one of Kinds.
func (k Kind) Valid() bool {
	switch k {
	case KindNode, KindAdmin, KindCoordinator:
		return true
	}
	return false
}

// ErrNoIdentity is returned when a certificate carries no usable SPIFFE ID:
// none, more than one, or one that is malformed.
var ErrNoIdentity = errors.New("no fleetcheck identity")

const (
	maxTrustDomain = 255
	maxName        = 253
)

// Identity is who a certificate speaks for.
type Identity struct {
	TrustDomain string
	Kind        Kind
	Name        string
}

// String is the SPIFFE ID, spiffe://TRUST_DOMAIN/KIND/NAME.
func (id Identity) String() string {
	u := url.URL{Scheme: "spiffe", Host: id.TrustDomain, Path: "/" + string(id.Kind) + "/" + id.Name}
	return u.String()
}

// URL is the SPIFFE ID as the URI SAN a certificate carries.
func (id Identity) URL() *url.URL {
	return &url.URL{Scheme: "spiffe", Host: id.TrustDomain, Path: "/" + string(id.Kind) + "/" + id.Name}
}

// Validate checks every part of id.
func (id Identity) Validate() error {
	if err := ValidateTrustDomain(id.TrustDomain); err != nil {
		return err
	}
	if !id.Kind.Valid() {
		return fmt.Errorf("identity kind %q: want node, admin or coordinator", id.Kind)
	}
	return ValidateName(id.Name)
}

// ValidateTrustDomain checks a trust domain as SPIFFE defines it: lowercase
// letters, digits, '.', '-' and '_'.
func ValidateTrustDomain(td string) error {
	if td == "" {
		return errors.New("trust domain is empty")
	}
	if len(td) > maxTrustDomain {
		return fmt.Errorf("trust domain is longer than %d characters", maxTrustDomain)
	}
	for i := 0; i < len(td); i++ {
		c := td[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("trust domain %q may hold only lowercase letters, digits, '.', '-' and '_'", td)
		}
	}
	return nil
}

// ValidateName checks a node, operator or coordinator name: the agent's
// node-name rule (letters, digits, '.', '-', '_', starting and ending with
// a letter or digit, at most 253 characters) and no "..", so a name is
// always safe as one path element and as a file name.
func ValidateName(name string) error {
	if name == "" {
		return errors.New("name is empty")
	}
	if len(name) > maxName {
		return fmt.Errorf("name is longer than %d characters", maxName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if (i == 0 || i == len(name)-1) && !alnum {
			return fmt.Errorf("name %q must start and end with a letter or digit", name)
		}
		if !alnum && c != '.' && c != '-' && c != '_' {
			return fmt.Errorf("name %q may hold only letters, digits, '.', '-' and '_'", name)
		}
	}
	if strings.Contains(name, "..") {
		return fmt.Errorf("name %q holds \"..\"", name)
	}
	return nil
}

// ParseID reads a SPIFFE ID of one of fleetcheck's kinds. It refuses
// anything a second reader could understand differently: escapes, a port,
// user info, a query or a fragment, extra path elements.
func ParseID(s string) (Identity, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %w", ErrNoIdentity, err)
	}
	return fromURL(u)
}

func fromURL(u *url.URL) (Identity, error) {
	bad := func(why string) (Identity, error) {
		return Identity{}, fmt.Errorf("%w: %q: %s", ErrNoIdentity, u.String(), why)
	}
	if u.Scheme != "spiffe" {
		return bad("scheme is not spiffe")
	}
	if u.Opaque != "" || u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.RawFragment != "" {
		return bad("a SPIFFE ID has only a trust domain and a path")
	}
	if u.Port() != "" || strings.Contains(u.Host, ":") {
		return bad("a trust domain has no port")
	}
	if u.RawPath != "" || strings.Contains(u.Path, "%") {
		return bad("escaped characters in the path")
	}
	if err := ValidateTrustDomain(u.Host); err != nil {
		return bad(err.Error())
	}
	kind, name, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
	if !strings.HasPrefix(u.Path, "/") || !ok {
		return bad("path is not /KIND/NAME")
	}
	id := Identity{TrustDomain: u.Host, Kind: Kind(kind), Name: name}
	if !id.Kind.Valid() {
		return bad("kind is not node, admin or coordinator")
	}
	if strings.Contains(name, "/") {
		return bad("path is not /KIND/NAME")
	}
	if err := ValidateName(name); err != nil {
		return bad(err.Error())
	}
	return id, nil
}

// ParseIdentity reads the identity of a leaf certificate from its one
// spiffe URI SAN. Other URI SANs are ignored (a foreign PKI may add its
// own); two spiffe SANs are refused, since the holder could then speak
// for either. It does not verify the chain: call it only on a certificate
// that TLS has verified.
func ParseIdentity(cert *x509.Certificate) (Identity, error) {
	if cert == nil {
		return Identity{}, fmt.Errorf("%w: no certificate", ErrNoIdentity)
	}
	if cert.IsCA {
		return Identity{}, fmt.Errorf("%w: %s is a CA certificate", ErrNoIdentity, cert.Subject)
	}
	var found *url.URL
	for _, u := range cert.URIs {
		if u == nil || !strings.EqualFold(u.Scheme, "spiffe") {
			continue
		}
		if found != nil {
			return Identity{}, fmt.Errorf("%w: certificate %s has more than one spiffe URI SAN", ErrNoIdentity, cert.Subject)
		}
		found = u
	}
	if found == nil {
		return Identity{}, fmt.Errorf("%w: certificate %s has no spiffe URI SAN", ErrNoIdentity, cert.Subject)
	}
	return fromURL(found)
}
