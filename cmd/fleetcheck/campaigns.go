//go:build !node

package main

import (
	"bytes"
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

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	"github.com/fleetcheck/fleetcheck/coordinator/campaignpb"
	"github.com/fleetcheck/fleetcheck/internal/config"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// campaignCall dials the coordinator's CampaignService and runs call with
// a bounded context. formats lists the -o values the verb takes beyond
// table and json.
func (f *opFlags) campaignCall(formats []string, call func(context.Context, pb.CampaignServiceClient) error) error {
	out := f.output
	for _, x := range formats {
		if out == x {
			f.output = "json" // pass the shared validation; restored below
		}
	}
	err := f.validate()
	f.output = out
	if err != nil {
		return err
	}
	cc, err := f.conn()
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if err := call(ctx, pb.NewCampaignServiceClient(cc)); err != nil {
		return f.rpcError(err)
	}
	return nil
}

// printDoc writes an engine's JSON document as it is (-o json), or decodes
// it into T for table.
func printDoc[T any](w io.Writer, f *opFlags, body []byte, table func(io.Writer, T) error) error {
	if f.output == "json" {
		var buf bytes.Buffer
		if err := json.Indent(&buf, body, "", "  "); err != nil {
			return fmt.Errorf("coordinator sent bad JSON: %w", err)
		}
		buf.WriteByte('\n')
		_, err := w.Write(buf.Bytes())
		return wrote(err)
	}
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		return fmt.Errorf("coordinator sent bad JSON: %w", err)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if err := table(tw, v); err != nil {
		return err
	}
	return wrote(tw.Flush())
}

// printReply prints a typed answer as the engine's value v: its JSON
// (-o json), or table. legacy is the JSON document an older coordinator
// sent instead (the answer's fields 1 and 2); it is printed as before.
func printReply[T any](w io.Writer, f *opFlags, legacy []byte, v T, table func(io.Writer, T) error) error {
	if len(legacy) > 0 {
		return printDoc(w, f, legacy, table)
	}
	if f.output == "json" {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return fmt.Errorf("encode: %w", err)
		}
		_, err = w.Write(append(b, '\n'))
		return wrote(err)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if err := table(tw, v); err != nil {
		return err
	}
	return wrote(tw.Flush())
}

// badReply is an answer the CLI cannot turn back into the engine's value.
func badReply(err error) error { return fmt.Errorf("coordinator sent a bad answer: %w", err) }

// progressBar is "[#####-----] 12/40" on a terminal, "12/40" otherwise.
func progressBar(w io.Writer, done, total int) string {
	if total <= 0 {
		return "-"
	}
	if f, ok := w.(*os.File); !ok || !isatty.IsTerminal(f.Fd()) {
		return fmt.Sprintf("%d/%d", done, total)
	}
	const width = 20
	n := min(width, done*width/total)
	return fmt.Sprintf("[%s%s] %d/%d", strings.Repeat("#", n), strings.Repeat("-", width-n), done, total)
}

func shortTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04")
}

func countsLine[K ~string](m map[K]int) string {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if v > 0 {
			keys = append(keys, fmt.Sprintf("%s=%d", k, v))
		}
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		return "-"
	}
	return strings.Join(keys, " ")
}

func readSpec(path string) ([]byte, error) {
	if path == "" {
		return nil, errors.New("-f SPEC.yaml is required")
	}
	if path == "-" {
		return io.ReadAll(os.Stdin)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	return b, nil
}

// idCmd is a verb that takes one campaign id.
func idCmd(use, short string, run func(cmd *cobra.Command, f *opFlags, id string) error) *cobra.Command {
	var f opFlags
	cmd := &cobra.Command{
		Use: use + " ID", Short: short, Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return run(cmd, &f, args[0]) },
	}
	f.register(cmd)
	return cmd
}

// ---------------------------------------------------------------- baseline

type baselineKeyFlags struct{ metric, scope, driver, nccl, rdma string }

func (k *baselineKeyFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&k.metric, "metric", baselines.MetricAllReduceBusBW, "metric name as in the report")
	fl.StringVar(&k.scope, "scope", "", "node:NAME, sku:SKU or link:A|B")
	fl.StringVar(&k.driver, "driver", "", "driver version of the stack")
	fl.StringVar(&k.nccl, "nccl", "", "NCCL version of the stack")
	fl.StringVar(&k.rdma, "rdma", "", "RDMA stack (\"MLNX_OFED 23.10-1.1.9.0\", \"DOCA 2.10.0\")")
}

func (k *baselineKeyFlags) pb() *pb.BaselineKey {
	return &pb.BaselineKey{Metric: k.metric, Scope: k.scope, Driver: k.driver, Nccl: k.nccl, Rdma: k.rdma}
}

