//go:build e2e && chaos

package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/needs"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
)

// The chaos suite (make chaos; make chaos-short in CI): three coordinator
// processes with the leader election on (ha:) over one real PostgreSQL,
// sixteen or more agents on simulated nodes listing all three, and a
// rollout, a sweep and a burn-in driven through the CLI while a seeded
// schedule of faults hits the coordinators and the database: kill -9 of
// the leader and of a follower (restarted), SIGSTOP/SIGCONT of the leader
// and of a follower, a restart of PostgreSQL. After each campaign the
// invariants are read from the store and the nodes: every acknowledged
// result stored exactly once, no node upgraded twice, maxUnavailable and
// the drain circuit breaker never exceeded, the campaign completed with no
// work skipped. It prints the failover times (leader kill to a new leader
// holding the lease) and the check results stored per second during
// failovers and outside every fault.

// ChaosSeedEnv reruns a schedule: the seed is printed at the start.
const chaosSeedEnv = "FLEETCHECK_CHAOS_SEED"

// chaosKeepEnv names a directory a failed run copies every process's
// whole log into (the test's own directory is removed).
const chaosKeepEnv = "FLEETCHECK_CHAOS_KEEP"

// chaosOpts size one run.
type chaosOpts struct {
	nodes    int
	faults   int
	leaseTTL time.Duration
	// breaker bounds campaign drains (distinct nodes per window).
	breakerWindow time.Duration
	breakerCount  int
	maxUnavail    int
}

// Fault kinds.
const (
	faultKillLeader   = "kill -9 leader"
	faultKillFollower = "kill -9 follower"
	faultStopLeader   = "SIGSTOP leader"
	faultStopFollower = "SIGSTOP follower"
	faultRestartPG    = "restart PostgreSQL"
)

var faultKinds = []string{faultKillLeader, faultKillFollower, faultStopLeader, faultStopFollower, faultRestartPG}

type fault struct {
	kind string
	// gap is the wait before it; hold how long a stopped process or the
	// database stays down (a killed follower: before its restart).
	gap, hold time.Duration
}

// schedule draws n faults from rng: every kind at least once, the leader
// killed at least twice when n allows (a median needs more than one), the
// rest at random, in random order.
func schedule(rng *rand.Rand, n int, ttl time.Duration) []fault {
	kinds := slices.Clone(faultKinds)
	if n > len(kinds) {
		kinds = append(kinds, faultKillLeader)
	}
	for len(kinds) < n {
		kinds = append(kinds, faultKinds[rng.IntN(len(faultKinds))])
	}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	out := make([]fault, len(kinds))
	for i, k := range kinds {
		f := fault{kind: k, gap: time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))}
		switch k {
		case faultStopLeader, faultStopFollower:
			// Shorter than the lease sometimes (the leader wakes still
			// leading), longer other times (it wakes deposed and fenced).
			f.hold = ttl/2 + time.Duration(rng.Int64N(int64(2*ttl)))
		case faultRestartPG, faultKillFollower:
			f.hold = 200*time.Millisecond + time.Duration(rng.Int64N(int64(2*time.Second)))
		}
		out[i] = f
	}
	return out
}

// coordProc is one of the coordinators.
type coordProc struct {
	*proc
	name, addr, health string
}

// haFleet is the fleet of several coordinators over one PostgreSQL.
type haFleet struct {
	*fleet
	o      chaosOpts
	rng    *rand.Rand
	pg     *pgtest.Server
	db     *sql.DB
	coords []*coordProc

	mu      sync.Mutex
	stopped map[string]bool // coordinators SIGSTOPped now

	// figures
	failovers []time.Duration
	windows   []window // leader kill → new leader
	faultWins []window // every fault, from its start to its recovery
	injected  map[string]int
	log       []string
	start     time.Time
	failures  []string // repeated after the logs: CI shows a failed run's tail
}

type window struct{ from, to time.Time }

// ensureCerts issues what the chaos fleet needs beyond TestMain's PKI:
// three coordinator certificates and node certificates past maxNodes.
func ensureCerts(t *testing.T, nodes int) {
	t.Helper()
	var steps [][]string
	for _, c := range []string{"coord-a", "coord-b", "coord-c"} {
		if _, err := os.Stat(filepath.Join(caDir, "coordinator-"+c+".crt")); err != nil {
			steps = append(steps, []string{"certs", "issue", "coordinator", c, "--dir", caDir, "--ip", "127.0.0.1"})
		}
	}
	for i := 1; i <= nodes; i++ {
		if _, err := os.Stat(filepath.Join(caDir, "node-"+nodeName(i)+".crt")); err != nil {
			steps = append(steps, []string{"certs", "issue", "node", nodeName(i), "--dir", caDir})
		}
	}
	for _, s := range steps {
		if out, err := exec.Command(binPath, s...).CombinedOutput(); err != nil {
			t.Fatalf("fleetcheck %s: %v\n%s", strings.Join(s, " "), err, out)
		}
	}
}

