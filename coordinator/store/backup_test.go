package store

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// fillFleet stores what a small fleet leaves in every table the store
// has: nodes joined with inventories (history), full results from several
// writers' nodes (check results, newest statuses, summaries), a changed
// inventory, events.
func fillFleet(t *testing.T, s *Store) {
	t.Helper()
	ctx := context.Background()
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for n := range 12 {
		node := fmt.Sprintf("node-%02d", n)
		inv := &report.Inventory{DriverVersion: "550.54.15", GPUs: []report.GPU{{Index: 0, Serial: node + "-S0", MemoryTotalMiB: 81559}}}
		if _, _, err := s.NodeJoined(ctx, Join{Node: node, Labels: map[string]string{"sku": "h100"}, Inventory: inv, At: at,
			InitialState: "initializing", InitialReason: "waiting"}); err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			if i == 4 { // a GPU swapped: a second history row
				inv = &report.Inventory{DriverVersion: "550.54.15", GPUs: []report.GPU{{Index: 0, Serial: node + "-S1", MemoryTotalMiB: 81559}}}
			}
			if _, err := s.Ingest(ctx, fullResult(fmt.Sprintf("%s-r%d", node, i), node, at.Add(time.Duration(i)*time.Minute), inv)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AddEvent(ctx, Event{Time: at, Node: node, Kind: "state", Message: "healthy"}); err != nil {
			t.Fatal(err)
		}
	}
}

func tableSums(t *testing.T, s *Store) []sqldb.TableSum {
	t.Helper()
	db, err := s.OpenSQLDB(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sums, err := db.TableSums(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return sums
}

// The backup and restore docs/store.md gives for PostgreSQL: the real
// pg_dump of a store, pg_restore into a fresh server, and every table
// holds the same rows (the counts and checksums coordinator migrate
// compares). The restored store then goes on: a result stored before is
// still answered as a duplicate, new rows number after the restored ones.
func TestPgDumpRestoreKeepsEveryRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := open(t, pgtest.URL(t), nil)
	defer src.Close()
	fillFleet(t, src)
	before := tableSums(t, src)
	byTable := map[string]sqldb.TableSum{}
	for _, ts := range before {
		byTable[ts.Table] = ts
	}
	for table, want := range map[string]int64{"results": 60, "check_results": 60 * 13, "nodes": 12, "inventory_history": 24} {
		if got := byTable[table].Rows; got != want {
			t.Fatalf("%s holds %d rows before the dump, want %d", table, got, want)
		}
	}
	if byTable["events"].Rows < 12 || byTable["node_checks"].Rows != 12*13 { // summaries come with retention (schema 8)
		t.Fatalf("tables before the dump: %+v", before)
	}

	srv := pgtest.Shared(t)
	dump := filepath.Join(t.TempDir(), "fleetcheck.dump")
	if out, err := exec.CommandContext(ctx, srv.Tool("pg_dump"), "--format=custom", "--file="+dump, "--dbname="+srcURL(src)).CombinedOutput(); err != nil {
		t.Fatalf("pg_dump: %v\n%s", err, out)
	}

	// A fresh server, as after losing the database's machine.
	fresh, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	name, err := fresh.CreateDB(ctx, "restored")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, fresh.Tool("pg_restore"), "--exit-on-error", "--no-owner",
		"--dbname="+fresh.URLFor(name), dump).CombinedOutput(); err != nil {
		t.Fatalf("pg_restore: %v\n%s", err, out)
	}
	dst := open(t, fresh.URLFor(name), nil)
	defer dst.Close()
	if after := tableSums(t, dst); !reflect.DeepEqual(after, before) {
		t.Fatalf("restored tables differ:\nbefore %+v\nafter  %+v", before, after)
	}

	old := fullResult("node-03-r2", "node-03", time.Now(), nil)
	if a, err := dst.Ingest(ctx, old); err != nil || !a.Duplicate {
		t.Fatalf("a result stored before the dump, sent again: %+v %v, want a duplicate", a, err)
	}
	if a, err := dst.Ingest(ctx, fullResult("after-restore", "node-03", time.Now(), nil)); err != nil || a.Duplicate {
		t.Fatalf("a new result after the restore: %+v %v", a, err)
	}
	if err := dst.AddEvent(ctx, Event{Time: time.Now(), Kind: "restored"}); err != nil {
		t.Fatalf("an event after the restore (identity sequence): %v", err)
	}
	evs, err := dst.Events(ctx, EventQuery{Limit: 1})
	if err != nil || len(evs) != 1 || evs[0].Kind != "restored" || evs[0].ID <= byTable["events"].Rows {
		t.Fatalf("newest event after the restore: %+v %v", evs, err)
	}
}

func srcURL(s *Store) string { return s.opts.URL }

// A SQLite backup (coordinator backup) of a store at rest holds the same
// rows in every table, by the same counts and checksums.
func TestSQLiteBackupKeepsEveryRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := open(t, t.TempDir(), nil)
	defer src.Close()
	fillFleet(t, src)
	out := t.TempDir()
	if err := src.Backup(ctx, filepath.Join(out, FileName)); err != nil {
		t.Fatal(err)
	}
	before := tableSums(t, src)
	dst := open(t, out, nil)
	defer dst.Close()
	if after := tableSums(t, dst); !reflect.DeepEqual(after, before) {
		t.Fatalf("backup's tables differ:\nsource %+v\nbackup %+v", before, after)
	}
}

