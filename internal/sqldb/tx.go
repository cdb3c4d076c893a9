package sqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// Tx is one write transaction, on one connection. Its queries are rebound
// like the DB's.
type Tx struct {
	conn    *sql.Conn
	dialect Dialect
}

// Tx runs fn in a write transaction: the fence first, then fn, then
// commit. An error from either (or a panic) rolls back and is returned.
// On SQLite the transaction takes the write lock at BEGIN (IMMEDIATE), so
// concurrent writers queue on the busy timeout instead of failing later.
//
// The transaction is a plain BEGIN ... COMMIT on a dedicated connection
// rather than a database/sql Tx, so that CopyFrom can reach the driver
// connection inside it.
func (db *DB) Tx(ctx context.Context, fn func(tx *Tx) error) (err error) {
	conn, err := db.db.Conn(ctx)
	if err != nil {
		return err
	}
	begin := "BEGIN"
	if db.dialect == SQLite {
		begin = "BEGIN IMMEDIATE"
	}
	if _, err := conn.ExecContext(ctx, begin); err != nil {
		_ = conn.Close() // the begin error is the one to report
		return fmt.Errorf("begin: %w", err)
	}
	tx := &Tx{conn: conn, dialect: db.dialect}
	committed := false
	defer func() {
		p := recover()
		if !committed {
			if rbErr := tx.rollback(); rbErr != nil && err == nil && p == nil {
				err = rbErr
			}
		}
		if cErr := conn.Close(); cErr != nil && err == nil && p == nil {
			err = cErr
		}
		if p != nil {
			panic(p)
		}
	}()
	if db.fence != nil {
		if err := db.fence(ctx, tx); err != nil {
			return fmt.Errorf("write fenced: %w", err)
		}
	}
	if err := fn(tx); err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	committed = true
	return nil
}

// rollback ends a failed transaction; it must run even when the caller's
// context is already done. A connection that cannot roll back is thrown
// away rather than handed to the next caller mid-transaction.
func (tx *Tx) rollback() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := tx.conn.ExecContext(ctx, "ROLLBACK")
	if err == nil || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) {
		return nil
	}
	_ = tx.conn.Raw(func(any) error { return driver.ErrBadConn }) // discard the connection
	return fmt.Errorf("rollback: %w", err)
}

// Dialect is the transaction's database dialect.
func (tx *Tx) Dialect() Dialect { return tx.dialect }

// ExecContext runs a statement in the transaction (rebound).
func (tx *Tx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return tx.conn.ExecContext(ctx, tx.dialect.Rebind(q), args...)
}

// QueryContext runs a query in the transaction (rebound).
func (tx *Tx) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return tx.conn.QueryContext(ctx, tx.dialect.Rebind(q), args...)
}

// QueryRowContext runs a query expected to return at most one row (rebound).
func (tx *Tx) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	return tx.conn.QueryRowContext(ctx, tx.dialect.Rebind(q), args...)
}

// PrepareContext prepares a statement for repeated use in the transaction.
func (tx *Tx) PrepareContext(ctx context.Context, q string) (*sql.Stmt, error) {
	return tx.conn.PrepareContext(ctx, tx.dialect.Rebind(q))
}

// CopyFrom appends rows to table (columns cols, in order): PostgreSQL's
// COPY, the fastest bulk load it has, or on SQLite one prepared INSERT
// per row. COPY has no ON CONFLICT: copy into a staging table (a TEMP
// table of the transaction) and INSERT ... SELECT ... ON CONFLICT from
// there when rows may already exist.
func (tx *Tx) CopyFrom(ctx context.Context, table string, cols []string, rows [][]any) (int64, error) {
	if len(rows) == 0 {
		return 0, nil
	}
	if tx.dialect == Postgres {
		var n int64
		err := tx.conn.Raw(func(dc any) error {
			c, ok := dc.(*stdlib.Conn)
			if !ok {
				return fmt.Errorf("copy into %s: driver connection is %T, not pgx", table, dc)
			}
			var err error
			n, err = c.Conn().CopyFrom(ctx, pgx.Identifier(strings.Split(table, ".")), cols, pgx.CopyFromRows(rows))
			return err
		})
		if err != nil {
			return n, fmt.Errorf("copy into %s: %w", table, err)
		}
		return n, nil
	}
	q := "INSERT INTO " + table + " (" + strings.Join(cols, ", ") + ") VALUES (" +
		strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ")"
	st, err := tx.conn.PrepareContext(ctx, q)
	if err != nil {
		return 0, fmt.Errorf("copy into %s: %w", table, err)
	}
	defer st.Close() //nolint:errcheck // closing a prepared statement has nothing to add
	var n int64
	for _, r := range rows {
		if _, err := st.ExecContext(ctx, r...); err != nil {
			return n, fmt.Errorf("copy into %s: %w", table, err)
		}
		n++
	}
	return n, nil
}
