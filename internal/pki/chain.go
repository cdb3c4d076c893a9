package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ErrCAOfOtherDomain is returned when a certificate's SPIFFE ID is of a
// trust domain that a CA in its chain does not name. Go's URI name
// constraint "example.net" also admits "fleet.example.net", so a CA of a
// parent domain would otherwise vouch for every identity below it.
var ErrCAOfOtherDomain = errors.New("issuing CA is not a CA of the identity's trust domain")

// CADomains are the trust domains a CA certificate names: its
// spiffe://TRUST_DOMAIN URI SANs and its permitted URI name constraints
// (an entry with a leading "." names only subdomains, which are other
// trust domains, so it adds none). declared is false when the CA names
// no domain at all and constrains no URI: another PKI's root, trusted for
// whatever the bundle it sits in is for.
func CADomains(cert *x509.Certificate) (domains []string, declared bool) {
	add := func(d string) {
		d = strings.ToLower(d)
		if !slices.Contains(domains, d) {
			domains = append(domains, d)
		}
	}
	for _, u := range cert.URIs {
		if u != nil && strings.EqualFold(u.Scheme, "spiffe") && (u.Path == "" || u.Path == "/") {
			declared = true
			add(u.Host)
		}
	}
	for _, d := range cert.PermittedURIDomains {
		declared = true
		if !strings.HasPrefix(d, ".") {
			add(d)
		}
	}
	return domains, declared
}

// ChainIdentity is the identity of the leaf of a verified chain (TLS's
// VerifiedChains), accepted only when every CA in the chain that names
// trust domains names the leaf's own exactly: a CA of `test` in the same
// bundle as a CA of `fleet.test` vouches for nothing in `fleet.test`, and
// neither does an intermediate of `fleet.test` under a root of `test`.
// A chain whose CAs name no domain (another PKI's) is taken as it is; the
// caller still checks the trust domain it serves. One chain that passes
// is enough: they all end in the same leaf.
func ChainIdentity(chains [][]*x509.Certificate) (Identity, error) {
	var first error
	for _, chain := range chains {
		if len(chain) == 0 {
			continue
		}
		id, err := ParseIdentity(chain[0])
		if err != nil {
			return Identity{}, err // the same leaf in every chain
		}
		if err := chainVouchesFor(chain[1:], id); err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		return id, nil
	}
	if first == nil {
		first = fmt.Errorf("%w: no verified certificate", ErrNoIdentity)
	}
	return Identity{}, first
}

func chainVouchesFor(cas []*x509.Certificate, id Identity) error {
	for _, ca := range cas {
		domains, declared := CADomains(ca)
		if declared && !slices.Contains(domains, id.TrustDomain) {
			names := "only subdomains"
			if len(domains) > 0 {
				names = "trust domain " + strings.Join(domains, ", ")
			}
			// The sentinel is matched, not shown: the sentence says it.
			return fmt.Errorf("%s is vouched for by CA %q (%s), not a CA of trust domain %s%.0w",
				id, ca.Subject.String(), names, id.TrustDomain, ErrCAOfOtherDomain)
		}
	}
	return nil
}
