package oauthflow

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"credbroker/internal/demomcp"
	"credbroker/internal/demoprovider"
	"credbroker/vault"
)

// demoMCP starts the demo OAuth-protected MCP server with the demo
// provider as its authorization server, described as a type: mcp entry,
// as broker dev does.
func demoMCP(h *harness) (string, map[string]string) {
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	h.t.Cleanup(srv.Close)
	var err error
	h.demo, err = demoprovider.New(demoprovider.Options{BaseURL: srv.URL + "/demo", ClientID: "unused",
		RedirectURIs: []string{srv.URL + "/unused"}, Resources: []string{srv.URL + "/mcp"}})
	if err != nil {
		h.t.Fatal(err)
	}
	h.demo.Mount(mux)
	up, err := demomcp.New(demomcp.Options{URL: srv.URL + "/mcp", AuthServer: h.demo})
	if err != nil {
		h.t.Fatal(err)
	}
	up.Mount(mux)
	return `providers:
  demo-mcp:
    display_name: Demo MCP server
    type: mcp
    scope_descriptions: {notes:read: Read your notes, notes:write: Change your notes}
    mcp: {url: ` + srv.URL + `/mcp}
`, nil
}

// TestGatewayConsent: connecting a type: mcp entry shows the broker's own
// consent page first, naming the MCP server it will relay to; the broker
// registers itself at the server's authorization server and stores the
// connection; asking for more (a step-up) marks only the added scope new.
func TestGatewayConsent(t *testing.T) {
	h := newHarness(t, demoMCP)
	upstream := strings.TrimSuffix(h.demo.Issuer(), "/demo") + "/mcp"
	alice := h.newAgent()
	g := h.grant("alice", "demo-mcp", []string{"notes:read"}, "Some Host")
	p := alice.openConnect(g, "alice")
	mustStatus(t, p, http.StatusOK)
	mustContain(t, p, "MCP server", `<span class="relay">`+upstream+`</span>`, "Read your notes", "Approve")
	if strings.Contains(p.body, `class="added"`) {
		t.Fatalf("a first connect marks scopes new:\n%s", p.body)
	}
	p = alice.submit(p, "/connect/"+g.ID, url.Values{"decision": {"approve"}})
	// The demo authorization server's own consent.
	p = alice.submit(p, "authorize", url.Values{"account": {"1001"}, "decision": {"approve"}})
	mustContain(t, p, "Connected")
	conns := h.connections("alice")
	if len(conns) != 1 || conns[0].Provider != "demo-mcp" || !slices.Equal(conns[0].Scopes, []string{"notes:read"}) {
		t.Fatalf("connections %+v", conns)
	}
	var registered, resourced bool
	for _, e := range h.demo.Events() {
		registered = registered || e.Kind == "register"
		resourced = resourced || e.Resource == upstream
	}
	if !registered || !resourced {
		t.Fatalf("the broker did not register (%v) or its grant is not bound to the server (%v): %+v", registered, resourced, h.demo.Events())
	}
	// More access: only notes:write is new.
	g = h.grant("alice", "demo-mcp", []string{"notes:read", "notes:write"}, "Some Host")
	p = alice.openConnect(g, "alice")
	mustContain(t, p, `<code>notes:write</code> <strong class="added">new</strong>`)
	if strings.Contains(p.body, `<code>notes:read</code> <strong class="added">`) {
		t.Fatalf("a held scope is marked new:\n%s", p.body)
	}
	h.finalCheck()
}

// TestClientMetadataDocument: the broker's Client ID Metadata Document is
// served only at its own https URL, names every mcp entry's callback, and
// says it is a public client; elsewhere (plain http, another configured
// URL) there is none.
func TestClientMetadataDocument(t *testing.T) {
	h := newHarness(t, demoMCP)
	get := func(f *Flow) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		f.handleClientMetadata(w, httptest.NewRequest(http.MethodGet, ClientMetadataPath, nil))
		return w
	}
	flow := func(public, doc string) *Flow {
		f, err := New(context.Background(), Options{PublicURL: public, Issuer: h.idp.Issuer(), ClientID: "broker",
			ClientSecret: vault.Secret(brokerClientSecret), Connections: h.conns, CookieKeys: h.flow.opts.CookieKeys,
			Now: h.clock.Now, DevMode: strings.HasPrefix(public, "http:"), ClientMetadataURL: doc})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	w := get(flow("https://broker.example.com", "https://broker.example.com"+ClientMetadataPath))
	var doc map[string]any
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &doc) != nil {
		t.Fatalf("document: %d %s", w.Code, w.Body)
	}
	if doc["client_id"] != "https://broker.example.com"+ClientMetadataPath || doc["token_endpoint_auth_method"] != "none" ||
		strings.Join(toStrings(doc["redirect_uris"]), " ") != "https://broker.example.com/oauth/demo-mcp/callback" ||
		w.Header().Get("Cache-Control") != "public, max-age=300" {
		t.Fatalf("document %v, headers %v", doc, w.Header())
	}
	if keys := slices.Sorted(maps.Keys(doc)); !slices.Equal(keys, []string{"client_id", "client_name", "client_uri", "grant_types",
		"redirect_uris", "response_types", "token_endpoint_auth_method"}) || doc["client_name"] != "credbroker" ||
		doc["client_uri"] != "https://broker.example.com" {
		t.Fatalf("document %v", doc)
	}
	for _, f := range []*Flow{h.flow, flow("https://broker.example.com", "https://elsewhere.example.com/cimd.json")} {
		if w := get(f); w.Code != http.StatusNotFound {
			t.Fatalf("%s with document %q: %d", f.opts.PublicURL, f.opts.ClientMetadataURL, w.Code)
		}
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}
