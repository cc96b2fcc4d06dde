package credbroker_test

import (
	"go/build"
	"io/fs"
	"path/filepath"
	"slices"
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
		"connections": append([]string{"cmd"}, frontDoors...),
		"provider":    append([]string{"cmd", "connections"}, frontDoors...),
		"binding":     append([]string{"cmd", "connections", "provider"}, frontDoors...),
		"vault":       append([]string{"cmd", "connections", "provider", "binding"}, frontDoors...),
		"internal":    append([]string{"cmd", "connections", "provider"}, frontDoors...),
		"webhook":     append([]string{"cmd", "connections", "provider", "binding"}, frontDoors...),
		"web":         append([]string{"cmd", "connections", "provider", "binding", "vault"}, frontDoors...),
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
// those of cmd/, which wires everything.
func TestImportArrows(t *testing.T) {
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
	checked := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "data") {
			return filepath.SkipDir
		}
		pkg, err := build.ImportDir(path, build.ImportComment)
		if err != nil {
			return nil // no Go files here
		}
		rel := filepath.ToSlash(path)
		var top string
		for k := range rules {
			if rel == k || strings.HasPrefix(rel, k+"/") {
				top = k
			}
		}
		if top == "" {
			return nil
		}
		checked++
		imports := slices.Concat(pkg.Imports, pkg.TestImports, pkg.XTestImports)
		for _, imp := range imports {
			for _, bad := range rules[top] {
				// A package's own subpackages (sidecar/client under sidecar) are fine.
				if under(imp, bad) && !under(imp, top) {
					t.Errorf("%s imports %s: %s must never import %s (docs/ARCHITECTURE.md)", rel, imp, top, bad)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 15 {
		t.Fatalf("checked only %d packages; the walk is broken", checked)
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
