package sweep

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/fleetcheck/fleetcheck/campaigns/kit/campaigndb"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// sqlSchema is the sweep_ tables. The record and each test are JSON
// documents; the columns beside them are what queries select on. Version
// 2 stores every time as campaigndb's text (version 1 had variable-width
// text, and unix milliseconds for coverage).
const sqlSchema = `
CREATE TABLE IF NOT EXISTS sweep_runs (
	id      TEXT    NOT NULL PRIMARY KEY,
	state   TEXT    NOT NULL,
	phase   TEXT    NOT NULL,
	wave    INTEGER NOT NULL,
	created TEXT    NOT NULL, -- campaign clock
	ended   TEXT    NOT NULL DEFAULT '',
	error   TEXT    NOT NULL DEFAULT '',
	record  TEXT    NOT NULL, -- Record JSON without state, phase, wave, report
	report  TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS sweep_runs_created ON sweep_runs(created);
CREATE TABLE IF NOT EXISTS sweep_tests (
	sweep_id TEXT    NOT NULL,
	seq      INTEGER NOT NULL,
	phase    TEXT    NOT NULL,
	wave     INTEGER NOT NULL,
	state    TEXT    NOT NULL,
	data     TEXT    NOT NULL, -- TestRecord JSON
	PRIMARY KEY (sweep_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sweep_drains (
	sweep_id TEXT NOT NULL,
	node     TEXT NOT NULL,
	state    TEXT NOT NULL,
	data     TEXT NOT NULL, -- DrainRecord JSON
	PRIMARY KEY (sweep_id, node)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sweep_coverage (
	node         TEXT NOT NULL PRIMARY KEY,
	last_covered TEXT NOT NULL, -- campaign clock
	sweep_id     TEXT NOT NULL
) WITHOUT ROWID;
`

var sqlTables = campaigndb.Schema{Name: "sweep", Current: sqlSchema, Steps: []campaigndb.Step{{
	What: "times in campaigndb's text",
	Up: func(ctx context.Context, tx *sqldb.Tx) error {
		return errors.Join(
			campaigndb.RewriteTimes(ctx, tx, "sweep_runs", "created", "ended"),
			campaigndb.Rebuild(ctx, tx, sqlSchema, "sweep_coverage",
				map[string]func(any) (any, error){"last_covered": campaigndb.MillisToTime}))
	},
}}}

// SQLStore keeps sweeps in sweep_* tables of a database someone else
// opened (the coordinator's; SQLite or PostgreSQL). Every write is one
// transaction.
type SQLStore struct {
	db *sqldb.DB
}

var _ Store = (*SQLStore)(nil)

// OpenSQLStore creates or upgrades the sweep tables.
func OpenSQLStore(ctx context.Context, db *sqldb.DB, now time.Time) (*SQLStore, error) {
	if err := sqlTables.Migrate(ctx, db, now); err != nil {
		return nil, fmt.Errorf("sweep store: %w", err)
	}
	return &SQLStore{db: db}, nil
}

func timeText(t time.Time) string { return campaigndb.Time(t) }

// CreateSweep implements Store.
func (s *SQLStore) CreateSweep(ctx context.Context, r Record) error {
	body := r
	body.Report = nil
	data, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("create sweep %s: %w", r.ID, err)
	}
	res, err := s.exec(ctx, `INSERT INTO sweep_runs (id, state, phase, wave, created, ended, error, record)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO NOTHING`,
		r.ID, string(r.State), string(r.Phase), r.Wave, timeText(r.Created), timeText(r.Ended), r.Error, string(data))
	if err != nil {
		return fmt.Errorf("create sweep %s: %w", r.ID, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("create sweep %s: %w", r.ID, ErrExists)
	}
	return nil
}

const runColumns = `id, state, phase, wave, ended, error, record`

func scanRecord(sc interface{ Scan(...any) error }, withReport bool) (Record, error) {
	var id, state, phase, ended, errText, data, rep string
	var wave int
	dest := []any{&id, &state, &phase, &wave, &ended, &errText, &data}
	if withReport {
		dest = append(dest, &rep)
	}
	if err := sc.Scan(dest...); err != nil {
		return Record{}, err
	}
	var r Record
	if err := json.Unmarshal([]byte(data), &r); err != nil {
		return Record{}, fmt.Errorf("sweep %s record: %w", id, err)
	}
	r.ID, r.State, r.Phase, r.Wave, r.Error = id, State(state), Phase(phase), wave, errText
	r.Ended = campaigndb.ParseTime(ended)
	if rep != "" {
		r.Report = &Report{}
		if err := json.Unmarshal([]byte(rep), r.Report); err != nil {
			return Record{}, fmt.Errorf("sweep %s report: %w", id, err)
		}
	}
	return r, nil
}

