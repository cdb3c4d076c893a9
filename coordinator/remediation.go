package coordinator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/escalate"
	"github.com/fleetcheck/fleetcheck/internal/report"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// remediationPoll is how often the engine's loop steps.
const remediationPoll = 10 * time.Second

// The leader's remediation feed reads the results every coordinator
// stores (check_results in stored order) and hands the agents' scheduled
// ones to the ladder.
const (
	remedFeedPoll  = 2 * time.Second
	remedFeedBatch = 2000
	// remedFeedGrace is how long a gap in the stored order is read again:
	// a batch another coordinator has not committed yet holds numbers
	// below rows already visible (an ingest batch commits in
	// milliseconds; this is far more).
	remedFeedGrace = 30 * time.Second
	// remedFeedGaps bounds the gaps kept; the oldest go first.
	remedFeedGaps = 256
	// remedCursor names the feed's place in the store.
	remedCursor = "results"
)

// remedFeedRead is what the feed reads of each stored check result: the
// findings, and only the metrics the escalation rules read (two counters
// of a result's ~350 numbers; reading them all back cost the leader about
// as much CPU as storing them).
var remedFeedRead = store.ChecksRead{MetricsOf: escalate.MetricChecks, KeepMetric: escalate.MetricWanted}

// remedFeedKept reads remedFeedRead's metrics from where ingest keeps
// them apart (store.Options.Feed): the rows' full metrics stay unread.
// Sparse: of the rows without findings, only those whose metrics the
// rules read come whole (the ladder takes nothing from the others).
var remedFeedKept = store.ChecksRead{Feed: true, Sparse: true}

// remedGap is a run of stored-order numbers not seen yet.
type remedGap struct {
	from, to int64
	since    time.Time // wall clock: commits are
}

// remedSink is what the feed hands results to and keeps its place in:
// the term's remediation engine.
type remedSink interface {
	Observe(ctx context.Context, node string, checks []report.CheckResult, at time.Time, job string) error
	RecallHorizon() time.Duration
	Recall(ctx context.Context, results []remediation.Observed) (int, error)
	Cursor(ctx context.Context, name string) (string, bool, error)
	SetCursor(ctx context.Context, name, value string) error
}

// remedFeed is one term's reader of the stored results for the ladder.
// Its place (the last number read) is kept in the store through the
// term's fenced handle, so the next leader goes on from there.
type remedFeed struct {
	st    *store.Store
	eng   remedSink
	log   zerolog.Logger
	last  int64
	saved int64
	gaps  []remedGap
}

// runRemedFeed reads the store for the ladder until ctx ends.
func (c *campaigns) runRemedFeed(ctx context.Context, eng *remediation.Engine) error {
	f := &remedFeed{st: c.s.store, eng: eng, log: c.log}
	if err := f.start(ctx); err != nil {
		return err
	}
	for {
		if err := f.poll(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn().Err(err).Msg("remediation feed")
		}
		// The wall clock, also under a simulated campaign clock: the feed
		// waits for the database, whose commits are in real time.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(remedFeedPoll):
		}
	}
}

// start takes the place the previous term left, or, on a new install,
// the end of what is stored (older results are not remediated).
func (f *remedFeed) start(ctx context.Context) error {
	v, ok, err := f.eng.Cursor(ctx, remedCursor)
	if err != nil {
		return err
	}
	if ok {
		if f.last, err = strconv.ParseInt(v, 10, 64); err != nil {
			return fmt.Errorf("remediation feed cursor %q: %w", v, err)
		}
		f.saved = f.last
		if err := f.recall(ctx); err != nil && ctx.Err() == nil {
			// The feed goes on: the windows start afresh, as before there
			// was a recall.
			f.log.Warn().Err(err).Msg("remediation feed")
		}
		return nil
	}
	if f.last, err = f.st.LastCheckSeq(ctx); err != nil {
		return err
	}
	f.saved = -1
	return f.save(ctx)
}

// recall hands the engine the scheduled results stored within the rules'
// horizon up to the kept place (what the previous terms observed), so a
// new leader's windows (Xid counts, ECC rises, flapping and flagged
// ports) are the old leader's.
// Without it a port flapping through a takeover, or Xids either side of
// it, never add up.
func (f *remedFeed) recall(ctx context.Context) error {
	began := time.Now()
	rows, err := f.st.RecentChecks(ctx, began.Add(-f.eng.RecallHorizon()), f.last, escalate.EventChecks, remedFeedKept)
	if err != nil {
		return fmt.Errorf("remediation feed: recall the rules' windows: %w", err)
	}
	results := scheduledResults(rows)
	n, err := f.eng.Recall(ctx, results)
	if err != nil {
		return fmt.Errorf("remediation feed: recall the rules' windows: %w", err)
	}
	f.log.Info().Int("results", len(results)).Int("events", n).Dur("took", time.Since(began)).
		Msg("remediation: the escalation rules' windows recalled from the stored results")
	return nil
}

