package ibsysfs

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// The fixture tree: a real H100 node's /sys/class/infiniband (see testdata/SOURCES.md).
var fixtureFS = os.DirFS("testdata")

func TestReadFixtureGolden(t *testing.T) {
	t.Parallel()
	hcas, err := Read(fixtureFS)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	got, err := json.MarshalIndent(hcas, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	golden := filepath.Join("testdata", "h100.golden.json")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with UPDATE_GOLDEN=1 to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("Read(fixture) differs from %s; rerun with UPDATE_GOLDEN=1 if the change is intended\n%s", golden, got)
	}
}

func TestReadFixtureFacts(t *testing.T) {
	t.Parallel()
	hcas, err := Read(fixtureFS)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	var names []string
	for _, h := range hcas {
		names = append(names, h.Name)
		if len(h.Errors) != 0 {
			t.Errorf("%s: unexpected errors %v", h.Name, h.Errors)
		}
		if len(h.Ports) != 1 || h.Ports[0].Port != 1 {
			t.Fatalf("%s: ports %+v", h.Name, h.Ports)
		}
	}
	wantNames := []string{"mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_bond_0"}
	if !reflect.DeepEqual(names, wantNames) {
		t.Fatalf("names = %v, want %v", names, wantNames)
	}
	h0 := hcas[0]
	p := h0.Ports[0]
	if h0.Model != "MT4129" || h0.FWVersion != "28.41.1000" || h0.BoardID != "MT_0000000838" {
		t.Errorf("mlx5_0 identity = %q %q %q", h0.Model, h0.FWVersion, h0.BoardID)
	}
	if p.State != "ACTIVE" || p.PhysState != "LinkUp" || p.RateGbps != 400 || p.RateText != "400 Gb/sec (4X NDR)" || p.LinkLayer != "InfiniBand" {
		t.Errorf("mlx5_0/1 = %+v", p)
	}
	// Data counters stay raw 4-byte words.
	if p.Counters["port_rcv_data"] != 230539874932483 || p.Counters["excessive_buffer_overrun_errors"] != 15 {
		t.Errorf("mlx5_0/1 counters = %v", p.Counters)
	}
	if p.HWCounters["rx_write_requests"] != 3809045607 || len(p.HWCounters) != 26 || len(p.Counters) != 21 {
		t.Errorf("mlx5_0/1 hw counters (%d) = %v", len(p.HWCounters), p.HWCounters)
	}
	if got := hcas[1].Ports[0].Counters["link_downed"]; got != 255 {
		t.Errorf("mlx5_1 link_downed = %d, want 255", got)
	}
	bond := hcas[8].Ports[0]
	if hcas[8].Model != "MT41692" || bond.LinkLayer != "Ethernet" || bond.RateGbps != 200 {
		t.Errorf("mlx5_bond_0 = %+v", hcas[8])
	}
}

func TestReadNoInfiniBand(t *testing.T) {
	t.Parallel()
	for name, fsys := range map[string]fs.FS{
		"empty":    fstest.MapFS{},
		"only sys": fstest.MapFS{"sys/class/net/eth0/mtu": {Data: []byte("1500\n")}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			hcas, err := Read(fsys)
			if !errors.Is(err, ErrNoInfiniBand) || hcas != nil {
				t.Fatalf("Read = %v, %v; want nil, ErrNoInfiniBand", hcas, err)
			}
			if err.Error() != "no /sys/class/infiniband" {
				t.Errorf("message %q", err)
			}
		})
	}
}

