package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
)

// How a batch is written. Every SQL statement is a cgo call, and a
// goroutine coming back from a cgo call waits for the scheduler; in a
// coordinator ingesting from a thousand streams many goroutines are
// runnable, so a writer that spends ~45 statements on each 13-check result
// waits in the run queue more than it writes (measured: ~6,000 check
// results/s on two cores, the writer mostly off-CPU). So:
//   - everything that needs no database — JSON of findings, metrics and
//     inventory, hashes, details — is computed by Ingest's caller, on many
//     goroutines at once, before the result is queued (prepare);
//   - a batch is written with a few multi-row statements per table;
//   - a node's inventory is written only when it differs from the one
//     stored, which the writer remembers (invCache): agents send the same
//     inventory with every result, and its JSON is made only then.

// prepared is a result's rows, computed outside the writer.
type prepared struct {
	checks []preparedCheck
	day    string   // the UTC day of Finished, for the summaries
	invSum [16]byte // inventorySum of the result's inventory, when it has one
}

type preparedCheck struct {
	findings, metrics, detail, reason string
	duration                          float64
}

// preparedInventory is one inventory's stored forms, made only when it is
// written (it changed): JSON twice over costs more than the rest of a
// result's preparation.
type preparedInventory struct {
	raw      string // the inventory's JSON (nodes.inventory, history)
	hash     string // of its identity (inventoryHash): "a change for the history"
	driver   string
	serials  string // JSON list of GPU serials
	firmware string // JSON map of HCA firmware
}

// prepare computes a validated result's rows. The findings and metrics
// JSON of all its checks are appended to one buffer and made into one
// string, which the checks' columns are substrings of (jsonenc.go).
func prepare(r *Result, orders *metricOrders) *prepared {
	p := &prepared{checks: make([]preparedCheck, len(r.Checks)), day: r.Finished.UTC().Format(time.DateOnly)}
	bp := jsonBufs.Get().(*[]byte)
	buf := (*bp)[:0]
	var endsArr [2 * 16]int
	ends := endsArr[:0]
	for i := range r.Checks {
		c := &r.Checks[i]
		buf = appendFindingsJSON(buf, c.Findings)
		ends = append(ends, len(buf))
		buf = appendMetricsJSON(buf, orders, c.Name, c.Metrics)
		ends = append(ends, len(buf))
	}
	all := string(buf)
	if cap(buf) <= maxPooledJSON {
		*bp = buf
		jsonBufs.Put(bp)
	}
	start := 0
	for i := range r.Checks {
		c := &r.Checks[i]
		f, m := ends[2*i], ends[2*i+1]
		p.checks[i] = preparedCheck{findings: all[start:f], metrics: all[f:m], detail: CheckDetail(*c),
			reason: clip(c.Reason), duration: finite(c.DurationMS)}
		start = m
	}
	if r.Inventory != nil {
		p.invSum = inventorySum(r.Inventory)
	}
	return p
}

// inventorySum fingerprints every field of an inventory, cheaply (no
// JSON): the writer compares it with the last one it wrote for the node.
// TestInventorySumCoversEveryField fails when a field is added to the
// report's inventory types and not here.
func inventorySum(inv *report.Inventory) [16]byte {
	b := make([]byte, 0, 1024)
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	num := func(v uint64) { b = binary.AppendUvarint(b, v) }
	str(inv.DriverVersion)
	str(inv.CUDAVersion)
	str(inv.Kernel)
	str(inv.FabricManagerVersion)
	str(inv.RDMAStack)
	num(uint64(len(inv.GPUs)))
	for _, g := range inv.GPUs {
		num(uint64(int64(g.Index)))
		str(g.Name)
		str(g.UUID)
		str(g.PCIBusID)
		str(g.Serial)
		str(g.VBIOSVersion)
		num(g.MemoryTotalMiB)
	}
	num(uint64(len(inv.HCAs)))
	for _, h := range inv.HCAs {
		str(h.Name)
		str(h.Model)
		str(h.FWVersion)
		num(uint64(len(h.Ports)))
		for _, p := range h.Ports {
			num(uint64(int64(p.Port)))
			str(p.State)
			str(p.PhysState)
			num(math.Float64bits(p.RateGbps))
			str(p.LinkLayer)
		}
	}
	sum := sha256.Sum256(b)
	var out [16]byte
	copy(out[:], sum[:])
	return out
}