// Sweep implements Store.
func (s *SQLStore) Sweep(ctx context.Context, id string) (Record, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+runColumns+`, report FROM sweep_runs WHERE id = ?`, id)
	r, err := scanRecord(row, true)
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, fmt.Errorf("sweep %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("sweep %s: %w", id, err)
	}
	return r, nil
}

// Sweeps implements Store.
func (s *SQLStore) Sweeps(ctx context.Context) ([]Record, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+runColumns+` FROM sweep_runs ORDER BY created DESC, id DESC`)
	if err != nil {
		return nil, fmt.Errorf("list sweeps: %w", err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r, err := scanRecord(rows, false)
		if err != nil {
			return nil, fmt.Errorf("list sweeps: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list sweeps: %w", err)
	}
	return out, nil
}

// SaveSelection implements Store.
func (s *SQLStore) SaveSelection(ctx context.Context, r Record) error {
	body := r
	body.Report = nil
	data, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("save selection of sweep %s: %w", r.ID, err)
	}
	res, err := s.exec(ctx, `UPDATE sweep_runs SET record = ? WHERE id = ?`, string(data), r.ID)
	if err != nil {
		return fmt.Errorf("save selection of sweep %s: %w", r.ID, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("sweep %s: %w", r.ID, ErrNotFound)
	}
	return nil
}

// SavePlan implements Store.
func (s *SQLStore) SavePlan(ctx context.Context, id string, phase Phase, wave int, tests []TestRecord) error {
	return s.inTx(ctx, func(tx *sqldb.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE sweep_runs SET phase = ?, wave = ? WHERE id = ?`, string(phase), wave, id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return fmt.Errorf("sweep %s: %w", id, ErrNotFound)
		}
		st, err := tx.PrepareContext(ctx, `INSERT INTO sweep_tests (sweep_id, seq, phase, wave, state, data) VALUES (?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return err
		}
		defer func() { _ = st.Close() }() // the statement's work is done; the inserts' errors count
		for _, t := range tests {
			data, err := json.Marshal(t)
			if err != nil {
				return err
			}
			if _, err := st.ExecContext(ctx, id, t.Seq, string(t.Phase), t.Wave, string(t.State), string(data)); err != nil {
				return fmt.Errorf("test %d: %w", t.Seq, err)
			}
		}
		return nil
	}, "save plan of sweep %s", id)
}

// SaveTest implements Store.
func (s *SQLStore) SaveTest(ctx context.Context, id string, t TestRecord) error {
	data, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("save test %d of sweep %s: %w", t.Seq, id, err)
	}
	res, err := s.exec(ctx, `UPDATE sweep_tests SET state = ?, data = ? WHERE sweep_id = ? AND seq = ?`,
		string(t.State), string(data), id, t.Seq)
	if err != nil {
		return fmt.Errorf("save test %d of sweep %s: %w", t.Seq, id, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("save test %d of sweep %s: %w", t.Seq, id, ErrNotFound)
	}
	return nil
}

// Tests implements Store.
func (s *SQLStore) Tests(ctx context.Context, id string) ([]TestRecord, error) {
	var exists int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM sweep_runs WHERE id = ?`, id).Scan(&exists); err != nil {
		return nil, fmt.Errorf("tests of sweep %s: %w", id, err)
	}
	if exists == 0 {
		return nil, fmt.Errorf("tests of sweep %s: %w", id, ErrNotFound)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT data FROM sweep_tests WHERE sweep_id = ? ORDER BY seq`, id)
	if err != nil {
		return nil, fmt.Errorf("tests of sweep %s: %w", id, err)
	}
	defer rows.Close()
	var out []TestRecord
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("tests of sweep %s: %w", id, err)
		}
		var t TestRecord
		if err := json.Unmarshal([]byte(data), &t); err != nil {
			return nil, fmt.Errorf("tests of sweep %s: %w", id, err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tests of sweep %s: %w", id, err)
	}
	return out, nil
}

