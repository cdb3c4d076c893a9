package ibsysfs

import (
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// seedValues adds every value file of the fixture tree as a seed, so the
// fuzzers start from what real hardware prints.
func seedValues(f *testing.F, base ...string) {
	f.Helper()
	seen := map[string]bool{}
	err := filepath.WalkDir("testdata/sys", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := d.Name()
		for _, b := range base {
			if name == b || (b == "*counter" && strings.Contains(p, "counters")) {
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				if !seen[string(data)] {
					seen[string(data)] = true
					f.Add(string(data))
				}
			}
		}
		return nil
	})
	if err != nil {
		f.Fatal(err)
	}
}

func FuzzParseState(f *testing.F) {
	seedValues(f, "state", "phys_state")
	for _, s := range []string{"1: DOWN\n", "3: Disabled\n", "2: Polling", "0: <unknown>", "ACTIVE", ": x", "4:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseState(s)
		if err != nil {
			if got != "" {
				t.Fatalf("error %v with value %q", err, got)
			}
			return
		}
		if got == "" || len(got) > maxTextLen || strings.TrimSpace(got) != got {
			t.Fatalf("parseState(%q) = %q", s, got)
		}
		// Idempotent: the name parses to itself.
		if again, err := parseState(got); err != nil || again != got {
			t.Fatalf("parseState(%q) = %q, then %q, %v", s, got, again, err)
		}
	})
}

func FuzzParseRate(f *testing.F) {
	seedValues(f, "rate")
	for _, s := range []string{"2.5 Gb/sec (1X SDR)\n", "10 Gb/sec (4X)", "NaN Gb/sec", "1e308 Gb/sec", "0 Gb/sec"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, text, err := parseRate(s)
		if err != nil {
			if v != 0 || text != "" {
				t.Fatalf("error %v with %v %q", err, v, text)
			}
			return
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			t.Fatalf("parseRate(%q) = %v", s, v)
		}
		if text != strings.TrimSpace(s) || !strings.Contains(text, "Gb/sec") {
			t.Fatalf("parseRate(%q) text %q", s, text)
		}
	})
}

func FuzzParseCounter(f *testing.F) {
	seedValues(f, "*counter")
	for _, s := range []string{"18446744073709551615\n", "18446744073709551616", "-1", "N/A (no PMA)\n", " 7 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := parseCounter(s)
		if err != nil {
			if v != 0 {
				t.Fatalf("error %v with %d", err, v)
			}
			return
		}
		if again, err := parseCounter(strings.TrimSpace(s)); err != nil || again != v {
			t.Fatalf("parseCounter(%q) = %d, trimmed gives %d, %v", s, v, again, err)
		}
	})
}

// FuzzReadPort walks a one-port tree whose files hold fuzzed bytes: Read
// must never fail, lose the device or port, or drop a value silently.
func FuzzReadPort(f *testing.F) {
	port := "testdata/sys/class/infiniband/mlx5_0/ports/1/"
	read := func(name string) string {
		b, err := os.ReadFile(port + name)
		if err != nil {
			f.Fatal(err)
		}
		return string(b)
	}
	f.Add("MT4129", read("state"), read("phys_state"), read("rate"), read("link_layer"), read("counters/symbol_error"), read("hw_counters/out_of_sequence"))
	f.Add("MT41692\n", "1: DOWN\n", "3: Disabled\n", "2.5 Gb/sec (1X SDR)\n", "Ethernet\n", "N/A (no PMA)\n", "garbage")
	f.Add("", "", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, hcaType, state, phys, rate, linkLayer, counter, hwCounter string) {
		base := ClassDir + "/mlx5_0/"
		fsys := fstest.MapFS{
			base + "hca_type":                            {Data: []byte(hcaType)},
			base + "ports/1/state":                       {Data: []byte(state)},
			base + "ports/1/phys_state":                  {Data: []byte(phys)},
			base + "ports/1/rate":                        {Data: []byte(rate)},
			base + "ports/1/link_layer":                  {Data: []byte(linkLayer)},
			base + "ports/1/counters/symbol_error":       {Data: []byte(counter)},
			base + "ports/1/hw_counters/out_of_sequence": {Data: []byte(hwCounter)},
		}
		hcas, err := Read(fsys)
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		if len(hcas) != 1 || hcas[0].Name != "mlx5_0" || len(hcas[0].Ports) != 1 || hcas[0].Ports[0].Port != 1 {
			t.Fatalf("lost the device or port: %+v", hcas)
		}
		h, p := hcas[0], hcas[0].Ports[0]
		if ht := strings.TrimSpace(hcaType); checkText(ht) == nil && h.Model != ht || ht == "" && h.Model != "" {
			t.Fatalf("model %q from %q", h.Model, hcaType)
		}
		if math.IsNaN(p.RateGbps) || math.IsInf(p.RateGbps, 0) || p.RateGbps < 0 {
			t.Fatalf("rate %v", p.RateGbps)
		}
		if len(h.Errors) > len(fsys) {
			t.Fatalf("more errors than files: %v", h.Errors)
		}
		noted := func(file string) bool {
			for _, e := range h.Errors {
				if strings.HasPrefix(e, "mlx5_0/ports/1/"+file+": ") {
					return true
				}
			}
			return false
		}
		check := func(file string, ok bool, got, want any) {
			t.Helper()
			if ok && (noted(file) || got != want) {
				t.Fatalf("%s: got %v want %v, errors %v", file, got, want, h.Errors)
			}
			if !ok && !noted(file) {
				t.Fatalf("%s: bad value not noted: %v", file, h.Errors)
			}
		}
		st, err := parseState(state)
		check("state", err == nil, p.State, st)
		ps, err := parseState(phys)
		check("phys_state", err == nil, p.PhysState, ps)
		rg, _, err := parseRate(rate)
		check("rate", err == nil, p.RateGbps, rg)
		ll := strings.TrimSpace(linkLayer)
		check("link_layer", checkText(ll) == nil, p.LinkLayer, ll)
		if !strings.HasPrefix(strings.TrimSpace(counter), "N/A") {
			v, err := parseCounter(counter)
			check("counters/symbol_error", err == nil, p.Counters["symbol_error"], v)
		}
		if !strings.HasPrefix(strings.TrimSpace(hwCounter), "N/A") {
			v, err := parseCounter(hwCounter)
			check("hw_counters/out_of_sequence", err == nil, p.HWCounters["out_of_sequence"], v)
		}
	})
}
