//go:build browser

// The console in a real browser (make test-browser): Debian's chromium,
// headless, driven by chromedp, against a real coordinator with mutual TLS
// and real agents on simulated nodes, all on 127.0.0.1. With
// CONSOLE_SCREENSHOTS=DIR each page's screenshot is written there
// (docs/console/ holds the committed ones).
package console_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/coordinator/console"
	"github.com/fleetcheck/fleetcheck/internal/needs"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

const (
	td        = "fleet.test"
	token     = "browser-0123456789abcdefghij"
	nodes     = 8
	agentPass = 3 * time.Second // every agent's pass interval
	refresh   = 500 * time.Millisecond
)

// stage is a coordinator with its console and a simulated fleet.
type stage struct {
	t       *testing.T
	dir     string
	ca      *pki.CA
	srv     *coordinator.Server
	console string // its URL
	logs    *syncBuf
	certs   pki.Files // the coordinator's
	tokens  string    // the console's token file
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (st *stage) files(dir string, kind pki.Kind, name string, ips ...net.IP) (cert, key, ca string) {
	st.t.Helper()
	leaf, err := st.ca.Issue(pki.Request{Kind: kind, Name: name, IPs: ips})
	if err != nil {
		st.t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		st.t.Fatal(err)
	}
	cert, key, err = pki.WriteLeaf(dir, leaf, false)
	if err != nil {
		st.t.Fatal(err)
	}
	if ca, err = pki.WriteCACert(dir, st.ca.Cert, false); err != nil {
		st.t.Fatal(err)
	}
	return cert, key, ca
}

func newStage(t *testing.T) *stage {
	t.Helper()
	ca, err := pki.NewCA(td, pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := &stage{t: t, dir: t.TempDir(), ca: ca, logs: &syncBuf{}}
	t.Cleanup(func() {
		if t.Failed() {
			l := st.logs.String()
			t.Logf("log (last 6000 bytes):\n%s", l[max(0, len(l)-6000):])
		}
	})
	cert, key, caf := st.files(filepath.Join(st.dir, "coordinator"), pki.KindCoordinator, "main", net.ParseIP("127.0.0.1"))
	st.certs = pki.Files{CertFile: cert, KeyFile: key, CAFile: caf}
	tokens := filepath.Join(st.dir, "console.tokens")
	st.tokens = tokens
	if err := os.WriteFile(tokens, []byte("browser "+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := coordinator.Config{
		Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: filepath.Join(st.dir, "data"),
		HeartbeatInterval: time.Second,
		TLS:               coordinator.TLSConfig{CertFile: cert, KeyFile: key, CAFile: caf, TrustDomain: td},
		Console:           console.Config{Enabled: true, Listen: "127.0.0.1:0", TokenFile: tokens, Actions: true, Refresh: refresh},
	}
	log := zerolog.New(st.logs).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	opts, _, err := coordinator.Secure(cfg, coordinator.Options{Logger: log, Version: "browser-test"})
	if err != nil {
		t.Fatal(err)
	}
	if st.srv, err = coordinator.New(cfg, opts); err != nil {
		t.Fatal(err)
	}
	if err := st.srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.srv.Stop(context.Background()) })
	st.console = strings.TrimSuffix(st.srv.ConsoleURL(), "/")
	if !strings.HasPrefix(st.console, "https://127.0.0.1:") {
		t.Fatalf("console at %q, want https on 127.0.0.1", st.console)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var agents sync.WaitGroup
	t.Cleanup(func() { cancel(); agents.Wait() })
	for i := 1; i <= nodes; i++ {
		name := fmt.Sprintf("gpu-%03d", i)
		dir := filepath.Join(st.dir, name)
		cert, key, caf := st.files(dir, pki.KindNode, name)
		drill := ""
		if i == 2 {
			drill = ", fleetcheck.io/drill: allowed"
		}
		a, err := agent.ParseConfig([]byte(fmt.Sprintf(`node: %s
labels: {sku: h100-sxm-80g-x8, rack: r%02d, leaf: leaf01%s}
coordinator: %s
tls: {ca_file: %s, cert_file: %s, key_file: %s, trust_domain: %s}
state_dir: %s
metrics_listen: "off"
activity: idle
interval: %s
reconnect: {initial: 100ms, max: 1s}
host: {mode: sim, seed: %d}
actions:
  sim-fault:
    command: [sim-fault, "{kind}", "{target}"]
    params: {kind: '[a-z_]+', target: '[A-Za-z0-9_]+'}
    revert: sim-clear
  sim-clear:
    command: [sim-clear, "{kind}", "{target}"]
    params: {kind: '[a-z_]+', target: '[A-Za-z0-9_]+'}
`, name, (i-1)/4+1, drill, st.srv.GRPCAddr(), caf, cert, key, td, filepath.Join(dir, "state"), agentPass, i)))
		if err != nil {
			t.Fatal(err)
		}
		alog := log.With().Str("node", name).Logger()
		h, err := agent.OpenHost(a, alog)
		if err != nil {
			t.Fatal(err)
		}
		ag, err := agent.New(a, h, alog, agent.WithVersion("browser-test"))
		if err != nil {
			t.Fatal(err)
		}
		agents.Add(1)
		go func() {
			defer agents.Done()
			if err := ag.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				alog.Error().Err(err).Msg("agent stopped")
			}
		}()
	}
	testwait.For(t, 90*time.Second, "every node healthy", func() (bool, string) {
		ns, err := st.srv.Store().Nodes(context.Background())
		if err != nil {
			return false, err.Error()
		}
		healthy := 0
		for _, n := range ns {
			if n.State == coordinator.StateHealthy {
				healthy++
			}
		}
		return healthy == nodes, fmt.Sprintf("%d of %d nodes healthy", healthy, len(ns))
	})
	return st
}

// client is an HTTPS client with a certificate of kind.
func (st *stage) client(kind pki.Kind, name string) *http.Client {
	cert, key, caf := st.files(filepath.Join(st.dir, "clients", string(kind)+"-"+name), kind, name)
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		st.t.Fatal(err)
	}
	pem, err := os.ReadFile(caf)
	if err != nil {
		st.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS13}}}
}

