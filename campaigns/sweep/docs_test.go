package sweep

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// specKeys lists the spec's JSON keys as dotted paths ("budget.max_share").
func specKeys(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		out = append(out, prefix+name)
		if f.Type.Kind() == reflect.Struct && f.Type.PkgPath() == t.PkgPath() {
			out = append(out, specKeys(f.Type, prefix+name+".")...)
		}
	}
	return out
}

// TestSpecReference: docs/sweep.md names every key of the spec, and
// examples/sweep.yaml sets every leaf key.
func TestSpecReference(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/sweep.md")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := os.ReadFile("../../examples/sweep.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := ParseSpec(ex)
	if err != nil {
		t.Fatalf("examples/sweep.yaml: %v", err)
	}
	if spec.Selector != "sku=h100-sxm-8" || !spec.Drain || spec.Budget.MaxShare != 0.25 {
		t.Errorf("examples/sweep.yaml not read whole: %+v", spec)
	}
	keys := specKeys(reflect.TypeOf(Spec{}), "")
	if len(keys) < 18 {
		t.Fatalf("only %d keys: %v", len(keys), keys)
	}
	for _, k := range keys {
		if !strings.Contains(string(doc), "`"+k+"`") {
			t.Errorf("docs/sweep.md does not document `%s`", k)
		}
		leaf := k[strings.LastIndexByte(k, '.')+1:]
		if !strings.Contains(string(ex), leaf+":") {
			t.Errorf("examples/sweep.yaml does not set %s", k)
		}
	}
}
