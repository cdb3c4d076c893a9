package demo

import (
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/escalate"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/selector"
	"github.com/fleetcheck/fleetcheck/sim/simfleet"
)

// Full size of the remediation scenario (CampaignOptions.RemediationNodes
// and RemediationDays at 0).
const (
	RemediationNodes = 1024
	RemediationDays  = 30
)

// Ground-truth fault kinds of the remediation scenario.
const (
	kindECC      = "xid48-ecc"      // double-bit ECC: a GPU reset applies the remap
	kindBus      = "xid79-bus"      // fell off the bus: a reboot brings it back
	kindFailing  = "gpu-failing"    // a bad GPU: every reset or reboot holds only hours
	kindXid13HW  = "xid13-gpu"      // Xid 13 over and over on one GPU: a reset clears it
	kindFlap     = "link-flap"      // a flapping IB port: a port reset settles it
	kindCable    = "bad-cable"      // a bad cable: resets hold only hours
	kindBurst    = "xid79-burst"    // a firmware push: many nodes fall off at once
	kindApp      = "app-crash"      // one job's crash on many nodes: nobody's hardware
	kindSuppress = "in-maintenance" // hardware faults on nodes the health path must leave alone
)

// RemediationKind is one fault kind's figures.
type RemediationKind struct {
	Kind     string  `json:"kind"`
	Faults   int     `json:"faults"`
	Restored int     `json:"restored"`
	MTTRS    float64 `json:"mttr_s"`     // mean, alert → back in service
	MTTRP95S float64 `json:"mttr_p95_s"` // nearest rank
	RMAs     int     `json:"rmas"`
}

// RemediationResult is the remediation scenario's outcome.
type RemediationResult struct {
	Nodes int `json:"nodes"`
	Days  int `json:"days"`
	// Remediations opened, by final state.
	Remediations int               `json:"remediations"`
	ByState      map[string]int    `json:"by_state"`
	Kinds        []RemediationKind `json:"kinds"`
	// Jobs crashed Crashes times in all; each crash is one job event.
	Jobs      int `json:"jobs_crashed"`
	Crashes   int `json:"crashes"`
	JobEvents int `json:"job_events"`
	// The targets: all 0.
	Wrong        int `json:"wrong_remediations"`
	DrainedByApp int `json:"nodes_drained_for_application_faults"`
	HealthyRMAs  int `json:"healthy_parts_sent_to_rma"`
	ActedOnHeld  int `json:"suppressed_nodes_acted_on"`
	// The breaker: most distinct nodes it held within its window, its
	// limit, and how often it made a drain wait.
	BreakerMax      int     `json:"breaker_max_in_window"`
	BreakerLimit    int     `json:"breaker_limit"`
	BreakerHeld     int     `json:"breaker_held"`
	BreakerExceeded bool    `json:"breaker_exceeded"`
	Unrestored      int     `json:"unrestored"`
	WallS           float64 `json:"wall_s"`
}

type remFault struct {
	kind     string
	node     string
	comp     string
	start    time.Time
	every    time.Duration
	replace  bool          // only a new part fixes it
	holds    time.Duration // how long a reset holds when replace
	fixedBy  string        // the step that fixes it
	job      string
	xid      int // app: the job's Xid
	crashes  int // app: crashes left
	nodes    []string
	resolved time.Time // fixed for good
	until    time.Time // a reset holds it quiet until then
}

func (f *remFault) active(now time.Time) bool { return f.resolved.IsZero() && !now.Before(f.until) }

// remFleet is a kit.Fleet with the remediation scenario's ground truth:
// the agent actions clear the faults they fix.
type remFleet struct {
	clock *simfleet.Clock
	rng   *rand.Rand

	mu     sync.Mutex
	names  []string
	labels map[string]map[string]string
	faults map[string]*remFault // hardware faults by node (one each)
	acts   map[string]int       // agent actions run per node
	// drains is the ladder's drain adapter: a node it drained has no job
	// left (the simulated jobs end at the drain), the others are busy.
	drains *drain.None
}

