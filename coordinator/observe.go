package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/wire"
)

// The coordinator's fleet keeps what agents report on their own schedule
// (its stored results): drills time detection by it.
var _ kit.Observer = (*fleet)(nil)

// observeRows bounds the rows read per check or per interval estimate.
const observeRows = 64

// Observed returns each named check's latest result on node that the
// agent ran on its own schedule (no work id: not a campaign's request;
// not the pass after an action, which a real fault never triggers) and
// that finished at or after since.
func (f *fleet) Observed(ctx context.Context, node string, checks []string, since time.Time) ([]kit.Observation, error) {
	db := f.s.Store()
	if db == nil {
		return nil, errors.New("observed: coordinator not started")
	}
	var out []kit.Observation
	for _, c := range checks {
		rows, err := db.Results(ctx, store.ResultQuery{Node: node, Check: c, Limit: observeRows})
		if err != nil {
			return nil, fmt.Errorf("observed %s on %s: %w", c, node, err)
		}
		for _, r := range rows { // newest first
			if r.Finished.Before(since) {
				break
			}
			if scheduled(r) {
				out = append(out, kit.Observation{Check: r.Check, At: r.Finished})
				break
			}
		}
	}
	return out, nil
}

// scheduled: the agent's schedule ran the pass. An old agent says nothing
// ("") and its passes without a work id count as scheduled: there is no
// better signal.
func scheduled(r store.StoredCheck) bool {
	switch r.Trigger {
	case wire.TriggerSchedule:
		return true
	case "":
		return r.WorkID == ""
	}
	return false
}

// CheckInterval is the longest gap between the node's latest scheduled
// results (0 with fewer than two); passes after an action are left out
// (an old agent's still shorten a gap, never lengthen it).
func (f *fleet) CheckInterval(ctx context.Context, node string) (time.Duration, error) {
	db := f.s.Store()
	if db == nil {
		return 0, errors.New("check interval: coordinator not started")
	}
	rows, err := db.Results(ctx, store.ResultQuery{Node: node, Limit: observeRows * 4})
	if err != nil {
		return 0, fmt.Errorf("check interval of %s: %w", node, err)
	}
	var times []time.Time
	seen := map[string]bool{}
	for _, r := range rows {
		if !scheduled(r) || seen[r.ResultID] {
			continue
		}
		seen[r.ResultID] = true
		times = append(times, r.Finished)
		if len(times) == 6 {
			break
		}
	}
	var gap time.Duration
	for i := 1; i < len(times); i++ {
		gap = max(gap, times[i-1].Sub(times[i]))
	}
	if gap >= 2*time.Second {
		return gap.Round(time.Second), nil
	}
	return gap.Round(100 * time.Millisecond), nil
}
