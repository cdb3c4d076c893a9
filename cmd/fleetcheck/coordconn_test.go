package main

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/coordinator/leader"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// fakeCoord is a plaintext CampaignService on 127.0.0.1 whose SweepStart
// answers from a script, one answer per call (the last repeats).
type fakeCoord struct {
	pb.UnimplementedCampaignServiceServer
	addr string

	mu      sync.Mutex
	answers []error // nil: started
	calls   int
}

func (f *fakeCoord) SweepStart(context.Context, *pb.SpecRequest) (*pb.CampaignStarted, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	err := f.answers[min(f.calls, len(f.answers))-1]
	if err != nil {
		return nil, err
	}
	return &pb.CampaignStarted{Id: "sweep-on-" + f.addr}, nil
}

func (f *fakeCoord) n() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func startFake(t *testing.T, answers ...error) *fakeCoord {
	t.Helper()
	return startFakeWith(t, nil, answers...)
}

// startFakeWith serves with opts (TLS credentials).
func startFakeWith(t *testing.T, opts []grpc.ServerOption, answers ...error) *fakeCoord {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeCoord{addr: lis.Addr().String(), answers: answers}
	if len(answers) == 0 {
		f.answers = []error{nil}
	}
	s := grpc.NewServer(opts...)
	pb.RegisterCampaignServiceServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return f
}

// deadAddr is a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := lis.Addr().String()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	return a
}

// start runs SweepStart through the CLI's connection to coordinators;
// the waits between election retries are recorded, not slept.
func start(t *testing.T, coordinators string) (id string, f *opFlags, waits []time.Duration, err error) {
	t.Helper()
	f = &opFlags{coordinators: coordinators, output: "table", insecure: true}
	if err := f.validate(); err != nil {
		t.Fatal(err)
	}
	c, err := f.conn()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.sleep = func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil }
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := pb.NewCampaignServiceClient(c).SweepStart(ctx, &pb.SpecRequest{})
	return r.GetId(), f, waits, err
}

func TestCLIFollowsTheLeader(t *testing.T) {
	lead := startFake(t)
	follower := startFake(t, leader.NotLeaderError(lead.addr))
	id, f, _, err := start(t, follower.addr)
	if err != nil || id != "sweep-on-"+lead.addr {
		t.Fatalf("via the follower: %q %v, want the leader's sweep", id, err)
	}
	if f.addr != lead.addr || follower.n() != 1 || lead.n() != 1 {
		t.Fatalf("in use %s; calls: follower %d, leader %d", f.addr, follower.n(), lead.n())
	}
}

// A refusal is followed once: a "leader" that refuses in turn (leadership
// moved meanwhile) is the answer, not a third hop.
func TestCLIFollowsOnce(t *testing.T) {
	third := startFake(t)
	moved := startFake(t, leader.NotLeaderError(third.addr))
	follower := startFake(t, leader.NotLeaderError(moved.addr))
	_, f, _, err := start(t, follower.addr)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), third.addr) {
		t.Fatalf("err %v, want the second refusal naming %s", err, third.addr)
	}
	if third.n() != 0 || f.addr != moved.addr {
		t.Fatalf("third called %d times; in use %s", third.n(), f.addr)
	}
	if msg := f.rpcError(err).Error(); !strings.HasPrefix(msg, "coordinator "+moved.addr+": failed precondition: not the leader; the leader is "+third.addr) {
		t.Fatalf("error line: %s", msg)
	}
}

// Unavailable "no leader now" is retried with a growing wait, and only
// for about electionWait.
func TestCLIWaitsOutAnElection(t *testing.T) {
	electing := leader.NoLeaderError("no leader now")
	c := startFake(t, electing, electing, electing, nil)
	id, _, waits, err := start(t, c.addr)
	if err != nil || id == "" || c.n() != 4 {
		t.Fatalf("%q %v after %d calls", id, err, c.n())
	}
	if want := []time.Duration{200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}; !slices.Equal(waits, want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}

	never := startFake(t, electing)
	_, _, waits, err = start(t, never.addr)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("endless election: %v", err)
	}
	var sum time.Duration
	for _, w := range waits {
		sum += w
		if w > electionMaxTry {
			t.Fatalf("a wait of %v, above %v", w, electionMaxTry)
		}
	}
	if sum > electionWait || len(waits) < 4 {
		t.Fatalf("waited %v in %d tries; bound %v", sum, len(waits), electionWait)
	}
}

// Other refusals are not retried: Unavailable without the detail, a
// NOT_LEADER refusal that names no address.
func TestCLIRetriesOnlyRefusals(t *testing.T) {
	for name, answer := range map[string]error{
		"plain unavailable": status.Error(codes.Unavailable, "campaigns are stopping"),
		"refusal text only": status.Error(codes.FailedPrecondition, leader.NotLeaderPrefix+"127.0.0.1:1"),
		"no address":        leader.NotLeaderError(""),
	} {
		c := startFake(t, answer, nil)
		_, _, waits, err := start(t, c.addr)
		if err == nil || c.n() != 1 || len(waits) != 0 {
			t.Errorf("%s: %v after %d calls, %d waits; want the first answer", name, err, c.n(), len(waits))
		}
	}
}

