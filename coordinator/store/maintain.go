package store

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// PruneStats says what a retention pass removed.
type PruneStats struct {
	Results      int
	CheckResults int
	Dispatches   int
}

// pruneChunk bounds one delete transaction, so ingest is never held off
// for long.
const pruneChunk = 2000

// Prune deletes raw results, check results and work dispatch records
// stored before the cutoff.
// Check results are folded into the daily summaries as they go (in the
// same transaction). Summaries, events, inventory history and each
// check's newest status stay. Rows are appended in stored order, so the old ones are a prefix of
// each table in rowid order: no index on time is needed (and none is paid
// for on every insert).
func (s *Store) Prune(ctx context.Context, before time.Time) (PruneStats, error) {
	var st PruneStats
	cut := ms(before)
	for _, t := range []struct {
		table string
		count *int
	}{{"check_results", &st.CheckResults}, {"results", &st.Results}, {"dispatches", &st.Dispatches}} {
		for {
			n, err := s.prunePrefix(ctx, t.table, cut)
			*t.count += n
			if err != nil {
				return st, err
			}
			if n < pruneChunk {
				break
			}
		}
	}
	return st, nil
}

// prunePrefix deletes up to pruneChunk of the table's oldest rows while
// they were stored before cut, and says how many went.
func (s *Store) prunePrefix(ctx context.Context, table string, cut int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("prune %s: %w", table, err)
	}
	order := s.storedOrder(table)
	n := 0
	err := s.w.Tx(ctx, func(tx *sqldb.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT `+order+`, stored FROM `+table+` ORDER BY `+order+` LIMIT ?`, pruneChunk)
		if err != nil {
			return err
		}
		var last int64
		for rows.Next() {
			var seq, stored int64
			if err := rows.Scan(&seq, &stored); err != nil {
				rows.Close()
				return err
			}
			if stored >= cut {
				break
			}
			last = seq
			n++
		}
		if err := rows.Err(); err != nil {
			_ = rows.Close() // the iteration error is the one to report
			return err
		}
		if err := rows.Close(); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		if table == "check_results" {
			return foldAndDelete(ctx, tx, last)
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE `+order+` <= ?`, last)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("prune %s: %w", table, err)
	}
	return n, nil
}

// foldSet adds a fold's counts to the summaries already kept.
const foldSet = ` ON CONFLICT (node, check_name, day) DO UPDATE SET
	pass = check_summaries.pass + excluded.pass, warn = check_summaries.warn + excluded.warn,
	fail = check_summaries.fail + excluded.fail, error = check_summaries.error + excluded.error,
	skip = check_summaries.skip + excluded.skip,
	duration_ms_total = check_summaries.duration_ms_total + excluded.duration_ms_total`

// foldAndDelete deletes the check results numbered up to last and adds
// them to the daily summaries. On PostgreSQL the fold is of the rows this
// DELETE removed (RETURNING): two coordinators pruning at once fold each
// row once, as the second's DELETE finds the first's rows gone. On SQLite
// the one writer folds, then deletes.
func foldAndDelete(ctx context.Context, tx *sqldb.Tx, last int64) error {
	head := `INSERT INTO check_summaries (node, check_name, day, pass, warn, fail, error, skip, duration_ms_total) `
	if tx.Dialect() == sqldb.Postgres {
		_, err := tx.ExecContext(ctx, `WITH gone AS (
			DELETE FROM check_results WHERE id <= ? RETURNING node, check_name, status, duration_ms, finished)
			`+head+rawSummaries(sqldb.Postgres, `gone`, ``)+foldSet, last)
		return err
	}
	// WHERE true: SQLite reads ON CONFLICT after a bare SELECT as a join's.
	if _, err := tx.ExecContext(ctx, head+rawSummaries(sqldb.SQLite, `check_results`, `WHERE rowid <= ? AND true`)+foldSet, last); err != nil {
		return fmt.Errorf("fold into the summaries: %w", err)
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM check_results WHERE rowid <= ?`, last)
	return err
}

// storedOrder is the column that numbers a table's rows in stored order:
// SQLite's rowid; on PostgreSQL check_results' id, the others' seq.
func (s *Store) storedOrder(table string) string {
	switch {
	case s.d != sqldb.Postgres:
		return "rowid"
	case table == "check_results":
		return "id"
	}
	return "seq"
}

// Backup writes a consistent copy of the open database to dest (a file
// that must not exist yet) while the store keeps serving.
// On PostgreSQL the server's own tools do that (pg_dump, docs/store.md):
// Backup says so with ErrBackupPostgres.
func (s *Store) Backup(ctx context.Context, dest string) error {
	if s.d == sqldb.Postgres {
		return ErrBackupPostgres
	}
	return backupFile(ctx, s.path, dest)
}

// BackupDir writes a consistent copy of the database in a data directory
// to dest. It works whether or not a coordinator has the directory open:
// SQLite lets another process read a WAL database, and VACUUM INTO copies
// one snapshot. It never creates or migrates a database.
func BackupDir(ctx context.Context, dir, dest string) error {
	path := filepath.Join(dir, FileName)
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("backup: %w in %s", ErrNotInitialized, dir)
		}
		return fmt.Errorf("backup: %w", err)
	}
	return backupFile(ctx, path, dest)
}

// BackupPath is BackupDir for a SQLite database file named directly
// (store_url: sqlite:PATH).
func BackupPath(ctx context.Context, path, dest string) error {
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("backup: %w at %s", ErrNotInitialized, path)
		}
		return fmt.Errorf("backup: %w", err)
	}
	return backupFile(ctx, path, dest)
}

func backupFile(ctx context.Context, src, dest string) error {
	abs, err := filepath.Abs(dest)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if _, err := os.Lstat(abs); err == nil {
		return fmt.Errorf("backup: %s already exists", abs)
	}
	// A dedicated connection: the writer keeps ingesting meanwhile, and
	// VACUUM INTO is only a read of the source.
	db := openDB(dsn(src, url.Values{"mode": {"rw"}, "_busy_timeout": {"10000"}}))
	defer func() { _ = db.Close() }() // a connection only read through (VACUUM INTO writes elsewhere)
	db.SetMaxOpenConns(1)
	v, err := schemaVersion(ctx, db)
	if err != nil {
		return fmt.Errorf("backup %s: %w: %w", src, ErrNotInitialized, err)
	}
	if v == 0 {
		return fmt.Errorf("backup %s: %w", src, ErrNotInitialized)
	}
	// Write beside the destination and rename, so a failed backup never
	// leaves a file that looks complete.
	tmp := abs + ".partial"
	_ = os.Remove(tmp)
	if _, err := db.ExecContext(ctx, `VACUUM INTO ?`, tmp); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("backup %s to %s: %w", src, abs, err)
	}
	if err := syncFile(tmp); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("backup: %w", err)
	}
	if err := os.Rename(tmp, abs); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("backup: %w", err)
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		_ = f.Close() // the sync error is the one to report
		return err
	}
	return f.Close()
}
