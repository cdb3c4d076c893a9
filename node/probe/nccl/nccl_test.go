package nccl

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

func fixtures(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	return files
}

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGolden compares each fixture's parse with its golden JSON;
// UPDATE_GOLDEN=1 rewrites the golden files.
func TestGolden(t *testing.T) {
	t.Parallel()
	update := os.Getenv("UPDATE_GOLDEN") == "1"
	for _, f := range fixtures(t) {
		name := strings.TrimSuffix(filepath.Base(f), ".txt")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			run, err := Parse(data)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got, err := json.MarshalIndent(run, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			golden := filepath.Join("testdata", "golden", name+".json")
			if update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with UPDATE_GOLDEN=1 to create)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("parse of %s differs from %s (UPDATE_GOLDEN=1 refreshes)\ngot:\n%s", f, golden, got)
			}
		})
	}
}

// TestFixtureFacts pins what matters in each fixture independently of the
// golden files, so a regenerated golden cannot hide a wrong value.
func TestFixtureFacts(t *testing.T) {
	t.Parallel()
	type want struct {
		rows        int
		largest     uint64
		busbw       float64
		avg         float64 // 0: absent
		oob         int64   // -1: absent
		oobFailed   bool
		devices     int
		version     string
		transport   string
		gpuDirect   bool
		failures    int
		wrongSizes  []uint64
		wrongNil    bool // every Wrong is nil (old layout)
		firstRowIPT float64
	}
	cases := map[string]want{
		"SYNTHETIC__h100x8_single-node_nvls_healthy_480GBps.txt": {
			rows: 31, largest: 8589934592, busbw: 479.02, avg: 121.847, oob: 0, devices: 8, version: "2.19.3",
			firstRowIPT: 194.55},
		"SYNTHETIC__h100x8_single-node_DEGRADED_nvls-off_370GBps.txt": {
			rows: 31, largest: 8589934592, busbw: 366.76, avg: 93.5862, oob: 0, devices: 8, version: "2.19.3",
			firstRowIPT: 249.64},
		"SYNTHETIC__h100x8_single-node_DATA-CORRUPTION_wrong.txt": {
			rows: 31, largest: 8589934592, busbw: 477.04, avg: 121.351, oob: 16384, oobFailed: true, devices: 8,
			version: "2.19.3", wrongSizes: []uint64{268435456}, firstRowIPT: 195.28},
		"nccl-tests-issue309__h100x16_2node_cx7-ndr400_good_469GBps.txt": {
			rows: 32, largest: 17179869184, busbw: 469.21, avg: 139.56, oob: 0, devices: 16, version: "2.26.2",
			firstRowIPT: 24.70},
		"nccl-tests-v2.19.4__a100x8_single-node_dkh__provenance-unidentified.txt": {
			rows: 25, largest: 134217728, busbw: 182.90, avg: 34.9024, oob: 0, devices: 8, version: "2.19.3",
			firstRowIPT: 36.18},
		"skypilot-nebius__h100x16_2node_ib__table-excerpt.txt": {
			rows: 5, largest: 8589934592, busbw: 477.42, avg: 457.407, oob: 0, firstRowIPT: 2354.3},
		"SYNTHETIC__v100x8_single-node_OLD-LAYOUT_error-column.txt": {
			rows: 25, largest: 134217728, busbw: 128.26, avg: 31.1516, oob: 0, devices: 8, wrongNil: true,
			firstRowIPT: 41.92},
		"SYNTHETIC__h100x16_2node_DEBUG-INFO_ib-gdrdma.txt": {
			rows: 7, largest: 8589934592, busbw: 461.21, avg: 447.657, oob: 0, devices: 16, version: "2.21.5",
			transport: "IB", gpuDirect: true, firstRowIPT: 607.13},
		"SYNTHETIC__h100x16_2node_DEBUG-INFO_SOCKET-FALLBACK.txt": {
			rows: 7, largest: 8589934592, busbw: 11.19, avg: 11.0543, oob: 0, devices: 16, version: "2.21.5",
			transport: "Socket", firstRowIPT: 23463},
		"SYNTHETIC__h100x16_2node_TEST-NCCL-FAILURE_no-rows.txt": {
			oob: -1, devices: 16, version: "2.21.5", failures: 4},
	}
	if n := len(fixtures(t)); n != len(cases) {
		t.Fatalf("%d fixtures but %d expectations: add the new fixture here", n, len(cases))
	}
	for name, w := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			run, err := Parse(readFixture(t, name))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(run.Rows) != w.rows {
				t.Errorf("rows = %d, want %d", len(run.Rows), w.rows)
			}
			row, ok := run.Largest()
			if ok != (w.rows > 0) {
				t.Fatalf("Largest ok = %v", ok)
			}
			if ok {
				if row.SizeBytes != w.largest || row.BusBW() != w.busbw {
					t.Errorf("largest = %d B %.2f GB/s, want %d B %.2f GB/s", row.SizeBytes, row.BusBW(), w.largest, w.busbw)
				}
				if run.Rows[0].InPlace.TimeUS != w.firstRowIPT {
					t.Errorf("first row in-place time = %v, want %v", run.Rows[0].InPlace.TimeUS, w.firstRowIPT)
				}
				if run.Rows[0].Type != "float" || run.Rows[0].RedOp != "sum" {
					t.Errorf("first row type/op = %q/%q", run.Rows[0].Type, run.Rows[0].RedOp)
				}
			}
			switch {
			case w.avg == 0 && run.AvgBusBW != nil:
				t.Errorf("AvgBusBW = %v, want absent", *run.AvgBusBW)
			case w.avg != 0 && (run.AvgBusBW == nil || *run.AvgBusBW != w.avg):
				t.Errorf("AvgBusBW = %v, want %v", run.AvgBusBW, w.avg)
			}
			switch {
			case w.oob < 0 && run.OutOfBounds != nil:
				t.Errorf("OutOfBounds = %d, want absent", *run.OutOfBounds)
			case w.oob >= 0 && (run.OutOfBounds == nil || *run.OutOfBounds != uint64(w.oob)):
				t.Errorf("OutOfBounds = %v, want %d", run.OutOfBounds, w.oob)
			}
			if run.OutOfBoundsFailed != w.oobFailed {
				t.Errorf("OutOfBoundsFailed = %v", run.OutOfBoundsFailed)
			}
			if run.Devices != w.devices {
				t.Errorf("Devices = %d, want %d", run.Devices, w.devices)
			}
			if run.NCCLVersion != w.version {
				t.Errorf("NCCLVersion = %q, want %q", run.NCCLVersion, w.version)
			}
			if run.Transport != w.transport || run.GPUDirect != w.gpuDirect {
				t.Errorf("transport = %q gdr=%v, want %q gdr=%v", run.Transport, run.GPUDirect, w.transport, w.gpuDirect)
			}
			if len(run.Failures) != w.failures {
				t.Errorf("Failures = %q, want %d", run.Failures, w.failures)
			}
			var wrong []uint64
			for _, r := range run.Rows {
				for _, res := range []snapshot.AllReduceResult{r.OutOfPlace, r.InPlace} {
					if w.wrongNil != (res.Wrong == nil) {
						t.Fatalf("size %d: Wrong = %v, want nil=%v", r.SizeBytes, res.Wrong, w.wrongNil)
					}
				}
				if r.OutOfPlace.Wrong != nil && *r.OutOfPlace.Wrong > 0 {
					wrong = append(wrong, r.SizeBytes)
				}
			}
			if len(wrong) != len(w.wrongSizes) || (len(wrong) > 0 && wrong[0] != w.wrongSizes[0]) {
				t.Errorf("sizes with #wrong = %v, want %v", wrong, w.wrongSizes)
			}
		})
	}
}

