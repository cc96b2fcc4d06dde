package testskip_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"credbroker/internal/testskip"
)

// recorder is a testing.TB that records Fatalf and Skip instead of
// stopping the test (the embedded *testing.T supplies everything else).
type recorder struct {
	*testing.T
	fatal, skip string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Fatalf(format string, args ...any) { r.fatal = fmt.Sprintf(format, args...) }
func (r *recorder) Skip(args ...any)                  { r.skip = fmt.Sprint(args...) }

func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		env                string
		wantFail, wantSkip bool
	}{
		{"", true, false},
		{"0", true, false},
		{"yes", true, false},
		{"1", false, true},
	} {
		t.Run("CREDBROKER_ALLOW_SKIP="+tc.env, func(t *testing.T) {
			t.Setenv(testskip.EnvAllow, tc.env)
			r := &recorder{T: t}
			testskip.Missing(r, "chromium", "apt-get install -y chromium")
			if got := r.fatal != ""; got != tc.wantFail {
				t.Errorf("failed = %v, want %v (%q)", got, tc.wantFail, r.fatal)
			}
			if got := r.skip != ""; got != tc.wantSkip {
				t.Errorf("skipped = %v, want %v (%q)", got, tc.wantSkip, r.skip)
			}
			for _, msg := range []string{r.fatal, r.skip} {
				if msg != "" && !strings.Contains(msg, "testskip: missing chromium: apt-get install -y chromium") {
					t.Errorf("message %q does not name what is missing and how to get it", msg)
				}
			}
			if tc.wantFail && !strings.Contains(r.fatal, "CREDBROKER_ALLOW_SKIP=1") {
				t.Errorf("failure %q does not say how to allow the skip", r.fatal)
			}
		})
	}
}

// TestNoOtherSkips keeps the policy whole: outside this package no Go file
// in the repository skips a test by itself or reads testing.Short. It reads
// every file's syntax tree (whatever its build tags), so a method value
// (`stop := t.SkipNow`), a method expression (`(*testing.T).Skip`) or a
// renamed import of testing counts as much as a call; comments and strings
// do not.
func TestNoOtherSkips(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s: %v", root, err)
	}
	self := filepath.Join(root, "internal", "testskip")
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch name := d.Name(); {
			case path == self, name == "node_modules", name == "testdata", strings.HasPrefix(name, ".") && path != root:
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		checked++
		uses, err := skipUses(token.NewFileSet(), rel, path, nil)
		if err != nil {
			t.Errorf("%v", err)
		}
		for _, u := range uses {
			t.Errorf("%s skips outside internal/testskip", u)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("only %d Go files checked under %s", checked, root)
	}
}

// skipUses parses one Go file (src, or the file at path when src is nil)
// and returns every place it names a Skip, Skipf or SkipNow method, called
// or not, whatever the receiver (a testing.T, TB or B, a value embedding
// one, or the type itself), and every use of testing's Short through any
// name the file gives the testing package, including a dot import. Each is
// "name:line:col: what".
func skipUses(fset *token.FileSet, name, path string, src any) ([]string, error) {
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, fmt.Errorf("%s: cannot parse: %w", name, err)
	}
	var uses []string
	at := func(n ast.Node, what string) {
		p := fset.Position(n.Pos())
		uses = append(uses, fmt.Sprintf("%s:%d:%d: %s", name, p.Line, p.Column, what))
	}
	testingNames := map[string]bool{}
	for _, spec := range f.Imports {
		if spec.Path.Value != `"testing"` {
			continue
		}
		switch {
		case spec.Name == nil:
			testingNames["testing"] = true
		case spec.Name.Name == ".":
			at(spec, `dot import of "testing" (Short and every other name unqualified)`)
		case spec.Name.Name != "_":
			testingNames[spec.Name.Name] = true
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		switch name := sel.Sel.Name; name {
		case "Skip", "Skipf", "SkipNow":
			at(sel, "uses "+name)
		case "Short":
			if x, ok := sel.X.(*ast.Ident); ok && testingNames[x.Name] {
				at(sel, "uses testing.Short")
			}
		}
		return true
	})
	return uses, nil
}

// TestSkipUses proves the check sees each way of reaching a skip, and no
// mention in a comment or a string.
func TestSkipUses(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		imports    string
		want       int
	}{
		{"call", `t.Skip("x")`, "", 1},
		{"Skipf", `t.Skipf("%d", 1)`, "", 1},
		{"SkipNow", `t.SkipNow()`, "", 1},
		{"method value", `stop := t.SkipNow; stop()`, "", 1},
		{"method value passed on", `defer t.Skip()`, "", 1},
		{"method value as argument", `func(f func(...any)) { f() }(t.Skip)`, "", 1},
		{"method expression", `(*testing.T).SkipNow(t)`, "", 1},
		{"interface method expression", `f := testing.TB.Skipf; f(t, "x")`, "", 1},
		{"embedded", `var s struct{ *testing.T }; s.T = t; s.Skip()`, "", 1},
		{"promoted", `var s struct{ *testing.T }; s.T = t; s.T.SkipNow()`, "", 1},
		{"Short", `if testing.Short() {}`, "", 1},
		{"Short as a value", `short := testing.Short; _ = short`, "", 1},
		{"Short renamed", `if tt.Short() {}`, `tt "testing"`, 1},
		{"dot import", `if Short() {}`, `. "testing"`, 1},
		{"comment and string", `// t.Skip("x") and testing.Short()
			t.Log("t.SkipNow() testing.Short()")`, "", 0},
		{"another package's Short", `_ = strings.Short`, "\"strings\"\n\t\"testing\"", 0},
		{"a field named Skipped", `_ = t.Skipped()`, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Only the syntax is read, so the snippets need not type-check.
			imports := tc.imports
			if imports == "" {
				imports = `"testing"`
			}
			src := "package x\n\nimport (\n\t" + imports + "\n)\n\nfunc TestX(t *testing.T) {\n\t" + tc.body + "\n}\n"
			uses, err := skipUses(token.NewFileSet(), "x_test.go", "x_test.go", src)
			if err != nil {
				t.Fatalf("%v\n%s", err, src)
			}
			if len(uses) != tc.want {
				t.Errorf("found %q, want %d use(s) in:\n%s", uses, tc.want, src)
			}
		})
	}
	if _, err := skipUses(token.NewFileSet(), "bad.go", "bad.go", "package x\nfunc {"); err == nil {
		t.Error("a file that does not parse was accepted")
	}
}
