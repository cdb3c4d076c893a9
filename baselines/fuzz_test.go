package baselines

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParseYAML: any input gives entries or an ErrInvalid error, never a
// panic; what it accepts the store accepts too, and writing it out and
// reading it back changes nothing.
func FuzzParseYAML(f *testing.F) {
	seeds, err := fs.Glob(referenceFS, "reference/*.yaml")
	if err != nil {
		f.Fatal(err)
	}
	for _, n := range seeds {
		data, err := referenceFS.ReadFile(n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	more, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, n := range more {
		data, err := os.ReadFile(n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"",
		"baselines:\n",
		"format: 1\nbaselines: []\n",
		"baselines:\n  - {metric: nccl.allreduce.busbw_gbps, scope: node:a, value: 480}\n",
		"baselines:\n  - {metric: nccl.allreduce.busbw_gbps, scope: link:b|a, value: 1e-300, threshold: 99}\n",
		"baselines:\n  - metric: a.b_us\n    scope: sku:x\n    samples: {count: 9, median: 2, mad: 0, min: 1, max: 3, values: [3, 1]}\n    note: |\n      two\n      lines\n",
		"baselines:\n  - &e {metric: a.b_gbps, scope: node:a, value: 1}\n  - *e\n",
		"baselines:\n  - {metric: a.b_gbps, scope: node:a, value: .nan}\n",
		"x: &a [*a]\n",
		"baselines: []\n---\nbaselines: []\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		bs, err := ParseYAML(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error not ErrInvalid: %v", err)
			}
			return
		}
		for i, b := range bs {
			n, err := b.normalize()
			if err != nil {
				t.Fatalf("entry %d parsed but the store rejects it: %v", i, err)
			}
			if !sameBaseline(n, b) {
				t.Fatalf("entry %d changes when normalized again: %v → %v", i, b, n)
			}
		}
		out, err := MarshalYAML(bs)
		if err != nil {
			t.Fatalf("marshal accepted entries: %v", err)
		}
		back, err := ParseYAML(out)
		if err != nil {
			t.Fatalf("reading back what was written: %v\n%s", err, out)
		}
		if len(back) != len(bs) {
			t.Fatalf("%d entries back, want %d", len(back), len(bs))
		}
		for i := range bs {
			if !sameBaseline(back[i], bs[i]) {
				t.Fatalf("entry %d changed in a round trip:\n got %+v\nwant %+v\n%s", i, back[i], bs[i], out)
			}
		}
		again, err := MarshalYAML(back)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("second marshal differs (%v)", err)
		}
	})
}