const modernHeader = `#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
`

func TestParseTraps(t *testing.T) {
	t.Parallel()
	u := func(v uint64) *uint64 { return &v }
	cases := []struct {
		name  string
		in    string
		check func(t *testing.T, r *snapshot.AllReduceRun)
	}{
		{
			name: "wrong N/A when not validated",
			in: modernHeader +
				"  1073741824     268435456     float     sum      -1   4109.18  261.30  457.28     N/A   4125.62  260.26  455.46     N/A\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if r.Rows[0].OutOfPlace.Wrong != nil || r.Rows[0].InPlace.Wrong != nil {
					t.Error("N/A must parse as nil Wrong")
				}
			},
		},
		{
			name: "old layout without root, error column N/A",
			in: "#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n" +
				"   134217728      33554432   float     sum  1834.98   73.14  128.00    N/A  1831.31   73.29  128.26    N/A\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if r.Rows[0].InPlace.BusBW != 128.26 || r.Rows[0].OutOfPlace.Wrong != nil {
					t.Errorf("row = %+v", r.Rows[0])
				}
			},
		},
		{
			name: "oldest layout: bytes N type op ... res",
			in: "#      bytes             N    type      op     time  algbw  busbw      res     time  algbw  busbw      res\n" +
				"    33554432       8388608   float     sum    6.613   5.07   8.88    1e-06    6.604   5.08   8.89    1e-06\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if r.Rows[0].SizeBytes != 33554432 || r.Rows[0].InPlace.BusBW != 8.89 || r.Rows[0].InPlace.Wrong != nil {
					t.Errorf("row = %+v", r.Rows[0])
				}
			},
		},
		{
			name: "header decides column positions, extra unknown column tolerated",
			in: "#       size         count      type   redop    root    extra     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\n" +
				"        1024           256     float     sum      -1        7    10.00    0.10    0.18       0    11.00    0.09    0.16       3\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				row := r.Rows[0]
				if row.OutOfPlace.TimeUS != 10 || row.InPlace.Wrong == nil || *row.InPlace.Wrong != 3 {
					t.Errorf("row = %+v", row)
				}
			},
		},
		{
			name: "rows without any header use the modern positions",
			in:   "  8589934592    2147483648     float     sum      -1  31512.0  272.59  477.04       0  31638.0  271.51  475.14       0\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if r.Rows[0].BusBW() != 477.04 {
					t.Errorf("busbw = %v", r.Rows[0].BusBW())
				}
			},
		},
		{
			name: "CRLF, mpirun tag-output and srun label prefixes",
			in: "[1,0]<stdout>:" + strings.ReplaceAll(modernHeader, "\n", "\r\n[1,0]<stdout>:") +
				"  1024  256  float  sum  -1  10.0  0.10  0.18  0  11.0  0.09  0.16  0\r\n" +
				"  0:   2048  512  float  sum  -1  10.0  0.20  0.36  0  11.0  0.19  0.33  0\r\n" +
				"[1,0]<stdout>:# Out of bounds values : 0 OK\r\n" +
				"  0: # Avg bus bandwidth    : 0.2575 \r\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if len(r.Rows) != 2 || r.AvgBusBW == nil || *r.AvgBusBW != 0.2575 || r.OutOfBounds == nil {
					t.Errorf("run = %+v", r)
				}
			},
		},
		{
			name: "noise that looks numeric is not a row",
			in: modernHeader +
				"  1024  256  float  sum  -1  10.0  0.10  0.18  0  11.0  0.09  0.16  0\n" +
				"  15 more processes have sent help message help-btl-vader.txt / xpmem-make-failed\n" +
				"  2048  512  float  sum  -1  NaN  0.20  0.36  0  11.0  0.19  0.33  0\n" +
				"  4096 1024  float  sum  -1  10.0  Inf  0.36  0  11.0  0.19  0.33  0\n" +
				"  8192 2048  float  sum  -1  10.0  0.20  -1.0  0  11.0  0.19  0.33  0\n" +
				"  16384 4096 float  sum  -1  10.0  0.20  0.36  x  11.0  0.19  0.33  0\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if len(r.Rows) != 1 {
					t.Errorf("rows = %+v", r.Rows)
				}
			},
		},
		{
			name: "largest size is judged, not the last row",
			in: modernHeader +
				"  8589934592 2147483648 float sum -1 31512.0 272.59 477.04 0 31638.0 271.51 475.14 0\n" +
				"  1024 256 float sum -1 10.0 0.10 0.18 0 11.0 0.09 0.16 0\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				row, _ := r.Largest()
				if row.SizeBytes != 8589934592 {
					t.Errorf("largest = %d", row.SizeBytes)
				}
			},
		},
		{
			name: "failures with rows, deduplicated",
			in: modernHeader +
				"  1024 256 float sum -1 10.0 0.10 0.18 0 11.0 0.09 0.16 0\n" +
				"gpu1:123:456 [0] NCCL WARN Cuda failure 'out of memory'\n" +
				"gpu1: Test NCCL failure common.cu:1005 'unhandled cuda error'\n" +
				" .. gpu1 pid 123: Test failure common.cu:891\n" +
				" .. gpu1 pid 123: Test failure common.cu:891\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if len(r.Failures) != 3 || len(r.Rows) != 1 {
					t.Errorf("failures = %q", r.Failures)
				}
			},
		},
		{
			name: "out of bounds without status word and footer FAILED by min bw",
			in: modernHeader +
				"  1024 256 float sum -1 10.0 0.10 0.18 2 11.0 0.09 0.16 0\n" +
				"# Out of bounds values : 2\n" +
				"# Avg bus bandwidth    : 0.17 FAILED\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if r.OutOfBounds == nil || *r.OutOfBounds != 2 || !r.OutOfBoundsFailed {
					t.Errorf("oob = %v %v", r.OutOfBounds, r.OutOfBoundsFailed)
				}
				if len(r.Failures) != 1 || !strings.Contains(r.Failures[0], "FAILED") {
					t.Errorf("failures = %q", r.Failures)
				}
				if *r.Rows[0].OutOfPlace.Wrong != *u(2) {
					t.Errorf("wrong = %d", *r.Rows[0].OutOfPlace.Wrong)
				}
			},
		},
		{
			name: "IB init line alone gives IB",
			in: "h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:10.0.0.1<0>\n" +
				"  1024 256 float sum -1 10.0 0.10 0.18 0 11.0 0.09 0.16 0\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if r.Transport != "IB" || r.GPUDirect {
					t.Errorf("transport = %q gdr = %v", r.Transport, r.GPUDirect)
				}
			},
		},
		{
			name: "one node falling back to sockets makes the run Socket",
			in: "a:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>\n" +
				"b:1:1 [0] NCCL INFO NET/IB : No device found.\n" +
				"b:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>\n" +
				"  1024 256 float sum -1 10.0 0.10 0.18 0 11.0 0.09 0.16 0\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if r.Transport != "Socket" {
					t.Errorf("transport = %q", r.Transport)
				}
			},
		},
		{
			name: "bootstrap socket line is not a fallback",
			in: "a:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n" +
				"a:1:1 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0\n" +
				"  1024 256 float sum -1 10.0 0.10 0.18 0 11.0 0.09 0.16 0\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if r.Transport != "IB" || r.GPUDirect {
					t.Errorf("transport = %q gdr = %v", r.Transport, r.GPUDirect)
				}
			},
		},
		{
			name: "NCCL version from INFO line beats the library code",
			in: "# nccl-tests version 2.13.10 nccl-headers=21805 nccl-library=21805\n" +
				"h:1:1 [0] NCCL INFO NCCL version 2.18.5+cuda12.2\n" +
				"  1024 256 float sum -1 10.0 0.10 0.18 0 11.0 0.09 0.16 0\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if r.NCCLVersion != "2.18.5" {
					t.Errorf("version = %q", r.NCCLVersion)
				}
			},
		},
		{
			name: "pre-2.9 library code",
			in: "# nccl-tests version 2.10.0 nccl-headers=2708 nccl-library=2708\n" +
				"  1024 256 float sum -1 10.0 0.10 0.18 0 11.0 0.09 0.16 0\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if r.NCCLVersion != "2.7.8" {
					t.Errorf("version = %q", r.NCCLVersion)
				}
			},
		},
		{
			name: "only failures: a run, not an error",
			in:   "h: Test NCCL failure common.cu:1005 'unhandled system error (run with NCCL_DEBUG=INFO for details) / '\n",
			check: func(t *testing.T, r *snapshot.AllReduceRun) {
				if len(r.Rows) != 0 || len(r.Failures) != 1 {
					t.Errorf("run = %+v", r)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r, err := Parse([]byte(c.in))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			c.check(t, r)
		})
	}
}

