package coordinator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetcheck/fleetcheck/internal/membership"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// keyOpWait bounds how long a key round waits for the agents' answers.
const keyOpWait = 15 * time.Second

// keyOpTable routes GossipKeyStatus answers to the round waiting for them.
type keyOpTable struct {
	mu sync.Mutex
	m  map[string]*keyRound
}

type keyRound struct {
	nodes   map[string]bool // who the op went to
	answers chan keyAnswer  // buffered for every node: the receiver never waits
}

type keyAnswer struct {
	node string
	st   *pb.GossipKeyStatus
}

func newKeyOpTable() *keyOpTable { return &keyOpTable{m: map[string]*keyRound{}} }

// status hands an agent's answer to its round: only from a node the op
// went to, at most once per node.
func (t *keyOpTable) status(node string, st *pb.GossipKeyStatus) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.m[st.GetOpId()]
	if r == nil || !r.nodes[node] {
		return
	}
	delete(r.nodes, node)
	r.answers <- keyAnswer{node: node, st: st}
}

func (t *keyOpTable) add(id string, nodes []string) *keyRound {
	r := &keyRound{nodes: make(map[string]bool, len(nodes)), answers: make(chan keyAnswer, len(nodes))}
	for _, n := range nodes {
		r.nodes[n] = true
	}
	t.mu.Lock()
	t.m[id] = r
	t.mu.Unlock()
	return r
}

func (t *keyOpTable) remove(id string) {
	t.mu.Lock()
	delete(t.m, id)
	t.mu.Unlock()
}

// GossipMembers lists the coordinator's view of the pool.
func (o *operatorService) GossipMembers(ctx context.Context, _ *pb.GossipMembersRequest) (*pb.GossipMembersResponse, error) {
	pool := o.s.gossip.Load()
	if pool == nil {
		return &pb.GossipMembersResponse{}, nil
	}
	resp := &pb.GossipMembersResponse{Enabled: true}
	for _, m := range pool.Members() {
		resp.Members = append(resp.Members, &pb.GossipMember{Name: m.Name, Addr: m.Addr, State: m.State.String(),
			Role: m.Meta.Role, Labels: m.Meta.Labels, AgentVersion: m.Meta.AgentVersion})
	}
	return resp, nil
}

// GossipKeys runs one round of a keyring rotation on the coordinator and
// every connected agent with gossip, or lists the coordinator's keys. The
// coordinator installs a key first (so it reads whatever agents send next)
// and switches to or removes one last, and only when every agent did.
func (o *operatorService) GossipKeys(ctx context.Context, req *pb.GossipKeysRequest) (*pb.GossipKeysResponse, error) {
	s := o.s
	pool := s.gossip.Load()
	if pool == nil {
		return nil, status.Error(codes.FailedPrecondition, "gossip is off on the coordinator")
	}
	if pool.Keys() == nil {
		return nil, status.Error(codes.FailedPrecondition, "gossip encryption is off: start every member with a gossip.keyring_file to rotate keys")
	}
	op := req.GetOp()
	if op == pb.GossipKeyOp_OP_UNSPECIFIED {
		return &pb.GossipKeysResponse{KeyFingerprints: membership.Fingerprints(pool.Keys())}, nil
	}
	if s.cfg.Insecure {
		return nil, status.Error(codes.FailedPrecondition, "gossip keys travel over the agent streams: rotation needs mTLS, and this coordinator is insecure")
	}
	key := req.GetKey()
	switch len(key) {
	case 16, 24, 32:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "a gossip key is 16, 24 or 32 bytes, not %d", len(key))
	}
	verb := strings.ToLower(strings.TrimPrefix(op.String(), "OP_"))
	actor := ActorFrom(ctx)
	fp := membership.Fingerprint(key)
	detail := "key " + fp
	if r := req.GetReason(); r != "" {
		detail += ": " + r
	}
	if err := s.Audit(ctx, actor, "gossip.key."+verb, detail); err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}

	apply := func() error {
		switch op {
		case pb.GossipKeyOp_OP_INSTALL:
			return pool.InstallKey(key)
		case pb.GossipKeyOp_OP_USE:
			return pool.UseKey(key)
		case pb.GossipKeyOp_OP_REMOVE:
			return pool.RemoveKey(key)
		}
		return fmt.Errorf("unknown op %v", op)
	}
	if op == pb.GossipKeyOp_OP_INSTALL {
		if err := apply(); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "coordinator: %v", err)
		}
	}
	nodes := s.keyRound(ctx, op, key)
	resp := &pb.GossipKeysResponse{Nodes: nodes}
	for _, n := range nodes {
		if n.GetError() == "" {
			resp.Applied++
		} else {
			resp.Failed++
		}
	}
	if op != pb.GossipKeyOp_OP_INSTALL {
		if resp.Failed > 0 {
			resp.KeyFingerprints = membership.Fingerprints(pool.Keys())
			s.auditKeyRound(ctx, actor, verb, fp, resp, "coordinator unchanged")
			return resp, nil
		}
		if err := apply(); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "coordinator: %v", err)
		}
	}
	if err := membership.WriteKeyringFile(filepath.Join(s.cfg.DataDir, gossipKeyringFile), pool.Keys()); err != nil {
		s.log.Error().Err(err).Msg("gossip keyring not saved: a restart would start with the old keys")
	}
	resp.KeyFingerprints = membership.Fingerprints(pool.Keys())
	s.auditKeyRound(ctx, actor, verb, fp, resp, "coordinator applied")
	return resp, nil
}

