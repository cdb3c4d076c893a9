package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host"
)

var commandSources = []snapshot.Source{snapshot.SrcNvidiaSMI, snapshot.SrcNVLink, snapshot.SrcKernelLog,
	snapshot.SrcAllReduce, snapshot.SrcDCGMDiag, snapshot.SrcVersions}

// render is everything a node shows: each command source and every file
// (by path, symlinks not followed), in a stable order.
func render(t testing.TB, h host.Host) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, src := range commandSources {
		c := h.Capture(context.Background(), src)
		out[string(src)] = append([]byte(fmt.Sprintf("state=%s exit=%d err=%q\n", c.State, c.ExitCode, c.Err)), c.Data...)
	}
	var files bytes.Buffer
	fsys := h.FS()
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := fsys.(fs.ReadLinkFS).ReadLink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&files, "%s -> %s\n", p, target)
		case !d.IsDir():
			b, err := fs.ReadFile(fsys, p)
			if err != nil {
				return err
			}
			fmt.Fprintf(&files, "%s: %q\n", p, b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out["fs.txt"] = files.Bytes()
	return out
}

func TestSameSpecSameBytes(t *testing.T) {
	t.Parallel()
	faults := []Fault{ECCUncorrectable{GPU: 1, Count: 3}, Xid{GPU: 2, Code: 94}, IBSymbolErrors{HCA: "mlx5_5", PerPass: 7}}
	build := func() *Node {
		n := testNode(t, func(s *Spec) { s.Seed = 42 })
		for _, f := range faults {
			if err := n.AddFault(f); err != nil {
				t.Fatal(err)
			}
		}
		return n
	}
	a, b := render(t, build()), render(t, build())
	for k := range a {
		if !bytes.Equal(a[k], b[k]) {
			t.Errorf("%s differs between two nodes built from the same spec", k)
		}
	}
	other := render(t, testNode(t, func(s *Spec) { s.Seed = 43 }))
	if bytes.Equal(a[string(snapshot.SrcNvidiaSMI)], other[string(snapshot.SrcNvidiaSMI)]) {
		t.Error("another seed rendered the same serials and UUIDs")
	}
}

func TestIdentitiesAreDistinct(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	for _, name := range []string{"gpu-001", "gpu-002", "gpu-003"} {
		s := testNode(t, func(s *Spec) { s.Name = name }).Spec()
		for i, g := range s.GPUs {
			for _, id := range []string{g.Serial, g.UUID} {
				if prev, dup := seen[id]; dup {
					t.Errorf("%s GPU%d repeats %s of %s", name, i, id, prev)
				}
				seen[id] = fmt.Sprintf("%s GPU%d", name, i)
			}
			if len(g.Serial) != 13 || !strings.HasPrefix(g.UUID, "GPU-") || len(g.UUID) != 40 {
				t.Errorf("GPU%d serial %q uuid %q", i, g.Serial, g.UUID)
			}
		}
	}
}