// SaveDrain implements Store.
func (s *SQLStore) SaveDrain(ctx context.Context, id string, d DrainRecord) error {
	data, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("save drain of %s: %w", d.Node, err)
	}
	_, err = s.exec(ctx, `INSERT INTO sweep_drains (sweep_id, node, state, data) VALUES (?, ?, ?, ?)
		ON CONFLICT(sweep_id, node) DO UPDATE SET state = excluded.state, data = excluded.data`,
		id, d.Node, string(d.State), string(data))
	if err != nil {
		return fmt.Errorf("save drain of %s in sweep %s: %w", d.Node, id, err)
	}
	return nil
}

// Drains implements Store.
func (s *SQLStore) Drains(ctx context.Context, id string) ([]DrainRecord, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT data FROM sweep_drains WHERE sweep_id = ? ORDER BY node`, id)
	if err != nil {
		return nil, fmt.Errorf("drains of sweep %s: %w", id, err)
	}
	defer rows.Close()
	var out []DrainRecord
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("drains of sweep %s: %w", id, err)
		}
		var d DrainRecord
		if err := json.Unmarshal([]byte(data), &d); err != nil {
			return nil, fmt.Errorf("drains of sweep %s: %w", id, err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("drains of sweep %s: %w", id, err)
	}
	return out, nil
}

// Finish implements Store.
func (s *SQLStore) Finish(ctx context.Context, id string, state State, errText string, rep *Report, covered []string, ended time.Time) error {
	var repText string
	if rep != nil {
		data, err := json.Marshal(rep)
		if err != nil {
			return fmt.Errorf("finish sweep %s: %w", id, err)
		}
		repText = string(data)
	}
	return s.inTx(ctx, func(tx *sqldb.Tx) error {
		q := `UPDATE sweep_runs SET state = ?, error = ?, report = ?, ended = ? WHERE id = ?`
		if state == StateDone {
			q = `UPDATE sweep_runs SET state = ?, error = ?, report = ?, ended = ?, phase = 'done' WHERE id = ?`
		}
		res, err := tx.ExecContext(ctx, q, string(state), errText, repText, timeText(ended), id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			return fmt.Errorf("sweep %s: %w", id, ErrNotFound)
		}
		if len(covered) == 0 {
			return nil
		}
		st, err := tx.PrepareContext(ctx, `INSERT INTO sweep_coverage (node, last_covered, sweep_id) VALUES (?, ?, ?)
			ON CONFLICT(node) DO UPDATE SET last_covered = excluded.last_covered, sweep_id = excluded.sweep_id
			WHERE excluded.last_covered >= sweep_coverage.last_covered`)
		if err != nil {
			return err
		}
		defer func() { _ = st.Close() }() // the statement's work is done; the inserts' errors count
		at := timeText(ended)
		for _, n := range covered {
			if _, err := st.ExecContext(ctx, n, at, id); err != nil {
				return fmt.Errorf("coverage of %s: %w", n, err)
			}
		}
		return nil
	}, "finish sweep %s", id)
}

// Coverage implements Store.
func (s *SQLStore) Coverage(ctx context.Context) (map[string]time.Time, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT node, last_covered FROM sweep_coverage`)
	if err != nil {
		return nil, fmt.Errorf("sweep coverage: %w", err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var n string
		var at string
		if err := rows.Scan(&n, &at); err != nil {
			return nil, fmt.Errorf("sweep coverage: %w", err)
		}
		out[n] = campaigndb.ParseTime(at)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sweep coverage: %w", err)
	}
	return out, nil
}

func (s *SQLStore) inTx(ctx context.Context, fn func(tx *sqldb.Tx) error, format string, args ...any) error {
	if err := s.db.Tx(ctx, fn); err != nil {
		return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), err)
	}
	return nil
}

// exec runs one write in its own transaction.
func (s *SQLStore) exec(ctx context.Context, q string, args ...any) (rowsAffected, error) {
	n, err := campaigndb.Exec(ctx, s.db, q, args...)
	return rowsAffected(n), err
}

// rowsAffected lets exec's callers keep database/sql's shape.
type rowsAffected int64

// RowsAffected is the count.
func (n rowsAffected) RowsAffected() (int64, error) { return int64(n), nil }