func (f *remedFeed) save(ctx context.Context) error {
	if f.last == f.saved {
		return nil
	}
	if err := f.eng.SetCursor(ctx, remedCursor, strconv.FormatInt(f.last, 10)); err != nil {
		return err
	}
	f.saved = f.last
	return nil
}

// poll reads the gaps again, then what is new, and hands each result's
// scheduled checks to the engine.
func (f *remedFeed) poll(ctx context.Context) error {
	now := time.Now()
	var rows []store.SeqCheck
	keep := f.gaps[:0]
	for _, g := range f.gaps {
		if now.Sub(g.since) > remedFeedGrace {
			continue
		}
		got, err := f.st.ChecksAfter(ctx, g.from-1, g.to, remedFeedBatch, remedFeedKept)
		if err != nil {
			return err
		}
		rows = appendRead(rows, got)
		from := g.from
		for _, r := range got {
			if r.Seq > from {
				keep = append(keep, remedGap{from, r.Seq - 1, g.since})
			}
			from = r.Seq + 1
		}
		if from <= g.to {
			keep = append(keep, remedGap{from, g.to, g.since})
		}
	}
	f.gaps = keep
	for {
		got, err := f.st.ChecksAfter(ctx, f.last, 0, remedFeedBatch, remedFeedKept)
		if err != nil {
			return err
		}
		for _, r := range got {
			if r.Seq > f.last+1 {
				f.gaps = append(f.gaps, remedGap{f.last + 1, r.Seq - 1, now})
			}
			f.last = r.Seq
		}
		rows = appendRead(rows, got)
		if len(got) < remedFeedBatch || ctx.Err() != nil {
			break
		}
	}
	if n := len(f.gaps) - remedFeedGaps; n > 0 {
		f.gaps = append(f.gaps[:0], f.gaps[n:]...)
	}
	f.observe(ctx, rows)
	return f.save(ctx)
}

// appendRead appends the rows of got read whole: a skipped row counts
// for the feed's place and gaps only.
func appendRead(rows, got []store.SeqCheck) []store.SeqCheck {
	for _, r := range got {
		if !r.Skipped {
			rows = append(rows, r)
		}
	}
	return rows
}

// observe hands the scheduled results among rows to the engine.
func (f *remedFeed) observe(ctx context.Context, rows []store.SeqCheck) {
	for _, x := range scheduledResults(rows) {
		if err := f.eng.Observe(ctx, x.Node, x.Checks, x.At, ""); err != nil && ctx.Err() == nil {
			f.log.Warn().Err(err).Str("node", x.Node).Str("result_id", x.ID).Msg("remediation: result not taken")
		}
	}
}

// scheduledResults groups rows by result, in the order of each result's
// first row, leaving out campaign runs (the ladder's own verifications
// among them): what the ladder takes is the agents' scheduled passes.
func scheduledResults(rows []store.SeqCheck) []remediation.Observed {
	var out []remediation.Observed
	by := map[string]int{}
	for _, r := range rows {
		if r.WorkID != "" || r.Skipped {
			continue
		}
		i, ok := by[r.ResultID]
		if !ok {
			i = len(out)
			by[r.ResultID] = i
			out = append(out, remediation.Observed{ID: r.ResultID, Node: r.Node, At: r.Finished})
		}
		out[i].Checks = append(out[i].Checks, r.Check)
	}
	return out
}

// remedHolding is what the campaigns hold: a node in a running rollout,
// burn-in or drill (or drained by one) is left alone by the health path.
type remedHolding struct {
	c    *campaigns
	busy *kit.Busy // the nodes running campaigns hold
}

func (h remedHolding) Holding(ctx context.Context, node string) (string, bool) {
	if who, held := h.busy.Holding(ctx, node); held {
		return "held by " + who, true
	}
	n := h.c.s.reg.lookup(node)
	if n == nil {
		return "", false
	}
	n.mu.Lock()
	state, reason := n.state, n.reason
	n.mu.Unlock()
	if campaignOwned(state) {
		return "held by a campaign or the drain policy: " + reason, true
	}
	return "", false
}

// remedBaselines gives the ladder's verification the node's stored
// single-node all_reduce baseline from the baselines store: the node's
// own, else its SKU's (baselines.Resolve, as the sweep judges).
type remedBaselines struct{ c *campaigns }

func (b remedBaselines) AllReduce(ctx context.Context, node string) (float64, bool, error) {
	n, known, err := kit.LookupNode(ctx, b.c.fleet, node)
	if err != nil {
		return 0, false, err
	}
	sku, stack := "", baselines.Stack{}
	if known {
		sku = baselines.SKUFromInventory(n.Inventory, n.Labels)
		stack = baselines.Stack{Driver: n.Inventory.DriverVersion, RDMAStack: n.Inventory.RDMAStack}.Normalize()
	}
	res, err := baselines.Resolve(ctx, b.c.bl, baselines.MetricAllReduceBusBW, node, sku, stack)
	if err != nil || res.Baseline == nil {
		return 0, false, err
	}
	return res.Baseline.Value, true, nil
}

