package kmsg

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// goldenInputs are the fixtures with the collection time and uptime each
// one is parsed under.
var goldenInputs = []struct {
	file        string
	collectedAt string
	uptime      time.Duration
}{
	{"gpud__dmesg-with-xid-119.log", "2025-02-23T17:00:00Z", 0},
	{"xid_kernel_log_line_samples.txt", "2025-02-23T17:00:00Z", 0},
	{"synthetic__dmesg-plain.log", "2026-11-28T12:00:00Z", 2397200 * time.Second},
	{"synthetic__dmesg-iso.log", "2026-11-28T02:00:00Z", 0},
	{"synthetic__kmsg.txt", "2026-11-28T12:00:00Z", 652700 * time.Second},
	{"synthetic__syslog.log", "2026-11-28T02:00:00Z", 2397300 * time.Second},
}

// readFixture returns a fixture's bytes; the samples file is "tag|line"
// with # comments, which are stripped to leave raw kernel lines.
func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if name != "xid_kernel_log_line_samples.txt" {
		return data
	}
	var out bytes.Buffer
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "#") || l == "" {
			continue
		}
		if i := strings.IndexByte(l, '|'); i >= 0 {
			l = l[i+1:]
		}
		out.WriteString(l + "\n")
	}
	return out.Bytes()
}

