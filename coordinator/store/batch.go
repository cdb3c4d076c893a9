package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
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
	invSum [16]byte // inventorySum of the result's inventory, when it has one
}

type preparedCheck struct {
	findings, metrics, detail, reason string
	feed                              string // the metrics Options.Feed reads; empty without Feed
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
func prepare(r *Result, orders *metricOrders, feed *ChecksRead) *prepared {
	p := &prepared{checks: make([]preparedCheck, len(r.Checks))}
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
			reason: clip(c.Reason), duration: finite(c.DurationMS), feed: feedMetricsJSON(feed, c.Name, c.Metrics)}
		start = m
	}
	if r.Inventory != nil {
		p.invSum = inventorySum(r.Inventory)
	}
	return p
}

// feedMetricsJSON is the JSON of the metrics feed reads of a check ('{}'
// when it reads none of this check's), or empty without a feed.
func feedMetricsJSON(feed *ChecksRead, check string, m map[string]float64) string {
	if feed == nil {
		return ""
	}
	if feed.MetricsOf != nil && !slices.Contains(feed.MetricsOf, check) {
		return "{}"
	}
	var keys []string
	for k := range m {
		if feed.KeepMetric == nil || feed.KeepMetric(check, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return string(appendSortedMetricsJSON(make([]byte, 0, 2+32*len(keys)), keys, m))
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
// no statement. Each writer has its own, for the nodes it stores
// (Store.shard). It is right only while every write of a node's inventory
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
// within the batch are left to commit, the rest is written. inv is the
// writer's cache. A transaction PostgreSQL aborted as a deadlock or a
// serialization failure (another coordinator's, or another writer's over
// a result id two nodes sent) is tried again, whole.
func (s *Store) commitTx(inv *invCache, batch []*ingestReq, stored time.Time) error {
	ctx := context.Background() // a batch is committed whole, whoever stopped waiting
	inv.mu.Lock()
	defer inv.mu.Unlock()
	var seen map[string]invSeen
	var err error
	for try := 1; ; try++ {
		err = s.w.Tx(ctx, func(tx *sqldb.Tx) error {
			for _, req := range batch { // a fenced or failed try leaves no half answers
				req.ack, req.err, req.dupOf = Ack{}, nil, -1
			}
			var err error
			seen, err = s.writeBatch(ctx, tx, inv, batch, stored.UnixMilli())
			return err
		})
		if err == nil || try == maxCommitTries || !sqldb.Retryable(err) {
			break
		}
		s.log.Warn().Err(err).Int("try", try).Int("results", len(batch)).Msg("store: batch aborted by the database, trying again")
	}
	if err != nil {
		return fmt.Errorf("store results: %w", err)
	}
	if inv.m == nil {
		inv.m = make(map[string]invSeen, len(seen))
	}
	for node, v := range seen {
		inv.m[node] = v
	}
	return nil
}

// maxCommitTries bounds the tries of one batch (commitTx).
const maxCommitTries = 5

func (s *Store) writeBatch(ctx context.Context, tx *sqldb.Tx, inv *invCache, batch []*ingestReq, storedMS int64) (map[string]invSeen, error) {
	// Which copy in the batch is the original depends on who stored the
	// id before. SQLite's one writer looks the ids up first; on
	// PostgreSQL the insert tells (another coordinator may store an id a
	// moment before), and only ids it did not insert are looked up.
	var known map[string]storedRow
	if tx.Dialect() != sqldb.Postgres {
		unique := make(map[string]bool, len(batch))
		ids := make([]any, 0, len(batch))
		for _, req := range batch {
			if !unique[req.r.ID] {
				unique[req.r.ID] = true
				ids = append(ids, req.r.ID)
			}
		}
		var err error
		if known, err = storedResults(ctx, tx, ids); err != nil {
			return nil, err
		}
	}
	fresh, lost, err := s.insertResults(ctx, tx, resolveCopies(batch, known, nil), storedMS)
	if err != nil {
		return nil, err
	}
	if len(lost) > 0 {
		if known, err = storedResults(ctx, tx, lost); err != nil {
			return nil, err
		}
		again := make(map[string]bool, len(lost))
		for _, id := range lost {
			if _, ok := known[id.(string)]; !ok {
				return nil, fmt.Errorf("results: %s neither inserted nor stored", id)
			}
			again[id.(string)] = true
		}
		resolveCopies(batch, known, again)
	}

	checks := 0
	for _, req := range fresh {
		checks += len(req.r.Checks)
	}
	checkRows := make([][]any, 0, checks)
	latestNewest := make(map[[2]string][]any, checks)
	var full []any
	for _, req := range fresh {
		r := &req.r
		finished := ms(r.Finished)
		for k := range r.Checks {
			c, pc := &r.Checks[k], &req.prep.checks[k]
			checkRows = append(checkRows, []any{r.ID, r.Node, c.Name, string(c.Status), pc.reason, pc.findings, pc.metrics,
				pc.duration, finished, storedMS, pc.feed})
			// Only the newest row per node and check can win (as rows
			// applied one at a time would), and PostgreSQL refuses one
			// statement updating a row twice.
			key := [2]string{r.Node, c.Name}
			if cur, ok := latestNewest[key]; !ok || newerRow(finished, r.ID, cur[5].(int64), cur[4].(string)) {
				latestNewest[key] = []any{r.Node, c.Name, string(c.Status), pc.detail, r.ID, finished}
			}
		}
		if r.Full {
			full = append(full, r.Node)
		}
		req.ack = Ack{ResultID: r.ID, Stored: fromMS(storedMS)}
	}
	if err := s.insertCheckRows(ctx, tx, checkRows); err != nil {
		return nil, fmt.Errorf("check results: %w", err)
	}

	steps := []struct {
		what, head, tail string
		types            []string // the columns' PostgreSQL types, for unnest
		args             []any
	}{
		{"latest checks", `INSERT INTO node_checks (node, check_name, status, detail, result_id, finished) VALUES `,
			` ON CONFLICT (node, check_name) DO UPDATE SET
				status = excluded.status, detail = excluded.detail,
				result_id = excluded.result_id, finished = excluded.finished
			WHERE excluded.finished > node_checks.finished
				OR (excluded.finished = node_checks.finished AND excluded.result_id >= node_checks.result_id)`,
			[]string{"text", "text", "text", "text", "text", "bigint"}, latestRows(latestNewest)},
	}
	for _, st := range steps {
		var err error
		if tx.Dialect() == sqldb.Postgres {
			err = execUnnest(ctx, tx, strings.TrimSuffix(st.head, "VALUES "), st.tail, st.types, st.args)
		} else {
			err = execRows(ctx, tx, st.head, st.tail, len(st.types), st.args)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", st.what, err)
		}
	}
	sortAny(full)
	if err := execIn(ctx, tx, `UPDATE nodes SET has_full = 1 WHERE has_full = 0 AND name IN `, full); err != nil {
		return nil, fmt.Errorf("mark full: %w", err)
	}
	return writeInventories(ctx, tx, inv, fresh)
}

// resolveCopies answers the requests whose ids are stored already (known)
// or sent twice in the batch, and returns the others, to be inserted. An
// id belongs to the node that stored it first, in an earlier batch
// (known) or earlier in this one: a copy from that node is answered with
// the original ack, one from another node is a conflict. With only, just
// the requests of those ids are answered again (all of them known).
func resolveCopies(batch []*ingestReq, known map[string]storedRow, only map[string]bool) []*ingestReq {
	inserting := make(map[string]int, len(batch))
	var fresh []*ingestReq
	for i, req := range batch {
		r := &req.r
		if only != nil {
			if !only[r.ID] {
				continue
			}
			req.ack, req.err, req.dupOf = Ack{}, nil, -1
		}
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
		fresh = append(fresh, req)
	}
	return fresh
}

// newerRow is CheckState.Newer on stored columns.
func newerRow(finished int64, id string, curFinished int64, curID string) bool {
	if finished != curFinished {
		return finished > curFinished
	}
	return id >= curID
}

// latestRows flattens the newest rows in key order: writers that lock rows
// in one order cannot deadlock each other (several coordinators on
// PostgreSQL).
func latestRows(m map[[2]string][]any) []any {
	keys := make([][2]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] < keys[j][1]
	})
	out := make([]any, 0, 6*len(keys))
	for _, k := range keys {
		out = append(out, m[k]...)
	}
	return out
}

func sortAny(v []any) {
	sort.Slice(v, func(i, j int) bool { return v[i].(string) < v[j].(string) })
}

const resultColumns = `id, node, work_id, started, finished, status, "full", stored, triggered_by`

func resultRow(r *Result, storedMS int64) []any {
	return []any{r.ID, r.Node, r.WorkID, ms(r.Started), ms(r.Finished), string(r.Status), boolInt(r.Full), storedMS, r.Trigger}
}

// insertResults writes the results' rows and returns the requests whose
// row it wrote, and the ids of those whose row it did not. On SQLite that
// is all of them: the one writer holds the database and looked the ids up
// first. On PostgreSQL the rows go in as one INSERT ... SELECT FROM
// unnest(arrays) ... ON CONFLICT DO NOTHING RETURNING id: a result stored
// before (by this coordinator or another one, also a moment ago) is not
// inserted, and its copies are answered as what is stored says.
func (s *Store) insertResults(ctx context.Context, tx *sqldb.Tx, fresh []*ingestReq, storedMS int64) ([]*ingestReq, []any, error) {
	if len(fresh) == 0 {
		return nil, nil, nil
	}
	if tx.Dialect() != sqldb.Postgres {
		args := make([]any, 0, 9*len(fresh))
		for _, req := range fresh {
			args = append(args, resultRow(&req.r, storedMS)...)
		}
		if err := execRows(ctx, tx, `INSERT INTO results (`+resultColumns+`) VALUES `, ``, 9, args); err != nil {
			return nil, nil, fmt.Errorf("results: %w", err)
		}
		return fresh, nil, nil
	}
	// In id order: two writers (or coordinators) inserting the same ids
	// take their locks in one order, and wait for each other rather than
	// deadlock.
	byID := make([]*ingestReq, len(fresh))
	copy(byID, fresh)
	sort.Slice(byID, func(i, j int) bool { return byID[i].r.ID < byID[j].r.ID })
	args := make([]any, 0, 9*len(fresh))
	for _, req := range byID {
		args = append(args, resultRow(&req.r, storedMS)...)
	}
	q, err := tx.QueryContext(ctx, `INSERT INTO results (`+resultColumns+`) SELECT * FROM `+
		unnestOf(resultTypes)+
		` ON CONFLICT (id) DO NOTHING RETURNING id`, columnArrays(resultTypes, args)...)
	if err != nil {
		return nil, nil, fmt.Errorf("results: %w", err)
	}
	inserted := make(map[string]bool, len(fresh))
	for q.Next() {
		var id string
		if err := q.Scan(&id); err != nil {
			q.Close()
			return nil, nil, fmt.Errorf("results: %w", err)
		}
		inserted[id] = true
	}
	if err := q.Err(); err != nil {
		return nil, nil, fmt.Errorf("results: %w", err)
	}
	if len(inserted) == len(fresh) {
		return fresh, nil, nil
	}
	var lost []any
	out := fresh[:0:0]
	for _, req := range fresh {
		if inserted[req.r.ID] {
			out = append(out, req)
		} else {
			lost = append(lost, req.r.ID)
		}
	}
	return out, lost, nil
}

var resultTypes = []string{"text", "text", "text", "bigint", "bigint", "text", "bigint", "bigint", "text"}

// unnestOf is "unnest(?::text[], ?::bigint[], ...)": rows sent as one
// array per column, a single parameter each however many rows (PostgreSQL
// takes at most 65,535 parameters; a batch would need chunks).
func unnestOf(types []string) string {
	parts := make([]string, len(types))
	for i, t := range types {
		parts[i] = "?::" + t + "[]"
	}
	return "unnest(" + strings.Join(parts, ", ") + ")"
}

// columnArrays turns row-major args (len(types) a row) into one typed
// slice per column, which pgx sends as PostgreSQL arrays.
func columnArrays(types []string, args []any) []any {
	n := len(types)
	rows := len(args) / n
	out := make([]any, n)
	for c, t := range types {
		switch t {
		case "text":
			col := make([]string, rows)
			for r := range rows {
				col[r] = args[r*n+c].(string)
			}
			out[c] = col
		case "bigint":
			col := make([]int64, rows)
			for r := range rows {
				switch v := args[r*n+c].(type) {
				case int64:
					col[r] = v
				case int:
					col[r] = int64(v)
				}
			}
			out[c] = col
		default: // double precision
			col := make([]float64, rows)
			for r := range rows {
				col[r] = args[r*n+c].(float64)
			}
			out[c] = col
		}
	}
	return out
}

// execUnnest runs head + SELECT * FROM unnest(...) + tail over args.
func execUnnest(ctx context.Context, tx *sqldb.Tx, head, tail string, types []string, args []any) error {
	if len(args) == 0 {
		return nil
	}
	_, err := tx.ExecContext(ctx, head+` SELECT * FROM `+unnestOf(types)+tail, columnArrays(types, args)...)
	return err
}

var checkColumns = []string{"result_id", "node", "check_name", "status", "reason", "findings", "metrics", "duration_ms", "finished", "stored", "feed_metrics"}

// insertCheckRows appends check results: COPY on PostgreSQL (their ids are
// new, so nothing can conflict), multi-row INSERTs on SQLite.
func (s *Store) insertCheckRows(ctx context.Context, tx *sqldb.Tx, rows [][]any) error {
	if tx.Dialect() == sqldb.Postgres {
		_, err := tx.CopyFrom(ctx, "check_results", checkColumns, rows)
		return err
	}
	args := make([]any, 0, len(checkColumns)*len(rows))
	for _, r := range rows {
		args = append(args, r...)
	}
	return execRows(ctx, tx, `INSERT INTO check_results (`+strings.Join(checkColumns, ", ")+`) VALUES `, ``, len(checkColumns), args)
}

// storedResults looks up which of ids are stored already.
func storedResults(ctx context.Context, tx *sqldb.Tx, ids []any) (map[string]storedRow, error) {
	out := map[string]storedRow{}
	err := resultsByID(ctx, tx, "id, node, stored", ids, func(rows *sql.Rows) error {
		var id string
		var r storedRow
		if err := rows.Scan(&id, &r.node, &r.stored); err != nil {
			return err
		}
		out[id] = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("look up stored results: %w", err)
	}
	return out, nil
}

// idQuerier is a transaction or a pool.
type idQuerier interface {
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
	Dialect() sqldb.Dialect
}

// resultsByID reads the named columns of the results with the given ids
// (strings), calling each for every row found: in chunks of IN lists on
// SQLite, as one array parameter on PostgreSQL (one statement, one plan,
// any count).
func resultsByID(ctx context.Context, q idQuerier, cols string, ids []any, each func(*sql.Rows) error) error {
	for done := 0; done < len(ids); {
		n := chunkRows(len(ids) - done)
		stmt, args := `SELECT `+cols+` FROM results WHERE id IN `+inList(n), ids[done:done+n]
		if q.Dialect() == sqldb.Postgres {
			n = len(ids) - done
			stmt, args = `SELECT `+cols+` FROM results WHERE id = ANY(?::text[])`, columnArrays([]string{"text"}, ids[done:])
		}
		rows, err := q.QueryContext(ctx, stmt, args...)
		if err != nil {
			return err
		}
		for rows.Next() {
			if err := each(rows); err != nil {
				rows.Close()
				return err
			}
		}
		if err := rows.Close(); err != nil {
			return err
		}
		if err := rows.Err(); err != nil {
			return err
		}
		done += n
	}
	return nil
}

// writeInventories records the inventories of the batch's new results, in
// batch order: the node's current inventory, and a history row for each
// change of identity. Unchanged inventories cost nothing. It returns what
// the cache should know once the transaction commits; inv.mu is held.
func writeInventories(ctx context.Context, tx *sqldb.Tx, inv *invCache, fresh []*ingestReq) (map[string]invSeen, error) {
	seen := map[string]invSeen{}
	for _, req := range fresh {
		if req.r.Inventory == nil {
			continue
		}
		node, sum := req.r.Node, req.prep.invSum
		cur, ok := seen[node]
		if !ok {
			cur, ok = inv.m[node]
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

func lastInventoryHash(ctx context.Context, tx *sqldb.Tx, node string) (string, error) {
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
func writeInventory(ctx context.Context, tx *sqldb.Tx, node string, p *preparedInventory, at int64, last string) (string, error) {
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
func execRows(ctx context.Context, tx *sqldb.Tx, head, tail string, cols int, args []any) error {
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
func execIn(ctx context.Context, tx *sqldb.Tx, head string, args []any) error {
	for done := 0; done < len(args); {
		n := chunkRows(len(args) - done)
		if _, err := tx.ExecContext(ctx, head+inList(n), args[done:done+n]...); err != nil {
			return err
		}
		done += n
	}
	return nil
}