// Several addresses: the first that connects is used.
func TestCLITriesTheNextCoordinator(t *testing.T) {
	up := startFake(t)
	dead := deadAddr(t)
	id, f, _, err := start(t, dead+", "+up.addr)
	if err != nil || id != "sweep-on-"+up.addr || len(f.unreachable) != 0 {
		t.Fatalf("%q %v (unreachable %v)", id, err, f.unreachable)
	}
	dead2 := deadAddr(t)
	_, f, _, err = start(t, dead+","+dead2)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("none up: %v", err)
	}
	if msg := f.rpcError(err).Error(); !strings.HasPrefix(msg, "coordinator "+dead+":") || !strings.Contains(msg, "("+dead2+" unreachable too)") {
		t.Fatalf("none up: %s", msg)
	}
}

func TestParseCoordinators(t *testing.T) {
	many := make([]string, 17)
	for i := range many {
		many[i] = "h" + string(rune('a'+i)) + ":1"
	}
	cases := []struct{ in, want string }{
		{"a:1", "a:1"},
		{"a:1, b:2 ,c:3", "a:1 b:2 c:3"},
		{"a:1,a:1,b:2", "a:1 b:2"},
		{"a:1,,b:2", "error: an empty address"},
		{"a:1,", "error: an empty address"},
		{strings.Repeat("x", 257), "error: longer than 256 bytes"},
		{strings.Join(many[:16], ","), strings.Join(many[:16], " ")},
		{strings.Join(many, ","), "error: 17 addresses, at most 16"},
	}
	for _, tc := range cases {
		got, err := parseCoordinators(tc.in)
		s := strings.Join(got, " ")
		if err != nil {
			s = "error: " + err.Error()
		}
		if !strings.Contains(s, strings.TrimPrefix(tc.want, "error: ")) || (err != nil) != strings.HasPrefix(tc.want, "error: ") {
			t.Errorf("%.40q: %s, want %s", tc.in, s, tc.want)
		}
	}
}

// tlsServer is mutual TLS with the identity of a test certificate.
func tlsServer(t *testing.T, id issued) []grpc.ServerOption {
	t.Helper()
	r, err := pki.NewReloader(pki.Files{CertFile: id.cert, KeyFile: id.key, CAFile: id.ca}, pki.ReloaderOptions{CheckInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	creds, err := pki.ServerCredentials(pki.ServerOptions{Reloader: r})
	if err != nil {
		t.Fatal(err)
	}
	return []grpc.ServerOption{grpc.Creds(creds)}
}

// The leader a follower names must be a coordinator of the operator's
// trust domain: a node's certificate (valid for server auth, with the
// leader's address in it) is refused, though --trust-domain was not
// given; a coordinator's is followed.
func TestCLIFollowsOnlyACoordinator(t *testing.T) {
	caDir := filepath.Join(t.TempDir(), "ca")
	if msg, code := execute(t, "certs", "init", "--dir", caDir, "--trust-domain", "fleet.test"); code != 0 {
		t.Fatal(msg)
	}
	ca, err := pki.LoadCA(caDir, "")
	if err != nil {
		t.Fatal(err)
	}
	loopback := []net.IP{net.IPv4(127, 0, 0, 1)}
	admin := issue(t, caDir, "admin", "alice")
	coord := issueWith(t, ca, pki.Request{Kind: pki.KindCoordinator, Name: "coord-l", IPs: loopback})
	impostor := issueWith(t, ca, pki.Request{Kind: pki.KindNode, Name: "gpu-001", IPs: loopback})
	call := func(follower *fakeCoord) error {
		t.Helper()
		f := &opFlags{coordinators: follower.addr, output: "table", cert: admin.cert, key: admin.key, ca: admin.ca}
		if err := f.validate(); err != nil {
			t.Fatal(err)
		}
		c, err := f.conn()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err = pb.NewCampaignServiceClient(c).SweepStart(ctx, &pb.SpecRequest{})
		return err
	}
	good := startFakeWith(t, tlsServer(t, coord))
	if err := call(startFakeWith(t, tlsServer(t, coord), leader.NotLeaderError(good.addr))); err != nil || good.n() != 1 {
		t.Fatalf("to a coordinator: %v (%d calls)", err, good.n())
	}
	bad := startFakeWith(t, tlsServer(t, impostor))
	err = call(startFakeWith(t, tlsServer(t, coord), leader.NotLeaderError(bad.addr)))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "not a coordinator of trust domain fleet.test") || bad.n() != 0 {
		t.Fatalf("to a node posing as the leader: %v (%d calls)", err, bad.n())
	}
}
