// Package demo runs fleetcheck end to end in one process: a coordinator on
// a temporary data directory and a fleet of simulated nodes, each with a
// real agent speaking real gRPC over loopback. The simulator renders the
// raw formats the real probes parse, so every check runs its real path.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetcheck/fleetcheck/agent"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/coordinator/console"
	"github.com/fleetcheck/fleetcheck/coordinator/metrics"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/membership"
	"github.com/fleetcheck/fleetcheck/internal/promserve"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/host/sim"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/sim/faultnet"
)

// Options configure a demo run.
type Options struct {
	Nodes int   // simulated nodes (default 16)
	Seed  int64 // chooses which nodes get which fault
	// Serve keeps the coordinator and agents running after the scenario
	// until ctx ends, for exploring with the CLI.
	Serve   bool
	DataDir string // "" = a temporary directory, removed at the end
	Logger  zerolog.Logger
	// Progress receives one line per scenario step (nil = silent).
	Progress io.Writer
	Version  string
}

// Fault is one injected fault, as the scenario reports it.
type Fault struct {
	Node  string `json:"node"`
	Fault string `json:"fault"`
	// Expect names the check that should catch it.
	Expect string `json:"expect"`
}

// NodeResult is one node at the end of the scenario.
type NodeResult struct {
	Name          string           `json:"name"`
	State         string           `json:"state"`
	Outcome       string           `json:"outcome"`
	FailingChecks []string         `json:"failing_checks"`
	Findings      []report.Finding `json:"findings"`
}

// Result is the scenario's outcome (`fleetcheck demo -o json`).
type Result struct {
	Scenario struct {
		Nodes       int     `json:"nodes"`
		Seed        int64   `json:"seed"`
		Faults      []Fault `json:"faults"`
		Coordinator string  `json:"coordinator"`
		CheckedIn   string  `json:"fleet_check_duration"`
	} `json:"scenario"`
	// Gossip is the partition step: one healthy node's gossip cut while
	// its agent stream stays up, then healed.
	Gossip *GossipStep  `json:"gossip,omitempty"`
	Nodes  []NodeResult `json:"nodes"`
	// Caught counts injected faults whose expected check failed on the node.
	Caught int `json:"caught"`
}

// faultPlan lists the faults the scenario injects, in order; node i of the
// shuffled fleet gets plan[i]. Each renders in the raw formats exactly as
// the real failure does.
var faultPlan = []struct {
	name   string
	expect string
	faults func() []sim.Fault
}{
	{"uncorrectable ECC on GPU3 (Xid 48)", "gpu.ecc", func() []sim.Fault { return sim.UncorrectableECCEvent(3, 2) }},
	{"GPU5 fell off the bus (Xid 79)", "gpu.inventory", func() []sim.Fault { return sim.GPUFellOffBus(5) }},
	{"IB port mlx5_4 down", "ib.ports", func() []sim.Fault { return []sim.Fault{sim.IBPortDown{HCA: "mlx5_4"}} }},
	{"hung nvidia-smi", "gpu.ecc", func() []sim.Fault { return []sim.Fault{sim.HungNvidiaSMI{}} }},
	{"GPU2 PCIe down-trained to x8", "gpu.pcie", func() []sim.Fault { return []sim.Fault{sim.PCIeDowntrained{GPU: 2, Width: 8}} }},
	{"thermal slowdown on GPU6", "gpu.thermal", func() []sim.Fault { return []sim.Fault{sim.ThermalSlowdown{GPU: 6}} }},
}

// toolTimeout bounds each simulated tool run, as tools.timeout does on a
// live host: a hung nvidia-smi costs one result, not the pass. Two seconds
// for the default fleet; more for a large one, whose simulated tools share
// this machine's cores and take longer to render while every node runs its
// pass at once (7 s at 1000 nodes).
func toolTimeout(nodes int) time.Duration {
	return 2*time.Second + time.Duration(nodes)*5*time.Millisecond
}

