package console

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

const testTD = "fleet.test"

// clock is a test clock that moves only when told, so the fleet cache's
// moment can be passed at will.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 1, 2, 4, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }

// insecureConsole serves src in the insecure mode over httptest.
func insecureConsole(t *testing.T, src Source, cfg Config) (*Server, *httptest.Server, *clock) {
	t.Helper()
	clk := newClock()
	s, err := New(cfg, Options{Source: src, Insecure: true, Now: clk.now, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts, clk
}

func get(t *testing.T, c *http.Client, u string, hdr ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

var nodeRowRE = regexp.MustCompile(`<tr data-node="([^"]+)" data-state="([^"]+)">`)

func rows(body string) map[string]string {
	out := map[string]string{}
	for _, m := range nodeRowRE.FindAllStringSubmatch(body, -1) {
		out[m[1]] = m[2]
	}
	return out
}

func TestFleetFiltersAggregatesAndPages(t *testing.T) {
	t.Parallel()
	src := fakeFleet(400) // 50 racks, 10 failed nodes (racks 1, 6, 11, ...)
	_, ts, _ := insecureConsole(t, src, Config{})
	c := ts.Client()

	code, body, _ := get(t, c, ts.URL+"/fleet")
	if code != 200 {
		t.Fatalf("GET /fleet: %d\n%s", code, body)
	}
	for _, want := range []string{`400 of 400 nodes`, `data-state="failed">10<`, `data-state="healthy">390<`,
		`<a href="/fleet?check=gpu.ecc">gpu.ecc</a></td><td class="n">10<`, `page 1 of 4`, `href="/fleet?page=2" rel="next"`,
		`class="tile st-failed" href="/fleet?sel=rack%3Dr001"`, `class="tile st-healthy" href="/fleet?sel=rack%3Dr002"`} {
		if !strings.Contains(body, want) {
			t.Errorf("fleet page lacks %q", want)
		}
	}
	// Worst first: the failed nodes lead the first page.
	if r := rows(body); len(r) != 100 || r["gpu-00001"] != "failed" || r["gpu-00041"] != "failed" {
		t.Errorf("first page: %d rows, gpu-00001 %q, gpu-00041 %q", len(r), r["gpu-00001"], r["gpu-00041"])
	}

	tests := []struct {
		name, query string
		want        int    // rows
		matched     string // the "N of M" line
		each        func(name, state string) bool
	}{
		{"selector", "sel=" + url.QueryEscape("rack=r006"), 8, "8 of 400 nodes", func(n, _ string) bool { return n > "gpu-00040" && n <= "gpu-00048" }},
		{"selector set", "sel=" + url.QueryEscape("rack in (r001,r002),name!=gpu-00001"), 15, "15 of 400 nodes", func(n, _ string) bool { return n != "gpu-00001" }},
		{"state", "state=failed", 10, "400 of 400 nodes", func(_, st string) bool { return st == "failed" }},
		{"check", "check=gpu.ecc", 10, "400 of 400 nodes", func(_, st string) bool { return st == "failed" }},
		{"selector and state", "sel=leaf%3Dleaf01&state=healthy", 31, "32 of 400 nodes", func(n, st string) bool { return st == "healthy" && n <= "gpu-00032" }},
		{"last page", "page=4", 100, "400 of 400 nodes", func(_, st string) bool { return st == "healthy" }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, body, _ := get(t, c, ts.URL+"/fleet?"+tc.query)
			if code != 200 {
				t.Fatalf("%d\n%s", code, body)
			}
			r := rows(body)
			if len(r) != tc.want {
				t.Errorf("%d rows, want %d", len(r), tc.want)
			}
			for n, st := range r {
				if !tc.each(n, st) {
					t.Errorf("row %s (%s) should have been filtered out", n, st)
				}
			}
			if !strings.Contains(body, tc.matched) {
				t.Errorf("page lacks %q", tc.matched)
			}
		})
	}

	code, body, _ = get(t, c, ts.URL+"/fleet?sel="+url.QueryEscape("rack in ("))
	if code != http.StatusBadRequest || !strings.Contains(body, `id="sel-error"`) {
		t.Errorf("bad selector: %d, want 400 with the error shown\n%.400s", code, body)
	}
}

func TestLivePartUpdatesWithETag(t *testing.T) {
	t.Parallel()
	src := fakeFleet(16)
	_, ts, clk := insecureConsole(t, src, Config{})
	c := ts.Client()
	code, body, h := get(t, c, ts.URL+"/fleet?sel=rack%3Dr002", liveHeader, "1")
	if code != 200 || strings.Contains(body, "<html") || !strings.Contains(body, "8 of 16 nodes") {
		t.Fatalf("live part: %d\n%.300s", code, body)
	}
	etag := h.Get("ETag")
	if code, _, _ := get(t, c, ts.URL+"/fleet?sel=rack%3Dr002", liveHeader, "1", "If-None-Match", etag); code != http.StatusNotModified {
		t.Errorf("unchanged live part: %d, want 304", code)
	}
	src.setState("gpu-00010", "failed", "ib.ports", report.Fail)
	clk.add(10 * time.Second) // past the shared read's refresh
	code, body, h = get(t, c, ts.URL+"/fleet?sel=rack%3Dr002", liveHeader, "1", "If-None-Match", etag)
	if code != 200 || h.Get("ETag") == etag {
		t.Fatalf("changed live part: %d, etag %s", code, h.Get("ETag"))
	}
	if r := rows(body); r["gpu-00010"] != "failed" || !strings.Contains(body, `href="/fleet?check=ib.ports&amp;sel=rack%3Dr002">ib.ports`) {
		t.Errorf("the new failure is not shown: %v\n%.2000s", r, body)
	}
}

func TestPagesRender(t *testing.T) {
	t.Parallel()
	src := fakeFleet(16)
	_, ts, _ := insecureConsole(t, src, Config{})
	for _, tc := range []struct {
		path string
		code int
		want string
	}{
		{"/", 200, "16 of 16 nodes"}, // redirected to /fleet
		{"/nodes/gpu-00001", 200, `id="node-state">failed`},
		{"/nodes/nope", 404, "not found"},
		{"/campaigns", 200, `href="/campaigns/rollout/ro-1"`},
		{"/campaigns/rollout/ro-1", 200, "canary"},
		{"/campaigns/rollout/nope", 404, ""},
		{"/campaigns/cake/1", 404, "want sweep, rollout, burnin or drill"},
		{"/events", 200, "no events"},
		{"/events?kind=cake", 400, "want one of"},
		{"/events?limit=0", 400, "1..2000"},
		{"/static/console.js", 200, "X-Console-Live"},
	} {
		code, body, h := get(t, ts.Client(), ts.URL+tc.path)
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s: %d, want %d with %q\n%.500s", tc.path, code, tc.code, tc.want, body)
		}
		if !strings.HasPrefix(tc.path, "/static/") && !strings.Contains(h.Get("Content-Security-Policy"), "default-src 'self'") {
			t.Errorf("GET %s: no content security policy", tc.path)
		}
	}
}

// pkiEnv is a CA, the coordinator's certificate and a client per identity.
type pkiEnv struct {
	t     *testing.T
	ca    *pki.CA
	certs *pki.Reloader
	pool  *x509.CertPool
}

func newPKI(t *testing.T) *pkiEnv {
	t.Helper()
	ca, err := pki.NewCA(testTD, pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e := &pkiEnv{t: t, ca: ca, pool: x509.NewCertPool()}
	e.pool.AddCert(ca.Cert)
	f := e.files(pki.Request{Kind: pki.KindCoordinator, Name: "main", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if e.certs, err = pki.NewReloader(f, pki.ReloaderOptions{}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *pkiEnv) files(req pki.Request) pki.Files {
	e.t.Helper()
	leaf, err := e.ca.Issue(req)
	if err != nil {
		e.t.Fatal(err)
	}
	dir := e.t.TempDir()
	cf, kf, err := pki.WriteLeaf(dir, leaf, false)
	if err != nil {
		e.t.Fatal(err)
	}
	caf, err := pki.WriteCACert(dir, e.ca.Cert, false)
	if err != nil {
		e.t.Fatal(err)
	}
	return pki.Files{CertFile: cf, KeyFile: kf, CAFile: caf}
}

// client dials with the certificate of kind/name; kind "" sends none.
func (e *pkiEnv) client(kind pki.Kind, name string) *http.Client {
	e.t.Helper()
	cfg := &tls.Config{RootCAs: e.pool, MinVersion: tls.VersionTLS13}
	if kind != "" {
		f := e.files(pki.Request{Kind: kind, Name: name})
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			e.t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Transport: &http.Transport{TLSClientConfig: cfg},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

const aliceToken = "alice-0123456789abcdefghijkl"

func writeTokens(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// tlsConsole serves src over HTTPS as a TLS coordinator's console does.
func tlsConsole(t *testing.T, src Source, cfg Config) (*Server, string, *pkiEnv) {
	t.Helper()
	e := newPKI(t)
	if cfg.TokenFile == "" {
		cfg.TokenFile = filepath.Join(t.TempDir(), "tokens")
		writeTokens(t, cfg.TokenFile, "# operators\nalice "+aliceToken+"\n")
	}
	s, err := New(cfg, Options{Source: src, TrustDomain: testTD, Certs: e.certs, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s.Handler())
	ts.TLS = s.tlsConfig()
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return s, ts.URL, e
}

func TestWhoMaySee(t *testing.T) {
	t.Parallel()
	s, base, e := tlsConsole(t, fakeFleet(16), Config{})
	for _, tc := range []struct {
		name   string
		client *http.Client
		hdr    []string
		code   int
		want   string
	}{
		{"admin certificate", e.client(pki.KindAdmin, "alice"), nil, 200, "admin:alice"},
		{"node certificate", e.client(pki.KindNode, "gpu-00001"), nil, 403, "may not act as an operator"},
		{"node certificate, sign-in page", e.client(pki.KindNode, "gpu-00001"), []string{"X-Path", "/login"}, 403, ""},
		{"node certificate, assets", e.client(pki.KindNode, "gpu-00001"), []string{"X-Path", "/static/console.js"}, 403, ""},
		{"node certificate with a token", e.client(pki.KindNode, "gpu-00001"), []string{"Authorization", "Bearer " + aliceToken}, 403, ""},
		{"nothing", e.client("", ""), nil, 401, "Sign in"},
		{"nothing, polling", e.client("", ""), []string{liveHeader, "1"}, 401, "no credentials"},
		{"bearer token", e.client("", ""), []string{"Authorization", "Bearer " + aliceToken}, 200, "token:alice"},
		{"wrong token", e.client("", ""), []string{"Authorization", "Bearer " + strings.Repeat("x", 30)}, 401, ""},
	} {
		path := "/fleet"
		if len(tc.hdr) == 2 && tc.hdr[0] == "X-Path" {
			path, tc.hdr = tc.hdr[1], nil
		}
		code, body, _ := get(t, tc.client, base+path, tc.hdr...)
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d, want %d with %q\n%.300s", tc.name, code, tc.code, tc.want, body)
		}
	}
	// Another trust domain's admin, its CA in the bundle, is refused.
	other, err := pki.NewCA("other.test", pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := other.Issue(pki.Request{Kind: pki.KindAdmin, Name: "mallory"})
	if err != nil {
		t.Fatal(err)
	}
	c := e.client("", "")
	foreign := &tls.Certificate{Certificate: [][]byte{leaf.Cert.Raw}, PrivateKey: leaf.Key}
	// Sent whatever CAs the server names, as a hostile client would.
	c.Transport.(*http.Transport).TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return foreign, nil
	}
	if resp, err := c.Get(base + "/fleet"); err == nil {
		resp.Body.Close()
		t.Errorf("a certificate of an unknown CA got %d, want a failed handshake", resp.StatusCode)
	}

	// Sign in with the token: a session cookie, then its end when the
	// token leaves the file.
	c = e.client("", "")
	resp, err := c.PostForm(base+"/login", url.Values{"token": {aliceToken}, "next": {"/events"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/events" {
		t.Fatalf("login: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if code, body, _ := get(t, c, base+"/fleet"); code != 200 || !strings.Contains(body, "token:alice") {
		t.Fatalf("after login: %d\n%.300s", code, body)
	}
	writeTokens(t, s.cfg.TokenFile, "bob "+strings.Repeat("b", 30)+"\n")
	if err := s.ReloadTokens(); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := get(t, c, base+"/fleet"); code != http.StatusUnauthorized {
		t.Errorf("session of a removed token: %d, want 401", code)
	}
	if code, _, _ := get(t, e.client("", ""), base+"/fleet", "Authorization", "Bearer "+strings.Repeat("b", 30)); code != 200 {
		t.Errorf("the reloaded file's token: %d, want 200", code)
	}
	// A cross-site sign-in form is refused.
	req, _ := http.NewRequest(http.MethodPost, base+"/login", strings.NewReader(url.Values{"token": {aliceToken}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin login: %d, want 403", resp.StatusCode)
	}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func post(t *testing.T, c *http.Client, u string, form url.Values, origin string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

func TestActionsNeedConfigCSRFAndOrigin(t *testing.T) {
	t.Parallel()
	src := fakeFleet(8)
	_, base, e := tlsConsole(t, src, Config{})
	admin := e.client(pki.KindAdmin, "alice")
	_, page, _ := get(t, admin, base+"/campaigns/rollout/ro-1")
	if strings.Contains(page, `data-action="pause"`) || !strings.Contains(page, "read-only") {
		t.Error("a read-only console offers actions")
	}
	if code, _, body := post(t, admin, base+"/campaigns/rollout/ro-1/pause", url.Values{}, base); code != http.StatusForbidden || !strings.Contains(body, "console.actions: false") {
		t.Errorf("action on a read-only console: %d\n%s", code, body)
	}

	src = fakeFleet(8)
	_, base, e = tlsConsole(t, src, Config{Actions: true})
	admin = e.client(pki.KindAdmin, "alice")
	_, page, _ = get(t, admin, base+"/campaigns/rollout/ro-1")
	m := csrfRE.FindStringSubmatch(page)
	if m == nil || !strings.Contains(page, `data-action="approve"`) {
		t.Fatalf("no action forms on the rollout page:\n%.2000s", page)
	}
	csrf := m[1]
	u := base + "/campaigns/rollout/ro-1/pause"
	for _, tc := range []struct {
		name   string
		c      *http.Client
		form   url.Values
		origin string
		code   int
	}{
		{"no csrf token", admin, url.Values{}, base, 403},
		{"wrong csrf token", admin, url.Values{"csrf": {strings.Repeat("0", 64)}}, base, 403},
		{"another site", admin, url.Values{"csrf": {csrf}}, "https://evil.example", 403},
		{"another admin's token", e.client(pki.KindAdmin, "bob"), url.Values{"csrf": {csrf}}, base, 403},
		{"node certificate", e.client(pki.KindNode, "gpu-00001"), url.Values{"csrf": {csrf}}, base, 403},
	} {
		if code, _, body := post(t, tc.c, u, tc.form, tc.origin); code != tc.code {
			t.Errorf("%s: %d, want %d\n%s", tc.name, code, tc.code, body)
		}
	}
	if got := src.controlled(); len(got) != 0 {
		t.Fatalf("refused requests reached the campaign service: %v", got)
	}
	code, loc, body := post(t, admin, u, url.Values{"csrf": {csrf}, "reason": {"NCCL regression on canary"}}, base)
	if code != http.StatusSeeOther || loc != "/campaigns/rollout/ro-1?done=pause" {
		t.Fatalf("pause: %d to %q\n%s", code, loc, body)
	}
	want := "admin:alice rollout ro-1 pause NCCL regression on canary (from the console)"
	if got := src.controlled(); len(got) != 1 || got[0] != want {
		t.Errorf("campaign service got %q, want %q", got, want)
	}
	if code, _, body := post(t, admin, base+"/campaigns/rollout/ro-1/rollback", url.Values{"csrf": {csrf}}, base); code != http.StatusBadRequest {
		t.Errorf("an action the console does not offer: %d\n%s", code, body)
	}
	// A bearer token is no browser's ambient credential: no CSRF token needed.
	tok := e.client("", "")
	req, _ := http.NewRequest(http.MethodPost, base+"/campaigns/rollout/ro-1/resume", nil)
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err := tok.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := src.controlled(); resp.StatusCode != http.StatusSeeOther || len(got) != 2 || !strings.HasPrefix(got[1], "token:alice rollout ro-1 resume") {
		t.Errorf("bearer resume: %d, %v", resp.StatusCode, got)
	}
}

func TestTokenFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	long := strings.Repeat("k", minTokenLen)
	for _, tc := range []struct {
		name, body string
		mode       os.FileMode
		err        string
	}{
		{"ok", "# c\n\nalice " + long + "\nbob " + long + "x\n", 0o600, ""},
		{"readable by others", "alice " + long + "\n", 0o644, "chmod 600"},
		{"short token", "alice short\n", 0o600, "at least 22"},
		{"three fields", "alice " + long + " extra\n", 0o600, "want NAME TOKEN"},
		{"bad name", "al/ice " + long + "\n", 0o600, "name"},
		{"shared token", "alice " + long + "\nbob " + long + "\n", 0o600, "same token"},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
		if err := os.WriteFile(p, []byte(tc.body), tc.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, tc.mode); err != nil {
			t.Fatal(err)
		}
		toks, err := loadTokens(p)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err == "" && func() bool { n, err := toks.lookup(long); return err != nil || n != "alice" }():
			t.Errorf("%s: alice's token not found", tc.name)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: error %v, want one with %q", tc.name, err, tc.err)
		}
	}
	if _, err := loadTokens(filepath.Join(dir, "absent")); err == nil {
		t.Error("a missing token file was accepted")
	}
}

func TestConfigRanges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg Config
		err string
	}{
		{Config{}, ""},
		{Config{Refresh: time.Millisecond}, "console.refresh"},
		{Config{Refresh: time.Hour}, "console.refresh"},
		{Config{PageSize: 5}, "console.page_size"},
		{Config{PageSize: 100_000}, "console.page_size"},
		{Config{Listen: "nowhere"}, "console.listen"},
	} {
		err := tc.cfg.WithDefaults().Validate()
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.err)
		}
	}
	if _, err := New(Config{}, Options{Source: fakeFleet(1)}); err == nil || !strings.Contains(err.Error(), "no certificates") {
		t.Errorf("a TLS console without certificates: %v", err)
	}
}

func TestTokenGuessingBounded(t *testing.T) {
	t.Parallel()
	_, base, e := tlsConsole(t, fakeFleet(4), Config{})
	c := e.client("", "")
	wrong := "Bearer " + strings.Repeat("w", 30)
	codes := map[int]int{}
	for range guessBurst + 3 {
		code, _, _ := get(t, c, base+"/fleet", "Authorization", wrong)
		codes[code]++
	}
	if codes[http.StatusUnauthorized] != guessBurst+1 || codes[http.StatusTooManyRequests] != 2 {
		t.Errorf("wrong tokens answered %v, want %d x 401 then 429", codes, guessBurst+1)
	}
	// Locked out: the right token is refused too, before any lookup.
	if code, _, _ := get(t, c, base+"/fleet", "Authorization", "Bearer "+aliceToken); code != http.StatusTooManyRequests {
		t.Errorf("right token while locked out: %d, want 429", code)
	}
	if code, _, body := post(t, c, base+"/login", url.Values{"token": {aliceToken}}, base); code != http.StatusTooManyRequests || !strings.Contains(body, "too many wrong tokens") {
		t.Errorf("sign-in while locked out: %d", code)
	}
	// A certificate is not a guess: an admin from the same host still gets in.
	if code, _, _ := get(t, e.client(pki.KindAdmin, "alice"), base+"/fleet"); code != http.StatusOK {
		t.Errorf("admin certificate during a lockout: %d", code)
	}
}
