package sim

import (
	"context"
	"errors"
	"io/fs"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/internal/testwait"
	"github.com/fleetcheck/fleetcheck/node/host"
	"github.com/fleetcheck/fleetcheck/node/probe/nccl"
	"github.com/fleetcheck/fleetcheck/node/probe/nvsmi"
	"github.com/fleetcheck/fleetcheck/node/probe/procfs"
)

func TestDriverUpgradeAction(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := fixedNow
	n := testNode(t, func(s *Spec) {
		s.ActionDelay = 20 * time.Millisecond
		s.Clock = ClockFunc(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	})
	if err := n.AddFault(Xid{GPU: 1, Code: 79}); err != nil {
		t.Fatal(err)
	}
	out, err := n.RunAction(context.Background(), ActionDriverUpgrade, []string{"550.54.15"})
	if err != nil || !strings.Contains(out, "installed NVIDIA driver 550.54.15 (was 535.161.08)") {
		t.Fatalf("upgrade: %q %v", out, err)
	}
	g, err := nvsmi.Parse(mustCapture(t, n, snapshot.SrcNvidiaSMI))
	if err != nil || g.DriverVersion != "550.54.15" {
		t.Fatalf("nvidia-smi after upgrade: %v %v", g.DriverVersion, err)
	}
	data, _ := fs.ReadFile(n.FS(), "proc/driver/nvidia/version")
	if v, err := procfs.ParseDriverVersion(data); err != nil || v != "550.54.15" {
		t.Errorf("/proc/driver/nvidia/version: %q %v", v, err)
	}
	v, err := procfs.ParseVersions(mustCapture(t, n, snapshot.SrcVersions))
	if err != nil || v.Driver != "550.54.15" || v.FabricManager != "550.54.15" {
		t.Errorf("versions: %+v %v", v, err)
	}
	mu.Lock()
	now = now.Add(time.Minute) // a minute after the reboot
	mu.Unlock()
	log := string(mustCapture(t, n, snapshot.SrcKernelLog))
	if !strings.Contains(log, "Kernel Module  550.54.15") || strings.Contains(log, "Xid") {
		t.Errorf("the rebooted kernel log loads the new driver and forgets the Xid:\n%s", log)
	}
	if n.Spec().Driver != "550.54.15" || n.Driver() != "550.54.15" {
		t.Errorf("spec driver %s", n.Spec().Driver)
	}
	if _, err := n.RunAction(context.Background(), ActionDriverRollback, []string{"535.161.08"}); err != nil || n.Driver() != "535.161.08" {
		t.Errorf("rollback: %v, driver %s", err, n.Driver())
	}
	// The argument is checked, and an interrupted upgrade changes nothing.
	if _, err := n.RunAction(context.Background(), ActionDriverUpgrade, []string{"latest"}); err == nil {
		t.Error("upgrade to a version that is not one")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := n.RunAction(ctx, ActionDriverUpgrade, []string{"550.54.15"}); !errors.Is(err, context.Canceled) || n.Driver() != "535.161.08" {
		t.Errorf("canceled upgrade: %v, driver %s", err, n.Driver())
	}
}

func TestFaultActions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := testNode(t, nil)
	steps := []struct {
		name string
		args []string
		kind FaultKind
		on   bool
	}{
		{ActionXidInject, []string{"79", "2"}, KindXid, true},
		{ActionXidClear, nil, KindXid, false},
		{ActionIBPortDown, []string{"mlx5_3"}, KindIBPortDown, true},
		{ActionIBPortUp, []string{"mlx5_3"}, KindIBPortDown, false},
		{ActionGPUSlowdown, []string{"50"}, KindSlowNode, true},
		{ActionGPUSlowdownClear, nil, KindSlowNode, false},
	}
	for _, s := range steps {
		if _, err := n.RunAction(ctx, s.name, s.args); err != nil {
			t.Fatalf("%s %v: %v", s.name, s.args, err)
		}
		has := false
		for _, f := range n.Faults() {
			has = has || f.Kind() == s.kind
		}
		if has != s.on {
			t.Errorf("after %s: %s present %v, want %v", s.name, s.kind, has, s.on)
		}
	}
	for _, bad := range []struct {
		name string
		args []string
	}{
		{ActionXidInject, []string{"x"}}, {ActionXidInject, []string{"79", "12"}}, {ActionIBPortDown, []string{"mlx5_99"}},
		{ActionGPUSlowdown, []string{"0"}}, {ActionGPUSlowdown, []string{"150"}}, {"format-disk", nil},
	} {
		if _, err := n.RunAction(ctx, bad.name, bad.args); err == nil {
			t.Errorf("%s %v accepted", bad.name, bad.args)
		}
	}
	if f, err := slowFactor("0.25"); err != nil || f != 0.25 {
		t.Errorf("factor 0.25: %v %v", f, err)
	}
}

func TestGPUBurnRunsHot(t *testing.T) {
	t.Parallel()
	n := testNode(t, nil)
	temp := func() float64 {
		g, err := nvsmi.Parse(mustCapture(t, n, snapshot.SrcNvidiaSMI))
		if err != nil || g.GPUs[0].TemperatureC == nil {
			t.Fatalf("nvidia-smi: %v", err)
		}
		return *g.GPUs[0].TemperatureC
	}
	idle := temp()
	done := make(chan error, 1)
	go func() {
		_, err := n.RunAction(context.Background(), ActionGPUBurn, []string{"300ms"})
		done <- err
	}()
	testwait.Value(t, 5*time.Second, "GPUs to warm up under gpu-burn", temp, func(c float64) bool { return c > idle+10 })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := temp(); got != idle {
		t.Errorf("after the burn %.0f C, idle was %.0f C", got, idle)
	}
}

func TestMultiNodeAllReduce(t *testing.T) {
	t.Parallel()
	fabric := NewFabric()
	node := func(name string) *Node {
		s := DefaultSpec(name)
		s.Fabric = fabric
		n, err := New(s)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	a, b := node("gpu-001"), node("gpu-002")
	run := func(hosts ...string) (*snapshot.AllReduceRun, host.Capture) {
		c := a.RunMultiNode(context.Background(), host.MultiNodeRun{Argv: []string{"mpirun"}, Hosts: hosts, Ranks: len(hosts)})
		r, err := nccl.Parse(c.Data)
		if err != nil {
			t.Fatalf("parse: %v\n%s", err, c.Data)
		}
		return r, c
	}
	busbw := func(r *snapshot.AllReduceRun) float64 {
		row, ok := r.Largest()
		if !ok {
			t.Fatal("no rows")
		}
		return row.BusBW()
	}
	r, c := run("gpu-001", "gpu-002")
	if c.State != snapshot.StateOK || len(r.Failures) != 0 || r.Transport != "IB" {
		t.Fatalf("healthy pair: %s failures %v transport %q", c.State, r.Failures, r.Transport)
	}
	if bw := busbw(r); math.Abs(bw-469)/469 > 0.03 {
		t.Errorf("healthy pair %.1f GB/s, want about 469", bw)
	}
	if !strings.Contains(string(c.Data), "Rank 15 Group  0") || !strings.Contains(string(c.Data), " on    gpu-002 device  7") {
		t.Errorf("ranks of both hosts missing:\n%s", c.Data)
	}
	// The slower side sets the pace, from either end.
	if err := b.AddFault(IBPortDown{HCA: "mlx5_0"}); err != nil {
		t.Fatal(err)
	}
	if err := b.AddFault(IBPortDown{HCA: "mlx5_1"}); err != nil {
		t.Fatal(err)
	}
	r, _ = run("gpu-001", "gpu-002")
	if bw := busbw(r); math.Abs(bw-469*0.75)/(469*0.75) > 0.03 {
		t.Errorf("peer with 6 of 8 ports: %.1f GB/s, want about %.0f", bw, 469*0.75)
	}
	// A host outside the fabric cannot be reached.
	r, c = run("gpu-001", "gpu-404")
	if c.State != snapshot.StateFailed || len(r.Failures) == 0 {
		t.Errorf("unknown peer: %s %v", c.State, r.Failures)
	}
}
