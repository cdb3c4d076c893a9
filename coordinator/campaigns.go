package coordinator

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/burnin"
	"github.com/fleetcheck/fleetcheck/campaign"
	"github.com/fleetcheck/fleetcheck/compat"
	"github.com/fleetcheck/fleetcheck/drain"
	k8sdrain "github.com/fleetcheck/fleetcheck/drain/kubernetes"
	"github.com/fleetcheck/fleetcheck/drain/slurm"
	"github.com/fleetcheck/fleetcheck/drill"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
	"github.com/fleetcheck/fleetcheck/rollout"
	"github.com/fleetcheck/fleetcheck/store"
	"github.com/fleetcheck/fleetcheck/sweep"
)

// DrainConfig picks how campaigns take nodes out of service.
//
//	drain:
//	  adapter: slurm            # none (default) | slurm | kubernetes
//	  slurm: {scontrol: /usr/bin/scontrol, timeout: 30s}
//	  kubernetes: {kubeconfig: /etc/fleetcheck/kubeconfig, evict_unmanaged: false}
//	  policy: {actions: [drain, replace, reseat], codes: [ECC_UNCORRECTABLE]}
type DrainConfig struct {
	Adapter    string           `yaml:"adapter"`
	Slurm      SlurmDrainConfig `yaml:"slurm"`
	Kubernetes K8sDrainConfig   `yaml:"kubernetes"`
	// Policy takes nodes out of service as their results arrive
	// (drainpolicy.go); off by default.
	Policy DrainPolicyConfig `yaml:"policy"`
}

// SlurmDrainConfig names the Slurm tools (PATH lookups by default).
type SlurmDrainConfig struct {
	Scontrol string        `yaml:"scontrol"`
	Sinfo    string        `yaml:"sinfo"`
	Squeue   string        `yaml:"squeue"`
	Timeout  time.Duration `yaml:"timeout"`
	Env      []string      `yaml:"env"`
}

// K8sDrainConfig reaches the API server: Kubeconfig, or in-cluster
// credentials when empty.
type K8sDrainConfig struct {
	Kubeconfig      string        `yaml:"kubeconfig"`
	EvictionTimeout time.Duration `yaml:"eviction_timeout"`
	EvictUnmanaged  bool          `yaml:"evict_unmanaged"`
}

// BreakerConfig bounds what campaigns together may drain (campaign.Breaker).
//
//	breaker: {window: 1h, max_share: 0.05, max_count: 20}
type BreakerConfig struct {
	Window   time.Duration `yaml:"window"`
	MaxShare float64       `yaml:"max_share"`
	MaxCount int           `yaml:"max_count"`
}

// SweepScheduleConfig runs a sweep on a cron schedule (five fields,
// robfig/cron syntax, the coordinator's local time unless CRON_TZ= leads).
//
//	sweep_schedule:
//	  cron: "0 2 * * *"
//	  spec: {selector: "sku=h100", threshold: 0.3, drain: true}
type SweepScheduleConfig struct {
	Cron string `yaml:"cron"`
	// Spec is the sweep to run (sweep/spec.go), decoded as strictly as
	// the rest of the file: durations as durations ("10m").
	Spec sweep.Spec `yaml:"spec"`
}

// validateCampaigns checks the campaign sections of the config.
func (c Config) validateCampaigns() error {
	var errs []error
	switch c.Drain.Adapter {
	case "", "none", "slurm", "kubernetes":
	default:
		errs = append(errs, fmt.Errorf("drain.adapter %q: must be none, slurm or kubernetes", c.Drain.Adapter))
	}
	if err := c.Drain.Policy.validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs,
		rangeBreakerWindow.CheckOrZero("breaker.window", c.Breaker.Window),
		rangeBreakerShare.Check("breaker.max_share", c.Breaker.MaxShare),
		rangeBreakerCount.Check("breaker.max_count", c.Breaker.MaxCount),
		rangeSlurmTimeout.CheckOrZero("drain.slurm.timeout", c.Drain.Slurm.Timeout),
		rangeEvictTimeout.CheckOrZero("drain.kubernetes.eviction_timeout", c.Drain.Kubernetes.EvictionTimeout))
	if c.SweepSchedule != nil {
		if _, err := cron.ParseStandard(c.SweepSchedule.Cron); err != nil {
			errs = append(errs, fmt.Errorf("sweep_schedule.cron %q: %w", c.SweepSchedule.Cron, err))
		}
		if err := c.SweepSchedule.Spec.WithDefaults().Validate(); err != nil {
			errs = append(errs, fmt.Errorf("sweep_schedule.spec: %w", err))
		}
	}
	return errors.Join(errs...)
}

