package dcgm

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

const (
	fix3     = "dcgm-3.1.0__diag__8gpu__from-NVIDIA-DCGM-JsonResult-test__with-banner-and-nulls.json.txt"
	fix4     = "SYNTHETIC__dcgm-4.1.1__diag-r3__h100x8__gpu3-memory-FAIL_gpu5-pcie-WARN.json"
	fix4RT   = "SYNTHETIC__dcgm-4.1.1__runtime-error_no-hostengine.json"
	fixSchem = "NVIDIA-DCGM__dcgm_diag_schema.json"
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGolden compares the parse of each parseable fixture with its golden
// JSON; UPDATE_GOLDEN=1 rewrites the golden files.
func TestGolden(t *testing.T) {
	t.Parallel()
	update := os.Getenv("UPDATE_GOLDEN") == "1"
	for _, name := range []string{fix3, fix4} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d, err := Parse(readFixture(t, name))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got, err := json.MarshalIndent(d, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			golden := filepath.Join("testdata", "golden", strings.TrimSuffix(name, filepath.Ext(name))+".golden.json")
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
				t.Errorf("parse differs from %s (UPDATE_GOLDEN=1 refreshes)\ngot:\n%s", golden, got)
			}
		})
	}
}

func count(d *snapshot.DCGMDiag) map[string]int {
	m := map[string]int{}
	for _, t := range d.Tests {
		m[t.Status]++
	}
	return m
}

func find(d *snapshot.DCGMDiag, name string, id int) *snapshot.DCGMTest {
	for i := range d.Tests {
		if d.Tests[i].Name == name && d.Tests[i].EntityID == id {
			return &d.Tests[i]
		}
	}
	return nil
}

func TestDCGM3Fixture(t *testing.T) {
	t.Parallel()
	d, err := Parse(readFixture(t, fix3))
	if err != nil {
		t.Fatal(err)
	}
	if d.Version != "3.1.0" {
		t.Errorf("Version = %q", d.Version)
	}
	// 9 node-wide Deployment tests (gpu_ids "0,...,7") + 8 per-GPU "software" results.
	if len(d.Tests) != 17 || count(d)[snapshot.DCGMPass] != 17 {
		t.Errorf("tests = %d, statuses %v", len(d.Tests), count(d))
	}
	if tt := find(d, "Denylist", -1); tt == nil || tt.Category != "Deployment" || tt.EntityGroup != "GPU" {
		t.Errorf("Denylist = %+v", tt)
	}
	if tt := find(d, "software", 7); tt == nil || tt.Category != "Custom" {
		t.Errorf("software GPU7 = %+v", tt)
	}
}

func TestDCGM4Fixture(t *testing.T) {
	t.Parallel()
	d, err := Parse(readFixture(t, fix4))
	if err != nil {
		t.Fatal(err)
	}
	if d.Version != "4.1.1" || d.DriverVersion != "550.90.07" || d.Level != 0 {
		t.Errorf("diag = %q %q level %d", d.Version, d.DriverVersion, d.Level)
	}
	want := map[string]int{snapshot.DCGMPass: 46, snapshot.DCGMFail: 1, snapshot.DCGMWarn: 1, snapshot.DCGMSkip: 8, snapshot.DCGMNotRun: 2}
	got := count(d)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d (all %v)", k, got[k], v, got)
		}
	}
	mem := find(d, "memory", 3)
	if mem == nil || mem.Status != snapshot.DCGMFail || mem.Category != "Hardware" || len(mem.Warnings) != 2 ||
		!strings.Contains(mem.Warnings[0], "DBE") || !strings.Contains(mem.Warnings[0], "(DCGM error 95)") {
		t.Errorf("memory GPU3 = %+v", mem)
	}
	if cpu := find(d, "cpu_eud", 1); cpu == nil || cpu.EntityGroup != "CPU" || cpu.Status != snapshot.DCGMNotRun {
		t.Errorf("cpu_eud = %+v", cpu)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		in   string
		want error
	}{
		"runtime error fixture": {string(readFixture(t, fix4RT)), ErrRuntime},
		"schema is not output":  {string(readFixture(t, fixSchem)), ErrNoJSON},
		"empty":                 {"", ErrNoJSON},
		"text only":             {"Error: unable to establish a connection to the specified host: localhost\n", ErrNoJSON},
		"other JSON":            {`{"foo": 1}`, ErrNoJSON},
		"no tests":              {`{"DCGM Diagnostic": {"test_categories": []}}`, ErrNoTests},
		"only nulls":            {`{"DCGM GPU Diagnostic": {"test_categories": [null, {"category": "x", "tests": [null]}]}}`, ErrNoTests},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d, err := Parse([]byte(c.in))
			if d != nil || !errors.Is(err, c.want) {
				t.Fatalf("Parse = %v, %v; want %v", d, err, c.want)
			}
			if !strings.Contains(err.Error(), "dcgmi diag") {
				t.Errorf("error %q does not name the source", err)
			}
		})
	}
	// A truncated document is a JSON error, still naming the source.
	trunc := readFixture(t, fix4)
	_, err := Parse(trunc[:len(trunc)/2])
	if err == nil || !strings.Contains(err.Error(), "dcgmi diag") {
		t.Errorf("truncated: %v", err)
	}
}

