package pki

import (
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestParseID(t *testing.T) {
	t.Parallel()
	good := []struct {
		in   string
		want Identity
	}{
		{"spiffe://fleet.test/node/gpu01", Identity{"fleet.test", KindNode, "gpu01"}},
		{"spiffe://fleet.test/admin/alice", Identity{"fleet.test", KindAdmin, "alice"}},
		{"spiffe://fleet.test/coordinator/coord-1", Identity{"fleet.test", KindCoordinator, "coord-1"}},
		{"spiffe://a_b-c.d/node/GPU_01.rack-2", Identity{"a_b-c.d", KindNode, "GPU_01.rack-2"}},
		{"SPIFFE://fleet.test/node/x", Identity{"fleet.test", KindNode, "x"}}, // schemes are case-insensitive
	}
	for _, tc := range good {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			got, err := ParseID(tc.in)
			if err != nil {
				t.Fatalf("ParseID(%q): %v", tc.in, err)
			}
			if got != tc.want {
				t.Fatalf("ParseID(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			if tc.in[0] != 'S' && got.String() != tc.in {
				t.Errorf("String() = %q, want %q", got.String(), tc.in)
			}
		})
	}

	bad := []string{
		"",
		"https://fleet.test/node/gpu01",
		"spiffe://fleet.test",
		"spiffe://fleet.test/",
		"spiffe://fleet.test/node",
		"spiffe://fleet.test/node/",
		"spiffe://fleet.test/node/a/b",
		"spiffe://fleet.test/node/..",
		"spiffe://fleet.test/node/a..b",
		"spiffe://fleet.test/node/.hidden",
		"spiffe://fleet.test/node/-flag",
		"spiffe://fleet.test/node/a%2Fb",
		"spiffe://fleet.test/node/a%2e%2e",
		"spiffe://fleet.test/node/gpu 01",
		"spiffe://fleet.test/root/gpu01",
		"spiffe://fleet.test/Node/gpu01",
		"spiffe://Fleet.test/node/gpu01",
		"spiffe://fleet.test:443/node/gpu01",
		"spiffe://user@fleet.test/node/gpu01",
		"spiffe://fleet.test/node/gpu01?x=1",
		"spiffe://fleet.test/node/gpu01#frag",
		"spiffe:fleet.test/node/gpu01",
		"spiffe:///node/gpu01",
		"spiffe://fleet.test//node/gpu01",
		"spiffe://fleet.test/node/" + strings.Repeat("a", 254),
	}
	for _, in := range bad {
		t.Run("bad "+in, func(t *testing.T) {
			t.Parallel()
			if id, err := ParseID(in); err == nil {
				t.Fatalf("ParseID(%q) = %+v, want an error", in, id)
			} else if !errors.Is(err, ErrNoIdentity) {
				t.Fatalf("ParseID(%q): %v is not ErrNoIdentity", in, err)
			}
		})
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestParseIdentity(t *testing.T) {
	t.Parallel()
	node := "spiffe://fleet.test/node/gpu01"
	cases := []struct {
		name string
		cert *x509.Certificate
		want string // SPIFFE ID, or "" for an error
	}{
		{"one spiffe SAN", &x509.Certificate{URIs: []*url.URL{mustURL(t, node)}}, node},
		{"other URIs ignored", &x509.Certificate{URIs: []*url.URL{mustURL(t, "https://idp.example/u/1"), mustURL(t, node)}}, node},
		{"no URI SAN", &x509.Certificate{DNSNames: []string{"gpu01"}}, ""},
		{"two spiffe SANs", &x509.Certificate{URIs: []*url.URL{mustURL(t, node), mustURL(t, "spiffe://fleet.test/admin/root")}}, ""},
		{"malformed SAN", &x509.Certificate{URIs: []*url.URL{mustURL(t, "spiffe://fleet.test/node/../admin/root")}}, ""},
		{"CA certificate", &x509.Certificate{IsCA: true, URIs: []*url.URL{mustURL(t, node)}}, ""},
		{"nil", nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id, err := ParseIdentity(tc.cert)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("got %v, want an error", id)
				}
				if !errors.Is(err, ErrNoIdentity) {
					t.Fatalf("%v is not ErrNoIdentity", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if id.String() != tc.want {
				t.Fatalf("got %s, want %s", id, tc.want)
			}
		})
	}
}

func TestValidateName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"a", "gpu01", "n-1.rack_2", "A9", strings.Repeat("x", 253)} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("ValidateName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a..b", "a/b", "-a", "a-", "a b", "ä", "a\x00"} {
		if err := ValidateName(bad); err == nil {
			t.Errorf("ValidateName(%q) accepted", bad)
		}
	}
}

// FuzzParseID: a SPIFFE ID from a peer's certificate never panics the
// parser, and one it accepts reads back the same from its own string and
// is valid: no two readers can disagree about whom it names.
func FuzzParseID(f *testing.F) {
	for _, s := range []string{
		"spiffe://fleet.test/node/gpu-001", "spiffe://fleet.test/admin/alice", "spiffe://fleet.test/coordinator/c1",
		"spiffe://FLEET.test/node/a", "spiffe://fleet.test:443/node/a", "spiffe://u@fleet.test/node/a",
		"spiffe://fleet.test/node/a/b", "spiffe://fleet.test/node/..", "spiffe://fleet.test/node/a%2Fb",
		"spiffe://fleet.test/node/a?x=1", "spiffe://fleet.test/node/a#f", "spiffe:///node/a", "spiffe:fleet.test/node/a",
		"spiffe://a.fleet.test/admin/mallory", "spiffe://test/admin/root", "https://fleet.test/node/a", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseID(s)
		if err != nil {
			return
		}
		if err := id.Validate(); err != nil {
			t.Fatalf("ParseID(%q) = %v, which does not validate: %v", s, id, err)
		}
		again, err := ParseID(id.String())
		if err != nil || again != id {
			t.Fatalf("ParseID(%q) = %v; its string %q reads back as %v, %v", s, id, id.String(), again, err)
		}
	})
}
