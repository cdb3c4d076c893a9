//go:build !node

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/coordinator"
	"github.com/fleetcheck/fleetcheck/internal/pki"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Environment defaults of the operator's flags.
const (
	envCoordinator     = "FLEETCHECK_COORDINATOR"
	envCert            = "FLEETCHECK_CERT"
	envKey             = "FLEETCHECK_KEY"
	envCA              = "FLEETCHECK_CA"
	envTrustDomain     = "FLEETCHECK_TRUST_DOMAIN"
	defaultCoordinator = "127.0.0.1:7443"
	callTimeout        = 30 * time.Second
)

// opFlags are shared by the operator's verbs.
type opFlags struct {
	// coordinators is --coordinator: one address or a comma list.
	coordinators string
	addrs        []string // parsed by validate
	// addr is the coordinator in use (errors name it); unreachable, the
	// others of the list that could not be connected to.
	addr        string
	unreachable []string
	atLeader    bool // addr is a leader a follower named (its name is addr's host)
	output      string
	// The operator's identity: an admin certificate (fleetcheck certs
	// issue admin NAME), or an explicit --insecure for a plaintext
	// coordinator.
	cert, key, ca string
	serverName    string
	trustDomain   string
	insecure      bool
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func (f *opFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.coordinators, "coordinator", envOr(envCoordinator, defaultCoordinator),
		"coordinator gRPC address, or several comma-separated (tried in order; a follower's refusal is retried at the leader) (default from $"+envCoordinator+", else "+defaultCoordinator+")")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	fl.StringVar(&f.cert, "cert", os.Getenv(envCert), "operator certificate, spiffe://TD/admin/NAME (default $"+envCert+")")
	fl.StringVar(&f.key, "key", os.Getenv(envKey), "its private key (default $"+envKey+")")
	fl.StringVar(&f.ca, "ca", os.Getenv(envCA), "CA bundle the coordinator's certificate must chain to (default $"+envCA+")")
	fl.StringVar(&f.trustDomain, "trust-domain", os.Getenv(envTrustDomain), "require the coordinator to hold spiffe://TRUST_DOMAIN/coordinator/NAME (default $"+envTrustDomain+")")
	fl.StringVar(&f.serverName, "server-name", "", "name to expect in the coordinator's certificate (default: the host of --coordinator)")
	fl.BoolVar(&f.insecure, "insecure", false, "plaintext, no certificate: only for a coordinator started with insecure: true (demo, tests)")
}

func (f *opFlags) validate() error {
	if f.output != "table" && f.output != "json" {
		return fmt.Errorf("-o must be table or json, not %q", f.output)
	}
	return f.parseAddrs()
}

// parseAddrs reads --coordinator into f.addrs.
func (f *opFlags) parseAddrs() error {
	if strings.TrimSpace(f.coordinators) == "" {
		return errors.New("--coordinator is empty")
	}
	addrs, err := parseCoordinators(f.coordinators)
	if err != nil {
		return err
	}
	f.addrs, f.addr = addrs, addrs[0]
	return nil
}

// dialOptions is the one place that says how operators reach the
// coordinator: mutual TLS with the operator's certificate, or plaintext
// only when asked for by name.
func (f *opFlags) dialOptions() ([]grpc.DialOption, error) {
	return f.dialOptionsFor(f.serverName, f.trustDomain, false)
}

// leaderDialOptions reach a leader a follower named: the same
// credentials, the name checked against the leader's address (not
// --server-name, which is for the addresses given), and its certificate
// held to the trust domain (--trust-domain, else the operator
// certificate's own).
func (f *opFlags) leaderDialOptions() ([]grpc.DialOption, error) {
	return f.dialOptionsFor("", f.trustDomain, true)
}

