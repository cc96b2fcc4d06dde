package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"credbroker/internal/tracing"
	"credbroker/vault"
)

// spanDump is every text a span carries that an exporter would send:
// name, attributes, events with theirs, links' attributes, the status
// description, the resource.
func spanDump(spans tracetest.SpanStubs) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "span %s status %q\n", s.Name, s.Status.Description)
		for _, a := range s.Attributes {
			fmt.Fprintf(&b, "  %s=%s\n", a.Key, a.Value.Emit())
		}
		for _, e := range s.Events {
			fmt.Fprintf(&b, "  event %s\n", e.Name)
			for _, a := range e.Attributes {
				fmt.Fprintf(&b, "    %s=%s\n", a.Key, a.Value.Emit())
			}
		}
		for _, l := range s.Links {
			for _, a := range l.Attributes {
				fmt.Fprintf(&b, "  link %s=%s\n", a.Key, a.Value.Emit())
			}
		}
		if s.Resource != nil {
			for _, a := range s.Resource.Attributes() {
				fmt.Fprintf(&b, "  resource %s=%s\n", a.Key, a.Value.Emit())
			}
		}
	}
	return b.String()
}

// noSecretsInSpans fails when any secret appears anywhere in the spans.
func noSecretsInSpans(t *testing.T, spans tracetest.SpanStubs, secrets map[string]string) {
	t.Helper()
	dump := spanDump(spans)
	for what, s := range secrets {
		if s == "" {
			t.Errorf("test bug: the %s is empty", what)
			continue
		}
		if strings.Contains(dump, s) {
			t.Errorf("the %s appears in a span:\n%s", what, dump)
		}
	}
}

func spansNamed(spans tracetest.SpanStubs, name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if s.Name == name || strings.HasSuffix(name, "*") && strings.HasPrefix(s.Name, strings.TrimSuffix(name, "*")) {
			out = append(out, s)
		}
	}
	return out
}

func attr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.Emit()
		}
	}
	return ""
}

func childrenOf(spans tracetest.SpanStubs, parent tracetest.SpanStub, name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spansNamed(spans, name) {
		if s.Parent.SpanID() == parent.SpanContext.SpanID() && s.Parent.TraceID() == parent.SpanContext.TraceID() {
			out = append(out, s)
		}
	}
	return out
}

const (
	testTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	testSpanID  = "00f067aa0ba902b7"
)