// Run plays the scenario and returns its outcome.
func Run(ctx context.Context, opts Options) (*Result, error) {
	if opts.Nodes <= 0 {
		opts.Nodes = 16
	}
	if opts.Nodes > 1000 {
		return nil, fmt.Errorf("demo: at most 1000 nodes, not %d", opts.Nodes)
	}
	say := func(format string, a ...any) {
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, format+"\n", a...)
		}
	}
	dir := opts.DataDir
	if dir == "" {
		d, err := os.MkdirTemp("", "fleetcheck-demo-")
		if err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
		defer func() { _ = os.RemoveAll(d) }() // best effort: a temp dir
		dir = d
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// Gossip runs on real loopback sockets behind a fault network, so the
	// scenario can partition one node's gossip.
	faults := faultnet.New()
	defer faults.Close()
	rng := rand.New(rand.NewPCG(uint64(opts.Seed), 0x5eed))
	order := rng.Perm(opts.Nodes)
	// The faulted nodes and the partition step's victim come first in
	// order: they are among the agents that gossip.
	gossipers := min(opts.Nodes, maxGossipAgents)
	gossipTune := func(c *membership.Config) error {
		demoGossipTimings(c, gossipers+1)
		t, err := faults.LoopbackTransport(membership.MemberlistLogger(opts.Logger))
		c.Transport = t
		return err
	}
	var tuneErr error

	// The coordinator's /metrics, as `fleetcheck coordinator` serves it.
	reg := prometheus.NewRegistry()
	cm, err := metrics.NewCoordinator(reg)
	if err != nil {
		return nil, fmt.Errorf("demo: metrics: %w", err)
	}
	// Loopback only, bind and advertise: nothing leaves this machine.
	srv, err := coordinator.New(coordinator.Config{
		Listen:            "127.0.0.1:0",
		HTTPListen:        "127.0.0.1:0",
		DataDir:           filepath.Join(dir, "coordinator"),
		HeartbeatInterval: demoHeartbeat(opts.Nodes),
		Insecure:          true,
		Gossip:            loopbackGossip(),
		// The web console, when serving: loopback, and in this
		// plaintext demo everyone is an anonymous operator.
		Console: console.Config{Enabled: opts.Serve, Listen: "127.0.0.1:0", Actions: true},
	}, coordinator.Options{Logger: opts.Logger, Version: opts.Version, Metrics: cm,
		Gossip: func(c *membership.Config) { tuneErr = errors.Join(tuneErr, gossipTune(c)) }})
	if err != nil {
		return nil, fmt.Errorf("demo: coordinator: %w", err)
	}
	cm.Watch(srv.Stats)
	cm.WatchCampaigns(srv.CampaignStats)
	srv.HTTPMux().Handle("/metrics", promserve.Handler(reg))
	if err := srv.Start(ctx); err != nil {
		return nil, fmt.Errorf("demo: start coordinator: %w", err)
	}
	if tuneErr != nil {
		return nil, fmt.Errorf("demo: %w", tuneErr)
	}
	defer func() { _ = srv.Stop(context.Background()) }() // the demo's outcome is already decided
	addr := srv.GRPCAddr().String()
	httpAddr := srv.HTTPAddr().String()
	say("coordinator listening on 127.0.0.1 only, plaintext: gRPC %s, HTTP http://%s (/metrics, /healthz), gossip %s; data in %s",
		addr, httpAddr, srv.GossipAddr(), dir)

	gossiping := map[int]bool{}
	for _, i := range order[:gossipers] {
		gossiping[i] = true
	}
	nodes, err := startFleet(ctx, opts, dir, addr, gossiping, func(c *membership.Config) {
		if err := gossipTune(c); err != nil {
			opts.Logger.Error().Err(err).Msg("demo gossip transport")
		}
	})
	if err != nil {
		return nil, err
	}
	var agents sync.WaitGroup
	defer func() { cancel(); agents.Wait() }()
	for _, n := range nodes {
		agents.Add(1)
		go func() {
			defer agents.Done()
			if err := n.agent.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				opts.Logger.Error().Err(err).Str("node", n.sim.Name()).Msg("agent stopped")
			}
		}()
	}
	if gossipers < len(nodes) {
		say("%d simulated 8x H100 nodes joined, %d of them in the gossip pool (the demo bounds it: all members share this machine); waiting for their first quick pass", len(nodes), gossipers)
	} else {
		say("%d simulated 8x H100 nodes joined; waiting for their first quick pass", len(nodes))
	}
	if err := waitStates(ctx, srv.Store(), len(nodes), scaled(60*time.Second, len(nodes)), func(st string) bool { return st == coordinator.StateHealthy }); err != nil {
		return nil, fmt.Errorf("demo: waiting for a healthy fleet: %w", err)
	}
	say("all %d nodes healthy", len(nodes))

	res := &Result{}
	res.Scenario.Nodes = len(nodes)
	res.Scenario.Seed = opts.Seed
	res.Scenario.Coordinator = addr
	for i, p := range faultPlan {
		if i >= len(nodes) {
			break
		}
		n := nodes[order[i]]
		for _, f := range p.faults() {
			if err := n.sim.AddFault(f); err != nil {
				return nil, fmt.Errorf("demo: inject %s: %w", p.name, err)
			}
		}
		res.Scenario.Faults = append(res.Scenario.Faults, Fault{Node: n.sim.Name(), Fault: p.name, Expect: p.expect})
		say("injected on %s: %s", n.sim.Name(), p.name)
	}

	say("fleet-wide check of every passive check")
	start := time.Now()
	final, err := fleetCheck(ctx, addr, scaled(20*time.Second, len(nodes)))
	if err != nil {
		return nil, err
	}
	res.Scenario.CheckedIn = time.Since(start).Round(time.Millisecond).String()
	say("check done in %s: %d nodes, %d failed or errored", res.Scenario.CheckedIn, final.GetTotal(), final.GetFailed())

	if err := collectNodes(ctx, srv.Store(), final, res); err != nil {
		return nil, err
	}
	if len(nodes) > len(faultPlan) {
		victim := nodes[order[len(faultPlan)]].sim.Name()
		if res.Gossip, err = partitionStep(ctx, srv, faults, victim, say); err != nil {
			return nil, err
		}
	}
	if opts.Serve {
		say("console: %s", srv.ConsoleURL())
		say("serving until interrupted: gRPC %s (try `fleetcheck nodes --insecure --coordinator %s`), metrics http://%s/metrics, gossip %s (`fleetcheck gossip members --insecure --coordinator %s` lists every member's address)",
			addr, addr, httpAddr, srv.GossipAddr(), addr)
		<-ctx.Done()
	}
	return res, nil
}

