package burnin

import (
	"context"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
)

// burninV1 is the previous release's schema, verbatim.
const burninV1 = `
CREATE TABLE IF NOT EXISTS burnin_schema_version (
	version    INTEGER NOT NULL PRIMARY KEY,
	applied_at TEXT    NOT NULL
);
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
CREATE TABLE IF NOT EXISTS burnin_events (
	id          INTEGER PRIMARY KEY,
	campaign_id TEXT    NOT NULL,
	node        TEXT    NOT NULL,
	at          TEXT    NOT NULL,
	what        TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS burnin_events_campaign ON burnin_events(campaign_id, id);
`

// A coordinator upgraded in place keeps its running burn-ins: a campaign
// half done under the previous release's tables (variable-width times)
// opens with this release's code, its times rewritten to the fixed width,
// and finishes with every run attempted once.
func TestUpgradeKeepsRunningCampaign(t *testing.T) {
	h := newHarness(t, 4)
	h.setSKUBaselines()
	id := h.start(standardSpec)
	ctx := context.Background()
	for range 3 {
		if _, err := h.eng.Step(ctx); err != nil {
			t.Fatal(err)
		}
	}
	before, err := h.eng.Status(ctx, id)
	if err != nil || before.RunsDone == 0 || before.RunsDone == before.RunsTotal {
		t.Fatalf("before the upgrade: %d/%d runs, %v", before.RunsDone, before.RunsTotal, err)
	}
	old := map[string]dbtest.Conv{"created_at": dbtest.OldText, "updated_at": dbtest.OldText, "finished_at": dbtest.OldText,
		"since": dbtest.OldText, "drained_at": dbtest.OldText, "started_at": dbtest.OldText, "at": dbtest.OldText}
	tables := []string{"burnin_campaigns", "burnin_nodes", "burnin_runs", "burnin_parts", "burnin_events"}
	conv := map[string]map[string]dbtest.Conv{}
	for _, tb := range tables {
		conv[tb] = old
	}
	dbtest.Downgrade(t, h.db, "burnin", burninV1, tables, conv)
	var created string
	if err := h.db.QueryRowContext(ctx, `SELECT created_at FROM burnin_campaigns WHERE id = ?`, id).Scan(&created); err != nil {
		t.Fatal(err)
	}

	e2 := h.newEngine(nil) // the upgraded coordinator starts
	if v := dbtest.Version(t, h.db, "burnin"); v != schema.Version() {
		t.Fatalf("schema version %d after the upgrade, want %d", v, schema.Version())
	}
	var rewritten string
	if err := h.db.QueryRowContext(ctx, `SELECT created_at FROM burnin_campaigns WHERE id = ?`, id).Scan(&rewritten); err != nil {
		t.Fatal(err)
	}
	if len(rewritten) != len("2006-01-02T15:04:05.000000000Z") || !before.CreatedAt.Equal(parseOr(t, rewritten)) {
		t.Errorf("created_at %q (was %q) after the upgrade, want %v in the fixed width", rewritten, created, before.CreatedAt)
	}
	after, err := e2.Status(ctx, id)
	if err != nil || after.State != StateRunning || after.RunsDone != before.RunsDone || !after.CreatedAt.Equal(before.CreatedAt) {
		t.Fatalf("after the upgrade: %+v, %v; before %+v", after, err, before)
	}
	h.finish(e2)
	r, err := e2.Report(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if r.Campaign.State != StateDone || r.Campaign.Accepted != 4 {
		t.Fatalf("the kept campaign ended %s with %d accepted", r.Campaign.State, r.Campaign.Accepted)
	}
	for _, n := range r.Nodes {
		for _, run := range n.Runs {
			if run.Attempts != 1 {
				t.Errorf("%s run %d (%s) attempted %d times", n.Node, run.Seq, run.Step, run.Attempts)
			}
		}
	}
}

func parseOr(t *testing.T, s string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return at
}