func (f *opFlags) dialOptionsFor(serverName, trustDomain string, needDomain bool) ([]grpc.DialOption, error) {
	set := f.cert != "" || f.key != "" || f.ca != ""
	switch {
	case f.insecure && set:
		return nil, errors.New("--insecure and --cert/--key/--ca (or $" + envCert + ", $" + envKey + ", $" + envCA + ") both given; choose one")
	case f.insecure:
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	case f.cert == "" || f.key == "" || f.ca == "":
		return nil, errors.New("no operator certificate: give --cert, --key and --ca (or $" + envCert + ", $" + envKey + ", $" + envCA +
			"), or --insecure for a plaintext coordinator")
	}
	r, err := pki.NewReloader(pki.Files{CertFile: f.cert, KeyFile: f.key, CAFile: f.ca}, pki.ReloaderOptions{CheckInterval: -1})
	if err != nil {
		return nil, err
	}
	if trustDomain == "" && needDomain {
		id, err := pki.ParseIdentity(r.Leaf())
		if err != nil {
			return nil, errNoTrustDomain
		}
		trustDomain = id.TrustDomain
	}
	creds, err := pki.ClientCredentials(pki.ClientOptions{Reloader: r, ServerName: serverName, TrustDomain: trustDomain})
	if err != nil {
		return nil, err
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(creds)}, nil
}

func (f *opFlags) client() (pb.OperatorServiceClient, func(), error) {
	if err := f.validate(); err != nil {
		return nil, nil, err
	}
	c, err := f.conn()
	if err != nil {
		return nil, nil, err
	}
	// Closed after the call: the call's own error is what is returned.
	return pb.NewOperatorServiceClient(c), c.Close, nil
}

// rpcError says what went wrong in one line, without gRPC's wrapping. A
// connection that failed is looked at again (diagnose): a refused
// certificate or plaintext against TLS is named as such.
func (f *opFlags) rpcError(err error) error {
	if errors.As(err, new(writeError)) {
		return err
	}
	if st, ok := status.FromError(err); ok {
		also := ""
		if len(f.unreachable) > 0 {
			also = fmt.Sprintf(" (%s unreachable too)", strings.Join(f.unreachable, ", "))
		}
		if st.Code() == codes.Unavailable {
			if why := f.diagnose(context.Background()); why != "" {
				return fmt.Errorf("coordinator %s: %s%s", f.addr, why, also)
			}
		}
		return fmt.Errorf("coordinator %s: %s: %s%s", f.addr, codeWords(st.Code().String()), st.Message(), also)
	}
	return fmt.Errorf("coordinator %s: %w", f.addr, err)
}

// codeWords turns "InvalidArgument" into "invalid argument".
func codeWords(code string) string {
	var b strings.Builder
	for i, r := range code {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte(' ')
		}
		b.WriteRune(r)
	}
	return strings.ToLower(b.String())
}

// writeJSON prints v as an indented JSON document: all of it, or the
// write's error (a document cut short is never a success).
func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return wrote(err)
}

func fmtTime(ms int64) string {
	if ms <= 0 {
		return "-"
	}
	return time.UnixMilli(ms).Local().Format("2006-01-02 15:04:05")
}

func jsonTime(ms int64) string {
	if ms <= 0 {
		return ""
	}
	return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)
}