func prepareInventory(inv *report.Inventory) (*preparedInventory, error) {
	raw, err := json.Marshal(inv)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	hash, err := inventoryHash(inv)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
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
		return nil, fmt.Errorf("inventory: %w", err)
	}
	fj, err := json.Marshal(fw) // encoding/json sorts map keys
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	return &preparedInventory{raw: string(raw), hash: hash, driver: inv.DriverVersion, serials: string(sj), firmware: string(fj)}, nil
}

// invCache remembers, per node, the inventory last written to nodes and
// the hash of its newest history row, so that an unchanged inventory costs
// no statement. It is right only while every write of a node's inventory
// goes through it: the writer (commitTx) and NodeJoined hold mu from before
// their transaction until they have recorded what it committed.
type invCache struct {
	mu sync.Mutex
	m  map[string]invSeen
}

type invSeen struct {
	sum  [16]byte // inventorySum of the inventory in nodes
	hist string   // hash of the newest inventory_history row
}

// storedRow is an already stored result's owner and stored time.
type storedRow struct {
	node   string
	stored int64
}

// commitTx writes a batch in one transaction: results already stored get
// their original ack (or a conflict, when another node owns the id), copies
// within the batch are left to commit, the rest is written.
func (s *Store) commitTx(batch []*ingestReq, stored time.Time) error {
	ctx := context.Background() // a batch is committed whole, whoever stopped waiting
	s.inv.mu.Lock()
	defer s.inv.mu.Unlock()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store results: begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit this is a no-op
	storedMS := stored.UnixMilli()

	unique := make(map[string]bool, len(batch))
	ids := make([]any, 0, len(batch))
	for _, req := range batch {
		if !unique[req.r.ID] {
			unique[req.r.ID] = true
			ids = append(ids, req.r.ID)
		}
	}
	known, err := storedResults(ctx, tx, ids)
	if err != nil {
		return err
	}

	checks := 0
	for _, req := range batch {
		checks += len(req.r.Checks)
	}
	results, full := make([]any, 0, 8*len(batch)), make([]any, 0, len(batch))
	checkRows, latest := make([]any, 0, 10*checks), make([]any, 0, 6*checks)
	sums := make(map[summaryKey]*summaryVal, checks)
	var fresh []*ingestReq
	// An id belongs to the node that stored it first, in an earlier batch
	// (known) or earlier in this one (inserting): a copy from that node is
	// answered with the original ack, one from another node is a conflict.
	inserting := make(map[string]int, len(batch))
	for i, req := range batch {
		r := &req.r
		owner := ""
		if k, ok := known[r.ID]; ok {
			owner = k.node
			if owner == r.Node {
				req.ack = Ack{ResultID: r.ID, Duplicate: true, Stored: fromMS(k.stored)}
				continue
			}
		} else if j, ok := inserting[r.ID]; ok {
			owner = batch[j].r.Node
			if owner == r.Node {
				req.dupOf = j
				continue
			}
		}
		if owner != "" {
			req.err = fmt.Errorf("%w: %s is %s's, not %s's", ErrIDConflict, r.ID, owner, r.Node)
			continue
		}
		inserting[r.ID] = i
		finished := ms(r.Finished)
		results = append(results, r.ID, r.Node, r.WorkID, ms(r.Started), finished, string(r.Status), boolInt(r.Full), storedMS, r.Trigger)
		for k := range r.Checks {
			c, pc := &r.Checks[k], &req.prep.checks[k]
			checkRows = append(checkRows, r.ID, r.Node, c.Name, string(c.Status), pc.reason, pc.findings, pc.metrics,
				pc.duration, finished, storedMS)
			latest = append(latest, r.Node, c.Name, string(c.Status), pc.detail, r.ID, finished)
			addSummary(sums, summaryKey{r.Node, c.Name, req.prep.day}, c.Status, pc.duration)
		}
		if r.Full {
			full = append(full, r.Node)
		}
		fresh = append(fresh, req)
		req.ack = Ack{ResultID: r.ID, Stored: fromMS(storedMS)}
	}

	steps := []struct {
		what, head, tail string
		cols             int
		args             []any
	}{
		{"results", `INSERT INTO results (id, node, work_id, started, finished, status, full, stored, triggered_by) VALUES `, ``, 9, results},
		{"check results", `INSERT INTO check_results
			(result_id, node, check_name, status, reason, findings, metrics, duration_ms, finished, stored) VALUES `, ``, 10, checkRows},
		// Rows apply in order, so a node's later result in the batch wins
		// as it would one statement at a time; a late one never overrides.
		{"latest checks", `INSERT INTO node_checks (node, check_name, status, detail, result_id, finished) VALUES `,
			` ON CONFLICT (node, check_name) DO UPDATE SET
				status = excluded.status, detail = excluded.detail,
				result_id = excluded.result_id, finished = excluded.finished
			WHERE excluded.finished > node_checks.finished
				OR (excluded.finished = node_checks.finished AND excluded.result_id >= node_checks.result_id)`, 6, latest},
		{"summaries", `INSERT INTO check_summaries
			(node, check_name, day, pass, warn, fail, error, skip, duration_ms_total) VALUES `,
			` ON CONFLICT (node, check_name, day) DO UPDATE SET
				pass = pass + excluded.pass, warn = warn + excluded.warn,
				fail = fail + excluded.fail, error = error + excluded.error,
				skip = skip + excluded.skip,
				duration_ms_total = duration_ms_total + excluded.duration_ms_total`, 9, summaryRows(sums)},
	}
	for _, st := range steps {
		if err := execRows(ctx, tx, st.head, st.tail, st.cols, st.args); err != nil {
			return fmt.Errorf("store results: %s: %w", st.what, err)
		}
	}
	if err := execIn(ctx, tx, `UPDATE nodes SET has_full = 1 WHERE has_full = 0 AND name IN `, full); err != nil {
		return fmt.Errorf("store results: mark full: %w", err)
	}
	seen, err := s.writeInventories(ctx, tx, fresh)
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store results: commit: %w", err)
	}
	if s.inv.m == nil {
		s.inv.m = make(map[string]invSeen, len(seen))
	}
	for node, v := range seen {
		s.inv.m[node] = v
	}
	return nil
}

