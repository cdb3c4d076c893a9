package burnin

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

var events = campaigndb.EventLog{Table: "burnin_events", Key: "campaign_id", Index: "burnin_events_campaign", Noun: "campaign"}

// schema is the burnin_ tables. Version 2 writes times in campaigndb's
// fixed width.
var schema = campaigndb.Schema{Name: "burnin", Current: `
CREATE TABLE IF NOT EXISTS burnin_campaigns (
	id          TEXT    NOT NULL PRIMARY KEY,
	seq         INTEGER NOT NULL,
	name        TEXT    NOT NULL,
	spec        TEXT    NOT NULL, -- JSON, defaults filled in
	state       TEXT    NOT NULL,
	phase       TEXT    NOT NULL,
	reason      TEXT    NOT NULL,
	sku_done    INTEGER NOT NULL DEFAULT 0, -- SKU baselines recorded
	created_at  TEXT    NOT NULL,
	updated_at  TEXT    NOT NULL,
	finished_at TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS burnin_nodes (
	campaign_id   TEXT    NOT NULL,
	node          TEXT    NOT NULL,
	state         TEXT    NOT NULL,
	drained_by_us INTEGER NOT NULL,
	attempts      INTEGER NOT NULL, -- drain attempts
	labels        TEXT    NOT NULL,
	inventory     TEXT    NOT NULL,
	sku           TEXT    NOT NULL,
	verdict       TEXT    NOT NULL,
	evidence      TEXT    NOT NULL,
	baseline_done INTEGER NOT NULL DEFAULT 0,
	note          TEXT    NOT NULL,
	updated_at    TEXT    NOT NULL,
	since         TEXT    NOT NULL, -- when the node entered its state
	drained_at    TEXT    NOT NULL DEFAULT '', -- for the breaker's window
	PRIMARY KEY (campaign_id, node)
);
CREATE TABLE IF NOT EXISTS burnin_runs (
	campaign_id TEXT    NOT NULL,
	seq         INTEGER NOT NULL,
	node        TEXT    NOT NULL,
	peers       TEXT    NOT NULL, -- JSON array
	rep         INTEGER NOT NULL,
	step        TEXT    NOT NULL,
	kind        TEXT    NOT NULL,
	round       INTEGER NOT NULL,
	state       TEXT    NOT NULL,
	attempts    INTEGER NOT NULL,
	status      TEXT    NOT NULL,
	outcome     TEXT    NOT NULL,
	error       TEXT    NOT NULL,
	started_at  TEXT    NOT NULL,
	finished_at TEXT    NOT NULL,
	result      TEXT    NOT NULL, -- JSON RunResult
	PRIMARY KEY (campaign_id, seq)
);
CREATE INDEX IF NOT EXISTS burnin_runs_node ON burnin_runs(campaign_id, node, seq);
CREATE TABLE IF NOT EXISTS burnin_parts (
	identity      TEXT    NOT NULL,
	campaign_id   TEXT    NOT NULL,
	node          TEXT    NOT NULL,
	kind          TEXT    NOT NULL,
	component     TEXT    NOT NULL,
	identity_kind TEXT    NOT NULL,
	verdict       TEXT    NOT NULL,
	implicated    INTEGER NOT NULL,
	reason        TEXT    NOT NULL,
	at            TEXT    NOT NULL,
	PRIMARY KEY (identity, campaign_id, node)
);
` + events.DDL(), Steps: []campaigndb.Step{{
	What: "times in fixed width",
	Up: func(ctx context.Context, tx *sqldb.Tx) error {
		return errors.Join(
			campaigndb.RewriteTimes(ctx, tx, "burnin_campaigns", "created_at", "updated_at", "finished_at"),
			campaigndb.RewriteTimes(ctx, tx, "burnin_nodes", "updated_at", "since", "drained_at"),
			campaigndb.RewriteTimes(ctx, tx, "burnin_runs", "started_at", "finished_at"),
			campaigndb.RewriteTimes(ctx, tx, "burnin_parts", "at"),
			campaigndb.RewriteTimes(ctx, tx, "burnin_events", "at"))
	},
}}}