// remedHistory gives an RMA the burn-in campaigns that tested the node,
// from the burn-in store.
type remedHistory struct{ c *campaigns }

func (h remedHistory) BurnIns(ctx context.Context, node string) ([]remediation.BurnInRecord, error) {
	runs, err := h.c.burnin().NodeHistory(ctx, node)
	if err != nil {
		return nil, err
	}
	out := make([]remediation.BurnInRecord, 0, len(runs))
	for _, r := range runs {
		v := string(r.Verdict)
		if v == "" {
			v = string(r.State)
		}
		detail := fmt.Sprintf("%s (%s)", r.Name, r.Level)
		if r.Reason != "" {
			detail += ": " + r.Reason
		}
		out = append(out, remediation.BurnInRecord{ID: r.Campaign, Verdict: v, At: r.At, Detail: detail})
	}
	return out, nil
}

// remediationService serves RemediationService.
type remediationService struct {
	pb.UnimplementedRemediationServiceServer
	c *campaigns
}

// engine is the engine reads go to: every coordinator's reads the store.
func (r *remediationService) engine() (*remediation.Engine, error) {
	if r.c == nil || r.c.fleet == nil {
		return nil, status.Error(codes.Unavailable, "remediation is off: no fleet wired into this coordinator")
	}
	return r.c.remed(), nil
}

// leading is the engine of the leader's term, for approve and cancel: a
// follower refuses them with the leader's address, as other campaign
// changes.
func (r *remediationService) leading(ctx context.Context) (*remediation.Engine, error) {
	if _, err := r.engine(); err != nil {
		return nil, err
	}
	t, err := r.c.leader(ctx)
	if err != nil {
		return nil, err
	}
	return t.e.remed, nil
}

func remedErr(op string, err error) error {
	switch {
	case errors.Is(err, remediation.ErrNotFound):
		return status.Errorf(codes.NotFound, "%s: %v", op, err)
	case errors.Is(err, remediation.ErrState):
		return status.Errorf(codes.FailedPrecondition, "%s: %v", op, err)
	}
	return campaignErr(op, err)
}

func remedDoc(op string, v any) (*pb.RemediationDocument, error) {
	d, err := jsonDoc(op, v)
	if err != nil {
		return nil, err
	}
	return &pb.RemediationDocument{ContentType: d.ContentType, Body: d.Body}, nil
}

func (r *remediationService) RemediationList(ctx context.Context, req *pb.RemediationListRequest) (*pb.RemediationDocument, error) {
	const op = "remediation list"
	e, err := r.engine()
	if err != nil {
		return nil, err
	}
	l, err := e.List(ctx, req.GetNode(), remediation.State(req.GetState()))
	if err != nil {
		return nil, remedErr(op, err)
	}
	if l == nil {
		l = []remediation.Remediation{}
	}
	jobs, err := e.JobEvents(ctx, 20)
	if err != nil {
		return nil, remedErr(op, err)
	}
	return remedDoc(op, struct {
		Mode         remediation.Mode          `json:"mode"`
		Remediations []remediation.Remediation `json:"remediations"`
		JobEvents    []remediation.JobEvent    `json:"job_events"`
		Flagged      any                       `json:"flagged_ports"`
	}{e.Mode(), l, jobs, e.Flagged(req.GetNode())})
}

func (r *remediationService) RemediationShow(ctx context.Context, req *pb.RemediationRef) (*pb.RemediationDocument, error) {
	const op = "remediation show"
	e, err := r.engine()
	if err != nil {
		return nil, err
	}
	x, err := e.Get(ctx, req.GetId())
	if err != nil {
		return nil, remedErr(op, err)
	}
	return remedDoc(op, x)
}

// who names the operator for the remediation's history.
func who(ctx context.Context) string {
	if id, ok := authz.IdentityFrom(ctx); ok && id.Name != "" {
		return id.Name
	}
	return "operator"
}

func (r *remediationService) RemediationApprove(ctx context.Context, req *pb.RemediationRef) (*pb.RemediationDocument, error) {
	const op = "remediation approve"
	e, err := r.leading(ctx)
	if err != nil {
		return nil, err
	}
	if err := r.c.audit(ctx, "remediation.approve", req.GetId()); err != nil {
		return nil, err
	}
	x, err := e.Approve(ctx, req.GetId(), who(ctx))
	if err != nil {
		return nil, remedErr(op, err)
	}
	return remedDoc(op, x)
}

func (r *remediationService) RemediationCancel(ctx context.Context, req *pb.RemediationRef) (*pb.RemediationDocument, error) {
	const op = "remediation cancel"
	e, err := r.leading(ctx)
	if err != nil {
		return nil, err
	}
	if err := r.c.audit(ctx, "remediation.cancel", req.GetId()+": "+req.GetReason()); err != nil {
		return nil, err
	}
	x, err := e.Cancel(ctx, req.GetId(), who(ctx), req.GetReason())
	if err != nil {
		return nil, remedErr(op, err)
	}
	return remedDoc(op, x)
}
