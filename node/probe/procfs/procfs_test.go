package procfs

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetcheck/fleetcheck/internal/snapshot"
)

const modulesH100 = `nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)
nvidia_uvm 1437696 4 - Live 0x0000000000000000 (POE)
nvidia_drm 77824 0 - Live 0x0000000000000000 (POE)
nvidia_modeset 1314816 1 nvidia_drm, Live 0x0000000000000000 (POE)
nvidia 56778752 110 nvidia_peermem,nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (POE)
ib_uverbs 184320 3 nvidia_peermem,rdma_ucm,mlx5_ib, Live 0x0000000000000000 (OE)
mlx5_ib 462848 0 - Live 0x0000000000000000 (OE)
mlx5_core 2265088 1 mlx5_ib, Live 0x0000000000000000 (OE)
`

const lsmodOutput = `Module                  Size  Used by
nv_peer_mem            16384  0
nvidia              56778752  110 nv_peer_mem
`

func TestParseModules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    []string
		wantErr string
	}{
		{name: "h100", in: modulesH100, want: []string{"nvidia_peermem", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia", "ib_uverbs", "mlx5_ib", "mlx5_core"}},
		{name: "lsmod", in: lsmodOutput, want: []string{"nv_peer_mem", "nvidia"}},
		{name: "empty", in: "", want: []string{}},
		{name: "blank lines and no final newline", in: "\nnvidia 1 0 - Live 0x0\n\n  \nmlx5_core 2 0 - Live 0x0", want: []string{"nvidia", "mlx5_core"}},
		{name: "garbage", in: "nvidia 1 0 - Live 0x0\n\x00\xff junk\n", wantErr: "parse /proc/modules: line 2: bad module name"},
		{name: "too long", in: strings.Repeat("a", 65) + " 1 0 - Live 0x0\n", wantErr: "line 1: bad module name"},
		{name: "huge line", in: strings.Repeat("a", 2<<20), wantErr: "parse /proc/modules: line 1: bufio.Scanner: token too long"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseModules([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseModules = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	// What gpu.peermem asks of the result.
	mods, _ := ParseModules([]byte(modulesH100))
	snap := &snapshot.Snapshot{Modules: mods}
	if loaded, ok := snap.HasModule("nvidia_peermem"); !loaded || !ok {
		t.Errorf("HasModule(nvidia_peermem) = %v, %v", loaded, ok)
	}
}

func TestParseUptime(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{in: "12345.67 54321.00\n", want: 12345*time.Second + 670*time.Millisecond},
		{in: "2397166.92 38000000.11\n", want: 2397166*time.Second + 920*time.Millisecond},
		{in: "0.00 0.00", want: 0},
		{in: "42", want: 42 * time.Second},
		{in: "  7.5\n", want: 7500 * time.Millisecond},
		{in: "", wantErr: true},
		{in: "\n", wantErr: true},
		{in: "-1.00 0.00", wantErr: true},
		{in: "NaN 0", wantErr: true},
		{in: "Inf 0", wantErr: true},
		{in: "1e9 0", wantErr: true},
		{in: "12. 0", wantErr: true},
		{in: ".5 0", wantErr: true},
		{in: "0x10 0", wantErr: true},
		{in: "99999999999999999999.00 0", wantErr: true},
	}
	for _, tc := range tests {
		got, err := ParseUptime([]byte(tc.in))
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseUptime(%q) = %v, %v; want %v, err %v", tc.in, got, err, tc.want, tc.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "/proc/uptime") {
			t.Errorf("error %q does not name the file", err)
		}
	}
}

func TestParseDriverVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
		wantErr        bool
	}{
		{name: "proprietary", in: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Wed Feb 14 10:27:41 UTC 2024\nGCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04) \n", want: "535.161.08"},
		{name: "open", in: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 19:32:55 UTC 2024\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n", want: "550.54.15"},
		{name: "aarch64", in: "NVRM version: NVIDIA UNIX aarch64 Kernel Module  570.133.20  Fri Mar 14 10:35:40 UTC 2025\n", want: "570.133.20"},
		{name: "two-part version", in: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  418.87  Thu Aug  8 15:35:46 CDT 2019\n", want: "418.87"},
		{name: "leading blank line", in: "\nNVRM version: NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023", want: "535.129.03"},
		{name: "gcc only", in: "GCC version:  gcc version 11.4.0\n", wantErr: true},
		{name: "no version", in: "NVRM version: NVIDIA UNIX x86_64 Kernel Module\n", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseDriverVersion([]byte(tc.in))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("ParseDriverVersion = %q, %v; want %q, err %v", got, err, tc.want, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "/proc/driver/nvidia/version") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

func TestParseVersions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		want    snapshot.Versions
		wantErr bool
	}{
		{
			name: "full",
			in: `{"driver": "535.129.03", "cuda": "12.2", "kernel": "6.5.0-1007-nvidia", "fabric_manager": "535.129.03",
			      "rdma_stack": "MLNX_OFED_LINUX-23.10-1.1.9.0", "nccl": "2.18.5", "dcgm": "3.3.5", "hostname_extra": {"x": [1]}, "future": 3}`,
			want: snapshot.Versions{Driver: "535.129.03", CUDA: "12.2", Kernel: "6.5.0-1007-nvidia", FabricManager: "535.129.03",
				RDMAStack: "MLNX_OFED_LINUX-23.10-1.1.9.0", NCCL: "2.18.5", DCGM: "3.3.5"},
		},
		{name: "partial and trimmed", in: "{\"kernel\": \" 6.8.0-45-generic\\n\", \"rdma_stack\": \"DOCA 2.10.0\"}\n", want: snapshot.Versions{Kernel: "6.8.0-45-generic", RDMAStack: "DOCA 2.10.0"}},
		{name: "null value", in: `{"driver": null}`, want: snapshot.Versions{}},
		{name: "empty object", in: `{}`, want: snapshot.Versions{}},
		{name: "number for a known key", in: `{"cuda": 12.10}`, wantErr: true},
		{name: "not an object", in: `["535"]`, wantErr: true},
		{name: "null document", in: `null`, wantErr: true},
		{name: "empty file", in: ``, wantErr: true},
		{name: "truncated", in: `{"driver": "535`, wantErr: true},
		{name: "trailing garbage", in: `{"driver": "535"} x`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseVersions([]byte(tc.in))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("ParseVersions = %+v, %v; want %+v, err %v", got, err, tc.want, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "versions.json") {
				t.Errorf("error %q does not name versions.json", err)
			}
		})
	}
}

func FuzzParseModules(f *testing.F) {
	f.Add([]byte(modulesH100))
	f.Add([]byte(lsmodOutput))
	f.Add([]byte(""))
	f.Add([]byte("a\n\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		mods, err := ParseModules(data)
		if err != nil {
			if mods != nil {
				t.Fatalf("error %v with modules %q", err, mods)
			}
			return
		}
		if mods == nil {
			t.Fatal("nil list without an error")
		}
		for _, m := range mods {
			if !validModuleName(m) {
				t.Fatalf("invalid name %q", m)
			}
		}
	})
}

func FuzzParseUptime(f *testing.F) {
	for _, s := range []string{"12345.67 54321.00\n", "0.00 0.00", "NaN", "9223372036.85", "1e9"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := ParseUptime(data)
		if err != nil {
			if d != 0 {
				t.Fatalf("error %v with %v", err, d)
			}
			return
		}
		if d < 0 {
			t.Fatalf("ParseUptime(%q) = %v", data, d)
		}
		if secs := strings.Fields(string(data))[0]; math.Abs(d.Seconds()-mustFloat(t, secs)) > 1e-3*math.Max(1, d.Seconds()) {
			t.Fatalf("ParseUptime(%q) = %v", data, d)
		}
	})
}

func mustFloat(t *testing.T, s string) float64 {
	t.Helper()
	var v float64
	for i, part := range strings.SplitN(s, ".", 2) {
		for _, c := range part {
			if i == 0 {
				v = v*10 + float64(c-'0')
			}
		}
		if i == 1 {
			scale := 0.1
			for _, c := range part {
				v += float64(c-'0') * scale
				scale /= 10
			}
		}
	}
	return v
}

func FuzzParseDriverVersion(f *testing.F) {
	f.Add([]byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Wed Feb 14 10:27:41 UTC 2024\nGCC version:  gcc version 11.4.0\n"))
	f.Add([]byte("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 19:32:55 UTC 2024\n"))
	f.Add([]byte("NVRM version:"))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := ParseDriverVersion(data)
		if err != nil {
			if v != "" {
				t.Fatalf("error %v with %q", err, v)
			}
			return
		}
		if !versionRE.MatchString(v) || !strings.Contains(string(data), v) {
			t.Fatalf("ParseDriverVersion(%q) = %q", data, v)
		}
	})
}

func FuzzParseVersions(f *testing.F) {
	f.Add([]byte(`{"driver": "535.129.03", "cuda": "12.2", "kernel": "6.5.0-1007-nvidia", "rdma_stack": "MLNX_OFED_LINUX-23.10-1.1.9.0"}`))
	f.Add([]byte(`{"cuda": 12.2}`))
	f.Add([]byte(`{"x": {"y": [null, true]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := ParseVersions(data)
		if err != nil {
			if v != (snapshot.Versions{}) {
				t.Fatalf("error %v with %+v", err, v)
			}
			return
		}
		for _, s := range []string{v.Driver, v.CUDA, v.Kernel, v.FabricManager, v.RDMAStack, v.NCCL, v.DCGM} {
			if strings.TrimSpace(s) != s {
				t.Fatalf("untrimmed value %q", s)
			}
		}
	})
}