// campaigns is the CampaignService with an admin certificate, as the CLI calls it.
func (st *stage) campaigns() pb.CampaignServiceClient {
	cert, key, caf := st.files(filepath.Join(st.dir, "clients", "cli"), pki.KindAdmin, "cli")
	r, err := pki.NewReloader(pki.Files{CertFile: cert, KeyFile: key, CAFile: caf}, pki.ReloaderOptions{})
	if err != nil {
		st.t.Fatal(err)
	}
	creds, err := pki.ClientCredentials(pki.ClientOptions{Reloader: r, TrustDomain: td})
	if err != nil {
		st.t.Fatal(err)
	}
	cc, err := grpc.NewClient(st.srv.GRPCAddr().String(), grpc.WithTransportCredentials(creds))
	if err != nil {
		st.t.Fatal(err)
	}
	st.t.Cleanup(func() { cc.Close() })
	return pb.NewCampaignServiceClient(cc)
}

// browser is one headless chromium tab and the console errors it saw.
type browser struct {
	t   *testing.T
	ctx context.Context

	mu     sync.Mutex
	errors []string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := needs.Tool(t, "chromium", "apt-get install chromium")
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.IgnoreCertErrors, chromedp.WindowSize(1280, 900))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	b := &browser{t: t, ctx: ctx}
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatal(err)
	}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == "error" {
				b.mu.Lock()
				b.errors = append(b.errors, m.String())
				b.mu.Unlock()
			}
		}
	}()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatal(err)
	}
	return b
}

// do runs actions with a deadline.
func (b *browser) do(t testing.TB, what string, within time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, within)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// poll waits until the page's expression is true.
func (b *browser) poll(t testing.TB, what, expr string, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, within+5*time.Second)
	defer cancel()
	// A poll does not survive a navigation (a submitted form): then poll
	// the new document.
	var err error
	for ctx.Err() == nil {
		if _, err = chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(50*time.Millisecond),
			chromedp.WithPollingTimeout(within))); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond) // a navigation's moment
	}
	t.Fatalf("waiting for %s: %v", what, err)
}

func (b *browser) eval(t testing.TB, expr string, opts ...chromedp.EvaluateOption) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr, opts...))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// takeErrors returns the console errors since the last call.
func (b *browser) takeErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	errs := b.errors
	b.errors = nil
	return errs
}

// noErrors fails the test for any console error since the last call.
func (b *browser) noErrors(t testing.TB, page string) {
	t.Helper()
	for _, e := range b.takeErrors() {
		t.Errorf("%s: console error: %s", page, e)
	}
}

