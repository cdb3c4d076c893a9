package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/report"
)

// Result is one inspection pass of one node, as an agent reported it.
type Result struct {
	ID       string
	Node     string
	WorkID   string // empty for the agent's own schedule
	Started  time.Time
	Finished time.Time
	Status   report.Status
	Full     bool // every passive check ran
	Checks   []report.CheckResult
	// Inventory, when set, is recorded on the node and in its history.
	Inventory *report.Inventory
}

// Ack says a result is durable. For a duplicate it is the original ack.
type Ack struct {
	ResultID  string
	Duplicate bool
	Stored    time.Time
}

const (
	maxIDLen     = 128
	maxNameLen   = 253
	maxChecks    = 256
	maxFindings  = 1024
	maxTextBytes = 4096
)

func validStatus(s report.Status, allowSkip bool) bool {
	switch s {
	case report.Pass, report.Warn, report.Fail, report.Error:
		return true
	case report.Skip:
		return allowSkip
	}
	return false
}

// Validate checks a result before it is queued, so that one bad result
// cannot fail the transaction it would share with others.
func (r *Result) Validate() error {
	switch {
	case r.ID == "" || len(r.ID) > maxIDLen:
		return fmt.Errorf("%w: id must be 1..%d bytes", ErrInvalid, maxIDLen)
	case r.Node == "" || len(r.Node) > maxNameLen:
		return fmt.Errorf("%w %s: node must be 1..%d bytes", ErrInvalid, r.ID, maxNameLen)
	case len(r.WorkID) > maxIDLen:
		return fmt.Errorf("%w %s: work id longer than %d bytes", ErrInvalid, r.ID, maxIDLen)
	case !validStatus(r.Status, false):
		return fmt.Errorf("%w %s: status %q is not pass, warn, fail or error", ErrInvalid, r.ID, r.Status)
	case len(r.Checks) > maxChecks:
		return fmt.Errorf("%w %s: %d checks, at most %d", ErrInvalid, r.ID, len(r.Checks), maxChecks)
	}
	seen := make(map[string]bool, len(r.Checks))
	for _, c := range r.Checks {
		switch {
		case c.Name == "" || len(c.Name) > maxNameLen:
			return fmt.Errorf("%w %s: a check without a name", ErrInvalid, r.ID)
		case seen[c.Name]:
			return fmt.Errorf("%w %s: check %s twice", ErrInvalid, r.ID, c.Name)
		case !validStatus(c.Status, true):
			return fmt.Errorf("%w %s: check %s status %q", ErrInvalid, r.ID, c.Name, c.Status)
		case len(c.Findings) > maxFindings:
			return fmt.Errorf("%w %s: check %s has %d findings, at most %d", ErrInvalid, r.ID, c.Name, len(c.Findings), maxFindings)
		}
		seen[c.Name] = true
	}
	return nil
}

type ingestReq struct {
	r    Result
	ack  Ack
	err  error
	done chan struct{}
	// dupOf is the batch index of an earlier request with the same id.
	dupOf int
}

// Ingest stores a result and returns once it is durable. A result whose id
// is already stored is not stored again: the answer is the original ack
// with Duplicate set. A cancelled ctx stops the wait, not the write.
func (s *Store) Ingest(ctx context.Context, r Result) (Ack, error) {
	if err := r.Validate(); err != nil {
		return Ack{}, err
	}
	if r.Finished.IsZero() {
		r.Finished = s.opts.Now()
	}
	if r.Started.IsZero() {
		r.Started = r.Finished
	}
	req := &ingestReq{r: r, done: make(chan struct{}), dupOf: -1}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return Ack{}, ErrClosed
	}
	select {
	case s.ingest <- req:
	case <-ctx.Done():
		s.mu.RUnlock()
		return Ack{}, fmt.Errorf("store result %s: %w", r.ID, ctx.Err())
	}
	s.mu.RUnlock()
	select {
	case <-req.done:
		return req.ack, req.err
	case <-ctx.Done():
		return Ack{}, fmt.Errorf("store result %s: %w", r.ID, ctx.Err())
	}
}

