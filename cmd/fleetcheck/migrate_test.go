//go:build !node

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/coordinator/store"
	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// fillStore gives a data directory a small fleet's history: nodes with
// inventories, results, events, dispatches, a baseline and a campaign
// engine's own table.
func fillStore(t *testing.T, dir string) store.Counts {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, store.Options{Dir: dir, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	at := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	for n := 0; n < 4; n++ {
		node := fmt.Sprintf("gpu-%03d", n)
		inv := &report.Inventory{DriverVersion: "550.54.15", GPUs: []report.GPU{{Index: 0, Serial: "S" + node}}}
		if _, _, err := st.NodeJoined(ctx, store.Join{Node: node, Labels: map[string]string{"rack": "r1"}, Inventory: inv,
			AgentVersion: "1.0", ProtocolVersion: "1", At: at, InitialState: "healthy"}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 30; i++ {
			r := store.Result{ID: fmt.Sprintf("%s-r%d", node, i), Node: node, Started: at, Finished: at.Add(time.Duration(i) * time.Minute),
				Status: report.Pass, Full: i%2 == 0, Trigger: "schedule", Checks: []report.CheckResult{
					{Name: "gpu.ecc", Status: report.Pass, DurationMS: 1.25, Metrics: map[string]float64{"gpu0.ecc.sbe": float64(i)}},
					{Name: "ib.ports", Status: report.Warn, Reason: "port 2 at 200 Gb/s", Findings: []report.Finding{{Severity: report.SevWarn, Component: "mlx5_1", Code: "LINK_DEGRADED", Message: "it's slow"}}},
				}}
			if _, err := st.Ingest(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := st.SetNodeState(ctx, store.StateChange{Node: node, State: "draining", Reason: "burn-in", Actor: "alice", At: at.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.RecordDispatch(ctx, "w-1", []string{"gpu-000", "gpu-001"}, at); err != nil {
		t.Fatal(err)
	}
	db, err := st.OpenSQLDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	bl, err := baselines.NewSQLStore(db)
	if err != nil {
		t.Fatal(err)
	}
	st2, _ := baselines.NewStats([]float64{470, 480, 490})
	if _, err := bl.Set(ctx, baselines.Baseline{Key: baselines.Key{Metric: baselines.MetricAllReduceBusBW, Scope: baselines.NodeScope("gpu-000")},
		Direction: baselines.HigherBetter, Samples: st2, Who: "alice"}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE demo_campaign_steps (id INTEGER PRIMARY KEY AUTOINCREMENT, campaign TEXT NOT NULL, node TEXT NOT NULL, state BLOB, at INTEGER NOT NULL)`,
		`CREATE INDEX demo_campaign_steps_campaign ON demo_campaign_steps(campaign, id)`,
		`INSERT INTO demo_campaign_steps (campaign, node, state, at) VALUES ('c1', 'gpu-000', x'00ff', 1), ('c1', 'gpu-001', NULL, 2)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	c, err := st.Count(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCoordinatorMigrateToPostgres: `coordinator migrate` moves every
// table of a data directory into PostgreSQL, where a store opened on it
// answers as the SQLite one did; a second run is refused, --replace
// redoes it, and a directory a coordinator holds is refused.
func TestCoordinatorMigrateToPostgres(t *testing.T) {
	if !pgtest.Available() {
		pgtest.Shared(t) // skips loudly (fails under CI=true)
	}
	ctx := context.Background()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	name, err := srv.CreateDB(ctx, "migrate")
	if err != nil {
		t.Fatal(err)
	}
	to := srv.URLFor(name)
	dir := t.TempDir()
	want := fillStore(t, dir)

	out, code := execute(t, "coordinator", "migrate", "--from", "sqlite:"+dir, "--to", to)
	if code != 0 {
		t.Fatalf("migrate: exit %d\n%s", code, out)
	}
	for _, s := range []string{"check_results", "demo_campaign_steps", "table created from the SQLite schema", "baselines", "migrated "} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}

	src, err := store.Open(ctx, store.Options{Dir: dir, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	pg, err := store.Open(ctx, store.Options{URL: to, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	got, err := pg.Count(ctx)
	if err != nil || got != want {
		t.Fatalf("PostgreSQL holds %+v (%v), SQLite held %+v", got, err, want)
	}
	same := func(what string, a, b any) {
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s differ:\nsqlite   %+v\npostgres %+v", what, a, b)
		}
	}
	an, _ := src.Nodes(ctx)
	bn, _ := pg.Nodes(ctx)
	same("nodes", an, bn)
	ar, _ := src.Results(ctx, store.ResultQuery{Node: "gpu-002", Limit: 100})
	br, _ := pg.Results(ctx, store.ResultQuery{Node: "gpu-002", Limit: 100})
	same("results", ar, br)
	ae, _ := src.Events(ctx, store.EventQuery{Limit: 100})
	be, _ := pg.Events(ctx, store.EventQuery{Limit: 100})
	same("events", ae, be)
	ah, _ := src.InventoryHistory(ctx, "gpu-001")
	bh, _ := pg.InventoryHistory(ctx, "gpu-001")
	same("inventory history", ah, bh)
	as, _ := src.Summaries(ctx, "gpu-003", "")
	bs, _ := pg.Summaries(ctx, "gpu-003", "")
	same("summaries", as, bs)
	if len(an) != 4 || len(ar) != 60 || len(ae) == 0 || len(ah) != 1 || len(as) != 2 {
		t.Errorf("compared too little: %d nodes, %d check results, %d events, %d inventories, %d summaries",
			len(an), len(ar), len(ae), len(ah), len(as))
	}
	if ok, err := pg.Dispatched(ctx, "w-1", "gpu-001"); !ok || err != nil {
		t.Errorf("dispatch not moved: %v %v", ok, err)
	}
	// The moved store goes on: new events number after the old ones.
	if err := pg.AddEvent(ctx, store.Event{Kind: store.EventAudit, Message: "after the move"}); err != nil {
		t.Fatal(err)
	}
	if ev, _ := pg.Events(ctx, store.EventQuery{Limit: 1}); len(ev) != 1 || ev[0].ID != ae[len(ae)-1].ID+1 {
		t.Errorf("event after the move: %+v, want id %d", ev, ae[len(ae)-1].ID+1)
	}
	pdb, err := sqldb.Open(ctx, to, sqldb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pdb.Close()
	bl, err := baselines.NewSQLStore(pdb)
	if err != nil {
		t.Fatal(err)
	}
	b, err := bl.Get(ctx, baselines.Key{Metric: baselines.MetricAllReduceBusBW, Scope: baselines.NodeScope("gpu-000")})
	if err != nil || b.Samples.Median != 480 || b.Who != "alice" {
		t.Errorf("baseline after the move: %+v %v", b, err)
	}
	var raw []byte
	if err := pdb.QueryRowContext(ctx, `SELECT state FROM demo_campaign_steps WHERE node = ?`, "gpu-000").Scan(&raw); err != nil || string(raw) != "\x00\xff" {
		t.Errorf("campaign table row: %v %v", raw, err)
	}

	// While a coordinator holds the directory: refused.
	out, code = execute(t, "coordinator", "migrate", "--from", dir, "--to", to, "--replace")
	if code == 0 || !strings.Contains(out, "stop the coordinator") {
		t.Errorf("migrate of a held directory: exit %d\n%s", code, out)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	out, code = execute(t, "coordinator", "migrate", "--from", dir, "--to", to)
	if code == 0 || !strings.Contains(out, "not empty") {
		t.Errorf("migrate onto a filled target: exit %d\n%s", code, out)
	}
	out, code = execute(t, "coordinator", "migrate", "--from", dir, "--to", to, "--replace")
	if code != 0 {
		t.Errorf("migrate --replace: exit %d\n%s", code, out)
	}
	for _, bad := range [][]string{
		{"--to", to},
		{"--from", dir},
		{"--from", dir, "--to", "sqlite:/tmp/x.db"},
		{"--from", to, "--to", to},
		{"--from", t.TempDir(), "--to", to},
	} {
		if out, code := execute(t, append([]string{"coordinator", "migrate"}, bad...)...); code == 0 {
			t.Errorf("migrate %v accepted:\n%s", bad, out)
		}
	}
}

// TestCoordinatorMigrateBackToSQLite: the way back. A fleet moved to
// PostgreSQL stores more there; `coordinator migrate --from postgres://
// --to DIR --replace` brings every table back into the SQLite file it came
// from, checked by counts and checksums, and the rows stored on
// PostgreSQL in between come along. A new SQLite file that lacks a table
// (a campaign engine's) is refused, naming it, and so is a filled one
// without --replace.
func TestCoordinatorMigrateBackToSQLite(t *testing.T) {
	if !pgtest.Available() {
		pgtest.Shared(t) // skips loudly (fails under CI=true)
	}
	ctx := context.Background()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	name, err := srv.CreateDB(ctx, "back")
	if err != nil {
		t.Fatal(err)
	}
	pgURL := srv.URLFor(name)
	dir := t.TempDir()
	fillStore(t, dir)
	if out, code := execute(t, "coordinator", "migrate", "--from", dir, "--to", pgURL); code != 0 {
		t.Fatalf("migrate to PostgreSQL: exit %d\n%s", code, out)
	}

	// The fleet runs on PostgreSQL for a while.
	pg, err := store.Open(ctx, store.Options{URL: pgURL, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	for i := 0; i < 5; i++ {
		r := store.Result{ID: fmt.Sprintf("on-pg-%d", i), Node: "gpu-001", Started: at, Finished: at.Add(time.Duration(i) * time.Minute),
			Status: report.Pass, Full: true, Checks: []report.CheckResult{{Name: "gpu.ecc", Status: report.Pass, DurationMS: 2}}}
		if _, err := pg.Ingest(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := pg.AddEvent(ctx, store.Event{Kind: store.EventAudit, Message: "on PostgreSQL"}); err != nil {
		t.Fatal(err)
	}
	want, err := pg.Count(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantResults, _ := pg.Results(ctx, store.ResultQuery{Node: "gpu-001", Limit: 100})
	wantEvents, _ := pg.Events(ctx, store.EventQuery{Limit: 100})
	wantNodes, _ := pg.Nodes(ctx)
	if err := pg.Close(); err != nil {
		t.Fatal(err)
	}

	fresh := t.TempDir()
	out, code := execute(t, "coordinator", "migrate", "--from", pgURL, "--to", fresh)
	if code == 0 || !strings.Contains(out, "demo_campaign_steps") || !strings.Contains(out, "start a coordinator") {
		t.Errorf("migrate into a SQLite file without the campaign table: exit %d\n%s", code, out)
	}
	out, code = execute(t, "coordinator", "migrate", "--from", pgURL, "--to", dir)
	if code == 0 || !strings.Contains(out, "not empty") {
		t.Errorf("migrate back without --replace: exit %d\n%s", code, out)
	}
	out, code = execute(t, "coordinator", "migrate", "--from", pgURL, "--to", "sqlite:"+filepath.Join(dir, store.FileName), "--replace")
	if code != 0 {
		t.Fatalf("migrate back: exit %d\n%s", code, out)
	}
	for _, s := range []string{"check_results", "demo_campaign_steps", "same rows on both sides", "migrated "} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}

	back, err := store.Open(ctx, store.Options{Dir: dir, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	got, err := back.Count(ctx)
	if err != nil || got != want {
		t.Fatalf("SQLite holds %+v (%v), PostgreSQL held %+v", got, err, want)
	}
	gotResults, _ := back.Results(ctx, store.ResultQuery{Node: "gpu-001", Limit: 100})
	gotEvents, _ := back.Events(ctx, store.EventQuery{Limit: 100})
	gotNodes, _ := back.Nodes(ctx)
	for _, c := range []struct {
		what      string
		got, want any
	}{{"results", gotResults, wantResults}, {"events", gotEvents, wantEvents}, {"nodes", gotNodes, wantNodes}} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s differ:\npostgres %+v\nsqlite   %+v", c.what, c.want, c.got)
		}
	}
	if len(gotResults) != 2*30+5 {
		t.Errorf("gpu-001 has %d check results back, want 65", len(gotResults))
	}
	if r, err := back.Result(ctx, "on-pg-4"); err != nil || r.Node != "gpu-001" {
		t.Errorf("a result stored on PostgreSQL: %+v %v", r, err)
	}
	// And goes on: a result sent again is a duplicate, new events number on.
	if a, err := back.Ingest(ctx, store.Result{ID: "on-pg-4", Node: "gpu-001", Status: report.Pass}); err != nil || !a.Duplicate {
		t.Errorf("a result stored on PostgreSQL, sent again: %+v %v", a, err)
	}
	if err := back.AddEvent(ctx, store.Event{Kind: store.EventAudit, Message: "back on SQLite"}); err != nil {
		t.Fatal(err)
	}
	if ev, _ := back.Events(ctx, store.EventQuery{Limit: 1}); len(ev) != 1 || ev[0].ID != wantEvents[len(wantEvents)-1].ID+1 {
		t.Errorf("event after the way back: %+v, want id %d", ev, wantEvents[len(wantEvents)-1].ID+1)
	}
	sdb, err := back.OpenSQLDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	var raw []byte
	if err := sdb.QueryRowContext(ctx, `SELECT state FROM demo_campaign_steps WHERE node = ?`, "gpu-000").Scan(&raw); err != nil || string(raw) != "\x00\xff" {
		t.Errorf("campaign table row: %v %v", raw, err)
	}
	// Stored order is rowid order again (retention walks it), not the
	// ids' order (r10 before r2): the first stored first, the rows stored
	// on PostgreSQL last.
	var first, last string
	if err := sdb.QueryRowContext(ctx, `SELECT group_concat(id, ' ') FROM (SELECT id FROM results ORDER BY rowid LIMIT 3)`).Scan(&first); err != nil ||
		first != "gpu-000-r0 gpu-000-r1 gpu-000-r2" {
		t.Errorf("first results in rowid order: %q %v", first, err)
	}
	if err := sdb.QueryRowContext(ctx, `SELECT id FROM results ORDER BY rowid DESC LIMIT 1`).Scan(&last); err != nil || last != "on-pg-4" {
		t.Errorf("last result in rowid order: %q %v, want on-pg-4", last, err)
	}
}
