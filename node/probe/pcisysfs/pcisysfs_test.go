package pcisysfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

// h100Tree is an 8×H100 SXM node's NVIDIA and Mellanox functions with the
// values sysfs prints, plus an Intel NIC that Read must leave out. The GPU
// and NVSwitch ids are the real ones (H100 SXM5 0x2330, NVSwitch 0x22a3);
// the layout is the DGX H100 one.
func h100Tree() fstest.MapFS {
	m := fstest.MapFS{}
	dev := func(addr string, files map[string]string) {
		for k, v := range files {
			m[DevicesDir+"/"+addr+"/"+k] = &fstest.MapFile{Data: []byte(v)}
		}
	}
	gpus := []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"}
	for _, a := range gpus {
		dev(a, map[string]string{
			"vendor": "0x10de\n", "device": "0x2330\n", "class": "0x030200\n",
			"current_link_width": "16\n", "max_link_width": "16\n",
			"current_link_speed": "32.0 GT/s PCIe\n", "max_link_speed": "32.0 GT/s PCIe\n",
		})
		m[DevicesDir+"/"+a+"/driver"] = &fstest.MapFile{Mode: fs.ModeSymlink, Data: []byte("../../../bus/pci/drivers/nvidia")}
	}
	// NVSwitch: bridge-class function, bound to nvidia as well.
	dev("0000:05:00.0", map[string]string{
		"vendor": "0x10de\n", "device": "0x22a3\n", "class": "0x068000\n",
		"current_link_width": "2\n", "max_link_width": "2\n",
		"current_link_speed": "16.0 GT/s PCIe\n", "max_link_speed": "16.0 GT/s PCIe\n",
	})
	m[DevicesDir+"/0000:05:00.0/driver"] = &fstest.MapFile{Mode: fs.ModeSymlink, Data: []byte("../../../bus/pci/drivers/nvidia")}
	// ConnectX-7 (Infiniband controller 0x0207): a bundle's plain driver file.
	dev("0000:1a:00.0", map[string]string{
		"vendor": "0x15b3\n", "device": "0x1021\n", "class": "0x020700\n",
		"current_link_width": "16\n", "max_link_width": "16\n",
		"current_link_speed": "32.0 GT/s PCIe\n", "max_link_speed": "32.0 GT/s PCIe\n",
		"driver": "mlx5_core\n",
	})
	// Intel NIC: not ours.
	dev("0000:00:1f.6", map[string]string{"vendor": "0x8086\n", "device": "0x15b9\n", "class": "0x020000\n"})
	return m
}

func TestReadH100(t *testing.T) {
	t.Parallel()
	devs, err := Read(h100Tree())
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	if len(devs) != 10 {
		t.Fatalf("got %d devices, want 10 (8 GPUs, NVSwitch, HCA): %+v", len(devs), devs)
	}
	gpus := 0
	for i, d := range devs {
		if i > 0 && devs[i-1].Address >= d.Address {
			t.Errorf("not sorted: %s before %s", devs[i-1].Address, d.Address)
		}
		if d.IsNVIDIAGPU() {
			gpus++
			want := snapshot.PCIDevice{Address: d.Address, Vendor: 0x10de, Device: 0x2330, Class: 0x030200, Driver: "nvidia",
				CurrentLinkWidth: 16, MaxLinkWidth: 16, CurrentLinkSpeed: "32.0 GT/s PCIe", MaxLinkSpeed: "32.0 GT/s PCIe"}
			if d != want {
				t.Errorf("GPU %+v, want %+v", d, want)
			}
		}
	}
	if gpus != 8 {
		t.Errorf("%d GPUs, want 8", gpus)
	}
	sw := devs[0]
	if sw.Address != "0000:05:00.0" || sw.Device != 0x22a3 || sw.Class != 0x068000 || sw.IsNVIDIAGPU() || sw.Driver != "nvidia" {
		t.Errorf("NVSwitch = %+v", sw)
	}
	hca := devs[2]
	if hca.Vendor != snapshot.VendorMellanox || hca.Device != 0x1021 || hca.Driver != "mlx5_core" {
		t.Errorf("HCA = %+v", hca)
	}
}