// tracedProviderRequest sends one 2026-07-28 provider_request with an
// incoming traceparent header.
func tracedProviderRequest(t *testing.T, base, bearer string) string {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"provider_request",
		"arguments":{"provider":"demo","method":"GET","path":"/user"},
		"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	req, _ := http.NewRequest("POST", base+"/mcp", strings.NewReader(body))
	for k, v := range map[string]string{
		"Authorization": "Bearer " + bearer, "Content-Type": "application/json",
		"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
		"Mcp-Method": "tools/call", "Mcp-Name": "provider_request",
		"Traceparent": "00-" + testTraceID + "-" + testSpanID + "-01",
	} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestTraceProviderRequestTree: one provider_request on a connected
// account (its access token expired) is one trace continuing the
// traceparent header: mcp.request → provider.request → the vault reads,
// the refresh (its flight, its token request) and the API call's HTTP
// span; no span carries a token, the bearer or the principal.
func TestTraceProviderRequestTree(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	mem := tracetest.NewInMemoryExporter()
	b := startDemoBrokerTraced(t, ctx, tracing.NewSyncProvider(mem))
	tok := b.connectAlice(t, ctx)
	bearer := b.bearer(t, "alice")
	mem.Reset() // the test's own setup is not the request

	answer := tracedProviderRequest(t, b.srv.URL, bearer)
	if !strings.Contains(answer, `\"login\":\"alice-demo\"`) {
		t.Fatalf("provider_request answered %s", answer)
	}
	spans := mem.GetSpans()
	mcpSpans := spansNamed(spans, "mcp.request")
	if len(mcpSpans) != 1 {
		t.Fatalf("%d mcp.request spans, want 1:\n%s", len(mcpSpans), spanDump(spans))
	}
	root := mcpSpans[0]
	if root.Parent.TraceID().String() != testTraceID || root.Parent.SpanID().String() != testSpanID {
		t.Errorf("mcp.request's parent is %s/%s, want the traceparent header's", root.Parent.TraceID(), root.Parent.SpanID())
	}
	for k, want := range map[string]string{"mcp.method": "tools/call", "mcp.tool": "provider_request", "mcp.era": "2026-07-28", "mcp.outcome": "complete"} {
		if got := attr(root, k); got != want {
			t.Errorf("mcp.request %s = %q, want %q", k, got, want)
		}
	}
	for _, s := range spans {
		if s.SpanContext.TraceID().String() != testTraceID {
			t.Errorf("span %s is in trace %s, not the request's", s.Name, s.SpanContext.TraceID())
		}
	}
	if len(childrenOf(spans, root, "vault.list_connections")) == 0 {
		t.Errorf("no vault.list_connections under mcp.request (the account pick):\n%s", spanDump(spans))
	}
	preq := childrenOf(spans, root, "provider.request")
	if len(preq) != 1 || attr(preq[0], "provider") != "demo" || attr(preq[0], "http.response.status_code") != "200" {
		t.Fatalf("provider.request under mcp.request: %d\n%s", len(preq), spanDump(spans))
	}
	if len(childrenOf(spans, preq[0], "vault.get_connection")) == 0 {
		t.Error("no vault.get_connection under provider.request")
	}
	api := childrenOf(spans, preq[0], "provider.http GET")
	if len(api) != 1 || !strings.HasSuffix(attr(api[0], "url.full"), devProviderPath+"/api/user") || attr(api[0], "http.response.status_code") != "200" {
		t.Fatalf("the API call's HTTP span under provider.request: %d\n%s", len(api), spanDump(spans))
	}
	refresh := childrenOf(spans, preq[0], "provider.token_refresh")
	if len(refresh) != 1 || attr(refresh[0], "refresh.role") != "leader" {
		t.Fatalf("provider.token_refresh under provider.request: %d\n%s", len(refresh), spanDump(spans))
	}
	flight := childrenOf(spans, refresh[0], "provider.token_refresh.flight")
	if len(flight) != 1 {
		t.Fatalf("no flight under the refresh:\n%s", spanDump(spans))
	}
	if len(childrenOf(spans, flight[0], "provider.http POST")) != 1 || len(childrenOf(spans, flight[0], "vault.update_connection")) != 1 {
		t.Errorf("the flight lacks its token request or its save:\n%s", spanDump(spans))
	}

	now, err := b.store.GetConnection(ctx, "conn-alice-demo")
	if err != nil {
		t.Fatal(err)
	}
	noSecretsInSpans(t, spans, map[string]string{
		"old access token": tok.AccessToken, "old refresh token": tok.RefreshToken,
		"new access token": now.Token.AccessToken.Reveal(), "new refresh token": now.Token.RefreshToken.Reveal(),
		"bearer": bearer, "principal's sub": "alice", "issuer": b.idp.Issuer(), "connection id": "conn-alice-demo",
	})
}

// TestTraceMRTRConnect: provider_request with nothing connected answers
// input_required; the browser steps (landing, sign-in callback, consent,
// provider callback with its token exchange) are spans of their own; the
// retry completes. No span carries a token, a code, the grant id, a
// cookie, the requestState, the bearer or the principal.
func TestTraceMRTRConnect(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	mem := tracetest.NewInMemoryExporter()
	b := startDemoBrokerTraced(t, ctx, tracing.NewSyncProvider(mem))
	bearer := b.bearer(t, "alice")
	mem.Reset()

	args := map[string]any{"provider": "demo", "method": "GET", "path": "/user"}
	first, err := mcpCall(http.DefaultClient, b.srv.URL, "", bearer, "provider_request", args, nil)
	if err != nil {
		t.Fatal(err)
	}
	key, link := elicitation(t, first)
	grantID := link[strings.LastIndex(link, "/")+1:]

	// The browser, recording every URL it visits (codes and states ride
	// in them).
	jar, _ := cookiejar.New(nil)
	var visited []*url.URL
	browser := &http.Client{Jar: jar, Timeout: 20 * time.Second, CheckRedirect: func(r *http.Request, via []*http.Request) error {
		visited = append(visited, r.URL)
		return nil
	}}
	get, _ := http.NewRequest(http.MethodGet, link, nil)
	p := fetch(t, browser, get)
	p = submitForm(t, browser, p, "login", url.Values{"username": {"alice"}, "password": {"alice"}})
	p = submitForm(t, browser, p, "/connect/", url.Values{"decision": {"approve"}})
	p = submitForm(t, browser, p, "authorize", url.Values{"decision": {"approve"}, "account": {"1001"}})
	if p.status != http.StatusOK || !strings.Contains(p.body, "Connected") {
		t.Fatalf("browser ended on %s (HTTP %d):\n%.2000s", p.url, p.status, p.body)
	}
	retry, err := mcpCall(http.DefaultClient, b.srv.URL, "", bearer, "provider_request", args, map[string]any{
		"inputResponses": map[string]any{key: map[string]any{"action": "accept"}},
		"requestState":   first.Result.RequestState,
	})
	if err != nil {
		t.Fatal(err)
	}
	if retry.Result.ResultType != "complete" || retry.Result.IsError {
		t.Fatalf("retry answered %s", retry.Raw)
	}

	spans := mem.GetSpans()
	mcpSpans := spansNamed(spans, "mcp.request")
	if len(mcpSpans) != 2 || attr(mcpSpans[0], "mcp.outcome") != "input_required" || attr(mcpSpans[1], "mcp.outcome") != "complete" {
		t.Fatalf("mcp.request spans: %d\n%s", len(mcpSpans), spanDump(spans))
	}
	for _, step := range []string{"oauthflow.landing", "oauthflow.signin_callback", "oauthflow.consent", "oauthflow.callback"} {
		if len(spansNamed(spans, step)) == 0 {
			t.Errorf("no %s span:\n%s", step, spanDump(spans))
		}
	}
	for _, s := range spansNamed(spans, "oauthflow.*") {
		if s.Name != "provider.code_exchange" && (attr(s, "http.route") == "" || strings.Contains(attr(s, "http.route"), grantID)) {
			t.Errorf("%s route %q", s.Name, attr(s, "http.route"))
		}
	}
	cb := spansNamed(spans, "oauthflow.callback")
	if len(cb) != 1 || attr(cb[0], "provider") != "demo" {
		t.Fatalf("oauthflow.callback spans: %d\n%s", len(cb), spanDump(spans))
	}
	ex := childrenOf(spans, cb[0], "provider.code_exchange")
	if len(ex) != 1 || len(childrenOf(spans, ex[0], "provider.http POST")) != 1 {
		t.Fatalf("the code exchange (and its token request) under the callback:\n%s", spanDump(spans))
	}
	if len(childrenOf(spans, cb[0], "vault.*")) == 0 {
		t.Error("no vault span under the callback (saving the connection)")
	}
	// The broker's own sign-in: its code exchange at the IdP is a client
	// span under the sign-in callback, naming the IdP's host and the
	// status but no URL (the issuer is half a principal; the secrets check
	// below looks for it in every span).
	signin := spansNamed(spans, "oauthflow.signin_callback")
	if len(signin) != 1 {
		t.Fatalf("oauthflow.signin_callback spans: %d\n%s", len(signin), spanDump(spans))
	}
	idpToken := childrenOf(spans, signin[0], "idp.http POST")
	if len(idpToken) != 1 {
		t.Fatalf("the sign-in's code exchange at the IdP under oauthflow.signin_callback:\n%s", spanDump(spans))
	}
	iu, _ := url.Parse(b.idp.Issuer())
	if attr(idpToken[0], "server.address") != iu.Hostname() || attr(idpToken[0], "http.response.status_code") != "200" ||
		attr(idpToken[0], "url.full") != "" || idpToken[0].SpanKind != trace.SpanKindClient {
		t.Errorf("idp.http POST: kind %v, attributes %v", idpToken[0].SpanKind, idpToken[0].Attributes)
	}

	secrets := map[string]string{
		"bearer": bearer, "principal's sub": "alice", "issuer": b.idp.Issuer(),
		"grant id": grantID, "requestState": first.Result.RequestState,
	}
	for i, u := range visited {
		for _, k := range []string{"code", "state"} {
			if v := u.Query().Get(k); v != "" {
				secrets[fmt.Sprintf("%s in visited URL %d", k, i)] = v
			}
		}
	}
	var codes, cookies int
	for k := range secrets {
		if strings.HasPrefix(k, "code in") {
			codes++
		}
	}
	if codes < 2 {
		t.Errorf("the test saw %d codes in the browser's redirects, want the IdP's and the provider's: %v", codes, visited)
	}
	for _, base := range []string{b.srv.URL, b.idp.Issuer()} {
		u, _ := url.Parse(base)
		for _, c := range jar.Cookies(u) {
			if len(c.Value) >= 8 {
				secrets["cookie "+c.Name] = c.Value
				cookies++
			}
		}
	}
	if cookies == 0 {
		t.Error("the test saw no cookie to look for")
	}
	list, err := b.store.ListConnections(ctx, vault.Principal{Issuer: b.idp.Issuer(), Subject: "alice"})
	if err != nil || len(list) != 1 {
		t.Fatalf("alice has %d connections (%v)", len(list), err)
	}
	t.Logf("looked for %d secrets (%d codes, %d cookies) in %d spans", len(secrets)+2, codes, cookies, len(spans))
	conn, err := b.store.GetConnection(ctx, list[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	secrets["access token"], secrets["refresh token"] = conn.Token.AccessToken.Reveal(), conn.Token.RefreshToken.Reveal()
	noSecretsInSpans(t, spans, secrets)
}

// TestTraceLegacyTree: a 2025-11-25 tools/call (through the go-sdk's
// handler) is traced like a modern one: its store reads are children of
// its mcp.request span, whose era says 2025-11-25.
func TestTraceLegacyTree(t *testing.T) {
	ctx := testContext(t, time.Minute)
	mem := tracetest.NewInMemoryExporter()
	b := startDemoBrokerTraced(t, ctx, tracing.NewSyncProvider(mem))
	bearer := b.bearer(t, "alice")
	mem.Reset()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_connections","arguments":{}}}`
	req, _ := http.NewRequest("POST", b.srv.URL+"/mcp", strings.NewReader(body))
	for k, v := range map[string]string{"Authorization": "Bearer " + bearer, "Content-Type": "application/json",
		"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	spans := mem.GetSpans()
	roots := spansNamed(spans, "mcp.request")
	if len(roots) != 1 || attr(roots[0], "mcp.era") != "2025-11-25" || attr(roots[0], "mcp.tool") != "list_connections" || attr(roots[0], "mcp.outcome") != "complete" {
		t.Fatalf("HTTP %d; spans:\n%s", resp.StatusCode, spanDump(spans))
	}
	if len(childrenOf(spans, roots[0], "vault.list_connections")) != 1 {
		t.Fatalf("the legacy tool's store read is not under its mcp.request:\n%s", spanDump(spans))
	}
	noSecretsInSpans(t, spans, map[string]string{"bearer": bearer, "principal's sub": "alice"})
}
