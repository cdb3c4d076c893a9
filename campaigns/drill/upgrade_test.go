package drill

import (
	"context"
	"testing"

	"github.com/fleetcheck/fleetcheck/campaigns/kit"
	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
)

// drillV1 is the previous release's schema, verbatim.
const drillV1 = `
CREATE TABLE IF NOT EXISTS drill_schema_version (
	version    INTEGER NOT NULL PRIMARY KEY,
	applied_at TEXT    NOT NULL
);
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
CREATE TABLE IF NOT EXISTS drill_events (
	id       INTEGER PRIMARY KEY,
	drill_id TEXT NOT NULL,
	node     TEXT NOT NULL,
	at       TEXT NOT NULL,
	what     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS drill_events_drill ON drill_events(drill_id, id);
`

// A coordinator upgraded in place keeps its running drills: a drill
// watching its injected fault under the previous release's tables opens
// with this release's code and finishes, the fault injected once.
func TestUpgradeKeepsRunningDrill(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 4, "gpu-002")
	id := h.start(xidDrill)
	h.run(h.eng, func() bool { return h.drill(id).Targets[0].State == TargetWatching })
	before := h.drill(id)
	old := map[string]dbtest.Conv{"created_at": dbtest.OldText, "updated_at": dbtest.OldText, "finished_at": dbtest.OldText, "at": dbtest.OldText}
	tables := []string{"drill_drills", "drill_targets", "drill_events"}
	dbtest.Downgrade(t, h.db, "drill", drillV1, tables, map[string]map[string]dbtest.Conv{
		"drill_drills": old, "drill_targets": old, "drill_events": old})

	e2, err := New(context.Background(), kit.Deps{DB: openDB(t, h.path), Fleet: h.fleet, Drainer: h.fleet.drain, Clock: h.fleet.clock, Logger: h.eng.log}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if v := dbtest.Version(t, h.db, "drill"); v != schema.Version() {
		t.Fatalf("schema version %d after the upgrade, want %d", v, schema.Version())
	}
	d, err := e2.Get(context.Background(), id)
	if err != nil || d.State != StateRunning || !d.CreatedAt.Equal(before.CreatedAt) || d.Targets[0].State != TargetWatching {
		t.Fatalf("after the upgrade: %+v, %v", d, err)
	}
	h.run(e2, nil)
	if d, err = e2.Get(context.Background(), id); err != nil || d.State != StateDone || h.fleet.actionCount("gpu-002", "xid-inject") != 1 {
		t.Fatalf("the kept drill ended %s (%v), injected %d times", d.State, err, h.fleet.actionCount("gpu-002", "xid-inject"))
	}
}