func baselineTable(w io.Writer, bs []baselines.Baseline) error {
	pr := newPrinter(w)
	pr.println("METRIC\tSCOPE\tSTACK\tVALUE\tDIR\tSAMPLES\tVERSION\tTAKEN\tWHO\tFROM")
	for _, b := range bs {
		pr.printf("%s\t%s\t%s\t%.4g\t%s\t%d\t%d\t%s\t%s\t%s\n", b.Metric, b.Scope, orDash(b.Stack.String()),
			b.Value, b.Direction, b.Samples.Count, b.Version, shortTime(b.TakenAt), orDash(b.Who), orDash(b.FromRun))
	}
	return pr.err
}

func newBaselineCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "baseline", Short: "Stored, versioned baselines: record, show, history, set, export, import"}
	cmd.AddCommand(newBaselineRecordCmd(), newBaselineShowCmd(false), newBaselineShowCmd(true),
		newBaselineSetCmd(), newBaselineExportCmd(), newBaselineImportCmd())
	return cmd
}

// looksLikeSelector tells a selector from a result id in --from.
func looksLikeSelector(s string) bool { return strings.ContainsAny(s, "=!(, ") }

func newBaselineRecordCmd() *cobra.Command {
	var (
		f       opFlags
		k       baselineKeyFlags
		from    string
		samples []float64
		note    string
	)
	cmd := &cobra.Command{
		Use:   "record",
		Short: "Record a baseline from a stored result, the selected nodes' recent results, or samples",
		Long: "Record a new baseline version.\n\n" +
			"  --from RESULT_ID    the metric's value in that stored result (scope defaults to its node's)\n" +
			"  --from SELECTOR     one node-scoped baseline per selected node, from its recent results;\n" +
			"                      nodes without the metric are listed as skipped, with why\n" +
			"  --sample V ...      the given measurements\n\n" +
			"From stored results the stack is the node's, as its inventory reported it then (driver,\n" +
			"RDMA stack); --driver, --nccl and --rdma set or override fields.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &pb.BaselineRecordRequest{Key: k.pb(), Samples: samples, Note: note}
			switch {
			case from != "" && looksLikeSelector(from):
				req.Selector = from
			default:
				req.FromRun = from
			}
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				rep, err := c.BaselineRecord(ctx, req)
				if err != nil {
					return err
				}
				return printReply(cmd.OutOrStdout(), &f, rep.GetDocument(), campaignpb.BaselineRecordFrom(rep), func(w io.Writer, r baselines.RecordReport) error {
					pr := newPrinter(w)
					if err := baselineTable(w, r.Recorded); err != nil {
						return err
					}
					// Nodes left out say so, and why: a fleet-wide record
					// that silently covers half the fleet is a trap.
					for _, sk := range r.Skipped {
						pr.printf("skipped %s: %s\n", sk.Node, sk.Reason)
					}
					return pr.err
				})
			})
		},
	}
	f.register(cmd)
	k.register(cmd)
	cmd.Flags().StringVar(&from, "from", "", "a result id, or a node selector")
	cmd.Flags().Float64SliceVar(&samples, "sample", nil, "a measurement (repeat or comma-separate)")
	cmd.Flags().StringVar(&note, "note", "", "why this baseline")
	return cmd
}

func newBaselineShowCmd(history bool) *cobra.Command {
	var (
		f    opFlags
		k    baselineKeyFlags
		kind string
		all  bool
	)
	use, short := "show", "List the latest baselines (filter by --metric, --scope, --kind)"
	if history {
		use, short = "history", "Every version of one baseline (--metric, --scope and the stack)"
	}
	cmd := &cobra.Command{
		Use: use, Short: short, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				var (
					rep *pb.BaselineListReply
					err error
				)
				if history {
					rep, err = c.BaselineHistory(ctx, &pb.BaselineKeyRequest{Key: k.pb()})
				} else {
					metric := k.metric
					if !cmd.Flags().Changed("metric") {
						metric = ""
					}
					rep, err = c.BaselineShow(ctx, &pb.BaselineQuery{Metric: metric, Scope: k.scope, Kind: kind, AllVersions: all})
				}
				if err != nil {
					return err
				}
				return printReply(cmd.OutOrStdout(), &f, rep.GetDocument(), campaignpb.BaselineListFrom(rep), baselineTable)
			})
		},
	}
	f.register(cmd)
	k.register(cmd)
	if !history {
		cmd.Flags().StringVar(&kind, "kind", "", "node, sku or link")
		cmd.Flags().BoolVar(&all, "all-versions", false, "every version, not only each key's latest")
	}
	return cmd
}

