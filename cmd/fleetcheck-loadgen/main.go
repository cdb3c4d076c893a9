// Command fleetcheck-loadgen simulates a fleet of agents against a running
// coordinator and measures it: connect time, coordinator memory per idle
// agent, fleet-wide check latency, sustained ingest. It speaks the real
// protocol through the generated client and replays one real report
// (analyzed once from a bundle) under fresh result ids. It talks to
// 127.0.0.1 only. scripts/bench-fleet.sh (make bench-fleet) runs it;
// docs/scale.md explains the figures.
//
//	fleetcheck-loadgen -coordinator 127.0.0.1:7443 -coordinator-pid PID -agents 1000 -sustain 10s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/sim/loadgen"
)

type options struct {
	addr          string
	pid           int
	agents        int
	perConn       int
	concurrency   int
	bundle        string
	initialPass   bool
	settle        time.Duration
	checkRuns     int
	checkTimeout  time.Duration
	cli           string
	sustain       time.Duration
	warmup        time.Duration
	window        int
	label         string
	targetCheck   time.Duration
	targetRate    float64
	targetKiB     float64
	embed         string
	cpuProfile    string
	heapProfile   string
	printFreePort bool
}

func main() {
	var o options
	flag.StringVar(&o.addr, "coordinator", "127.0.0.1:7443", "the coordinator's gRPC address (127.0.0.1 only; it must run with insecure: true)")
	flag.IntVar(&o.pid, "coordinator-pid", 0, "the coordinator's process id, to read its memory and CPU from /proc (0: no readings)")
	flag.IntVar(&o.agents, "agents", 1000, "simulated agents")
	flag.IntVar(&o.perConn, "agents-per-conn", 1, "agent streams per connection (1: one connection each, as in a real fleet)")
	flag.IntVar(&o.concurrency, "connect-concurrency", 256, "hellos in flight at once while connecting")
	flag.StringVar(&o.bundle, "bundle", "examples/bundles/h100-healthy", "the bundle whose report every agent replays")
	flag.BoolVar(&o.initialPass, "first-pass", true, "after the idle reading, every agent sends one full result, as a real agent's first pass")
	flag.DurationVar(&o.settle, "settle", 5*time.Second, "wait after connecting before reading the coordinator's idle memory (half of it after the first pass)")
	flag.IntVar(&o.checkRuns, "check-runs", 3, "fleet-wide checks to time")
	flag.DurationVar(&o.checkTimeout, "check-timeout", 2*time.Minute, "the fleet-wide check's timeout")
	flag.StringVar(&o.cli, "cli", "", "a fleetcheck binary: also time one `fleetcheck check` run through it")
	flag.DurationVar(&o.sustain, "sustain", 0, "send results as fast as acks allow for this long (0: skip)")
	flag.DurationVar(&o.warmup, "warmup", 0, "before the measured sustain, send as fast for this long, unmeasured but shown (a fresh database's first minutes: new WAL files, first touch of its memory)")
	flag.IntVar(&o.window, "window", 2, "unacked results per agent while sustaining")
	flag.StringVar(&o.label, "label", "", "the row label in the summary (default: N agents)")
	flag.DurationVar(&o.targetCheck, "target-check", 0, "target for the fleet-wide check (0: none)")
	flag.Float64Var(&o.targetRate, "target-rate", 0, "target for sustained check results per second (0: none)")
	flag.Float64Var(&o.targetKiB, "target-kib-per-agent", 0, "target for coordinator KiB per idle agent (0: none)")
	flag.StringVar(&o.embed, "embed", "", "run a coordinator in this process on this data dir (profiling; readings then include the load generator)")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process")
	flag.StringVar(&o.heapProfile, "heapprofile", "", "write a heap profile of this process after the idle reading")
	flag.BoolVar(&o.printFreePort, "print-free-port", false, "print a free 127.0.0.1 TCP port and exit")
	flag.Parse()

	if o.printFreePort {
		port, err := freePort()
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleetcheck-loadgen:", err)
			os.Exit(2)
		}
		fmt.Println(port)
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "fleetcheck-loadgen:", err)
		os.Exit(1)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }() // only held to learn a free port
	return l.Addr().(*net.TCPAddr).Port, nil
}