func newHAFleet(t *testing.T, o chaosOpts, seed uint64) *haFleet {
	t.Helper()
	if _, err := pgtest.BinDir(); err != nil {
		needs.Skip(t, "PostgreSQL: %v", err)
	}
	ensureCerts(t, o.nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatalf("start PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		if err := pg.Close(); err != nil {
			t.Errorf("stop PostgreSQL: %v", err)
		}
	})
	name, err := pg.CreateDB(ctx, "chaos")
	if err != nil {
		t.Fatal(err)
	}
	url := pg.URLFor(name)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })

	h := &haFleet{
		fleet:    &fleet{t: t, dir: t.TempDir(), cliTimeout: 30 * time.Second},
		o:        o,
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		pg:       pg,
		db:       db,
		stopped:  map[string]bool{},
		injected: map[string]int{},
		start:    time.Now(),
	}
	h.target = h.pick
	var addrs []string
	for _, c := range []string{"coord-a", "coord-b", "coord-c"} {
		cp := h.newCoordinator(c, url)
		h.coords = append(h.coords, cp)
		addrs = append(addrs, cp.addr)
	}
	t.Cleanup(func() {
		for _, c := range h.coords {
			_ = h.signal(c, syscall.SIGCONT) // never leave one stopped
		}
		for _, a := range h.agents {
			a.stop(t, syscall.SIGTERM)
		}
		for _, c := range h.coords {
			c.stop(t, syscall.SIGTERM)
		}
		t.Logf("chaos log:\n  %s", strings.Join(h.log, "\n  "))
		if t.Failed() {
			h.keepLogs()
			for _, c := range h.coords {
				t.Logf("%s log (last lines):\n%s", c.name, c.tail(40))
			}
			for _, a := range h.agents {
				t.Logf("%s log (last lines):\n%s", a.node, a.tail(10))
			}
			b, _ := os.ReadFile(pg.LogPath())
			t.Logf("PostgreSQL log:\n%s", lastLines(string(b), 30))
			h.mu.Lock()
			t.Logf("chaos seed %d failed:\n  %s", seed, strings.Join(h.failures, "\n  "))
			h.mu.Unlock()
		}
	})
	// Started one by one: the first to take the lease leads.
	for _, c := range h.coords {
		h.startCoord(c)
	}
	fo := fleetOpts{
		longTools:         time.Second,
		actionDelay:       time.Second,
		agentCoordinators: "coordinators: [" + strings.Join(addrs, ", ") + "]",
		agentReconnect:    "reconnect: {initial: 100ms, max: 1s, hello_timeout: 2s}",
	}
	for i := 1; i <= o.nodes; i++ {
		h.agents = append(h.agents, h.newAgent(i, map[string]string{"sku": "h100"}, fo))
	}
	for _, a := range h.agents {
		a.start(t)
	}
	h.waitConnected(2*time.Minute, "every agent connected with a full result")
	h.note("fleet up: %d agents over %s, leader %s", len(h.agents), strings.Join(addrs, ", "), h.leaderName())
	return h
}

// keepLogs copies the coordinators', agents' and PostgreSQL's logs into
// $FLEETCHECK_CHAOS_KEEP, when set.
func (h *haFleet) keepLogs() {
	dir := os.Getenv(chaosKeepEnv)
	if dir == "" {
		return
	}
	paths := []string{h.pg.LogPath()}
	for _, c := range h.coords {
		paths = append(paths, c.logPath)
	}
	for _, a := range h.agents {
		paths = append(paths, a.logPath)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.errorf("%s: %v", chaosKeepEnv, err)
		return
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a process that never started
		}
		name := filepath.Base(filepath.Dir(p)) + "-" + filepath.Base(p)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			h.errorf("%s: %v", chaosKeepEnv, err)
			return
		}
	}
	h.t.Logf("logs kept in %s", dir)
}

// errorf and fatalf fail the test and keep the message for the recap after
// the logs.
func (h *haFleet) errorf(format string, args ...any) {
	h.t.Helper()
	h.keepFailure(format, args...)
	h.t.Errorf(format, args...)
}

func (h *haFleet) fatalf(format string, args ...any) {
	h.t.Helper()
	h.keepFailure(format, args...)
	h.t.Fatalf(format, args...)
}

