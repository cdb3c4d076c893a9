// Package wire converts between the domain's report types and the
// protobuf messages of the agent protocol. It is the one place where a
// report, its checks, findings and inventory meet their wire form, so the
// agent (which sends) and the coordinator (which receives and lists) cannot
// drift apart. Protobuf types stay at the gRPC edge: nothing below the
// agent's stream or the coordinator's services sees them.
package wire

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Meta is what a Result carries besides the report: who made it, for which
// work, when, and whether every passive check ran.
type Meta struct {
	ID       string
	Node     string
	WorkID   string // empty for the agent's own schedule
	Started  time.Time
	Finished time.Time
	Full     bool
	Trigger  string // TriggerSchedule, TriggerRequest, TriggerAfterAction; "" from an old agent
}

// What started a pass. A drill times detection by scheduled passes only: a
// real fault triggers no pass, so the one after an injection is no evidence.
const (
	TriggerSchedule    = "schedule"
	TriggerRequest     = "request"
	TriggerAfterAction = "after_action"
)

// UnixMS is t in milliseconds since the epoch; the zero time is 0, which
// the protocol reads as "unset".
func UnixMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// FromUnixMS is the inverse of UnixMS: 0 or less is the zero time, anything
// else a UTC time.
func FromUnixMS(v int64) time.Time {
	if v <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

// Form is how a check's metrics travel: as entries (any coordinator reads
// them) or as columns (to a coordinator whose Welcome says metric_columns),
// which cost a coordinator a few allocations per check instead of two per
// metric.
type Form int

const (
	Entries Form = iota
	Columns
)

// ResultToProto builds the wire Result for one inspection pass, its
// metrics in the given form. The inventory always travels: the coordinator
// records it with the result.
func ResultToProto(m Meta, r *report.Report, form Form) *pb.Result {
	return &pb.Result{
		Id:             m.ID,
		Node:           m.Node,
		WorkId:         m.WorkID,
		StartedUnixMs:  UnixMS(m.Started),
		FinishedUnixMs: UnixMS(m.Finished),
		Status:         string(r.Status),
		Checks:         ChecksToProto(r.Checks, form),
		Inventory:      InventoryToProto(&r.Inventory),
		Full:           m.Full,
		Trigger:        m.Trigger,
	}
}

// ResultFromProto reads a wire Result back into its meta and report. The
// report's node is the result's; an absent inventory is the zero one
// (callers that must tell "absent" apart look at p.GetInventory()).
func ResultFromProto(p *pb.Result) (Meta, report.Report) {
	m := Meta{
		ID:       p.GetId(),
		Node:     p.GetNode(),
		WorkID:   p.GetWorkId(),
		Started:  FromUnixMS(p.GetStartedUnixMs()),
		Finished: FromUnixMS(p.GetFinishedUnixMs()),
		Full:     p.GetFull(),
		Trigger:  p.GetTrigger(),
	}
	r := report.Report{
		Node:   p.GetNode(),
		Status: report.Status(p.GetStatus()),
		Checks: ChecksFromProto(p.GetChecks()),
	}
	if p.GetInventory() != nil {
		r.Inventory = InventoryFromProto(p.GetInventory())
	}
	return m, r
}

// ChecksToProto converts check results; nil stays nil.
func ChecksToProto(cs []report.CheckResult, form Form) []*pb.CheckResult {
	if cs == nil {
		return nil
	}
	out := make([]*pb.CheckResult, 0, len(cs))
	for i := range cs {
		if form == Columns {
			out = append(out, CheckToProtoColumns(cs[i]))
		} else {
			out = append(out, CheckToProto(cs[i]))
		}
	}
	return out
}

// ChecksFromProto converts check results; the slice is never nil.
func ChecksFromProto(cs []*pb.CheckResult) []report.CheckResult {
	out := make([]report.CheckResult, 0, len(cs))
	for _, c := range cs {
		out = append(out, CheckFromProto(c))
	}
	return out
}

// CheckToProto converts one check result, its metrics as entries (what
// every reader takes: the coordinator answers the CLI this way).
func CheckToProto(c report.CheckResult) *pb.CheckResult {
	out := checkToProto(c)
	out.Metrics = MetricsToProto(c.Metrics)
	return out
}

// CheckToProtoColumns converts one check result, its metrics as columns
// for a coordinator that reads them; a check with a name holding
// the separator ("\n", which no well-formed name does) sends entries.
func CheckToProtoColumns(c report.CheckResult) *pb.CheckResult {
	out := checkToProto(c)
	names := sortedNames(c.Metrics)
	var b strings.Builder
	n := 0
	for _, k := range names {
		n += len(k) + 1
	}
	b.Grow(n)
	for _, k := range names {
		if strings.IndexByte(k, metricSep) >= 0 {
			out.Metrics = MetricsToProto(c.Metrics)
			return out
		}
		b.WriteString(k)
		b.WriteByte(metricSep)
	}
	if len(names) > 0 {
		out.MetricNames = b.String()
		out.MetricValues = make([]float64, len(names))
		for i, k := range names {
			out.MetricValues[i] = c.Metrics[k]
		}
	}
	return out
}

// metricSep ends each name in CheckResult.metric_names.
const metricSep = '\n'

func checkToProto(c report.CheckResult) *pb.CheckResult {
	out := &pb.CheckResult{
		Name:       c.Name,
		Status:     string(c.Status),
		DurationMs: c.DurationMS,
		Reason:     c.Reason,
	}
	if len(c.Findings) > 0 {
		out.Findings = make([]*pb.Finding, 0, len(c.Findings))
		for _, f := range c.Findings {
			out.Findings = append(out.Findings, FindingToProto(f))
		}
	}
	return out
}

// MetricsToProto writes a metrics map as the message's entries, in name
// order (the same bytes for the same metrics; a coordinator's JSON of
// them then finds the names in the order it remembers). One allocation
// holds every entry.
func MetricsToProto(m map[string]float64) []*pb.Metric {
	if len(m) == 0 {
		return nil
	}
	names := sortedNames(m)
	entries := make([]pb.Metric, len(names))
	out := make([]*pb.Metric, len(names))
	for i, k := range names {
		entries[i].Key, entries[i].Value = k, m[k]
		out[i] = &entries[i]
	}
	return out
}

func sortedNames(m map[string]float64) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// MetricsFromProto reads the message's entries into a map (nil for none;
// a name sent twice keeps its last value, as a map field would).
func MetricsFromProto(ms []*pb.Metric) map[string]float64 {
	if len(ms) == 0 {
		return nil
	}
	out := make(map[string]float64, len(ms))
	for _, e := range ms {
		out[e.GetKey()] = e.GetValue()
	}
	return out
}

// CheckFromProto converts one check result. Findings are never nil (the
// report's JSON says [] for none); metrics are nil when there are none.
func CheckFromProto(c *pb.CheckResult) report.CheckResult {
	out := report.CheckResult{
		Name:       c.GetName(),
		Status:     report.Status(c.GetStatus()),
		DurationMS: c.GetDurationMs(),
		Reason:     c.GetReason(),
		Findings:   make([]report.Finding, 0, len(c.GetFindings())),
	}
	for _, f := range c.GetFindings() {
		out.Findings = append(out.Findings, FindingFromProto(f))
	}
	if c.GetMetricNames() != "" || len(c.GetMetricValues()) > 0 {
		out.Metrics = metricsFromColumns(c.GetMetricNames(), c.GetMetricValues())
	} else {
		out.Metrics = MetricsFromProto(c.GetMetrics())
	}
	return out
}

// metricsFromColumns reads the columns into a map whose keys share the
// names' one string (nil for none). Names beyond the values, or values
// beyond the names, are left out: CheckMetricsValid refuses such a
// result before a coordinator stores it.
func metricsFromColumns(names string, values []float64) map[string]float64 {
	if len(values) == 0 {
		return nil
	}
	out := make(map[string]float64, len(values))
	for _, v := range values {
		k, rest, found := strings.Cut(names, string(metricSep))
		if !found {
			break
		}
		out[k] = v
		names = rest
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// CheckMetricsValid says whether every check of a result carries its
// metrics in one well-formed form: as many names as values, each name
// ended by the separator, and not both entries and columns.
func CheckMetricsValid(p *pb.Result) error {
	for _, c := range p.GetChecks() {
		names, values := c.GetMetricNames(), c.GetMetricValues()
		if names == "" && len(values) == 0 {
			continue
		}
		if len(c.GetMetrics()) > 0 {
			return fmt.Errorf("check %q sends its metrics both as entries and as columns", clip(c.GetName()))
		}
		if names != "" && names[len(names)-1] != metricSep {
			return fmt.Errorf("check %q: metric_names does not end with a newline", clip(c.GetName()))
		}
		if n := strings.Count(names, string(metricSep)); n != len(values) {
			return fmt.Errorf("check %q sends %d metric names and %d values", clip(c.GetName()), n, len(values))
		}
	}
	return nil
}

// clip bounds a name quoted in an error.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// FindingToProto converts one finding.
func FindingToProto(f report.Finding) *pb.Finding {
	return &pb.Finding{
		Severity:  string(f.Severity),
		Component: f.Component,
		PciBusId:  f.PCIBusID,
		Code:      f.Code,
		Message:   f.Message,
		Action:    string(f.Action),
	}
}

// FindingFromProto converts one finding.
func FindingFromProto(f *pb.Finding) report.Finding {
	return report.Finding{
		Severity:  report.Severity(f.GetSeverity()),
		Component: f.GetComponent(),
		PCIBusID:  f.GetPciBusId(),
		Code:      f.GetCode(),
		Message:   f.GetMessage(),
		Action:    report.Action(f.GetAction()),
	}
}

// InventoryToProto converts an inventory; nil (not known yet, as in the
// hello of an agent that has not made a pass) stays nil.
func InventoryToProto(inv *report.Inventory) *pb.Inventory {
	if inv == nil {
		return nil
	}
	out := &pb.Inventory{
		DriverVersion:        inv.DriverVersion,
		CudaVersion:          inv.CUDAVersion,
		Kernel:               inv.Kernel,
		FabricManagerVersion: inv.FabricManagerVersion,
		RdmaStack:            inv.RDMAStack,
	}
	for _, g := range inv.GPUs {
		out.Gpus = append(out.Gpus, &pb.GPU{
			Index:          int32(g.Index),
			Name:           g.Name,
			Uuid:           g.UUID,
			PciBusId:       g.PCIBusID,
			Serial:         g.Serial,
			VbiosVersion:   g.VBIOSVersion,
			MemoryTotalMib: g.MemoryTotalMiB,
		})
	}
	for _, h := range inv.HCAs {
		ph := &pb.HCA{Name: h.Name, Model: h.Model, FwVersion: h.FWVersion}
		for _, p := range h.Ports {
			ph.Ports = append(ph.Ports, &pb.Port{
				Port:      int32(p.Port),
				State:     p.State,
				PhysState: p.PhysState,
				RateGbps:  p.RateGbps,
				LinkLayer: p.LinkLayer,
			})
		}
		out.Hcas = append(out.Hcas, ph)
	}
	return out
}

// InventoryFromProto converts an inventory. GPU, HCA and port lists are
// never nil, so the stored JSON says [] rather than null.
func InventoryFromProto(in *pb.Inventory) report.Inventory {
	out := report.Inventory{
		DriverVersion:        in.GetDriverVersion(),
		CUDAVersion:          in.GetCudaVersion(),
		Kernel:               in.GetKernel(),
		FabricManagerVersion: in.GetFabricManagerVersion(),
		RDMAStack:            in.GetRdmaStack(),
		GPUs:                 make([]report.GPU, 0, len(in.GetGpus())),
		HCAs:                 make([]report.HCA, 0, len(in.GetHcas())),
	}
	for _, g := range in.GetGpus() {
		out.GPUs = append(out.GPUs, report.GPU{
			Index:          int(g.GetIndex()),
			Name:           g.GetName(),
			UUID:           g.GetUuid(),
			PCIBusID:       g.GetPciBusId(),
			Serial:         g.GetSerial(),
			VBIOSVersion:   g.GetVbiosVersion(),
			MemoryTotalMiB: g.GetMemoryTotalMib(),
		})
	}
	for _, h := range in.GetHcas() {
		hca := report.HCA{Name: h.GetName(), Model: h.GetModel(), FWVersion: h.GetFwVersion(),
			Ports: make([]report.Port, 0, len(h.GetPorts()))}
		for _, p := range h.GetPorts() {
			hca.Ports = append(hca.Ports, report.Port{
				Port:      int(p.GetPort()),
				State:     p.GetState(),
				PhysState: p.GetPhysState(),
				RateGbps:  p.GetRateGbps(),
				LinkLayer: p.GetLinkLayer(),
			})
		}
		out.HCAs = append(out.HCAs, hca)
	}
	return out
}