// shot writes the page's screenshot when CONSOLE_SCREENSHOTS names a folder.
func (b *browser) shot(t testing.TB, name string) {
	t.Helper()
	dir := os.Getenv("CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestBrowserConsole(t *testing.T) {
	st := newStage(t)
	b := newBrowser(t)
	base := st.console

	t.Run("node certificate refused", func(t *testing.T) {
		for _, c := range []struct {
			kind pki.Kind
			code int
		}{{pki.KindNode, http.StatusForbidden}, {pki.KindAdmin, http.StatusOK}} {
			resp, err := st.client(c.kind, "gpu-001").Get(base + "/fleet")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.code {
				t.Errorf("%s certificate: %d, want %d", c.kind, resp.StatusCode, c.code)
			}
		}
	})

	// Sign in with the token; then every page renders with no console error.
	b.do(t, "sign in", 20*time.Second, chromedp.Navigate(base+"/login"), chromedp.WaitVisible(`input[name=token]`),
		chromedp.SendKeys(`input[name=token]`, token), chromedp.Submit(`input[name=token]`), chromedp.WaitVisible(`#nodes`))
	b.noErrors(t, "/login")
	if got := b.eval(t, `document.querySelector("#matched").textContent`); !strings.Contains(got, "8 of 8 nodes") {
		t.Errorf("fleet page says %q", got)
	}
	b.shot(t, "fleet")

	t.Run("selector filter narrows the fleet", func(t *testing.T) {
		b.do(t, "filter", 20*time.Second, chromedp.SetValue(`#sel`, "rack=r02"), chromedp.Submit(`#sel`))
		b.poll(t, "the filtered URL", `location.search.includes("rack%3Dr02") && !!document.querySelector("#nodes")`, 10*time.Second)
		rows := b.eval(t, `Array.from(document.querySelectorAll("#nodes tr[data-node]")).map(r => r.dataset.node).join(",")`)
		if rows != "gpu-005,gpu-006,gpu-007,gpu-008" {
			t.Errorf("rack=r02 shows %q", rows)
		}
		b.noErrors(t, "/fleet?sel=rack=r02")
	})

	t.Run("a fault appears within one agent interval", func(t *testing.T) {
		b.do(t, "fleet", 20*time.Second, chromedp.Navigate(base+"/fleet"), chromedp.WaitVisible(`#nodes`))
		b.eval(t, `window.__sameDocument = "yes"`)
		start := time.Now()
		res, err := st.srv.Fleet().RunAction(context.Background(), "gpu-003", "sim-fault",
			map[string]string{"kind": "ib_port_down", "target": "mlx5_4", "revert_after": "10m"}, kit.RunOptions{Timeout: 10 * time.Second})
		if err != nil || !res.OK {
			t.Fatalf("inject: %+v %v", res, err)
		}
		injected := time.Since(start)
		b.poll(t, "the fault on the fleet page", `!!document.querySelector('#nodes tr[data-node="gpu-003"][data-state="failed"]')`, agentPass+10*time.Second)
		took := time.Since(start)
		t.Logf("fault shown on the fleet page %s after injection (the action itself %s; agent interval %s, page refresh %s)",
			took.Round(10*time.Millisecond), injected.Round(10*time.Millisecond), agentPass, refresh)
		// One interval for the agent's next pass, plus the page's poll and
		// the pass itself on two shared cores.
		if limit := agentPass + refresh + 2*time.Second; took > limit {
			t.Errorf("fault shown after %s, want within %s", took, limit)
		}
		if b.eval(t, `window.__sameDocument || ""`) != "yes" {
			t.Error("the page was reloaded: the update should come without one")
		}
		if f := b.eval(t, `document.querySelector('#nodes tr[data-node="gpu-003"] .failing').textContent`); !strings.Contains(f, "ib.ports") {
			t.Errorf("gpu-003's failing checks: %q", f)
		}
		b.noErrors(t, "/fleet (live)")
		b.shot(t, "fleet-fault")
	})

	t.Run("node page", func(t *testing.T) {
		b.do(t, "node", 20*time.Second, chromedp.Navigate(base+"/nodes/gpu-003"), chromedp.WaitVisible(`#timelines`))
		if got := b.eval(t, `document.querySelector("#gpus").textContent`); !strings.Contains(got, "GPU-") && !strings.Contains(got, "H100") {
			t.Errorf("no GPU inventory: %.200q", got)
		}
		if got := b.eval(t, `document.querySelector("#findings") ? document.querySelector("#findings").textContent : ""`); !strings.Contains(got, "mlx5_4") {
			t.Errorf("findings lack the port down: %.300q", got)
		}
		b.noErrors(t, "/nodes/gpu-003")
		b.shot(t, "node")
	})

	t.Run("a campaign's progress updates live", func(t *testing.T) {
		doc, err := st.campaigns().DrillStart(context.Background(), &pb.SpecRequest{Spec: []byte(`
name: browser-ib-loss
fault: sim-fault
revert: sim-clear
params: {kind: ib_port_down, target: mlx5_2}
expect: {check: ib.ports, out_of_service: false}
targets: "name=gpu-002"
blast_radius: {max_nodes: 1}
fleet_health: {max_degraded_share: 0.5}
deadline: 1m
poll_interval: 1s
watch: [ib.ports]
revert_after: 2m
revert_on_disconnect: 1m
recover_grace: 30s
who: browser-test
`)})
		if err != nil {
			t.Fatal(err)
		}
		id := doc.GetId()
		b.do(t, "drill page", 20*time.Second, chromedp.Navigate(base+"/campaigns/drill/"+id), chromedp.WaitVisible(`#progress`))
		b.eval(t, `window.__sameDocument = "yes"`)
		first := b.eval(t, `document.querySelector("#state").textContent`)
		b.poll(t, "the drill to finish on the page", `!!document.querySelector("#state") && document.querySelector("#state").textContent === "done"`, 90*time.Second)
		if b.eval(t, `window.__sameDocument || ""`) != "yes" {
			t.Error("the page was reloaded: progress should come without one")
		}
		ttd := b.eval(t, `document.querySelector("#drill-rows tr:nth-child(2) td:nth-child(3)").textContent`)
		t.Logf("drill %s: %s -> done on the page; time to detect %s", id, first, ttd)
		if ttd == "-" || ttd == "" {
			t.Errorf("no time to detect shown: %q", ttd)
		}
		b.noErrors(t, "/campaigns/drill/"+id)
		b.shot(t, "drill")
		b.do(t, "campaigns", 20*time.Second, chromedp.Navigate(base+"/campaigns"), chromedp.WaitVisible(`#drills`))
		if got := b.eval(t, `document.querySelector("#drills").textContent`); !strings.Contains(got, id) {
			t.Errorf("campaigns page lacks drill %s", id)
		}
		b.noErrors(t, "/campaigns")
		b.shot(t, "campaigns")
	})

	t.Run("events", func(t *testing.T) {
		b.do(t, "events", 20*time.Second, chromedp.Navigate(base+"/events?kind=audit"), chromedp.WaitVisible(`#events`))
		if got := b.eval(t, `document.querySelector("#events").textContent`); !strings.Contains(got, "drill.start") {
			t.Errorf("the audit log lacks the drill's start: %.400q", got)
		}
		b.noErrors(t, "/events")
		b.shot(t, "events")
	})

	// Last: it drains gpu-003 and signs in on a second console.
	t.Run("remediation", func(t *testing.T) { testRemediation(t, st, b) })
}

// testRemediation: the port taken down on gpu-003 (a reseat finding) is a
// shadow remediation, listed from the node page and shown live; a
// read-only console shows it without approve and refuses a POST; the
// signed-in operator approves it and cancels it from its page, and both
// are in the audit log under the operator's name.
func testRemediation(t *testing.T, st *stage, b *browser) {
	base := st.console
	b.do(t, "node page", 20*time.Second, chromedp.Navigate(base+"/nodes/gpu-003"), chromedp.WaitVisible(`#node-remediations`),
		chromedp.Click(`#node-remediations`))
	b.poll(t, "gpu-003's shadow reseat on the remediation list", `location.pathname === "/remediations" && location.search.includes("node=gpu-003") &&
		!!document.querySelector('#remediations tr[data-state="shadow"]')`, agentPass+10*time.Second)
	id := b.eval(t, `document.querySelector('#remediations tr[data-state="shadow"]').dataset.remediation`)
	if got := b.eval(t, `document.querySelector("#mode").textContent`); !strings.Contains(got, "shadow") {
		t.Errorf("the list does not say the mode: %q", got)
	}
	if got := b.eval(t, `document.querySelector('#remediations tr[data-state="shadow"]').textContent`); !strings.Contains(got, "mlx5_4/1") || !strings.Contains(got, "would:") {
		t.Errorf("the shadow row: %q", got)
	}
	b.noErrors(t, "/remediations?node=gpu-003")
	b.shot(t, "remediations")

	t.Run("a read-only console refuses approve", func(t *testing.T) {
		ro, err := readOnlyConsole(t, st)
		if err != nil {
			t.Fatal(err)
		}
		b.do(t, "sign in (read-only)", 20*time.Second, chromedp.Navigate(ro+"/login?next=/remediations/"+id), chromedp.WaitVisible(`input[name=token]`),
			chromedp.SendKeys(`input[name=token]`, token), chromedp.Submit(`input[name=token]`), chromedp.WaitVisible(`#remed-state`))
		if n := b.eval(t, `String(document.querySelectorAll("button[data-action]").length)`); n != "0" {
			t.Errorf("a read-only console shows %s action buttons", n)
		}
		if got := b.eval(t, `document.querySelector("#read-only") ? document.querySelector("#read-only").textContent : ""`); !strings.Contains(got, "fleetcheck remediation approve "+id) {
			t.Errorf("no read-only note naming the CLI: %q", got)
		}
		b.noErrors(t, ro+"/remediations/"+id)
		got := b.eval(t, `fetch("/remediations/`+id+`/approve", {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "csrf=x"})
			.then(r => r.text().then(t => r.status + " " + t))`, chromedp.EvalAwaitPromise)
		if !strings.HasPrefix(got, "403 ") || !strings.Contains(got, "console.actions: false") {
			t.Errorf("POST approve on a read-only console: %.300q", got)
		}
		for _, e := range b.takeErrors() { // the refused POST, as the browser logs it
			if !strings.Contains(e, "403") {
				t.Errorf("console error: %s", e)
			}
		}
	})

	// The read-only console's sign-in took the cookie (same host): sign in again.
	b.do(t, "sign in", 20*time.Second, chromedp.Navigate(base+"/login?next=/remediations/"+id), chromedp.WaitVisible(`input[name=token]`),
		chromedp.SendKeys(`input[name=token]`, token), chromedp.Submit(`input[name=token]`), chromedp.WaitVisible(`button[data-action=approve]`))
	if got := b.eval(t, `document.querySelector("#remed-state").textContent + " " + document.querySelector("#remed-mode").textContent`); got != "shadow shadow" {
		t.Errorf("before approve (the read-only POST must have changed nothing): %q", got)
	}
	if got := b.eval(t, `document.querySelector("#would").textContent`); !strings.Contains(got, "would: drain gpu-003") {
		t.Errorf("no would: %q", got)
	}
	// The live part is swapped in every refresh (its "updated" age
	// changes), so each action is one click in the page's own script:
	// never a node found by one step and clicked by the next.
	b.eval(t, `document.querySelector("button[data-action=approve]").click(), "clicked"`)
	b.poll(t, "the approved remediation", `!!document.querySelector("#flash") && document.querySelector("#remed-state").textContent !== "shadow" &&
		document.querySelector("#remed-mode").textContent === "auto"`, 10*time.Second)
	b.noErrors(t, "/remediations/"+id+" (approved)")
	b.shot(t, "remediation")

	b.do(t, "cancel button", 20*time.Second, chromedp.WaitVisible(`button[data-action=cancel]`))
	b.eval(t, `(f => { f.querySelector("input[name=reason]").value = "port reseated by hand"; f.querySelector("button").click(); return "clicked" })(document.querySelector('form[action$="/cancel"]'))`)
	b.poll(t, "the cancelled remediation", `!!document.querySelector("#remed-state") && document.querySelector("#remed-state").textContent === "cancelled"`, 10*time.Second)
	if got := b.eval(t, `document.querySelector("#transitions").textContent`); !strings.Contains(got, "approved by browser") || !strings.Contains(got, "port reseated by hand (from the console)") {
		t.Errorf("transitions: %.600q", got)
	}
	b.noErrors(t, "/remediations/"+id+" (cancelled)")

	b.do(t, "audit log", 20*time.Second, chromedp.Navigate(base+"/events?kind=audit"), chromedp.WaitVisible(`#events`))
	audit := b.eval(t, `Array.from(document.querySelectorAll("#events tr")).map(r => r.textContent).filter(t => t.includes("remediation.")).join("\n")`)
	for _, want := range []string{"token:browserremediation.approve: " + id, "token:browserremediation.cancel: " + id + ": port reseated by hand (from the console)"} {
		if !strings.Contains(audit, want) {
			t.Errorf("the audit log lacks %q:\n%s", want, audit)
		}
	}
	b.noErrors(t, "/events")
}

// readOnlyConsole serves a second console of the same coordinator with
// actions off, on 127.0.0.1, as an operator's read-only one would be.
func readOnlyConsole(t *testing.T, st *stage) (string, error) {
	certs, err := pki.NewReloader(st.certs, pki.ReloaderOptions{})
	if err != nil {
		return "", err
	}
	c, err := console.New(console.Config{Listen: "127.0.0.1:0", TokenFile: st.tokens, Refresh: refresh},
		console.Options{Source: st.srv.ConsoleSource(), TrustDomain: td, Certs: certs, Logger: zerolog.Nop()})
	if err != nil {
		return "", err
	}
	if err := c.Start(); err != nil {
		return "", err
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return strings.TrimSuffix(c.URL(), "/"), nil
}