// parseSweepSpec reads a sweep spec as YAML or JSON (sweep.ParseSpec).
func parseSweepSpec(b []byte) (sweep.Spec, error) { return sweep.ParseSpec(b) }

// newDrainAdapter builds the configured adapter.
func newDrainAdapter(c DrainConfig) (drain.Adapter, error) {
	switch c.Adapter {
	case "", "none":
		return drain.NewNone(nil), nil
	case "slurm":
		return slurm.New(slurm.Options{Scontrol: c.Slurm.Scontrol, Sinfo: c.Slurm.Sinfo, Squeue: c.Slurm.Squeue,
			Timeout: c.Slurm.Timeout, Env: c.Slurm.Env}), nil
	case "kubernetes":
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = c.Kubernetes.Kubeconfig
		rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("drain kubernetes: %w", err)
		}
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("drain kubernetes: %w", err)
		}
		return k8sdrain.New(cs, k8sdrain.Options{EvictionTimeout: c.Kubernetes.EvictionTimeout,
			EvictUnmanaged: c.Kubernetes.EvictUnmanaged}), nil
	}
	return nil, fmt.Errorf("drain adapter %q: unknown", c.Adapter)
}

// errNoFleet answers campaign calls on a coordinator given no fleet.
var errNoFleet = errors.New("no fleet wired into this coordinator: campaigns are off")

// campaigns hosts the campaign engines on the coordinator's database and
// serves CampaignService.
type campaigns struct {
	pb.UnimplementedCampaignServiceServer

	s       *Server
	log     zerolog.Logger
	db      *sql.DB
	fleet   campaign.Fleet
	matrix  string // configured compatibility matrix file
	bl      *baselines.Store
	breaker *campaign.Breaker
	policy  *drainPolicy     // nil when the drain policy is off
	conds   *conditionWriter // nil unless the drain adapter writes node conditions
	sweep   *sweep.Engine
	rollout *rollout.Engine
	burnin  *burnin.Engine
	drill   *drill.Engine
	cron    *cron.Cron

	ctx      context.Context // the engines' life: cancelled by stop
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	sweeping atomic.Bool // a scheduled sweep is running
}