func (h *haFleet) keepFailure(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if len(msg) > 2000 {
		msg = msg[:2000] + "..."
	}
	h.mu.Lock()
	h.failures = append(h.failures, msg)
	h.mu.Unlock()
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

func (h *haFleet) newCoordinator(name, url string) *coordProc {
	t := h.t
	dir := filepath.Join(h.dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	c := &coordProc{name: name, addr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	hport := freePort(t)
	c.health = fmt.Sprintf("http://127.0.0.1:%d/healthz", hport)
	cfg := filepath.Join(dir, "coordinator.yaml")
	write(t, cfg, fmt.Sprintf(`listen: %s
http_listen: 127.0.0.1:%d
data_dir: %s
store_url: %s
heartbeat_interval: 1s
breaker: {window: %s, max_share: 1, max_count: %d}
ha: {enabled: true, lease_ttl: %s}
tls:
  cert_file: %s
  key_file: %s
  ca_file: %s
  trust_domain: %s
`, c.addr, hport, filepath.Join(dir, "data"), url, h.o.breakerWindow, h.o.breakerCount, h.o.leaseTTL,
		filepath.Join(caDir, "coordinator-"+name+".crt"), filepath.Join(caDir, "coordinator-"+name+".key"),
		filepath.Join(caDir, "ca.crt"), trustDomain))
	c.proc = &proc{name: name, args: []string{"coordinator", "--config", cfg, "--log-format", "json"},
		logPath: filepath.Join(dir, "coordinator.log")}
	return c
}

// startCoord starts a coordinator and waits for its /healthz.
func (h *haFleet) startCoord(c *coordProc) {
	h.t.Helper()
	c.start(h.t)
	testwait.ForEvery(h.t, time.Minute, 100*time.Millisecond, c.name+"'s /healthz", func() (bool, string) {
		if !c.running() {
			h.fatalf("%s exited:\n%s", c.name, c.tail(20))
		}
		resp, err := http.Get(c.health)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// signal sends sig to a coordinator's running process.
func (h *haFleet) signal(c *coordProc, sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return fmt.Errorf("%s not running", c.name)
	}
	return c.cmd.Process.Signal(sig)
}

func (h *haFleet) note(format string, args ...any) {
	line := fmt.Sprintf("%6.1fs ", time.Since(h.start).Seconds()) + fmt.Sprintf(format, args...)
	h.log = append(h.log, line)
	h.t.Log(line)
}

// ---------------------------------------------------------------- the lease

// lease is the leader row as PostgreSQL has it.
type lease struct {
	addr     string
	token    int64
	acquired time.Time
	valid    bool
}

func (h *haFleet) lease() (lease, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var l lease
	err := h.db.QueryRowContext(ctx, `SELECT addr, token, acquired_at, expires_at > now() FROM fleetcheck_leader WHERE name = 'coordinator'`).
		Scan(&l.addr, &l.token, &l.acquired, &l.valid)
	return l, err
}

func (h *haFleet) byAddr(addr string) *coordProc {
	for _, c := range h.coords {
		if c.addr == addr {
			return c
		}
	}
	return nil
}

// leader is the coordinator holding a valid lease (nil: none now).
func (h *haFleet) leader() (*coordProc, lease) {
	l, err := h.lease()
	if err != nil || !l.valid {
		return nil, l
	}
	return h.byAddr(l.addr), l
}

func (h *haFleet) leaderName() string {
	if c, _ := h.leader(); c != nil {
		return c.name
	}
	return "none"
}

// waitLeader waits for a valid lease with a token above after, held by a
// running coordinator that is not stopped.
func (h *haFleet) waitLeader(after int64, within time.Duration) (*coordProc, lease) {
	h.t.Helper()
	var c *coordProc
	var l lease
	testwait.ForEvery(h.t, within, 20*time.Millisecond, fmt.Sprintf("a leader with a token above %d", after), func() (bool, string) {
		c, l = h.leader()
		if c == nil {
			return false, fmt.Sprintf("lease %+v", l)
		}
		return l.token > after && c.running() && !h.isStopped(c), fmt.Sprintf("%s token %d", c.name, l.token)
	})
	return c, l
}

func (h *haFleet) isStopped(c *coordProc) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stopped[c.name]
}

func (h *haFleet) setStopped(c *coordProc, v bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped[c.name] = v
}

// pick is where a CLI call goes, as an operator of this fleet would
// write it: --coordinator with every coordinator that runs and is not
// stopped, in random order. The CLI takes the first that answers and
// follows a follower's refusal to the leader (campaign changes), so the
// suite drives that too; reads are answered by any of them.
func (h *haFleet) pick() string {
	var live []string
	for _, c := range h.coords {
		if c.running() && !h.isStopped(c) {
			live = append(live, c.addr)
		}
	}
	if len(live) == 0 {
		return h.coords[0].addr
	}
	rand.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
	return strings.Join(live, ",")
}

// startCampaign runs a campaign-changing verb through the CLI, which
// finds the leader itself. No fault is injected while it runs, so the
// call is tried again only on a failure to reach the coordinators; a
// refusal naming the leader that reaches the test means the CLI did not
// follow it, and fails the test.
func (h *haFleet) startCampaign(args ...string) string {
	h.t.Helper()
	var out string
	testwait.ForEvery(h.t, time.Minute, 500*time.Millisecond, "fleetcheck "+strings.Join(args, " "), func() (bool, string) {
		o, e, code := h.cli(args...)
		if code == 0 {
			out = o
			return true, ""
		}
		if strings.Contains(e, "not the leader; the leader is") || strings.Contains(e, "already") || strings.Contains(e, "exists") {
			h.fatalf("fleetcheck %s: exit %d: %s", strings.Join(args, " "), code, e)
		}
		return false, fmt.Sprintf("exit %d: %s", code, strings.TrimSpace(e))
	})
	return out
}

// ---------------------------------------------------------------- faults

// inject runs one fault and waits for the fleet to recover from it: every
// coordinator running and healthy, a leader holding the lease.
func (h *haFleet) inject(f fault, campaign string) {
	h.t.Helper()
	from := time.Now()
	n := len(h.faultWins) + 1
	_, cur := h.waitLeader(0, time.Minute)
	leaderC := h.byAddr(cur.addr)
	var followers []*coordProc
	for _, c := range h.coords {
		if c != leaderC {
			followers = append(followers, c)
		}
	}
	what := ""
	switch f.kind {
	case faultKillLeader:
		t0 := time.Now()
		leaderC.stop(h.t, syscall.SIGKILL)
		nc, nl := h.waitLeader(cur.token, time.Minute)
		took := nl.acquired.Sub(t0)
		h.failovers = append(h.failovers, took)
		// The window runs one agent pass (5 s) past the takeover: the
		// agents' passes come in step, so a window of the takeover alone
		// holds a burst of results, or none, by chance.
		h.windows = append(h.windows, window{t0, nl.acquired.Add(5 * time.Second)})
		what = fmt.Sprintf("%s (token %d) killed; %s leads with token %d after %.2fs", leaderC.name, cur.token, nc.name, nl.token, took.Seconds())
		h.startCoord(leaderC)
	case faultKillFollower:
		c := followers[h.rng.IntN(len(followers))]
		c.stop(h.t, syscall.SIGKILL)
		time.Sleep(f.hold)
		h.startCoord(c)
		what = fmt.Sprintf("%s killed, restarted after %s", c.name, f.hold.Round(time.Millisecond))
	case faultStopLeader, faultStopFollower:
		c := leaderC
		if f.kind == faultStopFollower {
			c = followers[h.rng.IntN(len(followers))]
		}
		h.setStopped(c, true)
		if err := h.signal(c, syscall.SIGSTOP); err != nil {
			h.t.Fatal(err)
		}
		time.Sleep(f.hold)
		if err := h.signal(c, syscall.SIGCONT); err != nil {
			h.t.Fatal(err)
		}
		h.setStopped(c, false)
		after := "still leads"
		if f.kind == faultStopFollower {
			after = "leader " + h.leaderName()
		} else if l, err := h.lease(); err == nil && l.token != cur.token {
			after = fmt.Sprintf("deposed: %s leads with token %d", h.byAddr(l.addr).name, l.token)
		}
		what = fmt.Sprintf("%s stopped for %s (%s)", c.name, f.hold.Round(time.Millisecond), after)
	case faultRestartPG:
		port := h.pg.Port()
		if err := h.pg.Stop(); err != nil {
			h.t.Fatal(err)
		}
		time.Sleep(f.hold)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := h.pg.Restart(ctx)
		cancel()
		if err != nil {
			h.fatalf("restart PostgreSQL: %v", err)
		}
		if h.pg.Port() != port {
			h.fatalf("PostgreSQL came back on port %d, not %d: the coordinators' store_url is stale", h.pg.Port(), port)
		}
		what = fmt.Sprintf("down for %s", f.hold.Round(time.Millisecond))
	}
	// Recovered: all three serve and one leads.
	for _, c := range h.coords {
		if !c.running() {
			h.fatalf("%s exited after %s:\n%s", c.name, f.kind, c.tail(20))
		}
	}
	nc, _ := h.waitLeader(0, time.Minute)
	h.faultWins = append(h.faultWins, window{from, time.Now()})
	h.injected[f.kind]++
	h.note("fault %d [%s] %s: %s; recovered in %.1fs, leader %s", n, campaign, f.kind, what, time.Since(from).Seconds(), nc.name)
}

// run injects faults (each after its gap) while final says the campaign
// still runs, and returns the faults it did not get to.
func (h *haFleet) run(campaign string, faults []fault, final func() bool) []fault {
	h.t.Helper()
	for i, f := range faults {
		gap := f.gap
		if i == 0 {
			// The campaign's first fault soon after its start: a sweep
			// lasts seconds, and its share must land inside it.
			gap /= 4
		}
		deadline := time.Now().Add(gap)
		for time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if final() {
			return faults[i:]
		}
		h.inject(f, campaign)
	}
	return nil
}

// ---------------------------------------------------------------- invariants

// checkStoredOnce: every result an agent logged as acknowledged is in the
// store, and no check result is stored twice (read from PostgreSQL).
func (h *haFleet) checkStoredOnce(campaign string) {
	h.t.Helper()
	ctx := context.Background()
	for _, a := range h.agents {
		acked := a.ackedIDs()
		if len(acked) == 0 {
			h.errorf("after the %s: %s: no result acknowledged at all", campaign, a.node)
			continue
		}
		stored := map[string]bool{}
		rows, err := h.db.QueryContext(ctx, `SELECT id FROM results WHERE node = $1`, a.node)
		if err != nil {
			h.fatalf("read results: %v", err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				h.t.Fatal(err)
			}
			stored[id] = true
		}
		if err := rows.Err(); err != nil {
			h.t.Fatal(err)
		}
		rows.Close()
		var missing []string
		for _, id := range acked {
			if !stored[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			h.errorf("after the %s: %s: %d of %d acknowledged results not stored: %v", campaign, a.node, len(missing), len(acked), first(missing, 5))
		}
	}
	rows, err := h.db.QueryContext(ctx, `SELECT node, result_id, check_name, count(*) FROM check_results
		GROUP BY node, result_id, check_name HAVING count(*) > 1 ORDER BY 1, 2, 3 LIMIT 10`)
	if err != nil {
		h.fatalf("read check results: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var node, id, check string
		var n int
		if err := rows.Scan(&node, &id, &check, &n); err != nil {
			h.t.Fatal(err)
		}
		h.errorf("after the %s: %s: result %s check %s stored %d times", campaign, node, id, check, n)
	}
	if err := rows.Err(); err != nil {
		h.t.Fatal(err)
	}
}

func parseTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("stored time %q: %v", s, err)
	}
	return v
}

// activeState: the rollout's node states that hold a maxUnavailable
// slot (campaigns/rollout: active, or failed and still drained).
var activeState = map[string]bool{"drain-required": true, "draining": true, "upgrade-required": true,
	"upgrading": true, "rebooting": true, "validating": true, "undrain-required": true}

// checkMaxUnavailable replays the rollout's stored transitions: the nodes
// out of service on its account never exceed its max_unavailable.
func (h *haFleet) checkMaxUnavailable(id string) {
	h.t.Helper()
	rows, err := h.db.QueryContext(context.Background(),
		`SELECT time, node, from_state, to_state FROM rollout_events WHERE rollout = $1 AND kind = 'transition' ORDER BY id`, id)
	if err != nil {
		h.fatalf("read rollout events: %v", err)
	}
	defer rows.Close()
	state := map[string]string{}
	peak, transitions := 0, 0
	peakAt := ""
	for rows.Next() {
		var at, node, from, to string
		if err := rows.Scan(&at, &node, &from, &to); err != nil {
			h.t.Fatal(err)
		}
		transitions++
		state[node] = to
		n := 0
		for _, s := range state {
			if activeState[s] {
				n++
			}
		}
		if n > peak {
			peak, peakAt = n, at
		}
	}
	if err := rows.Err(); err != nil {
		h.t.Fatal(err)
	}
	if transitions == 0 {
		h.errorf("rollout %s: no transitions stored", id)
	}
	h.note("rollout %s: at most %d nodes out of service at once (max_unavailable %d; %d transitions stored; peak at %s)",
		id, peak, h.o.maxUnavail, transitions, peakAt)
	if peak > h.o.maxUnavail {
		h.errorf("rollout %s: %d nodes out of service at once at %s, max_unavailable %d", id, peak, peakAt, h.o.maxUnavail)
	}
}

type drainRec struct {
	node, by string
	at       time.Time
}

// drains are every campaign drain the store records: a rollout node's
// move to drain-required (taken after the breaker allowed it), a sweep's
// drains, a burn-in node's drain time.
func (h *haFleet) drains() []drainRec {
	h.t.Helper()
	ctx := context.Background()
	var out []drainRec
	q := func(query string, scan func(*sql.Rows) (drainRec, bool)) {
		rows, err := h.db.QueryContext(ctx, query)
		if err != nil {
			if strings.Contains(err.Error(), "does not exist") {
				return // that engine's tables are not there yet
			}
			h.fatalf("read drains: %v", err)
		}
		defer rows.Close()
		for rows.Next() {
			if r, ok := scan(rows); ok {
				out = append(out, r)
			}
		}
		if err := rows.Err(); err != nil {
			h.t.Fatal(err)
		}
	}
	q(`SELECT rollout, node, time FROM rollout_events WHERE kind = 'transition' AND to_state = 'drain-required'`, func(r *sql.Rows) (drainRec, bool) {
		var id, node, at string
		if err := r.Scan(&id, &node, &at); err != nil {
			h.t.Fatal(err)
		}
		return drainRec{node: node, by: id, at: parseTime(h.t, at)}, true
	})
	q(`SELECT sweep_id, data FROM sweep_drains`, func(r *sql.Rows) (drainRec, bool) {
		var id, data string
		if err := r.Scan(&id, &data); err != nil {
			h.t.Fatal(err)
		}
		var d struct {
			Node  string    `json:"node"`
			State string    `json:"state"`
			At    time.Time `json:"at"`
		}
		if err := json.Unmarshal([]byte(data), &d); err != nil {
			h.fatalf("sweep drain %s: %v", data, err)
		}
		return drainRec{node: d.Node, by: id, at: d.At}, d.State != "refused"
	})
	q(`SELECT campaign_id, node, drained_at FROM burnin_nodes WHERE drained_at <> ''`, func(r *sql.Rows) (drainRec, bool) {
		var id, node, at string
		if err := r.Scan(&id, &node, &at); err != nil {
			h.t.Fatal(err)
		}
		return drainRec{node: node, by: id, at: parseTime(h.t, at)}, true
	})
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// checkBreaker: at no drain did the window before it hold more distinct
// nodes than the breaker allows (a node drained again counts once).
func (h *haFleet) checkBreaker(campaign string) {
	h.t.Helper()
	limit := min(h.o.breakerCount, len(h.agents))
	ds := h.drains()
	peak := 0
	var peakAt time.Time
	for i, d := range ds {
		in := map[string]bool{}
		for _, e := range ds[:i+1] {
			if e.at.After(d.at.Add(-h.o.breakerWindow)) {
				in[e.node] = true
			}
		}
		if len(in) > peak {
			peak, peakAt = len(in), d.at
		}
		if len(in) > limit {
			var names []string
			for n := range in {
				names = append(names, n)
			}
			h.errorf("after the %s: drain circuit breaker exceeded: %d distinct nodes drained within %s before %s (%s for %s), limit %d: %v",
				campaign, len(in), h.o.breakerWindow, d.at.Format(time.RFC3339Nano), d.node, d.by, limit, first(names, 20))
			return
		}
	}
	h.note("after the %s: %d campaign drains stored; at most %d distinct nodes within a %s window (at %s), breaker limit %d",
		campaign, len(ds), peak, h.o.breakerWindow, peakAt.Format("15:04:05.000"), limit)
}

// ---------------------------------------------------------------- figures

// storedRate is check results stored per second within the windows.
func (h *haFleet) storedRate(ws []window) (float64, time.Duration) {
	h.t.Helper()
	var n int64
	var span time.Duration
	for _, w := range ws {
		if !w.to.After(w.from) {
			continue
		}
		var c int64
		err := h.db.QueryRowContext(context.Background(), `SELECT count(*) FROM check_results WHERE stored >= $1 AND stored < $2`,
			w.from.UnixMilli(), w.to.UnixMilli()).Scan(&c)
		if err != nil {
			h.fatalf("count check results: %v", err)
		}
		n += c
		span += w.to.Sub(w.from)
	}
	if span == 0 {
		return 0, 0
	}
	return float64(n) / span.Seconds(), span
}

// steady are the stretches of [from, to) outside every fault window (a
// second of margin after each).
func steady(from, to time.Time, faults []window) []window {
	out := []window{{from, to}}
	for _, f := range faults {
		var next []window
		for _, w := range out {
			end := f.to.Add(time.Second)
			if !f.from.Before(w.to) || !end.After(w.from) {
				next = append(next, w)
				continue
			}
			if f.from.After(w.from) {
				next = append(next, window{w.from, f.from})
			}
			if end.Before(w.to) {
				next = append(next, window{end, w.to})
			}
		}
		out = next
	}
	return out
}

func (h *haFleet) figures(end time.Time) {
	h.t.Helper()
	if len(h.failovers) > 0 {
		ds := slices.Clone(h.failovers)
		slices.Sort(ds)
		med := ds[len(ds)/2]
		if len(ds)%2 == 0 {
			med = (ds[len(ds)/2-1] + ds[len(ds)/2]) / 2
		}
		var all []string
		for _, d := range h.failovers {
			all = append(all, fmt.Sprintf("%.2fs", d.Seconds()))
		}
		h.note("FIGURE failover (leader kill -9 -> new leader holds the lease), %d kills, lease_ttl %s: median %.2fs, max %.2fs [%s]",
			len(ds), h.o.leaseTTL, med.Seconds(), ds[len(ds)-1].Seconds(), strings.Join(all, " "))
	}
	fr, fspan := h.storedRate(h.windows)
	sr, sspan := h.storedRate(steady(h.start, end, append(slices.Clone(h.faultWins), h.windows...)))
	h.note("FIGURE check results stored: %.0f/s during leader failovers (kill to takeover + 5 s; %.1fs in all), %.0f/s steady (%.0fs outside every fault)",
		fr, fspan.Seconds(), sr, sspan.Seconds())
	var kinds []string
	for _, k := range faultKinds {
		kinds = append(kinds, fmt.Sprintf("%s x%d", k, h.injected[k]))
	}
	h.note("faults injected: %s", strings.Join(kinds, ", "))
	if out, err := exec.Command("uptime").Output(); err == nil {
		h.note("load: %s", strings.TrimSpace(string(out)))
	}
}

// ---------------------------------------------------------------- the test

// TestChaos: a rollout, a sweep and a burn-in over a fleet of three
// coordinators and one PostgreSQL, each campaign hit by its share of a
// seeded schedule of faults. -short (make chaos-short, CI) runs fewer
// faults, every kind at least once and the leader killed at least once.
func TestChaos(t *testing.T) {
	o := chaosOpts{nodes: 16, faults: 24, leaseTTL: 3 * time.Second, breakerWindow: time.Minute, breakerCount: 12, maxUnavail: 4}
	if testing.Short() {
		o.faults = 7
	}
	if n, err := strconv.Atoi(os.Getenv("FLEETCHECK_CHAOS_FAULTS")); err == nil && n >= len(faultKinds) && n <= 200 {
		o.faults = n
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(chaosSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", chaosSeedEnv, s, err)
		}
		seed = v
	}
	t.Logf("chaos seed %d (rerun this schedule with %s=%d)", seed, chaosSeedEnv, seed)
	h := newHAFleet(t, o, seed)
	faults := schedule(h.rng, o.faults, o.leaseTTL)
	var plan []string
	for _, f := range faults {
		plan = append(plan, f.kind)
	}
	h.note("schedule of %d faults: %s", len(faults), strings.Join(plan, ", "))
	share := func(left int, campaigns int) int { return (left + campaigns - 1) / campaigns }

	// 1. The rollout: canary, then waves, max_unavailable 4, under the
	// breaker's 12 nodes a minute.
	spec := h.specFile("rollout.yaml", fmt.Sprintf(`
name: chaos
selector: "sku=h100"
target: {driver: %s}
action: driver-upgrade
rollback_action: driver-rollback
canary: 1
waves: [5, 10]
max_unavailable: %d
approval: auto
connect_grace: 30s
deadlines: {upgrading: 1m, rebooting: 2m, validating: 2m}
validation:
  checks: [gpu.inventory, gpu.ecc, gpu.xid, ib.ports, nccl.allreduce]
  baseline: measured
`, toDriver, o.maxUnavail))
	matrix := h.specFile("matrix.yaml", rolloutMatrix)
	rid := startedID(t, "rollout", h.startCampaign("rollout", "start", "-f", spec, "--matrix", matrix))
	h.note("rollout %s started", rid)
	var last rolloutDoc
	rolloutFinal := func() bool {
		var d rolloutDoc
		if tryJSON(h.fleet, &d, "rollout", "status", rid) {
			last = d
		}
		return last.Phase == "completed" || last.Phase == "halted" || last.Phase == "aborted" || last.Paused
	}
	// The long run rolls the rollout back at the end: a fourth campaign.
	campaigns := 4
	if testing.Short() {
		campaigns = 3
	}
	n := share(len(faults), campaigns)
	left := h.run("rollout", faults[:n], rolloutFinal)
	faults = append(left, faults[n:]...)
	d := h.waitRollout(rid, 8*time.Minute, "the rollout to finish", func(d rolloutDoc) bool {
		return d.Phase == "completed" || d.Phase == "halted" || d.Phase == "aborted" || d.Paused
	})
	h.note("rollout %s ended %s (halt reason %q)", rid, d.summary(), d.HaltReason)
	if d.Phase != "completed" {
		h.errorf("rollout stopped %s (halt reason %q, pause reason %q): a healthy fleet, only its coordinators and database hit",
			d.Phase, d.HaltReason, d.PauseReason)
	}
	want := map[string]int{}
	for _, name := range h.nodeNames() {
		want[name] = 1
		if nd := d.node(name); d.Phase == "completed" && (nd.State != "done" || nd.Upgrades != 1) {
			h.errorf("rollout completed with %s %s after %d upgrades (%s)", name, nd.State, nd.Upgrades, nd.Reason)
		}
	}
	if d.Phase == "completed" {
		h.checkUpgradedAtMostOnce(want)
	} else {
		h.checkUpgradedAtMostOnce(nil)
	}
	h.checkMaxUnavailable(rid)
	h.checkBreaker("rollout")
	h.checkStoredOnce("rollout")
	if d.Phase == "halted" || d.Paused {
		// A stopped rollout keeps its nodes (kit.Busy): abort it, as an
		// operator would, so that the sweep and the burn-in still run.
		h.startCampaign("rollout", "abort", rid)
		d = h.waitRollout(rid, 3*time.Minute, "the rollout aborted", func(d rolloutDoc) bool { return d.Phase == "aborted" })
		h.note("rollout %s aborted: %s", rid, d.summary())
	}

	// 2. The sweep over every node.
	sspec := h.specFile("sweep.yaml", "selector: sku=h100\ntest_timeout: 45s\nconnect_grace: 30s\nnote: chaos\n")
	sid := startedID(t, "sweep", h.startCampaign("sweep", "start", "-f", sspec))
	h.note("sweep %s started", sid)
	sweepFinal := func() bool {
		var r sweepReport
		return tryJSON(h.fleet, &r, "sweep", "report", sid) && r.State != "running"
	}
	n = share(len(faults), campaigns-1)
	left = h.run("sweep", faults[:n], sweepFinal)
	faults = append(left, faults[n:]...)
	r := h.waitSweep(sid, 8*time.Minute, "the sweep to finish", func(r sweepReport) bool { return r.State != "running" })
	h.note("sweep %s ended %s", sid, r.summary())
	if r.State != "done" || r.Tested != len(h.agents) || r.Incomplete != "" || len(r.Skipped) != 0 {
		h.errorf("sweep ended %s: want done, every node tested, none skipped", r.summary())
	}
	for _, v := range r.Verdicts {
		if v.Verdict != "pass" && v.Verdict != "ok" {
			h.errorf("sweep flagged %s %s (%s) on a healthy fleet", v.Subject, v.Verdict, v.Reason)
		}
	}
	h.checkUpgradedAtMostOnce(nil)
	h.checkBreaker("sweep")
	h.checkStoredOnce("sweep")

	// 3. The burn-in, quick level, every node; it gets the faults left.
	bspec := h.specFile("burnin.yaml", `
name: chaos
selector: "sku=h100"
level: quick
repeats: 1
outlier: {min_peers: 4}
baseline: {missing: peers}
connect_grace: 30s
who: oncall@example.com
`)
	bid := startedID(t, "burnin", h.startCampaign("burnin", "start", "-f", bspec))
	h.note("burn-in %s started", bid)
	burninFinal := func() bool {
		rep, ok := h.burninReport(bid)
		return ok && rep.Campaign.State != "running"
	}
	n = len(faults)
	if campaigns == 4 {
		n = share(len(faults), 2)
	}
	left = h.run("burn-in", faults[:n], burninFinal)
	faults = append(left, faults[n:]...)
	br := h.waitBurnin(bid, 8*time.Minute, "the burn-in to finish", func(r burninReport) bool { return r.Campaign.State != "running" })
	h.note("burn-in %s ended %s (%s)", bid, br.summary(), br.Campaign.Reason)
	if br.Campaign.State != "done" {
		h.errorf("burn-in ended %s: %s", br.Campaign.State, br.Campaign.Reason)
	}
	var bad []string
	for _, nd := range br.Nodes {
		if nd.Verdict != "accepted" {
			bad = append(bad, nd.Node+"="+nd.State+"/"+nd.Verdict)
		}
	}
	if len(bad) > 0 || len(br.Nodes) != len(h.agents) {
		h.errorf("burn-in: %d nodes, not accepted: %v (healthy nodes; only coordinators and the database were hit)", len(br.Nodes), bad)
	}
	h.checkUpgradedAtMostOnce(nil)
	h.checkBreaker("burn-in")
	h.checkStoredOnce("burn-in")

	// 4. (make chaos) The rollout rolled back: every node back on its
	// driver, each rolled back exactly once, none upgraded again.
	if campaigns == 4 && d.Phase == "completed" {
		h.startCampaign("rollout", "rollback", rid)
		h.note("rollout %s rolling back", rid)
		rollbackFinal := func() bool {
			var d rolloutDoc
			return tryJSON(h.fleet, &d, "rollout", "status", rid) && (d.Phase == "rolled-back" || d.Phase == "halted" || d.Paused)
		}
		faults = h.run("rollback", faults, rollbackFinal)
		d = h.waitRollout(rid, 8*time.Minute, "the rollback to finish", func(d rolloutDoc) bool {
			return d.Phase == "rolled-back" || d.Phase == "halted" || d.Paused
		})
		h.note("rollback of %s ended %s (halt reason %q)", rid, d.summary(), d.HaltReason)
		if d.Phase != "rolled-back" {
			h.errorf("rollback ended %s (halt %q, pause %q)", d.Phase, d.HaltReason, d.PauseReason)
		}
		for _, a := range h.agents {
			st := a.simState(t)
			if nd := d.node(a.node); nd.State != "rolled-back" || st.Driver != fromDriver || st.Actions["driver-rollback"] != 1 {
				h.errorf("%s after the rollback: %s (%s), driver %s, %d rollbacks", a.node, nd.State, nd.Reason, st.Driver, st.Actions["driver-rollback"])
			}
		}
		h.checkUpgradedAtMostOnce(nil)
		h.checkMaxUnavailable(rid)
		h.checkBreaker("rollback")
		h.checkStoredOnce("rollback")
	}
	left = faults

	end := time.Now()
	h.figures(end)
	if len(left) > 0 {
		var ks []string
		for _, f := range left {
			ks = append(ks, f.kind)
		}
		h.note("%d faults not injected: the campaigns ended first (%s)", len(left), strings.Join(ks, ", "))
	}
	for _, k := range faultKinds {
		if h.injected[k] == 0 {
			h.errorf("no %q injected: the campaigns ended before the schedule reached it (seed %d)", k, seed)
		}
	}
	if least := min(o.faults, 20); len(h.faultWins) < least {
		h.errorf("%d faults injected, want at least %d of the %d scheduled (seed %d)", len(h.faultWins), least, o.faults, seed)
	}
}

// TestChaosSchedule: a schedule has every kind of fault, the leader
// killed at least twice once there is room, the count asked for, holds
// within their bounds, and the same seed gives the same schedule.
func TestChaosSchedule(t *testing.T) {
	ttl := 3 * time.Second
	for _, n := range []int{5, 7, 24} {
		for seed := uint64(1); seed <= 50; seed++ {
			a := schedule(rand.New(rand.NewPCG(seed, 1)), n, ttl)
			b := schedule(rand.New(rand.NewPCG(seed, 1)), n, ttl)
			if !slices.Equal(a, b) {
				t.Fatalf("seed %d: two schedules differ", seed)
			}
			if len(a) != n {
				t.Fatalf("seed %d: %d faults, want %d", seed, len(a), n)
			}
			count := map[string]int{}
			for _, f := range a {
				count[f.kind]++
				if f.gap < time.Second || f.gap > 5*time.Second {
					t.Errorf("seed %d: %s gap %s outside 1..5s", seed, f.kind, f.gap)
				}
				switch f.kind {
				case faultStopLeader, faultStopFollower:
					if f.hold < ttl/2 || f.hold > ttl/2+2*ttl {
						t.Errorf("seed %d: %s held %s", seed, f.kind, f.hold)
					}
				case faultKillLeader:
					if f.hold != 0 {
						t.Errorf("seed %d: a killed leader is restarted after the takeover, not after a hold (%s)", seed, f.hold)
					}
				}
			}
			for _, k := range faultKinds {
				if count[k] == 0 {
					t.Errorf("n=%d seed %d: no %s", n, seed, k)
				}
			}
			if n > len(faultKinds) && count[faultKillLeader] < 2 {
				t.Errorf("n=%d seed %d: the leader killed %d times, want 2 or more", n, seed, count[faultKillLeader])
			}
		}
	}
}
