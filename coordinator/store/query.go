package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// StoredCheck is one stored check result with the result it came in.
type StoredCheck struct {
	ResultID string
	Node     string
	WorkID   string
	Trigger  string // what started the pass; "" from an old agent
	Finished time.Time
	Check    report.CheckResult
}

// ResultQuery selects check results. Node is required; Check narrows to one
// check; Limit bounds the rows (default 50, at most 10,000).
type ResultQuery struct {
	Node  string
	Check string
	Limit int
}

const (
	defaultLimit = 50
	maxLimit     = 10000
)

func clampLimit(n int) int {
	if n <= 0 {
		return defaultLimit
	}
	return min(n, maxLimit)
}

// Results returns check results, newest first.
func (s *Store) Results(ctx context.Context, q ResultQuery) ([]StoredCheck, error) {
	if q.Node == "" {
		return nil, fmt.Errorf("list results: %w: a node is required", ErrInvalid)
	}
	limit := clampLimit(q.Limit)
	var rows *sql.Rows
	var err error
	// Both walk the node's check rows newest first on the one index
	// check_results has; a check filter skips the other checks' rows.
	indexed := ""
	if s.d == sqldb.SQLite {
		indexed = "INDEXED BY check_results_node_finished"
	}
	rows, err = s.r.QueryContext(ctx, `SELECT c.result_id, c.node, COALESCE(r.work_id, ''), COALESCE(r.triggered_by, ''), c.finished, c.check_name,
			c.status, c.reason, c.findings, c.metrics, c.duration_ms
		FROM check_results c `+indexed+`
		LEFT JOIN results r ON r.id = c.result_id
		WHERE c.node = ? AND (? = '' OR c.check_name = ?)
		ORDER BY c.finished DESC, c.id DESC LIMIT ?`, q.Node, q.Check, q.Check, limit)
	if err != nil {
		return nil, fmt.Errorf("list results of %s: %w", q.Node, err)
	}
	defer rows.Close()
	var out []StoredCheck
	for rows.Next() {
		var sc StoredCheck
		var fin int64
		var findings, metrics string
		var status string
		if err := rows.Scan(&sc.ResultID, &sc.Node, &sc.WorkID, &sc.Trigger, &fin, &sc.Check.Name, &status,
			&sc.Check.Reason, &findings, &metrics, &sc.Check.DurationMS); err != nil {
			return nil, fmt.Errorf("list results of %s: %w", q.Node, err)
		}
		sc.Finished = fromMS(fin)
		sc.Check.Status = report.Status(status)
		if err := json.Unmarshal([]byte(findings), &sc.Check.Findings); err != nil {
			return nil, fmt.Errorf("result %s check %s findings: %w", sc.ResultID, sc.Check.Name, err)
		}
		if err := json.Unmarshal([]byte(metrics), &sc.Check.Metrics); err != nil {
			return nil, fmt.Errorf("result %s check %s metrics: %w", sc.ResultID, sc.Check.Name, err)
		}
		if len(sc.Check.Metrics) == 0 {
			sc.Check.Metrics = nil
		}
		out = append(out, sc)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list results of %s: %w", q.Node, err)
	}
	return out, nil
}

// StoredResult is one stored result's header.
type StoredResult struct {
	ID       string
	Node     string
	WorkID   string
	Started  time.Time
	Finished time.Time
	Status   report.Status
	Full     bool
	Trigger  string
	Stored   time.Time
}