// startCampaigns opens the engines on st, restores the breaker, resumes
// interrupted sweeps and starts the engines' loops and the schedule. With
// no fleet only baselines are served.
func startCampaigns(ctx context.Context, s *Server, st *store.Store) (_ *campaigns, err error) {
	c := &campaigns{s: s, log: s.log.With().Str("subsystem", "campaigns").Logger(), db: st.OpenDB(),
		fleet: s.campaignFleet(), matrix: s.cfg.CompatMatrix}
	defer func() {
		if err != nil {
			_ = c.db.Close() // the start error is the one to report
		}
	}()
	c.bl, err = baselines.NewStore(c.db, baselines.WithReader(st.ReaderDB()), baselines.WithClock(s.now))
	if err != nil {
		return nil, fmt.Errorf("baselines: %w", err)
	}
	if res, err := c.bl.ImportReference(ctx, "coordinator"); err != nil {
		return nil, fmt.Errorf("baselines reference: %w", err)
	} else if res.Added > 0 {
		c.log.Info().Int("added", res.Added).Msg("reference baselines imported")
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if c.fleet == nil {
		c.log.Warn().Msg("no fleet: sweeps, rollouts, burn-ins and drills are off")
		return c, nil
	}
	defer func() {
		if err != nil {
			c.cancel()
		}
	}()
	clock := s.opts.CampaignClock
	if clock == nil {
		clock = campaign.WallClock{}
	}
	adapter := s.opts.Drain
	if adapter == nil {
		if adapter, err = newDrainAdapter(s.cfg.Drain); err != nil {
			return nil, err
		}
	}
	bc := s.cfg.Breaker
	if c.breaker, err = campaign.NewBreaker(campaign.BreakerConfig{Window: bc.Window, MaxShare: bc.MaxShare, MaxCount: bc.MaxCount}, clock); err != nil {
		return nil, fmt.Errorf("breaker: %w", err)
	}
	sst, err := sweep.NewSQLiteStore(ctx, c.db)
	if err != nil {
		return nil, fmt.Errorf("sweep store: %w", err)
	}
	if c.sweep, err = sweep.New(sweep.Config{Fleet: c.fleet, Store: sst, Baselines: sweep.FinderSource{Finder: c.bl},
		Clock: clock, Drainer: adapter, Breaker: c.breaker, Logger: c.log}); err != nil {
		return nil, fmt.Errorf("sweep: %w", err)
	}
	if c.rollout, err = rollout.NewEngine(c.db, c.fleet, adapter, c.breaker, clock, c.log, rollout.WithBaselines(c.bl)); err != nil {
		return nil, fmt.Errorf("rollout: %w", err)
	}
	if c.burnin, err = burnin.NewEngine(c.db, c.fleet, adapter, c.breaker, c.bl, clock, c.log); err != nil {
		return nil, fmt.Errorf("burnin: %w", err)
	}
	if c.drill, err = drill.NewEngine(c.db, c.fleet, adapter, c.breaker, clock, c.log); err != nil {
		return nil, fmt.Errorf("drill: %w", err)
	}
	// The breaker keeps its window in memory: the campaigns' own records
	// of their drains bring it back after a restart.
	window := bc.Window
	if window <= 0 {
		window = time.Hour
	}
	if recs, err := c.sweep.BreakerRecords(ctx, clock.Now().Add(-window)); err == nil {
		c.breaker.Restore(recs)
	} else {
		c.log.Warn().Err(err).Msg("sweep drains not restored into the breaker")
	}
	if recs, err := c.burnin.DrainRecords(ctx); err == nil {
		c.breaker.Restore(recs)
	} else {
		c.log.Warn().Err(err).Msg("burn-in drains not restored into the breaker")
	}
	if nodes, err := st.Nodes(ctx); err == nil {
		c.breaker.Restore(policyBreakerRecords(nodes))
	} else {
		c.log.Warn().Err(err).Msg("drain policy drains not restored into the breaker")
	}
	c.conds = newConditionWriter(c.ctx, adapter, c.log)
	if p := s.cfg.Drain.Policy; p.Enabled() {
		c.policy = newDrainPolicy(c.ctx, s, p, adapter, s.cfg.Drain.Adapter, c.breaker, c.log)
		c.log.Info().Strs("actions", p.Actions).Strs("codes", p.Codes).Str("adapter", c.policy.via).Msg("drain policy on")
	}
	if sc := s.cfg.SweepSchedule; sc != nil {
		spec := sc.Spec
		c.cron = cron.New()
		if _, err := c.cron.AddFunc(sc.Cron, func() { c.scheduledSweep(spec) }); err != nil {
			return nil, fmt.Errorf("sweep_schedule.cron: %w", err)
		}
		c.cron.Start()
	}
	// Finish the sweeps a stop interrupted. They are listed now, not in
	// the goroutine (as Engine.Resume would), so a sweep an operator
	// starts meanwhile is not picked up twice.
	recs, err := sst.Sweeps(ctx)
	if err != nil {
		return nil, fmt.Errorf("sweep resume: %w", err)
	}
	var interrupted []string
	for _, r := range slices.Backward(recs) { // oldest first
		if r.State == sweep.StateRunning {
			interrupted = append(interrupted, r.ID)
		}
	}
	c.loop("sweep resume", func(ctx context.Context) error {
		var errs []error
		for _, id := range interrupted {
			c.log.Info().Str("campaign", id).Msg("resuming sweep")
			if _, err := c.sweep.Run(ctx, id); err != nil && !errors.Is(err, sweep.ErrAlreadyRunning) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
	c.loop("rollout", c.rollout.Run)
	c.loop("burnin", c.burnin.Run)
	c.loop("drill", c.drill.Run)
	return c, nil
}

// loop runs an engine's loop until stop.
func (c *campaigns) loop(name string, run func(context.Context) error) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := run(c.ctx); err != nil && !errors.Is(err, context.Canceled) {
			c.log.Error().Err(err).Str("engine", name).Msg("campaign engine stopped")
		}
	}()
}

// scheduledSweep runs one nightly sweep; a night whose previous sweep is
// still running is skipped rather than queued.
func (c *campaigns) scheduledSweep(spec sweep.Spec) {
	if !c.sweeping.CompareAndSwap(false, true) {
		c.log.Warn().Msg("scheduled sweep skipped: the previous one is still running")
		return
	}
	c.wg.Add(1)
	defer c.wg.Done()
	defer c.sweeping.Store(false)
	rec, err := c.sweep.Start(c.ctx, spec)
	if err != nil {
		c.log.Error().Err(err).Msg("scheduled sweep not started")
		return
	}
	if err := c.s.Audit(c.ctx, "schedule:sweep", "sweep.start", rec.ID); err != nil {
		c.log.Error().Err(err).Str("campaign", rec.ID).Msg("audit")
	}
	if _, err := c.sweep.Run(c.ctx, rec.ID); err != nil && !errors.Is(err, context.Canceled) {
		c.log.Error().Err(err).Str("campaign", rec.ID).Msg("scheduled sweep")
	}
}

// stop ends the schedule and the loops, and closes the engines' database.
func (c *campaigns) stop() error {
	// No new scheduled run first; then end the running ones (a scheduled
	// sweep can take hours, so cancel before waiting for it).
	var jobs context.Context
	if c.cron != nil {
		jobs = c.cron.Stop()
	}
	c.cancel()
	if jobs != nil {
		<-jobs.Done()
	}
	c.wg.Wait()
	c.policy.wait()
	c.conds.wait()
	return c.db.Close()
}

// campaignErr maps the engines' sentinels onto gRPC codes.
func campaignErr(op string, err error) error {
	if err == nil {
		return nil
	}
	// A gRPC status already says what happened (a fleet call's error).
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, errNoFleet):
		code = codes.Unavailable
	case errors.Is(err, baselines.ErrNotFound), errors.Is(err, sweep.ErrNotFound), errors.Is(err, rollout.ErrNotFound),
		errors.Is(err, burnin.ErrNotFound), errors.Is(err, drill.ErrNotFound), errors.Is(err, store.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, baselines.ErrInvalid), errors.Is(err, sweep.ErrInvalidSpec), errors.Is(err, rollout.ErrInvalidSpec),
		errors.Is(err, burnin.ErrInvalidSpec), errors.Is(err, drill.ErrInvalidSpec), errors.Is(err, compat.ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, sweep.ErrAlreadyRunning), errors.Is(err, sweep.ErrExists), errors.Is(err, rollout.ErrState),
		errors.Is(err, rollout.ErrConflict), errors.Is(err, rollout.ErrNothingToDo), errors.Is(err, rollout.ErrNoMatrix),
		errors.Is(err, burnin.ErrBusy), errors.Is(err, burnin.ErrNoNodes), errors.Is(err, burnin.ErrFinished),
		errors.Is(err, drill.ErrRefused), errors.Is(err, drill.ErrFinished):
		code = codes.FailedPrecondition
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return status.Errorf(code, "%s: %v", op, err)
}

// audit records an operator's action before it is taken: an action that
// could not be recorded is not taken.
func (c *campaigns) audit(ctx context.Context, action, detail string) error {
	if err := c.s.Audit(ctx, "", action, detail); err != nil {
		return status.Errorf(codes.Unavailable, "%s: %v", action, err)
	}
	return nil
}

// auditStarted records a start once the campaign has its id; the campaign
// is running by then, so a failure is logged rather than returned.
func (c *campaigns) auditStarted(ctx context.Context, action, id string) {
	if err := c.s.Audit(ctx, "", action, id); err != nil {
		c.log.Error().Err(err).Str("campaign", id).Msg("audit")
	}
}

func (c *campaigns) needFleet() error {
	if c.fleet == nil {
		return status.Error(codes.Unavailable, errNoFleet.Error())
	}
	return nil
}

func jsonDoc(op string, v any) (*pb.Document, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s: encode: %v", op, err)
	}
	return &pb.Document{ContentType: "application/json", Body: b}, nil
}