func (f *remFleet) node(name string) kit.Node {
	inv := report.Inventory{}
	for i := range 8 {
		inv.GPUs = append(inv.GPUs, report.GPU{Index: i, Name: "NVIDIA H100 80GB HBM3", Serial: fmt.Sprintf("1654922%06d", crc(name)*8+i)})
	}
	inv.HCAs = []report.HCA{{Name: "mlx5_0", Model: "MT4129"}}
	activity := "busy"
	if st, err := f.drains.Status(context.Background(), name); err == nil && st.Drained {
		activity = "drained"
	}
	return kit.Node{Name: name, Labels: f.labels[name], State: "healthy", Activity: activity, Connected: true, Inventory: inv}
}

func crc(s string) int {
	h := 0
	for _, c := range s {
		h = (h*31 + int(c)) % 100000
	}
	return h
}

func (f *remFleet) Nodes(_ context.Context, sel string) ([]kit.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name, ok := strings.CutPrefix(sel, "name="); ok {
		if _, known := f.labels[name]; known {
			return []kit.Node{f.node(name)}, nil
		}
		return nil, nil
	}
	s, err := selector.Parse(sel)
	if err != nil {
		return nil, err
	}
	out := make([]kit.Node, 0, len(f.names))
	for _, n := range f.names {
		if s.Matches(n, f.labels[n]) {
			out = append(out, kit.Node{Name: n, Labels: f.labels[n], Connected: true})
		}
	}
	return out, nil
}

func (f *remFleet) RunChecks(_ context.Context, node string, names []string, _ kit.RunOptions) (*report.Report, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	ft := f.faults[node]
	bad := ft != nil && ft.active(now)
	rep := &report.Report{}
	for _, name := range names {
		c := report.CheckResult{Name: name, Status: report.Pass, Findings: []report.Finding{}}
		switch {
		case name == "gpu.xid" && bad && strings.HasPrefix(ft.comp, "GPU"):
			c.Status, c.Findings = report.Fail, []report.Finding{ft.finding()}
		case name == "ib.counters" && bad && strings.Contains(ft.comp, "/"):
			c.Status, c.Findings = report.Fail, []report.Finding{{Severity: report.SevFail, Component: ft.comp, Code: "IB_COUNTER_RISING", Action: report.ActionReseat}}
		case name == "nccl.allreduce":
			bw := 480 * (0.98 + 0.04*f.rng.Float64())
			if bad {
				bw = 190
			}
			c.Metrics = map[string]float64{"nccl.allreduce.busbw_gbps": bw}
		}
		rep.Checks = append(rep.Checks, c)
	}
	return rep, nil
}

func (f *remFault) finding() report.Finding {
	switch f.kind {
	case kindBus, kindBurst:
		return report.Finding{Severity: report.SevFail, Component: f.comp, Code: "XID_79", Action: report.ActionReboot}
	case kindXid13HW:
		return report.Finding{Severity: report.SevWarn, Component: f.comp, Code: "XID_13", Action: report.ActionRestartApp}
	}
	return report.Finding{Severity: report.SevFail, Component: f.comp, Code: "XID_48", Action: report.ActionResetGPU}
}

func (f *remFleet) RunMulti(context.Context, []string, string, kit.RunOptions) (*report.Report, error) {
	return nil, fmt.Errorf("multi-node runs: %w", kit.ErrRefused)
}

