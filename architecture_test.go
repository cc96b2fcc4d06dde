package credbroker_test

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The layers of docs/ARCHITECTURE.md, from the top. Front doors translate;
// connections decides; provider talks outward; binding and vault keep
// state. A package may import only from its own layer's allowance below.
var (
	frontDoors = []string{"mcpapi", "sidecar", "oauthflow", "authserver", "adminapi"}
	// forbidden maps a package (and its subpackages) to what it must never
	// import (and their subpackages).
	forbidden = map[string][]string{
		// apps is the authorization server's core, beside connections:
		// neither imports the other.
		"connections": append([]string{"cmd", "apps"}, frontDoors...),
		"apps":        append([]string{"cmd", "connections", "provider", "binding"}, frontDoors...),
		"provider":    append([]string{"cmd", "connections", "apps"}, frontDoors...),
		"binding":     append([]string{"cmd", "connections", "apps", "provider"}, frontDoors...),
		"vault":       append([]string{"cmd", "connections", "apps", "provider", "binding"}, frontDoors...),
		"internal":    append([]string{"cmd", "connections", "apps", "provider"}, frontDoors...),
		"webhook":     append([]string{"cmd", "connections", "apps", "provider", "binding"}, frontDoors...),
		"web":         append([]string{"cmd", "connections", "apps", "provider", "binding", "vault"}, frontDoors...),
	}
)

const module = "credbroker"

// under reports whether import path p is package top or one of its
// subpackages.
func under(p, top string) bool {
	return p == module+"/"+top || strings.HasPrefix(p, module+"/"+top+"/")
}

// TestImportArrows fails when a package imports across the architecture's
// arrows: a front door importing another front door, or a lower layer
// (connections, provider, binding, vault, internal pieces) importing one
// above it. Test files count too, except the repository-wide ones and
// those of cmd/, which wires everything; so do files behind build tags
// (every Go file is read, whatever its tags), and a Go file that does not
// parse fails the test rather than hiding its imports.
func TestImportArrows(t *testing.T) {
	problems, checked, err := arrowProblems(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if checked < 15 {
		t.Fatalf("checked only %d packages; the walk is broken", checked)
	}
}

// arrowRules maps each top-level directory under the arrows to what it
// must never import.
func arrowRules() map[string][]string {
	rules := map[string][]string{}
	for _, fd := range frontDoors {
		for _, other := range frontDoors {
			if other != fd {
				rules[fd] = append(rules[fd], other)
			}
		}
		rules[fd] = append(rules[fd], "cmd")
	}
	for k, v := range forbidden {
		rules[k] = v
	}
	// The browser door asks connections about connect requests; it never
	// advances them itself.
	rules["oauthflow"] = append(rules["oauthflow"], "binding")
	return rules
}

// arrowProblems walks the module rooted at root and returns every import
// across the arrows and every Go file it could not read or parse, with the
// number of package directories it checked. A directory without Go files
// is not a package and is passed over; build constraints are ignored, so
// a file behind a tag (or one no build would ever select) counts as well.
func arrowProblems(root string) (problems []string, checked int, err error) {
	rules := arrowRules()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "data") {
			return filepath.SkipDir
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		var top string
		for k := range rules {
			if rel == k || strings.HasPrefix(rel, k+"/") {
				top = k
			}
		}
		if top == "" {
			return nil
		}
		files, err := filepath.Glob(filepath.Join(path, "*.go"))
		if err != nil {
			return err
		}
		if len(files) == 0 {
			return nil // no Go files: not a package
		}
		checked++
		fset := token.NewFileSet()
		for _, file := range files {
			f, err := parser.ParseFile(fset, file, nil, parser.ImportsOnly)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: cannot read its imports: %v", filepath.ToSlash(file), err))
				continue
			}
			for _, spec := range f.Imports {
				imp, err := strconv.Unquote(spec.Path.Value)
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s: import path %s: %v", filepath.ToSlash(file), spec.Path.Value, err))
					continue
				}
				for _, bad := range rules[top] {
					// A package's own subpackages (sidecar/client under sidecar) are fine.
					if under(imp, bad) && !under(imp, top) {
						base := filepath.Base(file)
						problems = append(problems, fmt.Sprintf("%s/%s imports %s: %s must never import %s (docs/ARCHITECTURE.md)", rel, base, imp, top, bad))
					}
				}
			}
		}
		return nil
	})
	return problems, checked, err
}

// TestImportArrowsReadsEveryFile proves the walk sees what a build would
// leave out: an import behind a build tag, and one in a file no build
// would select, both count; a file that does not parse is reported, not
// passed over; a directory with no Go files is not a package.
func TestImportArrowsReadsEveryFile(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"connections/connections.go": "package connections\n",
		"connections/linux_only.go":  "//go:build linux && never\n\npackage connections\n\nimport _ \"credbroker/mcpapi\"\n",
		"vault/gen.go":               "//go:build ignore\n\npackage main\n\nimport _ \"credbroker/provider\"\n",
		"vault/vault.go":             "package vault\n",
		"binding/broken.go":          "package binding\n\nimport \"credbroker/vault\n",
		"web/static/README.md":       "no Go here\n",
		"sidecar/ok.go":              "package sidecar\n\nimport _ \"credbroker/sidecar/client\"\n",
	}
	for name, content := range files {
		path := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	problems, checked, err := arrowProblems(root)
	if err != nil {
		t.Fatal(err)
	}
	if checked != 4 {
		t.Errorf("checked %d packages, want 4 (connections, vault, binding, sidecar; web/static has no Go files)", checked)
	}
	want := []string{
		"connections/linux_only.go imports credbroker/mcpapi",
		"vault/gen.go imports credbroker/provider",
		"binding/broken.go: cannot read its imports",
	}
	for _, w := range want {
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, w) }) {
			t.Errorf("no problem reported for %q; got %q", w, problems)
		}
	}
	if len(problems) != len(want) {
		t.Errorf("got %d problems, want %d: %q", len(problems), len(want), problems)
	}
}

// TestImportArrowsCatchesViolations proves the check sees a forbidden
// arrow: the rules, applied to a made-up import of each front door by
// another, all refuse.
func TestImportArrowsCatchesViolations(t *testing.T) {
	for _, fd := range frontDoors {
		for _, other := range frontDoors {
			if fd == other {
				continue
			}
			if !under(module+"/"+other+"/sub", other) {
				t.Fatalf("under(%s/sub, %s) is false", other, other)
			}
		}
	}
	for k, bads := range forbidden {
		for _, bad := range bads {
			if !under(module+"/"+bad, bad) || under(module+"/"+bad, k) {
				t.Fatalf("rule %s ↛ %s cannot fire", k, bad)
			}
		}
	}
}
