package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// Node is a node as the store knows it.
type Node struct {
	Name            string
	Labels          map[string]string
	State           string
	StateReason     string
	StateSince      time.Time
	FirstSeen       time.Time
	LastSeen        time.Time
	Inventory       report.Inventory
	AgentVersion    string
	ProtocolVersion string
	Connected       bool
	// Owner is the holder id of the coordinator that holds the node's
	// agent stream, OwnerAddr the address the others reach it at; both
	// empty while no stream is up (docs/ha.md, routing).
	Owner, OwnerAddr string
	// Activity is what the agent last reported (busy, idle, drained; ""
	// unknown), as its owner recorded it.
	Activity string
	// HasFull says a full result (every passive check) was ever stored.
	HasFull bool
	// Checks holds the newest status of each check, by name.
	Checks []CheckState
}

// CheckState is the newest status of one check on one node.
type CheckState struct {
	Name     string
	Status   report.Status
	Detail   string // CheckDetail of that result
	ResultID string
	Finished time.Time
}

// Newer reports whether a check result from result id, finished at
// finished, supersedes c. Ties on time go to the greater id, so that every
// copy of the state agrees whatever order results arrive in.
func (c CheckState) Newer(id string, finished time.Time) bool {
	if !finished.Equal(c.Finished) {
		return finished.After(c.Finished)
	}
	return id >= c.ResultID
}

// Join describes an agent's hello.
type Join struct {
	Node            string
	Labels          map[string]string
	Inventory       *report.Inventory
	AgentVersion    string
	ProtocolVersion string
	At              time.Time
	// Owner and OwnerAddr name the coordinator taking the stream (its
	// holder id and address); Activity is the hello's.
	Owner, OwnerAddr string
	Activity         string
	// State is set on a node seen for the first time.
	InitialState  string
	InitialReason string
	// FirstEvent, when set, is recorded in the same transaction for a node
	// seen for the first time (its node and time are the join's).
	FirstEvent *Event
}