func (s *Server) auditKeyRound(ctx context.Context, actor, verb, fp string, resp *pb.GossipKeysResponse, coord string) {
	msg := fmt.Sprintf("key %s: %d agents applied, %d failed; %s", fp, resp.Applied, resp.Failed, coord)
	var failed []string
	for _, n := range resp.Nodes {
		if n.GetError() != "" && len(failed) < 5 {
			failed = append(failed, n.GetNode()+": "+n.GetError())
		}
	}
	if len(failed) > 0 {
		msg += " (" + strings.Join(failed, "; ") + ")"
	}
	if err := s.Audit(ctx, actor, "gossip.key."+verb+".done", msg); err != nil {
		s.log.Error().Err(err).Msg("audit gossip key round")
	}
}

// keyRound sends the op to every connected agent with gossip and waits for
// their answers. Alive agent members with no such stream are listed as
// failed: the key could not reach them.
func (s *Server) keyRound(ctx context.Context, op pb.GossipKeyOp_Op, key []byte) []*pb.GossipKeyNodeStatus {
	var targets []*session
	reached := map[string]bool{}
	for _, sess := range s.reg.sessions() {
		// Only an agent that said it gossips is sent key ops: older agents
		// never set gossip_addr, so no version gate is needed.
		if sess.gossip != "" {
			targets = append(targets, sess)
			reached[sess.node] = true
		}
	}
	var out []*pb.GossipKeyNodeStatus
	if pool := s.gossip.Load(); pool != nil {
		for _, m := range pool.Members() {
			if m.State == membership.StateAlive && m.Meta.Role == membership.RoleAgent && !reached[m.Name] {
				out = append(out, &pb.GossipKeyNodeStatus{Node: m.Name, Error: "no agent stream with gossip: key not delivered"})
			}
		}
	}
	id := newOpID()
	names := make([]string, len(targets))
	for i, x := range targets {
		names[i] = x.node
	}
	round := s.keyOps.add(id, names)
	defer s.keyOps.remove(id)
	msg := &pb.CoordinatorMessage{Msg: &pb.CoordinatorMessage_GossipKey{GossipKey: &pb.GossipKeyOp{OpId: id, Op: op, Key: key}}}
	waiting := map[string]bool{}
	for _, x := range targets {
		if x.trySend(msg) {
			waiting[x.node] = true
		} else {
			out = append(out, &pb.GossipKeyNodeStatus{Node: x.node, Error: "send queue full or stream closing"})
		}
	}
	t := time.NewTimer(keyOpWait)
	defer t.Stop()
	for len(waiting) > 0 {
		select {
		case a := <-round.answers:
			delete(waiting, a.node)
			out = append(out, &pb.GossipKeyNodeStatus{Node: a.node, Error: a.st.GetError()})
		case <-t.C:
			for n := range waiting {
				out = append(out, &pb.GossipKeyNodeStatus{Node: n, Error: fmt.Sprintf("no answer within %s", keyOpWait)})
			}
			waiting = nil
		case <-ctx.Done():
			for n := range waiting {
				out = append(out, &pb.GossipKeyNodeStatus{Node: n, Error: "operator call ended before the answer"})
			}
			waiting = nil
		}
	}
	slices.SortFunc(out, func(a, b *pb.GossipKeyNodeStatus) int { return strings.Compare(a.GetNode(), b.GetNode()) })
	return out
}

func newOpID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "key-" + hex.EncodeToString(b[:])
}
