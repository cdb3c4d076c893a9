package loadgen

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fleetcheck/fleetcheck/coordinator"
)

func TestScratchCoordHeap(t *testing.T) {
	if os.Getenv("SCRATCH_HEAP") == "" {
		t.Skip()
	}
	srv, err := coordinator.New(coordinator.Config{Listen: "127.0.0.1:0", HTTPListen: "off", DataDir: t.TempDir(), Insecure: true},
		coordinator.Options{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(context.Background())
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	t.Logf("before: heap_inuse %d MiB stack %d MiB sys %d MiB goroutines %d", ms.HeapInuse>>20, ms.StackInuse>>20, ms.Sys>>20, runtime.NumGoroutine())
	cmd := exec.Command("/tmp/lg", "-coordinator", srv.GRPCAddr().String(), "-agents", "1000", "-settle", "40s", "-check-runs", "0", "-bundle", "../examples/bundles/h100-healthy")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	time.Sleep(25 * time.Second)
	for i := range 4 {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		t.Logf("gc %d: heap_inuse %d MiB heap_alloc %d MiB stack %d MiB", i, ms.HeapInuse>>20, ms.HeapAlloc>>20, ms.StackInuse>>20)
		time.Sleep(time.Second)
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	t.Logf("after: heap_inuse %d MiB heap_alloc %d MiB stack %d MiB sys %d MiB goroutines %d other_sys %d MiB mspan %d", ms.HeapInuse>>20, ms.HeapAlloc>>20, ms.StackInuse>>20, ms.Sys>>20, runtime.NumGoroutine(), ms.OtherSys>>20, ms.MSpanInuse>>20)
	g, _ := os.Create("/tmp/coordgr.txt")
	pprof.Lookup("goroutine").WriteTo(g, 1)
	g.Close()
	f, _ := os.Create("/tmp/coordheap.out")
	pprof.WriteHeapProfile(f)
	f.Close()
	st, _ := os.ReadFile("/proc/self/status")
	t.Logf("%s", st)
}
