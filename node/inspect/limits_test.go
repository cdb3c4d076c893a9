package inspect

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/checks"
	"github.com/fleetcheck/fleetcheck/checks/registry"
	"github.com/fleetcheck/fleetcheck/internal/snapshot"
	"github.com/fleetcheck/fleetcheck/node/host/bundle"
	"github.com/fleetcheck/fleetcheck/node/probe/kmsg"
)

const xidLine = "[ 2397166.923949] NVRM: Xid (PCI:0000:9b:00): 13, pid=40312, name=python3, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 1): Out Of Range Address\n"

// writeDmesg writes whole Xid lines up to size bytes.
func writeDmesg(t testing.TB, p string, size int) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte(xidLine), (1<<20)/len(xidLine))
	for left := size; left >= len(xidLine); {
		n := min(len(chunk), left/len(xidLine)*len(xidLine))
		if _, err := f.Write(chunk[:n]); err != nil {
			t.Fatal(err)
		}
		left -= n
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// A kernel log too large to hold is parsed from the bundle as a stream and
// reads the same as the whole file parsed in memory.
func TestLargeKernelLogIsStreamed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(`{"format":1,"collected_at":"2026-11-28T02:00:00Z"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "dmesg.txt")
	writeDmesg(t, p, 3<<20) // past the 1 MiB held in memory
	b, err := bundle.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := Read(context.Background(), b, Want{})
	if st := s.Source(snapshot.SrcKernelLog); st.State != snapshot.StateOK || s.Kernel == nil {
		t.Fatalf("kernel log: %+v", st)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	whole, _ := kmsg.Parse(data, s.CollectedAt, s.Uptime)
	if s.Kernel.Lines != whole.Lines || len(s.Kernel.Events) != len(whole.Events) || s.Kernel.Dropped[snapshot.EventXid] != whole.Dropped[snapshot.EventXid] {
		t.Errorf("streamed: %d lines, %d events, %v dropped; whole: %d, %d, %v",
			s.Kernel.Lines, len(s.Kernel.Events), s.Kernel.Dropped, whole.Lines, len(whole.Events), whole.Dropped)
	}
	// The file grows past its limit after the bundle was opened: it is
	// refused when read, and the source says why instead of reading on.
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(bundle.DefaultLimits.MaxKernelLogBytes) + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s = Read(context.Background(), b, Want{})
	if st := s.Source(snapshot.SrcKernelLog); st.State != snapshot.StateFailed || s.Kernel != nil {
		t.Errorf("kernel log grown past its limit: %+v, kernel %v", st, s.Kernel != nil)
	}
}

// BenchmarkAnalyzeLargestKernelLog is analyze of the largest accepted
// kernel log: the 8-GPU example bundle with a dmesg.txt of Xid lines just
// under bundle.DefaultLimits.MaxKernelLogBytes, as a directory. It
// reports the peak live heap, which the bound in docs/bundles.md covers.
func BenchmarkAnalyzeLargestKernelLog(b *testing.B) {
	cfg := loadExampleConfig(b)
	list, _ := checks.Select(registry.All(), nil, true)
	dir := b.TempDir()
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(examples, "h100-healthy"))); err != nil {
		b.Fatal(err)
	}
	size := int(bundle.DefaultLimits.MaxKernelLogBytes)
	writeDmesg(b, filepath.Join(dir, "dmesg.txt"), size)
	peak := samplePeakHeap()
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		bd, err := bundle.Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		res := Run(context.Background(), bd, Options{Config: cfg, Checks: list})
		if len(res.Report.Checks) == 0 {
			b.Fatal("no checks")
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(peak())/(1<<20), "peak-heap-MiB")
}

// samplePeakHeap samples the live heap every few milliseconds until the
// returned function is called, which gives the largest value seen.
func samplePeakHeap() func() uint64 {
	done := make(chan struct{})
	out := make(chan uint64)
	go func() {
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		var peak uint64
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(s)
			peak = max(peak, s[0].Value.Uint64())
			select {
			case <-done:
				out <- peak
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 { close(done); return <-out }
}