func TestReadNoPCI(t *testing.T) {
	t.Parallel()
	devs, err := Read(fstest.MapFS{"sys/class/net/eth0/mtu": {Data: []byte("1500")}})
	if !errors.Is(err, ErrNoPCI) || devs != nil || err.Error() != "no /sys/bus/pci/devices" {
		t.Fatalf("Read = %v, %v", devs, err)
	}
	if _, err := Read(fstest.MapFS{DevicesDir: {Data: []byte("file")}}); err == nil || errors.Is(err, ErrNoPCI) {
		t.Fatalf("not a directory: err = %v", err)
	}
	devs, err = Read(fstest.MapFS{DevicesDir: {Mode: fs.ModeDir | 0o755}})
	if err != nil || devs == nil || len(devs) != 0 {
		t.Fatalf("empty bus: %v, %v", devs, err)
	}
}

func TestReadPartial(t *testing.T) {
	t.Parallel()
	m := h100Tree()
	g := DevicesDir + "/0000:18:00.0/"
	m[g+"current_link_width"] = &fstest.MapFile{Data: []byte("x16\n")}
	m[g+"class"] = &fstest.MapFile{Data: []byte("0x03020000\n")}
	m[g+"max_link_speed"] = &fstest.MapFile{Data: []byte("\x00\x01\n")}
	delete(m, g+"current_link_speed") // missing link file: unknown, no error
	delete(m, DevicesDir+"/0000:2a:00.0/driver")
	delete(m, DevicesDir+"/0000:3a:00.0/driver")
	m[DevicesDir+"/0000:3a:00.0/driver/module"] = &fstest.MapFile{Data: []byte("copied dir")}
	m[DevicesDir+"/0000:5d:00.0/vendor"] = &fstest.MapFile{Data: []byte("nvidia\n")}

	devs, err := Read(m)
	if err == nil {
		t.Fatal("want a joined error naming the bad files")
	}
	if len(devs) != 9 {
		t.Fatalf("got %d devices, want 9 (one vendor unreadable)", len(devs))
	}
	var fe *FileError
	if !errors.As(err, &fe) {
		t.Fatalf("error %v holds no *FileError", err)
	}
	msg := err.Error()
	for _, want := range []string{
		`0000:18:00.0/current_link_width: parse "x16"`,
		`0000:18:00.0/class: parse "0x03020000"`,
		`0000:18:00.0/max_link_speed: parse`,
		`0000:5d:00.0/vendor: parse "nvidia"`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Count(msg, "\n") != 3 {
		t.Errorf("want exactly 4 file errors:\n%s", msg)
	}
	byAddr := map[string]snapshot.PCIDevice{}
	for _, d := range devs {
		byAddr[d.Address] = d
	}
	d := byAddr["0000:18:00.0"]
	if d.CurrentLinkWidth != 0 || d.Class != 0 || d.CurrentLinkSpeed != "" || d.MaxLinkSpeed != "" || d.MaxLinkWidth != 16 || d.Device != 0x2330 {
		t.Errorf("partial device = %+v", d)
	}
	if byAddr["0000:2a:00.0"].Driver != "" || byAddr["0000:3a:00.0"].Driver != "" {
		t.Errorf("absent or copied driver must read as unknown: %+v %+v", byAddr["0000:2a:00.0"], byAddr["0000:3a:00.0"])
	}
}

// A tree shaped like live sysfs: device entries and driver are symlinks.
func TestReadLiveShapedTree(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	mk := func(rel, data string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ln := func(target, rel string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	devDir := "sys/devices/pci0000:00/0000:00:01.0/0000:19:00.0"
	mk(devDir+"/vendor", "0x10de\n")
	mk(devDir+"/device", "0x2330\n")
	mk(devDir+"/class", "0x030200\n")
	mk(devDir+"/current_link_width", "8\n")
	mk(devDir+"/max_link_width", "16\n")
	mk("sys/bus/pci/drivers/nvidia/bind", "")
	ln("../../../bus/pci/drivers/nvidia", devDir+"/driver")
	ln("../../../devices/pci0000:00/0000:00:01.0/0000:19:00.0", DevicesDir+"/0000:19:00.0")
	// An unbound Mellanox function: no driver link.
	dev2 := "sys/devices/pci0000:00/0000:00:02.0/0000:1a:00.1"
	mk(dev2+"/vendor", "0x15b3\n")
	mk(dev2+"/device", "0x101e\n")
	mk(dev2+"/class", "0x020700\n")
	ln("../../../devices/pci0000:00/0000:00:02.0/0000:1a:00.1", DevicesDir+"/0000:1a:00.1")

	devs, err := Read(os.DirFS(root))
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	want := []snapshot.PCIDevice{
		{Address: "0000:19:00.0", Vendor: 0x10de, Device: 0x2330, Class: 0x030200, Driver: "nvidia", CurrentLinkWidth: 8, MaxLinkWidth: 16},
		{Address: "0000:1a:00.1", Vendor: 0x15b3, Device: 0x101e, Class: 0x020700},
	}
	if !reflect.DeepEqual(devs, want) {
		t.Fatalf("Read = %+v\nwant %+v", devs, want)
	}
}

func TestParseHex(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		bits    int
		want    uint64
		wantErr bool
	}{
		{"0x10de\n", 16, 0x10de, false},
		{"0x15B3", 16, 0x15b3, false},
		{"10de", 16, 0x10de, false},
		{"0x030200\n", 24, 0x030200, false},
		{"0xffffff", 24, 0xffffff, false},
		{"0x1000000", 24, 0, true},
		{"0x10de0", 16, 0, true},
		{"0x", 16, 0, true},
		{"", 16, 0, true},
		{"0xg0de", 16, 0, true},
		{"-0x1", 16, 0, true},
		{"0x_10", 16, 0, true},
	}
	for _, tc := range tests {
		got, err := parseHex(tc.in, tc.bits)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseHex(%q, %d) = %#x, %v; want %#x, err %v", tc.in, tc.bits, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestParseWidth(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{"16\n": 16, "0": 0, "2": 2, "32": 32} {
		if got, err := parseWidth(in); err != nil || got != want {
			t.Errorf("parseWidth(%q) = %d, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "x16", "33", "-1", "+4", "255", "1e1"} {
		if got, err := parseWidth(in); err == nil {
			t.Errorf("parseWidth(%q) = %d, want error", in, got)
		}
	}
}

func FuzzParseHex(f *testing.F) {
	for _, s := range []string{"0x10de\n", "0x15b3\n", "0x2330\n", "0x22a3\n", "0x030200\n", "0x068000\n", "0x020700\n", "0xffff", "0x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, bits := range []int{16, 24} {
			v, err := parseHex(s, bits)
			if err != nil {
				if v != 0 {
					t.Fatalf("error with value %#x", v)
				}
				continue
			}
			if v >= 1<<bits {
				t.Fatalf("parseHex(%q, %d) = %#x out of range", s, bits, v)
			}
			if again, err := parseHex(fmt.Sprintf("0x%x", v), bits); err != nil || again != v {
				t.Fatalf("round trip %#x: %#x, %v", v, again, err)
			}
		}
		if w, err := parseWidth(s); err == nil && (w < 0 || w > 32) {
			t.Fatalf("parseWidth(%q) = %d", s, w)
		}
	})
}

// FuzzReadDevice builds one function's files from fuzzed bytes: Read must
// not panic, must keep an NVIDIA function whose vendor parses, and must name
// every bad file.
func FuzzReadDevice(f *testing.F) {
	f.Add("0x10de\n", "0x2330\n", "0x030200\n", "16\n", "32.0 GT/s PCIe\n", "nvidia\n")
	f.Add("0x15b3\n", "0x1021\n", "0x020700\n", "x", "Unknown\n", "../../../bus/pci/drivers/mlx5_core")
	f.Add("0x8086", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, vendor, device, class, width, speed, driver string) {
		d := DevicesDir + "/0000:19:00.0/"
		m := fstest.MapFS{
			d + "vendor": {Data: []byte(vendor)}, d + "device": {Data: []byte(device)}, d + "class": {Data: []byte(class)},
			d + "current_link_width": {Data: []byte(width)}, d + "current_link_speed": {Data: []byte(speed)},
			d + "driver": {Data: []byte(driver)},
		}
		devs, err := Read(m)
		v, verr := parseHex(vendor, 16)
		ours := verr == nil && (v == 0x10de || v == 0x15b3)
		if ours != (len(devs) == 1) {
			t.Fatalf("vendor %q: got %d devices", vendor, len(devs))
		}
		if verr != nil && (err == nil || !strings.Contains(err.Error(), "0000:19:00.0/vendor: ")) {
			t.Fatalf("bad vendor not named: %v", err)
		}
		if !ours {
			return
		}
		got := devs[0]
		if _, e := parseWidth(width); e != nil != strings.Contains(fmt.Sprint(err), "current_link_width: ") {
			t.Fatalf("width %q: err %v", width, err)
		}
		if got.CurrentLinkWidth < 0 || got.CurrentLinkWidth > 32 || strings.Contains(got.Driver, "/") {
			t.Fatalf("device %+v", got)
		}
	})
}
