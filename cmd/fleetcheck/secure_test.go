package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/agent/metrics"
	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/promserve"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// issued names the files `fleetcheck certs issue` wrote for one identity.
type issued struct{ cert, key, ca string }

// issue runs `fleetcheck certs issue KIND NAME` into its own directory.
func issue(t *testing.T, caDir, kind, name string, extra ...string) issued {
	t.Helper()
	out := t.TempDir()
	args := append([]string{"certs", "issue", kind, name, "--dir", caDir, "--out", out}, extra...)
	if msg, code := execute(t, args...); code != 0 {
		t.Fatalf("certs issue %s %s: %s", kind, name, msg)
	}
	return issued{
		cert: filepath.Join(out, kind+"-"+name+".crt"),
		key:  filepath.Join(out, kind+"-"+name+".key"),
		ca:   filepath.Join(out, "ca.crt"),
	}
}

// runAgent runs a real agent over an example bundle, with mTLS from id.
func runAgent(t *testing.T, node, coord string, id issued, reg prometheus.Registerer) (stop func()) {
	t.Helper()
	h, err := bundle.Open(filepath.Join(examples, "bundles/h100-healthy"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := agent.DefaultConfig()
	cfg.Node = node
	cfg.Coordinator = coord
	cfg.TLS = agent.TLSConfig{CAFile: id.ca, CertFile: id.cert, KeyFile: id.key, TrustDomain: "fleet.test"}
	cfg.StateDir = t.TempDir()
	cfg.Interval = config.Duration(time.Hour)
	cfg.Activity = agent.ActivityIdle
	opts := []agent.Option{agent.WithBackoff(agent.ExpBackoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond})}
	if reg != nil {
		am, err := metrics.NewAgent(reg, metrics.AgentInfo{Node: node, Version: "test"})
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, agent.WithMetrics(am))
	}
	a, err := agent.New(cfg, h, zerolog.Nop(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := a.Run(ctx); err != nil {
			t.Errorf("agent %s: %v", node, err)
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// issueWith issues req from ca into its own directory, for certificates
// `fleetcheck certs` will not make (expired, not yet valid).
func issueWith(t *testing.T, ca *pki.CA, req pki.Request) issued {
	t.Helper()
	leaf, err := ca.Issue(req)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	cert, key, err := pki.WriteLeaf(out, leaf, false)
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := pki.WriteCACert(out, ca.Cert, false)
	if err != nil {
		t.Fatal(err)
	}
	return issued{cert: cert, key: key, ca: caFile}
}

// lockedBuf is a log sink written from many goroutines.
type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.WriteString(string(p))
}

func (l *lockedBuf) has(part string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.b.String(), part)
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// TestSecureFleet runs what an operator deploys: certificates from
// `fleetcheck certs`, a coordinator on mutual TLS wired as `fleetcheck
// coordinator` wires it, a real agent with a node certificate, and the
// operator's CLI with an admin certificate.
func TestSecureFleet(t *testing.T) {
	caDir := filepath.Join(t.TempDir(), "ca")
	if msg, code := execute(t, "certs", "init", "--dir", caDir, "--trust-domain", "fleet.test"); code != 0 {
		t.Fatal(msg)
	}
	// A new CA vouches for its domain and none below it.
	if out, code := execute(t, "certs", "show", filepath.Join(caDir, "ca.crt")); code != 0 ||
		!strings.Contains(out, "constraints: permits URI fleet.test; excludes URI .fleet.test") {
		t.Fatalf("certs show of a new CA: %d\n%s", code, out)
	}
	coordID := issue(t, caDir, "coordinator", "coord", "--ip", "127.0.0.1")
	nodeID := issue(t, caDir, "node", "gpu-001")
	otherID := issue(t, caDir, "node", "gpu-002")
	admin := issue(t, caDir, "admin", "alice")

	// The config as an operator writes it, paths relative to the file.
	dir := t.TempDir()
	for _, f := range []string{coordID.cert, coordID.key, coordID.ca} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// ca_file also holds two CAs of the parent domain "test": one from
	// today's `certs init`, one as fleetcheck made them before subdomains
	// were excluded. Neither may vouch for anyone in fleet.test.
	parentDir := filepath.Join(t.TempDir(), "parent-ca")
	if msg, code := execute(t, "certs", "init", "--dir", parentDir, "--trust-domain", "test"); code != 0 {
		t.Fatal(msg)
	}
	parentNew, err := pki.LoadCA(parentDir, "")
	if err != nil {
		t.Fatal(err)
	}
	parentOld := oldStyleCA(t, "test")
	caBundle, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	caBundle = append(append(caBundle, pki.EncodeCert(parentNew.Cert)...), pki.EncodeCert(parentOld.Cert)...)
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), caBundle, 0o600); err != nil {
		t.Fatal(err)
	}
	cfgFile := filepath.Join(dir, "coordinator.yaml")
	if err := os.WriteFile(cfgFile, []byte(`listen: 127.0.0.1:0
http_listen: 127.0.0.1:0
data_dir: data
heartbeat_interval: 1s
tls:
  cert_file: coordinator-coord.crt
  key_file: coordinator-coord.key
  ca_file: ca.crt
  trust_domain: fleet.test
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := coordinator.LoadConfig(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DataDir = filepath.Join(dir, "data")
	var logs lockedBuf
	srv, certs, err := newCoordinator(cfg, zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if certs == nil {
		t.Fatal("no certificate reloader for a TLS coordinator")
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	addr := srv.GRPCAddr().String()
	ctx := context.Background()

	agentReg := prometheus.NewRegistry()
	stopAgent := runAgent(t, "gpu-001", addr, nodeID, agentReg)
	testwait.Until(t, 20*time.Second, "gpu-001 healthy", func() bool {
		n, err := srv.Store().Node(ctx, "gpu-001")
		return err == nil && n.State == coordinator.StateHealthy
	})

	// A certificate for gpu-002 in an agent configured as gpu-003: the
	// agent will not start, and says why.
	wrong := agent.DefaultConfig()
	wrong.Node, wrong.Coordinator, wrong.StateDir = "gpu-003", addr, t.TempDir()
	wrong.TLS = agent.TLSConfig{CAFile: otherID.ca, CertFile: otherID.cert, KeyFile: otherID.key, TrustDomain: "fleet.test"}
	h, err := bundle.Open(filepath.Join(examples, "bundles/h100-healthy"))
	if err != nil {
		t.Fatal(err)
	}
	wa, err := agent.New(wrong, h, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if err := wa.Run(ctx); !errors.Is(err, agent.ErrWrongIdentity) || !strings.Contains(err.Error(), "spiffe://fleet.test/node/gpu-002") {
		t.Fatalf("agent gpu-003 on gpu-002's certificate: %v, want it refusing to start", err)
	}
	// Whoever speaks for gpu-003 on that certificate anyway is refused.
	if err := helloAs(ctx, addr, otherID, "gpu-003"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("hello as gpu-003 on gpu-002's certificate: %v, want PermissionDenied", err)
	}
	if _, err := srv.Store().Node(ctx, "gpu-003"); err == nil {
		t.Error("gpu-003 joined on gpu-002's certificate")
	}

	op := []string{"--coordinator", addr, "--cert", admin.cert, "--key", admin.key, "--ca", admin.ca, "--trust-domain", "fleet.test"}
	out, code := execute(t, append([]string{"nodes", "-o", "json"}, op...)...)
	if code != 0 {
		t.Fatalf("nodes with an admin certificate: %d %s", code, out)
	}
	var listing struct {
		Nodes []struct{ Name, State string }
	}
	if err := json.Unmarshal([]byte(out), &listing); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(listing.Nodes) != 1 || listing.Nodes[0].Name != "gpu-001" || listing.Nodes[0].State != "healthy" {
		t.Fatalf("nodes = %+v", listing.Nodes)
	}

	// The same from the environment.
	t.Setenv(envCert, admin.cert)
	t.Setenv(envKey, admin.key)
	t.Setenv(envCA, admin.ca)
	if out, code := execute(t, "nodes", "--coordinator", addr); code != 0 || !strings.Contains(out, "gpu-001") {
		t.Fatalf("nodes with the certificate from the environment: %d %s", code, out)
	}
	t.Setenv(envCert, "")
	t.Setenv(envKey, "")
	t.Setenv(envCA, "")

	// What a hostile or misconfigured client gets (docs/security.md).
	ours, err := pki.LoadCA(caDir, "")
	if err != nil {
		t.Fatal(err)
	}
	expired := issueWith(t, ours, pki.Request{Kind: pki.KindAdmin, Name: "old", NotBefore: time.Now().Add(-48 * time.Hour), Validity: time.Hour})
	future := issueWith(t, ours, pki.Request{Kind: pki.KindAdmin, Name: "early", NotBefore: time.Now().Add(48 * time.Hour)})
	strangerDir := filepath.Join(t.TempDir(), "ca")
	if msg, code := execute(t, "certs", "init", "--dir", strangerDir, "--trust-domain", "fleet.test"); code != 0 {
		t.Fatal(msg)
	}
	stranger := issue(t, strangerDir, "admin", "mallory")
	with := func(id issued, extra ...string) []string {
		return append([]string{"--coordinator", addr, "--cert", id.cert, "--key", id.key, "--ca", id.ca}, extra...)
	}
	refusedCLI := []struct {
		name string
		args []string
		want string
	}{
		{"node certificate", append([]string{"nodes"}, with(nodeID)...),
			"permission denied: node:gpu-001 may not call /fleetcheck.v1.OperatorService/ListNodes"},
		{"no certificate", []string{"nodes", "--coordinator", addr}, "no operator certificate"},
		{"plaintext to a TLS coordinator", []string{"nodes", "--coordinator", addr, "--insecure"},
			"coordinator " + addr + ": the coordinator expects TLS; drop --insecure"},
		{"both", []string{"nodes", "--coordinator", addr, "--insecure", "--cert", admin.cert}, "choose one"},
		{"coordinator of another trust domain", append([]string{"nodes"}, append(op[:len(op)-1:len(op)-1], "other.test")...), "is not a coordinator of trust domain other.test"},
		{"expired certificate", append([]string{"nodes"}, with(expired)...), "coordinator refused our certificate: expired (not after "},
		{"certificate not yet valid", append([]string{"events"}, with(future)...), "coordinator refused our certificate: not yet valid (not before "},
		{"certificate of another CA", append([]string{"nodes"}, with(issued{stranger.cert, stranger.key, admin.ca})...),
			"coordinator refused our certificate: not signed by a CA in its ca_file"},
		{"--ca of another CA", append([]string{"nodes"}, with(issued{admin.cert, admin.key, stranger.ca})...),
			"the coordinator's certificate is not signed by --ca (" + stranger.ca + ")"},
	}
	// The parent domain's CAs signing fleet.test identities (issue 16).
	for _, parent := range []*pki.CA{parentOld, parentNew} {
		mallory := issueWith(t, &pki.CA{Cert: parent.Cert, Key: parent.Key, TrustDomain: "fleet.test"},
			pki.Request{Kind: pki.KindAdmin, Name: "mallory"})
		mallory.ca = admin.ca
		want := "unauthenticated: spiffe://fleet.test/admin/mallory is vouched for by CA"
		if parent == parentNew {
			want = "coordinator refused our certificate" // its name constraints already exclude fleet.test
		}
		for _, verb := range []string{"nodes", "events"} {
			refusedCLI = append(refusedCLI, struct {
				name string
				args []string
				want string
			}{"parent domain's CA, " + verb + ", " + parent.Cert.Subject.CommonName, append([]string{verb}, with(mallory)...), want})
		}
	}
	for _, tc := range refusedCLI {
		out, code := execute(t, tc.args...)
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d, %q; want 2 and %q", tc.name, code, out, tc.want)
		}
	}
	var body string
	for _, reason := range []string{"plaintext", "expired", "not_yet_valid", "unknown_ca", "peer_refused", "name_not_allowed"} {
		counted := regexp.MustCompile(`fleetcheck_tls_handshake_failures_total\{reason="` + reason + `"\} [1-9]`)
		testwait.Until(t, 20*time.Second, "/metrics counting TLS refusals for "+reason, func() bool {
			body = httpGet(t, "http://"+srv.HTTPAddr().String()+"/metrics")
			return counted.MatchString(body)
		})
	}
	testwait.Until(t, 20*time.Second, "the coordinator's log line for the expired certificate", func() bool {
		return logs.has("tls handshake failed: certificate expired")
	})

	// An operator's request runs on the real agent and lands in the audit
	// log with who and why.
	out, code = execute(t, append([]string{"check", "name=gpu-001", "--checks", "gpu.ecc,ib.ports", "--timeout", "20s",
		"--reason", "INC-1234 slow job on gpu-001"}, op...)...)
	if code != 0 || !strings.Contains(out, "gpu-001") || !strings.Contains(out, "pass") {
		t.Fatalf("check: %d %s", code, out)
	}
	out, code = execute(t, append([]string{"events", "--kind", "operator_action", "-o", "json"}, op...)...)
	if code != 0 {
		t.Fatalf("events: %d %s", code, out)
	}
	var evs struct {
		Events []struct{ Kind, Actor, Message, Node string }
	}
	if err := json.Unmarshal([]byte(out), &evs); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(evs.Events) != 1 || evs.Events[0].Actor != "admin:alice" || !strings.Contains(evs.Events[0].Message, "reason: INC-1234 slow job on gpu-001") {
		t.Fatalf("operator_action events = %+v", evs.Events)
	}
	out, _ = execute(t, append([]string{"events", "--kind", "refused"}, op...)...)
	if !strings.Contains(out, "gpu-002") || !strings.Contains(out, `node:gpu-002 may not speak for node "gpu-003"`) {
		t.Errorf("refused events:\n%s", out)
	}

	// Both sides' /metrics.
	body = httpGet(t, "http://"+srv.HTTPAddr().String()+"/metrics")
	for _, want := range []string{`fleetcheck_nodes{state="healthy"} 1`, "fleetcheck_agents_connected 1", "process_resident_memory_bytes"} {
		if !strings.Contains(body, want) {
			t.Errorf("coordinator /metrics lacks %q", want)
		}
	}
	ms, err := promserve.Listen("127.0.0.1:0", agentReg, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Shutdown(context.Background()) //nolint:errcheck // test teardown
	body = httpGet(t, "http://"+ms.Addr().String()+"/metrics")
	// Every agent series names its node (labels sorted by name).
	for _, want := range []string{`fleetcheck_check_status{check="gpu.ecc",node="gpu-001"} 0`, `fleetcheck_agent_connected{node="gpu-001"} 1`,
		`fleetcheck_agent_work_requests_total{node="gpu-001",outcome="accepted"} 1`, `fleetcheck_agent_passes_total{kind="requested",node="gpu-001",status="pass"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("agent /metrics lacks %q", want)
		}
	}

	// A cleanly stopped agent has left; it is not unreachable.
	stopAgent()
	testwait.Until(t, 20*time.Second, "gpu-001 left", func() bool {
		n, err := srv.Store().Node(ctx, "gpu-001")
		return err == nil && n.State == coordinator.StateLeft
	})

	out, code = execute(t, append([]string{"nodes"}, op...)...)
	if code != 0 || !regexp.MustCompile(`(?m)^gpu-001\s+left\s`).MatchString(out) {
		t.Fatalf("nodes after the agent stopped: %d\n%s", code, out)
	}
}

// helloAs opens an agent stream with id's certificate and says hello as
// node, returning the coordinator's answer.
func helloAs(ctx context.Context, addr string, id issued, node string) error {
	r, err := pki.NewReloader(pki.Files{CertFile: id.cert, KeyFile: id.key, CAFile: id.ca}, pki.ReloaderOptions{CheckInterval: -1})
	if err != nil {
		return err
	}
	creds, err := pki.ClientCredentials(pki.ClientOptions{Reloader: r, TrustDomain: "fleet.test"})
	if err != nil {
		return err
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := pb.NewAgentServiceClient(cc).Connect(ctx)
	if err != nil {
		return err
	}
	_ = st.Send(&pb.AgentMessage{Msg: &pb.AgentMessage_Hello{Hello: &pb.Hello{Node: node, ProtocolVersion: coordinator.ProtocolVersion}}})
	_, err = st.Recv()
	return err
}

// TestCoordinatorRefusesPlaintextWithoutInsecure: no tls section and no
// --insecure is an error at start, not a plaintext server.
func TestCoordinatorRefusesPlaintextWithoutInsecure(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(cfgFile, []byte("listen: 127.0.0.1:0\nhttp_listen: off\ndata_dir: "+dir+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := execute(t, "coordinator", "--config", cfgFile)
	if code != 2 || !strings.Contains(out, "no transport credentials") {
		t.Fatalf("exit %d: %s", code, out)
	}
	if err := os.WriteFile(cfgFile, []byte("listen: 127.0.0.1:0\nhttp_listen: off\ndata_dir: "+dir+"\ntls:\n  cert_file: a\n  key_file: b\n  ca_file: c\n  trust_domain: fleet.test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code = execute(t, "coordinator", "--config", cfgFile, "--insecure")
	if code != 2 || !strings.Contains(out, "choose one") {
		t.Fatalf("--insecure with tls: exit %d: %s", code, out)
	}
}

// oldStyleCA is a CA for domain as fleetcheck made them before subdomains
// were excluded (a permitted URI domain only, which x509 reads as the
// domain and all below it).
func oldStyleCA(t *testing.T, domain string) *pki.CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "fleetcheck CA " + domain + " (old)"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage:            x509.KeyUsageCertSign,
		URIs:                []*url.URL{{Scheme: "spiffe", Host: domain}},
		PermittedURIDomains: []string{domain},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &pki.CA{Cert: cert, Key: key, TrustDomain: domain}
}
