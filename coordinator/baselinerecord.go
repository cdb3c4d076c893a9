package coordinator

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/coordinator/campaignpb"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/report"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// maxRecordSamples is how many recent results of a node a selector-based
// record takes: enough for a median, few enough to be this week's.
const maxRecordSamples = 5

// maxRunLookback is how far back among a node's results of the check a
// --from RESULT_ID record looks for that result.
const maxRunLookback = 1000

// sample is one stored value of a metric.
type sample struct {
	value    float64
	resultID string
	finished time.Time
}

// recentSamples is the metric's values in a node's latest stored results
// of its check, newest first; with run set, that result's value only.
// checked counts the results of the check looked at, with or without
// the metric.
func (c *campaigns) recentSamples(ctx context.Context, node, metric, run string, limit int) (out []sample, checked int, err error) {
	rows, err := c.s.Store().Results(ctx, store.ResultQuery{Node: node, Check: checkOf(metric), Limit: limit})
	if err != nil {
		return nil, 0, err
	}
	for _, r := range rows {
		if run != "" && r.ResultID != run {
			continue
		}
		checked++
		if v, ok := r.Check.Metrics[metric]; ok {
			out = append(out, sample{value: v, resultID: r.ResultID, finished: r.Finished})
		}
	}
	return out, checked, nil
}

// inventoryAt is the node's inventory when a result finished: the newest
// history row not after it, else the node's current inventory. since is
// when that inventory became the node's (zero when unknown).
func (c *campaigns) inventoryAt(ctx context.Context, node string, at time.Time) (inv report.Inventory, since time.Time, err error) {
	hist, err := c.s.Store().InventoryHistory(ctx, node)
	if err != nil {
		return report.Inventory{}, time.Time{}, err
	}
	for i := len(hist) - 1; i >= 0; i-- {
		if !hist[i].Time.After(at) {
			return hist[i].Inventory, hist[i].Time, nil
		}
	}
	n, err := c.s.Store().Node(ctx, node)
	if err != nil {
		return report.Inventory{}, time.Time{}, err
	}
	return n.Inventory, time.Time{}, nil
}

// noSamples says why a node gave no sample of metric.
func noSamples(metric string, checked int) string {
	if checked == 0 {
		return fmt.Sprintf("no stored %s result", checkOf(metric))
	}
	return fmt.Sprintf("its %d newest %s results hold no %s", checked, checkOf(metric), metric)
}