// writer drains the queue: it takes what is waiting, lingers up to
// BatchDelay for more while the batch is not full, and commits the lot in
// one transaction. Close closes the queue; what is left is still committed.
func (s *Store) writer() {
	defer close(s.writerDone)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	batch := make([]*ingestReq, 0, s.opts.MaxBatch)
	for {
		first, ok := <-s.ingest
		if !ok {
			return
		}
		batch = append(batch[:0], first)
		open := s.fill(&batch, timer)
		s.commit(batch)
		clear(batch)
		if !open {
			// The queue was closed while filling; finish what remains.
			for req := range s.ingest {
				s.commit([]*ingestReq{req})
			}
			return
		}
	}
}

// fill adds queued requests to batch; it reports false when the queue closed.
func (s *Store) fill(batch *[]*ingestReq, timer *time.Timer) bool {
	max := s.opts.MaxBatch
	// First whatever is already queued, without waiting.
	for len(*batch) < max {
		select {
		case req, ok := <-s.ingest:
			if !ok {
				return false
			}
			*batch = append(*batch, req)
			continue
		default:
		}
		break
	}
	if len(*batch) >= max || s.opts.BatchDelay <= 0 {
		return true
	}
	timer.Reset(s.opts.BatchDelay)
	defer timer.Stop()
	for len(*batch) < max {
		select {
		case req, ok := <-s.ingest:
			if !ok {
				return false
			}
			*batch = append(*batch, req)
		case <-timer.C:
			return true
		}
	}
	return true
}

// summaryKey groups check results into daily summaries.
type summaryKey struct{ node, check, day string }

type summaryVal struct {
	pass, warn, fail, errs, skip int
	durationMS                   float64
}

func (s *Store) commit(batch []*ingestReq) {
	start := time.Now()
	stored := s.opts.Now()
	err := s.commitTx(batch, stored)
	for _, req := range batch {
		switch {
		case err != nil:
			req.err = err
		case req.dupOf >= 0:
			first := batch[req.dupOf]
			req.ack, req.err = first.ack, first.err
			req.ack.Duplicate = true
		}
		close(req.done)
	}
	if err != nil {
		s.log.Error().Err(err).Int("results", len(batch)).Msg("store: batch commit failed")
		return
	}
	took := time.Since(start)
	s.batches.Add(1)
	s.committed.Add(uint64(len(batch)))
	s.commitNS.Add(uint64(took))
	s.log.Debug().Int("results", len(batch)).Dur("took", took).Msg("store: batch committed")
}

func (s *Store) commitTx(batch []*ingestReq, stored time.Time) error {
	ctx := context.Background() // a batch is committed whole, whoever stopped waiting
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store results: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	storedMS := stored.UnixMilli()
	firstOf := make(map[string]int, len(batch))
	sums := make(map[summaryKey]*summaryVal)
	for i, req := range batch {
		r := &req.r
		if j, ok := firstOf[r.ID]; ok {
			req.dupOf = j
			continue
		}
		firstOf[r.ID] = i
		res, err := tx.ExecContext(ctx, `INSERT INTO results (id, node, work_id, started, finished, status, full, stored)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`,
			r.ID, r.Node, r.WorkID, ms(r.Started), ms(r.Finished), string(r.Status), boolInt(r.Full), storedMS)
		if err != nil {
			return fmt.Errorf("store result %s: %w", r.ID, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			var node string
			var was int64
			if err := tx.QueryRowContext(ctx, `SELECT node, stored FROM results WHERE id = ?`, r.ID).Scan(&node, &was); err != nil {
				return fmt.Errorf("look up stored result %s: %w", r.ID, err)
			}
			if node != r.Node {
				req.err = fmt.Errorf("%w: %s is %s's, not %s's", ErrIDConflict, r.ID, node, r.Node)
				continue
			}
			req.ack = Ack{ResultID: r.ID, Duplicate: true, Stored: fromMS(was)}
			continue
		}
		if err := insertChecks(ctx, tx, r, storedMS, sums); err != nil {
			return err
		}
		if r.Full {
			if _, err := tx.ExecContext(ctx, `UPDATE nodes SET has_full = 1 WHERE name = ? AND has_full = 0`, r.Node); err != nil {
				return fmt.Errorf("store result %s: mark full: %w", r.ID, err)
			}
		}
		if r.Inventory != nil {
			if err := recordInventory(ctx, tx, r.Node, r.Inventory, ms(r.Finished)); err != nil {
				return fmt.Errorf("store result %s: %w", r.ID, err)
			}
		}
		req.ack = Ack{ResultID: r.ID, Stored: fromMS(storedMS)}
	}
	if err := upsertSummaries(ctx, tx, sums); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store results: commit: %w", err)
	}
	return nil
}