func started(op, id string, v any) (*pb.CampaignStarted, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s: encode: %v", op, err)
	}
	return &pb.CampaignStarted{Id: id, Document: b}, nil
}

// ---------------------------------------------------------------- baselines

func keyFromPB(k *pb.BaselineKey) (baselines.Key, error) {
	if k == nil {
		return baselines.Key{}, fmt.Errorf("%w: no key", baselines.ErrInvalid)
	}
	sc, err := baselines.ParseScope(k.GetScope())
	if err != nil {
		return baselines.Key{}, err
	}
	key := baselines.Key{Metric: k.GetMetric(), Scope: sc,
		Stack: baselines.Stack{Driver: k.GetDriver(), NCCL: k.GetNccl(), RDMAStack: k.GetRdma()}}
	return key.Normalize()
}

func filterFromPB(q *pb.BaselineQuery) (baselines.Filter, error) {
	f := baselines.Filter{Metric: q.GetMetric(), Kind: baselines.ScopeKind(q.GetKind()), AllVersions: q.GetAllVersions()}
	if q.GetScope() != "" {
		sc, err := baselines.ParseScope(q.GetScope())
		if err != nil {
			return f, err
		}
		f.Scope = sc
	}
	return f, nil
}

// checkOf is the check that reports a metric: its first two dotted words
// (nccl.allreduce.busbw_gbps comes from nccl.allreduce).
func checkOf(metric string) string {
	parts := strings.SplitN(metric, ".", 3)
	if len(parts) < 3 {
		return metric
	}
	return parts[0] + "." + parts[1]
}