func mustTime(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestGolden(t *testing.T) {
	t.Parallel()
	for _, in := range goldenInputs {
		t.Run(in.file, func(t *testing.T) {
			t.Parallel()
			data := readFixture(t, in.file)
			log, err := Parse(data, mustTime(t, in.collectedAt), in.uptime)
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(log, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			golden := filepath.Join("testdata", strings.TrimSuffix(in.file, filepath.Ext(in.file))+".golden.json")
			if os.Getenv("UPDATE_GOLDEN") != "" {
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
				t.Errorf("%s differs from golden; got:\n%s", in.file, got)
			}

			// The streaming reader must agree with the in-memory parser,
			// also when reads come one byte at a time.
			log2, err := ParseReader(iotest.OneByteReader(bytes.NewReader(data)), mustTime(t, in.collectedAt), in.uptime)
			if err != nil {
				t.Fatal(err)
			}
			got2, _ := json.MarshalIndent(log2, "", "  ")
			if !bytes.Equal(append(got2, '\n'), got) {
				t.Errorf("ParseReader differs from Parse")
			}
		})
	}
}

func dur(d time.Duration) *time.Duration { return &d }

func TestLineShapes(t *testing.T) {
	t.Parallel()
	collected := mustTime(t, "2026-11-28T12:00:00Z")
	uptime := 100 * time.Hour
	boot := collected.Add(-uptime)
	tests := []struct {
		name string
		in   string
		want []snapshot.KernelEvent // Raw is checked only for being the line
	}{
		{
			name: "plain dmesg",
			in:   "[ 3600.250000] NVRM: Xid (PCI:0000:9b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 79, PCIBusID: "0000:9b:00.0", PID: 1234, Process: "python3",
				Message: "GPU has fallen off the bus.", Time: boot.Add(3600*time.Second + 250*time.Millisecond), SinceBoot: dur(3600*time.Second + 250*time.Millisecond)}},
		},
		{
			name: "dmesg -T",
			in:   "[Sat Nov 28 01:58:17 2026] NVRM: Xid (PCI:0000:0f:00): 48, pid='<unknown>', name=<unknown>, DBE",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 48, PCIBusID: "0000:0f:00.0", Message: "DBE",
				Time: time.Date(2026, 11, 28, 1, 58, 17, 0, time.UTC)}},
		},
		{
			name: "dmesg -T single-digit day",
			in:   "[Sun Nov  8 01:58:17 2026] NVRM: Xid (PCI:0000:0f:00): 63, Row Remapper",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 63, PCIBusID: "0000:0f:00.0", Message: "Row Remapper",
				Time: time.Date(2026, 11, 8, 1, 58, 17, 0, time.UTC)}},
		},
		{
			name: "iso",
			in:   "2026-11-28T01:33:41,902311+02:00 NVRM: Xid (PCI:0000:9b:00): 119, pid=5, name=x, Timeout",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 119, PCIBusID: "0000:9b:00.0", PID: 5, Process: "x", Message: "Timeout",
				Time: time.Date(2026, 11, 27, 23, 33, 41, 902311000, time.UTC)}},
		},
		{
			name: "kmsg record",
			in:   "4,22626,7200000000,-;NVRM: Xid (PCI:0000:3b:00): 95, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 95, PCIBusID: "0000:3b:00.0", Message: "Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No",
				Time: boot.Add(2 * time.Hour), SinceBoot: dur(2 * time.Hour)}},
		},
		{
			name: "syslog",
			in:   "Nov 28 01:58:17 gpu-017 kernel: NVRM: Xid (PCI:0000:1b:00): 31, pid=9, name=a, MMU Fault",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 31, PCIBusID: "0000:1b:00.0", PID: 9, Process: "a", Message: "MMU Fault",
				Time: time.Date(2026, 11, 28, 1, 58, 17, 0, time.UTC)}},
		},
		{
			name: "syslog from last year",
			in:   "Dec 31 23:00:00 gpu-017 kernel: NVRM: Xid (PCI:0000:1b:00): 31, MMU Fault",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 31, PCIBusID: "0000:1b:00.0", Message: "MMU Fault",
				Time: time.Date(2025, 12, 31, 23, 0, 0, 0, time.UTC)}},
		},
		{
			name: "no timestamp, no PCI prefix",
			in:   "NVRM: Xid (0000:03:00): 14, Channel 00000001",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 14, PCIBusID: "0000:03:00.0", Message: "Channel 00000001"}},
		},
		{
			name: "pid N/A without name",
			in:   "NVRM: Xid (PCI:0000:65:00): 64, pid='N/A', Row Remapper: Failed to remap row",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 64, PCIBusID: "0000:65:00.0", Message: "Row Remapper: Failed to remap row"}},
		},
		{
			name: "MIG attribution",
			in:   "NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 94, pid=7194, name=p, Contained: CE User Channel (0x9). RST: No, D-RST: No",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 94, PCIBusID: "0000:01:00.0", PID: 7194, Process: "p", Message: "Contained: CE User Channel (0x9). RST: No, D-RST: No"}},
		},
		{
			name: "empty message",
			in:   "NVRM: Xid (PCI:0000:01:00): 43, pid=1, name=x, ",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 43, PCIBusID: "0000:01:00.0", PID: 1, Process: "x"}},
		},
		{
			name: "sxid fatal",
			in:   "[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventSXid, Code: 20034, PCIBusID: "0000:00:00.0", Device: "nvidia-nvswitch0", Fatal: true,
				Message: "Fatal, Link 30 LTSSM Fault Up", Time: boot.Add(131453740743 * time.Microsecond), SinceBoot: dur(131453740743 * time.Microsecond)}},
		},
		{
			name: "sxid with leading zeros and detail lines",
			in: "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 01234, Non-fatal, Link 04 thing\n" +
				"nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 01234, Severity 0 Engine instance 04 Sub-engine instance 00\n" +
				"nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 01234, Data {0x00000000, 0x00000000}",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventSXid, Code: 1234, PCIBusID: "0000:06:00.0", Device: "nvidia-nvswitch1", Message: "Non-fatal, Link 04 thing"}},
		},
		{
			name: "fallen off the bus without xid",
			in:   "NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventFellOffBus, PCIBusID: "0000:29:00.0", Message: "GPU has fallen off the bus."}},
		},
		{
			name: "fallen off the bus, old driver shape",
			in:   "NVRM: GPU at PCI:0000:01:00.0 has fallen off the bus",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventFellOffBus, PCIBusID: "0000:01:00.0", Message: "GPU has fallen off the bus"}},
		},
		{
			name: "fallen off the bus, three lines",
			in: "[   40.000000] NVRM: The NVIDIA GPU 0000:18:00.0\n" +
				"               NVRM: (PCI ID: 10de:20b5) installed in this system has\n" +
				"               NVRM: fallen off the bus and is not responding to commands.",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventFellOffBus, PCIBusID: "0000:18:00.0", Message: "GPU has fallen off the bus and is not responding to commands",
				Time: boot.Add(40 * time.Second), SinceBoot: dur(40 * time.Second)}},
		},
		{
			name: "gpu identity line marks a reset",
			in:   "NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventGPUReset, PCIBusID: "0000:9b:00.0", Message: "GPU initialised: GPU-509665ad-b600-ac93-3616-d754b23d636d"}},
		},
		{
			name: "driver load resets every GPU",
			in:   "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Mar  5 22:42:15 UTC 2024",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventGPUReset, Message: "NVIDIA driver loaded", DriverLoad: true}},
		},
		{
			name: "continuation never starts an event",
			in:   "[ 1.0] NVRM: something\n    NVRM: Xid (PCI:0000:9b:00): 79, GPU has fallen off the bus.\n\tnvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, x",
		},
		{
			name: "not driver lines",
			in: "[   18.6] mlx5_core 0000:9c:00.0: 252.056 Gb/s available PCIe bandwidth\n" +
				"NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of every 30).\n" +
				"NVRM: Xid (PCI:0000:9b:00): abc, not a number\n" +
				"NVRM: Xid (PCI:0000:9b:00): 1234567890, too long\n" +
				"NVRM: Xid (PCI:0000:9b:00 no close paren: 79,\n" +
				"NVRM: GPU4 GSP RPC buffer contains function 103",
		},
		{
			name: "bad bus id gives an event without one",
			in:   "NVRM: Xid (PCI:zz:qq): 79, GPU has fallen off the bus.",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 79, Message: "GPU has fallen off the bus."}},
		},
		{
			name: "crlf",
			in:   "NVRM: Xid (PCI:0000:03:00): 14, Channel 00000001\r\n",
			want: []snapshot.KernelEvent{{Kind: snapshot.EventXid, Code: 14, PCIBusID: "0000:03:00.0", Message: "Channel 00000001"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			log, err := Parse([]byte(tc.in), collected, uptime)
			if err != nil {
				t.Fatal(err)
			}
			if len(log.Events) != len(tc.want) {
				t.Fatalf("got %d events, want %d: %+v", len(log.Events), len(tc.want), log.Events)
			}
			for i, got := range log.Events {
				want := tc.want[i]
				if !strings.Contains(tc.in, got.Raw) || got.Raw == "" {
					t.Errorf("Raw %q is not a line of the input", got.Raw)
				}
				got.Raw = ""
				if (got.SinceBoot == nil) != (want.SinceBoot == nil) || (got.SinceBoot != nil && *got.SinceBoot != *want.SinceBoot) {
					t.Errorf("SinceBoot = %v, want %v", got.SinceBoot, want.SinceBoot)
				}
				got.SinceBoot, want.SinceBoot = nil, nil
				if !got.Time.Equal(want.Time) {
					t.Errorf("Time = %v, want %v", got.Time, want.Time)
				}
				got.Time, want.Time = time.Time{}, time.Time{}
				if got != want {
					t.Errorf("event\n got %+v\nwant %+v", got, want)
				}
			}
		})
	}
}

