package mcpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"credbroker/connections"
	"credbroker/internal/echoapi"
	"credbroker/internal/telemetry"
	"credbroker/internal/tracing"
	"credbroker/provider"
	"credbroker/vault"
)

// The connection's first tokens carry characters JSON, URLs and HTML
// escape, so that each escaped form differs from the token itself.
const (
	passAccess  = "up/ACCESS+tok=en<&>-0123456789"
	passRefresh = "up/REFRESH+tok=en<&>-9876543210"
)

// TestGatewayNoTokenPassthrough: issue 31's first invariant, end to end.
// The upstream's echo_headers tool answers the headers it received
// (Authorization included) in every encoding echoapi knows, URL-escaped
// and inside JSON (which escapes them again), with every refresh token the
// upstream issued, in its result and in a progress notification;
// echo_fail says the same in a JSON-RPC error. Both are called through
// the gateway by a 2026-07-28 host (a JSON answer and an event stream)
// and a 2025-11-25 host, before and after a forced refresh gave the
// connection new tokens. No form of any access or refresh token the
// upstream issued is in any byte a host got (bodies, events, headers), in
// the broker's log (mcpapi, connections, provider, the upstream client),
// its audit events or its spans; and the upstream never got the host's
// Authorization, cookie or session id.
func TestGatewayNoTokenPassthrough(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	g := newGatewayHarness(t, func(o *Options) { o.Tracing = tracing.NewSyncProvider(mem) })
	g.up.addLeakyTools()
	g.withAudit(g.client)

	// Alice connects; the connection holds the escapable tokens.
	d := g.gwCall("alice", urlCaps, "tools/call", "echo_headers", map[string]any{"arguments": map[string]any{}})
	_, link, _ := elicitation(t, d)
	gr, err := g.grants.Authorize(context.Background(), grantIDOf(t, link), g.principal("alice"))
	if err != nil {
		t.Fatal(err)
	}
	g.up.mu.Lock()
	g.up.tokens[passAccess], g.up.refresh[passRefresh] = []string{"tools"}, []string{"tools"}
	g.up.mu.Unlock()
	p, _ := g.conns.Providers().Lookup("up")
	conn, err := g.conns.Save(context.Background(), g.principal("alice"), gr, p, provider.Exchanged{Account: provider.Account{ID: "up-alice", Login: "alice@up"},
		Scopes: []string{"tools"}, Token: vault.TokenSet{AccessToken: passAccess, RefreshToken: passRefresh, TokenType: "Bearer", Expiry: g.clock.Now().Add(time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}

	// seen is every byte a host got: status line, headers and body.
	var seen bytes.Buffer
	keep := func(what string, status int, h http.Header, body []byte) {
		fmt.Fprintf(&seen, "== %s: %d %v\n%s\n", what, status, h, body)
	}
	hostHeaders := func(method, name string) map[string]string {
		hd := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization": "Bearer " + g.gwBearer("alice"), "MCP-Protocol-Version": versionModern, "Mcp-Method": method,
			"Cookie": "host_session=host-cookie-value", "Mcp-Session-Id": "host-session-id"}
		if name != "" {
			hd["Mcp-Name"] = name
		}
		return hd
	}
	modern := func(tool string, progress bool) rawResult {
		params := map[string]any{"name": tool, "arguments": map[string]any{}}
		body := modernBody(7, "tools/call", urlCaps, params)
		if progress {
			body = strings.Replace(body, `"_meta":{`, `"_meta":{"progressToken":"host-progress",`, 1)
		}
		r := g.do(rawCall{path: "/mcp/u/up", headers: hostHeaders("tools/call", tool), body: body})
		keep(fmt.Sprintf("modern %s (progress %v)", tool, progress), r.status, r.header, r.body)
		return r
	}
	// The legacy host: initialize, then calls in its session.
	legacyHeaders := func(session string) map[string]string {
		return map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization": "Bearer " + g.gwBearer("alice"), "MCP-Protocol-Version": versionLegacy, "Mcp-Session-Id": session,
			"Cookie": "host_session=host-cookie-value"}
	}
	init := g.do(rawCall{path: "/mcp/u/up", headers: legacyHeaders(""), body: `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"elicitation":{"url":{}}},"clientInfo":{"name":"legacy-host","version":"1"}}}`})
	keep("legacy initialize", init.status, init.header, init.body)
	session := init.header.Get("Mcp-Session-Id")
	if session == "" {
		t.Fatalf("initialize: no session id: %d %s", init.status, init.body)
	}
	legacy := func(tool string) rawResult {
		r := g.do(rawCall{path: "/mcp/u/up", headers: legacyHeaders(session),
			body: `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"` + tool + `","arguments":{}}}`})
		keep("legacy "+tool, r.status, r.header, r.body)
		return r
	}
	round := func(label string) {
		t.Helper()
		if r := modern("echo_headers", false); !strings.Contains(textOf(decode(t, r.body)), "hex-upper: ") {
			t.Fatalf("%s: echo_headers answered %d %s", label, r.status, r.body)
		}
		r := modern("echo_headers", true)
		progress := 0
		for sc := bufio.NewScanner(bytes.NewReader(r.body)); sc.Scan(); {
			if strings.Contains(sc.Text(), `"notifications/progress"`) {
				progress++
			}
		}
		if progress != 1 {
			t.Fatalf("%s: %d progress events in %s", label, progress, r.body)
		}
		if r := modern("echo_fail", false); !strings.Contains(string(r.body), "refused: ") {
			t.Fatalf("%s: echo_fail answered %d %s", label, r.status, r.body)
		}
		if r := legacy("echo_headers"); !strings.Contains(string(r.body), "hex-upper: ") {
			t.Fatalf("%s: legacy echo_headers answered %d %s", label, r.status, r.body)
		}
		legacy("echo_fail")
	}
	round("first tokens")
	// The upstream stops taking the access token: one forced refresh
	// (the refresh token goes to its token endpoint), new tokens, and the
	// echoes again.
	g.up.revoke(passAccess)
	round("after a forced refresh")
	if c, _ := g.store.GetConnection(context.Background(), conn.ID); c.Token.AccessToken.Reveal() == passAccess {
		t.Fatal("the access token was not refreshed")
	}

	// Every token the upstream issued, in every form, nowhere.
	var spans strings.Builder
	for _, s := range mem.GetSpans() {
		fmt.Fprintf(&spans, "%s %v %v %v %v\n", s.Name, s.Attributes, s.Events, s.Status, s.Links)
	}
	tokens := append(g.up.issued(), passAccess, passRefresh)
	for what, text := range map[string]string{"a host's answers": seen.String(), "the broker's log and audit events": g.logs.String(), "the spans": spans.String()} {
		for _, tok := range tokens {
			if l := tokenLeaks(text, tok); len(l) > 0 {
				t.Errorf("%s hold token %q as %v", what, tok, l)
			}
		}
	}
	if !strings.Contains(seen.String(), "REDACTED") {
		t.Error("nothing was redacted: the echoes never came back")
	}
	if !strings.Contains(g.logs.String(), `"audit":true`) {
		t.Error("no audit event was logged: the audit log was not checked")
	}

	// The upstream got the connection's tokens only: none of the host's
	// headers.
	g.up.mu.Lock()
	headers := g.up.seenHeaders
	g.up.mu.Unlock()
	hostBearer := g.gwBearer("alice")
	for _, h := range headers {
		if c := h.Values("Cookie"); len(c) > 0 {
			t.Errorf("the upstream got a cookie: %q", c)
		}
		if s := h.Get("Mcp-Session-Id"); s != "" {
			t.Errorf("the upstream got a session id %q", s)
		}
		if a := h.Get("Authorization"); a != "" && !strings.HasPrefix(a, "Bearer up") {
			t.Errorf("the upstream got Authorization %q", a)
		}
		for name, vs := range h {
			for _, v := range vs {
				if strings.Contains(v, hostBearer) || strings.Contains(v, "host-") || strings.Contains(v, session) {
					t.Errorf("the upstream got the host's %s: %q", name, v)
				}
			}
		}
	}
	if len(headers) == 0 {
		t.Fatal("the upstream recorded no request")
	}
}

// withAudit has the gateway's and the connections layer's audit events
// written to g's log, the connections layer using client.
func (g *gatewayHarness) withAudit(client *provider.Client) {
	g.t.Helper()
	rec := telemetry.New(telemetry.Options{Providers: g.conns.Providers().Names(), Audit: slog.New(slog.NewJSONHandler(g.logs, nil))})
	g.srv.opts.Telemetry = rec
	conns, err := connections.New(connections.Options{Store: g.store, Grants: g.grants, Client: client,
		PublicURL: publicURL, Now: g.clock.Now, Logger: slog.New(slog.NewJSONHandler(g.logs, nil)), Telemetry: rec})
	if err != nil {
		g.t.Fatal(err)
	}
	g.conns, g.srv.opts.Connections = conns, conns
}

// tokenLeaks names the forms of tok in text: each encoding echoapi finds
// (as is, hex, base64 fragments at any offset), JSON-escaped (with and
// without HTML escaping) and URL-escaped.
func tokenLeaks(text, tok string) []string {
	found := echoapi.Leaks(text, tok)
	html, _ := json.Marshal(tok)
	var plain bytes.Buffer
	enc := json.NewEncoder(&plain)
	enc.SetEscapeHTML(false)
	enc.Encode(tok)
	for name, f := range map[string]string{"json": string(html[1 : len(html)-1]), "json-plain": strings.TrimSpace(plain.String())[1 : len(strings.TrimSpace(plain.String()))-1],
		"query-escaped": url.QueryEscape(tok), "path-escaped": url.PathEscape(tok)} {
		if strings.Contains(text, f) {
			found = append(found, name)
		}
	}
	return found
}
