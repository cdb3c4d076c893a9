package coordinator

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"sync"
	"time"

	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// actionTable holds the RunAction calls waiting for their agent, by
// action id, so that an ActionStatus on any stream of that node (the
// agent may reconnect while its action runs) finds its call.
type actionTable struct {
	mu sync.Mutex
	m  map[string]*pendingAction
}

// pendingAction is one RunAction waiting for its answers.
type pendingAction struct {
	id, node string
	// updates receives each status; buffered so the stream's receiver
	// never waits on the caller.
	updates chan *pb.ActionStatus
}

func newActionTable() *actionTable { return &actionTable{m: map[string]*pendingAction{}} }

func (t *actionTable) add(id, node string) *pendingAction {
	p := &pendingAction{id: id, node: node, updates: make(chan *pb.ActionStatus, 8)}
	t.mu.Lock()
	t.m[id] = p
	t.mu.Unlock()
	return p
}

// drop removes p unless another call took its id over since.
func (t *actionTable) drop(p *pendingAction) {
	t.mu.Lock()
	if t.m[p.id] == p {
		delete(t.m, p.id)
	}
	t.mu.Unlock()
}

// status hands an agent's ActionStatus to its call: only from the node the
// action went to, and never blocking the stream (an ACCEPTED dropped from
// a full buffer costs nothing: the final status decides).
func (t *actionTable) status(node string, st *pb.ActionStatus) {
	t.mu.Lock()
	p := t.m[st.GetActionId()]
	t.mu.Unlock()
	if p == nil || p.node != node {
		return
	}
	select {
	case p.updates <- st:
	default:
	}
}

// actionIDRE is what the agent takes as an action id.
var actionIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// newActionID makes an action id an operator can read in the agent's log.
func newActionID(now time.Time) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Sprintf("a-%s", now.UTC().Format("20060102T150405.000000000"))
	}
	return fmt.Sprintf("a-%s-%s", now.UTC().Format("20060102T150405"), hex.EncodeToString(b[:]))
}
