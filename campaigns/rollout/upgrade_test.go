package rollout

import (
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb/dbtest"
)

// rolloutV1 is the previous release's schema, verbatim: times as unix
// milliseconds.
const rolloutV1 = `
CREATE TABLE IF NOT EXISTS rollout_schema_version (
	version    INTEGER PRIMARY KEY,
	applied_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS rollout_runs (
	id           TEXT PRIMARY KEY,
	name         TEXT NOT NULL DEFAULT '',
	spec         TEXT NOT NULL,
	plan         TEXT NOT NULL,
	phase        TEXT NOT NULL,
	wave         INTEGER NOT NULL DEFAULT 0,
	paused       INTEGER NOT NULL DEFAULT 0,
	paused_at    INTEGER NOT NULL DEFAULT 0,
	pause_reason TEXT NOT NULL DEFAULT '',
	soak_until   INTEGER NOT NULL DEFAULT 0,
	accepted     INTEGER NOT NULL DEFAULT 0,
	halt_reason  TEXT NOT NULL DEFAULT '',
	evidence     TEXT NOT NULL DEFAULT '[]',
	created      INTEGER NOT NULL,
	updated      INTEGER NOT NULL,
	finished     INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS rollout_nodes (
	rollout       TEXT NOT NULL,
	node          TEXT NOT NULL,
	wave          INTEGER NOT NULL,
	seq           INTEGER NOT NULL,
	state         TEXT NOT NULL,
	since         INTEGER NOT NULL,
	deadline      INTEGER NOT NULL DEFAULT 0,
	op            TEXT NOT NULL DEFAULT 'upgrade',
	from_driver   TEXT NOT NULL DEFAULT '',
	drained_by_us INTEGER NOT NULL DEFAULT 0,
	drained_at    INTEGER NOT NULL DEFAULT 0,
	after_undrain TEXT NOT NULL DEFAULT '',
	baseline      REAL NOT NULL DEFAULT 0,
	baseline_from TEXT NOT NULL DEFAULT '',
	pre           TEXT NOT NULL DEFAULT '',
	hold          TEXT NOT NULL DEFAULT '',
	reason        TEXT NOT NULL DEFAULT '',
	evidence      TEXT NOT NULL DEFAULT '[]',
	upgrades      INTEGER NOT NULL DEFAULT 0,
	PRIMARY KEY (rollout, node)
);
CREATE TABLE IF NOT EXISTS rollout_events (
	id      INTEGER PRIMARY KEY,
	rollout TEXT NOT NULL,
	time    INTEGER NOT NULL,
	node    TEXT NOT NULL DEFAULT '',
	kind    TEXT NOT NULL,
	from_state TEXT NOT NULL DEFAULT '',
	to_state   TEXT NOT NULL DEFAULT '',
	message TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS rollout_events_by_rollout ON rollout_events (rollout, id);
`

// A coordinator upgraded in place keeps its running rollouts: a rollout
// half done under the previous release's tables (times in unix ms) opens
// with this release's code, its times intact, and runs to its end.
func TestUpgradeKeepsRunningRollout(t *testing.T) {
	h := newHarness(t, 5)
	spec := baseSpec()
	spec.Waves = []Amount{Percent(100)}
	id := h.start(spec)
	for range 3 { // some nodes move on; the rollout is mid-way
		if err := h.eng.Step(h.ctx); err != nil {
			t.Fatal(err)
		}
		h.eng.waitOps()
		h.clock.advance(h.tick)
	}
	before := h.status(id)
	if settled(before) {
		t.Fatal("the rollout settled before the upgrade: nothing would be kept")
	}
	hist, err := h.eng.History(h.ctx, id, "", 1000)
	if err != nil || len(hist) == 0 {
		t.Fatalf("history before: %d events, %v", len(hist), err)
	}
	dbtest.Downgrade(t, h.db, "rollout", rolloutV1, []string{"rollout_runs", "rollout_nodes", "rollout_events"},
		map[string]map[string]dbtest.Conv{
			"rollout_runs":   {"paused_at": dbtest.OldMillis, "soak_until": dbtest.OldMillis, "created": dbtest.OldMillis, "updated": dbtest.OldMillis, "finished": dbtest.OldMillis},
			"rollout_nodes":  {"since": dbtest.OldMillis, "deadline": dbtest.OldMillis, "drained_at": dbtest.OldMillis},
			"rollout_events": {"time": dbtest.OldMillis},
		})
	var created int64
	if err := h.db.QueryRowContext(h.ctx, `SELECT created FROM rollout_runs WHERE id = ?`, id).Scan(&created); err != nil || created != before.Created.UnixMilli() {
		t.Fatalf("the downgraded table does not hold unix ms: %d, %v", created, err)
	}

	h.eng = h.newEngine() // the upgraded coordinator starts
	if v := dbtest.Version(t, h.db, "rollout"); v != schema.Version() {
		t.Fatalf("schema version %d after the upgrade, want %d", v, schema.Version())
	}
	after := h.status(id)
	if after.Phase != before.Phase || !after.Created.Equal(before.Created.Truncate(time.Millisecond)) || len(after.Nodes) != len(before.Nodes) {
		t.Fatalf("after the upgrade: phase %s created %v nodes %d; before: %s %v %d",
			after.Phase, after.Created, len(after.Nodes), before.Phase, before.Created, len(before.Nodes))
	}
	for i, n := range after.Nodes {
		if n.State != before.Nodes[i].State || !n.Since.Equal(before.Nodes[i].Since.Truncate(time.Millisecond)) {
			t.Errorf("node %s: %s since %v, was %s since %v", n.Node, n.State, n.Since, before.Nodes[i].State, before.Nodes[i].Since)
		}
	}
	hist2, err := h.eng.History(h.ctx, id, "", 1000)
	if err != nil || len(hist2) != len(hist) || !hist2[0].Time.Equal(hist[0].Time.Truncate(time.Millisecond)) {
		t.Fatalf("history after the upgrade: %d events (was %d), %v", len(hist2), len(hist), err)
	}
	for i := 0; i < 400 && !settled(h.status(id)); i++ {
		if err := h.eng.Step(h.ctx); err != nil {
			t.Fatal(err)
		}
		h.eng.waitOps()
		h.clock.advance(h.tick)
	}
	if s := h.status(id); s.Phase != PhaseCompleted {
		t.Fatalf("the kept rollout ended %s (%s), want completed", s.Phase, s.HaltReason)
	}
}