// NodeJoined records an agent's hello: labels, versions, inventory (and its
// history), connected. It returns the node as stored afterwards and whether
// it was known before.
func (s *Store) NodeJoined(ctx context.Context, j Join) (Node, bool, error) {
	labels := nonNilLabels(j.Labels)
	lj, err := json.Marshal(labels)
	if err != nil {
		return Node{}, false, fmt.Errorf("node %s joined: labels: %w", j.Node, err)
	}
	at := ms(j.At)
	// The inventory goes through the writer's cache (invCache): a fleet
	// reconnecting after a restart brings the inventories already stored,
	// and writes none of them again.
	var sum [16]byte
	if j.Inventory != nil {
		sum = inventorySum(j.Inventory)
	}
	inv := &s.inv[s.shard(j.Node)]
	inv.mu.Lock()
	locked := true
	defer func() {
		if locked {
			inv.mu.Unlock()
		}
	}()
	var existed bool
	var seen *invSeen
	err = s.w.Tx(ctx, func(tx *sqldb.Tx) error {
		existed, seen = false, nil
		var one int
		err := tx.QueryRowContext(ctx, `SELECT 1 FROM nodes WHERE name = ?`, j.Node).Scan(&one)
		existed = err == nil
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if existed {
			_, err = tx.ExecContext(ctx, `UPDATE nodes SET labels = ?, agent_version = ?, protocol_version = ?,
			connected = 1, last_seen = ?, owner = ?, owner_addr = ?, activity = ? WHERE name = ?`,
				string(lj), j.AgentVersion, j.ProtocolVersion, at, j.Owner, j.OwnerAddr, j.Activity, j.Node)
		} else {
			// ON CONFLICT: another coordinator may add the node meanwhile;
			// then this join updates it instead.
			_, err = tx.ExecContext(ctx, `INSERT INTO nodes (name, labels, state, state_reason, state_since,
			first_seen, last_seen, agent_version, protocol_version, connected, owner, owner_addr, activity)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET labels = excluded.labels, agent_version = excluded.agent_version,
				protocol_version = excluded.protocol_version, connected = 1, last_seen = excluded.last_seen,
				owner = excluded.owner, owner_addr = excluded.owner_addr, activity = excluded.activity`,
				j.Node, string(lj), j.InitialState, j.InitialReason, at, at, at, j.AgentVersion, j.ProtocolVersion,
				j.Owner, j.OwnerAddr, j.Activity)
		}
		if err != nil {
			return err
		}
		if j.Inventory != nil {
			cur, ok := inv.m[j.Node]
			if !ok || cur.sum != sum {
				if !ok {
					if cur.hist, err = lastInventoryHash(ctx, tx, j.Node); err != nil {
						return err
					}
				}
				p, err := prepareInventory(j.Inventory)
				if err != nil {
					return err
				}
				hist, err := writeInventory(ctx, tx, j.Node, p, at, cur.hist)
				if err != nil {
					return err
				}
				seen = &invSeen{sum: sum, hist: hist}
			}
		}
		if !existed && j.FirstEvent != nil {
			ev := *j.FirstEvent
			ev.Node, ev.Time = j.Node, j.At
			if ev.Time.IsZero() {
				ev.Time = s.opts.Now()
			}
			if err := insertEvent(ctx, tx, ev); err != nil {
				return fmt.Errorf("event: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return Node{}, false, fmt.Errorf("node %s joined: %w", j.Node, err)
	}
	if seen != nil {
		if inv.m == nil {
			inv.m = map[string]invSeen{}
		}
		inv.m[j.Node] = *seen
	}
	inv.mu.Unlock()
	locked = false
	if !existed {
		// Just written, whole: no need to read it back (a join storm of a
		// new fleet is thousands of these).
		n := Node{Name: j.Node, Labels: maps.Clone(labels), State: j.InitialState, StateReason: j.InitialReason,
			StateSince: fromMS(at), FirstSeen: fromMS(at), LastSeen: fromMS(at),
			AgentVersion: j.AgentVersion, ProtocolVersion: j.ProtocolVersion, Connected: true,
			Owner: j.Owner, OwnerAddr: j.OwnerAddr, Activity: j.Activity}
		if j.Inventory != nil {
			n.Inventory = *j.Inventory
		}
		return n, false, nil
	}
	n, err := s.Node(ctx, j.Node)
	return n, existed, err
}

// StateChange sets a node's state.
type StateChange struct {
	Node   string
	State  string
	Reason string
	Actor  string // who decided: "coordinator", an operator, a campaign
	At     time.Time
	// Connected, when set, is recorded too (a lost stream).
	Connected *bool
	// Cause, when set, replaces the event's wording of why the state changed.
	Cause string
	// Owner, when set, makes the change conditional: it applies only while
	// the node's stream is still this coordinator's (a stream that ended
	// here after the agent moved to another coordinator changes nothing).
	// With Connected false the owner is cleared too.
	Owner string
}

// SetNodeState records a node's state and, when it changed, a state_change
// event saying from what, to what and why, in one transaction. It reports
// whether the state changed. The reason is updated either way. With
// c.Owner set and the node's stream another coordinator's, nothing is
// written (ErrNotOwner).
func (s *Store) SetNodeState(ctx context.Context, c StateChange) (bool, error) {
	changed := false
	err := s.w.Tx(ctx, func(tx *sqldb.Tx) error {
		var prev, owner string
		// FOR UPDATE on PostgreSQL: an attach on another coordinator
		// waits, rather than being undone by this change.
		if err := tx.QueryRowContext(ctx, `SELECT state, owner FROM nodes WHERE name = ?`+s.forUpdate(), c.Node).Scan(&prev, &owner); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return ErrNotFound
			}
			return err
		}
		if c.Owner != "" && owner != c.Owner {
			return fmt.Errorf("%w: the stream is %s's now", ErrNotOwner, ownerName(owner))
		}
		at := ms(c.At)
		changed = prev != c.State
		q := `UPDATE nodes SET state = ?, state_reason = ?`
		args := []any{c.State, c.Reason}
		if changed {
			q += `, state_since = ?`
			args = append(args, at)
		}
		if c.Connected != nil {
			q += `, connected = ?, last_seen = ` + s.d.Greatest() + `(last_seen, ?)`
			args = append(args, boolInt(*c.Connected), at)
			if !*c.Connected && c.Owner != "" {
				q += `, owner = '', owner_addr = ''`
			}
		}
		q += ` WHERE name = ?`
		args = append(args, c.Node)
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return err
		}
		if !changed {
			return nil
		}
		msg := fmt.Sprintf("%s -> %s", prev, c.State)
		if c.Reason != "" {
			msg += ": " + c.Reason
		}
		if c.Cause != "" {
			msg = fmt.Sprintf("%s -> %s: %s", prev, c.State, c.Cause)
		}
		return insertEvent(ctx, tx, Event{Time: c.At, Node: c.Node, Kind: EventStateChange, Actor: c.Actor, Message: msg})
	})
	if err != nil {
		return false, fmt.Errorf("set state of %s: %w", c.Node, err)
	}
	return changed, nil
}

// TouchNodes records when nodes were last heard from, in one transaction.
func (s *Store) TouchNodes(ctx context.Context, seen map[string]time.Time) error {
	if len(seen) == 0 {
		return nil
	}
	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name)
	}
	sort.Strings(names) // one lock order for concurrent writers
	err := s.w.Tx(ctx, func(tx *sqldb.Tx) error {
		for _, name := range names {
			if _, err := tx.ExecContext(ctx, `UPDATE nodes SET last_seen = `+s.d.Greatest()+`(last_seen, ?) WHERE name = ?`, ms(seen[name]), name); err != nil {
				return fmt.Errorf("touch node %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("touch nodes: %w", err)
	}
	return nil
}

// MarkAllDisconnected clears every node's connected flag and owner: after
// a restart no agent stream is open yet. It returns how many nodes were
// marked.
func (s *Store) MarkAllDisconnected(ctx context.Context) (int, error) {
	return s.MarkDisconnected(ctx, "")
}

// MarkDisconnected is MarkAllDisconnected for one of several coordinators
// restarting at ownerAddr: only the nodes whose stream a coordinator at
// that address held (its previous process), or no coordinator, are
// marked; the others' streams are theirs. "" marks every node.
func (s *Store) MarkDisconnected(ctx context.Context, ownerAddr string) (int, error) {
	var n int64
	err := s.w.Tx(ctx, func(tx *sqldb.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET connected = 0, owner = '', owner_addr = ''
			WHERE (connected != 0 OR owner != '') AND (? = '' OR owner_addr = ? OR owner = '')`, ownerAddr, ownerAddr)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("mark nodes disconnected: %w", err)
	}
	return int(n), nil
}

const nodeColumns = `name, labels, state, state_reason, state_since, first_seen, last_seen, inventory,
	agent_version, protocol_version, connected, has_full, owner, owner_addr, activity`

func scanNode(sc interface{ Scan(...any) error }) (Node, error) {
	var n Node
	var labels, inv string
	var since, first, last int64
	var connected, full int
	if err := sc.Scan(&n.Name, &labels, &n.State, &n.StateReason, &since, &first, &last, &inv,
		&n.AgentVersion, &n.ProtocolVersion, &connected, &full, &n.Owner, &n.OwnerAddr, &n.Activity); err != nil {
		return Node{}, err
	}
	n.StateSince, n.FirstSeen, n.LastSeen = fromMS(since), fromMS(first), fromMS(last)
	n.Connected, n.HasFull = connected != 0, full != 0
	if err := json.Unmarshal([]byte(labels), &n.Labels); err != nil {
		return Node{}, fmt.Errorf("node %s labels: %w", n.Name, err)
	}
	if err := json.Unmarshal([]byte(inv), &n.Inventory); err != nil {
		return Node{}, fmt.Errorf("node %s inventory: %w", n.Name, err)
	}
	return n, nil
}

// Node returns one node with its checks' newest statuses, or ErrNotFound.
func (s *Store) Node(ctx context.Context, name string) (Node, error) {
	row := s.r.QueryRowContext(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE name = ?`, name)
	n, err := scanNode(row)
	if errors.Is(err, sql.ErrNoRows) {
		return Node{}, fmt.Errorf("node %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return Node{}, fmt.Errorf("node %s: %w", name, err)
	}
	checks, err := s.nodeChecks(ctx, `WHERE node = ?`, name)
	if err != nil {
		return Node{}, err
	}
	n.Checks = checks[name]
	return n, nil
}

// Nodes returns every node, by name, with its checks' newest statuses.
func (s *Store) Nodes(ctx context.Context) ([]Node, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+nodeColumns+` FROM nodes ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	defer rows.Close()
	var out []Node
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	checks, err := s.nodeChecks(ctx, ``)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Checks = checks[out[i].Name]
	}
	return out, nil
}

func (s *Store) nodeChecks(ctx context.Context, where string, args ...any) (map[string][]CheckState, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT node, check_name, status, detail, result_id, finished
		FROM node_checks `+where+` ORDER BY node, check_name`, args...)
	if err != nil {
		return nil, fmt.Errorf("latest checks: %w", err)
	}
	defer rows.Close()
	out := make(map[string][]CheckState)
	for rows.Next() {
		var node string
		var c CheckState
		var fin int64
		if err := rows.Scan(&node, &c.Name, &c.Status, &c.Detail, &c.ResultID, &fin); err != nil {
			return nil, fmt.Errorf("latest checks: %w", err)
		}
		c.Finished = fromMS(fin)
		out[node] = append(out[node], c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("latest checks: %w", err)
	}
	return out, nil
}

// KnownResultIDs returns the ids of the node's results finished since the
// given time, newest first, at most limit.
func (s *Store) KnownResultIDs(ctx context.Context, node string, since time.Time, limit int) ([]string, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT result_id FROM check_results
		WHERE node = ? AND finished >= ? GROUP BY result_id ORDER BY MAX(finished) DESC, result_id LIMIT ?`, node, ms(since), limit)
	if err != nil {
		return nil, fmt.Errorf("known results of %s: %w", node, err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("known results of %s: %w", node, err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("known results of %s: %w", node, err)
	}
	return ids, nil
}

// InventoryRecord is one row of a node's inventory history.
type InventoryRecord struct {
	Time      time.Time
	Inventory report.Inventory
}

// InventoryHistory returns a node's inventory changes, oldest first.
func (s *Store) InventoryHistory(ctx context.Context, node string) ([]InventoryRecord, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT time, inventory FROM inventory_history WHERE node = ? ORDER BY id`, node)
	if err != nil {
		return nil, fmt.Errorf("inventory history of %s: %w", node, err)
	}
	defer rows.Close()
	var out []InventoryRecord
	for rows.Next() {
		var at int64
		var raw string
		if err := rows.Scan(&at, &raw); err != nil {
			return nil, fmt.Errorf("inventory history of %s: %w", node, err)
		}
		rec := InventoryRecord{Time: fromMS(at)}
		if err := json.Unmarshal([]byte(raw), &rec.Inventory); err != nil {
			return nil, fmt.Errorf("inventory history of %s: %w", node, err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inventory history of %s: %w", node, err)
	}
	return out, nil
}

func nonNilLabels(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// SortChecksWorstFirst orders check states fail, error, warn, pass, skip,
// then causes before symptoms (report.CauseOrder).
func SortChecksWorstFirst(cs []CheckState) {
	rank := func(s report.Status) int {
		switch s {
		case report.Fail:
			return 0
		case report.Error:
			return 1
		case report.Warn:
			return 2
		case report.Pass:
			return 3
		}
		return 4
	}
	sort.SliceStable(cs, func(i, j int) bool {
		if ri, rj := rank(cs[i].Status), rank(cs[j].Status); ri != rj {
			return ri < rj
		}
		// Same status: causes before symptoms (ib.ports before ib.counters).
		return report.CauseLess(cs[i].Name, cs[j].Name)
	})
}

// ErrNotOwner is a change refused because another coordinator holds the
// node's stream now (StateChange.Owner).
var ErrNotOwner = errors.New("not the node's stream owner")

func ownerName(owner string) string {
	if owner == "" {
		return "no coordinator"
	}
	return owner
}

// forUpdate locks the rows a read in a write transaction returns, on
// PostgreSQL; SQLite's one writer needs none.
func (s *Store) forUpdate() string {
	if s.d == sqldb.Postgres {
		return " FOR UPDATE"
	}
	return ""
}

// NodeOwner is the coordinator holding node's stream: its holder id and
// address, both "" when none does. ErrNotFound for an unknown node.
func (s *Store) NodeOwner(ctx context.Context, node string) (owner, addr string, err error) {
	err = s.r.QueryRowContext(ctx, `SELECT owner, owner_addr FROM nodes WHERE name = ?`, node).Scan(&owner, &addr)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", fmt.Errorf("node %s: %w", node, ErrNotFound)
	}
	if err != nil {
		return "", "", fmt.Errorf("owner of node %s: %w", node, err)
	}
	return owner, addr, nil
}

// maxActivity bounds an activity name (busy, idle, drained).
const maxActivity = 32

// SetActivities records the activity agents last reported, by node, in
// one transaction; only for nodes whose stream owner is still owner
// (another coordinator's agents are its to record).
func (s *Store) SetActivities(ctx context.Context, owner string, act map[string]string) error {
	if len(act) == 0 {
		return nil
	}
	names := make([]string, 0, len(act))
	for name, a := range act {
		if len(a) > maxActivity {
			return fmt.Errorf("%w: activity of %s: at most %d bytes", ErrInvalid, name, maxActivity)
		}
		names = append(names, name)
	}
	sort.Strings(names) // one lock order for concurrent writers
	err := s.w.Tx(ctx, func(tx *sqldb.Tx) error {
		for _, name := range names {
			if _, err := tx.ExecContext(ctx, `UPDATE nodes SET activity = ? WHERE name = ? AND owner = ?`, act[name], name, owner); err != nil {
				return fmt.Errorf("activity of %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record activities: %w", err)
	}
	return nil
}
