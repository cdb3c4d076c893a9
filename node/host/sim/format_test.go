package sim

// Format tests use only the standard library and the real captures in
// testdata/fixtures: the simulator must print what the real tools print,
// independently of how our parsers read it.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

var fixedNow = time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)

func testNode(t testing.TB, mutate func(*Spec)) *Node {
	t.Helper()
	s := DefaultSpec("gpu-017")
	s.Clock = ClockFunc(func() time.Time { return fixedNow })
	s.DCGMDiag = true
	if mutate != nil {
		mutate(&s)
	}
	n, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func mustCapture(t testing.TB, n *Node, src snapshot.Source) []byte {
	t.Helper()
	c := n.Capture(context.Background(), src)
	if c.State != snapshot.StateOK {
		t.Fatalf("%s: %s %s", src, c.State, c.Err)
	}
	return c.Data
}

// elementPaths lists the element paths of the first <gpu> in document order.
func elementPaths(t *testing.T, data []byte) []string {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(data))
	d.Strict = true
	d.Entity = xml.HTMLEntity
	var stack, out []string
	inGPU := false
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("xml: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			stack = append(stack, e.Name.Local)
			if e.Name.Local == "gpu" && len(stack) == 2 {
				if inGPU {
					return out
				}
				inGPU = true
			}
			if inGPU {
				out = append(out, strings.Join(stack, "/"))
			}
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		}
	}
	return out
}

func TestXMLHasTheFixtureSchema(t *testing.T) {
	t.Parallel()
	want, err := os.ReadFile("testdata/fixtures/DERIVED__h100x8_healthy__v12__drv535.161.08.xml")
	if err != nil {
		t.Fatal(err)
	}
	got := mustCapture(t, testNode(t, nil), snapshot.SrcNvidiaSMI)
	wp, gp := elementPaths(t, want), elementPaths(t, got)
	if !slices.Equal(wp, gp) {
		for i := range min(len(wp), len(gp)) {
			if wp[i] != gp[i] {
				t.Fatalf("element %d: fixture %s, sim %s", i, wp[i], gp[i])
			}
		}
		t.Fatalf("fixture has %d elements per GPU, sim %d", len(wp), len(gp))
	}
	// Same prolog: declaration and DOCTYPE naming the v12 DTD.
	wantHead := strings.SplitN(string(want), "\n", 4)[:3]
	gotHead := strings.SplitN(string(got), "\n", 4)[:3]
	if !slices.Equal(wantHead, gotHead) {
		t.Errorf("prolog %q, want %q", gotHead, wantHead)
	}
}

// smiLog decodes the parts of nvidia-smi XML the fault tests look at.
type smiLog struct {
	Attached int `xml:"attached_gpus"`
	GPUs     []struct {
		ID     string `xml:"id,attr"`
		Serial string `xml:"serial"`
		UUID   string `xml:"uuid"`
		Reset  string `xml:"gpu_reset_status>reset_required"`
		Width  string `xml:"pci>pci_gpu_link_info>link_widths>current_link_width"`
		ECC    struct {
			VolDRAM string `xml:"volatile>dram_uncorrectable"`
			AggDRAM string `xml:"aggregate>dram_uncorrectable"`
		} `xml:"ecc_errors"`
		Remap struct {
			Pending string `xml:"remapped_row_pending"`
			Failure string `xml:"remapped_row_failure"`
		} `xml:"remapped_rows"`
		Temp      string `xml:"temperature>gpu_temp"`
		HWThermal string `xml:"clocks_event_reasons>clocks_event_reason_hw_thermal_slowdown"`
		FabState  string `xml:"fabric>state"`
		UsedMiB   string `xml:"fb_memory_usage>used"`
		Processes []struct {
			PID  int    `xml:"pid"`
			Used string `xml:"used_memory"`
		} `xml:"processes>process_info"`
	} `xml:"gpu"`
}

func decodeSMI(t *testing.T, data []byte) smiLog {
	t.Helper()
	var l smiLog
	d := xml.NewDecoder(bytes.NewReader(data))
	if err := d.Decode(&l); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return l
}