func ago(ms int64, now time.Time) string {
	if ms <= 0 {
		return "never"
	}
	d := now.Sub(time.UnixMilli(ms))
	switch {
	case d < time.Second:
		return "now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// ---------------------------------------------------------------- nodes

type nodeJSON struct {
	Name          string            `json:"name"`
	State         string            `json:"state"`
	StateReason   string            `json:"state_reason,omitempty"`
	Connected     bool              `json:"connected"`
	Labels        map[string]string `json:"labels"`
	GPUs          int32             `json:"gpus"`
	DriverVersion string            `json:"driver_version"`
	LastSeen      string            `json:"last_seen,omitempty"`
	FailingChecks []string          `json:"failing_checks"`
	// OutOfService: the coordinator took the node out of service (state
	// draining or drained); state_reason says by whom and why.
	OutOfService bool `json:"out_of_service"`
}

// outOfService reports whether a node state is out of service.
func outOfService(state string) bool { return state == "draining" || state == "drained" }

func newNodesCmd() *cobra.Command {
	var f opFlags
	cmd := &cobra.Command{
		Use:   "nodes [SELECTOR]",
		Short: "List nodes: state, GPUs, driver, last seen, failing checks",
		Long: "List the nodes the coordinator knows, optionally those a selector picks " +
			"(Kubernetes label-selector syntax over agent labels, plus name=: 'sku=h100,rack in (r1,r2)').",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := f.client()
			if err != nil {
				return err
			}
			defer done()
			sel := ""
			if len(args) == 1 {
				sel = args[0]
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			resp, err := c.ListNodes(ctx, &pb.ListNodesRequest{Selector: sel})
			if err != nil {
				return f.rpcError(err)
			}
			out := cmd.OutOrStdout()
			if f.output == "json" {
				nodes := make([]nodeJSON, 0, len(resp.Nodes))
				for _, n := range resp.Nodes {
					nodes = append(nodes, nodeJSON{Name: n.Name, State: n.State, StateReason: n.StateReason,
						Connected: n.Connected, Labels: n.Labels, GPUs: n.Gpus, DriverVersion: n.DriverVersion,
						LastSeen: jsonTime(n.LastSeenUnixMs), FailingChecks: append([]string{}, n.FailingChecks...),
						OutOfService: outOfService(n.State)})
				}
				return writeJSON(out, map[string]any{"nodes": nodes})
			}
			now := time.Now()
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			pr := newPrinter(tw)
			pr.println("NODE\tSTATE\tGPUS\tDRIVER\tLAST-SEEN\tFAILING-CHECKS\tOUT-OF-SERVICE")
			for _, n := range resp.Nodes {
				oos := "-"
				if outOfService(n.State) {
					oos = orDash(n.StateReason) // who took it out, through what, and why
				}
				pr.printf("%s\t%s\t%d\t%s\t%s\t%s\t%s\n", n.Name, n.State, n.Gpus, orDash(n.DriverVersion),
					ago(n.LastSeenUnixMs, now), orDash(strings.Join(n.FailingChecks, ",")), oos)
			}
			return pr.flush(tw)
		},
	}
	f.register(cmd)
	return cmd
}

// -------------------------------------------------------------- results

type storedJSON struct {
	ResultID string             `json:"result_id"`
	Node     string             `json:"node"`
	WorkID   string             `json:"work_id,omitempty"`
	Finished string             `json:"finished"`
	Check    report.CheckResult `json:"check"`
}

func newResultsCmd() *cobra.Command {
	var f opFlags
	var node, check string
	var limit int
	cmd := &cobra.Command{
		Use:   "results NODE [--check CHECK] [--limit N]",
		Short: "Show a node's stored check results, newest first",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// The node is the argument (results gpu-003); --node still works.
			if len(args) == 1 {
				if node != "" && node != args[0] {
					return fmt.Errorf("node %q and --node %q: give one", args[0], node)
				}
				node = args[0]
			}
			if node == "" {
				return errors.New("which node? fleetcheck results NODE")
			}
			if limit < 1 || limit > 10000 {
				return fmt.Errorf("--limit %d: want 1..10000", limit)
			}
			c, done, err := f.client()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			resp, err := c.ListResults(ctx, &pb.ListResultsRequest{Node: node, Check: check, Limit: int32(limit)})
			if err != nil {
				return f.rpcError(err)
			}
			out := cmd.OutOrStdout()
			if f.output == "json" {
				rows := make([]storedJSON, 0, len(resp.Results))
				for _, r := range resp.Results {
					rows = append(rows, storedJSON{ResultID: r.ResultId, Node: r.Node, WorkID: r.WorkId,
						Finished: jsonTime(r.FinishedUnixMs), Check: wire.CheckFromProto(r.Check)})
				}
				return writeJSON(out, map[string]any{"results": rows})
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			pr := newPrinter(tw)
			pr.println("FINISHED\tCHECK\tSTATUS\tDURATION\tDETAIL\tRESULT")
			for _, r := range resp.Results {
				ch := wire.CheckFromProto(r.Check)
				pr.printf("%s\t%s\t%s\t%.1fms\t%s\t%s\n", fmtTime(r.FinishedUnixMs), ch.Name, ch.Status,
					ch.DurationMS, orDash(resultDetail(ch)), r.ResultId)
			}
			return pr.flush(tw)
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&node, "node", "", "the node (instead of the argument)")
	cmd.Flags().StringVar(&check, "check", "", "only this check")
	cmd.Flags().IntVar(&limit, "limit", 50, "at most this many rows")
	return cmd
}

// resultDetail is one line about a check result: its findings or reason.
func resultDetail(c report.CheckResult) string {
	if len(c.Findings) == 0 {
		return c.Reason
	}
	report.SortFindings(c.Findings)
	parts := make([]string, 0, len(c.Findings))
	for i, x := range c.Findings {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("+%d more", len(c.Findings)-3))
			break
		}
		parts = append(parts, strings.TrimSpace(x.Component+" "+x.Code))
	}
	return strings.Join(parts, ", ")
}

// ---------------------------------------------------------------- check

type outcomeJSON struct {
	Node     string `json:"node"`
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`
	ResultID string `json:"result_id,omitempty"`
}

type checkJSON struct {
	WorkID      string        `json:"work_id"`
	Total       int32         `json:"total"`
	Done        int32         `json:"done"`
	Refused     int32         `json:"refused"`
	Failed      int32         `json:"failed"`
	Unreachable int32         `json:"unreachable"`
	TimedOut    int32         `json:"timed_out"`
	Outcomes    []outcomeJSON `json:"outcomes"`
}

func progressLine(p *pb.RunCheckProgress) string {
	line := fmt.Sprintf("%d/%d done, %d refused, %d failed", p.Done, p.Total, p.Refused, p.Failed)
	if p.Unreachable > 0 {
		line += fmt.Sprintf(", %d unreachable", p.Unreachable)
	}
	if p.TimedOut > 0 {
		line += fmt.Sprintf(", %d timed out", p.TimedOut)
	}
	return line
}

// outcomeOK is what lets `check` exit 0: the node ran the checks and
// nothing failed or errored. Refused, unreachable and timed out are
// inconclusive, never a pass.
func outcomeOK(status string) bool {
	return status == string(report.Pass) || status == string(report.Warn)
}

func newCheckCmd() *cobra.Command {
	var f opFlags
	var checks []string
	var timeout time.Duration
	var reason string
	cmd := &cobra.Command{
		Use:   "check SELECTOR --checks LIST [--timeout D] [--reason WHY]",
		Short: "Run checks now on every node a selector picks, and wait for the outcome",
		Long: `Ask every node the selector picks ('' for all) to run the named checks now, show
progress while waiting, then a table of per-node outcomes.

A node whose checks all skipped (nothing there to measure) shows skip; the
REASON column lists skipped checks with why, after any that did not pass.

Exit status: 0 when every node passed (or only warned), 1 when any node failed,
errored, skipped everything, refused, timed out or was unreachable, 2 when the
command could not run.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(checks) == 0 {
				return errors.New("--checks is required (comma separated; see `fleetcheck checks`)")
			}
			if timeout < coordinator.MinRunTimeout || timeout > coordinator.MaxRunTimeout {
				return fmt.Errorf("--timeout %s: want %s..%s", timeout, coordinator.MinRunTimeout, coordinator.MaxRunTimeout)
			}
			c, done, err := f.client()
			if err != nil {
				return err
			}
			defer done()
			// The call outlives the work's timeout by a margin for the final message.
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout+callTimeout)
			defer cancel()
			stream, err := c.RunCheck(ctx, &pb.RunCheckRequest{Selector: args[0], Checks: checks, TimeoutMs: timeout.Milliseconds(), Reason: reason})
			if err != nil {
				return f.rpcError(err)
			}
			final, err := followProgress(stream, cmd.ErrOrStderr())
			if err != nil {
				return f.rpcError(err)
			}
			if final.Total == 0 {
				return fmt.Errorf("selector %q matches no node the coordinator knows", args[0])
			}
			if err := writeOutcomes(cmd.OutOrStdout(), f.output, final); err != nil {
				return err
			}
			for _, o := range final.Outcomes {
				if !outcomeOK(o.Status) {
					return errChecksFailed
				}
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringSliceVar(&checks, "checks", nil, "checks to run (comma separated)")
	cmd.Flags().DurationVar(&timeout, "timeout", coordinator.DefaultRunTimeout, "how long to wait for the nodes")
	cmd.Flags().StringVar(&reason, "reason", "", "why you run it (a ticket, an incident), kept in the audit log")
	return cmd
}

// followProgress shows progress until the final message: on a terminal one
// line rewritten in place, otherwise a plain line when the counts move (at
// most one a second). The lines go to stderr, beside the outcomes on
// stdout: a failed write there loses only the progress, so it is not the
// command's error.
func followProgress(stream grpc.ServerStreamingClient[pb.RunCheckProgress], w io.Writer) (*pb.RunCheckProgress, error) {
	pr := newPrinter(w)
	tty := false
	if f, ok := w.(*os.File); ok {
		tty = isatty.IsTerminal(f.Fd())
	}
	var last string
	var lastAt time.Time
	for {
		p, err := stream.Recv()
		if err == io.EOF {
			return nil, errors.New("stream ended without a final message")
		}
		if err != nil {
			if tty && last != "" {
				pr.println()
			}
			return nil, err
		}
		line := progressLine(p)
		switch {
		case tty:
			pr.printf("\r%s\033[K", line)
			if p.Final {
				pr.println()
			}
		case line != last && (p.Final || time.Since(lastAt) >= time.Second):
			pr.println(line)
			lastAt = time.Now()
		}
		last = line
		if p.Final {
			return p, nil
		}
	}
}

func writeOutcomes(w io.Writer, format string, p *pb.RunCheckProgress) error {
	outs := append([]*pb.NodeOutcome(nil), p.Outcomes...)
	sort.Slice(outs, func(i, j int) bool { return outs[i].Node < outs[j].Node })
	if format == "json" {
		res := checkJSON{WorkID: p.WorkId, Total: p.Total, Done: p.Done, Refused: p.Refused, Failed: p.Failed,
			Unreachable: p.Unreachable, TimedOut: p.TimedOut, Outcomes: make([]outcomeJSON, 0, len(outs))}
		for _, o := range outs {
			res.Outcomes = append(res.Outcomes, outcomeJSON{Node: o.Node, Status: o.Status, Reason: o.Reason, ResultID: o.ResultId})
		}
		return writeJSON(w, res)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	pr := newPrinter(tw)
	pr.println("NODE\tSTATUS\tREASON\tRESULT")
	for _, o := range outs {
		pr.printf("%s\t%s\t%s\t%s\n", o.Node, o.Status, orDash(o.Reason), orDash(o.ResultId))
	}
	if err := pr.flush(tw); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "work %s: %s\n", p.WorkId, progressLine(p))
	return err
}

// --------------------------------------------------------------- events

type eventJSON struct {
	ID      int64  `json:"id"`
	Time    string `json:"time"`
	Node    string `json:"node,omitempty"`
	Kind    string `json:"kind"`
	Actor   string `json:"actor,omitempty"`
	Message string `json:"message"`
}

func newEventsCmd() *cobra.Command {
	var f opFlags
	var node, kind string
	var limit int
	cmd := &cobra.Command{
		Use:   "events [--node NODE] [--kind KIND] [--limit N]",
		Short: "Show the event log: state changes with their reasons, operator actions, refusals",
		Long: `Show the event log, oldest of the newest N first: who did what and why.

Kinds: state_change (a node's state and the reason, e.g. healthy -> failed:
gpu.ecc fail ...), operator_action (an operator's request: who, what, on which
nodes, the reason given), audit (what a campaign did and for whom), refused
(what the coordinator refused an agent: a certificate speaking for another
node, a result for work never sent), connection (agents joining, streams
replaced).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > 10000 {
				return fmt.Errorf("--limit %d: want 1..10000", limit)
			}
			c, done, err := f.client()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			resp, err := c.ListEvents(ctx, &pb.ListEventsRequest{Node: node, Kind: kind, Limit: int32(limit)})
			if err != nil {
				return f.rpcError(err)
			}
			out := cmd.OutOrStdout()
			if f.output == "json" {
				evs := make([]eventJSON, 0, len(resp.Events))
				for _, e := range resp.Events {
					evs = append(evs, eventJSON{ID: e.Id, Time: jsonTime(e.UnixMs), Node: e.Node, Kind: e.Kind, Actor: e.Actor, Message: e.Message})
				}
				return writeJSON(out, map[string]any{"events": evs})
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			pr := newPrinter(tw)
			pr.println("TIME\tNODE\tKIND\tACTOR\tMESSAGE")
			for _, e := range resp.Events {
				pr.printf("%s\t%s\t%s\t%s\t%s\n", fmtTime(e.UnixMs), orDash(e.Node), e.Kind, orDash(e.Actor), e.Message)
			}
			return pr.flush(tw)
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&node, "node", "", "only this node's events")
	cmd.Flags().StringVar(&kind, "kind", "", "only events of this kind: state_change, operator_action, audit, refused, connection")
	cmd.Flags().IntVar(&limit, "limit", 100, "the newest N events")
	return cmd
}
