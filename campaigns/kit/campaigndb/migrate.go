package campaigndb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// ErrSchemaTooNew: an engine's tables were written by a newer fleetcheck.
var ErrSchemaTooNew = errors.New("campaign tables are newer than this fleetcheck")

// Schema is one engine's tables. Current creates them as this release
// writes them (SQLite form, IF NOT EXISTS everywhere; sqldb translates it
// for PostgreSQL). A database at an older version is brought up by Steps,
// in order, then Current runs again for what is new (tables, indexes).
type Schema struct {
	// Name prefixes the tables; the versions are in Name_schema_version.
	Name    string
	Current string
	// Steps upgrade from version 1: Steps[i] brings version i+1 to i+2.
	// They run only on databases an earlier release wrote, so they may
	// assume SQLite (the only database earlier releases had).
	Steps []Step
}

// Step is one schema upgrade.
type Step struct {
	What string
	Up   func(ctx context.Context, tx *sqldb.Tx) error
}

// Version is the version Current creates.
func (s Schema) Version() int { return 1 + len(s.Steps) }

// Migrate creates the tables or brings them up to Version, in one
// transaction: a failed step leaves the database as it was.
func (s Schema) Migrate(ctx context.Context, db *sqldb.DB, now time.Time) error {
	if db == nil {
		return fmt.Errorf("%s tables: no database", s.Name)
	}
	err := db.Tx(ctx, func(tx *sqldb.Tx) error {
		if err := ExecDDL(ctx, tx, `CREATE TABLE IF NOT EXISTS `+s.Name+`_schema_version (
	version    INTEGER NOT NULL PRIMARY KEY,
	applied_at TEXT    NOT NULL
)`); err != nil {
			return err
		}
		var v sql.NullInt64
		if err := tx.QueryRowContext(ctx, `SELECT MAX(version) FROM `+s.Name+`_schema_version`).Scan(&v); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		have := int(v.Int64)
		switch {
		case have > s.Version():
			return fmt.Errorf("%w: %s tables at version %d, this fleetcheck knows %d", ErrSchemaTooNew, s.Name, have, s.Version())
		case have == s.Version():
			return nil
		case have == 0:
			// A new database: Current is the whole story.
		default:
			for i := have - 1; i < len(s.Steps); i++ {
				if err := s.Steps[i].Up(ctx, tx); err != nil {
					return fmt.Errorf("upgrade to version %d (%s): %w", i+2, s.Steps[i].What, err)
				}
			}
		}
		if err := ExecDDL(ctx, tx, s.Current); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.Name+`_schema_version (version, applied_at) VALUES (?, ?)`,
			s.Version(), Time(now)); err != nil {
			return fmt.Errorf("record schema version: %w", err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s tables: %w", s.Name, err)
	}
	return nil
}

// ExecDDL runs a schema, one statement at a time (the PostgreSQL driver
// takes one per call), translated for the database's dialect.
func ExecDDL(ctx context.Context, tx *sqldb.Tx, ddl string) error {
	for _, st := range statements(tx.Dialect().DDL(ddl)) {
		if _, err := tx.ExecContext(ctx, st); err != nil {
			return fmt.Errorf("%s: %w", firstLine(st), err)
		}
	}
	return nil
}

// statements splits a schema at the semicolons that end lines. Schemas
// here hold no semicolons in strings or comments.
func statements(ddl string) []string {
	var out []string
	for _, st := range strings.Split(ddl, ";\n") {
		if st = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(st), ";")); st != "" && !onlyComments(st) {
			out = append(out, st)
		}
	}
	return out
}

func onlyComments(st string) bool {
	for _, l := range strings.Split(st, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "--") {
			return false
		}
	}
	return true
}

func firstLine(st string) string {
	l, _, _ := strings.Cut(st, "\n")
	return strings.TrimSuffix(strings.TrimSpace(l), "(")
}

// createTable finds table's CREATE TABLE statement in a schema.
func createTable(schema, table string) (string, bool) {
	for _, st := range statements(schema) {
		head := strings.Fields(firstLine(st))
		if len(head) >= 6 && strings.EqualFold(head[0], "CREATE") && strings.EqualFold(head[1], "TABLE") &&
			strings.TrimSuffix(head[5], "(") == table {
			return st, true
		}
	}
	return "", false
}

