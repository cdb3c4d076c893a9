package config

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// zerologKeyed are the zerolog Event and Context methods whose first
// argument is a field key and that take exactly two arguments (cobra's
// flag methods of the same names take three or more, so they are not
// mistaken for log fields).
var zerologKeyed = map[string]bool{
	"Str": true, "Strs": true, "Stringer": true, "Stringers": true, "Bytes": true, "Hex": true,
	"RawJSON": true, "AnErr": true, "Errs": true, "Bool": true, "Bools": true,
	"Int": true, "Ints": true, "Int8": true, "Int16": true, "Int32": true, "Int64": true,
	"Uint": true, "Uints": true, "Uint8": true, "Uint16": true, "Uint32": true, "Uint64": true,
	"Float32": true, "Float64": true, "Floats64": true, "Time": true, "Times": true,
	"Dur": true, "Durs": true, "Interface": true, "Any": true, "Dict": true, "Array": true,
	"Object": true, "IPAddr": true, "IPPrefix": true, "MACAddr": true, "Type": true,
}

var snakeKey = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// A number logged under a key naming a time span says its unit in the
// key, as .Dur fields do (took_ms); a duration logged as text ("4m")
// carries its own.
var (
	spanWord   = regexp.MustCompile(`(^|_)(timeout|interval|elapsed|took|duration|latency|grace|backoff|delay|wait|age)(_|$)`)
	unitSuffix = regexp.MustCompile(`_(ns|us|ms|s|min|h)$`)
)

func isNumber(method string) bool {
	return strings.HasPrefix(method, "Int") || strings.HasPrefix(method, "Uint") || strings.HasPrefix(method, "Float")
}

// unstableKeys are names that the same thing was logged under somewhere,
// mapped to the one key agent and coordinator logs use for it, so a
// search for work_id finds a piece of work on both sides.
var unstableKeys = map[string]string{
	"id":          "a key that says whose id (work_id, result_id, campaign, action_id, op_id)",
	"work":        "work_id",
	"result":      "result_id",
	"drill":       "campaign",
	"campaign_id": "campaign",
	"node_id":     "node",
	"node_name":   "node",
	"err":         ".Err(err)",
}

// TestLogKeysStable walks the module's code for zerolog fields whose key
// breaks the logging contract: keys are snake_case, one name per thing
// (work_id, result_id, node, campaign), and an error goes through
// .Err(err), never .Str("error", err.Error()).
func TestLogKeysStable(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == "testdata" || n == "node_modules" || (strings.HasPrefix(n, ".") && path != root) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, p := range logKeyProblems(f) {
			checked++
			if p.why != "" {
				t.Errorf("%s: %s", fset.Position(p.pos), p.why)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk must have seen the module's log calls: a wrong root would
	// pass with nothing checked.
	if checked < 50 {
		t.Fatalf("only %d zerolog fields found under %s: the walk is not reading the module", checked, root)
	}
}

type logKeyProblem struct {
	pos token.Pos
	why string // empty: the field was looked at and is fine
}

// logKeyProblems returns one entry per zerolog field in f.
func logKeyProblems(f *ast.File) []logKeyProblem {
	var out []logKeyProblem
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !zerologKeyed[sel.Sel.Name] || len(call.Args) != 2 {
			return true
		}
		lit, ok := call.Args[0].(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return true
		}
		key, err := strconv.Unquote(lit.Value)
		if err != nil {
			return true
		}
		p := logKeyProblem{pos: sel.Sel.Pos()} // a chain's calls all start where the chain does
		switch {
		case !snakeKey.MatchString(key):
			p.why = "log key " + strconv.Quote(key) + " is not snake_case"
		case unstableKeys[key] != "":
			p.why = "log key " + strconv.Quote(key) + ": use " + unstableKeys[key]
		case key == "error" && sel.Sel.Name == "Str" && isErrorCall(call.Args[1]):
			p.why = `.Str("error", err.Error()): use .Err(err)`
		case isNumber(sel.Sel.Name) && spanWord.MatchString(key) && !unitSuffix.MatchString(key):
			p.why = "log key " + strconv.Quote(key) + " holds a time span as a number: name its unit (" + key + "_ms)"
		}
		out = append(out, p)
		return true
	})
	// Inspect meets a chain's last call first; report in source order.
	sort.Slice(out, func(i, j int) bool { return out[i].pos < out[j].pos })
	return out
}

// isErrorCall reports whether e is x.Error().
func isErrorCall(e ast.Expr) bool {
	c, ok := e.(*ast.CallExpr)
	if !ok || len(c.Args) != 0 {
		return false
	}
	s, ok := c.Fun.(*ast.SelectorExpr)
	return ok && s.Sel.Name == "Error"
}

// moduleRoot is the directory holding go.mod, found from this package's
// directory upwards, so the walk covers the module wherever the package
// sits in the tree.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

func TestLogKeyProblems(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src string
		want      []string // the problems, in order; "" for a fine field
	}{
		{"snake keys pass", `log.Info().Str("work_id", id).Dur("took_ms", d).Msg("x")`, []string{"", ""}},
		{"camelCase key", `log.Info().Str("workID", id).Msg("x")`, []string{`log key "workID" is not snake_case`}},
		{"dashed key", `log.With().Int("max-bytes", n).Logger()`, []string{`log key "max-bytes" is not snake_case`}},
		{"synonym", `log.Info().Str("work", id).Str("result", r).Msg("x")`,
			[]string{`log key "work": use work_id`, `log key "result": use result_id`}},
		{"error text", `log.Warn().Str("error", err.Error()).Msg("x")`, []string{`.Str("error", err.Error()): use .Err(err)`}},
		{"stored error string", `log.Warn().Str("error", t.Error).Msg("x")`, []string{""}},
		{"span without unit", `log.Info().Int64("timeout", n).Float64("duration_s", d).Str("grace", g.String()).Msg("x")`,
			[]string{`log key "timeout" holds a time span as a number: name its unit (timeout_ms)`, "", ""}},
		{"cobra flag is no log field", `cmd.Flags().Int("maxBytes", 0, "usage")`, nil},
		{"key from a variable", `log.Info().Str(k, v).Msg("x")`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, err := parser.ParseFile(token.NewFileSet(), "x.go", "package x\nfunc f() {\n"+tc.src+"\n}\n", 0)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range logKeyProblems(f) {
				got = append(got, p.why)
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") || len(got) != len(tc.want) {
				t.Errorf("problems = %q, want %q", got, tc.want)
			}
		})
	}
}