func (c *campaigns) BaselineShow(ctx context.Context, req *pb.BaselineQuery) (*pb.Document, error) {
	const op = "baseline show"
	f, err := filterFromPB(req)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	bs, err := c.bl.List(ctx, f)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if bs == nil {
		bs = []baselines.Baseline{}
	}
	return jsonDoc(op, bs)
}

func (c *campaigns) BaselineHistory(ctx context.Context, req *pb.BaselineKeyRequest) (*pb.Document, error) {
	const op = "baseline history"
	key, err := keyFromPB(req.GetKey())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	bs, err := c.bl.History(ctx, key)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, bs)
}

func (c *campaigns) BaselineSet(ctx context.Context, req *pb.BaselineSetRequest) (*pb.Document, error) {
	const op = "baseline set"
	key, err := keyFromPB(req.GetKey())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if req.GetValue() <= 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%s: value must be positive", op)
	}
	dir := baselines.Direction(req.GetDirection())
	if dir == "" {
		d, ok := baselines.DirectionFor(key.Metric)
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "%s: %s: its unit says no direction; give --direction higher|lower", op, key.Metric)
		}
		dir = d
	}
	if err := c.audit(ctx, "baseline.set", fmt.Sprintf("%s = %g", key, req.GetValue())); err != nil {
		return nil, err
	}
	b := baselines.Baseline{Key: key, Direction: dir, Value: req.GetValue(), Threshold: req.GetThreshold(),
		Who: ActorFrom(ctx), Note: req.GetNote()}
	if b.Samples, err = baselines.NewStats([]float64{req.GetValue()}); err != nil {
		return nil, campaignErr(op, err)
	}
	v, err := c.bl.Set(ctx, b)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	got, err := c.bl.History(ctx, key)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	for _, h := range got {
		if h.Version == v {
			return jsonDoc(op, h)
		}
	}
	return nil, status.Errorf(codes.Internal, "%s: version %d not stored", op, v)
}

