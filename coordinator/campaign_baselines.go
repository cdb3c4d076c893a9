package coordinator

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/coordinator/campaignpb"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

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

func (c *campaigns) BaselineShow(ctx context.Context, req *pb.BaselineQuery) (*pb.BaselineListReply, error) {
	const op = "baseline show"
	f, err := filterFromPB(req)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	bs, err := c.bl.List(ctx, f)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return campaignpb.BaselineListPB(bs), nil
}

func (c *campaigns) BaselineHistory(ctx context.Context, req *pb.BaselineKeyRequest) (*pb.BaselineListReply, error) {
	const op = "baseline history"
	key, err := keyFromPB(req.GetKey())
	if err != nil {
		return nil, campaignErr(op, err)
	}
	bs, err := c.bl.History(ctx, key)
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return campaignpb.BaselineListPB(bs), nil
}

func (c *campaigns) BaselineSet(ctx context.Context, req *pb.BaselineSetRequest) (*pb.BaselineSetReply, error) {
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
			return &pb.BaselineSetReply{Baseline: campaignpb.BaselinePB(h)}, nil
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

func (c *campaigns) BaselineImport(ctx context.Context, req *pb.BaselineImportRequest) (*pb.BaselineImportReply, error) {
	const op = "baseline import"
	if err := c.audit(ctx, "baseline.import", fmt.Sprintf("%d bytes", len(req.GetFile()))); err != nil {
		return nil, err
	}
	res, err := c.bl.Import(ctx, bytes.NewReader(req.GetFile()), ActorFrom(ctx))
	if err != nil {
		return nil, campaignErr(op, err)
	}
	return campaignpb.BaselineImportPB(res), nil
}
