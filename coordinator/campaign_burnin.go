package coordinator

import (
	"bytes"
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/coordinator/campaignpb"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

func (c *campaigns) BurninStart(ctx context.Context, req *pb.SpecRequest) (*pb.CampaignStarted, error) {
	const op = "burnin start"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	if _, err := c.leader(ctx); err != nil {
		return nil, err
	}
	spec, err := burnin.ParseSpec(req.GetSpec())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	if err := c.audit(ctx, "burnin.start", fmt.Sprintf("%s on %q", spec.Name, spec.Selector)); err != nil {
		return nil, err
	}
	id, err := c.burnin().Start(ctx, spec)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	c.auditStarted(ctx, "burnin.started", id)
	st, err := c.burnin().Status(ctx, id)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return started(op, id, st)
}

func (c *campaigns) BurninStatus(ctx context.Context, req *pb.CampaignRef) (*pb.BurninStatusReply, error) {
	const op = "burnin status"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	st, err := c.burnin().Status(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return campaignpb.BurninStatusPB(st), nil
}

func (c *campaigns) BurninList(ctx context.Context, _ *pb.CampaignListRequest) (*pb.BurninListReply, error) {
	const op = "burnin list"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	l, err := c.burnin().List(ctx)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return campaignpb.BurninListPB(l), nil
}

func (c *campaigns) BurninReport(ctx context.Context, req *pb.ReportRequest) (*pb.Document, error) {
	const op = "burnin report"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	r, err := c.burnin().Report(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	switch req.GetFormat() {
	case "", "json":
		return jsonDoc(op, r)
	case "html":
		var buf bytes.Buffer
		if err := c.burnin().WriteHTML(&buf, r); err != nil {
			return nil, campaignErr(op, err)
		}
		return &pb.Document{ContentType: "text/html", Body: buf.Bytes()}, nil
	}
	return nil, status.Errorf(codes.InvalidArgument, "%s: format %q: must be json or html", op, req.GetFormat())
}

func (c *campaigns) BurninCancel(ctx context.Context, req *pb.CampaignRef) (*pb.BurninStatusReply, error) {
	const op = "burnin cancel"
	if err := c.needFleet(); err != nil {
		return nil, err
	}
	if _, err := c.leader(ctx); err != nil {
		return nil, err
	}
	if _, err := c.burnin().Status(ctx, req.GetId()); err != nil {
		return nil, campaignErr(op, err)
	}
	if err := c.audit(ctx, "burnin.cancel", req.GetId()+": "+req.GetReason()); err != nil {
		return nil, err
	}
	if err := c.burnin().Cancel(ctx, req.GetId(), req.GetReason()); err != nil {
		return nil, campaignErr(op, err)
	}
	st, err := c.burnin().Status(ctx, req.GetId())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return campaignpb.BurninStatusPB(st), nil
}
