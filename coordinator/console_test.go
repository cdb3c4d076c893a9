package coordinator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/coordinator/console"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// TestConsoleServedWithTheCoordinatorsTLS: the console is on its own
// address, HTTPS with the coordinator's certificate; it shows the stored
// nodes with their live connection to an admin and refuses a node.
func TestConsoleServedWithTheCoordinatorsTLS(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	f := ca.files(pki.Request{Kind: pki.KindCoordinator, Name: "coord", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	cfg := Config{
		Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), HeartbeatInterval: time.Second,
		TLS:     TLSConfig{CertFile: f.CertFile, KeyFile: f.KeyFile, CAFile: f.CAFile, TrustDomain: testTD},
		Console: console.Config{Enabled: true, Listen: "127.0.0.1:0"},
	}
	opts, _, err := Secure(cfg, Options{Logger: zerolog.Nop(), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(t, s) })
	url := s.ConsoleURL()
	if !strings.HasPrefix(url, "https://127.0.0.1:") || url == "https://"+s.GRPCAddr().String()+"/" {
		t.Fatalf("console at %q, want its own https address on 127.0.0.1", url)
	}
	a, err := connectCreds(t, s, ca.creds(pki.KindNode, "gpu-7"), "gpu-7")
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	testwait.Until(t, 10*time.Second, "gpu-7 stored", func() bool { return nodeOf(t, s, "gpu-7").Name != "" })

	pool := x509.NewCertPool()
	pool.AddCert(ca.ca.Cert)
	client := func(kind pki.Kind, name string) *http.Client {
		f := ca.files(pki.Request{Kind: kind, Name: name})
		pair, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS13}}}
	}
	for _, tc := range []struct {
		kind pki.Kind
		code int
		want string
	}{
		{pki.KindAdmin, http.StatusOK, `data-node="gpu-7"`},
		{pki.KindNode, http.StatusForbidden, "may not act as an operator"},
		{pki.KindCoordinator, http.StatusForbidden, ""},
	} {
		resp, err := client(tc.kind, "x").Get(url + "fleet")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s certificate: %d, want %d with %q\n%.400s", tc.kind, resp.StatusCode, tc.code, tc.want, body)
		}
	}
}

func TestConsoleNeedsTLSOrInsecure(t *testing.T) {
	t.Parallel()
	_, err := ParseConfig([]byte("data_dir: /x\nconsole: {enabled: true}\n"))
	if err == nil || !strings.Contains(err.Error(), "console: needs tls:") {
		t.Errorf("a console with neither tls nor insecure: %v", err)
	}
	if _, err := ParseConfig([]byte("data_dir: /x\ninsecure: true\nconsole: {enabled: true, listen: nowhere}\n")); err == nil || !strings.Contains(err.Error(), "console.listen") {
		t.Errorf("a bad console.listen: %v", err)
	}
}

// TestConsoleRemediationThroughTheService: the console's approve and
// cancel of a real remediation go through RemediationService: audited
// under the admin's name (remediation.approve, remediation.cancel) and
// moved by the engine, as `fleetcheck remediation approve|cancel` does.
func TestConsoleRemediationThroughTheService(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	f := ca.files(pki.Request{Kind: pki.KindCoordinator, Name: "coord", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	cfg := Config{
		Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), HeartbeatInterval: time.Second,
		TLS:     TLSConfig{CertFile: f.CertFile, KeyFile: f.KeyFile, CAFile: f.CAFile, TrustDomain: testTD},
		Console: console.Config{Enabled: true, Listen: "127.0.0.1:0", Actions: true},
	}
	opts, _, err := Secure(cfg, Options{Logger: zerolog.Nop(), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopServer(t, s) })
	a, err := connectCreds(t, s, ca.creds(pki.KindNode, "gpu-7"), "gpu-7")
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	testwait.Until(t, 10*time.Second, "gpu-7 stored", func() bool { return nodeOf(t, s, "gpu-7").Name != "" })
	ctx := context.Background()
	eng := s.camp.remed()
	if eng == nil || eng.Mode() != remediation.ModeShadow {
		t.Fatalf("no remediation engine in shadow mode: %v", eng)
	}
	rid, err := eng.Trigger(ctx, remediation.Trigger{Node: "gpu-7", Component: "GPU3", Step: remediation.StepResetGPU, Code: "XID_79", Source: "finding", Reason: "gpu.xid: GPU3 XID_79"})
	if err != nil {
		t.Fatal(err)
	}

	pool := x509.NewCertPool()
	pool.AddCert(ca.ca.Cert)
	cf := ca.files(pki.Request{Kind: pki.KindAdmin, Name: "carol"})
	pair, err := tls.LoadX509KeyPair(cf.CertFile, cf.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	admin := &http.Client{
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS13}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	base := strings.TrimSuffix(s.ConsoleURL(), "/")
	page := func(path string) string {
		resp, err := admin.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d\n%.400s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	body := page("/nodes/gpu-7")
	if !strings.Contains(body, `href="/remediations/`+rid+`"`) {
		t.Fatalf("the node page does not link %s:\n%.3000s", rid, body)
	}
	body = page("/remediations/" + rid)
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(body)
	if m == nil || !strings.Contains(body, `id="remed-state">shadow`) || !strings.Contains(body, "would: drain gpu-7") {
		t.Fatalf("the shadow remediation's page:\n%.3000s", body)
	}
	act := func(action string, form url.Values) {
		t.Helper()
		form.Set("csrf", m[1])
		req, _ := http.NewRequest(http.MethodPost, base+"/remediations/"+rid+"/"+action, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", base)
		resp, err := admin.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("%s: %d\n%.400s", action, resp.StatusCode, b)
		}
	}
	act("approve", url.Values{})
	x, err := eng.Get(ctx, rid)
	// The approved remediation starts at once (it may have moved on past
	// "approved" already): the event says who approved it.
	if err != nil || x.State == remediation.StateShadow || x.Mode != remediation.ModeAuto || !hasRemedEvent(x, "approved by carol: running") {
		t.Fatalf("after the console's approve: %+v %v", x, err)
	}
	act("cancel", url.Values{"reason": {"wrong GPU"}})
	if x, err = eng.Get(ctx, rid); err != nil || x.State != remediation.StateCancelled || !strings.Contains(x.Reason, "wrong GPU (from the console)") {
		t.Fatalf("after the console's cancel: %+v %v", x, err)
	}
	evs, err := s.Store().Events(ctx, store.EventQuery{Kind: store.EventAudit, Limit: 50})
	if err != nil {
		t.Fatal(err)
	}
	var audit []string
	for _, e := range evs {
		if strings.HasPrefix(e.Message, "remediation.") {
			audit = append(audit, e.Actor+" "+e.Message)
		}
	}
	want := []string{"admin:carol remediation.approve: " + rid, "admin:carol remediation.cancel: " + rid + ": wrong GPU (from the console)"}
	if strings.Join(audit, "\n") != strings.Join(want, "\n") {
		t.Errorf("audit log:\n%s\nwant\n%s", strings.Join(audit, "\n"), strings.Join(want, "\n"))
	}
	if body := page("/remediations/" + rid); !strings.Contains(body, `id="remed-state">cancelled`) || !strings.Contains(body, "approved by carol: running") {
		t.Errorf("the cancelled remediation's page lacks its state or transitions:\n%.3000s", body)
	}
}

func hasRemedEvent(r remediation.Remediation, what string) bool {
	for _, e := range r.Events {
		if strings.Contains(e.What, what) {
			return true
		}
	}
	return false
}