func TestParseNoRows(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]string{
		"empty":         "",
		"header only":   modernHeader + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0 \n",
		"mpi noise":     "WARNING: Could not generate an xpmem segment id\n  Local host: bm-h100-01\n",
		"binary":        "\x00\x01\x02\xff\xfe",
		"truncated row": modernHeader + "  1073741824     268435456     float     sum      -1   4109.18  261.30",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, err := Parse([]byte(in))
			if !errors.Is(err, ErrNoRows) || r != nil {
				t.Fatalf("Parse = %v, %v; want ErrNoRows", r, err)
			}
			if !strings.Contains(err.Error(), "all_reduce_perf") {
				t.Errorf("error %q does not name the source", err)
			}
		})
	}
}

func TestFailuresBounded(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	for i := 0; i < 1000; i++ {
		b.WriteString("h:1:1 [0] NCCL WARN something ")
		b.WriteString(strings.Repeat("x", i))
		b.WriteString("\n")
	}
	r, err := Parse([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Failures) != maxFailures {
		t.Errorf("kept %d failures, want %d", len(r.Failures), maxFailures)
	}
	for _, f := range r.Failures {
		if len(f) > maxFailureLine {
			t.Errorf("failure line of %d bytes kept", len(f))
		}
	}
}

func TestLargestEmpty(t *testing.T) {
	t.Parallel()
	if _, ok := (*snapshot.AllReduceRun)(nil).Largest(); ok {
		t.Error("(*snapshot.AllReduceRun)(nil).Largest() ok")
	}
	if _, ok := (&snapshot.AllReduceRun{}).Largest(); ok {
		t.Error("Largest(empty) ok")
	}
}

func FuzzParse(f *testing.F) {
	for _, file := range fixtures(f) {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(modernHeader + "1 1 a b -1 1 1 1 1 1 1 1 1\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Parse(data)
		if err != nil {
			if r != nil || !errors.Is(err, ErrNoRows) {
				t.Fatalf("Parse = %v, %v", r, err)
			}
			return
		}
		if len(r.Rows) == 0 && len(r.Failures) == 0 {
			t.Fatal("run without rows or failures")
		}
		if len(r.Failures) > maxFailures {
			t.Fatalf("%d failures kept", len(r.Failures))
		}
		for _, row := range r.Rows {
			for _, v := range []float64{row.OutOfPlace.TimeUS, row.OutOfPlace.AlgBW, row.OutOfPlace.BusBW,
				row.InPlace.TimeUS, row.InPlace.AlgBW, row.InPlace.BusBW} {
				if v < 0 || v != v || v > 1e308 {
					t.Fatalf("bad value %v in %+v", v, row)
				}
			}
		}
		if r.AvgBusBW != nil && (*r.AvgBusBW < 0 || *r.AvgBusBW != *r.AvgBusBW) {
			t.Fatalf("bad avg %v", *r.AvgBusBW)
		}
		if _, err := json.Marshal(r); err != nil {
			t.Fatalf("run does not marshal: %v", err)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	data := readFixture(b, "nccl-tests-issue309__h100x16_2node_cx7-ndr400_good_469GBps.txt")
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
