//go:build !node

package main

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetcheck/fleetcheck/internal/pki"
)

func newCertsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Create a CA and issue node, operator and coordinator certificates for mTLS",
		Long: "Certificates carry the identity as a URI SAN (docs/design.md): spiffe://TRUST_DOMAIN/node/NODE " +
			"for an agent, .../admin/NAME for an operator, .../coordinator/NAME for the coordinator. " +
			"Certificates from any other PKI with the same SANs work too.",
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newCertsInitCmd(), newCertsIssueCmd(), newCertsShowCmd())
	return cmd
}

func newCertsInitCmd() *cobra.Command {
	var (
		dir, td  string
		validity time.Duration
		force    bool
	)
	cmd := &cobra.Command{
		Use:   "init --dir DIR --trust-domain TRUST_DOMAIN",
		Short: "Create a certificate authority: DIR/ca.crt and DIR/ca.key (mode 0600)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return fmt.Errorf("--dir is required")
			}
			if td == "" {
				return fmt.Errorf("--trust-domain is required (e.g. fleet.example.com)")
			}
			ca, err := pki.NewCA(td, pki.CAOptions{Validity: validity})
			if err != nil {
				return err
			}
			certFile, keyFile, err := pki.WriteCA(dir, ca, force)
			if err != nil {
				return err
			}
			pr := newPrinter(cmd.OutOrStdout())
			pr.printf("wrote %s and %s: CA for trust domain %s, valid until %s\n",
				certFile, keyFile, td, ca.Cert.NotAfter.UTC().Format(time.RFC3339))
			pr.printf("keep %s secret: whoever holds it can issue any identity\n", keyFile)
			return pr.err
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory for ca.crt and ca.key (created 0700)")
	cmd.Flags().StringVar(&td, "trust-domain", "", "SPIFFE trust domain: lowercase letters, digits, '.', '-', '_'")
	cmd.Flags().DurationVar(&validity, "validity", pki.DefaultCAValidity, "how long the CA certificate is valid")
	cmd.Flags().BoolVar(&force, "force", false, "replace an existing CA (every certificate it issued stops being trusted)")
	return cmd
}

func newCertsIssueCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "issue {node|admin|coordinator} NAME --dir CA_DIR",
		Short: "Issue a certificate signed by the CA in --dir",
		Args:  cobra.NoArgs,
	}
	for _, k := range pki.Kinds() {
		cmd.AddCommand(newCertsIssueKindCmd(k))
	}
	return cmd
}

func newCertsIssueKindCmd(kind pki.Kind) *cobra.Command {
	var (
		dir, out, td string
		dns, ips     []string
		validity     time.Duration
		force        bool
	)
	cmd := &cobra.Command{
		Use:  string(kind) + " NAME --dir CA_DIR",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if dir == "" {
				return fmt.Errorf("--dir (the CA's directory) is required")
			}
			if err := pki.ValidateName(name); err != nil {
				return fmt.Errorf("%s name: %w", kind, err)
			}
			req := pki.Request{Kind: kind, Name: name, DNSNames: dns, Validity: validity}
			for _, s := range ips {
				ip := net.ParseIP(s)
				if ip == nil {
					return fmt.Errorf("--ip %q is not an IP address", s)
				}
				req.IPs = append(req.IPs, ip)
			}
			if kind == pki.KindCoordinator && len(dns) == 0 && len(ips) == 0 {
				return fmt.Errorf("a coordinator certificate needs --dns or --ip: the names agents and operators dial it by")
			}
			ca, err := pki.LoadCA(dir, td)
			if err != nil {
				return err
			}
			leaf, err := ca.Issue(req)
			if err != nil {
				return err
			}
			if out == "" {
				out = dir
			}
			certFile, keyFile, err := pki.WriteLeaf(out, leaf, force)
			if err != nil {
				return err
			}
			caFile, err := pki.WriteCACert(out, ca.Cert, force)
			if err != nil {
				return err
			}
			pr := newPrinter(cmd.OutOrStdout())
			pr.printf("wrote %s, %s (mode 0600) and %s\n", certFile, keyFile, caFile)
			pr.printf("identity %s, valid until %s\n", leaf.Identity, leaf.Cert.NotAfter.UTC().Format(time.RFC3339))
			return pr.err
		},
	}
	cmd.Short = map[pki.Kind]string{
		pki.KindNode:        "Issue an agent's certificate: spiffe://TRUST_DOMAIN/node/NAME, client and server auth",
		pki.KindAdmin:       "Issue an operator's certificate: spiffe://TRUST_DOMAIN/admin/NAME, client auth",
		pki.KindCoordinator: "Issue the coordinator's certificate: spiffe://TRUST_DOMAIN/coordinator/NAME with the --dns/--ip names it is dialed by",
	}[kind]
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "the CA's directory (ca.crt, ca.key)")
	f.StringVar(&out, "out", "", "directory for KIND-NAME.crt, KIND-NAME.key and a copy of ca.crt (default --dir)")
	f.StringVar(&td, "trust-domain", "", "trust domain, for a CA certificate that does not record one")
	f.StringSliceVar(&dns, "dns", nil, "DNS name SAN (repeatable)")
	f.StringSliceVar(&ips, "ip", nil, "IP address SAN (repeatable)")
	f.DurationVar(&validity, "validity", pki.DefaultLeafValidity, "how long the certificate is valid (at most the CA's remaining life)")
	f.BoolVar(&force, "force", false, "replace an existing certificate and key")
	return cmd
}

func newCertsShowCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "show FILE",
		Short: "Print the identity, SANs and validity of the certificates in a PEM file",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			certs, err := pki.ParseCertsPEM(data)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			pr := newPrinter(cmd.OutOrStdout())
			for i, c := range certs {
				if i > 0 {
					pr.println()
				}
				writeCertSummary(pr, c, time.Now())
			}
			return pr.err
		},
	}
}

func writeCertSummary(pr *printer, c *x509.Certificate, now time.Time) {
	line := func(k, v string) { pr.printf("%-12s %s\n", k+":", v) }
	if c.IsCA {
		if td, err := pki.CATrustDomain(c); err == nil {
			line("identity", "CA of trust domain "+td)
		} else {
			line("identity", "CA (no trust domain recorded)")
		}
	} else if id, err := pki.ParseIdentity(c); err == nil {
		line("identity", fmt.Sprintf("%s (%s %s, trust domain %s)", id, id.Kind, id.Name, id.TrustDomain))
	} else {
		line("identity", "none: "+err.Error())
	}
	line("subject", c.Subject.String())
	line("issuer", c.Issuer.String())
	line("serial", c.SerialNumber.Text(16))
	validity := fmt.Sprintf("%s to %s", c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
	switch {
	case now.After(c.NotAfter):
		validity += " (EXPIRED)"
	case now.Before(c.NotBefore):
		validity += " (NOT YET VALID)"
	default:
		validity += fmt.Sprintf(" (%d days left)", int(c.NotAfter.Sub(now).Hours()/24))
	}
	line("valid", validity)
	var uris []string
	for _, u := range c.URIs {
		uris = append(uris, u.String())
	}
	var ips []string
	for _, ip := range c.IPAddresses {
		ips = append(ips, ip.String())
	}
	line("uri sans", joinOrNone(uris))
	line("dns sans", joinOrNone(c.DNSNames))
	line("ip sans", joinOrNone(ips))
	line("usage", joinOrNone(extKeyUsageNames(c.ExtKeyUsage)))
	if c.IsCA {
		// What it may vouch for: an old CA without the exclusion also
		// covers subdomains in x509 (the coordinator still holds it to
		// its exact domain).
		cons := "permits URI " + joinOrNone(c.PermittedURIDomains) + "; excludes URI " + joinOrNone(c.ExcludedURIDomains)
		line("constraints", cons)
	}
	sum := sha256.Sum256(c.Raw)
	line("sha256", hex.EncodeToString(sum[:]))
}

func extKeyUsageNames(us []x509.ExtKeyUsage) []string {
	var out []string
	for _, u := range us {
		switch u {
		case x509.ExtKeyUsageClientAuth:
			out = append(out, "client auth")
		case x509.ExtKeyUsageServerAuth:
			out = append(out, "server auth")
		case x509.ExtKeyUsageAny:
			out = append(out, "any")
		default:
			out = append(out, fmt.Sprintf("ext key usage %d", u))
		}
	}
	return out
}

func joinOrNone(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ", ")
}