// Several writers on PostgreSQL: every node's results go to one writer,
// nodes spread over all of them, and the rows are what one writer (and
// SQLite) stores: each result once, copies answered with the original
// ack, an id another node owns refused.
func TestWritersShareTheFleet(t *testing.T) {
	t.Parallel()
	pg := open(t, pgtest.URL(t), func(o *Options) { o.Writers = 4 })
	defer pg.Close()
	sq := open(t, t.TempDir(), func(o *Options) { o.Writers = 4 })
	defer sq.Close()
	if w := sq.Stats().Writers; w != 1 {
		t.Fatalf("SQLite writers: %d, want 1", w)
	}
	if w := pg.Stats().Writers; w != 4 {
		t.Fatalf("PostgreSQL writers: %d, want 4", w)
	}
	used := map[int]bool{}
	for n := range 40 {
		used[pg.shard(fmt.Sprintf("node-%02d", n))] = true
	}
	if len(used) != 4 {
		t.Fatalf("40 nodes reach writers %v, want all 4", used)
	}
	for _, s := range []*Store{pg, sq} {
		t.Run(s.Dialect().String(), func(t *testing.T) {
			ctx := context.Background()
			at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
			var mu sync.Mutex
			counts := map[string]int{}
			var wg sync.WaitGroup
			for n := range 40 {
				node := fmt.Sprintf("node-%02d", n)
				wg.Go(func() {
					if _, _, err := s.NodeJoined(ctx, Join{Node: node, At: at}); err != nil {
						t.Error(err)
						return
					}
					for i := range 6 {
						id := fmt.Sprintf("%s-r%d", node, i%4) // r0, r1 sent twice
						if i == 5 {
							id = "node-00-r0" // another node's id (node-00 itself sends it too)
						}
						_, err := s.Ingest(ctx, fullResult(id, node, at.Add(time.Duration(i)*time.Second), nil))
						a := "new"
						switch {
						case errors.Is(err, ErrIDConflict):
							a = "conflict"
						case err != nil:
							t.Error(err)
							return
						}
						mu.Lock()
						counts[a]++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			c, err := s.Count(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if c.Results != 40*4 || c.CheckResults != 40*4*13 {
				t.Fatalf("stored %+v, want %d results of 13 checks", c, 40*4)
			}
			// node-00's own r0 goes to it (or is a duplicate); 39 others' are conflicts.
			if counts["conflict"] != 39 {
				t.Fatalf("answers %v, want 39 conflicts", counts)
			}
			for n := range 40 {
				node := fmt.Sprintf("node-%02d", n)
				nd, err := s.Node(ctx, node)
				if err != nil {
					t.Fatal(err)
				}
				for _, ck := range nd.Checks {
					if ck.ResultID != node+"-r3" {
						t.Fatalf("%s %s newest from %s, want %s-r3", node, ck.Name, ck.ResultID, node)
					}
				}
			}
		})
	}
}
