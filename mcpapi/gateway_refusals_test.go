package mcpapi

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"credbroker/connections"
	"credbroker/internal/egress"
	"credbroker/internal/telemetry"
	"credbroker/provider"
)

// interceptor is a testUpstream's misbehaviour (its intercept).
type interceptor = func(u *testUpstream) func(w http.ResponseWriter, r *http.Request, next http.Handler)

// at answers the requests whose path starts with prefix with answer, and
// the others as usual.
func at(prefix string, answer func(u *testUpstream, w http.ResponseWriter, r *http.Request, next http.Handler)) interceptor {
	return func(u *testUpstream) func(http.ResponseWriter, *http.Request, http.Handler) {
		return func(w http.ResponseWriter, r *http.Request, next http.Handler) {
			if !strings.HasPrefix(r.URL.Path, prefix) {
				next.ServeHTTP(w, r)
				return
			}
			answer(u, w, r, next)
		}
	}
}

// editing answers path's JSON document with its members changed by edit.
func editing(path string, edit func(u *testUpstream, doc map[string]any)) interceptor {
	return at(path, func(u *testUpstream, w http.ResponseWriter, r *http.Request, next http.Handler) {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		var doc map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
			http.Error(w, "not JSON", http.StatusInternalServerError)
			return
		}
		edit(u, doc)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(doc)
	})
}

const (
	pathPRM = "/.well-known/oauth-protected-resource/mcp"
	pathASM = "/.well-known/oauth-authorization-server"
)

// TestGatewayUpstreamRefusals: when the broker cannot use an upstream
// server's authorization, the call that would have asked the person to
// connect is a tool error naming the server, what is wrong and the fix,
// with no connect link, and an upstream_error audit event whose outcome
// is the kind: protected-resource metadata for another resource, an
// authorization server whose metadata names another issuer or lacks S256,
// a server on a private address (no --upstream-allow-private), metadata
// answered with a redirect to another host, no way to register, and a
// dynamic registration that fails (then is not tried again within a
// minute; after it, it is, and the person gets the link).
func TestGatewayUpstreamRefusals(t *testing.T) {
	for _, c := range []struct {
		name      string
		intercept interceptor
		private   bool // the egress policy refuses loopback
		kind      string
		says      string
	}{
		{name: "resource metadata for another resource", kind: provider.UpstreamResourceMismatch,
			intercept: editing(pathPRM, func(u *testUpstream, doc map[string]any) { doc["resource"] = u.url() + "/v2" }),
			says:      `names the resource "%URL%/v2", not mcp.url "%URL%"; set mcp.url to the server's canonical URL`},
		{name: "another issuer", kind: provider.UpstreamIssuerMismatch,
			intercept: editing(pathASM, func(u *testUpstream, doc map[string]any) { doc["issuer"] = u.srv.URL + "/" }),
			says:      `metadata names issuer "%AS%/", not "%AS%" (RFC 8414 wants them identical); the server's operator must make them equal`},
		{name: "no S256", kind: provider.UpstreamNoS256,
			intercept: editing(pathASM, func(u *testUpstream, doc map[string]any) { doc["code_challenge_methods_supported"] = []string{"plain"} }),
			says:      "does not support PKCE with S256, which the broker requires; the server's operator must enable it"},
		{name: "a private address", kind: provider.UpstreamPrivateAddress, private: true,
			says: "127.0.0.1 is loopback (RFC 1122): start the broker with --upstream-allow-private to reach servers on private addresses"},
		{name: "a redirect to another host", kind: provider.UpstreamRedirect,
			intercept: at("/.well-known/oauth-protected-resource", func(_ *testUpstream, w http.ResponseWriter, r *http.Request, _ http.Handler) {
				http.Redirect(w, r, "https://elsewhere.example.com/prm", http.StatusFound)
			}),
			says: "answered with a redirect (HTTP 302), which the broker does not follow; set mcp.url to the server's canonical URL"},
		{name: "no way to register", kind: provider.UpstreamNoRegistration,
			intercept: editing(pathASM, func(_ *testUpstream, doc map[string]any) { delete(doc, "registration_endpoint") }),
			says:      "offers no way to register (no pre-registered client_id, no Client ID Metadata Documents, no dynamic registration): register the broker there and set client_id"},
		{name: "dynamic registration failing", kind: provider.UpstreamRegistrationFailed,
			intercept: at("/register", func(_ *testUpstream, w http.ResponseWriter, _ *http.Request, _ http.Handler) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusInternalServerError)
				w.Write([]byte(`{"error":"server_error"}`))
			}),
			says: "dynamic registration at its authorization server failed ("},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newGatewayHarness(t)
			client := g.client
			if c.private {
				strict, err := egress.New(egress.Options{AllowLoopbackHTTP: true})
				if err != nil {
					t.Fatal(err)
				}
				if client, err = provider.New(provider.Options{Store: g.store, Providers: g.conns.Providers(), Now: g.clock.Now,
					Logger: slog.New(slog.NewJSONHandler(g.logs, nil)), UpstreamHTTPClient: strict}); err != nil {
					t.Fatal(err)
				}
			}
			g.withAudit(client)
			if c.intercept != nil {
				g.up.mu.Lock()
				g.up.intercept = c.intercept(g.up)
				g.up.mu.Unlock()
			}
			says := strings.NewReplacer("%URL%", g.up.url(), "%AS%", g.up.srv.URL).Replace(c.says)
			refused := func(kind, says string) {
				t.Helper()
				before := strings.Count(g.logs.String(), `"event":"upstream_error"`)
				d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
				if d.Result["isError"] != true || !strings.HasPrefix(textOf(d), "Upstream: ") || !strings.Contains(textOf(d), says) || d.Result["inputRequests"] != nil {
					t.Fatalf("the call answered %+v %+v\n want a tool error saying %q", d.Result, d.Error, says)
				}
				events := auditEvents(t, g.logs.String(), telemetry.EventUpstreamError)
				if len(events) != before+1 {
					t.Fatalf("%d upstream_error audit events, want %d", len(events), before+1)
				}
				e := events[len(events)-1]
				if e["outcome"] != kind || e["provider"] != "up" || e["via"] != "mcp" || !strings.Contains(e["err"].(string), says) {
					t.Fatalf("audit event %v, want outcome %s", e, kind)
				}
				if p := e["principal"].(map[string]any); p["sub"] != "alice" {
					t.Fatalf("audit event for %v", p)
				}
			}
			refused(c.kind, says)
			if c.kind != provider.UpstreamRegistrationFailed {
				return
			}
			// Within the minute: not tried again, and said so.
			g.clock.Advance(30 * time.Second)
			refused(provider.UpstreamRegistrationBackoff, "dynamic registration failed a moment ago; try again in a minute")
			g.up.mu.Lock()
			g.up.intercept = nil
			g.up.mu.Unlock()
			g.clock.Advance(31 * time.Second)
			d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
			if _, link, _ := elicitation(t, d); link == "" {
				t.Fatalf("after the minute: %+v", d)
			}
		})
	}
}

