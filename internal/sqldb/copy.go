package sqldb

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"strconv"
	"strings"
)

// TableCopy is what CopySQLiteToPostgres did to one table.
type TableCopy struct {
	Table string
	// Created says the table did not exist in the target and was made
	// from the source's CREATE statement (DDL translated).
	Created bool
	// Rows counted in the source and, after the copy, in the target.
	SourceRows, TargetRows int64
	// Checksums of the rows in the columns both sides have: equal when
	// every row arrived unchanged (order does not count).
	SourceSum, TargetSum uint64
}

// OK says the target holds what the source did.
func (c TableCopy) OK() bool { return c.SourceRows == c.TargetRows && c.SourceSum == c.TargetSum }

// CopyOptions tune CopySQLiteToPostgres.
type CopyOptions struct {
	// Replace deletes the target's rows of every copied table first;
	// without it a target table that holds rows is refused (ErrNotEmpty),
	// version tables (Versions) excepted.
	Replace bool
	// Versions are tables that the target's schema set-up fills (schema
	// version tables): their rows are replaced by the source's, after
	// checking both list the same versions in column "version".
	Versions []string
	// Skip names tables not to copy.
	Skip []string
	// BatchRows bounds one COPY (default 10,000).
	BatchRows int
}

// ErrNotEmpty is a copy refused because the target already holds rows.
var ErrNotEmpty = errors.New("target database is not empty")

// ErrMismatch is a copy whose counts or checksums differ afterwards.
var ErrMismatch = errors.New("copied table differs from its source")

