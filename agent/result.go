package agent

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/wire"
	fleetcheckv1 "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Result is one inspection pass as the agent keeps it in its spool: the
// report plus what the coordinator needs to file it. It is the spool's JSON;
// the protobuf form exists only at the stream.
type Result struct {
	ID       string        `json:"id"`
	Node     string        `json:"node"`
	WorkID   string        `json:"work_id,omitempty"` // empty for the agent's own schedule
	Started  time.Time     `json:"started"`
	Finished time.Time     `json:"finished"`
	Full     bool          `json:"full"`              // every passive check ran
	Trigger  string        `json:"trigger,omitempty"` // wire.Trigger*: what started the pass
	Report   report.Report `json:"report"`
}

// NewResultID returns a fresh id: 12 hex digits of milliseconds since the
// epoch, then 20 random hex digits. Ids sort by creation time (handy in the
// spool and the store) and never collide across restarts or nodes.
func NewResultID(now time.Time) string {
	var b [16]byte
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(now.UnixMilli()))
	copy(b[:6], ms[2:])
	// crypto/rand.Read never fails (Go 1.24+: it aborts the process instead).
	_, _ = rand.Read(b[6:])
	return hex.EncodeToString(b[:])
}

// toProto converts a result for the wire, its metrics in the form the
// coordinator reads.
func (r *Result) toProto(form wire.Form) *fleetcheckv1.Result {
	return wire.ResultToProto(wire.Meta{
		ID: r.ID, Node: r.Node, WorkID: r.WorkID, Started: r.Started, Finished: r.Finished, Full: r.Full,
		Trigger: r.Trigger,
	}, &r.Report, form)
}

func activityToProto(a Activity) fleetcheckv1.NodeActivity {
	switch a {
	case ActivityBusy:
		return fleetcheckv1.NodeActivity_NODE_ACTIVITY_BUSY
	case ActivityIdle:
		return fleetcheckv1.NodeActivity_NODE_ACTIVITY_IDLE
	case ActivityDrained:
		return fleetcheckv1.NodeActivity_NODE_ACTIVITY_DRAINED
	}
	return fleetcheckv1.NodeActivity_NODE_ACTIVITY_UNSPECIFIED
}