// Rebuild gives an existing table the shape schema's CREATE TABLE gives
// it, copying every row and passing the columns named in conv through
// their function (a changed time encoding). Columns the new shape lacks
// are dropped; new ones take their defaults. Indexes go with the old
// table: Migrate runs Current again after the steps, which makes them.
func Rebuild(ctx context.Context, tx *sqldb.Tx, schema, table string, conv map[string]func(any) (any, error)) error {
	create, ok := createTable(schema, table)
	if !ok {
		return fmt.Errorf("rebuild %s: not in the schema", table)
	}
	old := table + "_rebuild_old"
	if _, err := tx.ExecContext(ctx, `ALTER TABLE `+table+` RENAME TO `+old); err != nil {
		return fmt.Errorf("rebuild %s: %w", table, err)
	}
	if _, err := tx.ExecContext(ctx, tx.Dialect().DDL(create)); err != nil {
		return fmt.Errorf("rebuild %s: %w", table, err)
	}
	keep, err := columns(ctx, tx, table)
	if err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, `SELECT * FROM `+old)
	if err != nil {
		return fmt.Errorf("rebuild %s: %w", table, err)
	}
	cols, err := rows.Columns()
	if err != nil {
		rows.Close()
		return fmt.Errorf("rebuild %s: %w", table, err)
	}
	var copied [][]any
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			rows.Close()
			return fmt.Errorf("rebuild %s: %w", table, err)
		}
		copied = append(copied, vals)
	}
	err = rows.Err()
	rows.Close()
	if err != nil {
		return fmt.Errorf("rebuild %s: %w", table, err)
	}
	var names []string
	var idx []int
	for i, c := range cols {
		if keep[c] {
			names = append(names, c)
			idx = append(idx, i)
		}
	}
	q := `INSERT INTO ` + table + ` (` + strings.Join(names, ", ") + `) VALUES (` +
		strings.TrimSuffix(strings.Repeat("?, ", len(names)), ", ") + `)`
	for _, vals := range copied {
		args := make([]any, len(idx))
		for j, i := range idx {
			args[j] = vals[i]
			if f := conv[cols[i]]; f != nil {
				if args[j], err = f(vals[i]); err != nil {
					return fmt.Errorf("rebuild %s: column %s: %w", table, cols[i], err)
				}
			}
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("rebuild %s: %w", table, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `DROP TABLE `+old); err != nil {
		return fmt.Errorf("rebuild %s: %w", table, err)
	}
	return nil
}

// columns names a table's columns.
func columns(ctx context.Context, tx *sqldb.Tx, table string) (map[string]bool, error) {
	rows, err := tx.QueryContext(ctx, `SELECT * FROM `+table+` WHERE 1 = 0`)
	if err != nil {
		return nil, fmt.Errorf("columns of %s: %w", table, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("columns of %s: %w", table, err)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("columns of %s: %w", table, err)
	}
	out := map[string]bool{}
	for _, c := range cols {
		out[c] = true
	}
	return out, nil
}

// MillisToTime converts a unix-milliseconds column (0: unset), as earlier
// releases stored some times, into Time's text.
func MillisToTime(v any) (any, error) {
	var ms int64
	switch x := v.(type) {
	case nil:
		return "", nil
	case int64:
		ms = x
	case float64:
		ms = int64(x)
	case string:
		if x == "" || x == "0" {
			return "", nil
		}
		if t := ParseTime(x); !t.IsZero() {
			return Time(t), nil // already text
		}
		return nil, fmt.Errorf("%q is neither unix milliseconds nor a time", x)
	default:
		return nil, fmt.Errorf("%T is not unix milliseconds", v)
	}
	if ms == 0 {
		return "", nil
	}
	return Time(time.UnixMilli(ms)), nil
}

// RewriteTimes rewrites time text columns of table that an earlier
// release wrote in variable width into Time's fixed width, so text order
// is time order for old rows too.
func RewriteTimes(ctx context.Context, tx *sqldb.Tx, table string, cols ...string) error {
	for _, c := range cols {
		rows, err := tx.QueryContext(ctx, `SELECT DISTINCT `+c+` FROM `+table+` WHERE `+c+` != ''`)
		if err != nil {
			return fmt.Errorf("rewrite %s.%s: %w", table, c, err)
		}
		var olds []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				rows.Close()
				return fmt.Errorf("rewrite %s.%s: %w", table, c, err)
			}
			olds = append(olds, s)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return fmt.Errorf("rewrite %s.%s: %w", table, c, err)
		}
		for _, s := range olds {
			t := ParseTime(s)
			if t.IsZero() || Time(t) == s {
				continue
			}
			if _, err := tx.ExecContext(ctx, `UPDATE `+table+` SET `+c+` = ? WHERE `+c+` = ?`, Time(t), s); err != nil {
				return fmt.Errorf("rewrite %s.%s: %w", table, c, err)
			}
		}
	}
	return nil
}