func TestXMLFaultsStructural(t *testing.T) {
	t.Parallel()
	n := testNode(t, nil)
	for _, f := range []Fault{
		ECCUncorrectable{GPU: 3, Count: 2}, RowRemapPending{GPU: 2}, RowRemapFailure{GPU: 1},
		GPUMissing{GPU: 6}, ThermalSlowdown{GPU: 0}, PCIeDowntrained{GPU: 4},
		GhostProcess{GPU: 5, MiB: 1234, PID: 4242}, FabricNotReady{},
	} {
		if err := n.AddFault(f); err != nil {
			t.Fatal(err)
		}
	}
	l := decodeSMI(t, mustCapture(t, n, snapshot.SrcNvidiaSMI))
	if l.Attached != 7 || len(l.GPUs) != 7 {
		t.Fatalf("attached %d, gpus %d", l.Attached, len(l.GPUs))
	}
	byID := map[string]int{}
	for i, g := range l.GPUs {
		byID[g.ID] = i
		if g.FabState != "In Progress" {
			t.Errorf("%s fabric %q", g.ID, g.FabState)
		}
	}
	if _, ok := byID["00000000:CB:00.0"]; ok {
		t.Error("missing GPU6 still listed")
	}
	g := func(id string) int {
		i, ok := byID[id]
		if !ok {
			t.Fatalf("no GPU %s", id)
		}
		return i
	}
	checks := []struct{ got, want string }{
		{l.GPUs[g("00000000:5D:00.0")].ECC.VolDRAM, "2"},
		{l.GPUs[g("00000000:5D:00.0")].ECC.AggDRAM, "2"},
		{l.GPUs[g("00000000:19:00.0")].ECC.VolDRAM, "0"},
		{l.GPUs[g("00000000:4C:00.0")].Remap.Pending, "Yes"},
		{l.GPUs[g("00000000:4C:00.0")].Reset, "Yes"},
		{l.GPUs[g("00000000:3B:00.0")].Remap.Failure, "Yes"},
		{l.GPUs[g("00000000:19:00.0")].Temp, "92 C"},
		{l.GPUs[g("00000000:19:00.0")].HWThermal, "Active"},
		{l.GPUs[g("00000000:3B:00.0")].HWThermal, "Not Active"},
		{l.GPUs[g("00000000:9B:00.0")].Width, "8x"},
		{l.GPUs[g("00000000:BB:00.0")].UsedMiB, "1234 MiB"},
	}
	for i, c := range checks {
		if c.got != c.want {
			t.Errorf("check %d: got %q, want %q", i, c.got, c.want)
		}
	}
	if p := l.GPUs[g("00000000:BB:00.0")].Processes; len(p) != 1 || p[0].PID != 4242 || p[0].Used != "1234 MiB" {
		t.Errorf("processes %+v", p)
	}
	// The missing GPU is still on the PCI bus.
	if b, err := fs.ReadFile(n.FS(), "sys/bus/pci/devices/0000:cb:00.0/class"); err != nil || string(b) != "0x030200\n" {
		t.Errorf("missing GPU's class file: %q %v", b, err)
	}
}

func TestAllReduceLayoutMatchesNCCLTests(t *testing.T) {
	t.Parallel()
	fix, err := os.ReadFile("testdata/fixtures/nccl-tests-v2.19.4__a100x8_single-node_dkh__provenance-unidentified.txt")
	if err != nil {
		t.Fatal(err)
	}
	got := string(mustCapture(t, testNode(t, nil), snapshot.SrcAllReduce))
	header := func(s string) []string {
		var out []string
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "#   ") || strings.HasPrefix(l, "#       size") || strings.HasPrefix(l, "#        (B)") {
				out = append(out, l)
			}
		}
		return out
	}
	if fh, gh := header(string(fix)), header(got); !slices.Equal(fh, gh) || len(gh) != 3 {
		t.Errorf("table header\n%q\nwant\n%q", gh, fh)
	}
	// Every data row has the fixture's column layout: fields end at the
	// same offsets.
	row := regexp.MustCompile(`^ {0,11}\d{1,12} {2,}\d+ +float +sum +-1( +[0-9.]+ +[0-9.]+ +[0-9.]+ +\d+){2}$`)
	var rows int
	var fixEnds []int
	for _, l := range strings.Split(string(fix), "\n") {
		if row.MatchString(l) {
			fixEnds = fieldEnds(l)
			break
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if !strings.HasPrefix(l, "#") && strings.Contains(l, "float") {
			rows++
			if !row.MatchString(l) {
				t.Errorf("row %q does not match the nccl-tests layout", l)
			} else if e := fieldEnds(l); !slices.Equal(e, fixEnds) {
				t.Errorf("row %q: field ends %v, fixture %v", l, e, fixEnds)
			}
		}
	}
	if rows != 31 {
		t.Errorf("%d rows, want 31 (8 B to 8 GiB)", rows)
	}
	for _, want := range []string{"# nccl-tests version 2.19.4 nccl-headers=22105 nccl-library=22105\n",
		"# Out of bounds values : 0 OK\n", "#\n# Collective test concluded: all_reduce_perf\n#\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if !regexp.MustCompile(`(?m)^# Avg bus bandwidth    : \d+\.\d+ $`).MatchString(got) {
		t.Error("no Avg bus bandwidth footer in the nccl-tests shape")
	}
}

func fieldEnds(l string) []int {
	var ends []int
	for i := 0; i < len(l); i++ {
		if l[i] != ' ' && (i+1 == len(l) || l[i+1] == ' ') {
			ends = append(ends, i)
		}
	}
	return ends
}