func (c *campaigns) BaselineExport(ctx context.Context, req *pb.BaselineQuery) (*pb.Document, error) {
	const op = "baseline export"
	f, err := filterFromPB(req)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	var buf bytes.Buffer
	if err := c.bl.Export(ctx, &buf, f); err != nil {
		return nil, campaignErr(op, err)
	}
	return &pb.Document{ContentType: "application/yaml", Body: buf.Bytes()}, nil
}

func (c *campaigns) BaselineImport(ctx context.Context, req *pb.BaselineImportRequest) (*pb.Document, error) {
	const op = "baseline import"
	if err := c.audit(ctx, "baseline.import", fmt.Sprintf("%d bytes", len(req.GetFile()))); err != nil {
		return nil, err
	}
	res, err := c.bl.Import(ctx, bytes.NewReader(req.GetFile()), ActorFrom(ctx))
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, res)
}

// ---------------------------------------------------------------- sweeps

func (c *campaigns) SweepStart(ctx context.Context, req *pb.SpecRequest) (*pb.CampaignStarted, error) {
	const op = "sweep start"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	spec, err := parseSweepSpec(req.GetSpec())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if err := c.audit(ctx, "sweep.start", "selector "+spec.Selector); err != nil {
		return nil, err
	}
	rec, err := c.sweep.Start(ctx, spec)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	c.auditStarted(ctx, "sweep.started", rec.ID)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if _, err := c.sweep.Run(c.ctx, rec.ID); err != nil && !errors.Is(err, context.Canceled) {
			c.log.Error().Err(err).Str("campaign", rec.ID).Msg("sweep")
		}
	}()
	return started(op, rec.ID, rec)
}

func (c *campaigns) SweepStatus(ctx context.Context, req *pb.CampaignRef) (*pb.Document, error) {
	const op = "sweep status"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	if p, ok := c.sweep.Live(req.GetId()); ok {
		return jsonDoc(op, p)
	}
	p, err := c.sweep.Status(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, p)
}

func (c *campaigns) SweepList(ctx context.Context, _ *pb.CampaignListRequest) (*pb.Document, error) {
	const op = "sweep list"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	l, err := c.sweep.List(ctx)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if l == nil {
		l = []sweep.Summary{}
	}
	return jsonDoc(op, l)
}

func (c *campaigns) SweepReport(ctx context.Context, req *pb.CampaignRef) (*pb.Document, error) {
	const op = "sweep report"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	r, err := c.sweep.Report(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, r)
}

// ---------------------------------------------------------------- rollouts

// rolloutInputs parses a rollout request: the spec and the matrix sent
// with it, else the configured one.
func (c *campaigns) rolloutInputs(req *pb.SpecRequest) (*rollout.Spec, *compat.Matrix, error) {
	spec, err := rollout.ParseSpec(req.GetSpec())
	if err != nil {
		return nil, nil, err
	}
	var m *compat.Matrix
	switch {
	case len(req.GetMatrix()) > 0:
		m, err = compat.Parse(req.GetMatrix())
	case c.matrix != "":
		var b []byte
		if b, err = os.ReadFile(c.matrix); err == nil {
			m, err = compat.Parse(b)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("compatibility matrix: %w", err)
	}
	return spec, m, nil
}

func (c *campaigns) RolloutPlan(ctx context.Context, req *pb.SpecRequest) (*pb.Document, error) {
	const op = "rollout plan"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	spec, m, err := c.rolloutInputs(req)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	p, err := rollout.Plan(ctx, spec, c.fleet, m)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, p)
}

