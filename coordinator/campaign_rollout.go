package coordinator

import (
	"context"
	"fmt"
	"os"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/coordinator/campaignpb"
	"github.com/fleetcheck/fleetcheck/internal/compat"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

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

func (c *campaigns) RolloutPlan(ctx context.Context, req *pb.SpecRequest) (*pb.RolloutPlanReply, error) {
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
	r, err := campaignpb.RolloutPlanPB(p)
	return r, encodeErr(op, err)
}

func (c *campaigns) RolloutStart(ctx context.Context, req *pb.SpecRequest) (*pb.CampaignStarted, error) {
	const op = "rollout start"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	if _, err := c.leader(ctx); err != nil {
		return nil, err
	}
	spec, m, err := c.rolloutInputs(req)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if err := c.audit(ctx, "rollout.start", fmt.Sprintf("%s to driver %s on %q", spec.Name, spec.Target.Driver, spec.Selector)); err != nil {
		return nil, err
	}
	id, err := c.rollout().Start(ctx, spec, m)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	c.auditStarted(ctx, "rollout.started", id)
	st, err := c.rollout().Status(id)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return started(op, id, st)
}

func (c *campaigns) RolloutStatus(ctx context.Context, req *pb.CampaignRef) (*pb.RolloutStatusReply, error) {
	const op = "rollout status"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	e, err := c.rolloutReads(ctx)
	if err != nil {
		return nil, err
	}
	st, err := e.Status(req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	r, err := campaignpb.RolloutStatusPB(st)
	return r, encodeErr(op, err)
}

func (c *campaigns) RolloutList(ctx context.Context, _ *pb.CampaignListRequest) (*pb.RolloutListReply, error) {
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	e, err := c.rolloutReads(ctx)
	if err != nil {
		return nil, err
	}
	return campaignpb.RolloutListPB(e.List()), nil
}

func (c *campaigns) RolloutControl(ctx context.Context, req *pb.RolloutControlRequest) (*pb.RolloutStatusReply, error) {
	op := "rollout " + req.GetAction()
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	if _, err := c.leader(ctx); err != nil {
		return nil, err
	}
	id := req.GetId()
	var act func() error
	switch req.GetAction() {
	case "pause":
		act = func() error { return c.rollout().Pause(ctx, id, req.GetReason()) }
	case "resume":
		act = func() error { return c.rollout().Resume(ctx, id) }
	case "abort":
		act = func() error { return c.rollout().Abort(ctx, id) }
	case "rollback":
		act = func() error { return c.rollout().Rollback(ctx, id) }
	case "approve":
		act = func() error { return c.rollout().Approve(ctx, id) }
	default:
		return nil, status.Errorf(codes.InvalidArgument, "rollout: action %q: must be pause, resume, abort, rollback or approve", req.GetAction())
	}
	if _, err := c.rollout().Status(id); err != nil {
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
	st, err := c.rollout().Status(id)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	r, err := campaignpb.RolloutStatusPB(st)
	return r, encodeErr(op, err)
}