func TestFloatStrLikeNCCLTests(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		v     float64
		width int
		want  string
	}{
		{193.77, 7, " 193.77"}, {1168.38, 7, "1168.38"}, {15787.5, 7, "15787.5"}, {144716, 7, " 144716"},
		{0.004, 6, "  0.00"}, {479.02, 6, "479.02"}, {1234.5, 6, "1234.5"},
	} {
		if got := floatStr(c.v, c.width); got != c.want {
			t.Errorf("floatStr(%v, %d) = %q, want %q", c.v, c.width, got, c.want)
		}
	}
}

func TestIBPortTreeMatchesRealTree(t *testing.T) {
	t.Parallel()
	want, err := os.ReadFile("testdata/fixtures/gpud__sys-class-infiniband-h100.0__mlx5_0__port1-files.txt")
	if err != nil {
		t.Fatal(err)
	}
	n := testNode(t, nil)
	if err := n.AddFault(IBPortDown{HCA: "mlx5_3"}); err != nil {
		t.Fatal(err)
	}
	fsys := n.FS()
	root := "sys/class/infiniband/mlx5_0/ports/1"
	var got []string
	err = fs.WalkDir(fsys, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			got = append(got, strings.TrimPrefix(p, root+"/"))
			b, err := fs.ReadFile(fsys, p)
			if err != nil || len(b) == 0 || b[len(b)-1] != '\n' {
				t.Errorf("%s: %q %v (sysfs values end with a newline)", p, b, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if w := strings.Fields(string(want)); !slices.Equal(got, w) {
		t.Errorf("port files\n%v\nwant\n%v", got, w)
	}
	for file, want := range map[string]string{
		"mlx5_0/ports/1/state": "4: ACTIVE\n", "mlx5_0/ports/1/phys_state": "5: LinkUp\n",
		"mlx5_0/ports/1/rate": "400 Gb/sec (4X NDR)\n", "mlx5_0/ports/1/link_layer": "InfiniBand\n",
		"mlx5_0/hca_type": "MT4129\n", "mlx5_0/fw_ver": "28.39.1002\n",
		"mlx5_3/ports/1/state": "1: DOWN\n", "mlx5_3/ports/1/phys_state": "3: Disabled\n",
	} {
		b, err := fs.ReadFile(fsys, "sys/class/infiniband/"+file)
		if err != nil || string(b) != want {
			t.Errorf("%s = %q (%v), want %q", file, b, err, want)
		}
	}
}

func TestSysfsIsMadeOfSymlinks(t *testing.T) {
	t.Parallel()
	fsys := testNode(t, nil).FS()
	rl := fsys.(fs.ReadLinkFS)
	entries, err := fs.ReadDir(fsys, "sys/class/infiniband")
	if err != nil || len(entries) != 8 {
		t.Fatalf("%d entries, %v", len(entries), err)
	}
	for _, e := range entries {
		if e.Type() != fs.ModeSymlink {
			t.Errorf("%s: type %v, want a symlink as on real sysfs", e.Name(), e.Type())
		}
		st, err := fs.Stat(fsys, "sys/class/infiniband/"+e.Name())
		if err != nil || !st.IsDir() {
			t.Errorf("%s does not resolve to a directory: %v", e.Name(), err)
		}
	}
	target, err := rl.ReadLink("sys/bus/pci/devices/0000:19:00.0/driver")
	if err != nil || path.Base(target) != "nvidia" {
		t.Errorf("driver link %q %v", target, err)
	}
	if fi, err := rl.Lstat("sys/bus/pci/devices/0000:19:00.0"); err != nil || fi.Mode().Type() != fs.ModeSymlink {
		t.Errorf("lstat %v %v", fi, err)
	}
	b, err := fs.ReadFile(fsys, "sys/class/infiniband/mlx5_2/device/vendor")
	if err != nil || string(b) != "0x15b3\n" {
		t.Errorf("mlx5_2/device/vendor = %q %v", b, err)
	}
	for _, bad := range []string{"/sys", "sys/../etc", "sys/class/infiniband/mlx5_9", "proc/uptime/x"} {
		if _, err := fsys.Open(bad); err == nil {
			t.Errorf("open %q succeeded", bad)
		}
	}
	// The fs.FS contract, including ReadLinkFS; fstest walks without
	// following links, so it names files by their real paths.
	if err := fstest.TestFS(fsys, "proc/uptime", "proc/modules",
		"sys/devices/pci0000:17/0000:17:01.0/0000:19:00.0/vendor",
		"sys/devices/pci0000:16/0000:16:01.0/0000:18:00.0/infiniband/mlx5_0/ports/1/counters/symbol_error"); err != nil {
		t.Error(err)
	}
}

func TestNVLinkTextShape(t *testing.T) {
	t.Parallel()
	fix, err := os.ReadFile("testdata/fixtures/gpud__nvidia-smi-nvlink-status__a100.txt")
	if err != nil {
		t.Fatal(err)
	}
	statusLine := regexp.MustCompile(`^GPU \d+: .+ \(UUID: GPU-[0-9a-f-]{36}\)$|^ {9}Link \d+: (\d+(\.\d+)? GB/s|<inactive>)$`)
	errLine := regexp.MustCompile(`^ {9}Link \d+: (Replay|Recovery|CRC) Errors: \d+$`)
	sc := bufio.NewScanner(bytes.NewReader(fix))
	for sc.Scan() {
		if !statusLine.MatchString(sc.Text()) {
			t.Fatalf("the shape regexp rejects the real capture's %q", sc.Text())
		}
	}
	n := testNode(t, nil)
	if err := n.AddFault(NVLinkDegraded{GPU: 2, Links: 2}); err != nil {
		t.Fatal(err)
	}
	got := mustCapture(t, n, snapshot.SrcNVLink)
	sc = bufio.NewScanner(bytes.NewReader(got))
	var headers, inactive int
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "GPU "):
			headers++
			fallthrough
		case statusLine.MatchString(l):
			inactive += strings.Count(l, "<inactive>")
		case errLine.MatchString(l):
		default:
			t.Errorf("unexpected line %q", l)
		}
	}
	if headers != 16 || inactive != 2 {
		t.Errorf("%d GPU headers (want 8 status + 8 error), %d inactive links", headers, inactive)
	}
}

