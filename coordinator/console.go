package coordinator

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/console"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/escalate"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// startConsole serves the web console when the config enables it; s.mu is
// held. It reads what the operator service reads, in process.
func (s *Server) startConsole() error {
	if !s.cfg.Console.Enabled {
		return nil
	}
	c, err := console.New(s.cfg.Console, console.Options{Logger: s.log, Source: consoleSource{s}, Insecure: s.cfg.Insecure,
		TrustDomain: s.cfg.TLS.TrustDomain, Certs: s.opts.Certs, Now: s.now, Version: s.opts.Version})
	if err != nil {
		return err
	}
	if err := c.Start(); err != nil {
		return err
	}
	s.console = c
	return nil
}

// ConsoleURL is where the web console serves; "" when it is off.
func (s *Server) ConsoleURL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.console == nil {
		return ""
	}
	return s.console.URL()
}

// ReloadConsole reads the console's token file again (SIGHUP).
func (s *Server) ReloadConsole() error {
	s.mu.Lock()
	c := s.console
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	return c.ReloadTokens()
}

// consoleSource is the coordinator as the console reads it.
type consoleSource struct{ s *Server }

// live merges the streams' view (connected, last heard) into a stored node,
// as ListNodes does.
func (c consoleSource) live(n *store.Node) {
	if e := c.s.reg.lookup(n.Name); e != nil {
		e.mu.Lock()
		if e.sess != nil {
			n.Connected = true
			if t := e.sess.lastRecv(); t.After(n.LastSeen) {
				n.LastSeen = t
			}
		}
		e.mu.Unlock()
	}
}

func (c consoleSource) Nodes(ctx context.Context) ([]store.Node, error) {
	nodes, err := c.s.store.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	for i := range nodes {
		c.live(&nodes[i])
	}
	return nodes, nil
}

func (c consoleSource) Node(ctx context.Context, name string) (store.Node, error) {
	n, err := c.s.store.Node(ctx, name)
	if err != nil {
		return n, err
	}
	c.live(&n)
	return n, nil
}

func (c consoleSource) Results(ctx context.Context, q store.ResultQuery) ([]store.StoredCheck, error) {
	return c.s.store.Results(ctx, q)
}

func (c consoleSource) Events(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	return c.s.store.Events(ctx, q)
}

func (c consoleSource) Baselines() baselines.Finder {
	if c.s.camp == nil || c.s.camp.bl == nil {
		return nil
	}
	return c.s.camp.bl
}

func (c consoleSource) Campaigns() console.Campaigns {
	if c.s.camp == nil || c.s.camp.fleet == nil {
		return nil
	}
	return consoleCampaigns{c.s.camp}
}

// consoleCampaigns reads the engines as the campaign service does, and
// acts through the service's own methods: the same checks and audit.
type consoleCampaigns struct{ c *campaigns }

func (k consoleCampaigns) Sweeps(ctx context.Context) ([]sweep.Summary, error) {
	return k.c.sweep().List(ctx)
}

func (k consoleCampaigns) Sweep(ctx context.Context, id string) (sweep.Progress, *sweep.Report, error) {
	p, ok := k.c.sweep().Live(id)
	if !ok {
		var err error
		if p, err = k.c.sweep().Status(ctx, id); err != nil {
			return p, nil, consoleNotFound(err)
		}
	}
	r, err := k.c.sweep().Report(ctx, id)
	if err != nil {
		return p, nil, nil //nolint:nilerr // a sweep not yet past its first test has no report: progress only
	}
	return p, r, nil
}

func (k consoleCampaigns) Rollouts(ctx context.Context) ([]rollout.Summary, error) {
	e, err := k.c.rolloutReads(ctx)
	if err != nil {
		return nil, err
	}
	return e.List(), nil
}

func (k consoleCampaigns) Rollout(ctx context.Context, id string) (*rollout.Status, error) {
	e, err := k.c.rolloutReads(ctx)
	if err != nil {
		return nil, err
	}
	st, err := e.Status(id)
	return st, consoleNotFound(err)
}

func (k consoleCampaigns) Burnins(ctx context.Context) ([]burnin.CampaignStatus, error) {
	return k.c.burnin().List(ctx)
}

func (k consoleCampaigns) Burnin(ctx context.Context, id string) (burnin.CampaignStatus, error) {
	st, err := k.c.burnin().Status(ctx, id)
	return st, consoleNotFound(err)
}