func TestParseTraps(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		in    string
		check func(t *testing.T, d *snapshot.DCGMDiag)
	}{
		{
			name: "banner with a brace before the JSON",
			in:   "WARNING: {deprecated} option\n" + `{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "GPU Memory", "results": [{"gpu_ids": 2, "status": "FAIL", "warnings": [{"warning": "bad", "error_id": 26}]}]}]}], "version": "3.3.5"}, "Driver Version Detected": "535.129.03"}`,
			check: func(t *testing.T, d *snapshot.DCGMDiag) {
				tt := d.Tests[0]
				if tt.EntityID != 2 || tt.Status != snapshot.DCGMFail || tt.Warnings[0] != "bad (DCGM error 26)" || d.DriverVersion != "535.129.03" {
					t.Errorf("diag = %+v", d)
				}
			},
		},
		{
			name: "gpu_id string, plain string warnings, NOT RUN",
			in:   `{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Stress", "tests": [{"name": "SM Stress", "results": [{"gpu_id": "4", "status": "NOT RUN", "warnings": ["w1", null, ""]}]}]}]}}`,
			check: func(t *testing.T, d *snapshot.DCGMDiag) {
				tt := d.Tests[0]
				if tt.EntityID != 4 || tt.Status != snapshot.DCGMNotRun || len(tt.Warnings) != 1 || tt.Warnings[0] != "w1" {
					t.Errorf("test = %+v", tt)
				}
			},
		},
		{
			name: "summary only",
			in:   `{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "memory", "results": [null], "test_summary": {"status": "Fail"}}]}]}}`,
			check: func(t *testing.T, d *snapshot.DCGMDiag) {
				if len(d.Tests) != 1 || d.Tests[0].EntityID != -1 || d.Tests[0].Status != snapshot.DCGMFail {
					t.Errorf("tests = %+v", d.Tests)
				}
			},
		},
		{
			name: "odd entity ids become node-wide",
			in:   `{"DCGM Diagnostic": {"test_categories": [{"category": "c", "tests": [{"name": "t", "results": [{"entity_group": "GPU", "entity_id": 1.5, "status": "Pass"}, {"entity_group": "GPU", "entity_id": -3, "status": "Pass"}, {"entity_group": "GPU", "entity_id": "x", "status": "Pass"}, {"entity_group": "GPU", "entity_id": 1e300, "status": "Pass"}]}]}]}}`,
			check: func(t *testing.T, d *snapshot.DCGMDiag) {
				for _, tt := range d.Tests {
					if tt.EntityID != -1 {
						t.Errorf("test = %+v", tt)
					}
				}
			},
		},
		{
			name: "unknown status kept, message key, trailing text",
			in:   `{"DCGM Diagnostic": {"test_categories": [{"category": "c", "tests": [{"name": "t", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Exploded", "warnings": {"message": "m"}}]}]}]}}` + "\ntrailing text",
			check: func(t *testing.T, d *snapshot.DCGMDiag) {
				tt := d.Tests[0]
				if tt.Status != "Exploded" || len(tt.Warnings) != 1 || tt.Warnings[0] != "m" {
					t.Errorf("test = %+v", tt)
				}
			},
		},
		{
			name: "warnings bounded",
			in:   `{"DCGM Diagnostic": {"test_categories": [{"category": "c", "tests": [{"name": "t", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Fail", "warnings": [` + strings.Repeat(`"`+strings.Repeat("x", 3000)+`",`, 40) + `"last"]}]}]}]}}`,
			check: func(t *testing.T, d *snapshot.DCGMDiag) {
				w := d.Tests[0].Warnings
				if len(w) != maxWarnings || len(w[0]) != maxWarningText {
					t.Errorf("%d warnings, first %d bytes", len(w), len(w[0]))
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d, err := Parse([]byte(c.in))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			c.check(t, d)
		})
	}
}

func TestNormalizeStatus(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"PASS": snapshot.DCGMPass, "Passed": snapshot.DCGMPass, "FAIL": snapshot.DCGMFail, "WARN": snapshot.DCGMWarn, "Warning": snapshot.DCGMWarn,
		"SKIP": snapshot.DCGMSkip, "Skipped": snapshot.DCGMSkip, "NOT RUN": snapshot.DCGMNotRun, "Not Run": snapshot.DCGMNotRun, " pass ": snapshot.DCGMPass,
		"": "", "Odd": "Odd",
	} {
		if got := snapshot.NormalizeDCGMStatus(in); got != want {
			t.Errorf("NormalizeStatus(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{fix3, fix4, fix4RT} {
		f.Add(readFixture(f, name))
	}
	f.Add([]byte(`{"DCGM Diagnostic": {"test_categories": [{"category": "c", "tests": [{"name": "t", "results": [{"gpu_ids": "1", "status": "fail", "warnings": [{"warning": "w", "error_id": 3}]}], "test_summary": {"status": "Fail"}}]}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Parse(data)
		if err != nil {
			if d != nil {
				t.Fatal("diag with error")
			}
			if !strings.Contains(err.Error(), "dcgmi diag") {
				t.Fatalf("error %q does not name the source", err)
			}
			return
		}
		if len(d.Tests) == 0 {
			t.Fatal("diag without tests")
		}
		for _, tt := range d.Tests {
			if tt.EntityID < -1 || len(tt.Warnings) > maxWarnings {
				t.Fatalf("bad test %+v", tt)
			}
		}
		if _, err := json.Marshal(d); err != nil {
			t.Fatal(err)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	data := readFixture(b, fix4)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