func TestReadClassDirProblems(t *testing.T) {
	t.Parallel()
	t.Run("not a directory", func(t *testing.T) {
		t.Parallel()
		_, err := Read(fstest.MapFS{ClassDir: {Data: []byte("x")}})
		if err == nil || errors.Is(err, ErrNoInfiniBand) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("unlistable", func(t *testing.T) {
		t.Parallel()
		fsys := faultFS{FS: fstest.MapFS{ClassDir + "/mlx5_0/hca_type": {Data: []byte("MT4129")}},
			openErr: map[string]error{ClassDir: syscall.EACCES}}
		_, err := Read(fsys)
		if !errors.Is(err, syscall.EACCES) {
			t.Fatalf("err = %v, want EACCES", err)
		}
	})
	t.Run("empty", func(t *testing.T) {
		t.Parallel()
		hcas, err := Read(fstest.MapFS{ClassDir: {Mode: fs.ModeDir | 0o755}})
		if err != nil || len(hcas) != 0 {
			t.Fatalf("Read = %v, %v", hcas, err)
		}
	})
}

// buildLiveTree lays out a tree the way the kernel does: device directories
// under sys/devices, class entries as relative symlinks, values ending in a
// newline.
func buildLiveTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write := func(rel, data string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(name, target string) {
		t.Helper()
		p := filepath.Join(root, "sys/class/infiniband", name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	dev := func(pci, name string) string {
		return "sys/devices/pci0000:00/" + pci + "/infiniband/" + name
	}

	d0 := dev("0000:19:00.0", "mlx5_0")
	write(d0+"/hca_type", "MT4129\n")
	write(d0+"/fw_ver", "28.39.1002\n")
	write(d0+"/board_id", "MT_0000000838\n")
	write(d0+"/ports/1/state", "4: ACTIVE\n")
	write(d0+"/ports/1/phys_state", "5: LinkUp\n")
	write(d0+"/ports/1/rate", "400 Gb/sec (4X NDR)\n")
	write(d0+"/ports/1/link_layer", "InfiniBand\n")
	write(d0+"/ports/1/counters/symbol_error", "3\n")
	write(d0+"/ports/1/counters/port_rcv_data", "1000\n")
	write(d0+"/ports/1/counters/link_downed", "garbage\n")
	write(d0+"/ports/1/counters/port_xmit_wait", "N/A (no PMA)\n")
	write(d0+"/ports/1/counters/port_rcv_errors", "12\n")
	write(d0+"/ports/1/hw_counters/out_of_sequence", "7\n")
	write(d0+"/ports/1/hw_counters/rx_write_requests", "9\n")
	write(d0+"/ports/1/hw_counters/req_cqe_error", "1\n")
	write(d0+"/ports/2/state", "1: DOWN\n")
	write(d0+"/ports/2/phys_state", "3: Disabled\n")
	write(d0+"/ports/2/rate", "2.5 Gb/sec (1X SDR)\n")
	write(d0+"/ports/2/link_layer", "InfiniBand\n")
	write(d0+"/ports/notaport/state", "4: ACTIVE\n")
	link("mlx5_0", "../../devices/pci0000:00/0000:19:00.0/infiniband/mlx5_0")

	// mlx5_1 has lost its ports directory.
	d1 := dev("0000:2a:00.0", "mlx5_1")
	write(d1+"/hca_type", "MT4129\n")
	link("mlx5_1", "../../devices/pci0000:00/0000:2a:00.0/infiniband/mlx5_1")

	// mlx5_10 sorts after mlx5_2 by number; no board_id (optional).
	d10 := dev("0000:3b:00.0", "mlx5_10")
	write(d10+"/hca_type", "MT4129\n")
	write(d10+"/fw_ver", "28.39.1002\n")
	write(d10+"/ports/1/state", "4: ACTIVE\n")
	write(d10+"/ports/1/phys_state", "5: LinkUp\n")
	write(d10+"/ports/1/rate", "200 Gb/sec (2X NDR)\n")
	write(d10+"/ports/1/link_layer", "InfiniBand\n")
	link("mlx5_10", "../../devices/pci0000:00/0000:3b:00.0/infiniband/mlx5_10")

	// mlx5_2 points nowhere.
	link("mlx5_2", "../../devices/pci0000:00/0000:4c:00.0/infiniband/mlx5_2")
	// A stray file is not an adapter.
	write("sys/class/infiniband/README", "not a device\n")
	return root
}

func TestReadLiveShapedTree(t *testing.T) {
	t.Parallel()
	root := buildLiveTree(t)
	d0 := ClassDir + "/mlx5_0/ports/1/"
	fsys := faultFS{
		FS: os.DirFS(root),
		readErr: map[string]error{
			d0 + "hw_counters/rx_write_requests": syscall.EINVAL, // ConnectX-7 quirk: skipped silently
			d0 + "hw_counters/req_cqe_error":     syscall.EIO,
		},
		openErr: map[string]error{
			d0 + "counters/port_rcv_errors": syscall.EACCES,
		},
	}
	hcas, err := Read(fsys)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	want := []snapshot.HCA{
		{
			Name: "mlx5_0", Model: "MT4129", FWVersion: "28.39.1002", BoardID: "MT_0000000838",
			Ports: []snapshot.IBPort{
				{
					Port: 1, State: "ACTIVE", PhysState: "LinkUp", RateGbps: 400, RateText: "400 Gb/sec (4X NDR)",
					LinkLayer:  "InfiniBand",
					Counters:   map[string]uint64{"symbol_error": 3, "port_rcv_data": 1000},
					HWCounters: map[string]uint64{"out_of_sequence": 7},
				},
				{Port: 2, State: "DOWN", PhysState: "Disabled", RateGbps: 2.5, RateText: "2.5 Gb/sec (1X SDR)", LinkLayer: "InfiniBand"},
			},
			Errors: []string{
				`mlx5_0/ports/1/counters/link_downed: parse "garbage": invalid syntax`,
				`mlx5_0/ports/1/counters/port_rcv_errors: open: permission denied`,
				`mlx5_0/ports/1/hw_counters/req_cqe_error: read: input/output error`,
				`mlx5_0/ports/notaport: not a port number`,
			},
		},
		{Name: "mlx5_1", Model: "MT4129", Errors: []string{"mlx5_1/ports: open: no such file or directory"}},
		{Name: "mlx5_2", Errors: []string{"mlx5_2: open: no such file or directory"}},
		{
			Name: "mlx5_10", Model: "MT4129", FWVersion: "28.39.1002",
			Ports: []snapshot.IBPort{{Port: 1, State: "ACTIVE", PhysState: "LinkUp", RateGbps: 200, RateText: "200 Gb/sec (2X NDR)", LinkLayer: "InfiniBand"}},
		},
	}
	sortErrors(hcas)
	if !reflect.DeepEqual(hcas, want) {
		g, _ := json.MarshalIndent(hcas, "", " ")
		w, _ := json.MarshalIndent(want, "", " ")
		t.Fatalf("Read:\n%s\nwant:\n%s", g, w)
	}
}

// sortErrors makes the comparison independent of directory listing order
// inside one port (the walk itself is deterministic per fs).
func sortErrors(hcas []snapshot.HCA) {
	for i := range hcas {
		e := hcas[i].Errors
		for a := 1; a < len(e); a++ {
			for b := a; b > 0 && e[b] < e[b-1]; b-- {
				e[b], e[b-1] = e[b-1], e[b]
			}
		}
	}
}

func TestReadMissingPortFiles(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		ClassDir + "/mlx5_0/hca_type":            {Data: []byte("MT4129")},
		ClassDir + "/mlx5_0/ports/1/state":       {Data: []byte("4: ACTIVE")},
		ClassDir + "/mlx5_0/ports/1/rate":        {Data: []byte("fast")},
		ClassDir + "/mlx5_0/ports/1/counters":    {Mode: fs.ModeDir | 0o755},
		ClassDir + "/mlx5_0/ports/1/hw_counters": {Data: []byte("not a dir")},
		ClassDir + "/mlx5_0/ports/3":             {Data: []byte("a file")},
	}
	hcas, err := Read(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if len(hcas) != 1 || len(hcas[0].Ports) != 1 {
		t.Fatalf("hcas = %+v", hcas)
	}
	p := hcas[0].Ports[0]
	if p.State != "ACTIVE" || p.PhysState != "" || p.RateGbps != 0 || p.Counters != nil || p.HWCounters != nil {
		t.Errorf("port = %+v", p)
	}
	got := strings.Join(hcas[0].Errors, "\n")
	for _, want := range []string{
		"mlx5_0/ports/1/phys_state: open: file does not exist",
		`mlx5_0/ports/1/rate: parse rate "fast"`,
		"mlx5_0/ports/1/link_layer: open: file does not exist",
		"mlx5_0/ports/1/hw_counters: ",
		"mlx5_0/ports/3: not a directory",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("errors lack %q:\n%s", want, got)
		}
	}
}

func TestReadOversizedValue(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		ClassDir + "/mlx5_0/ports/1/counters/symbol_error": {Data: bytes.Repeat([]byte("1"), maxValueSize+1)},
	}
	hcas, err := Read(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(hcas[0].Errors, "\n"); !strings.Contains(got, "counters/symbol_error: larger than 4096 bytes") {
		t.Errorf("errors = %s", got)
	}
}

func TestReadMapFSSymlinks(t *testing.T) {
	t.Parallel()
	// fstest.MapFS follows symlinks since Go 1.25: the same shape as live sysfs.
	dev := "sys/devices/pci0000:00/0000:19:00.0/infiniband/mlx5_0"
	fsys := fstest.MapFS{
		dev + "/hca_type":             {Data: []byte("MT4129\n")},
		dev + "/ports/1/state":        {Data: []byte("4: ACTIVE\n")},
		dev + "/ports/1/phys_state":   {Data: []byte("5: LinkUp\n")},
		dev + "/ports/1/rate":         {Data: []byte("400 Gb/sec (4X NDR)\n")},
		dev + "/ports/1/link_layer":   {Data: []byte("InfiniBand\n")},
		ClassDir + "/mlx5_0":          {Mode: fs.ModeSymlink, Data: []byte("../../devices/pci0000:00/0000:19:00.0/infiniband/mlx5_0")},
		"sys/class/infiniband_verbs/": {Mode: fs.ModeDir},
	}
	hcas, err := Read(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if len(hcas) != 1 || len(hcas[0].Ports) != 1 || hcas[0].Ports[0].State != "ACTIVE" || len(hcas[0].Errors) != 0 {
		t.Fatalf("hcas = %+v", hcas)
	}
}

func TestNaturalLess(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a, b string
		want bool
	}{
		{"mlx5_2", "mlx5_10", true},
		{"mlx5_10", "mlx5_2", false},
		{"mlx5_9", "mlx5_bond_0", true},
		{"mlx5_1", "mlx5_1", false},
		{"mlx5_1", "mlx5_1a", true},
		{"mlx5_01", "mlx5_1", true},
		{"mlx5_1", "mlx5_01", false},
		{"ibp1s0", "mlx5_0", true},
		{"", "a", true},
	}
	for _, tc := range tests {
		if got := naturalLess(tc.a, tc.b); got != tc.want {
			t.Errorf("naturalLess(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func BenchmarkRead(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		hcas, err := Read(fixtureFS)
		if err != nil || len(hcas) != 9 {
			b.Fatalf("Read = %d, %v", len(hcas), err)
		}
	}
}

// faultFS injects errors into an fs.FS: openErr fails Open, readErr fails
// Read on the opened file, both as *fs.PathError like the os package.
type faultFS struct {
	fs.FS
	openErr map[string]error
	readErr map[string]error
}

func (f faultFS) Open(name string) (fs.File, error) {
	if err, ok := f.openErr[name]; ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	file, err := f.FS.Open(name)
	if err != nil {
		return nil, err
	}
	if err, ok := f.readErr[name]; ok {
		return failingFile{File: file, err: &fs.PathError{Op: "read", Path: name, Err: err}}, nil
	}
	return file, nil
}

type failingFile struct {
	fs.File
	err error
}

func (f failingFile) Read([]byte) (int, error) { return 0, f.err }