// RunAction is the agent's configured actions: a reset or reboot fixes
// what it fixes; on a part that must be replaced it holds for hours.
func (f *remFleet) RunAction(_ context.Context, node, action string, params map[string]string, _ kit.RunOptions) (kit.ActionResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acts[node]++
	now := f.clock.Now()
	step := ""
	switch action {
	case "collect-bundle":
		return kit.ActionResult{OK: true, Message: "/var/lib/fleetcheck-agent/bundles/" + node + "-" + now.Format("20060102T150405") + ".tar.gz"}, nil
	case "gpu-reset":
		step = remediation.StepResetGPU
	case "ib-port-reset":
		step = remediation.StepResetIBPort
	case "reboot":
		step = remediation.StepReboot
	default:
		return kit.ActionResult{}, fmt.Errorf("action %q is not in the agent's config: %w", action, kit.ErrRefused)
	}
	ft := f.faults[node]
	if ft == nil || !ft.resolved.IsZero() {
		return kit.ActionResult{OK: true, Message: action + " done"}, nil
	}
	hits := step == remediation.StepReboot ||
		(step == remediation.StepResetGPU && "GPU"+params["gpu"] == ft.comp) ||
		(step == remediation.StepResetIBPort && params["hca"]+"/"+params["port"] == ft.comp)
	if !hits {
		return kit.ActionResult{OK: true, Message: action + " done"}, nil
	}
	switch {
	case ft.replace:
		ft.until = now.Add(ft.holds) // quiet for a while, then back
	case step == ft.fixedBy || step == remediation.StepReboot:
		ft.resolved = now
	}
	return kit.ActionResult{OK: true, Message: action + " done"}, nil
}

// swap is the technician replacing the part.
func (f *remFleet) swap(node string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ft := f.faults[node]; ft != nil && ft.resolved.IsZero() {
		ft.resolved = f.clock.Now()
	}
}

// emission is one thing the fleet reports at a time.
type emission struct {
	at    time.Time
	seq   int
	fault *remFault
	tech  bool // the technician's hourly round
}

type emissions []*emission

func (h emissions) Len() int { return len(h) }
func (h emissions) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h emissions) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *emissions) Push(x any)   { *h = append(*h, x.(*emission)) }
func (h *emissions) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

type remScenario struct {
	f       *remFleet
	eng     *remediation.Engine
	br      *kit.Breaker
	q       emissions
	seq     int
	all     []*remFault
	held    map[string]string // nodes a burn-in holds
	appNode map[string]bool
	jobs    int
	crashes int
}

func (s *remScenario) Holding(_ context.Context, node string) (string, bool) {
	why, ok := s.held[node]
	return why, ok
}

func (s *remScenario) push(at time.Time, ft *remFault, tech bool) {
	s.seq++
	heap.Push(&s.q, &emission{at: at, seq: s.seq, fault: ft, tech: tech})
}