// storedResults looks up which of ids are stored already.
func storedResults(ctx context.Context, tx *sql.Tx, ids []any) (map[string]storedRow, error) {
	out := map[string]storedRow{}
	for done := 0; done < len(ids); {
		n := chunkRows(len(ids) - done)
		rows, err := tx.QueryContext(ctx, `SELECT id, node, stored FROM results WHERE id IN `+inList(n), ids[done:done+n]...)
		if err != nil {
			return nil, fmt.Errorf("look up stored results: %w", err)
		}
		for rows.Next() {
			var id string
			var r storedRow
			if err := rows.Scan(&id, &r.node, &r.stored); err != nil {
				rows.Close()
				return nil, fmt.Errorf("look up stored results: %w", err)
			}
			out[id] = r
		}
		if err := rows.Close(); err != nil {
			return nil, fmt.Errorf("look up stored results: %w", err)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("look up stored results: %w", err)
		}
		done += n
	}
	return out, nil
}

// writeInventories records the inventories of the batch's new results, in
// batch order: the node's current inventory, and a history row for each
// change of identity. Unchanged inventories cost nothing. It returns what
// the cache should know once the transaction commits; s.inv.mu is held.
func (s *Store) writeInventories(ctx context.Context, tx *sql.Tx, fresh []*ingestReq) (map[string]invSeen, error) {
	seen := map[string]invSeen{}
	for _, req := range fresh {
		if req.r.Inventory == nil {
			continue
		}
		node, sum := req.r.Node, req.prep.invSum
		cur, ok := seen[node]
		if !ok {
			cur, ok = s.inv.m[node]
		}
		if ok && cur.sum == sum {
			continue
		}
		p, err := prepareInventory(req.r.Inventory)
		if err != nil {
			return nil, fmt.Errorf("store result %s: %w", req.r.ID, err)
		}
		if !ok {
			last, err := lastInventoryHash(ctx, tx, node)
			if err != nil {
				return nil, fmt.Errorf("store result %s: %w", req.r.ID, err)
			}
			cur.hist = last
		}
		hist, err := writeInventory(ctx, tx, node, p, ms(req.r.Finished), cur.hist)
		if err != nil {
			return nil, fmt.Errorf("store result %s: %w", req.r.ID, err)
		}
		seen[node] = invSeen{sum: sum, hist: hist}
	}
	return seen, nil
}

