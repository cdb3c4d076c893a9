package config

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Number is what a numeric config value is underneath: counts, sizes,
// durations, fractions.
type Number interface {
	~int | ~int32 | ~int64 | ~uint32 | ~uint64 | ~float64
}

// ErrOutOfRange wraps every error Range.Check returns.
var ErrOutOfRange = errors.New("out of range")

// Range is the closed interval [Min, Max] a numeric config value must lie
// in. Every numeric value of every config and spec has one, written in
// docs (docs/config.md, docs/coordinator-config.md): a value YAML accepts
// is not therefore one the code can live with (retention_days: 1e12 wraps
// the retention cutoff into the future and deletes every result).
type Range[T Number] struct{ Min, Max T }

// R is a Range.
func R[T Number](lo, hi T) Range[T] { return Range[T]{Min: lo, Max: hi} }

// Check returns nil when v lies in r, else an error naming the key, the
// value and the range:
//
//	retention_days 1000000000000 is out of range: must be within 1..36500
//
// NaN is never in range.
func (r Range[T]) Check(key string, v T) error {
	if v >= r.Min && v <= r.Max {
		return nil
	}
	return fmt.Errorf("%s %s is %w: must be within %s", key, Format(v), ErrOutOfRange, r)
}

// String writes the range as docs show it: "1..36500", "10ms..10m",
// "0..1".
func (r Range[T]) String() string { return Format(r.Min) + ".." + Format(r.Max) }

// Format writes a numeric config value as a config file would hold it:
// durations as durations ("10m"), floats in their shortest form.
func Format[T Number](v T) string {
	switch x := any(v).(type) {
	case time.Duration:
		return FormatDuration(x)
	case Duration:
		return FormatDuration(time.Duration(x))
	case fmt.Stringer:
		return x.String()
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Sprint(x)
		}
		if a := math.Abs(x); a != 0 && (a >= 1e15 || a < 1e-6) {
			return strconv.FormatFloat(x, 'g', -1, 64)
		}
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return fmt.Sprint(v)
}

// CheckOrZero is Check for a value whose zero means "the default": zero
// passes, anything else must lie in r.
func (r Range[T]) CheckOrZero(key string, v T) error {
	if v == 0 {
		return nil
	}
	return r.Check(key, v)
}

// NumericKeys lists the YAML keys of every numeric field of v's type
// (counts, sizes, durations, fractions), dotted from the top: "batch.delay",
// "limits.ib_counter_rise.*" for a map's values, "xid.overrides{}" for a
// map's numeric keys, "xid.ignore[]" for a list's items. Keys under a
// prefix in skip are left out (sections another package validates). Tests
// use it to hold every numeric value to a documented range.
func NumericKeys(v any, skip ...string) []string {
	var out []string
	walkNumeric(reflect.TypeOf(v), "", skip, &out, map[reflect.Type]bool{})
	sort.Strings(out)
	return out
}

func walkNumeric(t reflect.Type, prefix string, skip []string, out *[]string, seen map[reflect.Type]bool) {
	for _, s := range skip {
		if prefix != "" && (prefix == s || strings.HasPrefix(prefix, s+".")) {
			return
		}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case isNumericKind(t.Kind()):
		*out = append(*out, prefix)
		return
	case t.Kind() == reflect.Map:
		if isNumericKind(t.Key().Kind()) {
			*out = append(*out, prefix+"{}")
		}
		walkNumeric(t.Elem(), prefix+".*", skip, out, seen)
		return
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		walkNumeric(t.Elem(), prefix+"[]", skip, out, seen)
		return
	case t.Kind() != reflect.Struct || seen[t]:
		return
	}
	seen[t] = true
	defer delete(seen, t)
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		key := name
		if prefix != "" {
			key = prefix + "." + name
		}
		walkNumeric(f.Type, key, skip, out, seen)
	}
}

func isNumericKind(k reflect.Kind) bool {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return true
	}
	return false
}