// plan draws the month's faults with their ground truth.
func (s *remScenario) plan(nodes, days int, start time.Time, rng *rand.Rand, suppressed []string) {
	span := time.Duration(days) * 24 * time.Hour
	free := make([]string, 0, nodes)
	for _, n := range s.f.names {
		// Only the chosen suppressed nodes get faults among the left-alone.
		if _, held := s.held[n]; !held && s.f.labels[n]["rack"] != "r02" && s.f.labels[n][remediation.DefaultOptOutLabel] == "" {
			free = append(free, n)
		}
	}
	rng.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	take := func() string {
		n := free[0]
		free = free[1:]
		return n
	}
	scaled := func(perNodeDay float64) int {
		return max(1, int(perNodeDay*float64(nodes*days)+0.5))
	}
	// Hardware faults start in the first 80% of the span, so each has time to end.
	at := func() time.Time { return start.Add(time.Duration(rng.Float64() * 0.8 * float64(span))) }
	gpu := func() string { return "GPU" + strconv.Itoa(rng.IntN(8)) }
	add := func(ft *remFault) {
		s.all = append(s.all, ft)
		if ft.kind != kindApp {
			s.f.faults[ft.node] = ft
		}
		// The agent reports on its schedule: seen within its 5m interval.
		s.push(ft.start.Add(time.Duration(rng.IntN(300))*time.Second), ft, false)
	}
	for range scaled(0.0015) {
		add(&remFault{kind: kindECC, node: take(), comp: gpu(), start: at(), every: 30 * time.Minute, fixedBy: remediation.StepResetGPU})
	}
	for range scaled(0.001) {
		add(&remFault{kind: kindBus, node: take(), comp: gpu(), start: at(), every: 30 * time.Minute, fixedBy: remediation.StepReboot})
	}
	for range scaled(0.0003) {
		add(&remFault{kind: kindFailing, node: take(), comp: gpu(), start: at(), every: 30 * time.Minute, replace: true,
			holds: time.Duration(6+rng.IntN(24)) * time.Hour, fixedBy: remediation.StepReplace})
	}
	for range scaled(0.0003) {
		add(&remFault{kind: kindXid13HW, node: take(), comp: gpu(), start: at(), every: 15 * time.Minute, fixedBy: remediation.StepResetGPU})
	}
	for range scaled(0.0006) {
		add(&remFault{kind: kindFlap, node: take(), comp: "mlx5_0/1", start: at(), every: time.Duration(8+rng.IntN(12)) * time.Minute, fixedBy: remediation.StepResetIBPort})
	}
	for range scaled(0.0002) {
		add(&remFault{kind: kindCable, node: take(), comp: "mlx5_0/1", start: at(), every: time.Duration(5+rng.IntN(10)) * time.Minute, replace: true,
			holds: time.Duration(2+rng.IntN(8)) * time.Hour, fixedBy: remediation.StepReplace})
	}
	// A firmware push: a rack's worth of nodes fall off the bus within ten minutes.
	burst := start.Add(span / 2)
	for range max(2, nodes/25) {
		add(&remFault{kind: kindBurst, node: take(), comp: gpu(), start: burst.Add(time.Duration(rng.IntN(600)) * time.Second), every: 30 * time.Minute, fixedBy: remediation.StepReboot})
	}
	// Hardware faults on the nodes the health path must leave alone.
	for _, n := range suppressed {
		add(&remFault{kind: kindSuppress, node: n, comp: gpu(), start: at(), every: 30 * time.Minute, fixedBy: remediation.StepResetGPU})
	}
	// Jobs crashing: application Xids on every node of the job at once, a
	// few times as the job restarts. Any node may run a job.
	for j := range max(2, int(2*float64(days)*float64(nodes)/1024+0.5)) {
		size := 8 << rng.IntN(4) // 8..64 nodes
		size = min(size, nodes/2)
		ns := make([]string, 0, size)
		for _, i := range rng.Perm(len(s.f.names))[:size] {
			ns = append(ns, s.f.names[i])
			s.appNode[s.f.names[i]] = true
		}
		ft := &remFault{kind: kindApp, start: start.Add(time.Duration(rng.Float64() * float64(span))), job: strconv.Itoa(1000 + j), nodes: ns,
			crashes: 1 + rng.IntN(3), every: time.Duration(15+rng.IntN(15)) * time.Minute, comp: "GPU0", xid: []int{13, 13, 31, 43}[rng.IntN(4)]}
		s.jobs++
		s.crashes += ft.crashes
		add(ft)
	}
}

