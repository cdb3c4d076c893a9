package membership

import (
	"sync"

	"github.com/hashicorp/memberlist"
)

// metaDelegate hands memberlist this member's encoded Meta. fleetcheck sends
// nothing else over gossip: results and commands travel on the agent stream.
type metaDelegate struct {
	p *Pool
}

var _ memberlist.Delegate = metaDelegate{}

func (d metaDelegate) NodeMeta(int) []byte {
	// UpdateMeta and New already held the meta to MaxMetaSize, which is
	// the limit memberlist passes here.
	return d.p.localMeta()
}

func (metaDelegate) NotifyMsg([]byte)                {}
func (metaDelegate) GetBroadcasts(int, int) [][]byte { return nil }
func (metaDelegate) LocalState(bool) []byte          { return nil }
func (metaDelegate) MergeRemoteState([]byte, bool)   {}

// eventDelegate receives memberlist's node events. memberlist calls it while
// holding its node lock, so it only records the change and queues the event.
type eventDelegate struct {
	p *Pool
}

var _ memberlist.EventDelegate = eventDelegate{}

func (d eventDelegate) NotifyJoin(n *memberlist.Node)   { d.p.observe(eventJoined, n) }
func (d eventDelegate) NotifyLeave(n *memberlist.Node)  { d.p.observe(eventLeft, n) }
func (d eventDelegate) NotifyUpdate(n *memberlist.Node) { d.p.observe(eventUpdated, n) }

type eventKind int

const (
	eventJoined eventKind = iota
	eventLeft
	eventUpdated
)

type event struct {
	kind   eventKind
	member Member
}

// eventQueue delivers events to the consumer on its own goroutine, in order.
// It is unbounded on purpose: dropping a NodeLeft would leave a node marked
// reachable, and blocking would stall memberlist under its node lock.
type eventQueue struct {
	handler Events
	mu      sync.Mutex
	pending []event
	closed  bool
	wake    chan struct{}
	done    chan struct{}
}

func newEventQueue(h Events) *eventQueue {
	q := &eventQueue{handler: h, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go q.run()
	return q
}

func (q *eventQueue) push(e event) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.pending = append(q.pending, e)
	q.mu.Unlock()
	q.signal()
}

func (q *eventQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *eventQueue) run() {
	defer close(q.done)
	for {
		q.mu.Lock()
		batch, closed := q.pending, q.closed
		q.pending = nil
		q.mu.Unlock()
		for _, e := range batch {
			switch e.kind {
			case eventJoined:
				q.handler.NodeJoined(e.member)
			case eventLeft:
				q.handler.NodeLeft(e.member)
			case eventUpdated:
				q.handler.NodeUpdated(e.member)
			}
		}
		if len(batch) > 0 {
			continue
		}
		if closed {
			return
		}
		<-q.wake
	}
}

// close delivers what is queued, then stops the goroutine.
func (q *eventQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.signal()
	<-q.done
}
