package coordinator

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/coordinator/campaignpb"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

func (c *campaigns) DrillStart(ctx context.Context, req *pb.SpecRequest) (*pb.CampaignStarted, error) {
	const op = "drill start"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	if _, err := c.leader(ctx); err != nil {
		return nil, err
	}
	spec, err := drill.ParseSpec(req.GetSpec())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if err := c.audit(ctx, "drill.start", spec.Name); err != nil {
		return nil, err
	}
	id, err := c.drill().Start(ctx, spec)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	c.auditStarted(ctx, "drill.started", id)
	d, err := c.drill().Get(ctx, id)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return started(op, id, d)
}

func (c *campaigns) DrillStatus(ctx context.Context, req *pb.CampaignRef) (*pb.DrillStatusReply, error) {
	const op = "drill status"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	d, err := c.drill().Get(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	r, err := campaignpb.DrillStatusPB(d)
	return r, encodeErr(op, err)
}

func (c *campaigns) DrillList(ctx context.Context, _ *pb.CampaignListRequest) (*pb.DrillListReply, error) {
	const op = "drill list"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	l, err := c.drill().List(ctx)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	r, err := campaignpb.DrillListPB(l)
	return r, encodeErr(op, err)
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
	r, err := c.drill().Report(ctx, o)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return jsonDoc(op, r)
}

func (c *campaigns) DrillAbort(ctx context.Context, req *pb.CampaignRef) (*pb.DrillStatusReply, error) {
	const op = "drill abort"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	if _, err := c.leader(ctx); err != nil {
		return nil, err
	}
	if _, err := c.drill().Get(ctx, req.GetId()); err != nil {
		return nil, campaignErr(op, err)
	}
	if err := c.audit(ctx, "drill.abort", req.GetId()+": "+req.GetReason()); err != nil {
		return nil, err
	}
	if err := c.drill().Abort(ctx, req.GetId(), req.GetReason()); err != nil {
		return nil, campaignErr(op, err)
	}
	d, err := c.drill().Get(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	r, err := campaignpb.DrillStatusPB(d)
	return r, encodeErr(op, err)
}