func (c *campaigns) RolloutStart(ctx context.Context, req *pb.SpecRequest) (*pb.CampaignStarted, error) {
	const op = "rollout start"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	spec, m, err := c.rolloutInputs(req)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if err := c.audit(ctx, "rollout.start", fmt.Sprintf("%s to driver %s on %q", spec.Name, spec.Target.Driver, spec.Selector)); err != nil {
		return nil, err
	}
	id, err := c.rollout.Start(ctx, spec, m)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	c.auditStarted(ctx, "rollout.started", id)
	st, err := c.rollout.Status(id)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return started(op, id, st)
}

func (c *campaigns) RolloutStatus(_ context.Context, req *pb.CampaignRef) (*pb.Document, error) {
	const op = "rollout status"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	st, err := c.rollout.Status(req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, st)
}

func (c *campaigns) RolloutList(_ context.Context, _ *pb.CampaignListRequest) (*pb.Document, error) {
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	l := c.rollout.List()
	if l == nil {
		l = []rollout.Summary{}
	}
	return jsonDoc("rollout list", l)
}

func (c *campaigns) RolloutControl(ctx context.Context, req *pb.RolloutControlRequest) (*pb.Document, error) {
	op := "rollout " + req.GetAction()
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	id := req.GetId()
	var act func() error
	switch req.GetAction() {
	case "pause":
		act = func() error { return c.rollout.Pause(ctx, id, req.GetReason()) }
	case "resume":
		act = func() error { return c.rollout.Resume(ctx, id) }
	case "abort":
		act = func() error { return c.rollout.Abort(ctx, id) }
	case "rollback":
		act = func() error { return c.rollout.Rollback(ctx, id) }
	case "approve":
		act = func() error { return c.rollout.Approve(ctx, id) }
	default:
		return nil, status.Errorf(codes.InvalidArgument, "rollout: action %q: must be pause, resume, abort, rollback or approve", req.GetAction())
	}
	if _, err := c.rollout.Status(id); err != nil {
		return nil, campaignErr(op, err)
	}
	detail := id
	if req.GetReason() != "" {
		detail += ": " + req.GetReason()
	}
	if err := c.audit(ctx, "rollout."+req.GetAction(), detail); err != nil {
		return nil, err
	}
	if err := act(); err != nil {
		return nil, campaignErr(op, err)
	}
	st, err := c.rollout.Status(id)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, st)
}

// ---------------------------------------------------------------- burn-ins

func (c *campaigns) BurninStart(ctx context.Context, req *pb.SpecRequest) (*pb.CampaignStarted, error) {
	const op = "burnin start"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	spec, err := burnin.ParseSpec(req.GetSpec())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if err := c.audit(ctx, "burnin.start", fmt.Sprintf("%s on %q", spec.Name, spec.Selector)); err != nil {
		return nil, err
	}
	id, err := c.burnin.Start(ctx, spec)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	c.auditStarted(ctx, "burnin.started", id)
	st, err := c.burnin.Status(ctx, id)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return started(op, id, st)
}

func (c *campaigns) BurninStatus(ctx context.Context, req *pb.CampaignRef) (*pb.Document, error) {
	const op = "burnin status"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	st, err := c.burnin.Status(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, st)
}

func (c *campaigns) BurninList(ctx context.Context, _ *pb.CampaignListRequest) (*pb.Document, error) {
	const op = "burnin list"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	l, err := c.burnin.List(ctx)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if l == nil {
		l = []burnin.CampaignStatus{}
	}
	return jsonDoc(op, l)
}