// table collects the summary rows; err is the first failed write (the
// run fails with it: a summary missing rows is not a result).
type table struct {
	label string
	w     io.Writer
	err   error
}

// row prints one markdown row; ok is "ok", "MISSED" or "" (no target).
func (t *table) row(figure, value, target, ok string) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.w, "| %s | %s | %s | %s | %s |\n", t.label, figure, value, target, ok)
	}
}

func verdict(met bool) string {
	if met {
		return "ok"
	}
	return "MISSED"
}

func run(ctx context.Context, o options, out, errw io.Writer) (err error) {
	log := zerolog.New(zerolog.ConsoleWriter{Out: errw, TimeFormat: time.TimeOnly}).With().Timestamp().Logger()
	if o.label == "" {
		o.label = fmt.Sprintf("%d agents", o.agents)
	}
	tab := &table{label: o.label, w: out}
	if lim, err := loadgen.RaiseFileLimit(); err != nil {
		log.Warn().Err(err).Msg("open file limit")
	} else {
		log.Info().Uint64("open_files", lim).Msg("open file limit raised to the hard limit")
		if lim < uint64(o.agents)+256 {
			log.Warn().Uint64("open_files", lim).Int("agents", o.agents).Msg("fewer files than agents: raise the OS hard limit (ulimit -Hn)")
		}
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer func() {
			if err := f.Close(); err != nil {
				log.Warn().Err(err).Str("file", o.cpuProfile).Msg("cpu profile not written in full")
			}
		}()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if o.embed != "" {
		srv, err := coordinator.New(coordinator.Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: o.embed, Insecure: true},
			coordinator.Options{Logger: zerolog.Nop(), Version: "loadgen-embedded"})
		if err != nil {
			return err
		}
		if err := srv.Start(ctx); err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = errors.Join(err, srv.Stop(sctx))
		}()
		o.addr, o.pid = srv.GRPCAddr().String(), os.Getpid()
		log.Info().Str("addr", o.addr).Msg("embedded coordinator")
	}

	start := time.Now()
	fx, err := loadgen.LoadFixture(ctx, o.bundle)
	if err != nil {
		return err
	}
	names := fx.Checks()
	log.Info().Str("bundle", o.bundle).Str("status", fx.Status()).Int("checks", len(names)).
		Dur("took_ms", time.Since(start)).Msg("fixture analyzed once")

	op, err := loadgen.DialOperator(o.addr)
	if err != nil {
		return err
	}
	defer func() { _ = op.Close() }() // the run's own error is what is returned
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = op.WaitReady(rctx)
	cancel()
	if err != nil {
		return err
	}

	read := func() reading {
		r := reading{at: time.Now()}
		var err error
		if o.pid != 0 {
			if r.coord, err = loadgen.ReadProc(o.pid); err != nil {
				log.Warn().Err(err).Msg("coordinator reading")
			}
		}
		if r.self, err = loadgen.ReadProc(os.Getpid()); err != nil {
			log.Warn().Err(err).Msg("own reading")
		}
		if r.machine, err = loadgen.ReadMachine(); err != nil {
			log.Warn().Err(err).Msg("machine reading")
		}
		return r
	}
	p0 := read()

	log.Info().Int("agents", o.agents).Msg("connecting")
	start = time.Now()
	fleet, err := loadgen.Start(ctx, loadgen.Config{
		Addr: o.addr, Agents: o.agents, AgentsPerConn: o.perConn, ConnectConcurrency: o.concurrency,
		Window: o.window, Fixture: fx, Logger: log,
	})
	if err != nil {
		return err
	}
	defer fleet.Close()
	connect := time.Since(start)
	p1 := read()
	tab.row("connect: hello → welcome, every agent", fmt.Sprintf("%.2f s", connect.Seconds()), "", "")
	tab.row("CPU while connecting", usage(p0, p1), "", "")

	log.Info().Dur("connect_ms", connect).Dur("settle_ms", o.settle).Msg("connected; settling")
	select {
	case <-time.After(o.settle):
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := fleet.Lost(); err != nil {
		return err
	}
	idle := read()
	if o.pid != 0 {
		perKiB := float64(idle.coord.RSSKiB-p0.coord.RSSKiB) / float64(o.agents)
		tab.row("coordinator RSS with 0 agents", mib(p0.coord.RSSKiB), "", "")
		tab.row(fmt.Sprintf("coordinator RSS with %d idle agents (connected, heartbeating)", o.agents), mib(idle.coord.RSSKiB), "", "")
		target, ok := "", ""
		if o.targetKiB > 0 {
			target, ok = fmt.Sprintf("< %.0f KB", o.targetKiB), verdict(perKiB < o.targetKiB)
		}
		tab.row("coordinator memory per idle agent", fmt.Sprintf("%.1f KB", perKiB), target, ok)
	}
	if o.initialPass {
		// What a real fleet does next: every agent's first scheduled pass.
		before := read()
		if err := fleet.PassAll(ctx); err != nil {
			return err
		}
		after := read()
		tab.row("first pass: every agent's first full result stored", fmt.Sprintf("%.2f s", after.at.Sub(before.at).Seconds()), "", "")
		tab.row("CPU during the first pass", usage(before, after), "", "")
		select {
		case <-time.After(o.settle / 2):
		case <-ctx.Done():
			return ctx.Err()
		}
		if o.pid != 0 {
			warm := read()
			tab.row(fmt.Sprintf("coordinator RSS after the first pass (%d results stored)", o.agents), mib(warm.coord.RSSKiB), "", "")
			tab.row("coordinator memory per agent after the first pass (heap kept from the burst, store cache)",
				fmt.Sprintf("%.1f KB", float64(warm.coord.RSSKiB-p0.coord.RSSKiB)/float64(o.agents)), "", "")
		}
	}
	if o.heapProfile != "" {
		if err := writeHeap(o.heapProfile); err != nil {
			return err
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		log.Info().Uint64("heap_inuse_mib", ms.HeapInuse>>20).Uint64("stack_inuse_mib", ms.StackInuse>>20).
			Uint64("sys_mib", ms.Sys>>20).Int("goroutines", runtime.NumGoroutine()).Msg("this process's memory")
	}

	for i := range o.checkRuns {
		before := read()
		cr, err := op.RunCheck(ctx, "", names, o.checkTimeout)
		if err != nil {
			return err
		}
		after := read()
		f := cr.Final
		// The final progress can overtake the last acks on their streams.
		n, last := fleet.WorkAcked(f.GetWorkId())
		for wait := time.Now().Add(10 * time.Second); n < o.agents && time.Now().Before(wait); {
			time.Sleep(5 * time.Millisecond)
			n, last = fleet.WorkAcked(f.GetWorkId())
		}
		log.Info().Int("run", i+1).Dur("took_ms", cr.Took).Int32("total", f.GetTotal()).Int32("done", f.GetDone()).
			Int32("failed", f.GetFailed()).Int32("refused", f.GetRefused()).Int32("unreachable", f.GetUnreachable()).
			Int32("timed_out", f.GetTimedOut()).Int("acked_at_agents", n).Msg("fleet-wide check")
		if int(f.GetTotal()) != o.agents || f.GetDone() != f.GetTotal() || f.GetRefused()+f.GetUnreachable()+f.GetTimedOut() != 0 || n != o.agents {
			return fmt.Errorf("fleet-wide check %d: total %d done %d refused %d unreachable %d timed out %d, %d results acked at the agents; want all %d",
				i+1, f.GetTotal(), f.GetDone(), f.GetRefused(), f.GetUnreachable(), f.GetTimedOut(), n, o.agents)
		}
		target, ok := "", ""
		if o.targetCheck > 0 {
			target, ok = fmt.Sprintf("< %s", o.targetCheck), verdict(cr.Took < o.targetCheck)
		}
		agentsSaw := last.Sub(cr.Start)
		tab.row(fmt.Sprintf("fleet-wide check (%d checks), request → all %d stored, run %d", len(names), o.agents, i+1),
			fmt.Sprintf("%.3f s (last ack at an agent %.3f s)", cr.Took.Seconds(), agentsSaw.Seconds()), target, ok)
		tab.row(fmt.Sprintf("CPU during check run %d", i+1), usage(before, after), "", "")
	}

	if o.cli != "" {
		took, res, err := loadgen.RunCLICheck(ctx, o.cli, o.addr, names, o.checkTimeout)
		if err != nil {
			return err
		}
		if int(res.Done) != o.agents {
			return fmt.Errorf("fleetcheck check: %d of %d nodes done", res.Done, o.agents)
		}
		tab.row("`fleetcheck check '' --checks <13 passive>` process start → exit", fmt.Sprintf("%.3f s", took.Seconds()), "", "")
	}

	if o.sustain > 0 && o.warmup > 0 {
		before := read()
		st, err := fleet.Sustain(ctx, o.warmup)
		if err != nil {
			return err
		}
		after := read()
		rate := float64(st.CheckResults) / st.Elapsed.Seconds()
		log.Info().Int64("check_results", st.CheckResults).Float64("check_results_per_s", rate).Msg("warm-up")
		tab.row(fmt.Sprintf("warm-up before sustaining (%s, not the figure below)", o.warmup),
			fmt.Sprintf("%.0f /s (%s)", rate, load(before, after)), "", "")
	}
	if o.sustain > 0 {
		checksBefore := fleet.Counters().CheckResults
		before := read()
		st, err := fleet.Sustain(ctx, o.sustain)
		if err != nil {
			return err
		}
		after := read()
		rate := float64(st.CheckResults) / st.Elapsed.Seconds()
		log.Info().Int64("results", st.Results).Int64("check_results", st.CheckResults).Dur("elapsed_ms", st.Elapsed).
			Dur("drain_ms", st.Drain).Float64("check_results_per_s", rate).Msg("sustained ingest")
		target, ok := "", ""
		if o.targetRate > 0 {
			target, ok = fmt.Sprintf("≥ %.0f /s", o.targetRate), verdict(rate >= o.targetRate)
		}
		tab.row(fmt.Sprintf("sustained check results stored /s (%d checks per result, window %d, %s)", len(names), o.window, o.sustain),
			fmt.Sprintf("%.0f /s (%.0f results/s; %s)", rate, float64(st.Results)/st.Elapsed.Seconds(), load(before, after)), target, ok)
		tab.row("CPU while sustaining (and draining)", usage(before, after), "", "")
		if o.pid != 0 && st.CheckResults > 0 {
			c := fleet.Counters()
			per := (after.coord.CPU - before.coord.CPU).Seconds() / float64(c.CheckResults-checksBefore)
			tab.row("coordinator CPU per check result stored", fmt.Sprintf("%.0f µs (%s)", per*1e6, load(before, after)), "", "")
		}
		if o.pid != 0 {
			tab.row("coordinator RSS after sustaining", mib(after.coord.RSSKiB), "", "")
		}
	}
	if err := fleet.Lost(); err != nil {
		return err
	}
	c := fleet.Counters()
	if c.Refused > 0 {
		return fmt.Errorf("%d results refused", c.Refused)
	}
	log.Info().Int64("sent", c.Sent).Int64("acked", c.Acked).Int64("duplicates", c.Duplicates).
		Int64("check_results", c.CheckResults).Msg("done")
	if tab.err != nil {
		return fmt.Errorf("summary: %w", tab.err)
	}
	return nil
}

func mib(kib int64) string { return fmt.Sprintf("%.1f MiB", float64(kib)/1024) }

// reading is one look at the coordinator, this process and the machine.
type reading struct {
	at      time.Time
	coord   loadgen.Proc
	self    loadgen.Proc
	machine loadgen.Machine
}

// usage says who used the CPUs between two readings, in cores: the
// coordinator, the load generator, and everything else on the machine (on
// a shared machine, other people's work).
func usage(a, b reading) string {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return "-"
	}
	coord := (b.coord.CPU - a.coord.CPU).Seconds()
	self := (b.self.CPU - a.self.CPU).Seconds()
	busy := (b.machine.Busy - a.machine.Busy).Seconds()
	cpus := (b.machine.Total - a.machine.Total).Seconds() / wall
	others := max(busy-coord-self, 0)
	return fmt.Sprintf("coordinator %.2f, load generator %.2f, other processes %.2f cores (of %.0f) over %.2f s; %s",
		coord/wall, self/wall, others/wall, cpus, wall, load(a, b))
}

// load is the machine's one-minute load average at two readings, with its
// CPU count: a load above the CPUs means processes queued for them.
func load(a, b reading) string {
	return fmt.Sprintf("load average %.2f → %.2f on %d CPUs", a.machine.Load1, b.machine.Load1, b.machine.CPUs)
}

func writeHeap(path string) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("heap profile: %w", cerr)
		}
	}()
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	return nil
}
