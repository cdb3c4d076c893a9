package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetcheck/fleetcheck/internal/drain"
	"github.com/fleetcheck/fleetcheck/internal/drain/slurm"
	"github.com/fleetcheck/fleetcheck/internal/report"
)

// slurmFlags make `run` (and `analyze`) Slurm's HealthCheckProgram, as NHC
// is: the node drains itself with the first failure as the reason and
// resumes only its own drain (docs/deploy.md "Slurm").
type slurmFlags struct {
	enabled  bool
	node     string
	deadline time.Duration
}

// Bounds of --deadline: slurmd waits for its HealthCheckProgram, so the run
// must end; under 5 s the checks and two Slurm calls cannot fit.
const (
	minSlurmDeadline     = 5 * time.Second
	maxSlurmDeadline     = 30 * time.Minute
	defaultSlurmDeadline = 60 * time.Second
	// watchdogSlack is how long past the deadline the process may live
	// (a check that ignores its context) before it exits anyway.
	watchdogSlack = 10 * time.Second
)

// defaultPath is the PATH used when there is none: slurmd runs its
// HealthCheckProgram with SLURMD_NODENAME as the whole environment.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func (s *slurmFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&s.enabled, "slurm", false, "act as Slurm's HealthCheckProgram: drain this node with the first failure as the reason, resume only fleetcheck's own drain")
	cmd.Flags().StringVar(&s.node, "slurm-node", "", "the node's Slurm NodeName (default $SLURMD_NODENAME, then the short hostname)")
	cmd.Flags().DurationVar(&s.deadline, "deadline", defaultSlurmDeadline, "with --slurm: the whole run, checks and Slurm calls, ends within this (5s..30m)")
}

func (s *slurmFlags) validate() error {
	if !s.enabled {
		if s.node != "" {
			return fmt.Errorf("--slurm-node needs --slurm")
		}
		return nil
	}
	if s.deadline < minSlurmDeadline || s.deadline > maxSlurmDeadline {
		return fmt.Errorf("--deadline must be between %s and %s, not %s", minSlurmDeadline, maxSlurmDeadline, s.deadline)
	}
	if s.node == "" {
		s.node = os.Getenv("SLURMD_NODENAME")
	}
	if s.node == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--slurm: no --slurm-node, no SLURMD_NODENAME and no hostname: %w", err)
		}
		s.node, _, _ = strings.Cut(h, ".")
	}
	if err := drain.CheckNode(s.node); err != nil {
		return fmt.Errorf("--slurm: %w", err)
	}
	if os.Getenv("PATH") == "" {
		if err := os.Setenv("PATH", defaultPath); err != nil {
			return fmt.Errorf("--slurm: set PATH: %w", err)
		}
	}
	return nil
}

// callTimeout bounds each Slurm command: two of them (sinfo, scontrol)
// follow the checks within the deadline.
func (s *slurmFlags) callTimeout() time.Duration { return s.deadline / 6 }

// checksBudget is the part of the deadline the checks get.
func (s *slurmFlags) checksBudget() time.Duration { return s.deadline - 2*s.callTimeout() }

// start bounds the run: ctx ends when the checks' share of the deadline is
// spent, and a watchdog exits the process past the deadline whatever still
// runs, so slurmd is never left waiting. stop ends both.
func (s *slurmFlags) start(ctx context.Context, stderr io.Writer) (checksCtx context.Context, stop func()) {
	checksCtx, cancel := context.WithTimeout(ctx, s.checksBudget())
	dog := time.AfterFunc(s.deadline+watchdogSlack, func() {
		// Said on stderr for slurmd's log; the exit status says it too.
		_, _ = fmt.Fprintf(stderr, "%s: --slurm: still running %s past the %s deadline; exiting\n", programName, watchdogSlack, s.deadline)
		os.Exit(exitCommand)
	})
	return checksCtx, func() { cancel(); dog.Stop() }
}

// apply drains or resumes the node after the report and says what it did
// on stderr (slurmd logs it).
func (s *slurmFlags) apply(ctx context.Context, stderr io.Writer, r *report.Report) error {
	a := slurm.New(slurm.Options{Timeout: s.callTimeout()})
	failure := firstFailure(r)
	out, reason, err := a.HealthCheck(ctx, s.node, failure)
	if err != nil {
		return fmt.Errorf("--slurm: %w", err)
	}
	// A note for slurmd's log: the node's state is what was done, and a
	// lost note on stderr is not a reason to fail the prolog.
	switch out {
	case slurm.Drained, slurm.StillDrained, slurm.Resumed, slurm.NotOurs:
		_, _ = fmt.Fprintf(stderr, "%s: slurm node %s: %s (reason %q)\n", programName, s.node, out, reason)
	default:
		_, _ = fmt.Fprintf(stderr, "%s: slurm node %s: %s\n", programName, s.node, out)
	}
	return nil
}

// firstFailure is the drain reason for a failed report: the first failed
// (or, failing none, errored) check in report order with its first
// finding, "" when nothing failed.
func firstFailure(r *report.Report) string {
	var errored string
	for _, c := range r.Checks {
		switch c.Status {
		case report.Fail:
			for _, f := range c.Findings {
				if f.Severity == report.SevFail {
					return fmt.Sprintf("%s: %s %s: %s", c.Name, f.Component, f.Code, f.Message)
				}
			}
			if len(c.Findings) > 0 {
				f := c.Findings[0]
				return fmt.Sprintf("%s: %s %s: %s", c.Name, f.Component, f.Code, f.Message)
			}
			return c.Name + ": failed"
		case report.Error:
			if errored == "" {
				errored = fmt.Sprintf("%s: could not decide: %s", c.Name, c.Reason)
			}
		}
	}
	return errored
}
