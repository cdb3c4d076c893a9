package config

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// TestNoNanosecondDurations walks the module's code for the two ways a
// duration leaks out as a bare number: a time.Duration field with a JSON
// name (encoding/json writes nanoseconds: use Duration, which writes
// "4m"), and a zerolog .Dur field whose key does not say its unit
// (zerolog writes milliseconds: the key ends in _ms).
func TestNoNanosecondDurations(t *testing.T) {
	t.Parallel()
	root := ".."
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == ".git" || n == "testdata" || n == "node_modules" || (strings.HasPrefix(n, ".") && path != root) {
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
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Field:
				if n.Tag == nil || !isTimeDuration(n.Type) {
					return true
				}
				tag, _ := strconv.Unquote(n.Tag.Value)
				if name, ok := reflect.StructTag(tag).Lookup("json"); ok && name != "-" {
					t.Errorf("%s: time.Duration field with JSON name %q is written as nanoseconds; use config.Duration",
						fset.Position(n.Pos()), name)
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || sel.Sel.Name != "Dur" || len(n.Args) != 2 {
					return true
				}
				if lit, ok := n.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if key, _ := strconv.Unquote(lit.Value); !strings.HasSuffix(key, "_ms") {
						t.Errorf("%s: log field %q holds milliseconds; name it %s_ms", fset.Position(n.Pos()), key, key)
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func isTimeDuration(e ast.Expr) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && pkg.Name == "time" && sel.Sel.Name == "Duration"
}