func (k consoleCampaigns) BurninHTML(ctx context.Context, id string) ([]byte, error) {
	r, err := k.c.burnin().Report(ctx, id)
	if err != nil {
		return nil, consoleNotFound(err)
	}
	var buf bytes.Buffer
	if err := k.c.burnin().WriteHTML(&buf, r); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (k consoleCampaigns) Drills(ctx context.Context) ([]drill.Drill, error) {
	return k.c.drill().List(ctx)
}

func (k consoleCampaigns) DrillRows(ctx context.Context) ([]drill.Row, error) {
	r, err := k.c.drill().Report(ctx, drill.ReportOptions{})
	if err != nil {
		return nil, err
	}
	return r.Rows, nil
}

func (k consoleCampaigns) Control(ctx context.Context, kind, id, action, reason string) error {
	var err error
	switch kind {
	case "rollout":
		_, err = k.c.RolloutControl(ctx, &pb.RolloutControlRequest{Id: id, Action: action, Reason: reason})
	case "burnin":
		if action != "abort" {
			return fmt.Errorf("%w: burnin %s", console.ErrUnknownAction, action)
		}
		_, err = k.c.BurninCancel(ctx, &pb.CampaignRef{Id: id, Reason: reason})
	case "drill":
		if action != "abort" {
			return fmt.Errorf("%w: drill %s", console.ErrUnknownAction, action)
		}
		_, err = k.c.DrillAbort(ctx, &pb.CampaignRef{Id: id, Reason: reason})
	default:
		return fmt.Errorf("%w: %s %s", console.ErrUnknownAction, kind, action)
	}
	return err
}

// consoleNotFound marks the engines' not-found errors as the store's, so
// the console answers 404.
func consoleNotFound(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sweep.ErrNotFound) || errors.Is(err, rollout.ErrNotFound) || errors.Is(err, burnin.ErrNotFound) ||
		errors.Is(err, drill.ErrNotFound) {
		return fmt.Errorf("%w: %w", store.ErrNotFound, err)
	}
	return err
}

func (c consoleSource) Remediations() console.Remediations {
	if c.s.camp == nil || c.s.camp.fleet == nil {
		return nil
	}
	return consoleRemediations{svc: &remediationService{c: c.s.camp}}
}

// consoleRemediations reads the ladder as RemediationService does, and
// approves and cancels through the service's own methods: the same
// checks and audit as `fleetcheck remediation approve|cancel`.
type consoleRemediations struct{ svc *remediationService }

func (k consoleRemediations) Mode() remediation.Mode { return k.svc.c.remed().Mode() }

func (k consoleRemediations) List(ctx context.Context, node string, state remediation.State) ([]remediation.Remediation, error) {
	return k.svc.c.remed().List(ctx, node, state)
}

func (k consoleRemediations) Get(ctx context.Context, id string) (remediation.Remediation, error) {
	x, err := k.svc.c.remed().Get(ctx, id)
	if errors.Is(err, remediation.ErrNotFound) {
		return x, fmt.Errorf("%w: %w", store.ErrNotFound, err)
	}
	return x, err
}

func (k consoleRemediations) JobEvents(ctx context.Context, limit int) ([]remediation.JobEvent, error) {
	return k.svc.c.remed().JobEvents(ctx, limit)
}

func (k consoleRemediations) Flagged(node string) []escalate.FlaggedPort {
	return k.svc.c.remed().Flagged(node)
}

func (k consoleRemediations) Approve(ctx context.Context, id string) error {
	_, err := k.svc.RemediationApprove(ctx, &pb.RemediationRef{Id: id})
	return consoleRPCErr(err)
}

func (k consoleRemediations) Cancel(ctx context.Context, id, reason string) error {
	_, err := k.svc.RemediationCancel(ctx, &pb.RemediationRef{Id: id, Reason: reason})
	return consoleRPCErr(err)
}

// consoleRPCErr marks a service method's NotFound as the store's, so the
// console answers 404 (any other refusal is its 409).
func consoleRPCErr(err error) error {
	if err != nil && status.Code(err) == codes.NotFound {
		return fmt.Errorf("%w: %s", store.ErrNotFound, status.Convert(err).Message())
	}
	return err
}

// ConsoleSource is what the console reads, in process: for a second
// console beside the configured one (the browser suite serves a
// read-only one from it).
func (s *Server) ConsoleSource() console.Source { return consoleSource{s} }
