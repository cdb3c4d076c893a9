package membership

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestMetaRoundTrip(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		meta Meta
	}{
		{"minimal", Meta{Role: RoleAgent}},
		{"coordinator", Meta{Role: RoleCoordinator, AgentVersion: "v1.2.3", ProtocolVersion: "1"}},
		{"labels", Meta{Role: RoleAgent, AgentVersion: "v0.9.0", ProtocolVersion: "1",
			Labels: map[string]string{"sku": "h100", "rack": "r12", "zone": "", "pool": "training"}}},
		{"utf8", Meta{Role: RoleAgent, Labels: map[string]string{"owner": "équipe-ml"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := tc.meta.Encode()
			if err != nil {
				t.Fatalf("encode: %v", err)
			}
			got, err := DecodeMeta(b)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, tc.meta) {
				t.Fatalf("round trip: got %+v, want %+v", got, tc.meta)
			}
		})
	}
}

func TestMetaEncodingIsDeterministic(t *testing.T) {
	t.Parallel()
	labels := map[string]string{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		labels[k] = strings.Repeat(k, 3)
	}
	m := Meta{Role: RoleAgent, Labels: labels}
	first, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		again, err := m.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, again) {
			t.Fatal("same meta encoded to different bytes; peers would see spurious updates")
		}
	}
}

func TestMetaTooLarge(t *testing.T) {
	t.Parallel()
	m := Meta{Role: RoleAgent, Labels: map[string]string{"notes": strings.Repeat("x", MaxMetaSize)}}
	_, err := m.Encode()
	if !errors.Is(err, ErrMetaTooLarge) {
		t.Fatalf("err = %v, want ErrMetaTooLarge", err)
	}
	if !strings.Contains(err.Error(), "limit 512") {
		t.Fatalf("error should name the limit: %v", err)
	}

	// Just under the limit still encodes.
	fit := Meta{Role: RoleAgent, Labels: map[string]string{"notes": strings.Repeat("x", 490)}}
	b, err := fit.Encode()
	if err != nil || len(b) > MaxMetaSize {
		t.Fatalf("490-byte label: len %d err %v", len(b), err)
	}
}

func TestMetaValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		meta Meta
		ok   bool
	}{
		{"agent", Meta{Role: RoleAgent}, true},
		{"coordinator", Meta{Role: RoleCoordinator}, true},
		{"no role", Meta{}, false},
		{"unknown role", Meta{Role: "operator"}, false},
		{"empty label key", Meta{Role: RoleAgent, Labels: map[string]string{"": "x"}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.meta.Validate()
			if tc.ok != (err == nil) {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidMeta) {
				t.Fatalf("error %v does not wrap ErrInvalidMeta", err)
			}
		})
	}
}

func TestDecodeMetaRejectsCorruptInput(t *testing.T) {
	t.Parallel()
	valid, err := Meta{Role: RoleAgent, Labels: map[string]string{"sku": "h100"}}.Encode()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"format zero", []byte{0, 5, 'a', 'g', 'e', 'n', 't'}},
		{"truncated", valid[:len(valid)-2]},
		{"length past end", []byte{1, 200, 'a'}},
		{"huge length", []byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}},
		{"huge label count", []byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := DecodeMeta(tc.in); !errors.Is(err, ErrInvalidMeta) {
				t.Fatalf("DecodeMeta(%x) err = %v, want ErrInvalidMeta", tc.in, err)
			}
		})
	}
}

func TestDecodeMetaIgnoresNewerFields(t *testing.T) {
	t.Parallel()
	want := Meta{Role: RoleCoordinator, AgentVersion: "v2", Labels: map[string]string{"a": "b"}}
	b, err := want.Encode()
	if err != nil {
		t.Fatal(err)
	}
	// A later release bumps the format byte and appends a field.
	newer := append([]byte{2}, b[1:]...)
	newer = append(newer, 3, 'x', 'y', 'z')
	got, err := DecodeMeta(newer)
	if err != nil {
		t.Fatalf("decode newer format: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func FuzzDecodeMeta(f *testing.F) {
	for _, m := range []Meta{
		{Role: RoleAgent},
		{Role: RoleCoordinator, AgentVersion: "v1", ProtocolVersion: "1", Labels: map[string]string{"sku": "h100", "rack": "r1"}},
	} {
		b, err := m.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMeta(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidMeta) {
				t.Fatalf("error %v does not wrap ErrInvalidMeta", err)
			}
			return
		}
		// Whatever decodes must re-encode (when small enough) to the same meta.
		again, err := m.Encode()
		if err != nil {
			return
		}
		back, err := DecodeMeta(again)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !reflect.DeepEqual(normalize(back), normalize(m)) {
			t.Fatalf("re-encode changed meta: %+v vs %+v", back, m)
		}
	})
}

// normalize treats a nil and an empty label map alike.
func normalize(m Meta) Meta {
	if len(m.Labels) == 0 {
		m.Labels = nil
	}
	return m
}
