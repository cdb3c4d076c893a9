//go:build !node

package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/fleetcheck/fleetcheck/internal/membership"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

func newGossipCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "gossip",
		Short: "The gossip pool: members, keyring rotation, new keys",
		Long: "Agents and the coordinator gossip (hashicorp/memberlist) so that a dead or partitioned node is " +
			"marked unreachable within seconds. Gossip is a hint only: it never drains a node, decides a result " +
			"or changes a campaign.",
	}
	cmd.AddCommand(newGossipMembersCmd(), newGossipKeysCmd(), newGossipKeygenCmd())
	return cmd
}

func newGossipMembersCmd() *cobra.Command {
	var f opFlags
	cmd := &cobra.Command{
		Use:   "members",
		Short: "List the gossip pool's members as the coordinator sees them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, done, err := f.client()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			resp, err := c.GossipMembers(ctx, &pb.GossipMembersRequest{})
			if err != nil {
				return f.rpcError(err)
			}
			if f.output == "json" {
				return writeJSON(cmd.OutOrStdout(), resp)
			}
			if !resp.GetEnabled() {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), "gossip is off on the coordinator (no gossip.bind in its config)")
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			pr := newPrinter(tw)
			pr.println("NAME\tSTATE\tROLE\tADDR\tVERSION\tLABELS")
			for _, m := range resp.GetMembers() {
				pr.printf("%s\t%s\t%s\t%s\t%s\t%s\n", m.GetName(), m.GetState(), m.GetRole(), m.GetAddr(),
					orDash(m.GetAgentVersion()), labelList(m.GetLabels()))
			}
			return pr.flush(tw)
		},
	}
	f.register(cmd)
	return cmd
}

func newGossipKeysCmd() *cobra.Command {
	var (
		f      opFlags
		reason string
	)
	cmd := &cobra.Command{
		Use:   "keys list | install KEY | use KEY | remove KEY",
		Short: "Rotate the gossip keyring on the coordinator and every agent (needs mTLS)",
		Long: "A rotation is three rounds, each finished everywhere before the next: install the new key, " +
			"use it (make it primary), remove the old one. KEY is base64 (fleetcheck gossip keygen); '-' reads it " +
			"from stdin. The coordinator installs first and switches or removes last, only when every agent did; " +
			"a round with failures lists them and exits 1: fix those nodes and repeat it.",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ops := map[string]pb.GossipKeyOp_Op{"list": pb.GossipKeyOp_OP_UNSPECIFIED, "install": pb.GossipKeyOp_OP_INSTALL,
				"use": pb.GossipKeyOp_OP_USE, "remove": pb.GossipKeyOp_OP_REMOVE}
			op, ok := ops[args[0]]
			if !ok {
				return fmt.Errorf("unknown keys verb %q: list, install, use or remove", args[0])
			}
			req := &pb.GossipKeysRequest{Op: op, Reason: reason}
			switch {
			case op == pb.GossipKeyOp_OP_UNSPECIFIED && len(args) > 1:
				return fmt.Errorf("keys list takes no key")
			case op != pb.GossipKeyOp_OP_UNSPECIFIED:
				if len(args) != 2 {
					return fmt.Errorf("keys %s needs a KEY (base64; '-' reads stdin)", args[0])
				}
				key, err := readKey(args[1])
				if err != nil {
					return err
				}
				req.Key = key
			}
			c, done, err := f.client()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(cmd.Context(), callTimeout)
			defer cancel()
			resp, err := c.GossipKeys(ctx, req)
			if err != nil {
				return f.rpcError(err)
			}
			if f.output == "json" {
				if err := writeJSON(cmd.OutOrStdout(), resp); err != nil {
					return err
				}
			} else if err := printKeyRound(cmd, args[0], resp); err != nil {
				return err
			}
			if resp.GetFailed() > 0 {
				// On stderr, beside the exit status that already says so.
				_, _ = fmt.Fprintf(cmd.ErrOrStderr(), "fleetcheck: %s failed on %d node(s): fix them and repeat this round before the next\n", args[0], resp.GetFailed())
				return errChecksFailed
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log")
	return cmd
}

func printKeyRound(cmd *cobra.Command, verb string, resp *pb.GossipKeysResponse) error {
	pr := newPrinter(cmd.OutOrStdout())
	pr.println("coordinator keys (fingerprints, primary first):")
	for _, fp := range resp.GetKeyFingerprints() {
		pr.println("  " + fp)
	}
	if verb == "list" {
		return pr.err
	}
	pr.printf("%s: applied on %d agent(s), failed on %d\n", verb, resp.GetApplied(), resp.GetFailed())
	nodes := resp.GetNodes()
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].GetNode() < nodes[j].GetNode() })
	for _, n := range nodes {
		if n.GetError() != "" {
			pr.printf("  %s: %s\n", n.GetNode(), n.GetError())
		}
	}
	return pr.err
}

// readKey reads a base64 key from the argument or, for "-", stdin: a key
// on the command line lands in shell history.
func readKey(arg string) ([]byte, error) {
	s := arg
	if arg == "-" {
		b, err := io.ReadAll(io.LimitReader(os.Stdin, 4096))
		if err != nil {
			return nil, fmt.Errorf("read key from stdin: %w", err)
		}
		s = string(b)
	}
	keys, err := membership.ParseKeyring([]byte(strings.TrimSpace(s)))
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	if len(keys) != 1 {
		return nil, fmt.Errorf("key: give one key, not %d", len(keys))
	}
	return keys[0], nil
}

func newGossipKeygenCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keygen",
		Short: "Print a new random 32-byte gossip key (base64), for a keyring file or a rotation",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key := make([]byte, 32)
			if _, err := rand.Read(key); err != nil {
				return err
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), base64.StdEncoding.EncodeToString(key))
			return err
		},
	}
}

func labelList(l map[string]string) string {
	if len(l) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}
