package store

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/pgtest"
	"github.com/fleetcheck/fleetcheck/internal/report"
	"github.com/fleetcheck/fleetcheck/internal/sqldb"
)

// fullResult is a 13-check result like an agent's quick pass, with an
// inventory.
func fullResult(id, node string, at time.Time, inv *report.Inventory) Result {
	r := Result{ID: id, Node: node, Started: at.Add(-time.Second), Finished: at, Status: report.Pass, Full: true, Inventory: inv}
	for i := range 13 {
		r.Checks = append(r.Checks, report.CheckResult{Name: fmt.Sprintf("check.%02d", i), Status: report.Pass,
			DurationMS: 1.5, Findings: []report.Finding{}, Metrics: map[string]float64{fmt.Sprintf("gpu%d.x_c", i): float64(i)}})
	}
	return r
}

// Many results at once exercise every statement shape (256, 64, 16, 4, 1
// rows), copies within a batch, copies of stored results and an id owned
// by another node, and end with the same rows as one statement a row.
func TestBatchedWritesLikeOneByOne(t *testing.T) { both(t, testBatchedWritesLikeOneByOne) }

func testBatchedWritesLikeOneByOne(t *testing.T, be backend) {
	s := open(t, be.loc(t), func(o *Options) { o.BatchDelay = 20 * time.Millisecond })
	defer s.Close()
	ctx := context.Background()
	inv := &report.Inventory{DriverVersion: "535.161.08", GPUs: []report.GPU{{Index: 0, Serial: "S0"}}}
	const nodes, per = 37, 9 // 333 results: 256 + 64 + 4×3 + 1
	if _, err := s.Ingest(ctx, fullResult("stored-0", "n00", time.Now(), inv)); err != nil {
		t.Fatal(err)
	}
	type out struct {
		ack Ack
		err error
	}
	res := make(map[string][]out)
	var mu sync.Mutex
	var wg sync.WaitGroup
	base := time.Now()
	send := func(id, node string, at time.Time) {
		defer wg.Done()
		a, err := s.Ingest(ctx, fullResult(id, node, at, inv))
		mu.Lock()
		res[id+"@"+node] = append(res[id+"@"+node], out{a, err})
		mu.Unlock()
	}
	for n := range nodes {
		for i := range per {
			wg.Add(1)
			go send(fmt.Sprintf("r-%02d-%d", n, i), fmt.Sprintf("n%02d", n), base.Add(time.Duration(i)*time.Millisecond))
		}
	}
	wg.Add(3)
	go send("r-05-5", "n05", base.Add(5*time.Millisecond)) // a copy, likely in the same batch
	go send("stored-0", "n00", time.Now())                 // a copy of a stored result
	go send("stored-0", "n01", time.Now())                 // another node's id
	wg.Wait()

	if o := res["stored-0@n00"]; len(o) != 1 || o[0].err != nil || !o[0].ack.Duplicate {
		t.Errorf("copy of a stored result: %+v", o)
	}
	if o := res["stored-0@n01"]; len(o) != 1 || o[0].err == nil {
		t.Errorf("another node's id: %+v, want ErrIDConflict", o)
	}
	if o := res["r-05-5@n05"]; len(o) != 2 || o[0].err != nil || o[1].err != nil ||
		o[0].ack.Duplicate == o[1].ack.Duplicate || !o[0].ack.Stored.Equal(o[1].ack.Stored) {
		t.Errorf("two copies in flight: %+v, want one new, one duplicate, same stored time", o)
	}
	c, err := s.Count(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := nodes*per + 1; c.Results != want || c.CheckResults != 13*want {
		t.Errorf("counts %+v, want %d results and %d check results", c, want, 13*want)
	}
	for n := range nodes {
		name := fmt.Sprintf("n%02d", n)
		sums, err := s.Summaries(ctx, name, "")
		if err != nil {
			t.Fatal(err)
		}
		want := per
		if n == 0 {
			want++
		}
		for _, x := range sums {
			if x.Pass != want {
				t.Fatalf("%s %s: %d passes summarized, want %d", name, x.Check, x.Pass, want)
			}
		}
		rows, err := s.Results(ctx, ResultQuery{Node: name, Check: "check.03", Limit: 1})
		if err != nil || len(rows) != 1 {
			t.Fatalf("%s: %v %v", name, rows, err)
		}
		if n != 0 && rows[0].ResultID != fmt.Sprintf("r-%02d-%d", n, per-1) {
			t.Errorf("%s newest check.03 from %s, want the last result", name, rows[0].ResultID)
		}
		if rows[0].Check.Metrics["gpu3.x_c"] != 3 || len(rows[0].Check.Findings) != 0 {
			t.Errorf("%s: stored check %+v", name, rows[0].Check)
		}
	}
}

// The writer skips unchanged inventories by remembering them; a join that
// records an inventory behind its back makes it look again.
func TestInventoryCacheFollowsJoins(t *testing.T) { both(t, testInventoryCacheFollowsJoins) }

func testInventoryCacheFollowsJoins(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	defer s.Close()
	ctx := context.Background()
	a := &report.Inventory{DriverVersion: "535.161.08"}
	b := &report.Inventory{DriverVersion: "550.54.15"}
	t0 := time.Now()
	step := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	if _, _, err := s.NodeJoined(ctx, Join{Node: "n1", Inventory: a, At: step(0), InitialState: "initializing"}); err != nil {
		t.Fatal(err)
	}
	for i, inv := range []*report.Inventory{a, a, a} {
		if _, err := s.Ingest(ctx, fullResult(fmt.Sprintf("x%d", i), "n1", step(1+i), inv)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.NodeJoined(ctx, Join{Node: "n1", Inventory: b, At: step(5), InitialState: "initializing"}); err != nil {
		t.Fatal(err)
	}
	// The same inventory as the writer last wrote, but not as the node's now.
	if _, err := s.Ingest(ctx, fullResult("y", "n1", step(6), a)); err != nil {
		t.Fatal(err)
	}
	n, err := s.Node(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if n.Inventory.DriverVersion != a.DriverVersion {
		t.Errorf("current inventory %q, want %q", n.Inventory.DriverVersion, a.DriverVersion)
	}
	h, err := s.InventoryHistory(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	var drivers []string
	for _, r := range h {
		drivers = append(drivers, r.Inventory.DriverVersion)
	}
	if fmt.Sprint(drivers) != "[535.161.08 550.54.15 535.161.08]" {
		t.Errorf("history %v, want a, b, a", drivers)
	}
}

// Every field of the inventory types changes the writer's fingerprint:
// a field added to report.Inventory, GPU, HCA or Port and not to
// inventorySum would let a changed inventory go unrecorded.
func TestInventorySumCoversEveryField(t *testing.T) {
	t.Parallel()
	base := func() *report.Inventory {
		return &report.Inventory{GPUs: []report.GPU{{}}, HCAs: []report.HCA{{Ports: []report.Port{{}}}}}
	}
	want := inventorySum(base())
	// leaves calls visit on every scalar field, depth first.
	var leaves func(v reflect.Value, path string, visit func(reflect.Value, string))
	leaves = func(v reflect.Value, path string, visit func(reflect.Value, string)) {
		switch v.Kind() {
		case reflect.Struct:
			for i := range v.NumField() {
				leaves(v.Field(i), path+"."+v.Type().Field(i).Name, visit)
			}
		case reflect.Slice:
			for i := range v.Len() {
				leaves(v.Index(i), fmt.Sprintf("%s[%d]", path, i), visit)
			}
		default:
			visit(v, path)
		}
	}
	n := 0
	leaves(reflect.ValueOf(base()).Elem(), "inventory", func(reflect.Value, string) { n++ })
	if n < 20 {
		t.Fatalf("found %d fields; the walk is broken", n)
	}
	for i := range n {
		inv := base()
		k := 0
		leaves(reflect.ValueOf(inv).Elem(), "inventory", func(v reflect.Value, path string) {
			defer func() { k++ }()
			if k != i {
				return
			}
			switch v.Kind() {
			case reflect.String:
				v.SetString("x")
			case reflect.Int, reflect.Int32, reflect.Int64:
				v.SetInt(7)
			case reflect.Uint, reflect.Uint32, reflect.Uint64:
				v.SetUint(7)
			case reflect.Float64:
				v.SetFloat(7)
			default:
				t.Fatalf("%s: a %s field; teach inventorySum and this test about it", path, v.Kind())
			}
			if inventorySum(inv) == want {
				t.Errorf("%s does not change inventorySum", path)
			}
		})
	}
}

// Copies of one id in one batch: the first sender owns it; a copy from the
// owner is a duplicate of it, one from another node a conflict, whatever
// the order.
func TestSameIDTwiceInOneBatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		senders []string
		want    []string // "new", "dup" or "conflict", per sender
	}{
		{[]string{"n1", "n2", "n1"}, []string{"new", "conflict", "dup"}},
		{[]string{"n2", "n1", "n1"}, []string{"new", "conflict", "conflict"}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.senders), func(t *testing.T) {
			t.Parallel()
			// In a synctest bubble the senders' staggered sleeps and the
			// batch linger run on the bubble's clock: the three arrive in
			// order and within one linger however loaded the machine is.
			synctest.Test(t, func(t *testing.T) { sameIDTwice(t, tc.senders, tc.want) })
		})
	}
}

func sameIDTwice(t *testing.T, senders, want []string) {
	// A long linger puts the three in one transaction.
	s := open(t, t.TempDir(), func(o *Options) { o.BatchDelay = 500 * time.Millisecond })
	defer s.Close()
	got := make([]string, len(senders))
	var wg sync.WaitGroup
	for i, node := range senders {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 40 * time.Millisecond) // arrive in order
			a, err := s.Ingest(context.Background(), fullResult("same", node, time.Now(), nil))
			switch {
			case errors.Is(err, ErrIDConflict):
				got[i] = "conflict"
			case err != nil:
				got[i] = err.Error()
			case a.Duplicate:
				got[i] = "dup"
			default:
				got[i] = "new"
			}
		})
	}
	wg.Wait()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if st := s.Stats(); st.Batches != 1 {
		t.Logf("%d batches: the case did not land in one transaction", st.Batches)
	}
	r, err := s.Result(context.Background(), "same")
	if err != nil || r.Node != senders[0] {
		t.Errorf("stored %+v %v, want it %s's", r, err, senders[0])
	}
}