// Errors, tested with errors.Is.
var (
	ErrNotFound     = errors.New("no such burn-in campaign")
	ErrSchemaTooNew = campaigndb.ErrSchemaTooNew
	ErrNoNodes      = errors.New("the selector matches no node")
	ErrFinished     = errors.New("campaign already finished")
)

// campaignRow is one burnin_campaigns row.
type campaignRow struct {
	ID         string
	Seq        int64
	Name       string
	Spec       *Spec
	State      State
	Phase      Phase
	Reason     string
	SKUDone    bool
	CreatedAt  time.Time
	UpdatedAt  time.Time
	FinishedAt time.Time
}

const campaignCols = `id, seq, name, spec, state, phase, reason, sku_done, created_at, updated_at, finished_at`

func scanCampaign(sc interface{ Scan(...any) error }) (campaignRow, error) {
	var c campaignRow
	var spec, state, phase, created, updated, finished string
	var skuDone int
	if err := sc.Scan(&c.ID, &c.Seq, &c.Name, &spec, &state, &phase, &c.Reason, &skuDone, &created, &updated, &finished); err != nil {
		return c, err
	}
	c.Spec = &Spec{}
	if err := json.Unmarshal([]byte(spec), c.Spec); err != nil {
		return c, fmt.Errorf("campaign %s: stored spec: %w", c.ID, err)
	}
	c.State, c.Phase, c.SKUDone = State(state), Phase(phase), skuDone != 0
	c.CreatedAt, c.UpdatedAt, c.FinishedAt = campaigndb.ParseTime(created), campaigndb.ParseTime(updated), campaigndb.ParseTime(finished)
	return c, nil
}

