package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrMissingTables is a copy into SQLite refused because the target lacks
// tables the source has: CopyPostgresToSQLite creates none (their SQLite
// definitions are their owners', not PostgreSQL's).
var ErrMissingTables = errors.New("the SQLite database lacks tables the source has")

// CopyPostgresToSQLite copies every table of the PostgreSQL database src
// into the SQLite database dst: one snapshot of src (repeatable read), one
// transaction in dst, all or nothing. Every table must exist in dst
// already (ErrMissingTables names the others); columns are copied by
// name, and a column only src has (PostgreSQL's stored-order sequences)
// orders the rows instead, so that SQLite's rowid order is stored order
// again. Counts and checksums are compared as CopySQLiteToPostgres does;
// a difference rolls the copy back (ErrMismatch). opts.Replace and
// opts.Versions mean what they mean there.
func CopyPostgresToSQLite(ctx context.Context, src, dst *DB, opts CopyOptions) ([]TableCopy, error) {
	if src.Dialect() != Postgres || dst.Dialect() != SQLite {
		return nil, fmt.Errorf("copy: from PostgreSQL to SQLite only (got %v to %v)", src.Dialect(), dst.Dialect())
	}
	if opts.BatchRows <= 0 {
		opts.BatchRows = 10000
	}
	skip := map[string]bool{}
	for _, t := range opts.Skip {
		skip[t] = true
	}
	versions := map[string]bool{}
	for _, t := range opts.Versions {
		versions[t] = true
	}
	stx, err := src.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
	if err != nil {
		return nil, err
	}
	defer stx.Rollback() //nolint:errcheck // read only: nothing to keep
	tables, err := src.Tables(ctx)
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	var out []TableCopy
	err = dst.Tx(ctx, func(tx *Tx) error {
		dstCols := map[string][]string{}
		var missing []string
		for _, t := range tables {
			if skip[t] {
				continue
			}
			cols, err := sqliteColumns(ctx, tx, t)
			if err != nil {
				return fmt.Errorf("columns of %s: %w", t, err)
			}
			if len(cols) == 0 {
				missing = append(missing, t)
			}
			dstCols[t] = cols
		}
		if len(missing) > 0 {
			sort.Strings(missing)
			return fmt.Errorf("%w: %s", ErrMissingTables, strings.Join(missing, ", "))
		}
		for _, t := range tables {
			if skip[t] {
				continue
			}
			c, err := copyTableBack(ctx, src, stx, tx, t, dstCols[t], versions[t], opts)
			if err != nil {
				return fmt.Errorf("copy table %s: %w", t, err)
			}
			out = append(out, c)
		}
		var bad []string
		for _, c := range out {
			if !c.OK() {
				bad = append(bad, fmt.Sprintf("%s (rows %d -> %d, checksum %016x -> %016x)",
					c.Table, c.SourceRows, c.TargetRows, c.SourceSum, c.TargetSum))
			}
		}
		if len(bad) > 0 {
			return fmt.Errorf("%w: %s", ErrMismatch, strings.Join(bad, "; "))
		}
		return nil
	})
	return out, err
}

func copyTableBack(ctx context.Context, src *DB, sq Queryer, tx *Tx, table string, dstCols []string, isVersions bool, opts CopyOptions) (TableCopy, error) {
	c := TableCopy{Table: table}
	srcCols, err := src.columns(ctx, sq, table)
	if err != nil {
		return c, err
	}
	in := map[string]bool{}
	for _, col := range dstCols {
		in[col] = true
	}
	var cols []string
	order := ""
	for _, col := range srcCols {
		switch {
		case in[col]:
			cols = append(cols, col)
		case col == "seq":
			order = quoteIdent(col) // the stored order SQLite keeps as rowid
		}
	}
	if len(cols) == 0 {
		return c, fmt.Errorf("no column of the source table exists in the target")
	}
	if order == "" {
		order = "1"
		if in["id"] {
			order = quoteIdent("id")
		}
	}
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+quoteIdent(table)).Scan(&n); err != nil {
		return c, err
	}
	if n > 0 {
		switch {
		case isVersions:
			if err := sameVersions(ctx, sq, tx, table); err != nil {
				return c, err
			}
		case !opts.Replace:
			return c, fmt.Errorf("%w: %s holds %d rows (replace them with --replace)", ErrNotEmpty, table, n)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+quoteIdent(table)); err != nil {
			return c, err
		}
	}
	qcols := make([]string, len(cols))
	for i, col := range cols {
		qcols[i] = quoteIdent(col)
	}
	list := strings.Join(qcols, ", ")
	rows, err := sq.QueryContext(ctx, `SELECT `+list+` FROM `+quoteIdent(table)+` ORDER BY `+order)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	batch := make([][]any, 0, opts.BatchRows)
	flush := func() error {
		// Quoted: SQLite's INSERT takes the names as written ("full").
		if _, err := tx.CopyFrom(ctx, quoteIdent(table), qcols, batch); err != nil {
			return err
		}
		batch = batch[:0]
		return nil
	}
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return c, err
		}
		c.SourceRows++
		c.SourceSum += rowSum(vals)
		batch = append(batch, vals)
		if len(batch) == opts.BatchRows {
			if err := flush(); err != nil {
				return c, err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return c, err
	}
	if len(batch) > 0 {
		if err := flush(); err != nil {
			return c, err
		}
	}
	c.TargetRows, c.TargetSum, err = tableSum(ctx, tx, table, list, len(cols))
	return c, err
}