// auditEvents returns the audit events of kind in a JSON log.
func auditEvents(t *testing.T, logs, kind string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `"audit":true`) {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if e["event"] == kind {
			out = append(out, e)
		}
	}
	return out
}

// TestGatewayStateOfReplacedConnection: an upstream's question wrapped in
// gateway state is bound to the connection that asked it. After the person
// disconnects and connects again (another connection, new tokens), the
// retry carrying the old state gets the one -32602 "Invalid or expired
// requestState", and nothing reaches the upstream; a fresh call asks again.
func TestGatewayStateOfReplacedConnection(t *testing.T) {
	g, old := connectedGateway(t, "tools")
	caps := `{"elicitation":{"form":{},"url":{}}}`
	d := g.gwCall("alice", caps, "tools/call", "ask", map[string]any{"arguments": map[string]any{}})
	if d.Result["resultType"] != "input_required" {
		t.Fatalf("ask = %+v", d)
	}
	state := d.Result["requestState"].(string)
	answer := map[string]any{"colour": map[string]any{"action": "accept", "content": map[string]any{"colour": "blue"}}}

	// Replaced: the old connection is gone, a new one is made.
	if _, err := g.conns.DisconnectID(context.Background(), connections.Request{Principal: g.principal("alice"), Provider: "up", Via: "mcp"}, old.ID); err != nil {
		t.Fatal(err)
	}
	d = g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
	_, link, _ := elicitation(t, d)
	if repl := g.connectUp(grantIDOf(t, link), "tools"); repl.ID == old.ID {
		t.Fatalf("the connection was not replaced: %s", repl.ID)
	}
	calls := func() int {
		g.up.mu.Lock()
		defer g.up.mu.Unlock()
		return g.up.methods["tools/call"]
	}
	before := calls()
	d = g.gwCall("alice", caps, "tools/call", "ask", map[string]any{"arguments": map[string]any{}, "requestState": state, "inputResponses": answer})
	if d.Error == nil || d.Error.Code != codeInvalidParams || d.Error.Message != invalidState || d.Result != nil {
		t.Fatalf("the old state after a replaced connection: %+v %+v", d.Result, d.Error)
	}
	if calls() != before {
		t.Fatalf("the refused retry reached the upstream (%d calls, %d before)", calls(), before)
	}
	// The same call without the old state asks the upstream's question again.
	if d := g.gwCall("alice", caps, "tools/call", "ask", map[string]any{"arguments": map[string]any{}}); d.Result["resultType"] != "input_required" {
		t.Fatalf("ask on the new connection = %+v", d)
	}
}