func newBaselineSetCmd() *cobra.Command {
	var (
		f         opFlags
		k         baselineKeyFlags
		value     float64
		direction string
		threshold float64
		note      string
	)
	cmd := &cobra.Command{
		Use: "set", Short: "Set a baseline's value by hand (a new version; the old ones are kept)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				rep, err := c.BaselineSet(ctx, &pb.BaselineSetRequest{Key: k.pb(), Value: value, Direction: direction,
					Threshold: threshold, Note: note})
				if err != nil {
					return err
				}
				var b baselines.Baseline
				if rep.GetBaseline() != nil {
					b = campaignpb.BaselineFrom(rep.GetBaseline())
				}
				return printReply(cmd.OutOrStdout(), &f, rep.GetDocument(), b, func(w io.Writer, b baselines.Baseline) error {
					return baselineTable(w, []baselines.Baseline{b})
				})
			})
		},
	}
	f.register(cmd)
	k.register(cmd)
	cmd.Flags().Float64Var(&value, "value", 0, "the reference value")
	cmd.Flags().StringVar(&direction, "direction", "", "higher or lower is better (default: from the metric's unit)")
	cmd.Flags().Float64Var(&threshold, "threshold", 0, "deviation above which a check fails (default 0.30)")
	cmd.Flags().StringVar(&note, "note", "", "why this value")
	return cmd
}

func newBaselineExportCmd() *cobra.Command {
	var (
		f     opFlags
		k     baselineKeyFlags
		kind  string
		all   bool
		outTo string
	)
	cmd := &cobra.Command{
		Use: "export", Short: "Write baselines as a file that import reads back", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			metric := k.metric
			if !cmd.Flags().Changed("metric") {
				metric = ""
			}
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				doc, err := c.BaselineExport(ctx, &pb.BaselineQuery{Metric: metric, Scope: k.scope, Kind: kind, AllVersions: all})
				if err != nil {
					return err
				}
				if outTo == "" || outTo == "-" {
					_, err = cmd.OutOrStdout().Write(doc.GetBody())
					return wrote(err)
				}
				return os.WriteFile(outTo, doc.GetBody(), 0o644)
			})
		},
	}
	f.register(cmd)
	k.register(cmd)
	cmd.Flags().StringVar(&kind, "kind", "", "node, sku or link")
	cmd.Flags().BoolVar(&all, "all-versions", false, "every version (a full history)")
	cmd.Flags().StringVarP(&outTo, "file", "f", "", "write to FILE instead of stdout")
	return cmd
}

func newBaselineImportCmd() *cobra.Command {
	var f opFlags
	cmd := &cobra.Command{
		Use: "import FILE", Short: "Import a baselines file (entries equal to a stored version are skipped)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := readSpec(args[0])
			if err != nil {
				return err
			}
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				rep, err := c.BaselineImport(ctx, &pb.BaselineImportRequest{File: b})
				if err != nil {
					return err
				}
				return printReply(cmd.OutOrStdout(), &f, rep.GetDocument(), campaignpb.BaselineImportFrom(rep), func(w io.Writer, r baselines.ImportResult) error {
					pr := newPrinter(w)
					pr.printf("added %d, unchanged %d\n", r.Added, r.Unchanged)
					return pr.err
				})
			})
		},
	}
	f.register(cmd)
	return cmd
}

// ---------------------------------------------------------------- sweep

func newSweepCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "sweep", Short: "Slow-node sweeps: start, status, list, report"}
	cmd.AddCommand(newSweepStartCmd(),
		idCmd("status", "Where a sweep stands", func(cmd *cobra.Command, f *opFlags, id string) error {
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				rep, err := c.SweepStatus(ctx, &pb.CampaignRef{Id: id})
				if err != nil {
					return err
				}
				return printReply(cmd.OutOrStdout(), f, rep.GetDocument(), campaignpb.SweepStatusFrom(rep), func(w io.Writer, p sweep.Progress) error {
					pr := newPrinter(w)
					pr.println("ID\tSTATE\tPHASE\tROUND\tWAVE\tSINGLES\tPAIRS\tNODES")
					pr.printf("%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\n", p.ID, p.State, orDash(string(p.Phase)), p.Round,
						progressBar(cmd.OutOrStdout(), p.WaveDone, p.WaveTotal), progressBar(cmd.OutOrStdout(), p.Singles, p.SinglesAll),
						progressBar(cmd.OutOrStdout(), p.Pairs, p.PairsAll), p.Nodes)
					if p.Incomplete != "" {
						pr.printf("incomplete: %s\n", p.Incomplete)
					}
					if p.Waiting != "" {
						pr.printf("waiting: %s\n", p.Waiting)
					}
					return pr.err
				})
			})
		}),
		newSweepListCmd(),
		idCmd("report", "A sweep's verdicts with their evidence", func(cmd *cobra.Command, f *opFlags, id string) error {
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				doc, err := c.SweepReport(ctx, &pb.CampaignRef{Id: id})
				if err != nil {
					return err
				}
				return printDoc(cmd.OutOrStdout(), f, doc.GetBody(), sweepReportTable)
			})
		}))
	return cmd
}

