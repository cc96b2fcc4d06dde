package provider

import (
	"errors"
	"testing"
)

// TestEnterpriseCatalog: mcp.auth enterprise is an mcp entry that
// connects by assertion first (and keeps its code flow), with a static
// client or a metadata document; a catalogue with one needs people's IdP
// sessions, one without does not.
func TestEnterpriseCatalog(t *testing.T) {
	reg, err := ParseProviders("p.yaml", []byte(`providers:
  hr:
    type: mcp
    mcp: {url: "https://mcp.hr.example/mcp", auth: enterprise}
    client_id: broker-at-hr
    client_secret: ${HR_SECRET}
    default_scopes: [read]
  wiki:
    type: mcp
    mcp: {url: "https://wiki.example/mcp", auth: enterprise, registration: cimd}
`), env(map[string]string{"HR_SECRET": "s"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"hr", "wiki"} {
		p, _ := reg.Lookup(name)
		m, ok := p.Kind.(*MCP)
		if !ok || !m.Enterprise || !m.assertionEnabled() {
			t.Fatalf("%s = %T %+v, want an enterprise mcp entry", name, p.Kind, p.Kind)
		}
		if _, ok := p.Kind.(RedirectStep); !ok {
			t.Errorf("%s lost its browser step (the fallback)", name)
		}
	}
	if !reg.NeedsIdPSessions() {
		t.Error("a catalogue with enterprise entries needs no IdP sessions")
	}
	plain, err := ParseProviders("p.yaml", []byte(goodMCP), env(map[string]string{"LINEAR_ID": "i", "LINEAR_SECRET": "s"}))
	if err != nil {
		t.Fatal(err)
	}
	if plain.NeedsIdPSessions() {
		t.Error("a catalogue without enterprise entries asks for IdP sessions")
	}
}

// TestEnterpriseCatalogProblems: an enterprise entry's problems, each at
// its line: dynamic registration (the IdP cannot name the broker's client
// there), and the auth values are spelled exactly.
func TestEnterpriseCatalogProblems(t *testing.T) {
	doc := `providers:
  dcr:
    type: mcp
    mcp:
      url: https://mcp.example.com/mcp
      auth: enterprise
      registration: dcr
  cased:
    type: mcp
    mcp: {url: "https://mcp.example.com/mcp", auth: Enterprise}
`
	_, err := ParseProviders("p.yaml", []byte(doc), env(nil))
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *ConfigError", err)
	}
	wantProblems(t, ce, []string{
		`p.yaml:7: dcr: mcp.registration dcr cannot be used with mcp.auth enterprise: the IdP must name the broker's client id at the server in each ID-JAG, and a dynamically registered id is known to the broker only; use static (client_id) or cimd`,
		`p.yaml:10: cased: mcp.auth "Enterprise": want oauth, enterprise or none`,
	})
}
