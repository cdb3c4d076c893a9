package pki

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/rs/zerolog"
)

// Replacing the files on disk switches the served certificate, with no
// restart and no call into the server: the next handshake looks.
func TestReloadSwitchesServedCertificate(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "fleet.test")
	req := Request{Kind: KindCoordinator, Name: "coord", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
	live := ca.files(t, req)
	// A tiny interval: every handshake looks at the files.
	srv := newTestReloader(t, live, time.Nanosecond)
	cfg, err := ServerConfig(ServerOptions{Reloader: srv})
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, cfg)
	node := newTestReloader(t, ca.files(t, Request{Kind: KindNode, Name: "gpu01"}), -1)
	ccfg, err := ClientConfig(ClientOptions{Reloader: node, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}

	first, err := dial(t, addr, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	if first != srv.Leaf().SerialNumber.Text(16) {
		t.Fatalf("served %s, loaded %s", first, srv.Leaf().SerialNumber.Text(16))
	}

	replaceFiles(t, ca.files(t, req), live)
	second, err := dial(t, addr, ccfg)
	if err != nil {
		t.Fatal(err)
	}
	if second == first {
		t.Fatalf("still serving %s after the files were replaced", first)
	}
	if second != srv.Leaf().SerialNumber.Text(16) {
		t.Fatalf("served %s, loaded %s", second, srv.Leaf().SerialNumber.Text(16))
	}
}

// A half-replaced pair (new certificate, old key) is refused and the old
// pair kept; once the key arrives, the new pair is used.
func TestReloadKeepsOldMaterialOnError(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, "fleet.test")
	req := Request{Kind: KindNode, Name: "gpu01"}
	live := ca.files(t, req)
	r := newTestReloader(t, live, -1)
	old := r.Leaf().SerialNumber.Text(16)

	next := ca.files(t, req)
	certOnly := next
	certOnly.KeyFile, certOnly.CAFile = live.KeyFile, live.CAFile
	replaceFiles(t, certOnly, live)
	if changed, err := r.Check(); err == nil || changed {
		t.Fatalf("Check with a mismatched pair: changed=%v err=%v, want an error", changed, err)
	}
	if got := r.Leaf().SerialNumber.Text(16); got != old {
		t.Fatalf("serving %s after a failed reload, want the old %s", got, old)
	}

	replaceFiles(t, next, live)
	if changed, err := r.Check(); err != nil || !changed {
		t.Fatalf("Check with the full pair: changed=%v err=%v", changed, err)
	}
	if got := r.Leaf().SerialNumber.Text(16); got == old {
		t.Fatal("new pair not loaded")
	}
	if changed, err := r.Check(); err != nil || changed {
		t.Fatalf("Check with nothing new: changed=%v err=%v", changed, err)
	}

	if err := os.Remove(live.CAFile); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Check(); err == nil {
		t.Fatal("Check with the CA bundle gone succeeded")
	}
	if r.CAPool() == nil || r.Certificate() == nil {
		t.Fatal("material dropped after a failed check")
	}
}

// Rotating the CA bundle changes whom the server lets in, on the next
// handshake.
func TestReloadRotatesClientCAs(t *testing.T) {
	t.Parallel()
	oldCA := newTestCA(t, "fleet.test")
	newCA := newTestCA(t, "fleet.test")
	coordReq := Request{Kind: KindCoordinator, Name: "coord", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}
	live := oldCA.files(t, coordReq)
	srv := newTestReloader(t, live, -1)
	cfg, err := ServerConfig(ServerOptions{Reloader: srv})
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, cfg)

	clientOf := func(ca *testCA) *Reloader {
		f := ca.files(t, Request{Kind: KindNode, Name: "gpu01"})
		// Clients trust both CAs, so only the server's bundle decides.
		bundle := append(EncodeCert(oldCA.Cert), EncodeCert(newCA.Cert)...)
		if err := os.WriteFile(f.CAFile, bundle, 0o644); err != nil {
			t.Fatal(err)
		}
		return newTestReloader(t, f, -1)
	}
	dialWith := func(r *Reloader) error {
		c, err := ClientConfig(ClientOptions{Reloader: r, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		_, err = dial(t, addr, c)
		return err
	}
	oldClient, newClient := clientOf(oldCA), clientOf(newCA)
	if err := dialWith(oldClient); err != nil {
		t.Fatalf("old CA before rotation: %v", err)
	}
	if err := dialWith(newClient); err == nil {
		t.Fatal("new CA let in before rotation")
	}

	replaceFiles(t, newCA.files(t, coordReq), live)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Run(ctx, 5*time.Millisecond) }()
	t.Cleanup(func() { cancel(); <-done })
	testwait.For(t, 5*time.Second, "Run to pick up the new files", func() (bool, string) {
		err := dialWith(newClient)
		return err == nil, fmt.Sprint(err)
	})
	if err := dialWith(oldClient); err == nil {
		t.Fatal("old CA still let in after rotation")
	}
}

// A changed CA bundle says which CAs it added and removed, by SHA-256.
func TestReloadLogsCABundleChange(t *testing.T) {
	t.Parallel()
	ca, extra := newTestCA(t, "fleet.test"), newTestCA(t, "test")
	f := ca.files(t, Request{Kind: KindNode, Name: "gpu01"})
	var logs bytes.Buffer
	r, err := NewReloader(f, ReloaderOptions{CheckInterval: -1, Logger: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	check := func(bundle []byte) map[string]any {
		t.Helper()
		logs.Reset()
		tmp := f.CAFile + ".new"
		if err := os.WriteFile(tmp, bundle, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, f.CAFile); err != nil {
			t.Fatal(err)
		}
		if changed, err := r.Check(); err != nil || !changed {
			t.Fatalf("check: %v %v", changed, err)
		}
		for _, line := range strings.Split(logs.String(), "\n") {
			m := map[string]any{}
			if json.Unmarshal([]byte(line), &m) == nil && m["message"] == "tls ca bundle changed" {
				return m
			}
		}
		return nil
	}
	strs := func(v any) []string {
		var out []string
		for _, x := range v.([]any) {
			out = append(out, x.(string))
		}
		return out
	}
	m := check(append(EncodeCert(ca.Cert), EncodeCert(extra.Cert)...))
	if m == nil || m["level"] != "info" || !slices.Equal(strs(m["added_sha256"]), []string{Fingerprint(extra.Cert)}) ||
		len(strs(m["removed_sha256"])) != 0 {
		t.Fatalf("adding a CA logged %v", m)
	}
	if len(Fingerprint(extra.Cert)) != 64 {
		t.Fatalf("fingerprint %q is not SHA-256 hex", Fingerprint(extra.Cert))
	}
	m = check(EncodeCert(ca.Cert))
	if m == nil || !slices.Equal(strs(m["removed_sha256"]), []string{Fingerprint(extra.Cert)}) || len(strs(m["added_sha256"])) != 0 {
		t.Fatalf("removing a CA logged %v", m)
	}
}
