package coordinator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// remediationPoll is how often the engine's loop steps.
const remediationPoll = 10 * time.Second

// remedFeed hands the agents' scheduled results to the remediation
// engine off the ingest path: a full queue drops (and counts) a result
// rather than holding up an agent's stream.
type remedFeed struct {
	eng *remediation.Engine
	log zerolog.Logger
	ch  chan *store.Result
	wg  sync.WaitGroup

	mu      sync.Mutex
	dropped int
}

func newRemedFeed(ctx context.Context, eng *remediation.Engine, log zerolog.Logger) *remedFeed {
	f := &remedFeed{eng: eng, log: log, ch: make(chan *store.Result, 1024)}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case r := <-f.ch:
				if err := eng.Observe(ctx, r.Node, r.Checks, r.Finished, ""); err != nil && ctx.Err() == nil {
					log.Warn().Err(err).Str("node", r.Node).Msg("remediation: result not taken")
				}
			}
		}
	}()
	return f
}

// observe queues a result of the agent's own schedule (campaign runs,
// the ladder's own verifications among them, are left out).
func (f *remedFeed) observe(r *store.Result) {
	if f == nil || r.WorkID != "" {
		return
	}
	select {
	case f.ch <- r:
	default:
		f.mu.Lock()
		f.dropped++
		n := f.dropped
		f.mu.Unlock()
		if n == 1 || n%1000 == 0 {
			f.log.Warn().Int("dropped", n).Msg("remediation: queue full, results dropped")
		}
	}
}

func (f *remedFeed) wait() {
	if f != nil {
		f.wg.Wait()
	}
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

func (r *remediationService) engine() (*remediation.Engine, error) {
	if r.c == nil || r.c.remed == nil {
		return nil, status.Error(codes.Unavailable, "remediation is off: no fleet wired into this coordinator")
	}
	return r.c.remed, nil
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
	e, err := r.engine()
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
	e, err := r.engine()
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