func sweepReportTable(w io.Writer, r sweep.Report) error {
	pr := newPrinter(w)
	pr.printf("sweep %s: %s, %d nodes tested, %d passed, %d all_reduce runs, took %s\n", r.ID, r.State, r.Tested,
		len(r.Passed), r.AllReduceRuns, config.FormatDuration(time.Duration(r.DurationS*float64(time.Second)).Round(time.Second)))
	if r.Error != "" {
		pr.printf("error: %s\n", r.Error)
	}
	if r.Incomplete != "" {
		pr.printf("incomplete: %s\n", r.Incomplete)
	}
	if len(r.Verdicts) == 0 {
		pr.println("no slow node, pair or link")
	} else {
		pr.println("SUBJECT\tKIND\tVERDICT\tDEVIATION\tDRAIN\tREASON")
		for _, v := range r.Verdicts {
			dev := "-"
			if v.Deviation > 0 {
				dev = fmt.Sprintf("%.0f%%", v.Deviation*100)
			}
			drained := "-"
			if v.Drain != nil {
				drained = string(*v.Drain)
			}
			pr.printf("%s\t%s\t%s\t%s\t%s\t%s\n", v.Subject, orDash(v.SubjectKind), v.Verdict, dev, drained, orDash(v.Reason))
		}
	}
	if len(r.Skipped) > 0 {
		pr.println("SKIPPED\tREASON")
		for _, s := range r.Skipped {
			pr.printf("%s\t%s\n", s.Node, orDash(s.Reason))
		}
	}
	return pr.err
}

func newSweepStartCmd() *cobra.Command {
	var (
		f         opFlags
		file      string
		sel       string
		threshold float64
		drainIt   bool
		note      string
	)
	cmd := &cobra.Command{
		Use: "start", Short: "Start a sweep (-f SPEC, or --selector and friends)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var spec []byte
			if file != "" {
				b, err := readSpec(file)
				if err != nil {
					return err
				}
				spec = b
			} else {
				b, err := json.Marshal(sweep.Spec{Selector: sel, Threshold: threshold, Drain: drainIt, Note: note})
				if err != nil {
					return err
				}
				spec = b
			}
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				st, err := c.SweepStart(ctx, &pb.SpecRequest{Spec: spec})
				if err != nil {
					return err
				}
				return printStarted(cmd.OutOrStdout(), &f, "sweep", st)
			})
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringVarP(&file, "file", "f", "", "sweep spec (YAML or JSON, the sweep's field names)")
	fl.StringVar(&sel, "selector", "", "nodes to sweep (label selector; default all)")
	fl.Float64Var(&threshold, "threshold", 0, "deviation below baseline that is slow (default 0.30)")
	fl.BoolVar(&drainIt, "drain", false, "drain gpu-side and network-side nodes")
	fl.StringVar(&note, "note", "", "who and why")
	return cmd
}

func printStarted(w io.Writer, f *opFlags, what string, st *pb.CampaignStarted) error {
	if f.output == "json" {
		return printDoc[json.RawMessage](w, f, st.GetDocument(), nil)
	}
	_, err := fmt.Fprintf(w, "%s %s started\n", what, st.GetId())
	return wrote(err)
}

func newSweepListCmd() *cobra.Command {
	var f opFlags
	cmd := &cobra.Command{
		Use: "list", Short: "Sweeps, newest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				rep, err := c.SweepList(ctx, &pb.CampaignListRequest{})
				if err != nil {
					return err
				}
				return printReply(cmd.OutOrStdout(), &f, rep.GetDocument(), campaignpb.SweepListFrom(rep), func(w io.Writer, l []sweep.Summary) error {
					pr := newPrinter(w)
					pr.println("ID\tSTATE\tPHASE\tSELECTOR\tNODES\tCREATED\tVERDICTS")
					for _, s := range l {
						state := string(s.State)
						if s.Incomplete != "" {
							state += " (incomplete)"
						}
						pr.printf("%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.ID, state, orDash(string(s.Phase)), orDash(s.Selector),
							s.Nodes, shortTime(s.Created), countsLine(s.Counts))
					}
					return pr.err
				})
			})
		},
	}
	f.register(cmd)
	return cmd
}

// ---------------------------------------------------------------- rollout

func newRolloutCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "rollout", Short: "Driver and firmware rollouts in waves: plan, start, status, list, pause, resume, abort, rollback, approve"}
	cmd.AddCommand(newRolloutSpecCmd(true), newRolloutSpecCmd(false),
		idCmd("status", "A rollout's waves and nodes", func(cmd *cobra.Command, f *opFlags, id string) error {
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				rep, err := c.RolloutStatus(ctx, &pb.CampaignRef{Id: id})
				if err != nil {
					return err
				}
				st, err := campaignpb.RolloutStatusFrom(rep)
				if err != nil {
					return badReply(err)
				}
				return printReply(cmd.OutOrStdout(), f, rep.GetDocument(), st, func(w io.Writer, s rollout.Status) error {
					return rolloutStatusTable(w, cmd.OutOrStdout(), s)
				})
			})
		}),
		newRolloutListCmd())
	for _, a := range []struct{ verb, short string }{
		{"pause", "Stop starting nodes (running ones finish)"},
		{"resume", "Continue a paused or halted rollout"},
		{"abort", "Stop for good; nodes mid-upgrade finish or are left as they are"},
		{"rollback", "Take upgraded nodes back to their previous driver"},
		{"approve", "Let the waves after the canary start (approval: manual)"},
	} {
		var reason string
		c := idCmd(a.verb, a.short, func(cmd *cobra.Command, f *opFlags, id string) error {
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				rep, err := c.RolloutControl(ctx, &pb.RolloutControlRequest{Id: id, Action: a.verb, Reason: reason})
				if err != nil {
					return err
				}
				st, err := campaignpb.RolloutStatusFrom(rep)
				if err != nil {
					return badReply(err)
				}
				return printReply(cmd.OutOrStdout(), f, rep.GetDocument(), st, func(w io.Writer, s rollout.Status) error {
					if a.verb == "rollback" {
						if err := rollbackLine(w, s); err != nil {
							return err
						}
					}
					return rolloutStatusTable(w, cmd.OutOrStdout(), s)
				})
			})
		})
		c.Flags().StringVar(&reason, "reason", "", "why (kept with the rollout and the audit log)")
		cmd.AddCommand(c)
	}
	return cmd
}

// rollbackLine says what a rollback took on: each upgraded node and the
// driver it goes back to.
func rollbackLine(w io.Writer, s rollout.Status) error {
	pr := newPrinter(w)
	var back []string
	for _, n := range s.Nodes {
		if n.Op == "rollback" {
			back = append(back, n.Node+" to "+orDash(n.FromDriver))
		}
	}
	if len(back) == 0 {
		pr.printf("rollout %s: no upgraded node to roll back\n", s.ID)
		return pr.err
	}
	pr.printf("rollout %s: rolling back %d nodes: %s\n", s.ID, len(back), strings.Join(back, ", "))
	return pr.err
}

func rolloutStatusTable(w, term io.Writer, s rollout.Status) error {
	pr := newPrinter(w)
	// Settled nodes: a rollback turns done nodes back into pending ones
	// that end rolled-back (or failed), so those count too.
	done := s.Counts[rollout.Done] + s.Counts[rollout.Failed] + s.Counts[rollout.Skipped] + s.Counts[rollout.RolledBack]
	pr.printf("rollout %s (%s) to driver %s: %s%s, wave %d, %s, unavailable %d/%s\n", s.ID, orDash(s.Name), s.Driver,
		s.Phase, map[bool]string{true: " (paused: " + s.PauseReason + ")", false: ""}[s.Paused], s.Wave,
		progressBar(term, done, len(s.Nodes)), s.Unavailable, s.MaxUnavailable)
	if s.HaltReason != "" {
		pr.printf("halted: %s\n", s.HaltReason)
	}
	if s.Blocked != "" {
		pr.printf("blocked: %s\n", s.Blocked)
	}
	if s.Incomplete != "" {
		pr.printf("incomplete: %s\n", s.Incomplete)
	}
	pr.println("WAVE\tNAME\tSTATE\tSIZE\tBUDGET\tDONE\tFAILED\tSKIPPED\tACTIVE\tPENDING")
	for _, wv := range s.Waves {
		pr.printf("%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", wv.Index, wv.Name, wv.State, wv.Size, wv.Budget, wv.Done, wv.Failed, wv.Skipped, wv.Active, wv.Pending)
	}
	pr.println("NODE\tWAVE\tSTATE\tOP\tFROM\tSINCE\tREASON")
	for _, n := range s.Nodes {
		pr.printf("%s\t%d\t%s\t%s\t%s\t%s\t%s\n", n.Node, n.Wave, n.State, orDash(n.Op), orDash(n.FromDriver),
			shortTime(n.Since), orDash(firstNonEmpty(n.Reason, n.Waiting, n.LastError, n.Hold)))
	}
	return excludedTable(w, s.Excluded)
}

func excludedTable(w io.Writer, ex []rollout.Exclusion) error {
	pr := newPrinter(w)
	if len(ex) == 0 {
		return pr.err
	}
	pr.println("EXCLUDED\tKIND\tREASON")
	for _, e := range ex {
		pr.printf("%s\t%s\t%s\n", e.Node, e.Kind, e.Reason)
	}
	return pr.err
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

func newRolloutSpecCmd(plan bool) *cobra.Command {
	var (
		f            opFlags
		file, matrix string
	)
	use, short := "start", "Start a rollout from a spec file"
	if plan {
		use, short = "plan", "Show the waves a rollout would make and the nodes it would leave out, changing nothing"
	}
	cmd := &cobra.Command{
		Use: use, Short: short, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := readSpec(file)
			if err != nil {
				return err
			}
			req := &pb.SpecRequest{Spec: spec}
			if matrix != "" {
				if req.Matrix, err = os.ReadFile(matrix); err != nil {
					return fmt.Errorf("read matrix: %w", err)
				}
			}
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				if !plan {
					st, err := c.RolloutStart(ctx, req)
					if err != nil {
						return err
					}
					return printStarted(cmd.OutOrStdout(), &f, "rollout", st)
				}
				rep, err := c.RolloutPlan(ctx, req)
				if err != nil {
					return err
				}
				p, err := campaignpb.RolloutPlanFrom(rep)
				if err != nil {
					return badReply(err)
				}
				return printReply(cmd.OutOrStdout(), &f, rep.GetDocument(), p, rolloutPlanTable)
			})
		},
	}
	f.register(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "rollout spec (rollout.yaml)")
	cmd.Flags().StringVar(&matrix, "matrix", "", "compatibility matrix (default: the coordinator's compat_matrix)")
	return cmd
}