func TestPlainStampWithoutUptime(t *testing.T) {
	t.Parallel()
	log, _ := Parse([]byte("[ 5.000001] NVRM: Xid (PCI:0000:9b:00): 79, x"), time.Now(), 0)
	if len(log.Events) != 1 {
		t.Fatalf("events: %+v", log.Events)
	}
	e := log.Events[0]
	if !e.Time.IsZero() || e.SinceBoot == nil || *e.SinceBoot != 5*time.Second+time.Microsecond {
		t.Errorf("without uptime want zero Time and SinceBoot 5.000001s, got %v %v", e.Time, e.SinceBoot)
	}
}

func TestCTimeUsesCollectionZone(t *testing.T) {
	t.Parallel()
	zone := time.FixedZone("host", 8*3600)
	log, _ := Parse([]byte("[Sat Nov 28 01:58:17 2026] NVRM: Xid (PCI:0000:9b:00): 79, x"), time.Date(2026, 11, 28, 3, 0, 0, 0, zone), 0)
	want := time.Date(2026, 11, 27, 17, 58, 17, 0, time.UTC)
	if len(log.Events) != 1 || !log.Events[0].Time.Equal(want) {
		t.Errorf("got %+v, want time %v", log.Events, want)
	}
}

func TestGarbage(t *testing.T) {
	t.Parallel()
	inputs := [][]byte{
		nil,
		{},
		[]byte("\n\n\n"),
		bytes.Repeat([]byte{0xff, 0x00, 0x1b, '['}, 1<<16),
		append(bytes.Repeat([]byte("x"), 3*maxLine), []byte("NVRM: Xid (PCI:0000:9b:00): 79, past the line bound")...),
		[]byte("[\n]\n[]\n[ .]\n[1.]\n1,2;\n9999999999999999999999,1,2;NVRM: Xid (PCI:0000:9b:00): 79, x\n"),
	}
	for i, in := range inputs {
		log, err := Parse(in, time.Time{}, 0)
		if err != nil {
			t.Errorf("input %d: %v", i, err)
		}
		for _, e := range log.Events {
			if e.Kind != snapshot.EventXid {
				t.Errorf("input %d: unexpected event %+v", i, e)
			}
		}
	}
	if log, _ := Parse(inputs[4], time.Time{}, 0); len(log.Events) != 0 {
		t.Errorf("text past maxLine must not be parsed: %+v", log.Events)
	}
}