// A new node's join returns the node without reading it back: it must be
// what a read gives.
func TestNodeJoinedReturnsWhatIsStored(t *testing.T) { both(t, testNodeJoinedReturnsWhatIsStored) }

func testNodeJoinedReturnsWhatIsStored(t *testing.T, be backend) {
	s := open(t, be.loc(t), nil)
	defer s.Close()
	ctx := context.Background()
	inv := &report.Inventory{DriverVersion: "535.161.08", GPUs: []report.GPU{{Index: 0, Serial: "S0", MemoryTotalMiB: 81559}},
		HCAs: []report.HCA{{Name: "mlx5_0", Ports: []report.Port{{Port: 1, State: "ACTIVE", RateGbps: 400}}}}}
	for _, j := range []Join{
		{Node: "a", Labels: map[string]string{"sku": "h100"}, Inventory: inv, AgentVersion: "1.2.3", ProtocolVersion: "1.1",
			At: time.Now(), InitialState: "initializing", InitialReason: "waiting"},
		{Node: "b"},
	} {
		got, existed, err := s.NodeJoined(ctx, j)
		if err != nil || existed {
			t.Fatalf("%s: %v %v", j.Node, existed, err)
		}
		want, err := s.Node(ctx, j.Node)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: join returned\n%+v\nthe store holds\n%+v", j.Node, got, want)
		}
	}
	// Joining again with the same inventory adds no history.
	if _, _, err := s.NodeJoined(ctx, Join{Node: "a", Inventory: inv, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if h, err := s.InventoryHistory(ctx, "a"); err != nil || len(h) != 1 {
		t.Errorf("history after a rejoin: %d rows, %v", len(h), err)
	}
}

// Two coordinators on one PostgreSQL: a result another stored before
// this one's insert is answered as a duplicate (same node) or a conflict,
// also its copies within the batch, and nothing is stored twice.
func TestInsertResultsLosesARaceCleanly(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a := open(t, url, nil)
	defer a.Close()
	b := open(t, url, nil)
	defer b.Close()
	ctx := context.Background()
	if _, err := a.Ingest(ctx, fullResult("mine", "n1", time.Now(), nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Ingest(ctx, fullResult("theirs", "n2", time.Now(), nil)); err != nil {
		t.Fatal(err)
	}
	req := func(id, node string) *ingestReq {
		r := fullResult(id, node, time.Now(), nil)
		return &ingestReq{r: r, prep: prepare(&r, &b.orders, nil), dupOf: -1}
	}
	// b learns what a stored only from its insert.
	reqs := []*ingestReq{req("mine", "n1"), req("theirs", "n1"), req("new", "n1"), req("theirs", "n2"), req("new", "n1"), req("mine", "n3")}
	err := b.w.Tx(ctx, func(tx *sqldb.Tx) error {
		_, err := b.writeBatch(ctx, tx, &invCache{}, reqs, time.Now().UnixMilli())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"duplicate", "conflict", "stored", "duplicate", "copy of 2", "conflict"} {
		r := reqs[i]
		got := "stored"
		switch {
		case r.dupOf >= 0:
			got = fmt.Sprintf("copy of %d", r.dupOf)
		case errors.Is(r.err, ErrIDConflict):
			got = "conflict"
		case r.err != nil:
			got = r.err.Error()
		case r.ack.Duplicate:
			got = "duplicate"
		}
		if got != want {
			t.Errorf("request %d (%s from %s): %s, want %s", i, r.r.ID, r.r.Node, got, want)
		}
	}
	c, err := b.Count(ctx)
	if err != nil || c.Results != 3 || c.CheckResults != 3*13 {
		t.Fatalf("stored: %+v %v, want 3 results of 13 checks", c, err)
	}
}