func lastInventoryHash(ctx context.Context, tx *sql.Tx, node string) (string, error) {
	var last string
	err := tx.QueryRowContext(ctx, `SELECT hash FROM inventory_history WHERE node = ? ORDER BY id DESC LIMIT 1`, node).Scan(&last)
	if err != nil && err != sql.ErrNoRows {
		return "", fmt.Errorf("inventory history of %s: %w", node, err)
	}
	return last, nil
}

// writeInventory sets the node's current inventory and appends a history
// row when its identity differs from last, the newest row's hash. It
// returns the newest row's hash afterwards.
func writeInventory(ctx context.Context, tx *sql.Tx, node string, p *preparedInventory, at int64, last string) (string, error) {
	if _, err := tx.ExecContext(ctx, `UPDATE nodes SET inventory = ? WHERE name = ?`, p.raw, node); err != nil {
		return "", fmt.Errorf("inventory of %s: %w", node, err)
	}
	if last == p.hash {
		return last, nil
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO inventory_history
		(node, time, hash, driver_version, gpu_serials, hca_firmware, inventory) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		node, at, p.hash, p.driver, p.serials, p.firmware, p.raw); err != nil {
		return "", fmt.Errorf("inventory history of %s: %w", node, err)
	}
	return p.hash, nil
}

func addSummary(sums map[summaryKey]*summaryVal, k summaryKey, st report.Status, durationMS float64) {
	v := sums[k]
	if v == nil {
		v = &summaryVal{}
		sums[k] = v
	}
	switch st {
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
	v.durationMS += durationMS
}

func summaryRows(sums map[summaryKey]*summaryVal) []any {
	out := make([]any, 0, 9*len(sums))
	for k, v := range sums {
		out = append(out, k.node, k.check, k.day, v.pass, v.warn, v.fail, v.errs, v.skip, v.durationMS)
	}
	return out
}

// Multi-row statements come in a few sizes only, so that the connection's
// statement cache keeps every shape prepared: n rows are written as
// chunks of 256, then 64, 16, 4 and 1. 256 rows of 10 columns stay well
// under SQLite's 32,766 parameters.
var chunkSizes = [...]int{256, 64, 16, 4, 1}

func chunkRows(left int) int {
	for _, n := range chunkSizes {
		if left >= n {
			return n
		}
	}
	return left
}

// placeholders is "(?, ?), (?, ?)": rows of cols values.
func placeholders(cols, rows int) string {
	var b strings.Builder
	row := "(?" + strings.Repeat(", ?", cols-1) + ")"
	b.Grow(rows * (len(row) + 2))
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(row)
	}
	return b.String()
}

// inList is "(?, ?, ...)" with n values.
func inList(n int) string {
	return "(?" + strings.Repeat(", ?", n-1) + ")"
}

// execRows runs head + VALUES rows + tail over args, cols values a row.
func execRows(ctx context.Context, tx *sql.Tx, head, tail string, cols int, args []any) error {
	rows := len(args) / cols
	for done := 0; done < rows; {
		n := chunkRows(rows - done)
		if _, err := tx.ExecContext(ctx, head+placeholders(cols, n)+tail, args[done*cols:(done+n)*cols]...); err != nil {
			return err
		}
		done += n
	}
	return nil
}

// execIn runs head + (?, ...) over args in chunks.
func execIn(ctx context.Context, tx *sql.Tx, head string, args []any) error {
	for done := 0; done < len(args); {
		n := chunkRows(len(args) - done)
		if _, err := tx.ExecContext(ctx, head+inList(n), args[done:done+n]...); err != nil {
			return err
		}
		done += n
	}
	return nil
}
