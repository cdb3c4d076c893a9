package console

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/pki"
)

var remedRowRE = regexp.MustCompile(`<tr data-remediation="([^"]+)" data-state="([^"]+)">`)

// remedRows is the remediation ids a page lists, in order, with their states.
func remedRows(body string) []string {
	var out []string
	for _, m := range remedRowRE.FindAllStringSubmatch(body, -1) {
		out = append(out, m[1]+"="+m[2])
	}
	return out
}

func TestRemediationPages(t *testing.T) {
	t.Parallel()
	src := fakeFleet(16).withRemediations()
	_, ts, _ := insecureConsole(t, src, Config{})
	c := ts.Client()
	for _, tc := range []struct {
		name, path string
		code       int
		rows       string // the listed remediations, in order; "-": not checked
		want       []string
	}{
		{"all, newest first", "/remediations", 200, "rem-4=shadow,rem-3=shadow,rem-2=rma,rem-1=done",
			[]string{`id="mode"`, `mode <b>shadow</b>`, "nothing is drained or run until an operator approves it", "4 of 4 remediations",
				`<span class="mode-badge mode-auto">auto</span>`, "would: drain gpu-00001; run action gpu-reset (gpu=3); verify: passive checks and all_reduce; <a href=\"/remediations/rem-3\">and 1 more</a>", `href="/nodes/gpu-00001"`,
				"<td>4711</td><td class=\"n\">13</td><td>3: gpu-00003, gpu-00004, gpu-00005</td>", `<td><a href="/nodes/gpu-00002">gpu-00002</a></td><td>mlx5_0/1</td>`}},
		{"a node in a job event, no flagged port", "/remediations?node=gpu-00004", 200, "", []string{"Xid 13 on 3 nodes within 1m",
			`<table class="compact" id="flagged"><tr><th>node</th><th>port</th><th>flagged since</th><th>last flap</th><th>clears</th></tr>
<tr><td colspan="5" class="quiet">none</td></tr>`}},
		{"one node", "/remediations?node=gpu-00001", 200, "rem-3=shadow,rem-2=rma,rem-1=done",
			[]string{"3 of 3 remediations", `href="/remediations?node=gpu-00001&amp;state=rma">rma 1<`,
				`<table class="compact" id="job-events"><tr><th>when</th><th>job</th><th>Xid</th><th>nodes</th><th>why</th></tr>
<tr><td colspan="5" class="quiet">none</td></tr>`}},
		{"node and state", "/remediations?node=gpu-00001&state=rma", 200, "rem-2=rma", []string{"1 of 3 remediations", `<option selected>rma</option>`}},
		{"a state none is in", "/remediations?state=held", 200, "", []string{"no remediations in state held"}},
		{"unknown state", "/remediations?state=cake", 400, "-", []string{"want one of shadow, awaiting, rma"}},
		{"node name too long", "/remediations?node=" + strings.Repeat("n", maxNodeName+1), 400, "-", []string{"at most 253 bytes"}},
		{"shadow detail", "/remediations/rem-3", 200, "-", []string{`id="remed-state">shadow`, `id="remed-mode">shadow`,
			"would: run action gpu-reset (gpu=3)", "<li>would: return to service</li>", `<li class="rung-current">reset_gpu <b>`, `<li class="rung-ahead">reboot`,
			"XID_79", "opened in shadow mode", "no action run yet"}},
		{"RMA detail", "/remediations/rem-2", 200, "-", []string{`id="rma"`, "RMA rma-2", "io.fleetcheck.remediation.rma.opened",
			"gpu-00001/GPU1", `<span class="bad">not sent</span> after 3 tries: rma webhook: 503 Service Unavailable`,
			"1650923012345", "/var/lib/fleetcheck/bundles/gpu-00001.tar.gz", `<li class="rung-passed">reboot`,
			`recurred after <a href="/remediations/rem-1">`, "the node is drained by it"}},
		{"final: no actions", "/remediations/rem-1", 200, "-", []string{`id="remed-state">done`}},
		{"unknown id", "/remediations/rem-99", 404, "-", []string{"not found"}},
		{"node page links its remediations", "/nodes/gpu-00001", 200, "rem-3=shadow,rem-2=rma,rem-1=done",
			[]string{`href="/remediations?node=gpu-00001" id="node-remediations"`, `href="/remediations/rem-3"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, h := get(t, c, ts.URL+tc.path)
			if code != tc.code {
				t.Fatalf("GET %s: %d, want %d\n%.600s", tc.path, code, tc.code, body)
			}
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("GET %s lacks %q", tc.path, w)
				}
			}
			if got := strings.Join(remedRows(body), ","); tc.rows != "-" && got != tc.rows {
				t.Errorf("GET %s lists %q, want %q", tc.path, got, tc.rows)
			}
			if !strings.Contains(h.Get("Content-Security-Policy"), "default-src 'self'") {
				t.Errorf("GET %s: no content security policy", tc.path)
			}
		})
	}
	// The final one offers nothing, even on a console that acts.
	_, body, _ := get(t, c, ts.URL+"/remediations/rem-1")
	if strings.Contains(body, "data-action=") || strings.Contains(body, `id="read-only"`) {
		t.Errorf("a done remediation offers actions:\n%.1500s", body)
	}
	if got := src.controlled(); len(got) != 0 {
		t.Errorf("reading pages acted: %v", got)
	}
}

func TestRemediationLivePart(t *testing.T) {
	t.Parallel()
	src := fakeFleet(8).withRemediations()
	_, ts, _ := insecureConsole(t, src, Config{Actions: true})
	c := ts.Client()
	code, body, h := get(t, c, ts.URL+"/remediations?node=gpu-00002", liveHeader, "1")
	if code != 200 || strings.Contains(body, "<html") || strings.Join(remedRows(body), ",") != "rem-4=shadow" {
		t.Fatalf("live part: %d\n%.600s", code, body)
	}
	etag := h.Get("ETag")
	if code, _, _ := get(t, c, ts.URL+"/remediations?node=gpu-00002", liveHeader, "1", "If-None-Match", etag); code != http.StatusNotModified {
		t.Errorf("unchanged live part: %d, want 304", code)
	}
	_, page, _ := get(t, c, ts.URL+"/remediations/rem-4")
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no action form:\n%.1500s", page)
	}
	noFollow := *c
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if code, loc, body := post(t, &noFollow, ts.URL+"/remediations/rem-4/approve", url.Values{"csrf": {m[1]}}, ts.URL); code != http.StatusSeeOther {
		t.Fatalf("approve: %d %s\n%s", code, loc, body)
	}
	code, body, h = get(t, c, ts.URL+"/remediations?node=gpu-00002", liveHeader, "1", "If-None-Match", etag)
	if code != 200 || h.Get("ETag") == etag || strings.Join(remedRows(body), ",") != "rem-4=draining" {
		t.Errorf("after approve the live part is %d %q", code, remedRows(body))
	}
}

func TestRemediationOff(t *testing.T) {
	t.Parallel()
	src := fakeFleet(8)
	src.remedOff = true
	_, ts, _ := insecureConsole(t, src, Config{Actions: true})
	if code, body, _ := get(t, ts.Client(), ts.URL+"/remediations"); code != 200 || !strings.Contains(body, "runs no remediation ladder") {
		t.Errorf("/remediations without a ladder: %d\n%.400s", code, body)
	}
	if code, _, _ := get(t, ts.Client(), ts.URL+"/remediations/rem-1"); code != 404 {
		t.Errorf("a remediation without a ladder: %d, want 404", code)
	}
	if code, body, _ := get(t, ts.Client(), ts.URL+"/nodes/gpu-00001"); code != 200 || strings.Contains(body, "node-remediations") {
		t.Errorf("node page without a ladder: %d, links remediations: %v", code, strings.Contains(body, "node-remediations"))
	}
}

// Approve and cancel: only on a console that acts, same-origin with the
// CSRF token, for an operator; each reaches the service (which audits it)
// once, under the operator's name.
func TestRemediationActions(t *testing.T) {
	t.Parallel()
	src := fakeFleet(8).withRemediations()
	_, base, e := tlsConsole(t, src, Config{})
	admin := e.client(pki.KindAdmin, "alice")
	_, page, _ := get(t, admin, base+"/remediations/rem-3")
	if strings.Contains(page, `data-action="approve"`) || !strings.Contains(page, `id="read-only"`) ||
		!strings.Contains(page, "fleetcheck remediation approve rem-3") {
		t.Errorf("a read-only console offers approve:\n%.2000s", page)
	}
	m := csrfRE.FindStringSubmatch(page) // the layout's sign-out-free pages still carry none
	csrf := ""
	if m != nil {
		csrf = m[1]
	}
	for _, action := range []string{"approve", "cancel"} {
		if code, _, body := post(t, admin, base+"/remediations/rem-3/"+action, url.Values{"csrf": {csrf}}, base); code != http.StatusForbidden || !strings.Contains(body, "console.actions: false") {
			t.Errorf("%s on a read-only console: %d\n%.300s", action, code, body)
		}
	}
	if got := src.controlled(); len(got) != 0 {
		t.Fatalf("a read-only console reached the service: %v", got)
	}

	src = fakeFleet(8).withRemediations()
	_, base, e = tlsConsole(t, src, Config{Actions: true})
	admin = e.client(pki.KindAdmin, "alice")
	_, page, _ = get(t, admin, base+"/remediations/rem-3")
	m = csrfRE.FindStringSubmatch(page)
	if m == nil || !strings.Contains(page, `data-action="approve"`) || !strings.Contains(page, `data-action="cancel"`) {
		t.Fatalf("no approve and cancel on a shadow remediation:\n%.2000s", page)
	}
	csrf = m[1]
	u := base + "/remediations/rem-3/approve"
	for _, tc := range []struct {
		name   string
		c      *http.Client
		form   url.Values
		origin string
	}{
		{"no csrf token", admin, url.Values{}, base},
		{"wrong csrf token", admin, url.Values{"csrf": {strings.Repeat("0", 64)}}, base},
		{"another site", admin, url.Values{"csrf": {csrf}}, "https://evil.example"},
		{"another admin's token", e.client(pki.KindAdmin, "bob"), url.Values{"csrf": {csrf}}, base},
		{"node certificate", e.client(pki.KindNode, "gpu-00001"), url.Values{"csrf": {csrf}}, base},
		{"coordinator certificate", e.client(pki.KindCoordinator, "other"), url.Values{"csrf": {csrf}}, base},
	} {
		if code, _, body := post(t, tc.c, u, tc.form, tc.origin); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403\n%.300s", tc.name, code, body)
		}
	}
	if got := src.controlled(); len(got) != 0 {
		t.Fatalf("refused requests reached the service: %v", got)
	}

	code, loc, body := post(t, admin, u, url.Values{"csrf": {csrf}}, base)
	if code != http.StatusSeeOther || loc != "/remediations/rem-3?done=approve" {
		t.Fatalf("approve: %d to %q\n%s", code, loc, body)
	}
	_, page, _ = get(t, admin, base+loc)
	if !strings.Contains(page, `id="remed-state">draining`) || !strings.Contains(page, `id="flash">approve: done`) {
		t.Errorf("after approve:\n%.1500s", page)
	}
	// Approved once: a second approve is the engine's refusal, answered 409.
	if code, _, body := post(t, admin, u, url.Values{"csrf": {csrf}}, base); code != http.StatusConflict || !strings.Contains(body, "not possible in this state") {
		t.Errorf("approve twice: %d\n%.300s", code, body)
	}
	if code, loc, body := post(t, admin, base+"/remediations/rem-2/cancel", url.Values{"csrf": {csrf}, "reason": {"part on order"}}, base); code != http.StatusSeeOther || loc != "/remediations/rem-2?done=cancel" {
		t.Errorf("cancel: %d to %q\n%s", code, loc, body)
	}
	if code, _, _ := post(t, admin, base+"/remediations/rem-2/cancel", url.Values{"csrf": {csrf}, "reason": {strings.Repeat("x", maxReason+1)}}, base); code != http.StatusBadRequest {
		t.Errorf("a reason over %d bytes: %d, want 400", maxReason, code)
	}
	if code, _, _ := post(t, admin, base+"/remediations/rem-1/reboot", url.Values{"csrf": {csrf}}, base); code != http.StatusBadRequest {
		t.Errorf("an action the console does not offer: %d, want 400", code)
	}
	if code, _, _ := post(t, admin, base+"/remediations/rem-99/approve", url.Values{"csrf": {csrf}}, base); code != http.StatusNotFound {
		t.Errorf("approve an unknown remediation: %d, want 404", code)
	}
	// A bearer token needs no CSRF token (no browser sends it for another site).
	req, _ := http.NewRequest(http.MethodPost, base+"/remediations/rem-4/approve", nil)
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err := e.client("", "").Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Errorf("bearer approve: %d", resp.StatusCode)
	}
	want := []string{
		"admin:alice remediation rem-3 approve",
		"admin:alice remediation rem-3 approve",
		"admin:alice remediation rem-2 cancel part on order (from the console)",
		"admin:alice remediation rem-99 approve",
		"token:alice remediation rem-4 approve",
	}
	if got := src.controlled(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the service got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