func rolloutPlanTable(w io.Writer, p rollout.PlanResult) error {
	pr := newPrinter(w)
	pr.printf("%d selected of %d, %d excluded, at most %d unavailable at once\n", p.Selected, p.FleetSize, len(p.Excluded), p.MaxUnavailable)
	pr.println("WAVE\tNAME\tBUDGET\tNODES")
	for _, wv := range p.Waves {
		names := make([]string, 0, len(wv.Nodes))
		for _, n := range wv.Nodes {
			names = append(names, n.Name)
		}
		pr.printf("%d\t%s\t%d\t%s\n", wv.Index, wv.Name, wv.Budget, strings.Join(names, ","))
	}
	// Nodes planned while their agent was away: in their wave, waited for.
	header := false
	for _, wv := range p.Waves {
		for _, n := range wv.Nodes {
			if !n.Disconnected {
				continue
			}
			if !header {
				pr.println("DISCONNECTED\tWAVE\tNOTE")
				header = true
			}
			pr.printf("%s\t%s\t%s\n", n.Name, wv.Name, n.Note)
		}
	}
	return excludedTable(w, p.Excluded)
}

func newRolloutListCmd() *cobra.Command {
	var f opFlags
	cmd := &cobra.Command{
		Use: "list", Short: "Rollouts", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				rep, err := c.RolloutList(ctx, &pb.CampaignListRequest{})
				if err != nil {
					return err
				}
				return printReply(cmd.OutOrStdout(), &f, rep.GetDocument(), campaignpb.RolloutListFrom(rep), func(w io.Writer, l []rollout.Summary) error {
					pr := newPrinter(w)
					pr.println("ID\tNAME\tDRIVER\tPHASE\tWAVE\tNODES\tCREATED\tSTATES")
					for _, s := range l {
						phase := string(s.Phase)
						if s.Paused {
							phase += " (paused)"
						}
						pr.printf("%s\t%s\t%s\t%s\t%d/%d\t%d\t%s\t%s\n", s.ID, orDash(s.Name), s.Driver, phase, s.Wave, s.Waves,
							s.Nodes, shortTime(s.Created), countsLine(s.Counts))
					}
					return pr.err
				})
			})
		},
	}
	f.register(cmd)
	return cmd
}

// ---------------------------------------------------------------- burnin

func burninStatusTable(term io.Writer) func(io.Writer, []burnin.CampaignStatus) error {
	return func(w io.Writer, l []burnin.CampaignStatus) error {
		pr := newPrinter(w)
		pr.println("ID\tNAME\tSTATE\tPHASE\tLEVEL\tNODES\tACCEPTED\tREJECTED\tRUNS\tCREATED")
		for _, s := range l {
			pr.printf("%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", s.ID, orDash(s.Name), s.State, s.Phase, s.Level, s.Nodes,
				s.Accepted, s.Rejected, progressBar(term, s.RunsDone, s.RunsTotal), shortTime(s.CreatedAt))
		}
		return pr.err
	}
}

// burninNodesTable is one line per node: the step it runs (or how far
// it got), where it is, and why it waits or was rejected.
func burninNodesTable(w io.Writer, s burnin.CampaignStatus) error {
	pr := newPrinter(w)
	if len(s.NodeStates) == 0 {
		return pr.err
	}
	pr.println("NODE\tSTEP\tSTATE\tVERDICT\tREASON")
	for _, n := range s.NodeStates {
		step := n.Step
		if step == "" && n.Steps > 0 {
			step = fmt.Sprintf("%d/%d steps", n.StepsDone, n.Steps)
		}
		pr.printf("%s\t%s\t%s\t%s\t%s\n", n.Node, orDash(step), n.State, orDash(string(n.Verdict)),
			orDash(firstNonEmpty(n.Reason, n.Waiting)))
	}
	return pr.err
}

func newBurninCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "burnin", Short: "Burn-in campaigns for new or repaired nodes: start, status, list, report, cancel"}
	cmd.AddCommand(specStartCmd("burnin", "Start a burn-in campaign from burnin.yaml",
		func(ctx context.Context, c pb.CampaignServiceClient, r *pb.SpecRequest) (*pb.CampaignStarted, error) {
			return c.BurninStart(ctx, r)
		}),
		idCmd("status", "A burn-in campaign's progress", func(cmd *cobra.Command, f *opFlags, id string) error {
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				rep, err := c.BurninStatus(ctx, &pb.CampaignRef{Id: id})
				if err != nil {
					return err
				}
				return printReply(cmd.OutOrStdout(), f, rep.GetDocument(), campaignpb.BurninStatusFrom(rep), func(w io.Writer, s burnin.CampaignStatus) error {
					if err := burninStatusTable(cmd.OutOrStdout())(w, []burnin.CampaignStatus{s}); err != nil {
						return err
					}
					return burninNodesTable(w, s)
				})
			})
		}),
		listCmd("Burn-in campaigns", func(cmd *cobra.Command, f *opFlags, ctx context.Context, c pb.CampaignServiceClient) error {
			rep, err := c.BurninList(ctx, &pb.CampaignListRequest{})
			if err != nil {
				return err
			}
			return printReply(cmd.OutOrStdout(), f, rep.GetDocument(), campaignpb.BurninListFrom(rep), burninStatusTable(cmd.OutOrStdout()))
		}),
		newBurninReportCmd(),
		newCancelCmd("cancel", "Cancel a burn-in campaign", func(ctx context.Context, c pb.CampaignServiceClient, r *pb.CampaignRef) ([]byte, any, error) {
			rep, err := c.BurninCancel(ctx, r)
			if err != nil {
				return nil, nil, err
			}
			return rep.GetDocument(), campaignpb.BurninStatusFrom(rep), nil
		}))
	return cmd
}

func newBurninReportCmd() *cobra.Command {
	var outTo string
	cmd := idCmd("report", "A campaign's acceptance report (-o table|json|html)", func(cmd *cobra.Command, f *opFlags, id string) error {
		return f.campaignCall([]string{"html"}, func(ctx context.Context, c pb.CampaignServiceClient) (rerr error) {
			format := "json"
			if f.output == "html" {
				format = "html"
			}
			doc, err := c.BurninReport(ctx, &pb.ReportRequest{Id: id, Format: format})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if outTo != "" && outTo != "-" {
				fh, err := os.Create(outTo)
				if err != nil {
					return fmt.Errorf("report: %w", err)
				}
				defer func() {
					if err := fh.Close(); err != nil && rerr == nil {
						rerr = fmt.Errorf("report: %w", err)
					}
				}()
				w = fh
			}
			if format == "html" {
				_, err = w.Write(doc.GetBody())
				return wrote(err)
			}
			return printDoc(w, f, doc.GetBody(), func(w io.Writer, r burnin.Report) error {
				return burninReportTable(w, cmd.OutOrStdout(), r)
			})
		})
	})
	cmd.Flags().StringVar(&outTo, "out", "", "write to FILE instead of stdout")
	return cmd
}

// burninReportTable is the campaign's line, then each node's verdict and
// why it was rejected.
func burninReportTable(w, term io.Writer, r burnin.Report) error {
	pr := newPrinter(w)
	if err := burninStatusTable(term)(w, []burnin.CampaignStatus{r.Campaign}); err != nil {
		return err
	}
	pr.println("NODE\tSKU\tSTATE\tVERDICT\tREASON")
	for _, n := range r.Nodes {
		pr.printf("%s\t%s\t%s\t%s\t%s\n", n.Node, orDash(n.SKU), n.State, orDash(string(n.Verdict)),
			orDash(firstNonEmpty(n.Reason, n.Note)))
	}
	return pr.err
}

// specStartCmd is `VERB start -f SPEC`.
func specStartCmd(what, short string, start func(context.Context, pb.CampaignServiceClient, *pb.SpecRequest) (*pb.CampaignStarted, error)) *cobra.Command {
	var (
		f    opFlags
		file string
	)
	cmd := &cobra.Command{
		Use: "start", Short: short, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := readSpec(file)
			if err != nil {
				return err
			}
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				st, err := start(ctx, c, &pb.SpecRequest{Spec: spec})
				if err != nil {
					return err
				}
				return printStarted(cmd.OutOrStdout(), &f, what, st)
			})
		},
	}
	f.register(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", what+" spec ("+what+".yaml)")
	return cmd
}

func listCmd(short string, run func(*cobra.Command, *opFlags, context.Context, pb.CampaignServiceClient) error) *cobra.Command {
	var f opFlags
	cmd := &cobra.Command{
		Use: "list", Short: short, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error { return run(cmd, &f, ctx, c) })
		},
	}
	f.register(cmd)
	return cmd
}

