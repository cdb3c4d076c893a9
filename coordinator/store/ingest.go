package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// Result is one inspection pass of one node, as an agent reported it.
type Result struct {
	ID       string
	Node     string
	WorkID   string // empty for the agent's own schedule
	Started  time.Time
	Finished time.Time
	Status   report.Status
	Full     bool   // every passive check ran
	Trigger  string // what started the pass (wire.Trigger*); "" from an old agent
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
	prep *prepared
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
	// Computed here, on the caller's goroutine, so the writers only write.
	prep := prepare(&r, &s.orders, s.opts.Feed)
	req := &ingestReq{r: r, prep: prep, done: make(chan struct{}), dupOf: -1}
	q := s.ingest[s.shard(r.Node)]
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return Ack{}, ErrClosed
	}
	select {
	case q <- req:
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

// writer drains queue n: it takes what is waiting, lingers up to
// BatchDelay for more while the batch is not full, and commits the lot in
// one transaction. Close closes the queue; what is left is still committed.
func (s *Store) writer(n int) {
	queue := s.ingest[n]
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	batch := make([]*ingestReq, 0, s.opts.MaxBatch)
	for {
		first, ok := <-queue
		if !ok {
			return
		}
		batch = append(batch[:0], first)
		open := s.fill(queue, &batch, timer)
		s.commit(n, batch)
		clear(batch)
		if !open {
			// The queue was closed while filling; finish what remains.
			for req := range queue {
				s.commit(n, []*ingestReq{req})
			}
			return
		}
	}
}

// fill adds queued requests to batch; it reports false when the queue closed.
func (s *Store) fill(queue chan *ingestReq, batch *[]*ingestReq, timer *time.Timer) bool {
	max := s.opts.MaxBatch
	// First whatever is already queued, without waiting.
	for len(*batch) < max {
		select {
		case req, ok := <-queue:
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
		case req, ok := <-queue:
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

func (s *Store) commit(writer int, batch []*ingestReq) {
	start := time.Now()
	stored := s.opts.Now()
	err := s.commitTx(&s.inv[writer], batch, stored)
	took := time.Since(start)
	if err != nil {
		s.log.Error().Err(err).Int("results", len(batch)).Msg("store: batch commit failed")
	} else {
		// Counted before anyone is answered: a caller that saw its ack
		// also sees the batch in Stats and OnCommit.
		s.batches.Add(1)
		s.committed.Add(uint64(len(batch)))
		s.commitNS.Add(uint64(took))
		if s.opts.OnCommit != nil {
			s.opts.OnCommit(len(batch), took)
		}
		s.log.Debug().Int("results", len(batch)).Dur("took_ms", took).Msg("store: batch committed")
	}
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

// insertInventory appends a history row for inv, changed or not (the schema
// migration seeds each node's history with it).
func insertInventory(ctx context.Context, tx *sqldb.Tx, node string, inv *report.Inventory, at int64) error {
	p, err := prepareInventory(inv)
	if err != nil {
		return fmt.Errorf("inventory of %s: %w", node, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO inventory_history
		(node, time, hash, driver_version, gpu_serials, hca_firmware, inventory) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		node, at, p.hash, p.driver, p.serials, p.firmware, p.raw); err != nil {
		return fmt.Errorf("inventory history of %s: %w", node, err)
	}
	return nil
}