func getCampaign(ctx context.Context, q querier, id string) (campaignRow, error) {
	c, err := scanCampaign(q.QueryRowContext(ctx, `SELECT `+campaignCols+` FROM burnin_campaigns WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return c, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return c, fmt.Errorf("read campaign %s: %w", id, err)
	}
	return c, nil
}

func listCampaigns(ctx context.Context, q querier, where string, args ...any) ([]campaignRow, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+campaignCols+` FROM burnin_campaigns `+where+` ORDER BY seq`, args...)
	if err != nil {
		return nil, fmt.Errorf("list campaigns: %w", err)
	}
	defer rows.Close()
	var out []campaignRow
	for rows.Next() {
		c, err := scanCampaign(rows)
		if err != nil {
			return nil, fmt.Errorf("list campaigns: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list campaigns: %w", err)
	}
	return out, nil
}

// nodeRow is one burnin_nodes row.
type nodeRow struct {
	Node         string
	State        NodeState
	DrainedByUs  bool
	Attempts     int
	Labels       map[string]string
	Inventory    report.Inventory
	SKU          string
	Verdict      Verdict
	Evidence     *Evidence
	BaselineDone bool
	Note         string
	UpdatedAt    time.Time
}

const nodeCols = `node, state, drained_by_us, attempts, labels, inventory, sku, verdict, evidence, baseline_done, note, updated_at`

func scanNode(sc interface{ Scan(...any) error }) (nodeRow, error) {
	var n nodeRow
	var state, labels, inv, verdict, ev, updated string
	var drained, bdone int
	if err := sc.Scan(&n.Node, &state, &drained, &n.Attempts, &labels, &inv, &n.SKU, &verdict, &ev, &bdone, &n.Note, &updated); err != nil {
		return n, err
	}
	n.State, n.DrainedByUs, n.Verdict, n.BaselineDone = NodeState(state), drained != 0, Verdict(verdict), bdone != 0
	n.UpdatedAt = campaigndb.ParseTime(updated)
	if err := json.Unmarshal([]byte(labels), &n.Labels); err != nil {
		return n, fmt.Errorf("node %s labels: %w", n.Node, err)
	}
	if err := json.Unmarshal([]byte(inv), &n.Inventory); err != nil {
		return n, fmt.Errorf("node %s inventory: %w", n.Node, err)
	}
	if ev != "" && ev != "null" {
		n.Evidence = &Evidence{}
		if err := json.Unmarshal([]byte(ev), n.Evidence); err != nil {
			return n, fmt.Errorf("node %s evidence: %w", n.Node, err)
		}
	}
	return n, nil
}

func listNodes(ctx context.Context, q querier, id string) ([]nodeRow, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+nodeCols+` FROM burnin_nodes WHERE campaign_id = ? ORDER BY node`, id)
	if err != nil {
		return nil, fmt.Errorf("campaign %s nodes: %w", id, err)
	}
	defer rows.Close()
	var out []nodeRow
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, fmt.Errorf("campaign %s nodes: %w", id, err)
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("campaign %s nodes: %w", id, err)
	}
	return out, nil
}

const runCols = `seq, node, peers, rep, step, kind, round, state, attempts, status, outcome, error, started_at, finished_at, result`

func scanRun(sc interface{ Scan(...any) error }, withResult bool) (Run, error) {
	var r Run
	var peers, kind, status, started, finished, result string
	if err := sc.Scan(&r.Seq, &r.Node, &peers, &r.Repeat, &r.Step, &kind, &r.Round, &r.State, &r.Attempts,
		&status, &r.Outcome, &r.Error, &started, &finished, &result); err != nil {
		return r, err
	}
	r.Kind, r.Status = StepKind(kind), report.Status(status)
	r.StartedAt, r.FinishedAt = campaigndb.ParseTime(started), campaigndb.ParseTime(finished)
	if err := json.Unmarshal([]byte(peers), &r.Peers); err != nil {
		return r, fmt.Errorf("run %d peers: %w", r.Seq, err)
	}
	if withResult && result != "" {
		if err := json.Unmarshal([]byte(result), &r.Result); err != nil {
			return r, fmt.Errorf("run %d result: %w", r.Seq, err)
		}
	}
	return r, nil
}

// listRuns reads a campaign's runs; where narrows them ("AND node = ?").
func listRuns(ctx context.Context, q querier, id string, withResult bool, where string, args ...any) ([]Run, error) {
	cols := runCols
	if !withResult {
		// The result is the bulk of a row: leave it out when unused.
		cols = `seq, node, peers, rep, step, kind, round, state, attempts, status, outcome, error, started_at, finished_at, ''`
	}
	rows, err := q.QueryContext(ctx, `SELECT `+cols+` FROM burnin_runs WHERE campaign_id = ? `+where+` ORDER BY seq`,
		append([]any{id}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("campaign %s runs: %w", id, err)
	}
	defer rows.Close()
	var out []Run
	for rows.Next() {
		r, err := scanRun(rows, withResult)
		if err != nil {
			return nil, fmt.Errorf("campaign %s runs: %w", id, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("campaign %s runs: %w", id, err)
	}
	return out, nil
}

func insertRun(ctx context.Context, q querier, id string, r Run) error {
	peers := r.Peers
	if peers == nil {
		peers = []string{}
	}
	_, err := q.ExecContext(ctx, `INSERT INTO burnin_runs (campaign_id, `+runCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		id, r.Seq, r.Node, campaigndb.JSON(peers), r.Repeat, r.Step, string(r.Kind), r.Round, RunPending, 0, "", "", "", "", "", "{}")
	if err != nil {
		return fmt.Errorf("plan run %d of %s: %w", r.Seq, id, err)
	}
	return nil
}

// Event is one line of a campaign's history.
type Event = campaigndb.Event

type querier = campaigndb.Querier