// BaselineRecord records baselines from a stored result (scope: its
// node's unless given), from each selected node's recent results (one
// node-scoped baseline per node; nodes without the metric are listed as
// skipped, with why), or from samples. The stack is what the flags give,
// and for stored results what the node's inventory reported when they
// were taken fills the rest (driver, RDMA stack).
func (c *campaigns) BaselineRecord(ctx context.Context, req *pb.BaselineRecordRequest) (*pb.BaselineRecordReply, error) {
	const op = "baseline record"
	type job struct {
		key     baselines.Key
		samples []float64
		from    string
	}
	var jobs []job
	rep := baselines.RecordReport{Recorded: []baselines.Baseline{}, Skipped: []baselines.Skipped{}}
	given := baselines.Stack{Driver: req.GetKey().GetDriver(), NCCL: req.GetKey().GetNccl(), RDMAStack: req.GetKey().GetRdma()}
	metric := req.GetKey().GetMetric()
	switch {
	case req.GetSelector() != "":
		// The key's scope is replaced by each node's.
		if err := c.needFleet(); err != nil {
			return nil, err
		}
		if err := baselines.ValidMetric(metric); err != nil {
			return nil, campaignErr(op, fmt.Errorf("%w: %w", baselines.ErrInvalid, err))
		}
		nodes, err := c.fleet.Nodes(ctx, req.GetSelector())
		if err != nil {
			return nil, campaignErr(op, err)
		}
		for _, n := range nodes {
			s, checked, err := c.recentSamples(ctx, n.Name, metric, "", maxRecordSamples)
			if err != nil {
				return nil, campaignErr(op, err)
			}
			if len(s) == 0 {
				rep.Skipped = append(rep.Skipped, baselines.Skipped{Node: n.Name, Reason: noSamples(metric, checked)})
				continue
			}
			// One stack per baseline: the one the newest sample ran
			// under, and only the samples taken under it.
			inv, since, err := c.inventoryAt(ctx, n.Name, s[0].finished)
			if err != nil {
				return nil, campaignErr(op, err)
			}
			var vals []float64
			for _, x := range s {
				if !x.finished.Before(since) {
					vals = append(vals, x.value)
				}
			}
			k, err := baselines.Key{Metric: metric, Scope: baselines.NodeScope(n.Name),
				Stack: given.Or(baselines.StackFromInventory(inv))}.Normalize()
			if err != nil {
				return nil, campaignErr(op, err)
			}
			jobs = append(jobs, job{key: k, samples: vals, from: "selector " + req.GetSelector()})
		}
		if len(jobs) == 0 {
			return nil, status.Errorf(codes.NotFound, "%s: no node %q selects has a stored %s: %s", op, req.GetSelector(), metric, skippedText(rep.Skipped))
		}
	case req.GetFromRun() != "" && len(req.GetSamples()) == 0:
		res, err := c.s.Store().Result(ctx, req.GetFromRun())
		if err != nil {
			return nil, campaignErr(op, fmt.Errorf("result %s: %w", req.GetFromRun(), err))
		}
		s, checked, err := c.recentSamples(ctx, res.Node, metric, res.ID, maxRunLookback)
		if err != nil {
			return nil, campaignErr(op, err)
		}
		if len(s) == 0 {
			why := fmt.Sprintf("its %s check holds no %s", checkOf(metric), metric)
			if checked == 0 {
				why = fmt.Sprintf("it holds no %s check, or it is not among node %s's newest %d", checkOf(metric), res.Node, maxRunLookback)
			}
			return nil, status.Errorf(codes.NotFound, "%s: result %s: %s", op, res.ID, why)
		}
		scope := req.GetKey().GetScope()
		if scope == "" {
			scope = string(baselines.NodeScope(res.Node)) // the result's node's
		}
		inv, _, err := c.inventoryAt(ctx, res.Node, res.Finished)
		if err != nil {
			return nil, campaignErr(op, err)
		}
		key, err := keyFromPB(&pb.BaselineKey{Metric: metric, Scope: scope})
		if err != nil {
			return nil, campaignErr(op, err)
		}
		key.Stack = given.Or(baselines.StackFromInventory(inv))
		if key, err = key.Normalize(); err != nil {
			return nil, campaignErr(op, err)
		}
		jobs = append(jobs, job{key: key, samples: []float64{s[0].value}, from: res.ID})
	default:
		if len(req.GetSamples()) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "%s: give samples, a result id or a selector", op)
		}
		key, err := keyFromPB(req.GetKey())
		if err != nil {
			return nil, campaignErr(op, err)
		}
		jobs = append(jobs, job{key: key, samples: req.GetSamples(), from: req.GetFromRun()})
	}
	detail := fmt.Sprintf("%d baselines of %s", len(jobs), jobs[0].key.Metric)
	if len(rep.Skipped) > 0 {
		detail += fmt.Sprintf("; %d nodes skipped", len(rep.Skipped))
	}
	if err := c.audit(ctx, "baseline.record", detail); err != nil {
		return nil, err
	}
	who := ActorFrom(ctx)
	for _, j := range jobs {
		b, err := c.bl.Record(ctx, j.key, j.samples, who, j.from, req.GetNote())
		if err != nil {
			return nil, campaignErr(op, err)
		}
		rep.Recorded = append(rep.Recorded, b)
	}
	return campaignpb.BaselineRecordPB(rep), nil
}

// skippedText lists skipped nodes for an error, at most ten.
func skippedText(sk []baselines.Skipped) string {
	if len(sk) == 0 {
		return "it selects no node"
	}
	var parts []string
	for i, s := range sk {
		if i == 10 {
			parts = append(parts, fmt.Sprintf("and %d more", len(sk)-10))
			break
		}
		parts = append(parts, s.Node+": "+s.Reason)
	}
	return strings.Join(parts, "; ")
}