func TestParseReaderError(t *testing.T) {
	t.Parallel()
	_, err := ParseReader(iotest.ErrReader(os.ErrClosed), time.Time{}, 0)
	if err == nil || !strings.Contains(err.Error(), "kernel log") {
		t.Errorf("err = %v", err)
	}
	// An overlong line followed by a read error.
	r := iotest.DataErrReader(bytes.NewReader(bytes.Repeat([]byte("y"), 3*maxLine)))
	if _, err := ParseReader(r, time.Time{}, 0); err != nil {
		t.Errorf("overlong final line: %v", err)
	}
	r2 := newErrAfter(bytes.Repeat([]byte("z"), 2*maxLine))
	if _, err := ParseReader(r2, time.Time{}, 0); err == nil {
		t.Errorf("read error after an overlong line not reported")
	}
}

// newErrAfter yields data then a non-EOF error.
func newErrAfter(data []byte) *errAfter { return &errAfter{data: data} }

type errAfter struct{ data []byte }

func (e *errAfter) Read(p []byte) (int, error) {
	if len(e.data) == 0 {
		return 0, os.ErrClosed
	}
	n := copy(p, e.data)
	e.data = e.data[n:]
	return n, nil
}

func TestNormalizeBusID(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"PCI:0000:9b:00":   "0000:9b:00.0",
		"0000:9B:00":       "0000:9b:00.0",
		"00000000:19:00.0": "0000:19:00.0",
		"9b:00.1":          "0000:9b:00.1",
		"0008:01:00":       "0008:01:00.0",
		"1:2:3":            "0001:02:03.0",
		"":                 "",
		"10000:00:00.0":    "10000:00:00.0", // VMD domains exceed 16 bits
		"0000:9b:00.8":     "",
		"0000:9b:20.0":     "",
		"0000:9b:00.":      "",
		"g0:00.0":          "",
		"a:b:c:d":          "",
		"zz:qq":            "",
	} {
		if got := normalizeBusID(in); got != want {
			t.Errorf("normalizeBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, in := range goldenInputs {
		f.Add(readFixture(f, in.file))
	}
	f.Add([]byte("6,1,2,-;NVRM: Xid (PCI:0000:9b:00): 79, pid=1, name=x, y"))
	f.Add([]byte("NVRM: The NVIDIA GPU 0000:18:00.0\n  fallen off the bus and is not responding"))
	collected := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, data []byte) {
		log, err := Parse(data, collected, time.Hour)
		if err != nil {
			t.Fatalf("Parse error on in-memory input: %v", err)
		}
		if log.Lines < 0 || log.Lines > len(data)+1 {
			t.Fatalf("Lines = %d for %d bytes", log.Lines, len(data))
		}
		for _, e := range log.Events {
			if len(e.Raw) > maxLine {
				t.Fatalf("Raw longer than maxLine")
			}
			if e.PCIBusID != "" && normalizeBusID(e.PCIBusID) != e.PCIBusID {
				t.Fatalf("bus id %q not normalized", e.PCIBusID)
			}
			if e.Code < 0 {
				t.Fatalf("negative code %d", e.Code)
			}
		}
		log2, err := ParseReader(bytes.NewReader(data), collected, time.Hour)
		if err != nil {
			t.Fatalf("ParseReader: %v", err)
		}
		if len(log2.Events) != len(log.Events) || log2.Lines != log.Lines {
			t.Fatalf("ParseReader %d events/%d lines, Parse %d/%d", len(log2.Events), log2.Lines, len(log.Events), log.Lines)
		}
	})
}

// benchLog builds a ~10 MB dmesg: ordinary kernel chatter with a few
// driver lines mixed in.
func benchLog(b *testing.B) []byte {
	b.Helper()
	fixture := readFixture(b, "synthetic__dmesg-plain.log")
	var buf bytes.Buffer
	noise := []byte("[ 1234.567890] eth0: renamed from veth1a2b3c4 link becomes ready and some more text to make a typical line\n")
	for buf.Len() < 10<<20 {
		for i := 0; i < 200; i++ {
			buf.Write(noise)
		}
		buf.Write(fixture)
	}
	return buf.Bytes()
}

func BenchmarkParse(b *testing.B) {
	data := benchLog(b)
	collected := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Parse(data, collected, 2397200*time.Second); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseReader(b *testing.B) {
	data := benchLog(b)
	collected := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := ParseReader(bytes.NewReader(data), collected, 2397200*time.Second); err != nil {
			b.Fatal(err)
		}
	}
}