// emit reports what a fault shows at its time, and when it shows next.
func (s *remScenario) emit(ctx context.Context, e *emission) error {
	ft, now := e.fault, e.at
	if ft.kind == kindApp {
		code := ft.xid
		var evs []escalate.Event
		for i, n := range ft.nodes {
			for g := range 8 {
				evs = append(evs, escalate.Event{At: now.Add(time.Duration(i%30) * time.Second), Node: n, Component: "GPU" + strconv.Itoa(g), Kind: escalate.KindXid, Xid: code, Job: ft.job})
			}
		}
		if err := s.eng.ObserveEvents(ctx, evs...); err != nil {
			return err
		}
		if ft.crashes--; ft.crashes > 0 {
			s.push(now.Add(ft.every), ft, false)
		}
		return nil
	}
	if !ft.resolved.IsZero() {
		return nil
	}
	if now.Before(ft.until) {
		s.push(ft.until, ft, false)
		return nil
	}
	var err error
	switch ft.kind {
	case kindFlap, kindCable:
		err = s.eng.ObserveEvents(ctx, escalate.Event{At: now, Node: ft.node, Component: ft.comp, Kind: escalate.KindLinkFlap, Count: 1})
	case kindXid13HW:
		err = s.eng.ObserveEvents(ctx, escalate.Event{At: now, Node: ft.node, Component: ft.comp, Kind: escalate.KindXid, Xid: 13})
	default:
		c := report.CheckResult{Name: "gpu.xid", Status: report.Fail, Findings: []report.Finding{ft.finding()}}
		err = s.eng.Observe(ctx, ft.node, []report.CheckResult{c}, now, "")
	}
	s.push(now.Add(ft.every), ft, false)
	return err
}

// technician swaps the parts of RMAs a day old and approves them.
func (s *remScenario) technician(ctx context.Context, now time.Time) error {
	rs, err := s.eng.List(ctx, "", remediation.StateRMA)
	if err != nil {
		return err
	}
	for _, r := range rs {
		if r.RMA != nil && now.Sub(r.RMA.Evidence.Opened) >= 24*time.Hour {
			s.f.swap(r.Node)
			if _, err := s.eng.Approve(ctx, r.ID, "technician"); err != nil {
				return err
			}
		}
	}
	return nil
}

