package sidecar_test

import (
	"os"
	"regexp"
	"slices"
	"testing"

	"go.yaml.in/yaml/v3"

	"credbroker/connections"
	"credbroker/sidecar/sidecartest"
)

// TestSpecListsEveryErrorCode: every error code this package can answer
// (its own, and every connections.Code its failed() relays; including
// those no test provokes, such as internal) is in the document's ErrorCode
// enum, and the enum lists nothing the package never answers. Every answer the tests do provoke is checked against the
// document by sidecartest.Contract.
func TestSpecListsEveryErrorCode(t *testing.T) {
	src, err := os.ReadFile("sidecar.go")
	if err != nil {
		t.Fatal(err)
	}
	var used []string
	for _, m := range regexp.MustCompile(`writeError\(w, http\.Status\w+, "([a-z_]+)"`).FindAllSubmatch(src, -1) {
		if c := string(m[1]); !slices.Contains(used, c) {
			used = append(used, c)
		}
	}
	if len(used) < 5 {
		t.Fatalf("found only %d error codes in sidecar.go; the pattern is broken", len(used))
	}
	for _, c := range connections.Codes() {
		if !slices.Contains(used, string(c)) {
			used = append(used, string(c))
		}
	}
	b, err := os.ReadFile(sidecartest.SpecPath())
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Schemas struct {
				ErrorCode struct {
					Enum []string `yaml:"enum"`
				} `yaml:"ErrorCode"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	listed := doc.Components.Schemas.ErrorCode.Enum
	for _, c := range used {
		if !slices.Contains(listed, c) {
			t.Errorf("sidecar.go answers %q, which docs/sidecar.openapi.yaml does not list", c)
		}
	}
	for _, c := range listed {
		if !slices.Contains(used, c) {
			t.Errorf("docs/sidecar.openapi.yaml lists %q, which sidecar.go never answers", c)
		}
	}
}