// Result returns one result's header, or ErrNotFound.
func (s *Store) Result(ctx context.Context, id string) (StoredResult, error) {
	var r StoredResult
	var started, finished, stored int64
	var status string
	var full int
	err := s.r.QueryRowContext(ctx, `SELECT id, node, work_id, started, finished, status, "full", stored, triggered_by
		FROM results WHERE id = ?`, id).Scan(&r.ID, &r.Node, &r.WorkID, &started, &finished, &status, &full, &stored, &r.Trigger)
	if err == sql.ErrNoRows {
		return StoredResult{}, fmt.Errorf("result %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return StoredResult{}, fmt.Errorf("result %s: %w", id, err)
	}
	r.Started, r.Finished, r.Stored = fromMS(started), fromMS(finished), fromMS(stored)
	r.Status, r.Full = report.Status(status), full != 0
	return r, nil
}

// Counts says how many rows the main tables hold.
type Counts struct {
	Results, CheckResults, Events, Summaries, Nodes int
}

// Count returns the row counts; tests and status pages use it.
func (s *Store) Count(ctx context.Context) (Counts, error) {
	var c Counts
	err := s.r.QueryRowContext(ctx, `SELECT
		(SELECT COUNT(*) FROM results), (SELECT COUNT(*) FROM check_results),
		(SELECT COUNT(*) FROM events), (SELECT COUNT(*) FROM check_summaries),
		(SELECT COUNT(*) FROM nodes)`).Scan(&c.Results, &c.CheckResults, &c.Events, &c.Summaries, &c.Nodes)
	if err != nil {
		return Counts{}, fmt.Errorf("count rows: %w", err)
	}
	return c, nil
}

// NodeCount is the number of nodes stored: the fleet every coordinator
// over this database serves, whichever of them each node connected to.
func (s *Store) NodeCount(ctx context.Context) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM nodes`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count nodes: %w", err)
	}
	return n, nil
}

// Summary is one node's one check on one UTC day.
type Summary struct {
	Node, Check, Day              string
	Pass, Warn, Fail, Error, Skip int
	DurationMSTotal               float64
}

// Summaries returns a node's daily check summaries, oldest day first.
// Check narrows to one check when set. A day's counts are those retention
// folded into check_summaries when it dropped the raw rows, plus the raw
// rows still kept: ingest writes no summary (one more row updated per
// check result), a read adds them up.
func (s *Store) Summaries(ctx context.Context, node, check string) ([]Summary, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT node, check_name, day, CAST(SUM(pass) AS BIGINT), CAST(SUM(warn) AS BIGINT), CAST(SUM(fail) AS BIGINT),
			CAST(SUM(error) AS BIGINT), CAST(SUM(skip) AS BIGINT), SUM(duration_ms_total)
		FROM (
			SELECT node, check_name, day, pass, warn, fail, error, skip, duration_ms_total
			FROM check_summaries WHERE node = ? AND (? = '' OR check_name = ?)
			UNION ALL
			`+rawSummaries(s.d, `check_results`, `WHERE node = ? AND (? = '' OR check_name = ?)`)+`
		) AS days
		GROUP BY node, check_name, day ORDER BY day, check_name`, node, check, check, node, check, check)
	if err != nil {
		return nil, fmt.Errorf("summaries of %s: %w", node, err)
	}
	defer rows.Close()
	var out []Summary
	for rows.Next() {
		var x Summary
		if err := rows.Scan(&x.Node, &x.Check, &x.Day, &x.Pass, &x.Warn, &x.Fail, &x.Error, &x.Skip, &x.DurationMSTotal); err != nil {
			return nil, fmt.Errorf("summaries of %s: %w", node, err)
		}
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("summaries of %s: %w", node, err)
	}
	return out, nil
}

// rawSummaries is the SELECT of daily summaries (check_summaries'
// columns) of the check results in from (check_results' columns) that
// where selects.
func rawSummaries(d sqldb.Dialect, from, where string) string {
	return `SELECT node, check_name, ` + utcDay(d, "finished") + ` AS day,
		SUM(CASE WHEN status = 'pass' THEN 1 ELSE 0 END), SUM(CASE WHEN status = 'warn' THEN 1 ELSE 0 END),
		SUM(CASE WHEN status = 'fail' THEN 1 ELSE 0 END), SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END),
		SUM(CASE WHEN status = 'skip' THEN 1 ELSE 0 END), SUM(duration_ms)
		FROM ` + from + ` ` + where + ` GROUP BY 1, 2, 3`
}

// utcDay is the SQL of the UTC day (YYYY-MM-DD) of a unix-milliseconds
// column, as Go's time.DateOnly writes it.
func utcDay(d sqldb.Dialect, col string) string {
	if d == sqldb.Postgres {
		return `to_char(to_timestamp(` + col + ` / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD')`
	}
	return `strftime('%Y-%m-%d', ` + col + ` / 1000, 'unixepoch')`
}

// SeqCheck is a stored check result with its place in stored order.
type SeqCheck struct {
	Seq int64
	// Skipped: a Sparse read's row of no interest to it, which comes as
	// its number alone (the rest empty), so that its reader still sees
	// every number and can tell a row skipped from one not yet committed.
	Skipped bool
	StoredCheck
}

// maxChecksAfter bounds one ChecksAfter read.
const maxChecksAfter = 10000

