package burnin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb"
)

// NodeRun is one burn-in campaign's verdict on one node.
type NodeRun struct {
	Campaign string    `json:"campaign"`
	Name     string    `json:"name"`
	Level    Level     `json:"level"`
	State    NodeState `json:"state"`
	Verdict  Verdict   `json:"verdict,omitempty"` // "" while the campaign runs
	// Reason sums up a rejection (RejectSummary).
	Reason string `json:"reason,omitempty"`
	// At is when the campaign finished, else the node's last change.
	At time.Time `json:"at"`
}

// maxNodeHistory bounds NodeHistory: an RMA carries the latest runs.
const maxNodeHistory = 50

// NodeHistory lists the burn-in campaigns that tested node, newest first
// (at most 50): the burn-in history an RMA record carries.
func (e *Engine) NodeHistory(ctx context.Context, node string) ([]NodeRun, error) {
	rows, err := e.db.QueryContext(ctx, `SELECT c.id, c.name, c.spec, c.finished_at, n.state, n.verdict, n.evidence, n.updated_at
		FROM burnin_nodes n JOIN burnin_campaigns c ON c.id = n.campaign_id
		WHERE n.node = ? ORDER BY c.seq DESC LIMIT ?`, node, maxNodeHistory)
	if err != nil {
		return nil, fmt.Errorf("burn-in history of %s: %w", node, err)
	}
	defer rows.Close()
	out := []NodeRun{}
	for rows.Next() {
		var r NodeRun
		var spec, finished, state, verdict, ev, updated string
		if err := rows.Scan(&r.Campaign, &r.Name, &spec, &finished, &state, &verdict, &ev, &updated); err != nil {
			return nil, fmt.Errorf("burn-in history of %s: %w", node, err)
		}
		r.State, r.Verdict = NodeState(state), Verdict(verdict)
		var sp Spec
		if err := json.Unmarshal([]byte(spec), &sp); err == nil {
			r.Level = sp.Level
		}
		if ev != "" && ev != "null" {
			var e Evidence
			if err := json.Unmarshal([]byte(ev), &e); err == nil {
				r.Reason = RejectSummary(&e)
			}
		}
		r.At = campaigndb.ParseTime(finished)
		if r.At.IsZero() {
			r.At = campaigndb.ParseTime(updated)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("burn-in history of %s: %w", node, err)
	}
	return out, nil
}