// newCancelCmd is a verb that stops a campaign: call returns the
// campaign's status after it (legacy: an older coordinator's document).
func newCancelCmd(verb, short string, call func(context.Context, pb.CampaignServiceClient, *pb.CampaignRef) (legacy []byte, status any, err error)) *cobra.Command {
	var reason string
	cmd := idCmd(verb, short, func(cmd *cobra.Command, f *opFlags, id string) error {
		return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
			legacy, st, err := call(ctx, c, &pb.CampaignRef{Id: id, Reason: reason})
			if err != nil {
				return err
			}
			if f.output == "json" {
				return printReply[any](cmd.OutOrStdout(), f, legacy, st, nil)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: %s requested\n", id, verb)
			return wrote(err)
		})
	})
	cmd.Flags().StringVar(&reason, "reason", "", "why (kept with the campaign and the audit log)")
	return cmd
}

// ---------------------------------------------------------------- drill

func drillTable(w io.Writer, l []drill.Drill) error {
	pr := newPrinter(w)
	pr.println("ID\tNAME\tFAULT\tSTATE\tTARGETS\tCREATED\tREASON")
	for _, d := range l {
		states := map[drill.TargetState]int{}
		for _, t := range d.Targets {
			states[t.State]++
		}
		pr.printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.ID, orDash(d.Name), d.Fault, d.State, countsLine(states),
			shortTime(d.CreatedAt), orDash(d.Reason))
	}
	return pr.err
}

func newDrillCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "drill", Short: "Fault-injection drills that measure detection and repair: start, status, list, report, abort"}
	cmd.AddCommand(specStartCmd("drill", "Start a drill from drill.yaml",
		func(ctx context.Context, c pb.CampaignServiceClient, r *pb.SpecRequest) (*pb.CampaignStarted, error) {
			return c.DrillStart(ctx, r)
		}),
		idCmd("status", "A drill and its targets", func(cmd *cobra.Command, f *opFlags, id string) error {
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				rep, err := c.DrillStatus(ctx, &pb.CampaignRef{Id: id})
				if err != nil {
					return err
				}
				d, err := campaignpb.DrillStatusFrom(rep)
				if err != nil {
					return badReply(err)
				}
				return printReply(cmd.OutOrStdout(), f, rep.GetDocument(), d, func(w io.Writer, d drill.Drill) error {
					pr := newPrinter(w)
					if err := drillTable(w, []drill.Drill{d}); err != nil {
						return err
					}
					pr.println("NODE\tSTATE\tINJECTED\tDETECTED\tBY")
					for _, t := range d.Targets {
						pr.printf("%s\t%s\t%s\t%s\t%s\n", t.Node, t.State, shortTime(t.InjectedAt), shortTime(t.DetectedAt), orDash(t.DetectedBy))
					}
					return pr.err
				})
			})
		}),
		listCmd("Drills", func(cmd *cobra.Command, f *opFlags, ctx context.Context, c pb.CampaignServiceClient) error {
			rep, err := c.DrillList(ctx, &pb.CampaignListRequest{})
			if err != nil {
				return err
			}
			l, err := campaignpb.DrillListFrom(rep)
			if err != nil {
				return badReply(err)
			}
			return printReply(cmd.OutOrStdout(), f, rep.GetDocument(), l, drillTable)
		}),
		newDrillReportCmd(),
		newCancelCmd("abort", "Abort a drill (injected faults are reverted)", func(ctx context.Context, c pb.CampaignServiceClient, r *pb.CampaignRef) ([]byte, any, error) {
			rep, err := c.DrillAbort(ctx, r)
			if err != nil {
				return nil, nil, err
			}
			d, err := campaignpb.DrillStatusFrom(rep)
			if err != nil {
				return nil, nil, badReply(err)
			}
			return rep.GetDocument(), d, nil
		}))
	return cmd
}

func newDrillReportCmd() *cobra.Command {
	var (
		f                           opFlags
		since, until, fault, bucket string
	)
	cmd := &cobra.Command{
		Use: "report", Short: "Time to detect and to repair per fault, over drills", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.campaignCall(nil, func(ctx context.Context, c pb.CampaignServiceClient) error {
				doc, err := c.DrillReport(ctx, &pb.DrillReportRequest{Since: since, Until: until, Fault: fault, Bucket: bucket})
				if err != nil {
					return err
				}
				if f.output == "json" {
					return printDoc[json.RawMessage](cmd.OutOrStdout(), &f, doc.GetBody(), nil)
				}
				var r drill.Report
				if err := json.Unmarshal(doc.GetBody(), &r); err != nil {
					return fmt.Errorf("coordinator sent bad JSON: %w", err)
				}
				return r.WriteTable(cmd.OutOrStdout())
			})
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&since, "since", "", "drills started at or after (RFC 3339)")
	fl.StringVar(&until, "until", "", "drills started before (RFC 3339)")
	fl.StringVar(&fault, "fault", "", "one fault kind")
	fl.StringVar(&bucket, "bucket", "", "trend period (default 168h)")
	return cmd
}