// ChecksRead says what a ChecksAfter reader needs of each row beyond its
// status and findings. Metrics are most of a row (the JSON of ~350
// numbers a result) and most of the cost of reading it back; a reader of
// every result, like the remediation feed, needs a few of them.
type ChecksRead struct {
	// MetricsOf lists the checks whose metrics are read; the other rows
	// come without metrics. Nil: every check's.
	MetricsOf []string
	// KeepMetric, when set, keeps only the metrics it accepts.
	KeepMetric func(check, name string) bool
	// Feed reads the metrics kept at ingest for Options.Feed, whose
	// MetricsOf and KeepMetric then apply (this read's are ignored); a
	// row stored without them is read as those say.
	Feed bool
	// Sparse reads in full only the rows with findings and those of the
	// checks whose metrics are read (MetricsOf; nil: every row); the
	// others come Skipped. A healthy pass's ~13 rows are then ~2 for the
	// remediation feed, which reads every stored result.
	Sparse bool
}

// ChecksAfter returns the check results numbered above after and at
// most upTo (0: no bound) in stored order (check_results' id), at most
// limit (1..10,000) rows, with their results' work ids, and of their
// metrics what read asks for. Every coordinator over one database stores
// into the same table, so a reader here sees what any of them took in. A
// transaction still open may hold numbers below rows already visible: a
// reader that must see every row reads such gaps again for a while (the
// remediation feed does).
//
// It reads windows of numbers no wider than the rows still wanted, so
// that no plan can touch more rows than it returns: a PostgreSQL plan
// made while the table was small (a cached generic plan) read every row
// after the cursor, computed its columns and sorted them to keep the
// first 2,000, again for each 2,000, and a feed a second behind spent
// the server a third of its CPU on that (docs/scale.md).
func (s *Store) ChecksAfter(ctx context.Context, after, upTo int64, limit int, read ChecksRead) ([]SeqCheck, error) {
	limit = min(max(limit, 1), maxChecksAfter)
	last, err := s.LastCheckSeq(ctx) // rows numbered above are read next time
	if err != nil {
		return nil, err
	}
	if upTo <= 0 || upTo > last {
		upTo = last
	}
	var out []SeqCheck
	for from := after; len(out) < limit && from < upTo; {
		to := min(upTo, from+int64(limit-len(out)))
		got, err := s.readChecks(ctx, read, `WHERE c.id > ? AND c.id <= ? ORDER BY c.id LIMIT ?`, from, to, limit-len(out))
		if err != nil {
			return nil, fmt.Errorf("check results after %d: %w", from, err)
		}
		out = append(out, got...)
		if len(got) > 0 {
			from = to
			continue
		}
		// An empty window (rows pruned, or numbers never committed): on
		// to the next row there is.
		next, err := s.nextCheckSeq(ctx, to)
		if err != nil {
			return nil, err
		}
		if next == 0 {
			break
		}
		from = next - 1
	}
	return out, nil
}

// nextCheckSeq is the number of the first stored check result above
// after (0: none).
func (s *Store) nextCheckSeq(ctx context.Context, after int64) (int64, error) {
	var v sql.NullInt64
	if err := s.r.QueryRowContext(ctx, `SELECT MIN(id) FROM check_results WHERE id > ?`, after).Scan(&v); err != nil {
		return 0, fmt.Errorf("check results after %d: %w", after, err)
	}
	return v.Int64, nil
}

// maxRecentPerNode bounds what RecentChecks reads of one node: a day of
// the event checks every minute, and more.
const maxRecentPerNode = 10000

