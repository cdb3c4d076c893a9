// Package checks defines the Check contract and runs checks over a snapshot.
// Checks are pure: they read a snapshot, the node's configuration and the
// state of the previous run, and return findings and metrics. They never
// touch the host, so every check is testable on fixtures.
package checks

import (
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/config"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// Check is one named health check.
type Check interface {
	// Name is the check's fixed name (gpu.ecc, ib.ports ...).
	Name() string
	// Needs lists the sources the check cannot judge without: when one is
	// absent the check is skipped, when one failed or timed out it errors.
	// A check that handles missing sources itself returns nil.
	Needs() []snapshot.Source
	// Disruptive reports whether the check takes the node's GPUs or network
	// for itself (and so runs only when asked for).
	Disruptive() bool
	// Run judges the snapshot.
	Run(in Input) Result
}

// Input is everything a check may read.
type Input struct {
	Snap   *snapshot.Snapshot
	Config *config.Config
	// Prev is the state the previous run left, nil on the first run.
	Prev *State
	Now  time.Time
	// Labels are the labels the node declares (an agent's labels: sku,
	// rack, ...); nil for run/analyze. gpu.inventory reads GPU
	// expectations from them.
	Labels map[string]string
}

// Result is what a check returns; the runner turns it into a report.CheckResult.
type Result struct {
	Status   report.Status
	Reason   string
	Findings []report.Finding
	Metrics  map[string]float64
}

// Add appends a finding and raises the status to match its severity.
func (r *Result) Add(f report.Finding) {
	r.Findings = append(r.Findings, f)
	switch f.Severity {
	case report.SevFail:
		r.Status = report.Worse(r.Status, report.Fail)
	case report.SevWarn:
		r.Status = report.Worse(r.Status, report.Warn)
	}
}

// Metric records a metric value.
func (r *Result) Metric(name string, v float64) {
	if r.Metrics == nil {
		r.Metrics = make(map[string]float64)
	}
	r.Metrics[name] = v
}

// Skipf returns a skip result with a reason.
func Skipf(format string, a ...any) Result {
	return Result{Status: report.Skip, Reason: fmt.Sprintf(format, a...)}
}

// Errorf returns an error result with a reason: the check could not decide.
func Errorf(format string, a ...any) Result {
	return Result{Status: report.Error, Reason: fmt.Sprintf(format, a...)}
}

// GPUComponent names a GPU in findings.
func GPUComponent(index int) string { return fmt.Sprintf("GPU%d", index) }

// PortComponent names an HCA port in findings ("mlx5_4/1").
func PortComponent(hca string, port int) string { return fmt.Sprintf("%s/%d", hca, port) }

// NodeComponent names the node itself.
const NodeComponent = "node"