func TestTimeMovesCountersAndStamps(t *testing.T) {
	t.Parallel()
	now := fixedNow
	var mu sync.Mutex
	clock := ClockFunc(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	n := testNode(t, func(s *Spec) { s.Clock = clock })
	read := func(p string) string {
		b, err := fs.ReadFile(n.FS(), p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	data0 := read("sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data")
	err0 := read("sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_errors")
	up0 := read("proc/uptime")
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	if read("sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data") <= data0 {
		t.Error("port_xmit_data did not grow in an hour")
	}
	if read("sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_errors") != err0 {
		t.Error("a lifetime error counter moved on a healthy port")
	}
	if read("proc/uptime") == up0 {
		t.Error("uptime did not move")
	}
	if !bytes.Contains(mustCapture(t, n, snapshot.SrcNvidiaSMI), []byte("<timestamp>Sat Nov 28 03:00:00 2026</timestamp>")) {
		t.Error("nvidia-smi timestamp does not follow the clock")
	}

	// A port that is down carries no traffic.
	if err := n.AddFault(IBPortDown{HCA: "mlx5_0"}); err != nil {
		t.Fatal(err)
	}
	down := read("sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data")
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	if got := read("sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data"); got != down {
		t.Errorf("traffic on a down port: %s -> %s", down, got)
	}
	n.ClearFault(KindIBPortDown, "mlx5_0")
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	if read("sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data") <= down {
		t.Error("traffic did not resume after the port came back")
	}
	if read("sys/class/infiniband/mlx5_0/ports/1/counters/link_downed") != "1\n" {
		t.Error("link_downed should keep the down it counted")
	}
}

func TestRebootStartsOver(t *testing.T) {
	t.Parallel()
	now := fixedNow
	n := testNode(t, func(s *Spec) { s.Clock = ClockFunc(func() time.Time { return now }) })
	for _, f := range append(UncorrectableECCEvent(0, 1), GPUMissing{GPU: 7}) {
		if err := n.AddFault(f); err != nil {
			t.Fatal(err)
		}
	}
	n.Reboot()
	if !n.Boot().Equal(now) {
		t.Errorf("boot %v, want %v", n.Boot(), now)
	}
	log := mustCapture(t, n, snapshot.SrcKernelLog)
	if bytes.Contains(log, []byte("Xid")) {
		t.Error("the Xid survived the reboot")
	}
	now = now.Add(30 * time.Second) // the boot messages appear as time passes
	if log := mustCapture(t, n, snapshot.SrcKernelLog); !bytes.Contains(log, []byte("NVRM: loading NVIDIA")) {
		t.Errorf("no driver load after reboot:\n%s", log)
	}
	l := decodeSMI(t, mustCapture(t, n, snapshot.SrcNvidiaSMI))
	if l.GPUs[0].ECC.VolDRAM != "0" || l.GPUs[0].ECC.AggDRAM != "1" {
		t.Errorf("after reboot volatile %s aggregate %s, want 0 and 1", l.GPUs[0].ECC.VolDRAM, l.GPUs[0].ECC.AggDRAM)
	}
	if r := l.GPUs[0].Remap; r.Pending != "No" {
		t.Errorf("the reboot did not apply the pending remap: %+v", r)
	}
	if len(l.GPUs) != 7 {
		t.Errorf("a hardware fault should outlive a reboot: %d GPUs", len(l.GPUs))
	}
	if got := n.Faults(); len(got) != 3 {
		t.Errorf("faults after reboot %v", got)
	}
}

func TestFaultBookkeeping(t *testing.T) {
	t.Parallel()
	n := testNode(t, nil)
	for _, bad := range []Fault{
		ECCUncorrectable{GPU: 8}, IBPortDown{HCA: "mlx5_9"}, Xid{GPU: 0}, SlowNode{}, NVLinkDegraded{GPU: 0, Links: 19},
		NVLinkErrors{GPU: 0, Link: 18}, IBRateDrop{HCA: "mlx5_0"}, DCGMFailure{GPU: 0},
	} {
		if err := n.AddFault(bad); !errors.Is(err, ErrBadFault) {
			t.Errorf("%#v: err %v", bad, err)
		}
	}
	must := func(f Fault) {
		t.Helper()
		if err := n.AddFault(f); err != nil {
			t.Fatal(err)
		}
	}
	must(ThermalSlowdown{GPU: 1, TempC: 90})
	must(ThermalSlowdown{GPU: 1, TempC: 95}) // replaces
	must(Xid{GPU: 1, Code: 13})
	must(Xid{GPU: 1, Code: 31}) // accumulates
	must(IBPortDown{HCA: "mlx5_1"})
	want := []Fault{ThermalSlowdown{GPU: 1, TempC: 95}, Xid{GPU: 1, Code: 13}, Xid{GPU: 1, Code: 31}, IBPortDown{HCA: "mlx5_1"}}
	if got := n.Faults(); !slices.Equal(got, want) {
		t.Errorf("faults %v, want %v", got, want)
	}
	if !n.ClearFault(KindXid, "") || n.ClearFault(KindXid, "GPU1") {
		t.Error("ClearFault with an empty target should clear every Xid, once")
	}
	if !n.ClearFault(KindIBPortDown, "mlx5_1") || len(n.Faults()) != 1 {
		t.Errorf("faults %v", n.Faults())
	}
	n.ClearAll()
	if len(n.Faults()) != 0 {
		t.Errorf("faults after ClearAll %v", n.Faults())
	}
	for _, f := range want {
		if f.Kind() == "" || f.Target() == "" {
			t.Errorf("%#v has no kind or target", f)
		}
	}
	if _, err := New(Spec{}); err == nil {
		t.Error("New accepted a spec without a name")
	}
	dup := DefaultSpec("x")
	dup.HCAs[1].Name = dup.HCAs[0].Name
	if _, err := New(dup); err == nil {
		t.Error("New accepted two HCAs with one name")
	}
}

func TestCaptureRespectsContextAndSources(t *testing.T) {
	t.Parallel()
	n := testNode(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if c := n.Capture(ctx, snapshot.SrcKernelLog); c.State != snapshot.StateFailed {
		t.Errorf("cancelled capture: %+v", c)
	}
	if c := n.Capture(context.Background(), snapshot.SrcInfiniBand); c.State != snapshot.StateAbsent {
		t.Errorf("file source as a command: %+v", c)
	}
	// With every GPU gone nvidia-smi answers like the real one.
	for i := range 8 {
		if err := n.AddFault(GPUMissing{GPU: i}); err != nil {
			t.Fatal(err)
		}
	}
	c := n.Capture(context.Background(), snapshot.SrcNvidiaSMI)
	if c.State != snapshot.StateFailed || c.ExitCode != 6 || string(c.Data) != "No devices were found\n" {
		t.Errorf("no GPUs: %+v", c)
	}
}

// TestConcurrentUse exercises the node from many goroutines; run with -race.
func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	n := testNode(t, nil)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 20 {
				switch (w + i) % 5 {
				case 0:
					_ = n.AddFault(IBSymbolErrors{HCA: "mlx5_2", PerPass: 1})
					_ = n.AddFault(Xid{GPU: i % 8, Code: 79})
				case 1:
					n.ClearFault(KindXid, "")
				case 2:
					fsys := n.FS()
					_, _ = fs.ReadFile(fsys, "sys/class/infiniband/mlx5_2/ports/1/counters/symbol_error")
					_, _ = fs.ReadDir(fsys, "sys/bus/pci/devices")
				case 3:
					for _, src := range commandSources {
						n.Capture(context.Background(), src)
					}
				case 4:
					_ = n.Faults()
					if i == 10 {
						n.Reboot()
					}
				}
			}
		})
	}
	wg.Wait()
}