// RecentChecks returns the stored results of the named checks that
// finished at or after since and are numbered at most upTo, every node's,
// in stored order, with of their metrics what read asks for; of a node
// with more than 10,000 such rows, the newest; upTo 0: no bound. It reads node by node
// along the (node, finished) index: a new leader reads the day its
// escalation rules' windows reach back over (coordinator/remediation.go).
func (s *Store) RecentChecks(ctx context.Context, since time.Time, upTo int64, checks []string, read ChecksRead) ([]SeqCheck, error) {
	if len(checks) == 0 {
		return nil, nil
	}
	if upTo <= 0 {
		upTo = math.MaxInt64
	}
	rows, err := s.r.QueryContext(ctx, `SELECT name FROM nodes ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("recent check results: %w", err)
	}
	var nodes []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("recent check results: %w", err)
		}
		nodes = append(nodes, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("recent check results: %w", err)
	}
	var out []SeqCheck
	for _, node := range nodes {
		args := []any{node, ms(since), upTo}
		for _, c := range checks {
			args = append(args, c)
		}
		got, err := s.readChecks(ctx, read, `WHERE c.node = ? AND c.finished >= ? AND c.id <= ? AND c.check_name IN `+inList(len(checks))+
			` ORDER BY c.finished DESC LIMIT ?`, append(args, maxRecentPerNode)...)
		if err != nil {
			return nil, fmt.Errorf("recent check results of %s: %w", node, err)
		}
		out = append(out, got...)
	}
	slices.SortFunc(out, func(a, b SeqCheck) int { return cmp.Compare(a.Seq, b.Seq) })
	return out, nil
}

// sqlArgs gathers a statement's arguments as its SQL is written.
type sqlArgs struct{ args []any }

// in is "(?, ...)" for vals, appended.
func (q *sqlArgs) in(vals []string) string {
	for _, v := range vals {
		q.args = append(q.args, v)
	}
	return inList(len(vals))
}

// readChecks reads check results joined with their results' work ids;
// tail is the WHERE, ORDER and LIMIT, over args.
func (s *Store) readChecks(ctx context.Context, read ChecksRead, tail string, args ...any) ([]SeqCheck, error) {
	kept, sparse := read.Feed, read.Sparse
	if kept {
		if s.opts.Feed == nil {
			return nil, errors.New("a read of the feed's metrics from a store that keeps none (Options.Feed)")
		}
		read = *s.opts.Feed
	}
	// Each expression is written with its arguments appended as it is
	// written, so placeholders and arguments keep one order.
	var q sqlArgs
	checkIn := func(names []string) string { return `c.check_name IN ` + q.in(names) }
	metrics := func() string {
		m := "c.metrics"
		if read.MetricsOf != nil {
			// The server leaves the other rows' metrics unread (not even
			// decompressed), and sends none.
			m = `'{}'`
			if len(read.MetricsOf) > 0 {
				m = `CASE WHEN ` + checkIn(read.MetricsOf) + ` THEN c.metrics ELSE '{}' END`
			}
		}
		if kept {
			// Rows stored before schema 7, or by a store without Feed,
			// have none kept (empty).
			m = `CASE WHEN c.feed_metrics <> '' THEN c.feed_metrics ELSE ` + m + ` END`
		}
		return m
	}
	// col writes a column; on a sparse read, empty ('' or 0) for a row
	// skipped: the server still reads the row, but the client decodes (and
	// allocates) nothing of it.
	col := func(_ string, c func() string) string { return c() }
	full := "1"
	if sparse && read.MetricsOf != nil {
		wanted := func() string {
			if len(read.MetricsOf) == 0 {
				return `c.findings <> '[]'`
			}
			return `(c.findings <> '[]' OR ` + checkIn(read.MetricsOf) + `)`
		}
		full = `CASE WHEN ` + wanted() + ` THEN 1 ELSE 0 END`
		col = func(zero string, c func() string) string {
			w := wanted()
			return `CASE WHEN ` + w + ` THEN ` + c() + ` ELSE ` + zero + ` END`
		}
	}
	name := func(c string) func() string { return func() string { return c } }
	cols := []string{col("''", name("c.result_id")), col("''", name("c.node")), col("0", name("c.finished")),
		col("''", name("c.check_name")), col("''", name("c.status")), col("''", name("c.reason")),
		col("''", name("c.findings")), col("''", metrics), col("0", name("c.duration_ms"))}
	// The results' work ids and triggers are read apart, once a result
	// (a join looked its result up again for each of its ~13 rows: on
	// PostgreSQL, half of this read's server time).
	rows, err := s.r.QueryContext(ctx, `SELECT c.id, `+full+`, `+strings.Join(cols, ", ")+`
		FROM check_results c
		`+tail, append(q.args, args...)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SeqCheck
	for rows.Next() {
		var sc SeqCheck
		var fin, whole int64
		var findings, metrics, status string
		if err := rows.Scan(&sc.Seq, &whole, &sc.ResultID, &sc.Node, &fin, &sc.Check.Name, &status,
			&sc.Check.Reason, &findings, &metrics, &sc.Check.DurationMS); err != nil {
			return nil, err
		}
		if whole == 0 {
			out = append(out, SeqCheck{Seq: sc.Seq, Skipped: true})
			continue
		}
		sc.Finished = fromMS(fin)
		sc.Check.Status = report.Status(status)
		if sc.Check.Findings, err = decodeFindings(findings); err != nil {
			return nil, fmt.Errorf("result %s check %s findings: %w", sc.ResultID, sc.Check.Name, err)
		}
		if sc.Check.Metrics, err = decodeMetrics(metrics, sc.Check.Name, read.KeepMetric); err != nil {
			return nil, fmt.Errorf("result %s check %s metrics: %w", sc.ResultID, sc.Check.Name, err)
		}
		if len(sc.Check.Metrics) == 0 {
			sc.Check.Metrics = nil
		}
		out = append(out, sc)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows.Close()
	return out, s.addResultTriggers(ctx, out)
}

// addResultTriggers fills in the rows' work ids and triggers from their
// results; a result gone (pruned a moment ago) leaves them empty, as its
// rows would have read.
func (s *Store) addResultTriggers(ctx context.Context, rows []SeqCheck) error {
	var ids []any
	seen := make(map[string]bool)
	for i := range rows {
		if id := rows[i].ResultID; !rows[i].Skipped && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	type trig struct{ work, trigger string }
	by := make(map[string]trig, len(ids))
	err := resultsByID(ctx, s.r, "id, work_id, triggered_by", ids, func(r *sql.Rows) error {
		var id string
		var t trig
		if err := r.Scan(&id, &t.work, &t.trigger); err != nil {
			return err
		}
		by[id] = t
		return nil
	})
	if err != nil {
		return fmt.Errorf("results of check results: %w", err)
	}
	for i := range rows {
		t := by[rows[i].ResultID]
		rows[i].WorkID, rows[i].Trigger = t.work, t.trigger
	}
	return nil
}

// LastCheckSeq is the number of the last stored check result (0: none).
func (s *Store) LastCheckSeq(ctx context.Context) (int64, error) {
	var v sql.NullInt64
	if err := s.r.QueryRowContext(ctx, `SELECT MAX(id) FROM check_results`).Scan(&v); err != nil {
		return 0, fmt.Errorf("last check result: %w", err)
	}
	return v.Int64, nil
}

// loadResultChecks reads one result's check rows (node, finished,
// result id, limit) along the (node, finished) index: every row of a
// result carries the result's node and finished time. By result id
// alone, which no index has, it read the whole table.
const loadResultChecks = `SELECT check_name, status, reason, findings, metrics, duration_ms
	FROM check_results WHERE node = ? AND finished = ? AND result_id = ? ORDER BY id LIMIT ?`

// LoadResult reads one result back whole: its header and its checks in
// the order they were stored, or ErrNotFound, with the node's newest
// inventory: a result's own is not kept (agents send the same one with
// every result, the node's row holds the last), and a campaign judging
// the result reads it (no GPU in it is inconclusive). A coordinator uses
// it for a result another coordinator, or its own previous stream,
// acknowledged (docs/ha.md, routing).
func (s *Store) LoadResult(ctx context.Context, id string) (Result, error) {
	h, err := s.Result(ctx, id)
	if err != nil {
		return Result{}, err
	}
	r := Result{ID: h.ID, Node: h.Node, WorkID: h.WorkID, Started: h.Started, Finished: h.Finished, Status: h.Status,
		Full: h.Full, Trigger: h.Trigger}
	rows, err := s.r.QueryContext(ctx, loadResultChecks, h.Node, ms(h.Finished), id, maxLimit)
	if err != nil {
		return Result{}, fmt.Errorf("result %s checks: %w", id, err)
	}
	defer rows.Close()
	for rows.Next() {
		var c report.CheckResult
		var status, findings, metrics string
		if err := rows.Scan(&c.Name, &status, &c.Reason, &findings, &metrics, &c.DurationMS); err != nil {
			return Result{}, fmt.Errorf("result %s checks: %w", id, err)
		}
		c.Status = report.Status(status)
		if err := json.Unmarshal([]byte(findings), &c.Findings); err != nil {
			return Result{}, fmt.Errorf("result %s check %s findings: %w", id, c.Name, err)
		}
		if err := json.Unmarshal([]byte(metrics), &c.Metrics); err != nil {
			return Result{}, fmt.Errorf("result %s check %s metrics: %w", id, c.Name, err)
		}
		if len(c.Metrics) == 0 {
			c.Metrics = nil
		}
		r.Checks = append(r.Checks, c)
	}
	if err := rows.Err(); err != nil {
		return Result{}, fmt.Errorf("result %s checks: %w", id, err)
	}
	var inv string
	err = s.r.QueryRowContext(ctx, `SELECT inventory FROM nodes WHERE name = ?`, r.Node).Scan(&inv)
	if err != nil && err != sql.ErrNoRows {
		return Result{}, fmt.Errorf("result %s inventory: %w", id, err)
	}
	if inv != "" && inv != "{}" {
		r.Inventory = &report.Inventory{}
		if err := json.Unmarshal([]byte(inv), r.Inventory); err != nil {
			return Result{}, fmt.Errorf("result %s inventory: %w", id, err)
		}
	}
	return r, nil
}