type fleetNode struct {
	sim   *sim.Node
	agent *agent.Agent
}

// demoHeartbeat is the agents' heartbeat interval: a second for a small
// fleet, so that the demo shows a lost stream quickly, and longer for a
// large one (10 s, production's default, at 1000 nodes), whose agents,
// sharing this machine, cannot all be heard from every second while their
// passes run; a stream is closed after three silent intervals.
func demoHeartbeat(nodes int) time.Duration {
	return max(time.Second, time.Duration(nodes)*10*time.Millisecond)
}

// scaled stretches a wait that suits the default 16 nodes to a fleet of n
// sharing this machine: each node's pass costs CPU time, and a 1000-node
// fleet's first pass takes a minute or more on two cores.
func scaled(base time.Duration, n int) time.Duration {
	return base + time.Duration(n)*100*time.Millisecond
}

func startFleet(ctx context.Context, opts Options, dir, addr string, gossiping map[int]bool, gossipTune func(*membership.Config)) ([]fleetNode, error) {
	var out []fleetNode
	for i := 0; i < opts.Nodes; i++ {
		name := fmt.Sprintf("gpu-%03d", i+1)
		spec := sim.DefaultSpec(name)
		spec.Labels = map[string]string{
			"sku":  "h100-sxm-80g-x8",
			"rack": fmt.Sprintf("r%02d", i/8+1),
			"leaf": fmt.Sprintf("leaf%02d", i/32+1),
		}
		n, err := sim.New(spec)
		if err != nil {
			return nil, fmt.Errorf("demo: sim %s: %w", name, err)
		}
		cfg := agent.DefaultConfig()
		cfg.Node = name
		cfg.Labels = spec.Labels
		cfg.Coordinator = addr
		cfg.Insecure = true
		cfg.StateDir = filepath.Join(dir, "agents", name)
		// One scheduled pass at start; the scenario's check does the rest.
		cfg.Interval = config.Duration(10 * time.Minute)
		cfg.Activity = agent.ActivityIdle
		cfg.Checks.Expect = config.Expect{GPUCount: 8, IBPorts: 8, IBRateGbps: 400}
		// No join address: agents join the one the coordinator announces.
		if gossiping[i] {
			cfg.Gossip = loopbackGossip()
		}
		a, err := agent.New(cfg, timeoutHost{n, toolTimeout(opts.Nodes)}, opts.Logger.With().Str("node", name).Logger(),
			agent.WithVersion(opts.Version), agent.WithGossipConfig(gossipTune),
			agent.WithBackoff(agent.ExpBackoff{Initial: 50 * time.Millisecond, Max: time.Second}))
		if err != nil {
			return nil, fmt.Errorf("demo: agent %s: %w", name, err)
		}
		out = append(out, fleetNode{sim: n, agent: a})
	}
	return out, nil
}

// timeoutHost gives each simulated tool run the deadline a live host's
// tools.timeout gives it.
type timeoutHost struct {
	*sim.Node
	timeout time.Duration
}

func (h timeoutHost) Capture(ctx context.Context, src snapshot.Source) host.Capture {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	c := h.Node.Capture(ctx, src)
	if c.State == snapshot.StateTimeout {
		c.Err = fmt.Sprintf("%s timed out after %s", src, h.timeout)
	}
	return c
}

