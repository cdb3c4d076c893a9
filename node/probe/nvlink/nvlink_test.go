package nvlink

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

var fixtures = []string{
	"gpud__nvidia-smi-nvlink-status__a100.txt",
	"synthetic__h100-status-and-errors.txt",
	"synthetic__b200-newer-counters.txt",
}

func read(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestGolden(t *testing.T) {
	t.Parallel()
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st, err := Parse(read(t, name))
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.MarshalIndent(st, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			golden := filepath.Join("testdata", strings.TrimSuffix(name, ".txt")+".golden.json")
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
				t.Errorf("differs from golden; got:\n%s", got)
			}
		})
	}
}

func TestA100Fixture(t *testing.T) {
	t.Parallel()
	st, err := Parse(read(t, fixtures[0]))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GPUs) != 8 {
		t.Fatalf("GPUs = %d, want 8", len(st.GPUs))
	}
	for i, g := range st.GPUs {
		if g.Index != i || g.Name != "NVIDIA A100-SXM4-80GB" || !strings.HasPrefix(g.UUID, "GPU-") || len(g.Links) != 12 {
			t.Errorf("GPU %d = %+v", i, g)
		}
		for _, l := range g.Links {
			if !l.Active || l.SpeedGBps != 25 || l.Errors != nil {
				t.Errorf("GPU %d link %+v", i, l)
			}
		}
	}
}

func TestShapes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want *snapshot.NVLinkState
	}{
		{"empty", "", &snapshot.NVLinkState{}},
		{"blank lines", "\n  \n", &snapshot.NVLinkState{}},
		{
			"header without uuid, inactive and speeds",
			"GPU 3: Tesla V100\n  Link 0: <inactive>\n  Link 1: 25.781 GB/s\n  Link 2: 200 Gb/s\n  Link 3: Inactive\n  Link 4: N/A\n",
			&snapshot.NVLinkState{GPUs: []snapshot.NVLinkGPU{{Index: 3, Name: "Tesla V100", Links: []snapshot.NVLink{
				{Link: 0}, {Link: 1, Active: true, SpeedGBps: 25.781}, {Link: 2, Active: true, SpeedGBps: 25}, {Link: 3},
			}}}},
		},
		{
			"sections merge, counters on one line",
			"GPU 0: X (UUID: GPU-1)\n Link 1: 25 GB/s\nGPU 0: X (UUID: GPU-1)\n Link 1: Replay Errors: 4, Recovery Errors: 1, CRC Errors: 9\n",
			&snapshot.NVLinkState{GPUs: []snapshot.NVLinkGPU{{Index: 0, Name: "X", UUID: "GPU-1", Links: []snapshot.NVLink{
				{Link: 1, Active: true, SpeedGBps: 25, Errors: map[string]uint64{"replay": 4, "recovery": 1, "crc": 9}},
			}}}},
		},
		{
			"counters only",
			"GPU 1: X (UUID: GPU-2)\n Link 0: Replay Errors: 0\n",
			&snapshot.NVLinkState{GPUs: []snapshot.NVLinkGPU{{Index: 1, Name: "X", UUID: "GPU-2", Links: []snapshot.NVLink{
				{Link: 0, Errors: map[string]uint64{"replay": 0}},
			}}}},
		},
		{
			"gpu with no links (PCIe only)",
			"GPU 0: NVIDIA A10G (UUID: GPU-3)\n",
			&snapshot.NVLinkState{GPUs: []snapshot.NVLinkGPU{{Index: 0, Name: "NVIDIA A10G", UUID: "GPU-3", Links: []snapshot.NVLink{}}}},
		},
		{
			"junk lines inside a section are ignored",
			"GPU 0: X\n Link x: 25 GB/s\n Link 1 25 GB/s\n Link 99999999999: 1 GB/s\n Link 2: -5 GB/s\n Link 3: 5 parsecs\n something else\n",
			&snapshot.NVLinkState{GPUs: []snapshot.NVLinkGPU{{Index: 0, Name: "X", Links: []snapshot.NVLink{}}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := Parse([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"Failed to initialize NVML: Driver/library version mismatch\n",
		"No devices were found\n",
		"\x00\x01\x02 binary",
	} {
		_, err := Parse([]byte(in))
		if err == nil || !strings.Contains(err.Error(), "nvidia-smi nvlink") {
			t.Errorf("Parse(%q) err = %v", in, err)
		}
	}
}

func TestCounterNames(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"Replay Errors":                   "replay",
		"Recovery Errors":                 "recovery",
		"CRC Errors":                      "crc",
		"CRC Flit Errors":                 "crc_flit",
		"Flit CRC Errors":                 "crc_flit",
		"CRC Data Errors":                 "crc_data",
		"Data CRC Errors":                 "crc_data",
		"Rx remote Errors":                "rx_remote",
		"Tx discards":                     "tx_discards",
		"Link recovery successful events": "link_recovery_successful_events",
		"FEC Errors - 0":                  "fec_errors_0",
		"  ":                              "",
	} {
		if got := counterName(in); got != want {
			t.Errorf("counterName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestH100Fixture(t *testing.T) {
	t.Parallel()
	st, err := Parse(read(t, fixtures[1]))
	if err != nil {
		t.Fatal(err)
	}
	g := st.GPUs[1]
	if l := g.Links[7]; l.Active || l.SpeedGBps != 0 {
		t.Errorf("link 7 = %+v", l)
	}
	if l := g.Links[9]; !l.Active || l.SpeedGBps != 13.281 || l.Errors["replay"] != 3 || l.Errors["crc"] != 17 {
		t.Errorf("link 9 = %+v", l)
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range fixtures {
		f.Add(read(f, name))
	}
	f.Add([]byte("GPU 0: X\n Link 0: Replay Errors: 1, CRC Errors: 2\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := Parse(data)
		if err != nil {
			if st != nil {
				t.Fatal("state with error")
			}
			return
		}
		for i, g := range st.GPUs {
			if i > 0 && st.GPUs[i-1].Index >= g.Index {
				t.Fatalf("GPUs not sorted/unique")
			}
			for j, l := range g.Links {
				if j > 0 && g.Links[j-1].Link >= l.Link {
					t.Fatalf("links not sorted/unique")
				}
				if l.SpeedGBps < 0 || l.SpeedGBps != l.SpeedGBps || (l.Active && l.SpeedGBps == 0) {
					t.Fatalf("bad link %+v", l)
				}
			}
		}
	})
}

func BenchmarkParse(b *testing.B) {
	data := read(b, "synthetic__h100-status-and-errors.txt")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