// TestGolden pins the rendered bytes of a faulted node. UPDATE_GOLDEN=1
// rewrites testdata/golden.
func TestGolden(t *testing.T) {
	t.Parallel()
	n := testNode(t, func(s *Spec) { s.Seed = 7; s.DCGMLevel = 2; s.NCCLDebugInfo = true })
	for _, f := range []Fault{
		ECCUncorrectable{GPU: 3, Count: 2}, RowRemapPending{GPU: 3}, Xid{GPU: 4, Code: 79}, GPUMissing{GPU: 4},
		ThermalSlowdown{GPU: 0}, PCIeDowntrained{GPU: 5}, IBPortDown{HCA: "mlx5_4"},
		IBRateDrop{HCA: "mlx5_2", Gbps: 200}, IBSymbolErrors{HCA: "mlx5_1", PerPass: 10},
		NVLinkDegraded{GPU: 6, Links: 2}, GhostProcess{GPU: 7, MiB: 30000}, PeerMemMissing{},
	} {
		if err := n.AddFault(f); err != nil {
			t.Fatal(err)
		}
	}
	got := render(t, n)
	// all_reduce fails with a GPU missing; pin a healthy run too.
	healthy := testNode(t, func(s *Spec) { s.Seed = 7 })
	got["all_reduce_perf-healthy.txt"] = mustCapture(t, healthy, snapshot.SrcAllReduce)
	dir := filepath.Join("testdata", "golden")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range got {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	for name, b := range got {
		want, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("%v (run with UPDATE_GOLDEN=1 to create)", err)
		}
		if !bytes.Equal(b, want) {
			t.Errorf("%s differs from its golden file (UPDATE_GOLDEN=1 refreshes it)\n%s", name, firstDiff(want, b))
		}
	}
}

func firstDiff(want, got []byte) string {
	wl, gl := strings.Split(string(want), "\n"), strings.Split(string(got), "\n")
	for i := range min(len(wl), len(gl)) {
		if wl[i] != gl[i] {
			return fmt.Sprintf("line %d:\nwant %q\ngot  %q", i+1, wl[i], gl[i])
		}
	}
	return fmt.Sprintf("want %d lines, got %d", len(wl), len(gl))
}

func TestSharedTreeRendersEachNode(t *testing.T) {
	t.Parallel()
	sh := NewShared()
	build := func(name string, shared *Shared, spec func(string) Spec) *Node {
		s := spec(name)
		s.Clock = ClockFunc(func() time.Time { return fixedNow })
		s.Shared = shared
		n, err := New(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var wg sync.WaitGroup
	nodes := make([]*Node, 4)
	for i := range nodes {
		wg.Go(func() {
			spec := DefaultSpec
			if i == 3 {
				spec = A100Spec // another shape under the same Shared
			}
			nodes[i] = build(fmt.Sprintf("gpu-%03d", i), sh, spec)
		})
	}
	wg.Wait()
	if nodes[0].tree != nodes[1].tree || nodes[0].tree == nodes[3].tree {
		t.Error("nodes of one shape should share a tree, other shapes not")
	}
	if err := nodes[1].AddFault(IBPortDown{HCA: "mlx5_0"}); err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		spec := DefaultSpec
		if i == 3 {
			spec = A100Spec
		}
		alone := build(fmt.Sprintf("gpu-%03d", i), nil, spec)
		for _, f := range n.Faults() {
			if err := alone.AddFault(f); err != nil {
				t.Fatal(err)
			}
		}
		got, want := render(t, n)["fs.txt"], render(t, alone)["fs.txt"]
		if !bytes.Equal(got, want) {
			t.Errorf("node %d renders differently with a shared tree\n%s", i, firstDiff(want, got))
		}
	}
}
