package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

var events = campaigndb.EventLog{Table: "drill_events", Key: "drill_id", Index: "drill_events_drill", Noun: "drill"}

// schema is the drill_ tables. Version 2 writes times in campaigndb's
// fixed width.
var schema = campaigndb.Schema{Name: "drill", Current: `
CREATE TABLE IF NOT EXISTS drill_drills (
	id          TEXT    NOT NULL PRIMARY KEY,
	seq         INTEGER NOT NULL,
	name        TEXT    NOT NULL,
	fault       TEXT    NOT NULL,
	spec        TEXT    NOT NULL, -- JSON, defaults filled in
	state       TEXT    NOT NULL,
	reason      TEXT    NOT NULL,
	degraded    TEXT    NOT NULL, -- JSON array: nodes degraded at start
	created_at  TEXT    NOT NULL,
	updated_at  TEXT    NOT NULL,
	finished_at TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS drill_drills_state ON drill_drills(state);
CREATE INDEX IF NOT EXISTS drill_drills_created ON drill_drills(created_at);
CREATE TABLE IF NOT EXISTS drill_targets (
	drill_id   TEXT NOT NULL,
	node       TEXT NOT NULL,
	state      TEXT NOT NULL,
	data       TEXT NOT NULL, -- JSON Target
	updated_at TEXT NOT NULL,
	PRIMARY KEY (drill_id, node)
);
` + events.DDL(), Steps: []campaigndb.Step{{
	What: "times in fixed width",
	Up: func(ctx context.Context, tx *sqldb.Tx) error {
		return errors.Join(
			campaigndb.RewriteTimes(ctx, tx, "drill_drills", "created_at", "updated_at", "finished_at"),
			campaigndb.RewriteTimes(ctx, tx, "drill_targets", "updated_at"),
			campaigndb.RewriteTimes(ctx, tx, "drill_events", "at"))
	},
}}}

// Errors, tested with errors.Is.
var (
	ErrNotFound     = errors.New("no such drill")
	ErrSchemaTooNew = campaigndb.ErrSchemaTooNew
	ErrFinished     = errors.New("drill already finished")
)

const drillCols = `id, name, fault, spec, state, reason, degraded, created_at, updated_at, finished_at`

func scanDrill(sc interface{ Scan(...any) error }) (Drill, error) {
	var d Drill
	var spec, state, degraded, created, updated, finished string
	if err := sc.Scan(&d.ID, &d.Name, &d.Fault, &spec, &state, &d.Reason, &degraded, &created, &updated, &finished); err != nil {
		return d, err
	}
	d.Spec = &Spec{}
	if err := json.Unmarshal([]byte(spec), d.Spec); err != nil {
		return d, fmt.Errorf("drill %s spec: %w", d.ID, err)
	}
	if err := json.Unmarshal([]byte(degraded), &d.Degraded); err != nil {
		return d, fmt.Errorf("drill %s: %w", d.ID, err)
	}
	d.State = State(state)
	d.CreatedAt, d.UpdatedAt, d.FinishedAt = campaigndb.ParseTime(created), campaigndb.ParseTime(updated), campaigndb.ParseTime(finished)
	return d, nil
}

// loadDrills reads drills (where filters them) with their targets.
func loadDrills(ctx context.Context, q querier, where string, args ...any) ([]Drill, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+drillCols+` FROM drill_drills `+where+` ORDER BY seq`, args...)
	if err != nil {
		return nil, fmt.Errorf("list drills: %w", err)
	}
	var out []Drill
	for rows.Next() {
		d, err := scanDrill(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("list drills: %w", err)
		}
		out = append(out, d)
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return nil, fmt.Errorf("list drills: %w", err)
	}
	for i := range out {
		ts, err := loadTargets(ctx, q, out[i].ID)
		if err != nil {
			return nil, err
		}
		out[i].Targets = ts
	}
	return out, nil
}

func loadDrill(ctx context.Context, q querier, id string) (Drill, error) {
	ds, err := loadDrills(ctx, q, `WHERE id = ?`, id)
	if err != nil {
		return Drill{}, err
	}
	if len(ds) == 0 {
		return Drill{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return ds[0], nil
}

func loadTargets(ctx context.Context, q querier, id string) ([]Target, error) {
	rows, err := q.QueryContext(ctx, `SELECT data FROM drill_targets WHERE drill_id = ? ORDER BY node`, id)
	if err != nil {
		return nil, fmt.Errorf("drill %s targets: %w", id, err)
	}
	defer rows.Close()
	var out []Target
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("drill %s targets: %w", id, err)
		}
		var t Target
		if err := json.Unmarshal([]byte(data), &t); err != nil {
			return nil, fmt.Errorf("drill %s targets: %w", id, err)
		}
		if t.Findings == nil {
			t.Findings = []Finding{}
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("drill %s targets: %w", id, err)
	}
	return out, nil
}

func saveTarget(ctx context.Context, q querier, id string, t Target, now time.Time) error {
	if _, err := q.ExecContext(ctx, `UPDATE drill_targets SET state = ?, data = ?, updated_at = ? WHERE drill_id = ? AND node = ?`,
		string(t.State), campaigndb.JSON(t), campaigndb.Time(now), id, t.Node); err != nil {
		return fmt.Errorf("drill %s target %s: %w", id, t.Node, err)
	}
	return nil
}

// Event is one line of a drill's history.
type Event = campaigndb.Event

type querier = campaigndb.Querier