func TestDmesgStamps(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		format KernelLogFormat
		re     string
	}{
		{LogSinceBoot, `^\[ *\d+\.\d{6}\] \S`},
		{LogCtime, `^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ 123]\d \d\d:\d\d:\d\d \d{4}\] \S`},
		{LogISO, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}[+-]\d\d:\d\d \S`},
	} {
		n := testNode(t, func(s *Spec) { s.KernelLogFormat = c.format })
		if err := n.AddFault(Xid{GPU: 4, Code: 79}); err != nil {
			t.Fatal(err)
		}
		out := string(mustCapture(t, n, snapshot.SrcKernelLog))
		re := regexp.MustCompile(c.re)
		for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
			if !re.MatchString(l) {
				t.Errorf("format %d: line %q", c.format, l)
			}
		}
		if c.format == LogSinceBoot {
			us := fixedNow.Sub(n.Boot()).Microseconds()
			if want := fmt.Sprintf("[%5d.%06d] NVRM: Xid", us/1e6, us%1e6); !strings.Contains(out, want) {
				t.Errorf("no %q: the Xid must carry the uptime at injection", want)
			}
		}
		if !strings.Contains(out, "NVRM: Xid (PCI:0000:9b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n") {
			t.Errorf("format %d: no Xid 79 line:\n%s", c.format, out)
		}
	}
}

func TestDCGMDiagIsJSON(t *testing.T) {
	t.Parallel()
	n := testNode(t, func(s *Spec) { s.DCGMLevel = 3 })
	if err := n.AddFault(RowRemapFailure{GPU: 1}); err != nil {
		t.Fatal(err)
	}
	c := n.Capture(context.Background(), snapshot.SrcDCGMDiag)
	if c.State != snapshot.StateOK || c.ExitCode != 226 {
		t.Fatalf("capture %s exit %d", c.State, c.ExitCode)
	}
	var doc map[string]struct {
		Categories []struct {
			Category string `json:"category"`
			Tests    []*struct {
				Name    string `json:"name"`
				Results []struct {
					IDs    string `json:"gpu_ids"`
					Status string `json:"status"`
				} `json:"results"`
			} `json:"tests"`
		} `json:"test_categories"`
		Version string `json:"version"`
	}
	if err := json.Unmarshal(c.Data, &doc); err != nil {
		t.Fatal(err)
	}
	body := doc["DCGM GPU Diagnostic"]
	var cats []string
	fails := 0
	for _, cat := range body.Categories {
		cats = append(cats, cat.Category)
		for _, tr := range cat.Tests {
			if tr == nil { // DCGM 3.x leaves nulls between deployment tests
				continue
			}
			for _, r := range tr.Results {
				if r.Status == "FAIL" {
					fails++
				}
			}
		}
	}
	if body.Version != "3.3.5" || !slices.Equal(cats, []string{"Deployment", "Integration", "Hardware", "Stress"}) || fails != 1 {
		t.Errorf("version %s categories %v fails %d", body.Version, cats, fails)
	}
	if absent := testNode(t, func(s *Spec) { s.DCGMDiag = false }).Capture(context.Background(), snapshot.SrcDCGMDiag); absent.State != snapshot.StateAbsent {
		t.Errorf("dcgm without DCGMDiag: %s", absent.State)
	}
}