func (c *campaigns) BurninReport(ctx context.Context, req *pb.ReportRequest) (*pb.Document, error) {
	const op = "burnin report"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	r, err := c.burnin.Report(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	switch req.GetFormat() {
	case "", "json":
		return jsonDoc(op, r)
	case "html":
		var buf bytes.Buffer
		if err := c.burnin.WriteHTML(&buf, r); err != nil {
			return nil, campaignErr(op, err)
		}
		return &pb.Document{ContentType: "text/html", Body: buf.Bytes()}, nil
	}
	return nil, status.Errorf(codes.InvalidArgument, "%s: format %q: must be json or html", op, req.GetFormat())
}

func (c *campaigns) BurninCancel(ctx context.Context, req *pb.CampaignRef) (*pb.Document, error) {
	const op = "burnin cancel"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	if _, err := c.burnin.Status(ctx, req.GetId()); err != nil {
		return nil, campaignErr(op, err)
	}
	if err := c.audit(ctx, "burnin.cancel", req.GetId()+": "+req.GetReason()); err != nil {
		return nil, err
	}
	if err := c.burnin.Cancel(ctx, req.GetId(), req.GetReason()); err != nil {
		return nil, campaignErr(op, err)
	}
	st, err := c.burnin.Status(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, st)
}

// ---------------------------------------------------------------- drills

func (c *campaigns) DrillStart(ctx context.Context, req *pb.SpecRequest) (*pb.CampaignStarted, error) {
	const op = "drill start"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	spec, err := drill.ParseSpec(req.GetSpec())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if err := c.audit(ctx, "drill.start", spec.Name); err != nil {
		return nil, err
	}
	id, err := c.drill.Start(ctx, spec)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	c.auditStarted(ctx, "drill.started", id)
	d, err := c.drill.Get(ctx, id)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return started(op, id, d)
}

func (c *campaigns) DrillStatus(ctx context.Context, req *pb.CampaignRef) (*pb.Document, error) {
	const op = "drill status"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	d, err := c.drill.Get(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, d)
}

func (c *campaigns) DrillList(ctx context.Context, _ *pb.CampaignListRequest) (*pb.Document, error) {
	const op = "drill list"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	l, err := c.drill.List(ctx)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if l == nil {
		l = []drill.Drill{}
	}
	return jsonDoc(op, l)
}

func (c *campaigns) DrillReport(ctx context.Context, req *pb.DrillReportRequest) (*pb.Document, error) {
	const op = "drill report"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	o := drill.ReportOptions{Fault: req.GetFault()}
	for _, t := range []struct {
		s   string
		dst *time.Time
	}{{req.GetSince(), &o.Since}, {req.GetUntil(), &o.Until}} {
		if t.s == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, t.s)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: %v", op, err)
		}
		*t.dst = v
	}
	if req.GetBucket() != "" {
		d, err := time.ParseDuration(req.GetBucket())
		if err != nil || d <= 0 {
			return nil, status.Errorf(codes.InvalidArgument, "%s: bucket %q: a positive duration", op, req.GetBucket())
		}
		o.Bucket = d
	}
	r, err := c.drill.Report(ctx, o)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, r)
}

func (c *campaigns) DrillAbort(ctx context.Context, req *pb.CampaignRef) (*pb.Document, error) {
	const op = "drill abort"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	if _, err := c.drill.Get(ctx, req.GetId()); err != nil {
		return nil, campaignErr(op, err)
	}
	if err := c.audit(ctx, "drill.abort", req.GetId()+": "+req.GetReason()); err != nil {
		return nil, err
	}
	if err := c.drill.Abort(ctx, req.GetId(), req.GetReason()); err != nil {
		return nil, campaignErr(op, err)
	}
	d, err := c.drill.Get(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, d)
}

// conditions is the node condition writer; nil unless drains go through Kubernetes.
func (s *Server) conditions() *conditionWriter {
	if s.camp == nil {
		return nil
	}
	return s.camp.conds
}

// drainPolicy is the running drain policy; nil when it is off.
func (s *Server) drainPolicy() *drainPolicy {
	if s.camp == nil {
		return nil
	}
	return s.camp.policy
}

// campaignFleet is the fleet campaigns run on: Options.Fleet when the
// caller wired one in (a simulated fleet), else the agents' streams.
func (s *Server) campaignFleet() campaign.Fleet {
	if s.opts.Fleet != nil {
		return s.opts.Fleet
	}
	return s.Fleet()
}