func insertChecks(ctx context.Context, tx *sql.Tx, r *Result, stored int64, sums map[summaryKey]*summaryVal) error {
	finished := ms(r.Finished)
	day := r.Finished.UTC().Format(time.DateOnly)
	for i := range r.Checks {
		c := &r.Checks[i]
		findings := c.Findings
		if findings == nil {
			findings = []report.Finding{}
		}
		fj, err := json.Marshal(findings)
		if err != nil {
			return fmt.Errorf("store result %s: check %s findings: %w", r.ID, c.Name, err)
		}
		mj, err := marshalMetrics(c.Metrics)
		if err != nil {
			return fmt.Errorf("store result %s: check %s metrics: %w", r.ID, c.Name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO check_results
			(result_id, node, check_name, status, reason, findings, metrics, duration_ms, finished, stored)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			r.ID, r.Node, c.Name, string(c.Status), clip(c.Reason), string(fj), mj, finite(c.DurationMS), finished, stored); err != nil {
			return fmt.Errorf("store result %s: check %s: %w", r.ID, c.Name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO node_checks (node, check_name, status, detail, result_id, finished)
			VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (node, check_name) DO UPDATE SET
				status = excluded.status, detail = excluded.detail,
				result_id = excluded.result_id, finished = excluded.finished
			WHERE excluded.finished > node_checks.finished
				OR (excluded.finished = node_checks.finished AND excluded.result_id >= node_checks.result_id)`,
			r.Node, c.Name, string(c.Status), CheckDetail(*c), r.ID, finished); err != nil {
			return fmt.Errorf("store result %s: latest %s: %w", r.ID, c.Name, err)
		}
		k := summaryKey{r.Node, c.Name, day}
		v := sums[k]
		if v == nil {
			v = &summaryVal{}
			sums[k] = v
		}
		switch c.Status {
		case report.Pass:
			v.pass++
		case report.Warn:
			v.warn++
		case report.Fail:
			v.fail++
		case report.Error:
			v.errs++
		case report.Skip:
			v.skip++
		}
		v.durationMS += finite(c.DurationMS)
	}
	return nil
}

func upsertSummaries(ctx context.Context, tx *sql.Tx, sums map[summaryKey]*summaryVal) error {
	for k, v := range sums {
		if _, err := tx.ExecContext(ctx, `INSERT INTO check_summaries
			(node, check_name, day, pass, warn, fail, error, skip, duration_ms_total)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (node, check_name, day) DO UPDATE SET
				pass = pass + excluded.pass, warn = warn + excluded.warn,
				fail = fail + excluded.fail, error = error + excluded.error,
				skip = skip + excluded.skip,
				duration_ms_total = duration_ms_total + excluded.duration_ms_total`,
			k.node, k.check, k.day, v.pass, v.warn, v.fail, v.errs, v.skip, v.durationMS); err != nil {
			return fmt.Errorf("store summary %s/%s/%s: %w", k.node, k.check, k.day, err)
		}
	}
	return nil
}

// marshalMetrics drops values JSON cannot carry; the report contract
// forbids them anyway.
func marshalMetrics(m map[string]float64) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	clean := make(map[string]float64, len(m))
	for k, v := range m {
		if finite(v) == v {
			clean[k] = v
		}
	}
	b, err := json.Marshal(clean)
	return string(b), err
}

func finite(v float64) float64 {
	if v != v || v > 1e308 || v < -1e308 {
		return 0
	}
	return v
}

func clip(s string) string {
	if len(s) <= maxTextBytes {
		return s
	}
	return s[:maxTextBytes]
}

// CheckDetail is the short why of a check's status, for node state reasons
// and listings: its worst finding ("GPU3 ECC_UNCORRECTABLE"), else its
// reason; empty for a clean pass.
func CheckDetail(c report.CheckResult) string {
	var worst *report.Finding
	for i := range c.Findings {
		f := &c.Findings[i]
		if worst == nil || (f.Severity == report.SevFail && worst.Severity != report.SevFail) {
			worst = f
		}
	}
	if worst != nil {
		d := strings.TrimSpace(worst.Component + " " + worst.Code)
		if n := len(c.Findings); n > 1 {
			d += fmt.Sprintf(" (+%d more)", n-1)
		}
		return d
	}
	r := c.Reason
	if len(r) > 200 {
		r = r[:200]
	}
	return r
}

// inventoryIdentity is what makes an inventory change: the hardware and
// software identity, not link state or rate, which come and go.
func inventoryIdentity(inv *report.Inventory) report.Inventory {
	id := *inv
	id.HCAs = make([]report.HCA, len(inv.HCAs))
	for i, h := range inv.HCAs {
		h.Ports = make([]report.Port, len(inv.HCAs[i].Ports))
		for j, p := range inv.HCAs[i].Ports {
			h.Ports[j] = report.Port{Port: p.Port, LinkLayer: p.LinkLayer}
		}
		id.HCAs[i] = h
	}
	return id
}

func inventoryHash(inv *report.Inventory) (string, error) {
	b, err := json.Marshal(inventoryIdentity(inv))
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), nil
}

// recordInventory sets the node's current inventory and appends a history
// row when its identity changed since the last row.
func recordInventory(ctx context.Context, tx *sql.Tx, node string, inv *report.Inventory, at int64) error {
	raw, err := json.Marshal(inv)
	if err != nil {
		return fmt.Errorf("inventory of %s: %w", node, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE nodes SET inventory = ? WHERE name = ?`, string(raw), node); err != nil {
		return fmt.Errorf("inventory of %s: %w", node, err)
	}
	hash, err := inventoryHash(inv)
	if err != nil {
		return fmt.Errorf("inventory of %s: %w", node, err)
	}
	var last string
	err = tx.QueryRowContext(ctx, `SELECT hash FROM inventory_history WHERE node = ? ORDER BY id DESC LIMIT 1`, node).Scan(&last)
	if err != nil && err != sql.ErrNoRows {
		return fmt.Errorf("inventory history of %s: %w", node, err)
	}
	if last == hash {
		return nil
	}
	return insertInventory(ctx, tx, node, inv, at)
}

func insertInventory(ctx context.Context, tx *sql.Tx, node string, inv *report.Inventory, at int64) error {
	hash, err := inventoryHash(inv)
	if err != nil {
		return fmt.Errorf("inventory of %s: %w", node, err)
	}
	raw, err := json.Marshal(inv)
	if err != nil {
		return fmt.Errorf("inventory of %s: %w", node, err)
	}
	serials := make([]string, 0, len(inv.GPUs))
	for _, g := range inv.GPUs {
		serials = append(serials, g.Serial)
	}
	fw := make(map[string]string, len(inv.HCAs))
	for _, h := range inv.HCAs {
		fw[h.Name] = h.FWVersion
	}
	sj, err := json.Marshal(serials)
	if err != nil {
		return fmt.Errorf("inventory of %s: %w", node, err)
	}
	fj, err := json.Marshal(fw) // encoding/json sorts map keys
	if err != nil {
		return fmt.Errorf("inventory of %s: %w", node, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO inventory_history
		(node, time, hash, driver_version, gpu_serials, hca_firmware, inventory) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		node, at, hash, inv.DriverVersion, string(sj), string(fj), string(raw)); err != nil {
		return fmt.Errorf("inventory history of %s: %w", node, err)
	}
	return nil
}