// CopySQLiteToPostgres copies every table of the SQLite database src into
// the PostgreSQL database dst, in one transaction on each side (a
// snapshot of src; all or nothing in dst). A table missing in dst is
// created from src's schema (DDL, with its indexes). Columns are copied by
// name; a column only dst has keeps its default (a sequence numbers the
// rows in src's rowid order). Identity sequences are moved past the
// copied ids. After the copy every table's rows are counted and
// checksummed on both sides; any difference fails the copy (ErrMismatch)
// and rolls it back.
func CopySQLiteToPostgres(ctx context.Context, src, dst *DB, opts CopyOptions) ([]TableCopy, error) {
	if src.Dialect() != SQLite || dst.Dialect() != Postgres {
		return nil, fmt.Errorf("copy: from SQLite to PostgreSQL only (got %v to %v)", src.Dialect(), dst.Dialect())
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
	var out []TableCopy
	// A read transaction on SQLite is a snapshot in WAL mode.
	err := readTx(ctx, src, func(sq Queryer) error {
		tables, err := sqliteTables(ctx, sq)
		if err != nil {
			return err
		}
		return dst.Tx(ctx, func(tx *Tx) error {
			for _, t := range tables {
				if skip[t.name] {
					continue
				}
				c, err := copyTable(ctx, sq, tx, t, versions[t.name], opts)
				if err != nil {
					return fmt.Errorf("copy table %s: %w", t.name, err)
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
	})
	if err != nil {
		return out, err
	}
	return out, nil
}

// Queryer is what a pool, a connection and a transaction share.
type Queryer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func readTx(ctx context.Context, db *DB, fn func(q Queryer) error) error {
	tx, err := db.SQL().BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // read only: nothing to keep
	return fn(tx)
}

type sqliteTable struct {
	name, create string
	indexes      []string
}

func sqliteTables(ctx context.Context, q Queryer) ([]sqliteTable, error) {
	rows, err := q.QueryContext(ctx, `SELECT type, name, tbl_name, COALESCE(sql, '') FROM sqlite_master
		WHERE type IN ('table', 'index') AND name NOT LIKE 'sqlite_%' ORDER BY type DESC, name`)
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	defer rows.Close()
	var tables []sqliteTable
	at := map[string]int{}
	for rows.Next() {
		var typ, name, tbl, ddl string
		if err := rows.Scan(&typ, &name, &tbl, &ddl); err != nil {
			return nil, fmt.Errorf("list tables: %w", err)
		}
		if typ == "table" {
			at[name] = len(tables)
			tables = append(tables, sqliteTable{name: name, create: ddl})
		} else if i, ok := at[tbl]; ok && ddl != "" { // automatic indexes have no SQL
			tables[i].indexes = append(tables[i].indexes, ddl)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	return tables, nil
}

// pgColumns returns the table's columns and their types in dst, or none
// when the table does not exist.
func pgColumns(ctx context.Context, tx *Tx, table string) (map[string]string, []string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT column_name, data_type, is_identity FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = ? ORDER BY ordinal_position`, table)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	types := map[string]string{}
	var identity []string
	for rows.Next() {
		var name, typ, ident string
		if err := rows.Scan(&name, &typ, &ident); err != nil {
			return nil, nil, err
		}
		types[name] = typ
		if ident == "YES" {
			identity = append(identity, name)
		}
	}
	return types, identity, rows.Err()
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func copyTable(ctx context.Context, sq Queryer, tx *Tx, t sqliteTable, isVersions bool, opts CopyOptions) (TableCopy, error) {
	c := TableCopy{Table: t.name}
	types, identity, err := pgColumns(ctx, tx, t.name)
	if err != nil {
		return c, err
	}
	if len(types) == 0 {
		if _, err := tx.ExecContext(ctx, Postgres.DDL(t.create)); err != nil {
			return c, fmt.Errorf("create: %w", err)
		}
		for _, ix := range t.indexes {
			if _, err := tx.ExecContext(ctx, Postgres.DDL(ix)); err != nil {
				return c, fmt.Errorf("create index: %w", err)
			}
		}
		c.Created = true
		if types, identity, err = pgColumns(ctx, tx, t.name); err != nil {
			return c, err
		}
	}
	srcCols, err := sqliteColumns(ctx, sq, t.name)
	if err != nil {
		return c, err
	}
	var cols []string
	for _, col := range srcCols {
		if _, ok := types[col]; ok {
			cols = append(cols, col)
		}
	}
	if len(cols) == 0 {
		return c, fmt.Errorf("no column of the source table exists in the target")
	}
	var n int64
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+quoteIdent(t.name)).Scan(&n); err != nil {
		return c, err
	}
	if n > 0 {
		switch {
		case isVersions:
			if err := sameVersions(ctx, sq, tx, t.name); err != nil {
				return c, err
			}
		case !opts.Replace:
			return c, fmt.Errorf("%w: %s holds %d rows (replace them with --replace)", ErrNotEmpty, t.name, n)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+quoteIdent(t.name)); err != nil {
			return c, err
		}
	}

	qcols := make([]string, len(cols))
	for i, col := range cols {
		qcols[i] = quoteIdent(col)
	}
	list := strings.Join(qcols, ", ")
	// rowid order is stored order; a WITHOUT ROWID table has its key's.
	order := "rowid"
	if strings.Contains(strings.ToUpper(t.create), "WITHOUT ROWID") {
		order = "1"
	}
	rows, err := sq.QueryContext(ctx, `SELECT `+list+` FROM `+quoteIdent(t.name)+` ORDER BY `+order)
	if err != nil {
		return c, err
	}
	defer rows.Close()
	batch := make([][]any, 0, opts.BatchRows)
	flush := func() error {
		if _, err := tx.CopyFrom(ctx, t.name, cols, batch); err != nil {
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
		for i, col := range cols {
			vals[i] = coerce(vals[i], types[col])
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
	for _, col := range identity {
		q := fmt.Sprintf(`SELECT setval(pg_get_serial_sequence(?, ?), COALESCE((SELECT MAX(%s) FROM %s), 0) + 1, false)`,
			quoteIdent(col), quoteIdent(t.name))
		if _, err := tx.ExecContext(ctx, q, quoteIdent(t.name), col); err != nil {
			return c, fmt.Errorf("move the %s sequence: %w", col, err)
		}
	}
	c.TargetRows, c.TargetSum, err = tableSum(ctx, tx, t.name, list, len(cols))
	return c, err
}

func sqliteColumns(ctx context.Context, q Queryer, table string) ([]string, error) {
	rows, err := q.QueryContext(ctx, `SELECT name FROM pragma_table_info(?) ORDER BY cid`, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		cols = append(cols, name)
	}
	return cols, rows.Err()
}

// sameVersions checks that a version table lists the same versions on
// both sides: a target set up by another fleetcheck would take rows its
// schema does not match.
func sameVersions(ctx context.Context, sq Queryer, tx *Tx, table string) error {
	read := func(q Queryer) ([]int64, error) {
		rows, err := q.QueryContext(ctx, `SELECT version FROM `+quoteIdent(table)+` ORDER BY version`)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var vs []int64
		for rows.Next() {
			var v int64
			if err := rows.Scan(&v); err != nil {
				return nil, err
			}
			vs = append(vs, v)
		}
		return vs, rows.Err()
	}
	a, err := read(sq)
	if err != nil {
		return err
	}
	b, err := read(tx)
	if err != nil {
		return err
	}
	if fmt.Sprint(a) != fmt.Sprint(b) {
		return fmt.Errorf("schema versions differ: source %v, target %v (run the same fleetcheck on both)", a, b)
	}
	return nil
}

// coerce turns what go-sqlite3 returned into what the target column takes.
func coerce(v any, pgType string) any {
	switch x := v.(type) {
	case []byte:
		if pgType != "bytea" {
			return string(x)
		}
	case string:
		if pgType == "bytea" {
			return []byte(x)
		}
	case int64:
		if pgType == "double precision" || pgType == "real" {
			return float64(x)
		}
	}
	return v
}

func tableSum(ctx context.Context, tx *Tx, table, list string, ncols int) (int64, uint64, error) {
	return sumRows(ctx, tx, `SELECT `+list+` FROM `+quoteIdent(table), ncols)
}

// sumRows counts a query's rows and sums their hashes (rowSum).
func sumRows(ctx context.Context, q Queryer, query string, ncols int) (int64, uint64, error) {
	rows, err := q.QueryContext(ctx, query)
	if err != nil {
		return 0, 0, err
	}
	defer rows.Close()
	var n int64
	var sum uint64
	vals := make([]any, ncols)
	ptrs := make([]any, ncols)
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return 0, 0, err
		}
		n++
		sum += rowSum(vals)
	}
	return n, sum, rows.Err()
}

// rowSum hashes one row's values in a form both drivers agree on (text
// and bytes alike, an integral float as its integer); the table's sum of
// row hashes does not depend on row order.
func rowSum(vals []any) uint64 {
	h := fnv.New64a()
	var buf [8]byte
	for _, v := range vals {
		var s string
		switch x := v.(type) {
		case nil:
			s = "\x00NULL"
		case int64:
			s = strconv.FormatInt(x, 10)
		case int32:
			s = strconv.FormatInt(int64(x), 10)
		case float64:
			if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
				s = strconv.FormatInt(int64(x), 10)
			} else {
				s = strconv.FormatFloat(x, 'g', -1, 64)
			}
		case bool:
			s = strconv.FormatBool(x)
		case []byte:
			s = string(x)
		case string:
			s = x
		default:
			s = fmt.Sprint(x)
		}
		binary.LittleEndian.PutUint64(buf[:], uint64(len(s)))
		_, _ = h.Write(buf[:]) // hash writes never fail
		_, _ = h.Write([]byte(s))
	}
	return h.Sum64()
}

// Tables lists a database's tables, sorted.
func (db *DB) Tables(ctx context.Context) ([]string, error) {
	q := `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`
	if db.dialect == Postgres {
		q = `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'`
	}
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out, rows.Err()
}

// TableSum is one table's row count and checksum, as the copy compares
// them (TableCopy): a sum of row hashes over its columns, in any row order.
type TableSum struct {
	Table string
	Rows  int64
	Sum   uint64
}

// TableSums counts and checksums every table of the database, in one
// read transaction (one snapshot), tables sorted. Two databases holding
// the same rows give the same sums: a backup restored, or a copy.
func (db *DB) TableSums(ctx context.Context) ([]TableSum, error) {
	tables, err := db.Tables(ctx)
	if err != nil {
		return nil, err
	}
	var out []TableSum
	opts := &sql.TxOptions{ReadOnly: true}
	if db.dialect == Postgres {
		opts.Isolation = sql.LevelRepeatableRead // one snapshot for every table
	}
	tx, err := db.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // read only: nothing to keep
	err = func(q Queryer) error {
		for _, t := range tables {
			cols, err := db.columns(ctx, q, t)
			if err != nil {
				return fmt.Errorf("columns of %s: %w", t, err)
			}
			qcols := make([]string, len(cols))
			for i, c := range cols {
				qcols[i] = quoteIdent(c)
			}
			n, sum, err := sumRows(ctx, q, `SELECT `+strings.Join(qcols, ", ")+` FROM `+quoteIdent(t), len(cols))
			if err != nil {
				return fmt.Errorf("checksum %s: %w", t, err)
			}
			out = append(out, TableSum{Table: t, Rows: n, Sum: sum})
		}
		return nil
	}(tx)
	return out, err
}

// columns lists a table's columns in their defined order.
func (db *DB) columns(ctx context.Context, q Queryer, table string) ([]string, error) {
	if db.dialect == SQLite {
		return sqliteColumns(ctx, q, table)
	}
	rows, err := q.QueryContext(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position`, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, err
		}
		cols = append(cols, c)
	}
	return cols, rows.Err()
}
