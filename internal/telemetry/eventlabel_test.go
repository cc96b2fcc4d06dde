package telemetry

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestEveryEventHasItsLabel: every audit event kind this package defines
// (each Event* string constant of its source) is counted under its own
// name in credbroker_audit_events_total, not folded into "other"; an
// unknown kind is.
func TestEveryEventHasItsLabel(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(node ast.Node) bool {
			vs, ok := node.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Event") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				kind, _ := strconv.Unquote(lit.Value)
				n++
				if got := eventLabel(kind); got != kind {
					t.Errorf("%s (%q) is counted as %q", name.Name, kind, got)
				}
			}
			return true
		})
	}
	if n < 20 {
		t.Fatalf("found %d Event constants; the parse missed them", n)
	}
	if got := eventLabel("no_such_event"); got != "other" {
		t.Fatalf("an unknown kind is counted as %q, want other", got)
	}
}
