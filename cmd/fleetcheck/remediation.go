//go:build !node

package main

import (
	"context"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetcheck/fleetcheck/campaigns/remediation"
	"github.com/fleetcheck/fleetcheck/internal/escalate"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// remediationCall dials the coordinator's RemediationService.
func (f *opFlags) remediationCall(call func(context.Context, pb.RemediationServiceClient) error) error {
	if err := f.validate(); err != nil {
		return err
	}
	cc, err := f.conn()
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := call(ctx, pb.NewRemediationServiceClient(cc)); err != nil {
		return f.rpcError(err)
	}
	return nil
}

// remediationList is RemediationList's document.
type remediationList struct {
	Mode         remediation.Mode          `json:"mode"`
	Remediations []remediation.Remediation `json:"remediations"`
	JobEvents    []remediation.JobEvent    `json:"job_events"`
	Flagged      []escalate.FlaggedPort    `json:"flagged_ports"`
}

func remediationTable(w io.Writer, l remediationList) error {
	pr := newPrinter(w)
	pr.printf("mode: %s\n", l.Mode)
	pr.println("ID\tNODE\tCOMPONENT\tSTEP\tSTATE\tCREATED\tWHY")
	for _, r := range l.Remediations {
		pr.printf("%s\t%s\t%s\t%s (%d/%d)\t%s\t%s\t%s\n", r.ID, r.Node, r.Component, r.Step, r.Rung+1, len(r.Ladder), r.State, shortTime(r.CreatedAt), orDash(r.Trigger.Reason))
	}
	if len(l.JobEvents) > 0 {
		pr.println("\nJOB EVENT\tJOB\tXID\tNODES\tWHY")
		for _, j := range l.JobEvents {
			pr.printf("%s\t%s\t%d\t%d\t%s\n", shortTime(j.At), orDash(j.Job), j.Xid, len(j.Nodes), j.Reason)
		}
	}
	if len(l.Flagged) > 0 {
		pr.println("\nFLAGGED PORT\tSINCE\tLAST FLAP\tCLEARS")
		for _, p := range l.Flagged {
			pr.printf("%s %s\t%s\t%s\t%s\n", p.Node, p.Component, shortTime(p.Since), shortTime(p.LastFlap), shortTime(p.Until))
		}
	}
	return pr.err
}

func remediationShow(w io.Writer, r remediation.Remediation) error {
	pr := newPrinter(w)
	pr.printf("%s\t%s %s\n", r.ID, r.Node, r.Component)
	pr.printf("state\t%s\t%s\n", r.State, r.Reason)
	pr.printf("step\t%s\tladder %s\n", r.Step, strings.Join(r.Ladder, " -> "))
	pr.printf("cause\t%s\t%s\n", r.Trigger.Source, r.Trigger.Reason)
	if r.Recurs != "" {
		pr.printf("recurs after\t%s\t\n", r.Recurs)
	}
	for _, x := range r.Would {
		pr.printf("would\t%s\t\n", x)
	}
	if r.RMA != nil {
		pr.printf("rma\t%s\tsent %v, bundle %s\n", r.RMA.ID, r.RMA.Sent, r.RMA.Evidence.Bundle)
	}
	for _, e := range r.Events {
		pr.printf("%s\t%s\t\n", shortTime(e.At), e.What)
	}
	return pr.err
}

func newRemediationCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "remediation", Short: "The remediation ladder: list, show, approve, cancel (docs/remediation.md)"}
	var lf opFlags
	var node, state string
	list := &cobra.Command{
		Use: "list", Short: "Remediations newest first, job events and flagged ports", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return lf.remediationCall(func(ctx context.Context, c pb.RemediationServiceClient) error {
				d, err := c.RemediationList(ctx, &pb.RemediationListRequest{Node: node, State: state})
				if err != nil {
					return err
				}
				return printDoc(cmd.OutOrStdout(), &lf, d.GetBody(), remediationTable)
			})
		},
	}
	lf.register(list)
	list.Flags().StringVar(&node, "node", "", "only this node's")
	list.Flags().StringVar(&state, "state", "", "only those in this state (shadow, held, draining, acting, verifying, awaiting, rma, done, failed, cancelled, suppressed)")
	one := func(use, short string, rpc func(context.Context, pb.RemediationServiceClient, *pb.RemediationRef) (*pb.RemediationDocument, error), reason *string) *cobra.Command {
		return idCmd(use, short, func(cmd *cobra.Command, f *opFlags, id string) error {
			return f.remediationCall(func(ctx context.Context, c pb.RemediationServiceClient) error {
				ref := &pb.RemediationRef{Id: id}
				if reason != nil {
					ref.Reason = *reason
				}
				d, err := rpc(ctx, c, ref)
				if err != nil {
					return err
				}
				return printDoc(cmd.OutOrStdout(), f, d.GetBody(), remediationShow)
			})
		})
	}
	var reason string
	cancel := one("cancel", "Cancel a remediation; a node it drained returns to service",
		func(ctx context.Context, c pb.RemediationServiceClient, r *pb.RemediationRef) (*pb.RemediationDocument, error) {
			return c.RemediationCancel(ctx, r)
		}, &reason)
	cancel.Flags().StringVar(&reason, "reason", "", "why (kept with the remediation and the audit log)")
	cmd.AddCommand(list,
		one("show", "A remediation with its history", func(ctx context.Context, c pb.RemediationServiceClient, r *pb.RemediationRef) (*pb.RemediationDocument, error) {
			return c.RemediationShow(ctx, r)
		}, nil),
		one("approve", "Run a shadow remediation, or say a reseat or part swap is done (the node is then verified)",
			func(ctx context.Context, c pb.RemediationServiceClient, r *pb.RemediationRef) (*pb.RemediationDocument, error) {
				return c.RemediationApprove(ctx, r)
			}, nil),
		cancel)
	return cmd
}