func runRemediation(ctx context.Context, opts CampaignOptions) (*RemediationResult, error) {
	wallStart := time.Now()
	nodes, days := opts.RemediationNodes, opts.RemediationDays
	if nodes <= 0 {
		nodes = RemediationNodes
	}
	if days <= 0 {
		days = RemediationDays
	}
	if nodes < 64 {
		return nil, fmt.Errorf("remediation scenario: at least 64 nodes, not %d", nodes)
	}
	w := opts.Progress
	heading(w, fmt.Sprintf("remediation: %d nodes, %d days of faults with known ground truth, on the virtual clock", nodes, days))
	start := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	clock := simfleet.NewClock(start)
	rng := rand.New(rand.NewPCG(opts.Seed, 0x72656d6564))
	f := &remFleet{clock: clock, rng: rng, labels: map[string]map[string]string{}, faults: map[string]*remFault{}, acts: map[string]int{},
		drains: drain.NewNone(nil)}
	for i := range nodes {
		n := fmt.Sprintf("gpu-%04d", i+1)
		f.names = append(f.names, n)
		f.labels[n] = map[string]string{"rack": fmt.Sprintf("r%02d", i/32+1), "sku": "h100"}
	}
	// Suppressed: two opted out, rack r02 in a maintenance window (days
	// 3 to 20), four in a burn-in all month.
	f.labels["gpu-0001"][remediation.DefaultOptOutLabel] = "off"
	f.labels["gpu-0002"][remediation.DefaultOptOutLabel] = "off"
	s := &remScenario{f: f, held: map[string]string{}, appNode: map[string]bool{}}
	suppressed := []string{"gpu-0001", "gpu-0002", "gpu-0033", "gpu-0040", "gpu-0050", "gpu-0060"}
	for _, n := range []string{"gpu-0050", "gpu-0060", "gpu-0061", "gpu-0062"} {
		s.held[n] = "held by burn-in bi-demo"
	}
	// The window outlasts the run, so its nodes' faults are never due.
	mw := remediation.Window{Nodes: "rack=r02", From: start, Until: start.Add(time.Duration(days+30) * 24 * time.Hour)}
	var err error
	bc := kit.BreakerConfig{Window: time.Hour, MaxShare: 0.02}
	if s.br, err = kit.NewBreaker(bc, clock); err != nil {
		return nil, err
	}
	db, err := openCampaignDB(opts.Dir, "remediation")
	if err != nil {
		return nil, err
	}
	defer func() { _ = db.Close() }() // the demo's own store
	// One step at a time: the breaker's order and so the figures are the
	// same on every run of a seed.
	cfg := remediation.Config{Mode: remediation.ModeAuto, Maintenance: []remediation.Window{mw}, Parallel: 1}
	if opts.remediationConfig != nil {
		opts.remediationConfig(&cfg)
	}
	s.eng, err = remediation.New(ctx, cfg, remediation.Deps{DB: db, Fleet: f, Drain: f.drains, Breaker: s.br, Clock: clock,
		Log: zerolog.Nop(), Baselines: flatBaseline(480), Campaigns: s})
	if err != nil {
		return nil, err
	}
	s.plan(nodes, days, start, rng, suppressed)
	end := start.Add(time.Duration(days) * 24 * time.Hour)
	stop := end.Add(72 * time.Hour)
	for t := start.Add(time.Hour); !t.After(stop); t = t.Add(time.Hour) {
		s.push(t, nil, true)
	}
	res := &RemediationResult{Nodes: nodes, Days: days, ByState: map[string]int{}, BreakerLimit: s.br.State(nodes).Limit}
	heldSeen := map[string]bool{}
	// Faults run for the days; the engine and the technician get three
	// more to finish what is open.
	for ctx.Err() == nil {
		next := time.Time{}
		if len(s.q) > 0 {
			next = s.q[0].at
		}
		if due, ok, err := s.eng.NextDue(ctx); err != nil {
			return nil, err
		} else if ok && (next.IsZero() || due.Before(next)) {
			next = due
		}
		if next.IsZero() {
			break
		}
		if now := clock.Now(); next.After(now) {
			clock.Advance(next.Sub(now))
		}
		now := clock.Now()
		if now.After(stop) {
			break
		}
		for len(s.q) > 0 && !s.q[0].at.After(now) {
			e := heap.Pop(&s.q).(*emission)
			var err error
			if e.tech {
				err = s.technician(ctx, now)
			} else {
				err = s.emit(ctx, e)
			}
			if err != nil {
				return nil, err
			}
		}
		if _, err := s.eng.Step(ctx); err != nil {
			return nil, err
		}
		st := s.br.State(nodes)
		res.BreakerMax = max(res.BreakerMax, st.Drained)
		if st.Open {
			held, err := s.eng.List(ctx, "", remediation.StateHeld)
			if err != nil {
				return nil, err
			}
			for _, h := range held {
				if !heldSeen[h.ID] {
					heldSeen[h.ID] = true
					res.BreakerHeld++
				}
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := s.score(ctx, res); err != nil {
		return nil, err
	}
	res.WallS = time.Since(wallStart).Seconds()
	s.print(w, res)
	return res, nil
}

type flatBaseline float64

func (b flatBaseline) AllReduce(context.Context, string) (float64, bool, error) {
	return float64(b), true, nil
}

// score holds the engine's records against the ground truth.
func (s *remScenario) score(ctx context.Context, res *RemediationResult) error {
	rs, err := s.eng.List(ctx, "", "")
	if err != nil {
		return err
	}
	jobs, err := s.eng.JobEvents(ctx, 1<<20)
	if err != nil {
		return err
	}
	res.JobEvents, res.Jobs, res.Crashes = len(jobs), s.jobs, s.crashes
	res.Remediations = len(rs)
	byNode := map[string][]remediation.Remediation{}
	for _, r := range rs {
		res.ByState[string(r.State)]++
		byNode[r.Node] = append(byNode[r.Node], r)
		ft := s.f.faults[r.Node]
		truth := ft != nil && ft.comp == r.Component && !r.CreatedAt.Before(ft.start)
		if ft != nil && ft.kind == kindSuppress {
			if r.State != remediation.StateSuppressed || r.Drained || s.f.acts[r.Node] > 0 {
				res.ActedOnHeld++
			}
			continue
		}
		if !truth && r.State != remediation.StateSuppressed {
			res.Wrong++
			if s.appNode[r.Node] && wasDrained(r) {
				res.DrainedByApp++
			}
		}
		if r.RMA != nil && (ft == nil || !ft.replace) {
			res.HealthyRMAs++
		}
	}
	kinds := map[string]*RemediationKind{}
	mttr := map[string][]time.Duration{}
	var order []string
	for _, ft := range s.all {
		if ft.kind == kindApp {
			continue
		}
		k := kinds[ft.kind]
		if k == nil {
			k = &RemediationKind{Kind: ft.kind}
			kinds[ft.kind] = k
			order = append(order, ft.kind)
		}
		k.Faults++
		if ft.kind == kindSuppress {
			continue
		}
		// Restored: the remediation that was running when the fault was
		// fixed for good brought the node back.
		var back time.Time
		for _, r := range byNode[ft.node] {
			if r.RMA != nil {
				k.RMAs++
			}
			if r.State == remediation.StateDone && !ft.resolved.IsZero() && !r.DoneAt.Before(ft.resolved) && (back.IsZero() || r.DoneAt.Before(back)) {
				back = r.DoneAt
			}
		}
		if back.IsZero() {
			res.Unrestored++
			continue
		}
		k.Restored++
		mttr[ft.kind] = append(mttr[ft.kind], back.Sub(ft.start))
	}
	for _, kind := range order {
		k := kinds[kind]
		ds := mttr[kind]
		if len(ds) > 0 {
			sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
			var sum time.Duration
			for _, d := range ds {
				sum += d
			}
			k.MTTRS = (sum / time.Duration(len(ds))).Seconds()
			k.MTTRP95S = ds[(len(ds)*95+99)/100-1].Seconds()
		}
		res.Kinds = append(res.Kinds, *k)
	}
	res.BreakerExceeded = res.BreakerLimit >= 0 && res.BreakerMax > res.BreakerLimit
	return nil
}

func wasDrained(r remediation.Remediation) bool {
	switch r.State {
	case remediation.StateShadow, remediation.StateSuppressed:
		return false
	}
	return r.Drained || r.State == remediation.StateDone || r.State == remediation.StateRMA
}

func (s *remScenario) print(w interface{ Write([]byte) (int, error) }, res *RemediationResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FAULT KIND\tFAULTS\tRESTORED\tMTTR\tMTTR P95\tRMAS")
	for _, k := range res.Kinds {
		mttr, p95 := "-", "-"
		if k.Restored > 0 {
			mttr, p95 = simDur(time.Duration(k.MTTRS*float64(time.Second))), simDur(time.Duration(k.MTTRP95S*float64(time.Second)))
		}
		if k.Kind == kindSuppress {
			mttr, p95 = "left alone", "(maintenance, opt-out, burn-in)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%d\n", k.Kind, k.Faults, k.Restored, mttr, p95, k.RMAs)
	}
	_ = tw.Flush() // text for a person
	fmt.Fprintf(w, "%d remediations (%s); %d jobs crashed %d times with application Xids on every node: %d job events, %d nodes drained for them.\n",
		res.Remediations, states(res.ByState), res.Jobs, res.Crashes, res.JobEvents, res.DrainedByApp)
	fmt.Fprintf(w, "Wrong remediations: %d. Nodes drained for an application fault: %d. Healthy parts sent to RMA: %d. Suppressed nodes acted on: %d.\n",
		res.Wrong, res.DrainedByApp, res.HealthyRMAs, res.ActedOnHeld)
	fmt.Fprintf(w, "Breaker: at most %d nodes within its window (limit %d); it made %d drains wait; exceeded: %v. Unrestored at the end: %d. (%.1fs wall)\n",
		res.BreakerMax, res.BreakerLimit, res.BreakerHeld, res.BreakerExceeded, res.Unrestored, res.WallS)
}

func states(m map[string]int) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var parts []string
	for _, k := range ks {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}