func waitStates(ctx context.Context, st *store.Store, want int, within time.Duration, ok func(string) bool) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		nodes, err := st.Nodes(ctx)
		if err == nil {
			good := 0
			for _, n := range nodes {
				if ok(n.State) {
					good++
				}
			}
			if good >= want {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// passiveChecks are the names of every passive check.
func passiveChecks() []string {
	var out []string
	for _, c := range registry.All() {
		if !c.Disruptive() {
			out = append(out, c.Name())
		}
	}
	return out
}

// fleetCheck asks the coordinator, through its operator API like the CLI
// does, to run the passive checks on every node and waits for the end.
func fleetCheck(ctx context.Context, addr string, timeout time.Duration) (*pb.RunCheckProgress, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("demo: dial coordinator: %w", err)
	}
	defer func() { _ = conn.Close() }() // the call's own error is what is returned
	stream, err := pb.NewOperatorServiceClient(conn).RunCheck(ctx, &pb.RunCheckRequest{
		Checks:    passiveChecks(),
		TimeoutMs: timeout.Milliseconds(),
	})
	if err != nil {
		return nil, fmt.Errorf("demo: run check: %w", err)
	}
	for {
		p, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("demo: run check: %w", err)
		}
		if p.GetFinal() {
			return p, nil
		}
	}
}

func collectNodes(ctx context.Context, st *store.Store, final *pb.RunCheckProgress, res *Result) error {
	outcome := map[string]*pb.NodeOutcome{}
	for _, o := range final.GetOutcomes() {
		outcome[o.GetNode()] = o
	}
	nodes, err := st.Nodes(ctx)
	if err != nil {
		return fmt.Errorf("demo: list nodes: %w", err)
	}
	failing := map[string]map[string]bool{}
	for _, n := range nodes {
		nr := NodeResult{Name: n.Name, State: n.State, FailingChecks: []string{}, Findings: []report.Finding{}}
		o := outcome[n.Name]
		if o != nil {
			nr.Outcome = o.GetStatus()
		}
		failing[n.Name] = map[string]bool{}
		if o != nil && o.GetResultId() != "" {
			rows, err := st.Results(ctx, store.ResultQuery{Node: n.Name, Limit: 100})
			if err != nil {
				return fmt.Errorf("demo: results of %s: %w", n.Name, err)
			}
			var results []report.CheckResult
			for _, r := range rows {
				if r.ResultID != o.GetResultId() {
					continue
				}
				if r.Check.Status == report.Fail || r.Check.Status == report.Error {
					nr.FailingChecks = append(nr.FailingChecks, r.Check.Name)
					failing[n.Name][r.Check.Name] = true
					if r.Check.Status == report.Error && len(r.Check.Findings) == 0 {
						r.Check.Findings = []report.Finding{{Severity: report.SevFail, Component: "node", Code: "CHECK_ERROR", Message: r.Check.Name + ": " + r.Check.Reason, Action: report.ActionMonitor}}
					}
				}
				results = append(results, r.Check)
			}
			// Causes first: a port that is down before the counter it raised.
			for _, f := range report.FindingsByCause(results, registry.CauseOrder()) {
				if f.Severity == report.SevFail {
					nr.Findings = append(nr.Findings, f)
				}
			}
			sort.Strings(nr.FailingChecks)
		}
		res.Nodes = append(res.Nodes, nr)
	}
	for _, f := range res.Scenario.Faults {
		if failing[f.Node][f.Expect] {
			res.Caught++
		}
	}
	return nil
}

// WriteTable prints the fleet table.
func WriteTable(w io.Writer, r *Result) error {
	faults := map[string]string{}
	for _, f := range r.Scenario.Faults {
		faults[f.Node] = f.Fault
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tFAILING CHECKS\tFIRST FINDING\tINJECTED")
	for _, n := range r.Nodes {
		first := ""
		if len(n.Findings) > 0 {
			f := n.Findings[0]
			first = fmt.Sprintf("%s %s", f.Component, f.Code)
		}
		checks := strings.Join(n.FailingChecks, ",")
		if checks == "" {
			checks = "-"
		}
		inj := faults[n.Name]
		if inj == "" {
			inj = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Name, n.State, checks, first, inj)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "\n%d of %d injected faults caught by the check that should catch them; fleet check took %s.\n",
		r.Caught, len(r.Scenario.Faults), r.Scenario.CheckedIn); err != nil {
		return err
	}
	if g := r.Gossip; g != nil {
		if _, err := fmt.Fprintf(w, "gossip partition of %s (agent stream up: %v): unreachable after %s, healthy again %s after the heal.\n",
			g.Node, g.StreamUp, g.Detected, g.Cleared); err != nil {
			return err
		}
	}
	return nil
}
